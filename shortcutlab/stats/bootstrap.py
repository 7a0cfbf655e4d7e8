"""The vectorised two-way cluster bootstrap and the rows it summarises into.

Predictions are summed into (cell, seed, parent) arrays of correct counts and crop counts once
(`Cells`); each resample is a pair of multinomial weight vectors (seeds, parents), and every
resampled accuracy is a ratio of two bilinear forms ``w' S v / w' N v``, computed for all
resamples with a few matrix products.

Two interval methods (`INTERVAL_METHODS`; the keyword ``interval`` everywhere):

- ``"cgm"`` (the default): Cameron, Gelbach & Miller (2011, "Robust inference with multiway
  clustering", JBES 29:238) two-way clustering, V = V_seed + V_parent - V_seed∩parent, each V
  the variance of a one-way cluster bootstrap (seeds only, parents only, (seed, parent) cells),
  with est ± t·sqrt(V) and the matching t p-value. It counts the seed x parent and crop terms
  once; measured calibrated on two independent generators (docs/statistics.md, "Calibration").
- ``"pigeonhole"``: seeds and parents resampled independently in one draw (Owen 2007, "the
  pigeonhole bootstrap"), percentile interval. It counts the seed x parent term about three
  times and is conservative (96.5-100% coverage of the leak and its cut on the test generators,
  SE / Monte Carlo SD 1.2-1.6); kept bit-for-bit.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import pandas as pd

from .errors import StatsError, StatsWarning
from .predictions import group_codes

__all__ = ["DEFAULT_INTERVAL", "INTERVAL_METHODS", "MIN_CLUSTERS", "Cells", "bootstrap_summary", "cgm_summary",
           "check_interval", "degenerate_reason", "estimate_row", "finish_rows", "multinomial_weights", "paired_support"]

#: The interval methods: CGM two-way clustering (calibrated) and the pigeonhole bootstrap (conservative).
INTERVAL_METHODS = ("cgm", "pigeonhole")
#: The method used when none is named.
DEFAULT_INTERVAL = "cgm"
#: Fewest seeds (and test parents) an interval is stated from: with two, a variance has one
#: degree of freedom and a bootstrap over two clusters has three distinct resamples.
MIN_CLUSTERS = 3
#: The three one-way schemes of a "cgm" draw, in the order `Cells.boot` stacks them.
CGM_SCHEMES = ("seed", "parent", "seed x parent")


def check_interval(interval: str) -> str:
    """`interval` if it names an interval method, else a `StatsError` listing them."""
    if interval not in INTERVAL_METHODS:
        raise StatsError(f"interval method {interval!r} is unknown; expected one of {', '.join(INTERVAL_METHODS)}")
    return interval


class Cells:
    """Correct counts S and crop counts N of each cell, as (K, n_seeds, n_parents) arrays.

    A cell is one combination of `keys` (e.g. arch x diversity x intervention x exposure); seeds
    and parents are the clusters that the bootstrap resamples.
    """

    def __init__(self, frame: pd.DataFrame, keys: Sequence[str]):
        keys = list(keys)
        self.seeds, seed_code = np.unique(frame["seed"].to_numpy(), return_inverse=True)
        parent_code, self.parents = pd.factorize(frame["parent"], sort=True)
        if keys:
            code = group_codes(frame, keys)
            first = np.unique(code, return_index=True)[1]
            table = frame[keys].iloc[first].reset_index(drop=True)
            for col in keys:
                table[col] = table[col].astype(str) if col != "seed" else table[col]
            order = table.sort_values(keys, kind="mergesort").index.to_numpy()
            rank = np.empty_like(order)
            rank[order] = np.arange(len(order))
            cell_code = rank[code]
            self.table = table.iloc[order].reset_index(drop=True)
        else:
            cell_code = np.zeros(len(frame), dtype=np.int64)
            self.table = pd.DataFrame(index=[0])
        K, R, C = len(self.table), len(self.seeds), len(self.parents)
        flat = (cell_code * R + seed_code) * C + parent_code
        self.S = np.bincount(flat, weights=frame["correct"].to_numpy(), minlength=K * R * C).reshape(K, R, C)
        self.N = np.bincount(flat, minlength=K * R * C).astype(np.float64).reshape(K, R, C)
        self.index = {tuple(row): i for i, row in enumerate(self.table[keys].itertuples(index=False))} if keys else {(): 0}

    def point(self) -> np.ndarray:
        """Accuracy of every cell, (K,); NaN where a cell has no crop."""
        s, n = self.S.sum(axis=(1, 2)), self.N.sum(axis=(1, 2))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, s / np.where(n > 0, n, 1), np.nan)

    def boot(self, n_boot: int, rng: np.random.Generator, chunk_elems: int = 2 ** 23,
             interval: str = DEFAULT_INTERVAL) -> np.ndarray:
        """Resampled accuracy of every cell, all cells under the same draws.

        ``interval="pigeonhole"``: (n_boot, K). Each resample draws seeds with replacement
        (multinomial weights w) and, independently, parents with replacement (weights v); a
        cell's accuracy is w' S v / w' N v. A drawn seed brings every model of that seed (leak
        and clean, every architecture), a drawn parent its crops in every model's test set: the
        pairing is kept by construction.

        ``interval="cgm"``: (3 n_boot, K), three one-way cluster bootstraps stacked along the
        resample axis (`CGM_SCHEMES`): seeds only (v = 1), parents only (w = 1), and the
        non-empty (seed, parent) cells drawn with replacement. Each block's deviations from the
        point estimate are scaled by sqrt(G / (G - 1)) for its G clusters (CGM's small-sample
        factor: a bootstrap over G clusters has the variance times (G - 1) / G), so any linear
        combination of columns (differences, means over architectures) carries it; `cgm_summary`
        combines the blocks.

        NaN where a resample holds none of a cell's crops.
        """
        check_interval(interval)
        K, R, C = self.S.shape
        if interval == "pigeonhole":
            W = multinomial_weights(rng, R, n_boot)
            V = multinomial_weights(rng, C, n_boot)
            return self._two_way(W, V, chunk_elems)
        point = self.point()
        blocks = [self._two_way(multinomial_weights(rng, R, n_boot), np.ones((n_boot, C)), chunk_elems),
                  self._two_way(np.ones((n_boot, R)), multinomial_weights(rng, C, n_boot), chunk_elems),
                  self._cell_boot(n_boot, rng, chunk_elems)]
        sizes = [R, C, int((self.N.sum(axis=0) > 0).sum())]
        for block, G in zip(blocks, sizes):
            block -= point
            block *= np.sqrt(G / (G - 1)) if G > 1 else np.nan
            block += point
        return np.concatenate(blocks)

    def _two_way(self, W: np.ndarray, V: np.ndarray, chunk_elems: int) -> np.ndarray:
        """(B, K) accuracies w' S v / w' N v for seed weights W (B, R) and parent weights V (B, C)."""
        K, R, C = self.S.shape
        n_boot = len(W)
        SN = np.concatenate([self.S, self.N]).transpose(1, 0, 2).reshape(R, 2 * K * C)
        out = np.empty((n_boot, K))
        step = max(1, chunk_elems // max(1, 2 * K * C))
        for lo in range(0, n_boot, step):
            hi = min(n_boot, lo + step)
            A = (W[lo:hi] @ SN).reshape(hi - lo, 2 * K, C)          # seed-weighted, per parent
            sums = np.matmul(A, V[lo:hi, :, None])[:, :, 0]         # parent-weighted: (b, 2K)
            out[lo:hi] = _ratio(sums[:, :K], sums[:, K:])
        return out

    def _cell_boot(self, n_boot: int, rng: np.random.Generator, chunk_elems: int) -> np.ndarray:
        """(B, K) accuracies with the non-empty (seed, parent) cells drawn with replacement."""
        K = len(self.S)
        used = np.flatnonzero(self.N.sum(axis=0).ravel() > 0)
        SN = np.concatenate([self.S.reshape(K, -1)[:, used], self.N.reshape(K, -1)[:, used]]).T   # (G, 2K)
        out = np.empty((n_boot, K))
        step = max(1, chunk_elems // max(1, len(used)))
        for lo in range(0, n_boot, step):
            hi = min(n_boot, lo + step)
            sums = multinomial_weights(rng, len(used), hi - lo) @ SN
            out[lo:hi] = _ratio(sums[:, :K], sums[:, K:])
        return out


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, NaN where den is 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def multinomial_weights(rng: np.random.Generator, n: int, n_boot: int) -> np.ndarray:
    """(n_boot, n) counts of each of n clusters in n draws with replacement, as floats."""
    idx = rng.integers(0, n, size=(n_boot, n))
    flat = (idx + (np.arange(n_boot) * n)[:, None]).ravel()
    return np.bincount(flat, minlength=n_boot * n).reshape(n_boot, n).astype(np.float64)


def bootstrap_summary(estimate: float, reps: np.ndarray, level: float = 0.95) -> dict:
    """Percentile interval, standard error and two-sided bootstrap p-value of one estimate
    (the ``"pigeonhole"`` method's summary).

    The p-value is the percentile-bootstrap one: ``p = min(1, 2 * min(1 + #{b <= 0},
    1 + #{b >= 0}) / (B + 1))`` over the B finite resamples b (the +1 counts the observed
    sample, so p is never 0 and is valid for a finite B). It rejects at alpha about when 0
    lies outside the (1 - alpha) percentile interval.

    Args:
        estimate: the point estimate.
        reps: (B,) resampled estimates; NaN resamples (no crop drawn) are left out.
        level: two-sided interval coverage.

    Returns:
        dict with ci_low, ci_high, se, p_value, n_boot (the finite resamples used); NaN
        interval, se and p where fewer than 2 resamples are finite or they do not vary.
    """
    reps = np.asarray(reps, dtype=np.float64)
    reps = reps[np.isfinite(reps)]
    B = len(reps)
    if B < 2 or not np.isfinite(estimate) or np.ptp(reps) == 0:
        return dict(ci_low=np.nan, ci_high=np.nan, se=np.nan, p_value=np.nan, n_boot=B)
    a = (1 - level) / 2
    lo, hi = np.quantile(reps, [a, 1 - a])
    p = min(1.0, 2 * min(1 + np.count_nonzero(reps <= 0), 1 + np.count_nonzero(reps >= 0)) / (B + 1))
    return dict(ci_low=float(lo), ci_high=float(hi), se=float(reps.std(ddof=1)), p_value=float(p), n_boot=B)


def cgm_summary(estimate: float, reps: np.ndarray, level: float = 0.95, df: float | None = None) -> dict:
    """Cameron-Gelbach-Miller two-way interval of one estimate from `Cells.boot`'s "cgm" draws.

    V = V_seed + V_parent - V_seed∩parent (CGM 2011, eq. 2.13), each V the variance of one
    block of resamples (`CGM_SCHEMES`, already scaled by G / (G - 1)). Where V is not positive
    the larger of V_seed and V_parent is used (CGM's suggestion) and the row says so. The
    interval is est ± q sqrt(V) and p = 2 P(T > |est| / sqrt(V)), with T a t on `df` degrees
    of freedom (min(seeds, parents) - 1, as CGM advise for few clusters) or normal (df None).

    Args:
        estimate: the point estimate.
        reps: (3 B,) resampled estimates, the three blocks stacked; NaN resamples are left out.
        level: two-sided interval coverage.
        df: degrees of freedom of the t quantile and p-value; None: normal.

    Returns:
        dict with ci_low, ci_high, se, p_value, n_boot (finite resamples of the scheme with the
        fewest: each scheme draws the B asked for) and note ('' or
        why the interval is NaN or how V was formed); NaN interval, se and p where a block has
        fewer than 2 finite resamples, V is not finite, or the resamples do not vary.
    """
    from scipy import special

    reps = np.asarray(reps, dtype=np.float64).reshape(len(CGM_SCHEMES), -1)
    fin = [r[np.isfinite(r)] for r in reps]
    B = min(len(f) for f in fin)   # resamples per one-way scheme, as the user asked for
    nan = dict(ci_low=np.nan, ci_high=np.nan, se=np.nan, p_value=np.nan, n_boot=B)
    if not np.isfinite(estimate):
        return {**nan, "note": ""}
    if min(len(f) for f in fin) < 2:
        return {**nan, "note": "a one-way bootstrap has fewer than 2 finite resamples: no interval"}
    v_seed, v_parent, v_cell = (float(np.var(f, ddof=1)) for f in fin)
    var, note = v_seed + v_parent - v_cell, ""
    if not np.isfinite(var):
        return {**nan, "note": "the bootstrap variance is not finite: no interval"}
    if max(v_seed, v_parent) <= 1e-24 * max(1.0, estimate ** 2):
        return {**nan, "note": "the resamples do not vary (every one gives the estimate): no interval"}
    if var <= 0:
        var = max(v_seed, v_parent)
        note = "two-way variance V_seed + V_parent - V_seed x parent not positive: the larger one-way variance used"
    se = float(np.sqrt(var))
    z = abs(estimate) / se
    if df is not None and np.isfinite(df) and df >= 1:
        q, p = float(special.stdtrit(df, 0.5 + level / 2)), float(2 * special.stdtr(df, -z))
    else:
        q, p = float(special.ndtri(0.5 + level / 2)), float(2 * special.ndtr(-z))
    return dict(ci_low=estimate - q * se, ci_high=estimate + q * se, se=se, p_value=min(1.0, p), n_boot=B, note=note)


def estimate_row(estimate, reps, level, reason="", interval: str = DEFAULT_INTERVAL, **extra) -> dict:
    """One row of an estimates table: `extra` (keys), the estimate and its interval.

    Args:
        estimate: the point estimate.
        reps: resampled estimates from `Cells.boot` with the same `interval` ((B,) pigeonhole,
            (3 B,) cgm), or None (no resamples: NaN interval, n_boot 0).
        level: interval coverage.
        reason: why the design is degenerate ('' when it is not): NaN interval, n_boot 0.
        interval: the method the resamples were drawn for ("cgm": `cgm_summary` with
            min(n_seeds, n_parents) - 1 degrees of freedom when `extra` holds both, else normal;
            "pigeonhole", or "percentile" for a one-way bootstrap: `bootstrap_summary`).
        **extra: the row's other columns (estimand, condition, arch, n_seeds, ...).

    Returns:
        dict of `extra`, estimate, ci_low, ci_high, se, p_value, n_boot, reason (also why an
        interval could not be formed, and the resamples left out for drawing no crop of a
        cell) and interval_method.
    """
    if interval != "percentile":      # a one-way bootstrap's percentile summary (the dose slope)
        check_interval(interval)
    if reason or reps is None:      # degenerate, or n_boot = 0 (point estimates only)
        s = dict(ci_low=np.nan, ci_high=np.nan, se=np.nan, p_value=np.nan, n_boot=0)
    elif interval == "cgm":
        ns, npar = extra.get("n_seeds"), extra.get("n_parents")
        df = min(ns, npar) - 1 if ns is not None and npar is not None else None
        s = cgm_summary(estimate, reps, level, df)
        reason = s.pop("note")
    else:
        s = bootstrap_summary(estimate, reps, level)
        if np.isfinite(estimate) and s["n_boot"] >= 2 and not np.isfinite(s["se"]):
            reason = "the resamples do not vary (every one gives the estimate): no interval"
    asked = (len(reps) // (len(CGM_SCHEMES) if interval == "cgm" else 1)) if reps is not None and np.ndim(reps) else 0
    if not reason and s["n_boot"] < asked:
        reason = f"{asked - s['n_boot']} of {asked} resamples drew no crop of a cell and were left out"
    return {**extra, "estimate": float(estimate), **s, "reason": reason, "interval_method": interval}


def finish_rows(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    """The rows as a frame of `columns`; a `StatsWarning` for each row with a reason and no
    interval, naming its estimand and keys (a reason beside an interval, such as resamples
    left out or CGM's fallback variance, is recorded without a warning)."""
    df = pd.DataFrame(rows, columns=columns)
    for r in rows:
        if r.get("reason") and not np.isfinite(r.get("ci_low", np.nan)):
            warnings.warn(f"{r.get('estimand', 'estimate')} "
                          f"{', '.join(f'{k}={r[k]}' for k in ('condition', 'arch', 'diversity', 'intervention') if k in r)}: "
                          f"{r['reason']}", StatsWarning, stacklevel=3)
    return df


def degenerate_reason(n_seeds: int, n_parents: int) -> str:
    """Why a two-way bootstrap over `n_seeds` seeds and `n_parents` parents gives no interval
    (fewer than `MIN_CLUSTERS` of either, for every interval method), or '' when it can.

    With two seeds the seed-level variance has one degree of freedom (a t quantile of 12.7) and
    a bootstrap over them three distinct resamples; an interval from them is false precision."""
    if n_seeds < MIN_CLUSTERS:
        return (f"{n_seeds} seed(s), fewer than {MIN_CLUSTERS}: the seed-level variance cannot be estimated, "
                f"no interval")
    if n_parents < MIN_CLUSTERS:
        return (f"{n_parents} test parent(s), fewer than {MIN_CLUSTERS}: the parent-level variance cannot be "
                f"estimated, no interval")
    return ""


def paired_support(cells: Cells, ks: Sequence[int]) -> tuple[int, int, int]:
    """(seeds, parents, crops) holding crops in every cell of ks (the pairing's support); the
    crops are those of the first cell."""
    n = np.stack([cells.N[k] for k in ks]) if ks else np.zeros((1, 0, 0))
    both = (n > 0).all(axis=0)
    return int(both.any(axis=1).sum()), int(both.any(axis=0).sum()), int(n[0][both].sum()) if ks else 0
