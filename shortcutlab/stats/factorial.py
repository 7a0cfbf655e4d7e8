"""The leak effect of the factorial: leak-model minus clean-model accuracy on the common test
crops, with the paired two-way cluster bootstrap (the paper's H3, F3)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from .bootstrap import DEFAULT_INTERVAL, Cells, check_interval, degenerate_reason, estimate_row, finish_rows, paired_support
from .errors import StatsWarning
from .predictions import check_predictions, check_unique, group_codes

__all__ = ["LEAK_COLUMNS", "factorial_bootstrap", "factorial_rows", "leak_effect", "leak_rows", "leak_table",
           "no_factorial_rows", "prepare_factorial"]

LEAK_COLUMNS = ["estimand", "condition", "arch", "diversity", "intervention", "estimate", "ci_low", "ci_high", "se",
                "p_value", "n_seeds", "n_parents", "n_crops", "n_boot", "reason", "interval_method"]


def factorial_rows(pred: pd.DataFrame) -> tuple[pd.DataFrame, list[dict]]:
    """Factorial rows restricted to crops scored by both the leak and the clean model of their
    (condition, seed, arch, diversity, intervention); plus records of groups that lack one side."""
    is_leak = pred["exposure"].to_numpy() == "leak"
    fac_mask = is_leak | (pred["exposure"].to_numpy() == "clean")
    fac = pred if fac_mask.all() else pred[fac_mask]
    is_leak = is_leak[fac_mask].astype(np.float64)
    keys = ["condition", "arch", "diversity", "intervention"]
    cell = group_codes(fac, keys)
    n_leak, n_all = np.bincount(cell, weights=is_leak), np.bincount(cell)
    lone_cells = (n_leak == 0) | (n_leak == n_all)         # a cell without its clean or leak model
    missing = []
    if lone_cells.any():
        first = np.unique(cell, return_index=True)[1]
        for c in np.flatnonzero(lone_cells):
            row = fac.iloc[first[c]]
            lacking = "clean" if n_leak[c] else "leak"
            missing.append(dict({k: str(row[k]) for k in keys}, reason=f"no {lacking} model in this cell"))
        missing.sort(key=lambda m: tuple(m[k] for k in keys))
    g = group_codes(fac, [cell, "seed", "id"])
    leak, both = np.bincount(g, weights=is_leak), np.bincount(g)
    keep = (leak[g] > 0) & (leak[g] < both[g])
    # rows of a lone cell are recorded in `missing`; warn about the rest
    dropped = int((~keep & ~lone_cells[cell]).sum())
    if dropped:
        warnings.warn(f"leak effect: {dropped} of {len(fac)} factorial predictions left out: their crop was not scored "
                      f"by the paired leak/clean model of the same seed (the effect uses the common test crops)",
                      StatsWarning, stacklevel=3)
    return (fac if keep.all() else fac[keep]), missing


def leak_rows(cells: Cells, condition, archs, level, reps, point, pooled: bool, baseline=None,
              interval: str = DEFAULT_INTERVAL):
    """Leak rows (and, from the same draws, cells' leak replicates) for one condition.

    Args:
        cells: the condition's cells (arch x diversity x intervention x exposure).
        condition: its name, for the rows.
        archs: its architectures, sorted.
        level: interval coverage.
        reps: (B, K) resampled cell accuracies, or None.
        point: (K,) cell accuracies.
        pooled: add the pooled-over-architectures rows.
        interval: the method `reps` were drawn for (`Cells.boot`).

    Returns:
        (rows, effects): the leak rows (`estimate_row` dicts), and per (arch, diversity,
        intervention) the (estimate, replicates, (n_seeds, n_parents, n_crops)).
    """
    t = cells.table
    rows, effects = [], {}
    for (div, inter), sub in t.groupby(["diversity", "intervention"], sort=True):
        per_arch = []
        for arch in archs:
            kl = cells.index.get((arch, div, inter, "leak"))
            kc = cells.index.get((arch, div, inter, "clean"))
            if kl is None or kc is None:
                continue
            est = point[kl] - point[kc]
            rep = reps[:, kl] - reps[:, kc] if reps is not None else None
            ns, npar, ncrop = paired_support(cells, [kl, kc])
            reason = degenerate_reason(ns, npar)
            rows.append(estimate_row(est, rep, level, reason, interval, estimand="leak", condition=condition, arch=arch, diversity=div,
                             intervention=inter, n_seeds=ns, n_parents=npar, n_crops=ncrop))
            effects[(arch, div, inter)] = (est, rep, (ns, npar, ncrop))
            per_arch.append((arch, kl, kc))
        if pooled and len(per_arch) > 1:
            est = float(np.mean([effects[(a, div, inter)][0] for a, _, _ in per_arch]))
            rep = np.mean([effects[(a, div, inter)][1] for a, _, _ in per_arch], axis=0) if reps is not None else None
            ns, npar, ncrop = paired_support(cells, [k for _, kl, kc in per_arch for k in (kl, kc)])
            ncrop = sum(effects[(a, div, inter)][2][2] for a, _, _ in per_arch)
            reason = degenerate_reason(ns, npar)
            rows.append(estimate_row(est, rep, level, reason, interval, estimand="leak", condition=condition, arch="pooled",
                             diversity=div, intervention=inter, n_seeds=ns, n_parents=npar, n_crops=ncrop))
            effects[("pooled", div, inter)] = (est, rep, (ns, npar, ncrop))
    return rows, effects


def factorial_bootstrap(pred, n_boot, seed, interval: str = DEFAULT_INTERVAL):
    """Per condition: the cells, their point accuracies and replicates (shared draws) drawn for
    the interval method `interval` (`Cells.boot`).

    Returns:
        ({condition: (cells, point, reps or None, archs)}, missing): `missing` as in
        `factorial_rows`.
    """
    fac, missing = factorial_rows(pred)
    out = {}
    for condition, sub in fac.groupby("condition", sort=True):
        cells = Cells(sub, ["arch", "diversity", "intervention", "exposure"])
        reps = cells.boot(n_boot, np.random.default_rng(seed), interval=interval) if n_boot > 0 else None
        archs = sorted(sub["arch"].unique())
        out[condition] = (cells, cells.point(), reps, archs)
    return out, missing


def prepare_factorial(predictions, n_boot, seed, interval: str = DEFAULT_INTERVAL):
    """Check `predictions` and draw the factorial's bootstrap once: (checked predictions,
    `factorial_bootstrap`'s result), what `leak_effect` and `intervention_effect` share."""
    pred = check_predictions(predictions)
    check_unique(pred)
    return pred, factorial_bootstrap(pred, n_boot, seed, check_interval(interval))


def no_factorial_rows(pred, missing, estimand):
    """NaN rows of `estimand` with their reason: one per cell lacking its clean or leak model
    (`missing`) and one per condition without factorial predictions."""
    rows = [dict(estimand=estimand, **m, estimate=np.nan, ci_low=np.nan, ci_high=np.nan, se=np.nan, p_value=np.nan,
                 n_seeds=0, n_parents=0, n_crops=0, n_boot=0) for m in missing]
    fac_conditions = set(pred.loc[pred["exposure"].isin(["leak", "clean"]), "condition"].unique())
    for condition in sorted(set(pred["condition"].unique()) - fac_conditions):
        rows.append(dict(estimand=estimand, condition=condition, arch="", diversity="", intervention="",
                         estimate=np.nan, ci_low=np.nan, ci_high=np.nan, se=np.nan, p_value=np.nan, n_seeds=0,
                         n_parents=0, n_crops=0, n_boot=0,
                         reason="no factorial: no prediction with exposure 'leak' or 'clean'"))
    return rows


def leak_effect(predictions: pd.DataFrame, *, n_boot: int = 10_000, level: float = 0.95, seed: int = 0,
                pooled: bool = True, interval: str = DEFAULT_INTERVAL) -> pd.DataFrame:
    """Leak effect per condition x arch x diversity x intervention, with its two-way bootstrap.

    The estimate (the paper's H3) is the accuracy of the leak models minus that of the clean
    models on the common test crops: per cell (condition, arch, diversity, intervention) the
    mean of `correct` over every (seed, crop) scored by the leak model minus the same mean for
    the clean model. Crops scored by only one model of a seed's pair are left out (warned).

    Inference: paired two-way cluster bootstrap. Seeds are the clusters of one dimension (a
    drawn seed brings both its leak and its clean model, and every architecture's, because a
    seed fixes the data and the split), test parents of the other (a drawn parent brings its
    crops in every model's test set); the effect is recomputed on the weighted data. All cells
    of a condition share the draws, so differences between rows are paired too.

    - ``interval="cgm"`` (default): Cameron, Gelbach & Miller (2011) two-way clustering from
      three one-way bootstraps (seeds, parents, (seed, parent) cells), V = V_seed + V_parent -
      V_cell, interval est ± t(min(seeds, parents) - 1) sqrt(V) (`cgm_summary`). Measured on
      two generators other than `simulate_factorial` (docs/statistics.md, "Calibration"; the tests in
      tests/test_stats_calibration.py): coverage within 93-97% and SE / Monte Carlo SD near 1.
    - ``interval="pigeonhole"``: seeds and parents resampled independently in one draw (Owen
      2007), percentile interval (`bootstrap_summary`). It counts the seed x parent (and crop)
      variance about three times: conservative (99-100% coverage where that term matters);
      96.4% with 20 seeds where the leak varies by seed and parent, against 48% for a naive
      crop-level bootstrap.

    Fewer than 3 seeds or test parents give no interval (NaN with the reason), whichever the
    method.

    The row ``arch="pooled"`` (when there are two or more architectures) is the unweighted mean
    of the per-architecture effects, resampled under the same draws (seeds jointly across
    architectures, one parent draw): one test per benchmark, as in the paper.

    Args:
        predictions: the sweep's predictions table (see the contract); factorial rows are those
            with `exposure` 'leak' or 'clean'.
        n_boot: resamples (0: point estimates only, NaN intervals).
        level: interval coverage.
        seed: seed of the resampling.
        pooled: add the pooled-over-architectures rows.
        interval: "cgm" (calibrated, default) or "pigeonhole" (conservative).

    Returns:
        One row per cell: estimand ('leak'), condition, arch, diversity, intervention, estimate,
        ci_low, ci_high, se, p_value, n_seeds, n_parents, n_crops (the (seed, crop) pairs scored by
        both models), n_boot (finite resamples), reason ('' or why the interval is NaN),
        interval_method. Cells
        without a clean or a leak model, and conditions without factorial rows, get a NaN row
        with the reason and a `StatsWarning`.

    Example:
        >>> from shortcutlab.stats import leak_effect, simulate_factorial
        >>> pred = simulate_factorial(n_seeds=10, n_parents=40, effect=0.5, seed=1)
        >>> row = leak_effect(pred, n_boot=500).iloc[0]
        >>> bool(row.ci_low < row.estimate < row.ci_high)
        True
    """
    return leak_table(prepare_factorial(predictions, n_boot, seed, interval), level=level, pooled=pooled,
                      interval=interval)


def leak_table(prepared, *, level: float = 0.95, pooled: bool = True, interval: str = DEFAULT_INTERVAL) -> pd.DataFrame:
    """`leak_effect`'s rows from draws made once (`prepare_factorial`, with the same
    `interval`), which `estimates` shares with `intervention_table`."""
    pred, (boots, missing) = prepared
    rows = []
    for condition, (cells, point, reps, archs) in boots.items():
        rows += leak_rows(cells, condition, archs, level, reps, point, pooled, interval=interval)[0]
    rows += no_factorial_rows(pred, missing, "leak")
    return finish_rows(rows, LEAK_COLUMNS)
