"""The report's sections: a matplotlib figure (PNG bytes), its reading, or why it is left out.

Every builder returns a `Section`; a section whose inputs are missing carries `missing`, a
sentence starting "Left out because", and no figure. Figures are drawn with the Agg backend
(no display) and saved without timestamps, so the same numbers give the same bytes.
"""

from __future__ import annotations

import functools
import io
import textwrap
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from shortcutlab.report import readings as rd
from shortcutlab.stats.units import is_nan, pp_number
from shortcutlab.report.tables import (R_QUANTITIES, dose_pairs, erasure_setting, gradcam_rows, gradcam_summary, per_model_accuracy,
                                      supplied_rows)

DPI = 100


@dataclass
class Section:
    """One part of the report.

    Attributes:
        key: file stem of its figure (``figures/<key>.png``) and the HTML anchor.
        title: heading.
        png: the figure, or None.
        reading: the sentence(s) read from the numbers; a newline starts a new line (one
            per condition where there are several).
        missing: why the figure is left out ("Left out because ..."), or None.
        table: a frame of display strings shown under the reading, or None.
        notes: further sentences (skipped interventions, caveats).
    """

    key: str
    title: str
    png: bytes | None = None
    reading: str = ""
    missing: str | None = None
    table: pd.DataFrame | None = None
    notes: list[str] = field(default_factory=list)


def agg_pyplot():
    """matplotlib.pyplot on the Agg backend (no display): every report figure is drawn with it."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


#: Text sizes (points) of every figure. The HTML shows a figure at its own pixel size (100 dpi,
#: 1 pt = 1.4 px) up to the page's width, so these are the sizes a reader sees: no text under
#: 9 pt (7-pt labels were unreadable in Chromium).
STYLE = {"font.size": 10, "axes.titlesize": 10, "axes.labelsize": 10, "xtick.labelsize": 9, "ytick.labelsize": 9,
         "legend.fontsize": 9, "legend.title_fontsize": 9, "figure.titlesize": 10, "text.parse_math": False}
#: The widest figure (inches, labels included) the page shows unscaled: its column is 980 px.
MAX_WIDTH = 9.3
#: About how wide (inches) one character of a 9-10 pt label is: room is made for labels that
#: sit outside the axes, so that the saved figure (bbox "tight") stays within `MAX_WIDTH`.
CHAR_WIDTH = 0.075


def _plain_text(build):
    """Run a figure or section builder in the report's `STYLE`, with matplotlib's mathtext off:
    labels, conditions and intervention names come from the user's data, and a '$' in one would
    be parsed as TeX (and an unbalanced or invalid one would fail the whole report)."""
    @functools.wraps(build)
    def wrapper(*args, **kwargs):
        import matplotlib

        with matplotlib.rc_context(STYLE):
            return build(*args, **kwargs)

    return wrapper


def _png(fig) -> bytes:
    plt = agg_pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def left_out(key: str, title: str, why: str, reading: str = "") -> Section:
    return Section(key, title, reading=reading, missing=f"Left out because {why}.")


def jitter(n: int, width: float) -> np.ndarray:
    """`n` deterministic offsets spread evenly over `width` (centred on 0): the dots of one
    group side by side, so that 4 models show as 4 dots even where two score the same."""
    return np.zeros(1) if n <= 1 else np.linspace(-width / 2, width / 2, n)


# --- accuracy per cell (or protocol) -------------------------------------------------------------

def chance_levels(pred: pd.DataFrame, baseline: str = "none") -> dict[str, float]:
    """Per condition, the accuracy of always answering the most frequent class: the largest
    class share among the test crops its models scored on the unaltered crops (each crop
    counted once, over the union of its models' test sets)."""
    if not {"id", "label"} <= set(pred.columns):
        return {}
    p = pred[pred["intervention"].astype(str) == baseline]
    crops = p.drop_duplicates(["condition", "id"])
    return {str(c): float(sub["label"].value_counts(normalize=True).max()) for c, sub in crops.groupby("condition")}


def accuracy_title(acc: pd.DataFrame) -> str:
    """The accuracy section's heading, naming what its figure groups by: cells of a factorial,
    protocols, or both; and the architecture(s)."""
    cells, prots = (acc["cell"] != "").any(), (acc["cell"] == "").any()
    what = "cell and protocol" if cells and prots else "cell" if cells else "protocol"
    archs = sorted(acc["arch"].unique())
    return f"Test accuracy per {what}" + (" and architecture" if len(archs) > 1 else f" ({archs[0]})" if archs else "")


@_plain_text
def accuracy_figure(acc: pd.DataFrame, chance: dict[str, float] | None = None):
    """One panel per condition: a bar per group (cell or protocol) and architecture (the mean
    over models), one dot per model (jittered, so every model shows), n per bar, and chance
    (the largest class share, `chance_levels`) as a dashed line. Returns the Figure."""
    plt = agg_pyplot()
    chance = chance or {}
    conds = sorted(acc["condition"].unique())
    width_in = min(MAX_WIDTH, max(4.6, 3.3 * len(conds) + 1.2))
    fig, axes = plt.subplots(1, len(conds), figsize=(width_in, 3.8), squeeze=False, sharey=True)
    archs = sorted(acc["arch"].unique())
    colors = plt.get_cmap("tab10")
    for ax, cond in zip(axes[0], conds):
        sub = acc[acc["condition"] == cond]
        groups = sorted(sub["group"].unique())
        width = 0.8 / max(1, len(archs))
        for j, arch in enumerate(archs):
            for i, g in enumerate(groups):
                v = sub[(sub["group"] == g) & (sub["arch"] == arch)].sort_values("seed")["accuracy"].to_numpy()
                if not len(v):
                    continue
                x = i + (j - (len(archs) - 1) / 2) * width
                ax.bar(x, 100 * v.mean(), width * 0.9, color=colors(j), alpha=0.35, label=f"mean, {arch}" if i == 0 else None)
                ax.scatter(x + jitter(len(v), width * 0.5), 100 * v, color=colors(j), s=16, zorder=3, edgecolors="white",
                           linewidths=0.5, clip_on=False, label="one model" if i == 0 and j == 0 else None)
                ax.text(x, 2, f"n={len(v)}", ha="center", va="bottom", fontsize=9)
        if cond in chance:
            ax.axhline(100 * chance[cond], color="black", ls="--", lw=1,
                       label=f"chance: largest class share ({rd.pct(chance[cond])})")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, rotation=20, ha="right")
        ax.set_title(f"condition: {cond}")
        ax.set_ylim(0, 100)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("test accuracy (%), unaltered crops")
    handles, labels = {}, []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    labels = list(handles)
    fig.tight_layout(rect=(0, 0.02 + 0.06 * -(-len(labels) // 3), 1, 1))
    fig.legend([handles[k] for k in labels], labels, loc="lower center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(3, len(labels)), frameon=False)
    return fig


def accuracy_section(pred: pd.DataFrame, est: pd.DataFrame | None, baseline: str = "none") -> Section:
    key = "accuracy"
    acc = per_model_accuracy(pred, baseline)
    if acc.empty:
        return left_out(key, "Test accuracy per cell or protocol",
                        f"no model was scored on the unaltered crops (intervention {baseline!r})")
    chance = chance_levels(pred, baseline)
    fig = accuracy_figure(acc, chance)
    return Section(key, accuracy_title(acc), png=_png(fig), reading=rd.accuracy_reading(acc, est, chance=chance))


# --- the leak effect forest plot --------------------------------------------------------------------

def forest_rows(est: pd.DataFrame) -> pd.DataFrame:
    """The forest plot's rows: each condition's unaltered leak (every architecture and the
    pooled row), then the leak under each intervention for its headline architecture
    (`readings.headline_arch`), sorted by condition and diversity."""
    leak = est[(est["estimand"] == "leak") & est["estimate"].notna()].copy()
    if leak.empty:
        return leak
    keep = []
    for cond, sub in leak.groupby("condition", sort=True):
        head = rd.headline_arch(est, cond)
        base = sub[sub["intervention"] == "none"]
        other = sub[(sub["intervention"] != "none") & (sub["arch"] == head)]
        keep.append(pd.concat([base, other]))
    rows = pd.concat(keep)
    rows["order_i"] = (rows["intervention"] != "none").astype(int)
    rows["order_a"] = (rows["arch"] == "pooled").astype(int)
    return rows.sort_values(["condition", "diversity", "order_i", "intervention", "order_a", "arch"]).reset_index(drop=True)


#: The forest plot's labels are wrapped to this many characters, at most two lines (a long
#: setting name would otherwise push the figure past the page's width).
LABEL_CHARS = 40


def _fit_label(text: str) -> str:
    return textwrap.shorten(text, 2 * LABEL_CHARS, placeholder="...") if len(text) > LABEL_CHARS else text


def forest_layout(rows: pd.DataFrame) -> list[tuple[str, int | None]]:
    """The forest plot's y rows, top to bottom: a heading per condition and diversity (its
    label, None), then one row per estimate (its label: the intervention, with the
    architecture where the group holds several; its index in `rows`). Labels longer than
    `LABEL_CHARS` are wrapped onto two lines (and shortened past that)."""
    out: list[tuple[str, int | None]] = []
    for (cond, div), sub in rows.groupby(["condition", "diversity"], sort=False):
        archs = sub["arch"].unique()
        head = f"{cond}" + (f", {div} diversity" if str(div) not in ("", "high-low") else "")
        out.append((head + (f" ({archs[0]})" if len(archs) == 1 else ""), None))
        for i, r in sub.iterrows():
            name = rd.intervention_label(r["intervention"]) if r["intervention"] != "none" else "unaltered crops"
            out.append((f"{name}, {r['arch']}" if len(archs) > 1 else name, i))
    return [("\n".join(textwrap.wrap(_fit_label(lab), LABEL_CHARS)) or lab, i) for lab, i in out]


@_plain_text
def forest_figure(rows: pd.DataFrame, level: float = 0.95):
    """The leak (leak minus clean accuracy) on the unaltered crops and under each intervention,
    with intervals, grouped by condition (a bold heading, then its rows); a dotted line at each
    condition's unaltered leak (an intervention's cut is its distance from that line).
    Returns the Figure."""
    plt = agg_pyplot()
    layout = forest_layout(rows)
    n = len(layout)
    height = 1.6 + 0.34 * n
    labels = max(len(line) + 4 for lab, _ in layout for line in lab.split("\n")) * CHAR_WIDTH
    fig, ax = plt.subplots(figsize=(max(4.0, MAX_WIDTH - labels - 0.2), height))
    ys = np.arange(n)[::-1].astype(float)
    est_pp, lo, hi = (100 * rows[c].to_numpy(float) for c in ("estimate", "ci_low", "ci_high"))
    styles = {"unaltered, pooled over architectures": ("black", "D"), "unaltered": ("tab:blue", "o"),
              "under an intervention": ("tab:orange", "s")}
    drawn: set[str] = set()
    for y, (_, i) in zip(ys, layout):
        if i is None:
            continue
        r = rows.loc[i]
        kind = ("under an intervention" if r["intervention"] != "none" else
                "unaltered, pooled over architectures" if r["arch"] == "pooled" else "unaltered")
        color, marker = styles[kind]
        err = np.array([[est_pp[i] - lo[i]], [hi[i] - est_pp[i]]])
        ax.errorbar(est_pp[i], y, xerr=np.where(np.isfinite(err), err, 0), fmt=marker, color=color, ms=5, capsize=2.5,
                    lw=1.2, label=None if kind in drawn else kind)
        drawn.add(kind)
    heads = [k for k, (_, i) in enumerate(layout) if i is None] + [n]
    for k, end in zip(heads[:-1], heads[1:]):      # each condition's headline unaltered leak, over its rows
        members = [i for _, i in layout[k + 1:end]]
        base = [i for i in members if rows.loc[i, "intervention"] == "none"]
        if base:
            j = next((i for i in base if rows.loc[i, "arch"] == "pooled"), base[0])
            ax.plot([est_pp[j]] * 2, [ys[end - 1] - 0.4, ys[k + 1] + 0.4], color="grey", ls=":", lw=1.5,
                    label=None if "line" in drawn else "leak on the unaltered crops (a cut is the distance from it)")
            drawn.add("line")
    ax.set_yticks(ys)
    ax.set_yticklabels([lab if i is None else "\n".join("    " + line for line in lab.split("\n")) for lab, i in layout])
    for tick, (_, i) in zip(ax.get_yticklabels(), layout):
        if i is None:
            tick.set_fontweight("bold")
    ax.set_ylim(-0.7, n - 0.3)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel(f"leak: leak-model minus clean-model accuracy (pp), {level * 100:.0f}% interval")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.55 / height), ncol=2, frameon=False)
    return fig


def forest_section(est: pd.DataFrame, level: float = 0.95) -> Section:
    key, title = "leak_effect", "The leak on the unaltered crops and under each intervention"
    leak = est[est["estimand"] == "leak"]
    if leak.empty or leak["estimate"].isna().all():
        reasons = sorted(set(leak["reason"].dropna().astype(str))) if len(leak) else []
        why = reasons[0] if reasons else "no prediction with exposure 'leak' or 'clean'"
        return left_out(key, title, f"the sweep has no leak/clean factorial to estimate a leak from ({why})")
    heads = leak[(leak["intervention"] == "none") & leak["estimate"].notna()][["condition", "diversity"]].drop_duplicates()
    reading = "\n".join(rd.leak_reading(est, c, d, level=level) for c, d in heads.sort_values(["condition", "diversity"]).itertuples(index=False))  # one line per condition
    rows = forest_rows(est)
    if rows[["ci_low", "ci_high"]].isna().all(axis=None):
        why = sorted(set(rows["reason"].dropna().astype(str)) - {""})
        return left_out(key, title, f"no leak estimate has an interval ({why[0] if why else 'no resamples'}), and a forest plot "
                        f"without intervals would mislead", reading=reading)
    sec = Section(key, title, png=_png(forest_figure(rows, level)), reading=reading)
    sec.notes.append("The plot shows the leak itself under each intervention (leak minus clean accuracy on the altered "
                     "crops); the text reads each intervention's cut: the leak on the unaltered crops (dotted line) minus "
                     "the leak under it, with the cut's own interval.")
    return sec


def _run_hint(quantities) -> str:
    """'run the parent_probe or leace diagnostic': the registered suppliers of `quantities`
    (`readings.suppliers`), with ', which needs cell masks' when each of them does."""
    names = list(dict.fromkeys(n for q in quantities for n, _ in rd.suppliers(q)))
    if not names:
        return f"no registered diagnostic supplies {' or '.join(quantities)}"
    masks = all("masks" in getattr(rd.diagnostic_class(n), "needs", ()) for n in names)
    return f"run the {' or '.join(names)} diagnostic" + (", which needs cell masks" if masks else "")


# --- R (before and after erasure) against the gap ----------------------------------------------

def dose_title(pairs: pd.DataFrame) -> str:
    """The dose section's heading: 'before and after erasure' only where an erasure is drawn."""
    after = "R_after" in pairs and "gap_after" in pairs and (pairs["R_after"].notna() & pairs["gap_after"].notna()).any()
    return ("Parent recoverability R before and after erasure against the leak gap of refitted heads" if after
            else "Parent recoverability R against the leak gap")


def _slope_label(cond: str, sub: pd.DataFrame, slopes: pd.DataFrame | None, level: float) -> tuple[str, pd.Series | None]:
    """The legend entry of one condition's fitted line, and its slope row (None: no line)."""
    row = None
    if slopes is not None and len(slopes) and "intercept" in slopes:
        hit = slopes[(slopes["condition"].astype(str) == str(cond)) & slopes["estimate"].notna()]
        row = hit.iloc[0] if len(hit) else None
    if row is None:
        return f"{cond} ({len(sub)} pair{'s' if len(sub) != 1 else ''})", None
    why = rd.slope_interval_problem(sub["R"], sub["seed"])
    ci = ("no interval" if why or is_nan(row["ci_low"]) else
          f"{level * 100:.0f}% CI {pp_number(row['ci_low'] * 0.1)} to {pp_number(row['ci_high'] * 0.1)}")
    return f"{cond} ({len(sub)} pairs): fit {pp_number(row['estimate'] * 0.1)} pp per 0.1 of R ({ci})", row


@_plain_text
def dose_figure(pairs: pd.DataFrame, slopes: pd.DataFrame | None = None, level: float = 0.95):
    """The leak gap against R, one colour per condition, on R's whole range (0 to 1). With
    erasure rows (R_after and gap_after), the refitted heads' gap before (filled) and after
    (hollow) the erasure, joined by arrows; without, the models' gap with each condition's
    fitted line over the R it was fitted on, its slope (and interval, where
    `readings.slope_interval_problem` finds none) in the legend. Returns the Figure."""
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(6.8, 4.2))
    cmap = plt.get_cmap("tab10")
    heads = "gap_after" in pairs and pairs["gap_after"].notna().any()
    for i, (cond, sub) in enumerate(pairs.groupby("condition", sort=True)):
        c = cmap(i)
        if heads:
            # one gap measure for both points: the refitted heads' before and after erasure
            sub = sub.dropna(subset=["R_after", "gap_before", "gap_after"])
            ax.scatter(sub["R"], 100 * sub["gap_before"], color=c, s=28, label=f"{cond}: before erasure (n={len(sub)})", zorder=3)
            ax.scatter(sub["R_after"], 100 * sub["gap_after"], facecolors="none", edgecolors=c, s=28,
                       label=f"{cond}: after erasure (n={len(sub)})", zorder=3)
            for _, r in sub.iterrows():
                ax.annotate("", xy=(r["R_after"], 100 * r["gap_after"]), xytext=(r["R"], 100 * r["gap_before"]),
                            arrowprops=dict(arrowstyle="->", color=c, lw=0.6, alpha=0.6))
            continue
        label, row = _slope_label(cond, sub, slopes, level)
        ax.scatter(sub["R"], 100 * sub["gap"], color=c, s=28, label=label, zorder=3)
        if row is not None:
            xs = np.array([sub["R"].min(), sub["R"].max()])
            ax.plot(xs, 100 * (row["intercept"] + row["estimate"] * xs), color=c, lw=1.2)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel("R of the leak model (0 to 1): parent named among its class's parents")
    ax.set_ylabel("leak gap (pp): leak minus clean accuracy" + (",\nrefitted linear heads" if heads else ""))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    ax.grid(alpha=0.3)
    return fig


def dose_section(pred: pd.DataFrame, results: pd.DataFrame | None, slopes: pd.DataFrame | None, level: float = 0.95) -> Section:
    key, title = "dose_response", "Parent recoverability R against the leak gap"
    if results is None:
        return left_out(key, title, "the sweep folder holds no results table (no diagnostics were run)")
    pairs = dose_pairs(pred, results)
    if pairs.empty:
        has_r = (results["metric"] == "R").any() if len(results) else False
        why = ("no leak model with an R row has a clean partner in the factorial" if has_r else
               f"the results hold no parent-recoverability R ({_run_hint(R_QUANTITIES)})")
        return left_out(key, title, why)
    rank = erasure_setting(results) or ""
    erasure = rd.diagnostic_label(supplied_rows(results, "recoverability_after_erasure")[0])
    reading = rd.dose_reading(pairs, slopes, level, rank=rank, erasure=erasure)
    sec = Section(key, dose_title(pairs), png=_png(dose_figure(pairs, slopes, level)), reading=reading)
    if pairs["R_after"].isna().all():
        sec.notes.append(f"No {rd.supplier_label('recoverability_after_erasure') or 'erasure'} rows: only R before erasure is shown.")
    return sec


# --- Grad-CAM outside mass ------------------------------------------------------------------------

EXPOSURE_COLORS = {"leak": "tab:red", "clean": "tab:blue"}


@_plain_text
def gradcam_figure(rows: pd.DataFrame):
    """Left: each model's Grad-CAM mass outside the cell (filled) and its randomised head's
    (hollow), 0-100%; right: Spearman rho between its trained and randomised-head maps (dots)
    and between random pairs of crops (x), -1 to 1, with the check's threshold. Red = leak
    models, blue = clean; n per group under its name. Returns the Figure."""
    from matplotlib.lines import Line2D

    plt = agg_pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(MAX_WIDTH, 4.2))
    groups = list(rows.groupby(["condition", "exposure"], sort=True))
    order = {"leak": 0, "clean": 1}
    groups.sort(key=lambda kv: (kv[0][0], order.get(kv[0][1], 2)))
    for i, ((cond, exp), sub) in enumerate(groups):
        color = EXPOSURE_COLORS.get(exp, "grey")
        dx = jitter(len(sub), 0.16)
        a1.scatter(i - 0.12 + dx, 100 * sub["outside_mass"], color=color, s=20, zorder=3)
        a1.scatter(i + 0.12 + dx, 100 * sub["randomized_outside_mass"], facecolors="none", edgecolors=color, s=20)
        a2.scatter(i - 0.12 + dx, sub["randomized_head_spearman"], color=color, s=20, zorder=3)
        a2.scatter(i + 0.12 + dx, sub["random_pair_spearman"], marker="x", color="black", s=18)
    labels = [f"{c}\n{e}\nn={len(sub)}" for (c, e), sub in groups]
    for ax in (a1, a2):
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(labels)
        ax.set_xlim(-0.6, len(groups) - 0.4)
        ax.grid(axis="y", alpha=0.3)
    a1.set_ylim(0, 100)
    a1.set_ylabel("Grad-CAM attribution outside the cell (%)")
    a1.set_title("mass outside the cell (full range 0-100%)")
    a2.set_ylim(-1, 1)
    a2.set_ylabel("Spearman rho between maps (-1 to 1)")
    a2.axhline(rd.HEAD_CHECK_RHO, color="grey", lw=1, ls="--")
    # the label sits at the foot of the axes, clear of the points that gather near the line
    a2.text(-0.55, -0.97, f"dashed line: check passes below rho {rd.HEAD_CHECK_RHO:g}", ha="left", va="bottom",
            color="dimgrey")
    a2.set_title("trained vs randomised-head maps")
    exps = [e for e in ("leak", "clean") if any(g[0][1] == e for g in groups)]
    handles = [Line2D([], [], ls="", marker="o", color=EXPOSURE_COLORS[e], label=f"{e} models") for e in exps]
    handles += [Line2D([], [], ls="", marker="o", color="grey", label="trained model"),
                Line2D([], [], ls="", marker="o", markerfacecolor="none", color="grey", label="randomised head"),
                Line2D([], [], ls="", marker="x", color="black", label="random pairs of crops (right)")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), bbox_to_anchor=(0.5, -0.02), frameon=False,
               handletextpad=0.3, columnspacing=1.0)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def gradcam_section(results: pd.DataFrame | None) -> Section:
    key, title = "gradcam", "Grad-CAM mass outside the cell, leak and clean models"
    if results is None:
        return left_out(key, title, "the sweep folder holds no results table (no diagnostics were run)")
    rows = gradcam_rows(results)
    if rows.empty:
        return left_out(key, title, f"the results hold no Grad-CAM rows ({_run_hint(('outside_mass',))})")
    summary = gradcam_summary(rows)
    return Section(key, title, png=_png(gradcam_figure(rows)), reading=rd.gradcam_reading(summary))


# --- example crops ----------------------------------------------------------------------------------

def _example_crops(crops, side, n_crops: int, device: str):
    """Up to `n_crops` test crops, one per parent (a fixed draw), as a float batch and masks."""
    import torch

    test = np.flatnonzero(side == 2)
    rng = np.random.default_rng(0)
    parents = np.asarray(crops.table.parent_codes)[test]
    _, first = np.unique(parents, return_index=True)
    pick = np.sort(rng.choice(test[first], size=min(n_crops, len(first)), replace=False))
    x, m = crops.float_batch(torch.from_numpy(pick), device=device)
    return pick, x, m, rng


def _intervention_columns(folder, crops, split, side, pick, x, m, rng, device: str, fit_crops: int, notes: list) -> list:
    """(label, batch) for each intervention the sweep scored (or every registered one with its
    defaults), applied to the example crops; one that cannot be shown is named in `notes`."""
    import torch

    import interventions

    train = np.flatnonzero(side == 0)
    settings = folder.intervention_settings()
    if settings is None:
        settings = [(n, n, {}) for n in interventions.available()]
        notes.append("The sweep folder does not record its interventions: every registered one is shown with its defaults.")
    columns: list[tuple[str, torch.Tensor]] = [("crop", x)]
    for setting, name, params in settings:
        try:
            cls = interventions.get_class(name)
            if cls.requires_mask and m is None:
                notes.append(f"{rd.intervention_label(setting)}: skipped, it needs cell masks.")
                continue
            fn = interventions.get(name, **params)
            targets = cls.targets_for(crops, split, seed=0) if interventions.declares_targets(cls) else None
            if targets is None and cls.label_conditioned:
                notes.append(f"{rd.intervention_label(setting)}: skipped, its per-crop targets are not defined.")
                continue
            kw = interventions.target_rows(targets, pick, x.device) if targets is not None else {}
            if callable(getattr(fn, "fit", None)) and not params and len(train):
                sel = np.sort(rng.choice(train, size=min(len(train), fit_crops), replace=False))
                xt, mt = crops.float_batch(torch.from_numpy(sel), device=device)
                fn.fit(xt, mt)
            if getattr(fn, "stochastic", False):
                fn.generator = torch.Generator().manual_seed(0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                y = fn(x, m, **kw)
            columns.append((rd.intervention_label(setting), y))
        except Exception as e:  # noqa: BLE001 - one intervention's failure is named, the rest are shown
            notes.append(f"{rd.intervention_label(setting)}: skipped ({' '.join(str(e).split())[:160]}).")
    return columns


def _gradcam_columns(leak, clean, run, x, m, device: str, notes: list) -> tuple[list, dict, dict]:
    """Grad-CAM maps of the leak model and its clean model on the example crops (as each model
    scored them), each map's mean mass outside the cell, and each model's predicted class
    index per crop ({'leak': (B,) array, 'clean': ...})."""
    import torch

    from probes.base import apply_preprocess
    from probes.saliency import gradcam, outside_mass

    from shortcutlab.models.runs import load_run

    cams, masses, preds = [], {}, {}
    for ref, label in ((leak, "leak"), (clean, "clean")):
        if ref is None:
            notes.append("No clean model of the same seed and architecture has a run folder: one Grad-CAM column.")
            continue
        try:
            r = run if ref is leak else load_run(ref.run_dir, device=device)
            pre = r.preprocess  # the crops as the model scored them (its masked background)
            # (resized with the crops for a run with an input size)
            xin, min_ = apply_preprocess(pre, x, m) if pre is not None and m is not None else (x, m)
            with torch.no_grad():
                preds[label] = r.adapter.logits(xin.to(r.adapter.dtype)).argmax(1).cpu().numpy()
            maps = gradcam(r.adapter, xin.to(r.adapter.dtype)).detach().float().cpu()
            if m is not None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    om = outside_mass(maps, min_.cpu()).numpy()
                if np.isfinite(om).any():
                    masses[label] = float(np.nanmean(om))
            if tuple(maps.shape[-2:]) != tuple(x.shape[-2:]):  # drawn over the crop as it is
                maps = torch.nn.functional.interpolate(maps[:, None], size=tuple(x.shape[-2:]), mode="bilinear")[:, 0]
            cams.append((f"Grad-CAM, {label} model", maps))
        except Exception as e:  # noqa: BLE001
            notes.append(f"Grad-CAM of the {label} model: left out ({' '.join(str(e).split())[:160]}).")
    return cams, masses, preds


def row_labels(labels, classes, preds: dict) -> list[str]:
    """Each example row's label: its class, then each model's prediction ('class 2', 'leak
    model: 2', 'clean model: 0'), class names from `classes` where the index is one."""
    def name(k) -> str:
        k = int(k)
        return str(classes[k]) if 0 <= k < len(classes) else str(k)

    return ["\n".join([f"class: {name(y)}"] + [f"{who} model: {name(p[i])}" for who, p in preds.items()])
            for i, y in enumerate(labels)]


CAM_SCALE = "Grad-CAM, scaled per crop to its maximum (0 to 1)"


@_plain_text
def example_grid(x, m, columns: list, cams: list, rows: list[str] | None = None):
    """The figure: one row per crop (its label on the left: class and predictions), the crop
    (with its cell outline), each intervention, then each Grad-CAM overlay, with a colour bar
    for the maps (`CAM_SCALE`). Returns the Figure."""
    plt = agg_pyplot()
    ncol = len(columns) + len(cams)
    B = x.shape[0]
    longest = max((len(line) for text in rows or [] for line in text.split("\n")), default=0)
    extra = 0.3 + longest * CHAR_WIDTH + (1.0 if cams else 0)         # the row labels, the colour bar
    side = min(1.35, (MAX_WIDTH - extra) / max(ncol, 1))
    fig, axes = plt.subplots(B, ncol, figsize=(extra + side * ncol, side * B + 0.9), squeeze=False)
    mk = None if m is None else m[:, 0].cpu().numpy()
    for j, (name, imgs) in enumerate(columns):
        arr = imgs.detach().float().cpu().clamp(0, 1).permute(0, 2, 3, 1).numpy()
        for i in range(B):
            ax = axes[i][j]
            ax.imshow(arr[i], interpolation="nearest")
            if mk is not None and j == 0:
                ax.contour(mk[i], levels=[0.5], colors="lime", linewidths=0.8)
    base = x.detach().float().cpu().permute(0, 2, 3, 1).numpy()
    im = None
    for j, (name, maps) in enumerate(cams, start=len(columns)):
        for i in range(B):
            ax = axes[i][j]
            ax.imshow(base[i], interpolation="nearest")
            mp = maps[i].numpy()
            im = ax.imshow(mp / mp.max() if mp.max() > 0 else mp, cmap="jet", alpha=0.5, vmin=0, vmax=1, interpolation="bilinear")
            if mk is not None:
                ax.contour(mk[i], levels=[0.5], colors="white", linewidths=0.6)
    names = [c[0] for c in columns] + [c[0] for c in cams]
    for j, name in enumerate(names):
        # wrapped to the panel's width: long intervention names overlapped their neighbours
        axes[0][j].set_title(textwrap.fill(name, 11, break_long_words=False))
    for i, text in enumerate(rows or []):
        axes[i][0].set_ylabel(text, rotation=0, ha="right", va="center", labelpad=6)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    if im is not None:   # the bar opaque (the overlay's alpha made its colours unreadable)
        from matplotlib.cm import ScalarMappable

        bar = fig.colorbar(ScalarMappable(norm=im.norm, cmap=im.cmap), ax=axes[:, len(columns):].ravel().tolist(),
                           fraction=0.08, pad=0.04)
        bar.set_label(textwrap.fill(CAM_SCALE, 26))
    return fig


def examples_section(folder, n_crops: int = 4, device: str = "cpu", fit_crops: int = 256) -> Section:
    """Test crops of one leak model with their mask outlines, each intervention the sweep
    scored applied (or every registered one with its defaults), and Grad-CAM overlays of the
    leak and its clean model. CPU, a handful of crops."""
    key, title = "examples", "Example crops: masks, interventions and Grad-CAM"
    leak, clean = folder.example_pair()
    if leak is None:
        return left_out(key, title, "no leak model's run folder is in the sweep folder (tasks/train/<id>/run.json), so there "
                        "is no model to explain and no crop to show")
    from shortcutlab.models.runs import load_run, load_run_data

    try:
        run = load_run(leak.run_dir, device=device)
        crops, split, side = load_run_data(run)
    except Exception as e:  # noqa: BLE001 - a figure, not the report, is lost
        return left_out(key, title, f"the leak model's run folder could not be loaded ({' '.join(str(e).split())[:200]})")
    if not (side == 2).any():
        return left_out(key, title, "the leak model's split has no test crop")
    pick, x, m, rng = _example_crops(crops, side, n_crops, device)
    notes = []
    if m is None:
        notes.append("The crops have no cell masks: no outlines, and the interventions that need masks are skipped.")
    columns = _intervention_columns(folder, crops, split, side, pick, x, m, rng, device, fit_crops, notes)
    cams, masses, preds = _gradcam_columns(leak, clean, run, x, m, device, notes)
    labels = np.asarray(crops.table.label_codes)[pick]
    fig = example_grid(x, m, columns, cams, row_labels(labels, crops.table.classes, preds))
    B = len(pick)
    reading = (f"{B} test crops of the {leak.condition} leak model ({leak.cell or 'leak'}, {leak.arch}, seed {leak.seed}), "
               f"one per parent, with their cell outlines; then {len(columns) - 1} intervention"
               f"{'s' if len(columns) != 2 else ''} applied ({', '.join(c[0] for c in columns[1:]) or 'none'}) and "
               f"{', '.join(c[0] for c in cams) or 'no Grad-CAM map'} (red: more attribution; each map scaled to its own "
               f"maximum); each row names the crop's class and what each model predicted")
    if masses:
        reading += "; on these crops the maps put " + " and ".join(f"{rd.pct(v)} ({k} model)" for k, v in masses.items()) + \
                   " of their mass outside the cell"
    return Section(key, title, png=_png(fig), reading=reading + ".", notes=notes)
