"""Dose-response: the OLS slope of a gap on parent recoverability R with a cluster-bootstrap
interval (the paper's F5-F8), and the points it is fitted on."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from shortcutlab.errors import first_rows

from .bootstrap import MIN_CLUSTERS, estimate_row, finish_rows, multinomial_weights
from .errors import StatsError
from .factorial import factorial_rows
from .predictions import check_predictions, need_columns

__all__ = ["DOSE_COLUMNS", "MIN_SLOPE_SEEDS", "dose_points", "dose_response", "slope_interval_problem"]

DOSE_COLUMNS = ["estimand", "estimate", "intercept", "ci_low", "ci_high", "se", "p_value", "n_points", "n_clusters",
                "n_boot", "reason", "interval_method"]


#: A slope's seed-bootstrap interval is stated from this many seeds (clusters) up.
MIN_SLOPE_SEEDS = 3
#: The narrowest spread of R over which a slope's interval is stated (the unit it is stated per).
MIN_R_SPAN = 0.1
#: R values closer than this count as one value (`slope_interval_problem`).
R_RESOLUTION = 0.01


def slope_interval_problem(r_values, seeds) -> str:
    """Why a slope of the gap on R fitted to these points has no meaningful interval ('' when
    it has one): fewer than `MIN_SLOPE_SEEDS` seeds; R at fewer than three distinct values (to
    `R_RESOLUTION`); R spread over less than `MIN_R_SPAN`; or two separated clumps (a gap
    between neighbouring R values wider than half the spread: the slope joins the clumps and
    says nothing between them). These are the rules the report's readings state.

    Args:
        r_values: R of each point (fractions).
        seeds: each point's seed (the bootstrap's cluster).
    """
    n = len(set(seeds))
    if n < MIN_SLOPE_SEEDS:
        return f"{n} seed{'s' if n != 1 else ''}; an interval needs {MIN_SLOPE_SEEDS}"
    r = np.sort(np.asarray(r_values, dtype=float))
    levels = len(np.unique(np.round(r / R_RESOLUTION)))
    span = float(r[-1] - r[0])
    if levels < 3:
        return (f"R takes {levels} distinct value{'s' if levels != 1 else ''} ({r[0]:.2f} to {r[-1]:.2f}); a slope "
                f"through fewer than 3 is a line between clumps")
    if span < MIN_R_SPAN:
        return (f"R spans only {span:.2f} ({r[0]:.2f} to {r[-1]:.2f}), less than the {MIN_R_SPAN:g} the slope is "
                f"stated per, so the slope extrapolates")
    k = int(np.argmax(np.diff(r)))
    if r[k + 1] - r[k] > span / 2:
        return (f"R forms two separated clumps ({r[0]:.2f} to {r[k]:.2f} and {r[k + 1]:.2f} to {r[-1]:.2f}), so "
                f"the slope is a line between them")
    return ""


def dose_response(frame: pd.DataFrame, *, x: str = "R", y: str = "gap", cluster: str | Sequence[str] = "seed",
                  by: Sequence[str] = (), n_boot: int = 10_000, level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """OLS slope of `y` on `x` with a cluster-bootstrap interval (the paper's F5-F8, "gap tracks R").

    The slope is cov(x, y) / var(x) over the points (one row each). Resamples draw the clusters
    (e.g. seeds: the points of one seed share its data and split) with replacement and refit;
    with per-cluster sums of 1, x, y, xy and x^2 every refit is a matrix product. Percentile
    interval and bootstrap p-value as in `bootstrap_summary` (a one-way cluster bootstrap counts
    each cluster's variance once; `interval_method` 'percentile'); resamples with no spread in x
    are left out (counted in n_boot). Fewer than `MIN_CLUSTERS` (3) clusters give no interval:
    with 2 seeds the bootstrap has three distinct resamples and printed "+1.3 [+1.3, +1.3]";
    resamples that do not vary give none either.

    Args:
        frame: one row per point, with columns x, y, the cluster column(s) and `by`.
        x, y: regressor and response (e.g. R and the leak gap, both fractions).
        cluster: resampled unit(s).
        by: columns to fit separately (one row each).
        n_boot, level, seed: as in `leak_effect`.

    Returns:
        One row per group: `by` columns, estimand ('slope'), estimate, intercept, ci_low, ci_high,
        se, p_value, n_points, n_clusters, n_boot, reason, interval_method.
    """
    clusters = [cluster] if isinstance(cluster, str) else list(cluster)
    by = list(by)
    need_columns(frame, [x, y] + clusters + by, "dose-response frame")
    for col in (x, y):
        vals = pd.to_numeric(frame[col], errors="coerce")
        bad = ~np.isfinite(vals.to_numpy(dtype=float))
        if bad.any():
            value = frame[col][bad].iloc[0]
            value = float(value) if isinstance(value, (float, np.floating)) else value
            raise StatsError(f"dose-response column {col!r} holds {value!r} in {first_rows(np.asarray(bad, dtype=bool))}; "
                             f"expected a finite number")
    rows = []
    groups = frame.groupby(by, sort=True) if by else [((), frame)]
    for key, sub in groups:
        key = key if isinstance(key, tuple) else (key,)
        head = dict(zip(by, key))
        code, uniq = pd.factorize(sub[clusters].astype(str).agg("\x1f".join, axis=1))
        G = len(uniq)
        xs, ys = sub[x].to_numpy(float), sub[y].to_numpy(float)
        parts = np.stack([np.bincount(code, weights=w, minlength=G) for w in (np.ones_like(xs), xs, ys, xs * ys,
                                                                             xs * xs)], axis=1)   # (G, 5)
        est, icpt = _slope(parts.sum(0)[None])
        est, icpt = float(est[0]), float(icpt[0])
        reason = ""
        if not np.isfinite(est):
            reason = f"{x!r} does not vary: no slope"
        elif G < MIN_CLUSTERS:
            reason = f"{G} cluster(s) of {', '.join(clusters)}, fewer than {MIN_CLUSTERS}: no interval"
        if reason or n_boot <= 0:
            r = estimate_row(est, None, level, reason, "percentile", estimand="slope", **head)
        else:
            W = multinomial_weights(np.random.default_rng(seed), G, n_boot)
            rep, _ = _slope(W @ parts)
            r = estimate_row(est, rep, level, "", "percentile", estimand="slope", **head)
        r.update(intercept=icpt, n_points=len(sub), n_clusters=G)
        rows.append(r)
    return finish_rows(rows, by + DOSE_COLUMNS)


def _slope(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """OLS slope and intercept from weighted sums (n, Sx, Sy, Sxy, Sxx), one row each."""
    n, sx, sy, sxy, sxx = s.T
    with np.errstate(invalid="ignore", divide="ignore"):
        vxx = sxx - sx * sx / n
        slope = np.where(vxx > 1e-12 * np.maximum(sxx, 1e-300), (sxy - sx * sy / n) / vxx, np.nan)
        return slope, (sy - slope * sx) / n


def dose_points(predictions: pd.DataFrame, results: pd.DataFrame, *, diagnostic: str = "parent_probe",
                metric: str = "R", setting: str | None = None, intervention: str = "none") -> pd.DataFrame:
    """Points of the leak-gap dose-response: one per factorial pair (condition, arch, diversity, seed).

    gap = leak-model accuracy minus clean-model accuracy of the pair on their common test crops
    (under `intervention`); R = the leak model's `metric` from `diagnostic` rows with `setting`
    (None, the default: the diagnostic's overall value, i.e. its shortest setting that names no
    class, such as the parent probe's ``on=all``). Pairs without an R row are left out.

    Returns:
        columns condition, arch, diversity, seed, gap, R.
    """
    pred = check_predictions(predictions)
    need_columns(results, ["model", "diagnostic", "metric", "setting", "value"], "results")
    fac, _ = factorial_rows(pred[pred["intervention"] == intervention])
    keys = ["condition", "arch", "diversity", "seed"]
    acc = fac.groupby(keys + ["exposure"])["correct"].mean().unstack("exposure")
    if acc.empty or not {"leak", "clean"} <= set(acc.columns):
        return pd.DataFrame(columns=keys + ["gap", "R"])
    gap = (acc["leak"] - acc["clean"]).rename("gap").dropna().reset_index()
    sel = results[(results["diagnostic"] == diagnostic) & (results["metric"] == metric)]
    settings = sel["setting"].fillna("").astype(str)
    if setting is None:
        overall = sorted({v for v in settings if "class=" not in v}, key=lambda v: (len(v), v))
        setting = overall[0] if overall else ""
    sel = sel[settings == setting]
    r = sel.groupby(sel["model"].astype(str))["value"].mean()
    leak_model = fac[fac["exposure"] == "leak"].groupby(keys)["model"].first().rename("model").reset_index()
    out = gap.merge(leak_model, on=keys)
    out["R"] = out["model"].map(r)
    return out.dropna(subset=["R"])[keys + ["gap", "R"]].reset_index(drop=True)
