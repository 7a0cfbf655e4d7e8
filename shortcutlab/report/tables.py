"""The numbers behind the report's figures, as tidy frames (pure functions of the tables).

Units: fractions (accuracies, R, outside mass, effects); the readings print them in pp.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

import numpy as np
import pandas as pd

from shortcutlab.report.readings import (diagnostic_class, diagnostic_label, headline_arch, intervention_label,
                                         intervention_rows, moves_verdict, removal_verdict, share_note,
                                         suppliers)
from shortcutlab.stats import get_estimand
from shortcutlab.stats.hypotheses import registered_tests
from shortcutlab.stats.units import format_interval, format_value, is_nan, pct, pp_number

PAIR_KEYS = ["condition", "arch", "diversity", "seed"]


def per_model_accuracy(pred: pd.DataFrame, baseline: str = "none") -> pd.DataFrame:
    """One row per model: condition, arch, protocol, cell, group (the cell, or the protocol for
    single-cell protocols), seed, accuracy on the unaltered crops, n crops."""
    p = pred[pred["intervention"].astype(str) == baseline]
    keys = ["model", "condition", "arch", "protocol", "cell", "seed"]
    keys = [k for k in keys if k in p.columns]
    acc = p.groupby(keys, observed=True)["correct"].agg(["mean", "size"]).reset_index()
    acc = acc.rename(columns={"mean": "accuracy", "size": "n"})
    for k in ("protocol", "cell"):
        if k not in acc:
            acc[k] = ""
        acc[k] = acc[k].astype(str)
    acc["group"] = np.where(acc["cell"] != "", acc["cell"], acc["protocol"])
    for k in ("condition", "arch", "model"):
        acc[k] = acc[k].astype(str)
    return acc.sort_values(["condition", "group", "arch", "seed"]).reset_index(drop=True)


# --- results rows per model and leak/clean pairs ------------------------------------------------

def _model_values(results: pd.DataFrame, diagnostic: str, metric: str, setting) -> pd.DataFrame:
    """One value per model of the rows (diagnostic, metric, setting) with the model's keys.

    `setting` is a string, or a callable on the setting column giving a mask.
    """
    r = results[(results["diagnostic"] == diagnostic) & (results["metric"] == metric)]
    r = r[setting(r["setting"])] if callable(setting) else r[r["setting"] == setting]
    if r.empty:
        return pd.DataFrame(columns=PAIR_KEYS + ["exposure", "value"])
    keys = PAIR_KEYS + ["exposure"]
    r = r.assign(condition=r["condition"].astype(str), arch=r["arch"].astype(str), diversity=r["diversity"].astype(str))
    return r.groupby(["model"] + keys)["value"].mean().reset_index()


def paired(results: pd.DataFrame, diagnostic: str, metric: str, setting) -> pd.DataFrame:
    """Leak and clean values of one metric side by side, per (condition, arch, diversity, seed).

    Returns:
        columns condition, arch, diversity, seed, leak, clean, diff (leak - clean); pairs
        lacking one side are left out.
    """
    v = _model_values(results, diagnostic, metric, setting)
    v = v[v["exposure"].isin(["leak", "clean"])]
    if v.empty:
        return pd.DataFrame(columns=PAIR_KEYS + ["leak", "clean", "diff"])
    w = v.pivot_table(index=PAIR_KEYS, columns="exposure", values="value", aggfunc="mean")
    if not {"leak", "clean"} <= set(w.columns):
        return pd.DataFrame(columns=PAIR_KEYS + ["leak", "clean", "diff"])
    w = w.dropna(subset=["leak", "clean"]).reset_index()
    w["diff"] = w["leak"] - w["clean"]
    return w[PAIR_KEYS + ["leak", "clean", "diff"]]


def seed_interval(values: pd.DataFrame, column: str, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float, int]:
    """Mean of `column` over seeds (architectures averaged within a seed first) and a percentile
    bootstrap interval that resamples seeds.

    Returns:
        (mean, low, high, number of seeds); the interval is NaN with fewer than
        `stats.bootstrap.MIN_CLUSTERS` (3) seeds, as the estimates' are, and where the seeds'
        values do not vary (never a degenerate [x, x]).
    """
    from shortcutlab.stats.bootstrap import MIN_CLUSTERS

    per_seed = values.groupby("seed")[column].mean().dropna().to_numpy(float)
    k = len(per_seed)
    if k == 0:
        return (np.nan, np.nan, np.nan, 0)
    mean = float(per_seed.mean())
    if k < MIN_CLUSTERS or n_boot <= 0 or np.ptp(per_seed) <= 1e-12 * max(1.0, abs(mean)):
        return (mean, np.nan, np.nan, k)
    rng = np.random.default_rng(seed)
    reps = per_seed[rng.integers(0, k, size=(n_boot, k))].mean(axis=1)
    a = (1 - level) / 2
    lo, hi = np.quantile(reps, [a, 1 - a])
    return (mean, float(lo), float(hi), k)


def _not_class(setting: pd.Series) -> pd.Series:
    return ~setting.str.contains("class=", regex=False)


# --- the rows of a quantity (`probes.QUANTITIES`), found by who supplies it ------------------------

class Source(NamedTuple):
    """Where the report reads a quantity: the quantity (`probes.QUANTITIES`), the diagnostic and
    metric of the results rows that carry it (`Diagnostic.supplies`), and the setting read."""

    quantity: str
    diagnostic: str
    metric: str
    setting: object


#: The quantities read as the models' R, in order of preference: the parent probe's R, else
#: the R before erasure.
R_QUANTITIES = ("recoverability", "recoverability_before_erasure")


def supplied_rows(results: pd.DataFrame, quantity: str) -> tuple[str, str, pd.DataFrame]:
    """(diagnostic, metric, rows) of `quantity` in `results`: the rows of the first registered
    supplier of it (by name, `readings.suppliers`) that has any; ('', '', no rows) when none has."""
    for name, metric in suppliers(quantity):
        r = results[(results["diagnostic"] == name) & (results["metric"] == metric)]
        if not r.empty:
            return name, metric, r
    return "", "", results.iloc[0:0]


def _quantity_values(results: pd.DataFrame, quantity: str, setting) -> pd.DataFrame:
    """`_model_values` of the rows that carry `quantity` (`supplied_rows`)."""
    name, metric, _ = supplied_rows(results, quantity)
    return _model_values(results, name, metric, setting)


def r_source(results: pd.DataFrame | None) -> Source | None:
    """Where the models' overall R is read (`R_QUANTITIES`): "recoverability" (its rows
    without a class, the shortest setting), else "recoverability_before_erasure" at the
    erasure setting (`erasure_setting`); None when the results supply neither."""
    if results is None or results.empty:
        return None
    name, metric, r = supplied_rows(results, "recoverability")
    r = r[_not_class(r["setting"])]
    if not r.empty:
        return Source("recoverability", name, metric, sorted(r["setting"].unique(), key=len)[0])
    name, metric, r = supplied_rows(results, "recoverability_before_erasure")
    if not r.empty:
        return Source("recoverability_before_erasure", name, metric, erasure_setting(results))
    return None


def erasure_setting(results: pd.DataFrame | None) -> str | None:
    """The erasure setting to read ('rank=256', or 'rank=full'): the largest among the rows of
    "recoverability_after_erasure" ('full' above every number); None without them."""
    if results is None or results.empty:
        return None
    s = supplied_rows(results, "recoverability_after_erasure")[2]["setting"].unique()
    if not len(s):
        return None

    def key(x):
        v = x.split("=", 1)[-1]
        return float("inf") if v == "full" else float(v) if v.replace(".", "").isdigit() else -1.0

    return sorted(s, key=key)[-1]


def erasure_heads(results: pd.DataFrame, setting: str) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """The refitted heads of the erasure at `setting` on the split's test side: (the diagnostic
    supplying "head_accuracy_before_erasure", `paired` accuracies before, `paired` after)."""
    test = f"{setting},test_set=test"
    name, metric, _ = supplied_rows(results, "head_accuracy_before_erasure")
    before = paired(results, name, metric, test)
    after = paired(results, *supplied_rows(results, "head_accuracy_after_erasure")[:2], test)
    return name, before, after


def dose_pairs(pred: pd.DataFrame, results: pd.DataFrame | None, baseline: str = "none") -> pd.DataFrame:
    """One row per leak/clean pair: R of the leak model (`r_source`), the leak gap (models' own
    heads, on their common test crops), and with erasure rows ("recoverability_after_erasure",
    "head_accuracy_*_erasure") R_after and the gap of refitted heads before and after erasure
    (gap_before, gap_after).

    Returns:
        columns condition, arch, diversity, seed, R, gap, R_after, gap_before, gap_after
        (NaN where absent); empty without R rows or factorial pairs.
    """
    cols = PAIR_KEYS + ["R", "gap", "R_after", "gap_before", "gap_after"]
    src = r_source(results)
    if src is None:
        return pd.DataFrame(columns=cols)
    from shortcutlab.stats import factorial_rows, check_predictions

    p = check_predictions(pred)
    fac, _ = factorial_rows(p[p["intervention"] == baseline])
    if fac.empty:
        return pd.DataFrame(columns=cols)
    acc = fac.groupby(PAIR_KEYS + ["exposure"], observed=True)["correct"].mean().unstack("exposure")
    if not {"leak", "clean"} <= set(acc.columns):
        return pd.DataFrame(columns=cols)
    gap = (acc["leak"] - acc["clean"]).rename("gap").dropna().reset_index()
    for k in ("condition", "arch", "diversity"):
        gap[k] = gap[k].astype(str)
    R = _model_values(results, src.diagnostic, src.metric, src.setting)
    R = R[R["exposure"] == "leak"][PAIR_KEYS + ["value"]].rename(columns={"value": "R"})
    out = gap.merge(R, on=PAIR_KEYS)
    rank = erasure_setting(results)
    if rank is not None:
        after = _quantity_values(results, "recoverability_after_erasure", rank)
        after = after[after["exposure"] == "leak"][PAIR_KEYS + ["value"]].rename(columns={"value": "R_after"})
        out = out.merge(after, on=PAIR_KEYS, how="left")
        _, b, a = erasure_heads(results, rank)
        heads = b[PAIR_KEYS + ["diff"]].rename(columns={"diff": "gap_before"}).merge(
            a[PAIR_KEYS + ["diff"]].rename(columns={"diff": "gap_after"}), on=PAIR_KEYS)
        out = out.merge(heads, on=PAIR_KEYS, how="left")
    for c in cols:
        if c not in out:
            out[c] = np.nan
    return out[cols].sort_values(PAIR_KEYS).reset_index(drop=True)


def _quantity_counts(results: pd.DataFrame, quantity: str, setting: str) -> pd.DataFrame:
    """Per model, the count rows that carry `quantity` at `setting`: columns model, value
    (the count) and n (what it counts out of), each summed over the model's rows."""
    name, metric, r = supplied_rows(results, quantity)
    r = r[r["setting"] == setting]
    if r.empty:
        return pd.DataFrame(columns=["model", "value", "n"])
    return r.assign(n=pd.to_numeric(r["n"], errors="coerce")).groupby("model")[["value", "n"]].sum(min_count=1).reset_index()


#: The count columns of `gradcam_rows`: (column, quantity, its n's column).
_GRADCAM_COUNTS = (("randomized_constant_maps", "randomized_constant_maps", "n_maps"),
                   ("randomized_undefined", "randomized_undefined", None))


def gradcam_rows(results: pd.DataFrame | None) -> pd.DataFrame:
    """One row per model with saliency rows (the quantities "outside_mass" and the rest, as
    Grad-CAM supplies them), a column each: keys, outside_mass, randomized_outside_mass,
    randomized_head_spearman (the head alone, cascade=0), random_pair_spearman; the counts
    randomized_constant_maps (randomised-head maps that are constant) and randomized_undefined
    (crops whose rho is undefined) out of n_maps crops, and cam_height, cam_width (the cells of
    the saliency layer); NaN where the rows do not say."""
    cols = ["model"] + PAIR_KEYS + ["exposure", "outside_mass", "randomized_outside_mass", "randomized_head_spearman",
                                    "random_pair_spearman", "randomized_constant_maps", "randomized_undefined", "n_maps",
                                    "cam_height", "cam_width"]
    if results is None or results.empty:
        return pd.DataFrame(columns=cols)
    name, metric, om = supplied_rows(results, "outside_mass")
    om = om[~om["setting"].str.contains("cascade=", regex=False)]
    if om.empty:
        return pd.DataFrame(columns=cols)
    base = sorted(om["setting"].unique(), key=len)[0]
    parts = [_model_values(results, name, metric, base).rename(columns={"value": "outside_mass"})]
    for quantity, setting in (("randomized_outside_mass", f"{base},cascade=0"), ("randomized_head_spearman", f"{base},cascade=0"),
                              ("random_pair_spearman", base), ("cam_height", base), ("cam_width", base)):
        v = _quantity_values(results, quantity, setting)
        if "model" in v:  # rows that do not supply a quantity (an older sweep) leave its column NaN
            parts.append(v[["model", "value"]].rename(columns={"value": quantity}))
    for column, quantity, n_col in _GRADCAM_COUNTS:
        v = _quantity_counts(results, quantity, f"{base},cascade=0").rename(columns={"value": column, "n": n_col or "drop"})
        parts.append(v.drop(columns=["drop"], errors="ignore"))
    out = parts[0]
    for v in parts[1:]:
        out = out.merge(v, on="model", how="left")
    for c in cols:
        if c not in out:
            out[c] = np.nan
    out["exposure"] = out["exposure"].replace("", "unpaired")
    return out[cols].sort_values(["condition", "exposure", "seed"]).reset_index(drop=True)


def gradcam_summary(rows: pd.DataFrame) -> dict:
    """Means for the Grad-CAM reading: outside mass per exposure, randomised-head outside mass,
    median rhos (medians over models of the per-model medians); the randomised-head maps that
    are constant and the crops with an undefined rho, summed over models, out of ``maps``
    crops (absent where the rows do not count them); and ``cam_cells``, the (h, w) of the
    coarsest saliency layer among the models (absent where unknown); and, with more than one
    condition, ``outside_mass_by_condition`` ({condition: {exposure: mean}}, ``none`` last)."""
    if rows.empty:
        return {}
    om = {str(k): float(v) for k, v in rows.groupby("exposure")["outside_mass"].mean().items() if np.isfinite(v)}
    order = {"leak": 0, "clean": 1}
    om = dict(sorted(om.items(), key=lambda kv: order.get(kv[0], 2)))

    def med(c):
        v = rows[c].dropna()
        return float(v.median()) if len(v) else np.nan

    out = {"outside_mass": om, "randomized_outside_mass": float(rows["randomized_outside_mass"].mean())
           if rows["randomized_outside_mass"].notna().any() else np.nan,
           "randomized_head_spearman": med("randomized_head_spearman"), "random_pair_spearman": med("random_pair_spearman")}
    counted = rows.dropna(subset=["n_maps"]) if "n_maps" in rows else rows.iloc[0:0]
    if len(counted) and counted["n_maps"].sum() > 0:
        out["maps"] = int(counted["n_maps"].sum())
        for c in ("randomized_constant_maps", "randomized_undefined"):
            if counted[c].notna().any():
                out[c] = int(counted[c].sum())
    if rows["condition"].nunique() > 1:
        by = rows.groupby(["condition", "exposure"])["outside_mass"].mean()
        conds = sorted(rows["condition"].astype(str).unique(), key=lambda c: (c == "none", c))
        out["outside_mass_by_condition"] = {
            c: dict(sorted(((str(e), float(v)) for (cc, e), v in by.items() if str(cc) == c and np.isfinite(v)),
                           key=lambda kv: order.get(kv[0], 2)))
            for c in conds}
    cells = rows.dropna(subset=["cam_height", "cam_width"]) if {"cam_height", "cam_width"} <= set(rows) else rows.iloc[0:0]
    if len(cells):
        h, w = min(zip(cells["cam_height"].astype(int), cells["cam_width"].astype(int)), key=lambda hw: (hw[0] * hw[1], hw))
        out["cam_cells"] = (int(h), int(w))
    return out


# --- the validity table (the issue's item 3) ------------------------------------------------

VALIDITY_COLUMNS = ["condition", "diversity", "arch", "leak", "leak_ci_low", "leak_ci_high", "kind", "item", "estimate",
                    "ci_low", "ci_high", "share", "share_ci_low", "share_ci_high", "clean_cost", "cost_ci_low", "cost_ci_high",
                    "verdict", "n_seeds"]


def _pair_subset(frame: pd.DataFrame, condition: str, diversity: str, arch: str) -> pd.DataFrame:
    f = frame[(frame["condition"] == condition) & (frame["diversity"] == diversity)]
    return f if arch == "pooled" else f[f["arch"] == arch]


def validity_table(est: pd.DataFrame, results: pd.DataFrame | None = None, *, n_boot: int = 2000, seed: int = 0,
                   level: float = 0.95) -> pd.DataFrame:
    """For each planted mechanism (condition) and diversity level: the leak, what each
    intervention removes of it next to its cost on clean models, and whether the diagnostics
    move with it (the issue's validity table).

    Rows (`kind`):

    - ``intervention``: estimate = the leak cut, share = the share removed, clean_cost = the
      accuracy cost on clean models, each with its interval from `est`; verdict from
      `readings.removal_verdict` (the rule table of `shortcutlab.report.readings`); the share
      is blank (NaN) where the leak is not a leak (`readings.share_note`);
    - ``R``: estimate = leak-model R minus clean-model R, paired by seed, where the R is the
      quantity "recoverability" (the parent probe's; `r_source`);
    - ``erasure``: estimate = the leak gap of refitted heads before minus after erasure
      ("head_accuracy_before_erasure" and "..._after_erasure", LEACE's, at the largest rank), share = that cut over the gap before, clean_cost = the clean
      heads' accuracy cost; verdict as for an intervention;
    - one per metric a registered diagnostic declares in its ``leak_metrics`` (kind = the
      diagnostic's name, e.g. ``gradcam``: leak-model minus clean-model Grad-CAM outside
      mass), item "<label> <metric label>" as the diagnostic class names them.

    The diagnostic rows' intervals resample seeds (`seed_interval`; architectures averaged
    within a seed for the pooled row); R and the leak metrics get `readings.moves_verdict`.

    Args:
        est: the estimates table (`shortcutlab.stats.estimates`).
        results: the sweep's results rows (with the model key columns), or None.

    Returns:
        `VALIDITY_COLUMNS`, fractions; empty when `est` holds no leak row with an estimate.
    """
    rows = []
    leaks = est[(est["estimand"] == "leak") & (est["intervention"] == "none") & est["estimate"].notna()]
    sources = _diagnostic_sources(results)
    for condition in sorted(leaks["condition"].unique()):
        arch = headline_arch(est, condition)
        for diversity in sorted(leaks.loc[leaks["condition"] == condition, "diversity"].unique()):
            lr = leaks[(leaks["condition"] == condition) & (leaks["diversity"] == diversity) & (leaks["arch"] == arch)]
            if lr.empty:
                continue
            lr = lr.iloc[0]
            head = dict(condition=condition, diversity=diversity, arch=arch, leak=lr["estimate"], leak_ci_low=lr["ci_low"],
                        leak_ci_high=lr["ci_high"])
            rows += _intervention_validity(est, head, lr["n_seeds"])
            if sources is None:
                continue
            boot = dict(n_boot=n_boot, seed=seed, level=level)
            rows += _r_validity(results, sources, head, boot)
            rows += _erasure_validity(results, sources, head, lr, boot)
            rows += _leak_metric_validity(results, sources, head, boot)
    out = pd.DataFrame(rows, columns=VALIDITY_COLUMNS)
    return _shares_of_leaks_only(out)


def _shares_of_leaks_only(table: pd.DataFrame) -> pd.DataFrame:
    """The table with the share removed (and its interval) blanked where the leak is not a
    leak (`readings.share_note`): a share of a leak whose interval includes or lies below 0
    divides by a number that may be 0 or negative ("187% (-200% to 867%)")."""
    if table.empty:
        return table
    keep = [share_note(r.leak, r.leak_ci_low, r.leak_ci_high) == "" for r in table.itertuples(index=False)]
    table.loc[~np.asarray(keep, dtype=bool), ["share", "share_ci_low", "share_ci_high"]] = np.nan
    return table


def _diagnostic_sources(results: pd.DataFrame | None) -> dict | None:
    """What the validity table reads in `results`, found once: the R source (`r_source`), the
    erasure setting (`erasure_setting`) and, per registered diagnostic declaring ``leak_metrics``, each
    metric's overall setting (the shortest naming no class); None without results."""
    if results is None or results.empty:
        return None
    leak_metrics = []
    names = set(results["diagnostic"].astype(str))
    for name in sorted(names):
        cls = diagnostic_class(name)
        for metric in getattr(cls, "leak_metrics", ()):
            r = results[(results["diagnostic"] == name) & (results["metric"] == metric)]
            settings = [v for v in r["setting"].unique() if "class=" not in str(v)]
            if settings:
                leak_metrics.append((name, metric, sorted(settings, key=len)[0]))
    return {"r": r_source(results), "rank": erasure_setting(results), "leak_metrics": leak_metrics}


def _intervention_validity(est: pd.DataFrame, head: dict, n_seeds) -> list[dict]:
    return [dict(head, kind="intervention", item=r["setting"], estimate=r["cut"]["estimate"],
                 ci_low=r["cut"]["ci_low"], ci_high=r["cut"]["ci_high"], share=r["share"]["estimate"],
                 share_ci_low=r["share"]["ci_low"], share_ci_high=r["share"]["ci_high"],
                 clean_cost=r["cost"]["estimate"], cost_ci_low=r["cost"]["ci_low"],
                 cost_ci_high=r["cost"]["ci_high"], verdict=r["verdict"], n_seeds=n_seeds)
            for r in intervention_rows(est, head["condition"], head["diversity"], head["arch"])]


def _moves_row(values: pd.DataFrame, head: dict, kind: str, item: str, boot: dict) -> list[dict]:
    """The row of one diagnostic metric's leak-minus-clean difference, if a pair has it."""
    d = _pair_subset(values, head["condition"], head["diversity"], head["arch"])
    if not len(d):
        return []
    m, lo, hi, k = seed_interval(d, "diff", boot["n_boot"], boot["seed"], boot["level"])
    return [dict(head, kind=kind, item=item, estimate=m, ci_low=lo, ci_high=hi, verdict=moves_verdict(lo, hi), n_seeds=k)]


def _r_validity(results: pd.DataFrame, sources: dict, head: dict, boot: dict) -> list[dict]:
    """The R row, where the models' R is the quantity "recoverability" (not the R before an
    erasure), named "<label> <metric label> (<setting>)" by its supplier."""
    src = sources["r"]
    if src is None or src.quantity != "recoverability":
        return []
    item = f"{diagnostic_label(src.diagnostic, src.metric)} ({src.setting or 'overall'})"
    return _moves_row(paired(results, src.diagnostic, src.metric, src.setting), head, "R", item, boot)


def _erasure_validity(results: pd.DataFrame, sources: dict, head: dict, lr, boot: dict) -> list[dict]:
    """The erasure row: the refitted heads' leak gap before minus after erasure (`erasure_heads`)."""
    rank = sources["rank"]
    if rank is None:
        return []
    name, b, a = erasure_heads(results, rank)
    j = b.merge(a, on=PAIR_KEYS, suffixes=("_b", "_a"))
    j = _pair_subset(j, head["condition"], head["diversity"], head["arch"])
    if not len(j):
        return []
    j = j.assign(cut=j["diff_b"] - j["diff_a"], cost=j["clean_b"] - j["clean_a"], gap=j["diff_b"])
    m, lo, hi, k = seed_interval(j, "cut", boot["n_boot"], boot["seed"], boot["level"])
    gap = float(j.groupby("seed")["gap"].mean().mean())
    cost = float(j.groupby("seed")["cost"].mean().mean())
    share = m / gap if gap else np.nan
    verdict = removal_verdict(m, lo, hi, share, lr["estimate"], lr["ci_low"], lr["ci_high"], cost)
    return [dict(head, kind="erasure", item=f"{diagnostic_label(name)} {rank} (refitted heads)", estimate=m, ci_low=lo,
                 ci_high=hi, share=share, clean_cost=cost, verdict=verdict, n_seeds=k)]


def _leak_metric_validity(results: pd.DataFrame, sources: dict, head: dict, boot: dict) -> list[dict]:
    """One row per leak metric a registered diagnostic declares (`Diagnostic.leak_metrics`)."""
    rows = []
    for name, metric, setting in sources["leak_metrics"]:
        rows += _moves_row(paired(results, name, metric, setting), head, name, diagnostic_label(name, metric), boot)
    return rows


# --- the audit card ------------------------------------------------------------------------------

def audit_card(manifest: str, split: str, columns: dict | None = None, geometry: bool = False,
               results: pd.DataFrame | None = None, cells: Iterable[str] | None = None) -> dict:
    """The data's audit card for one benchmark and split: parents, crops, classes, split unit
    and protocol, and per cell of the split the test side's share with a training sibling
    and with a pixel-overlapping training sibling (`shortcutlab.data.audit`).

    Hook: where `results` holds rows of a ``siblings`` diagnostic (metric ``share``), their
    mean is added as ``siblings_share``.

    Args:
        manifest, split: the crop manifest and split manifest CSVs.
        columns: the crop manifest's id/label/parent columns where not so named.
        geometry: the manifest has boxes (x, y, w, h): measure pixel overlap.
        results: the sweep's results rows, or None.
        cells: the cells to keep (those a model was trained on); None keeps every cell.

    Returns:
        dict with n_crops, n_parents, n_classes, sibling_share (closed form: crops whose parent
        holds another), protocol, unit, params, sha256, split_text (how the split was made, in
        words: `split_words`), and cells: {cell: {n_test, n_train, test_parents,
        with_train_sibling, with_overlapping_train_sibling}}.
    """
    from shortcutlab.data.audit import audit
    from shortcutlab.data.manifest import SplitManifest
    from shortcutlab.data.table import CropTable

    c = {"id": "id", "label": "label", "parent": "parent", **(columns or {})}
    kw = {"box": "x,y,w,h"} if geometry else {}
    table = CropTable.from_csv(manifest, id=c["id"], label=c["label"], parent=c["parent"], **kw)
    sm = SplitManifest.read(split)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = audit(table, split=sm)
    measured = res.get("measured") or {}
    found = measured if measured and "train" not in measured else {"": measured}
    unit = (sm.params or {}).get("unit", "parent" if sm.protocol in ("factorial", "parent", "parent-dedup") else
                                  "crop" if sm.protocol == "crop" else "unknown")
    card = dict(n_crops=res["n_crops"], n_parents=res["n_parents"], n_classes=res["n_classes"],
                sibling_share=res["sibling_share"], protocol=sm.protocol, unit=unit,
                params={k: v for k, v in (sm.params or {}).items() if k != "dedup"}, sha256=sm.hash,
                split_text=split_words(sm.protocol, unit, sm.params or {}, sm.report or {}), cells={})
    keep = None if cells is None else {str(x) for x in cells}
    for name, m in found.items():
        if not isinstance(m, dict) or "test" not in m or (keep is not None and name and name not in keep):
            continue
        t = m["test"]
        card["cells"][name] = dict(n_train=m.get("train", {}).get("n_crops"), n_test=t["n_crops"], test_parents=t["n_parents"],
                                   with_train_sibling=t.get("with_train_sibling"),
                                   with_overlapping_train_sibling=t.get("with_overlapping_train_sibling"))
    if results is not None and not results.empty:
        s = results[(results["diagnostic"] == "siblings") & (results["metric"] == "share")]
        if not s.empty:
            card["siblings_share"] = float(s["value"].mean())
    return card


def split_words(protocol: str, unit: str, params: dict, report: dict) -> str:
    """How a split was made, in words: the factorial's design ('factorial: one common test set
    (30% of the parents); leak cells train on other crops of the test parents, clean cells on
    other parents'), else '<protocol> by <unit>'."""
    if protocol != "factorial":
        return f"{protocol} by {unit}"
    share = params.get("test_parent_share")
    n = report.get("n_test_parents")
    of = ", ".join(x for x in (f"{pct(share)} of the parents" if share is not None else "",
                               f"{n:,} parents" if isinstance(n, int) else "") if x)
    text = (f"factorial: one common test set{f' ({of})' if of else ''}; leak cells train on other crops of the test "
            f"parents, clean cells on other parents")
    reserved = report.get("n_reserved_parents")
    if isinstance(reserved, int) and reserved:
        text += f"; {reserved:,} parents held back as unseen fields"
    return text


# --- the registered tests (the paper's Table 2) ---------------------------------------------------

def _p_text(p) -> str:
    """A p-value as the paper prints it: '<0.001', else three decimals; '' for no test."""
    if p is None or not np.isfinite(p):
        return ""
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def registered_table(est: pd.DataFrame, level: float = 0.95, sensitivity: pd.DataFrame | None = None) -> pd.DataFrame:
    """The estimates' registered tests as display strings, in the paper's order (Table 2):
    hypothesis, test, condition, estimate and interval in the estimand's unit, p, p_holm, the
    Holm family and whether it is rejected at the family-wise level (a row without an interval
    says why instead: never a degenerate [x, x]); with `sensitivity`
    (`stats.sensitivity.sensitivity_summary`) the sensitivity p-values beside them (sign-flip,
    t on per-seed differences with its df, binomial mixed model). Empty when no row carries a
    hypothesis."""
    rows = registered_tests(est, sensitivity)
    out = []
    for r in rows.to_dict("records"):
        unit = get_estimand(str(r["estimand"])).unit
        scale = 100.0 if unit.startswith("pp per") else 1.0      # a slope of fractions, printed in pp
        lo, hi = r["ci_low"], r["ci_high"]
        if not is_nan(lo) and lo == hi:                           # resamples that do not vary: no interval
            lo = hi = np.nan
            why = f"the resamples do not vary ({int(r['n_seeds'])} seed(s))"
            r = {**r, "p_value": np.nan, "p_holm": np.nan, "reason": f"{why}; {r['reason']}" if r.get("reason") else why}
        interval = format_interval(lo * scale, hi * scale, unit, level) if not is_nan(lo) else "no interval"
        if interval == "no interval" and r.get("reason"):
            interval = f"no interval: {r['reason']}"
        value = f"{pp_number(r['estimate'])} {unit}" if scale != 1 and not is_nan(r["estimate"]) else \
            format_value(r["estimate"], unit)
        cut = r["estimand"] in ("leak_cut", "leak_cut_pooled")      # named by the intervention's label, as elsewhere
        what = r["name"] + (f" ({intervention_label(str(r['intervention']))})" if cut else "")
        what += f" [{r['recipe']}]" if str(r.get("recipe") or "") not in ("", "nan") else ""
        tested = not is_nan(r["p_holm"])
        row = {"hypothesis": r["hypothesis"], "test": what, "condition": r["condition"],
               "estimate": value, "interval": interval, "p": _p_text(r["p_value"]),
               "p_holm": _p_text(r["p_holm"]), "family": r["family"],
               "reject": ("yes" if r["reject"] else "no") if tested else ""}
        if sensitivity is not None:
            df = r.get("df", np.nan)
            row.update({"p sign-flip": _p_text(r.get("p_sign_flip", np.nan)),
                        "p t": _p_text(r.get("p_t", np.nan)) + (f" ({df:.3g} df)" if not is_nan(df) else ""),
                        "p GLMM": _p_text(r.get("p_glmm", np.nan))})
        out.append(row)
    cols = ["hypothesis", "test", "condition", "estimate", "interval", "p", "p_holm", "family", "reject"]
    return pd.DataFrame(out, columns=cols + (["p sign-flip", "p t", "p GLMM"] if sensitivity is not None else []))
