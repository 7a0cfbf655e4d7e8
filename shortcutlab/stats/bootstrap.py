"""The vectorised two-way cluster bootstrap and the rows it summarises into.

Predictions are summed into (cell, seed, parent) arrays of correct counts and crop counts once
(`Cells`); each resample is a pair of multinomial weight vectors (seeds, parents), and every
resampled accuracy is a ratio of two bilinear forms ``w' S v / w' N v``, computed for all
resamples with a few matrix products.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import pandas as pd

from .errors import StatsWarning
from .predictions import group_codes

__all__ = ["Cells", "bootstrap_summary", "degenerate_reason", "estimate_row", "finish_rows", "multinomial_weights",
           "paired_support"]


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

    def boot(self, n_boot: int, rng: np.random.Generator, chunk_elems: int = 2 ** 23) -> np.ndarray:
        """Resampled accuracy of every cell, (n_boot, K), all cells under the same draws.

        Each resample draws seeds with replacement (multinomial weights w) and, independently,
        parents with replacement (weights v); a cell's accuracy is w' S v / w' N v. A drawn
        seed brings every model of that seed (leak and clean, every architecture), a drawn
        parent its crops in every model's test set: the pairing is kept by construction.
        NaN where a resample holds none of a cell's crops.
        """
        K, R, C = self.S.shape
        W = multinomial_weights(rng, R, n_boot)
        V = multinomial_weights(rng, C, n_boot)
        SN = np.concatenate([self.S, self.N]).transpose(1, 0, 2).reshape(R, 2 * K * C)
        out = np.empty((n_boot, K))
        step = max(1, chunk_elems // max(1, 2 * K * C))
        for lo in range(0, n_boot, step):
            hi = min(n_boot, lo + step)
            A = (W[lo:hi] @ SN).reshape(hi - lo, 2 * K, C)          # seed-weighted, per parent
            sums = np.matmul(A, V[lo:hi, :, None])[:, :, 0]         # parent-weighted: (b, 2K)
            num, den = sums[:, :K], sums[:, K:]
            with np.errstate(invalid="ignore", divide="ignore"):
                out[lo:hi] = np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
        return out


def multinomial_weights(rng: np.random.Generator, n: int, n_boot: int) -> np.ndarray:
    """(n_boot, n) counts of each of n clusters in n draws with replacement, as floats."""
    idx = rng.integers(0, n, size=(n_boot, n))
    flat = (idx + (np.arange(n_boot) * n)[:, None]).ravel()
    return np.bincount(flat, minlength=n_boot * n).reshape(n_boot, n).astype(np.float64)


def bootstrap_summary(estimate: float, reps: np.ndarray, level: float = 0.95) -> dict:
    """Percentile interval, standard error and two-sided bootstrap p-value of one estimate.

    The p-value is the percentile-bootstrap one: ``p = min(1, 2 * min(1 + #{b <= 0},
    1 + #{b >= 0}) / (B + 1))`` over the B finite resamples b (the +1 counts the observed
    sample, so p is never 0 and is valid for a finite B). It rejects at alpha about when 0
    lies outside the (1 - alpha) percentile interval.

    Args:
        estimate: the point estimate.
        reps: (B,) resampled estimates; NaN resamples (no crop drawn) are left out.
        level: two-sided interval coverage.

    Returns:
        dict with ci_low, ci_high, se, p_value, n_boot (the finite resamples used).
    """
    reps = np.asarray(reps, dtype=np.float64)
    reps = reps[np.isfinite(reps)]
    B = len(reps)
    if B < 2 or not np.isfinite(estimate):
        return dict(ci_low=np.nan, ci_high=np.nan, se=np.nan, p_value=np.nan, n_boot=B)
    a = (1 - level) / 2
    lo, hi = np.quantile(reps, [a, 1 - a])
    p = min(1.0, 2 * min(1 + np.count_nonzero(reps <= 0), 1 + np.count_nonzero(reps >= 0)) / (B + 1))
    return dict(ci_low=float(lo), ci_high=float(hi), se=float(reps.std(ddof=1)), p_value=float(p), n_boot=B)


def estimate_row(estimate, reps, level, reason="", **extra) -> dict:
    """One row of an estimates table: `extra` (keys), the estimate and its bootstrap summary.

    Args:
        estimate: the point estimate.
        reps: (B,) resampled estimates, or None (no resamples: NaN interval, n_boot 0).
        level: interval coverage.
        reason: why the design is degenerate ('' when it is not): NaN interval, n_boot 0.
        **extra: the row's other columns (estimand, condition, arch, n_seeds, ...).

    Returns:
        dict of `extra`, estimate, ci_low, ci_high, se, p_value, n_boot and reason (which
        counts the resamples left out for drawing no crop of a cell).
    """
    if reason or reps is None:      # degenerate, or n_boot = 0 (point estimates only)
        s = dict(ci_low=np.nan, ci_high=np.nan, se=np.nan, p_value=np.nan, n_boot=0)
    else:
        s = bootstrap_summary(estimate, reps, level)
        if s["n_boot"] < len(reps):
            reason = f"{len(reps) - s['n_boot']} of {len(reps)} resamples drew no crop of a cell and were left out"
    return {**extra, "estimate": float(estimate), **s, "reason": reason}


def finish_rows(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    """The rows as a frame of `columns`; a `StatsWarning` for each row with a degenerate reason
    (not for resamples left out), naming its estimand and keys."""
    df = pd.DataFrame(rows, columns=columns)
    for r in rows:
        if r.get("reason") and not r["reason"].endswith("left out"):
            warnings.warn(f"{r.get('estimand', 'estimate')} "
                          f"{', '.join(f'{k}={r[k]}' for k in ('condition', 'arch', 'diversity', 'intervention') if k in r)}: "
                          f"{r['reason']}", StatsWarning, stacklevel=3)
    return df


def degenerate_reason(n_seeds: int, n_parents: int) -> str:
    """Why a two-way bootstrap over `n_seeds` seeds and `n_parents` parents gives no interval
    (fewer than two of either), or '' when it can."""
    if n_seeds < 2:
        return f"{n_seeds} seed(s): the seed-level variance cannot be estimated, no interval"
    if n_parents < 2:
        return f"{n_parents} test parent(s): the parent-level variance cannot be estimated, no interval"
    return ""


def paired_support(cells: Cells, ks: Sequence[int]) -> tuple[int, int, int]:
    """(seeds, parents, crops) holding crops in every cell of ks (the pairing's support); the
    crops are those of the first cell."""
    n = np.stack([cells.N[k] for k in ks]) if ks else np.zeros((1, 0, 0))
    both = (n > 0).all(axis=0)
    return int(both.any(axis=1).sum()), int(both.any(axis=0).sum()), int(n[0][both].sum()) if ks else 0
