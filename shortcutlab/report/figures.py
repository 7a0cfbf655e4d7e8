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


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _plain_text(build):
    """Run a section builder with matplotlib's mathtext off: labels, conditions and
    intervention names come from the user's data, and a '$' in one would be parsed as TeX (and
    an unbalanced or invalid one would fail the whole report)."""
    @functools.wraps(build)
    def wrapper(*args, **kwargs):
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False}):
            return build(*args, **kwargs)

    return wrapper


def _png(fig) -> bytes:
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def left_out(key: str, title: str, why: str, reading: str = "") -> Section:
    return Section(key, title, reading=reading, missing=f"Left out because {why}.")


# --- accuracy per protocol and architecture -----------------------------------------------------

@_plain_text
def accuracy_section(pred: pd.DataFrame, est: pd.DataFrame | None, baseline: str = "none") -> Section:
    key, title = "accuracy", "Accuracy per protocol and architecture"
    acc = per_model_accuracy(pred, baseline)
    if acc.empty:
        return left_out(key, title, f"no model was scored on the unaltered crops (intervention {baseline!r})")
    plt = _plt()
    conds = sorted(acc["condition"].unique())
    fig, axes = plt.subplots(1, len(conds), figsize=(max(4.0, 3.2 * len(conds)), 3.4), squeeze=False, sharey=True)
    archs = sorted(acc["arch"].unique())
    colors = plt.get_cmap("tab10")
    for ax, cond in zip(axes[0], conds):
        sub = acc[acc["condition"] == cond]
        groups = sorted(sub["group"].unique())
        width = 0.8 / max(1, len(archs))
        for j, arch in enumerate(archs):
            for i, g in enumerate(groups):
                v = sub[(sub["group"] == g) & (sub["arch"] == arch)]["accuracy"].to_numpy()
                if not len(v):
                    continue
                x = i + (j - (len(archs) - 1) / 2) * width
                ax.bar(x, 100 * v.mean(), width * 0.9, color=colors(j), alpha=0.35, label=arch if i == 0 else None)
                ax.scatter(np.full(len(v), x), 100 * v, color=colors(j), s=12, zorder=3)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
        ax.set_title(cond, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("test accuracy (%), unaltered crops")
    if len(archs) > 1:
        axes[0][-1].legend(fontsize=7, title="architecture", title_fontsize=7)
    fig.suptitle("bars: mean over seeds; dots: one model each", fontsize=8)
    return Section(key, title, png=_png(fig), reading=rd.accuracy_reading(acc, est))


# --- the leak effect forest plot --------------------------------------------------------------------

def _forest_rows(est: pd.DataFrame) -> pd.DataFrame:
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


@_plain_text
def forest_section(est: pd.DataFrame, level: float = 0.95) -> Section:
    key, title = "leak_effect", "The leak effect per condition and intervention"
    leak = est[est["estimand"] == "leak"]
    if leak.empty or leak["estimate"].isna().all():
        reasons = sorted(set(leak["reason"].dropna().astype(str))) if len(leak) else []
        why = reasons[0] if reasons else "no prediction with exposure 'leak' or 'clean'"
        return left_out(key, title, f"the sweep has no leak/clean factorial to estimate a leak from ({why})")
    heads = leak[(leak["intervention"] == "none") & leak["estimate"].notna()][["condition", "diversity"]].drop_duplicates()
    reading = "\n".join(rd.leak_reading(est, c, d, level=level) for c, d in heads.sort_values(["condition", "diversity"]).itertuples(index=False))  # one line per condition
    rows = _forest_rows(est)
    if rows[["ci_low", "ci_high"]].isna().all(axis=None):
        why = sorted(set(rows["reason"].dropna().astype(str)) - {""})
        return left_out(key, title, f"no leak estimate has an interval ({why[0] if why else 'no resamples'}), and a forest plot "
                        f"without intervals would mislead", reading=reading)
    plt = _plt()
    n = len(rows)
    fig, ax = plt.subplots(figsize=(7.0, 0.8 + 0.28 * n))
    y = np.arange(n)[::-1]
    est_pp = 100 * rows["estimate"].to_numpy(float)
    lo = 100 * rows["ci_low"].to_numpy(float)
    hi = 100 * rows["ci_high"].to_numpy(float)
    base = (rows["intervention"] == "none").to_numpy()
    pooled = (rows["arch"] == "pooled").to_numpy()
    err = np.vstack([est_pp - lo, hi - est_pp])
    err = np.where(np.isfinite(err), err, 0)
    for mask, color, marker in ((base & pooled, "black", "D"), (base & ~pooled, "tab:blue", "o"), (~base, "tab:orange", "s")):
        if mask.any():
            ax.errorbar(est_pp[mask], y[mask], xerr=err[:, mask], fmt=marker, color=color, ms=4, capsize=2, lw=1)
    labels = [f"{r.condition} · {r.diversity} · {r.arch} · {rd.intervention_label(r.intervention) if r.intervention != 'none' else 'unaltered'}"
              for r in rows.itertuples()]
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=7)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel(f"leak effect: leak minus clean accuracy (pp), {level * 100:.0f}% interval")
    ax.grid(axis="x", alpha=0.3)
    return Section(key, title, png=_png(fig), reading=reading)


def _run_hint(quantities) -> str:
    """'run the parent_probe or leace diagnostic': the registered suppliers of `quantities`
    (`readings.suppliers`), with ', which needs cell masks' when each of them does."""
    names = list(dict.fromkeys(n for q in quantities for n, _ in rd.suppliers(q)))
    if not names:
        return f"no registered diagnostic supplies {' or '.join(quantities)}"
    masks = all("masks" in getattr(rd.diagnostic_class(n), "needs", ()) for n in names)
    return f"run the {' or '.join(names)} diagnostic" + (", which needs cell masks" if masks else "")


# --- R before and after erasure against the gap --------------------------------------------------

@_plain_text
def dose_section(pred: pd.DataFrame, results: pd.DataFrame | None, slopes: pd.DataFrame | None, level: float = 0.95) -> Section:
    key, title = "dose_response", "Parent recoverability R before and after erasure against the leak gap"
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
    reading = rd.dose_reading(pairs.assign(), slopes, level, rank=rank, erasure=erasure)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    cmap = plt.get_cmap("tab10")
    heads = pairs["gap_after"].notna().any()
    for i, (cond, sub) in enumerate(pairs.groupby("condition", sort=True)):
        c = cmap(i)
        if heads:
            # one gap measure for both points: the refitted heads' before and after erasure
            sub = sub.dropna(subset=["R_after", "gap_before", "gap_after"])
            ax.scatter(sub["R"], 100 * sub["gap_before"], color=c, s=22, label=f"{cond}: before erasure", zorder=3)
            ax.scatter(sub["R_after"], 100 * sub["gap_after"], facecolors="none", edgecolors=c, s=22,
                       label=f"{cond}: after erasure", zorder=3)
            for _, r in sub.iterrows():
                ax.annotate("", xy=(r["R_after"], 100 * r["gap_after"]), xytext=(r["R"], 100 * r["gap_before"]),
                            arrowprops=dict(arrowstyle="->", color=c, lw=0.6, alpha=0.6))
        else:
            ax.scatter(sub["R"], 100 * sub["gap"], color=c, s=22, label=cond, zorder=3)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("R (leak model): parent named among its class's parents")
    ax.set_ylabel("leak gap (pp): leak minus clean accuracy" + (",\nrefitted linear heads" if heads else ""))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    sec = Section(key, title, png=_png(fig), reading=reading)
    if pairs["R_after"].isna().all():
        sec.notes.append(f"No {rd.supplier_label('recoverability_after_erasure') or 'erasure'} rows: only R before erasure is shown.")
    return sec


# --- Grad-CAM outside mass ------------------------------------------------------------------------

@_plain_text
def gradcam_section(results: pd.DataFrame | None) -> Section:
    key, title = "gradcam", "Grad-CAM mass outside the cell, leak and clean models"
    if results is None:
        return left_out(key, title, "the sweep folder holds no results table (no diagnostics were run)")
    rows = gradcam_rows(results)
    if rows.empty:
        return left_out(key, title, f"the results hold no Grad-CAM rows ({_run_hint(('outside_mass',))})")
    summary = gradcam_summary(rows)
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8.0, 3.4))
    groups = list(rows.groupby(["condition", "exposure"], sort=True))
    order = {"leak": 0, "clean": 1}
    groups.sort(key=lambda kv: (kv[0][0], order.get(kv[0][1], 2)))
    for i, ((cond, exp), sub) in enumerate(groups):
        color = "tab:red" if exp == "leak" else "tab:blue" if exp == "clean" else "grey"
        a1.scatter(np.full(len(sub), i), 100 * sub["outside_mass"], color=color, s=16, zorder=3)
        a1.scatter(np.full(len(sub), i + 0.2), 100 * sub["randomized_outside_mass"], facecolors="none", edgecolors=color, s=16)
        a2.scatter(np.full(len(sub), i), sub["randomized_head_spearman"], color=color, s=16, zorder=3)
        a2.scatter(np.full(len(sub), i + 0.2), sub["random_pair_spearman"], marker="x", color="black", s=14)
    labels = [f"{c}\n{e}" for (c, e), _ in groups]
    for ax in (a1, a2):
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    a1.set_ylabel("attribution outside the cell (%)")
    a1.set_title("filled: trained model; hollow: randomised head", fontsize=8)
    a2.set_ylabel("Spearman rho")
    a2.axhline(rd.HEAD_CHECK_RHO, color="grey", lw=0.6, ls="--")
    a2.set_title("dots: trained vs randomised-head maps; x: random pairs", fontsize=8)
    return Section(key, title, png=_png(fig), reading=rd.gradcam_reading(summary))


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


def _gradcam_columns(leak, clean, run, x, m, device: str, notes: list) -> tuple[list, dict]:
    """Grad-CAM maps of the leak model and its clean model on the example crops (as each model
    scored them), and each map's mean mass outside the cell."""
    import torch

    from probes.base import apply_preprocess
    from probes.saliency import gradcam, outside_mass

    from shortcutlab.models.runs import load_run

    cams, masses = [], {}
    for ref, label in ((leak, "leak"), (clean, "clean")):
        if ref is None:
            notes.append("No clean model of the same seed and architecture has a run folder: one Grad-CAM column.")
            continue
        try:
            r = run if ref is leak else load_run(ref.run_dir, device=device)
            pre = r.preprocess  # the crops as the model scored them (its masked background)
            # (resized with the crops for a run with an input size)
            xin, min_ = apply_preprocess(pre, x, m) if pre is not None and m is not None else (x, m)
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
    return cams, masses


def _example_grid(x, m, columns: list, cams: list):
    """The figure: one row per crop, the crop (with its cell outline), each intervention, then
    each Grad-CAM overlay."""
    plt = _plt()
    ncol = len(columns) + len(cams)
    B = x.shape[0]
    fig, axes = plt.subplots(B, ncol, figsize=(1.25 * ncol, 1.3 * B + 0.4), squeeze=False)
    mk = None if m is None else m[:, 0].cpu().numpy()
    for j, (name, imgs) in enumerate(columns):
        arr = imgs.detach().float().cpu().clamp(0, 1).permute(0, 2, 3, 1).numpy()
        for i in range(B):
            ax = axes[i][j]
            ax.imshow(arr[i], interpolation="nearest")
            if mk is not None and j == 0:
                ax.contour(mk[i], levels=[0.5], colors="lime", linewidths=0.8)
    base = x.detach().float().cpu().permute(0, 2, 3, 1).numpy()
    for j, (name, maps) in enumerate(cams, start=len(columns)):
        for i in range(B):
            ax = axes[i][j]
            ax.imshow(base[i], interpolation="nearest")
            mp = maps[i].numpy()
            ax.imshow(mp / mp.max() if mp.max() > 0 else mp, cmap="jet", alpha=0.5, vmin=0, vmax=1, interpolation="bilinear")
            if mk is not None:
                ax.contour(mk[i], levels=[0.5], colors="white", linewidths=0.6)
    names = [c[0] for c in columns] + [c[0] for c in cams]
    for j, name in enumerate(names):
        # wrapped to the panel's width: long intervention names overlapped their neighbours
        axes[0][j].set_title(textwrap.fill(name, 16), fontsize=6)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    return fig


@_plain_text
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
    cams, masses = _gradcam_columns(leak, clean, run, x, m, device, notes)
    fig = _example_grid(x, m, columns, cams)
    B = len(pick)
    reading = (f"{B} test crops of the {leak.condition} leak model ({leak.cell or 'leak'}, {leak.arch}, seed {leak.seed}), "
               f"one per parent, with their cell outlines; then {len(columns) - 1} intervention"
               f"{'s' if len(columns) != 2 else ''} applied ({', '.join(c[0] for c in columns[1:]) or 'none'}) and "
               f"{', '.join(c[0] for c in cams) or 'no Grad-CAM map'} (red: more attribution)")
    if masses:
        reading += "; on these crops the maps put " + " and ".join(f"{rd.pct(v)} ({k} model)" for k, v in masses.items()) + \
                   " of their mass outside the cell"
    return Section(key, title, png=_png(fig), reading=reading + ".", notes=notes)
