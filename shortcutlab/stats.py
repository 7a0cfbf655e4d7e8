"""Statistics on tidy results: pure functions of numbers and frames, no file or model access.

The estimands follow the paper (reference 000, "Study design" and Table 2):

- **leak effect** (H3, F3): accuracy of the leak model minus the clean model of the same
  factorial cell on the common test crops of its seed (`leak_effect`);
- **leak cut** (F2, F4): the leak effect on unaltered crops minus the leak effect under an
  intervention, with the share of the leak removed and the intervention's accuracy cost on
  clean models (`intervention_effect`);
- **protocol effect** (H1, H2): accuracy of P1 (crop-level split) minus P2 (parent-disjoint)
  models (`protocol_effect`);
- **dose-response** (F5-F8): the OLS slope of a gap on parent recoverability R with a cluster
  bootstrap interval (`dose_response`).

Inference is the paper's primary one: a paired two-way cluster bootstrap over seeds and test
parents, percentile intervals, bootstrap p-values, Holm within named families (`holm`,
`add_holm`); `estimates` assembles every estimand of a sweep into one tidy table.

The bootstrap is vectorised: predictions are summed into (cell, seed, parent) arrays of
correct counts and crop counts once; each resample is a pair of multinomial weight vectors
(seeds, parents), and every resampled accuracy is a ratio of two bilinear forms
``w' S v / w' N v``, computed for all resamples with a few matrix products.

Units: accuracies and effects are fractions (0.0173, not 1.73 pp).
"""

from __future__ import annotations

import math
import warnings
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from shortcutlab.errors import ShortcutlabError

__all__ = [
    "StatsError",
    "StatsWarning",
    "add_holm",
    "against_chance",
    "bootstrap_summary",
    "chance_level",
    "cluster_bootstrap_interval",
    "dose_points",
    "dose_response",
    "estimates",
    "holm",
    "intervention_effect",
    "leak_effect",
    "protocol_effect",
    "simulate_factorial",
    "true_leak_effect",
    "wilson_interval",
]


class StatsError(ShortcutlabError):
    """A predictions or results frame lacks a column or holds values the statistics cannot use."""


class StatsWarning(UserWarning):
    """An estimate was computed on a degenerate design (one seed, a missing model, ...): its
    interval is NaN and the row's `reason` says why."""


def wilson_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k / n.

    Args:
        k: successes (0 <= k <= n).
        n: trials; n == 0 gives (nan, nan).
        level: two-sided coverage.

    Returns:
        (low, high) in [0, 1].
    """
    from scipy.stats import norm

    if n <= 0:
        return (math.nan, math.nan)
    if not 0 <= k <= n:
        raise ValueError(f"successes k must lie in [0, n={n}]; got {k}")
    z = float(norm.ppf(0.5 + level / 2))
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


# --- columns and checks ------------------------------------------------------------------------

#: Columns of the sweep's predictions table (the contract) that the statistics read.
PREDICTION_COLUMNS = ("model", "condition", "arch", "seed", "protocol", "exposure", "diversity",
                      "intervention", "id", "parent", "correct")
EXPOSURES = ("leak", "clean", "")

#: Columns of `estimates`' table, in order.
ESTIMATE_COLUMNS = ["estimand", "family", "condition", "arch", "diversity", "intervention", "estimate",
                    "ci_low", "ci_high", "se", "p_value", "p_holm", "reject", "n_seeds", "n_parents", "n_crops",
                    "n_boot", "reason"]


def _need(frame, columns: Iterable[str], what: str) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise StatsError(f"{what} must be a pandas DataFrame; got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise StatsError(f"{what} column {missing[0]!r} is missing (needs {', '.join(columns)}); "
                         f"columns are: {', '.join(map(str, frame.columns))}")


def check_predictions(pred: pd.DataFrame, columns=PREDICTION_COLUMNS) -> pd.DataFrame:
    """Validate a predictions frame; return a copy with string keys and a 0/1 float `correct`."""
    _need(pred, columns, "predictions")
    out = pred.loc[:, [c for c in dict.fromkeys(columns)]].copy()
    for col in ("model", "condition", "arch", "protocol", "exposure", "diversity", "intervention", "id", "parent"):
        if col in out.columns:
            if out[col].isna().any():
                raise StatsError(f"predictions column {col!r} is empty in {_rows(out[col].isna())}; expected a string "
                                 f"('' where it does not apply)")
            out[col] = _as_str(out[col])
    if "exposure" in out.columns:
        bad = ~out["exposure"].isin(EXPOSURES)
        if bad.any():
            value = out["exposure"][bad].iloc[0]
            raise StatsError(f"predictions column 'exposure' holds {value!r} in {_rows(bad)}; expected 'leak', 'clean' "
                             f"or '' (not a factorial cell)")
    num = pd.to_numeric(out["seed"], errors="coerce")
    bad = (num.isna() | (num % 1 != 0)).to_numpy()
    if bad.any():
        raise StatsError(f"predictions column 'seed' holds {out['seed'][bad].iloc[0]!r} in {_rows(bad)}; "
                         f"expected an integer seed")
    out["seed"] = num.astype(np.int64)
    out["correct"] = correct_as_float(out["correct"])
    return out


def correct_as_float(corr: pd.Series) -> pd.Series:
    """A predictions table's `correct` column as 0.0/1.0 floats.

    Raises:
        StatsError: a value other than True/False or 1/0, naming the first rows that hold one.
    """
    if pd.api.types.is_bool_dtype(corr):
        return corr.astype(np.float64)
    num = pd.to_numeric(corr, errors="coerce")
    bad = ~num.isin([0, 1])
    if bad.any():
        raise StatsError(f"predictions column 'correct' holds {corr[bad].iloc[0]!r} in {_rows(bad)}; "
                         f"expected True/False or 1/0")
    return num.astype(np.float64)


def _as_str(col: pd.Series) -> pd.Series:
    """Strings as they are; categoricals keep their codes (string categories); the rest as str."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.rename_categories([str(c) for c in col.cat.categories])
    if pd.api.types.is_string_dtype(col.dtype) and not pd.api.types.is_object_dtype(col.dtype):
        return col
    return col.astype(str)


def _codes(frame: pd.DataFrame, columns: Sequence) -> np.ndarray:
    """One int64 group code per row for the combination of `columns` (names of frame's columns
    or arrays of its length; dense, unsorted)."""
    code = np.zeros(len(frame), dtype=np.int64)
    size = 1
    for col in columns:
        c, u = pd.factorize(frame[col] if isinstance(col, str) else col)
        if size * max(1, len(u)) >= 2 ** 62:
            code = np.unique(code, return_inverse=True)[1].astype(np.int64)
            size = int(code.max()) + 1 if len(code) else 1
        code = code * max(1, len(u)) + c
        size *= max(1, len(u))
    return np.unique(code, return_inverse=True)[1].astype(np.int64) if len(code) else code


def _rows(mask) -> str:
    from shortcutlab.errors import first_rows

    return first_rows(np.asarray(mask, dtype=bool))


def _check_unique(pred: pd.DataFrame) -> None:
    dup = pred.duplicated(["model", "intervention", "id"])
    if dup.any():
        r = pred[dup].iloc[0]
        raise StatsError(f"predictions hold crop {r['id']!r} twice for model {r['model']!r} under intervention "
                         f"{r['intervention']!r} ({_rows(dup)}); expected one row per model x intervention x crop")


# --- the vectorised two-way cluster bootstrap ----------------------------------------------------

class _Cells:
    """Correct counts S and crop counts N of each cell, as (K, n_seeds, n_parents) arrays.

    A cell is one combination of `keys` (e.g. arch x diversity x intervention x exposure); seeds
    and parents are the clusters that the bootstrap resamples.
    """

    def __init__(self, frame: pd.DataFrame, keys: Sequence[str]):
        keys = list(keys)
        self.seeds, seed_code = np.unique(frame["seed"].to_numpy(), return_inverse=True)
        parent_code, self.parents = pd.factorize(frame["parent"], sort=True)
        if keys:
            code = _codes(frame, keys)
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
        W = _multinomial_weights(rng, R, n_boot)
        V = _multinomial_weights(rng, C, n_boot)
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


def _multinomial_weights(rng: np.random.Generator, n: int, n_boot: int) -> np.ndarray:
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


def _row(estimate, reps, level, reason="", **extra) -> dict:
    if reason or reps is None:      # degenerate, or n_boot = 0 (point estimates only)
        s = dict(ci_low=np.nan, ci_high=np.nan, se=np.nan, p_value=np.nan, n_boot=0)
    else:
        s = bootstrap_summary(estimate, reps, level)
        if s["n_boot"] < len(reps):
            reason = f"{len(reps) - s['n_boot']} of {len(reps)} resamples drew no crop of a cell and were left out"
    return {**extra, "estimate": float(estimate), **s, "reason": reason}


def _finish(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=columns)
    for r in rows:
        if r.get("reason") and not r["reason"].endswith("left out"):
            warnings.warn(f"{r.get('estimand', 'estimate')} "
                          f"{', '.join(f'{k}={r[k]}' for k in ('condition', 'arch', 'diversity', 'intervention') if k in r)}: "
                          f"{r['reason']}", StatsWarning, stacklevel=3)
    return df


def _degenerate(n_seeds: int, n_parents: int) -> str:
    if n_seeds < 2:
        return f"{n_seeds} seed(s): the seed-level variance cannot be estimated, no interval"
    if n_parents < 2:
        return f"{n_parents} test parent(s): the parent-level variance cannot be estimated, no interval"
    return ""


def _clusters(cells: _Cells, ks: Sequence[int]) -> tuple[int, int, int]:
    """(seeds, parents, crops) holding crops in every cell of ks (the pairing's support)."""
    n = np.stack([cells.N[k] for k in ks]) if ks else np.zeros((1, 0, 0))
    both = (n > 0).all(axis=0)
    return int(both.any(axis=1).sum()), int(both.any(axis=0).sum()), int(n[0][both].sum()) if ks else 0


# --- leak effect ---------------------------------------------------------------------------------

LEAK_COLUMNS = ["estimand", "condition", "arch", "diversity", "intervention", "estimate", "ci_low", "ci_high", "se",
                "p_value", "n_seeds", "n_parents", "n_crops", "n_boot", "reason"]


def factorial_rows(pred: pd.DataFrame) -> tuple[pd.DataFrame, list[dict]]:
    """Factorial rows restricted to crops scored by both the leak and the clean model of their
    (condition, seed, arch, diversity, intervention); plus records of groups that lack one side."""
    is_leak = pred["exposure"].to_numpy() == "leak"
    fac_mask = is_leak | (pred["exposure"].to_numpy() == "clean")
    fac = pred if fac_mask.all() else pred[fac_mask]
    is_leak = is_leak[fac_mask].astype(np.float64)
    keys = ["condition", "arch", "diversity", "intervention"]
    cell = _codes(fac, keys)
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
    g = _codes(fac, [cell, "seed", "id"])
    leak, both = np.bincount(g, weights=is_leak), np.bincount(g)
    keep = (leak[g] > 0) & (leak[g] < both[g])
    # rows of a lone cell are recorded in `missing`; warn about the rest
    dropped = int((~keep & ~lone_cells[cell]).sum())
    if dropped:
        warnings.warn(f"leak effect: {dropped} of {len(fac)} factorial predictions left out: their crop was not scored "
                      f"by the paired leak/clean model of the same seed (the effect uses the common test crops)",
                      StatsWarning, stacklevel=3)
    return (fac if keep.all() else fac[keep]), missing


def _leak_rows(cells: _Cells, condition, archs, level, reps, point, pooled: bool, baseline=None):
    """Leak rows (and, from the same draws, cells' leak replicates) for one condition."""
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
            ns, npar, ncrop = _clusters(cells, [kl, kc])
            reason = _degenerate(ns, npar)
            rows.append(_row(est, rep, level, reason, estimand="leak", condition=condition, arch=arch, diversity=div,
                             intervention=inter, n_seeds=ns, n_parents=npar, n_crops=ncrop))
            effects[(arch, div, inter)] = (est, rep, (ns, npar, ncrop))
            per_arch.append((arch, kl, kc))
        if pooled and len(per_arch) > 1:
            est = float(np.mean([effects[(a, div, inter)][0] for a, _, _ in per_arch]))
            rep = np.mean([effects[(a, div, inter)][1] for a, _, _ in per_arch], axis=0) if reps is not None else None
            ns, npar, ncrop = _clusters(cells, [k for _, kl, kc in per_arch for k in (kl, kc)])
            ncrop = sum(effects[(a, div, inter)][2][2] for a, _, _ in per_arch)
            reason = _degenerate(ns, npar)
            rows.append(_row(est, rep, level, reason, estimand="leak", condition=condition, arch="pooled",
                             diversity=div, intervention=inter, n_seeds=ns, n_parents=npar, n_crops=ncrop))
            effects[("pooled", div, inter)] = (est, rep, (ns, npar, ncrop))
    return rows, effects


def _factorial_bootstrap(pred, n_boot, seed):
    """Per condition: the cells, their point accuracies and replicates (shared draws)."""
    fac, missing = factorial_rows(pred)
    out = {}
    for condition, sub in fac.groupby("condition", sort=True):
        cells = _Cells(sub, ["arch", "diversity", "intervention", "exposure"])
        reps = cells.boot(n_boot, np.random.default_rng(seed)) if n_boot > 0 else None
        archs = sorted(sub["arch"].unique())
        out[condition] = (cells, cells.point(), reps, archs)
    return out, missing


def _prepare(predictions, n_boot, seed):
    pred = check_predictions(predictions)
    _check_unique(pred)
    return pred, _factorial_bootstrap(pred, n_boot, seed)


def _no_factorial_rows(pred, missing, estimand):
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
                pooled: bool = True, _shared=None) -> pd.DataFrame:
    """Leak effect per condition x arch x diversity x intervention, with its two-way bootstrap.

    The estimate (the paper's H3) is the accuracy of the leak models minus that of the clean
    models on the common test crops: per cell (condition, arch, diversity, intervention) the
    mean of `correct` over every (seed, crop) scored by the leak model minus the same mean for
    the clean model. Crops scored by only one model of a seed's pair are left out (warned).

    Inference: paired two-way cluster bootstrap. Each resample draws the seeds with replacement
    (a drawn seed brings both its leak and its clean model, and every architecture's, because a
    seed fixes the data and the split) and, independently, the test parents with replacement (a
    drawn parent brings its crops in every model's test set); the effect is recomputed on the
    weighted data. Percentile interval, two-sided bootstrap p (`bootstrap_summary`). All cells of
    a condition share the draws, so differences between rows are paired too. Measured by
    simulation (README, "Statistics"): 96.4% coverage of the 95% interval with 20 seeds where
    the leak varies by seed and parent, against 48% for a naive crop-level bootstrap; where crop
    noise dominates the interval is conservative (the seed x parent noise is counted about
    three times, Owen 2007), with few seeds slightly liberal (93.8% with 10).

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

    Returns:
        One row per cell: estimand ('leak'), condition, arch, diversity, intervention, estimate,
        ci_low, ci_high, se, p_value, n_seeds, n_parents, n_crops (the (seed, crop) pairs scored by
        both models), n_boot (finite resamples), reason ('' or why the interval is NaN). Cells
        without a clean or a leak model, and conditions without factorial rows, get a NaN row
        with the reason and a `StatsWarning`.

    Example:
        >>> from shortcutlab.stats import leak_effect, simulate_factorial
        >>> pred = simulate_factorial(n_seeds=10, n_parents=40, effect=0.5, seed=1)
        >>> row = leak_effect(pred, n_boot=500).iloc[0]
        >>> bool(row.ci_low < row.estimate < row.ci_high)
        True
    """
    # `_shared`: (checked predictions, draws) from `estimates`, which computes the draws once
    pred, (boots, missing) = _shared or _prepare(predictions, n_boot, seed)
    rows = []
    for condition, (cells, point, reps, archs) in boots.items():
        rows += _leak_rows(cells, condition, archs, level, reps, point, pooled)[0]
    rows += _no_factorial_rows(pred, missing, "leak")
    return _finish(rows, LEAK_COLUMNS)


# --- interventions ---------------------------------------------------------------------------------

INTERVENTION_COLUMNS = LEAK_COLUMNS[:5] + ["baseline"] + LEAK_COLUMNS[5:] + ["cost_exceeds_leak"]


def intervention_effect(predictions: pd.DataFrame, *, baseline: str = "none", n_boot: int = 10_000,
                        level: float = 0.95, seed: int = 0, pooled: bool = True, _shared=None) -> pd.DataFrame:
    """What each intervention does to the leak, and what it costs clean models.

    Per condition x arch (and pooled) x diversity x intervention other than `baseline`, three
    estimands, all from the same draws as the leak effect (the differences are paired):

    - ``leak_cut``: leak effect under `baseline` minus leak effect under the intervention
      (positive: the intervention removes part of the leak; the paper's F2 and F4, e.g. color
      transfer cut the leak from 1.72 to 0.46 pp, F2 = 1.27 pp);
    - ``share_removed``: leak_cut / leak effect under `baseline` (percentile interval; no
      p-value: a ratio near a zero denominator is no test);
    - ``clean_cost``: clean-model accuracy under `baseline` minus under the intervention
      (positive: the intervention costs accuracy). `cost_exceeds_leak` is True where this cost
      is larger than the leak effect under `baseline`: such an intervention damages the crops
      more than the leak is worth, and a cut of the leak says little.

    Args:
        predictions: the sweep's predictions table.
        baseline: the intervention name of the unaltered crops.
        n_boot, level, seed, pooled: as in `leak_effect`.

    Returns:
        Tidy rows: estimand, condition, arch, diversity, intervention, baseline, estimate,
        ci_low, ci_high, se, p_value, n_seeds, n_parents, n_crops, n_boot, reason,
        cost_exceeds_leak.
    """
    # `_shared`: (checked predictions, draws) from `estimates`, which computes the draws once
    pred, (boots, missing) = _shared or _prepare(predictions, n_boot, seed)
    rows = []
    for condition, (cells, point, reps, archs) in boots.items():
        _, leak = _leak_rows(cells, condition, archs, level, reps, point, pooled)
        inters = sorted(set(cells.table["intervention"]) - {baseline})
        if baseline not in set(cells.table["intervention"]):
            for inter in inters:
                rows.append(dict(estimand="leak_cut", condition=condition, arch="", diversity="", intervention=inter,
                                 baseline=baseline, estimate=np.nan, n_seeds=0, n_parents=0, n_crops=0, n_boot=0,
                                 reason=f"no prediction under the baseline intervention {baseline!r}"))
            continue
        for div in sorted(set(cells.table["diversity"])):
            for inter in inters:
                clean_pool = []
                for arch in list(archs) + (["pooled"] if pooled and len(archs) > 1 else []):
                    base, alt = leak.get((arch, div, baseline)), leak.get((arch, div, inter))
                    if base is None or alt is None:
                        continue
                    if arch == "pooled":
                        if not clean_pool:
                            continue
                        cost = float(np.mean([c[0] for c in clean_pool]))
                        cost_rep = np.mean([c[1] for c in clean_pool], axis=0) if reps is not None else None
                        size = (base[2][0], base[2][1], sum(c[2] for c in clean_pool))
                    else:
                        kb = cells.index[(arch, div, baseline, "clean")]
                        ki = cells.index[(arch, div, inter, "clean")]
                        cost = point[kb] - point[ki]
                        cost_rep = reps[:, kb] - reps[:, ki] if reps is not None else None
                        ns, npar, ncrop = _clusters(cells, [kb, ki])
                        size = (ns, npar, ncrop)
                        clean_pool.append((cost, cost_rep, ncrop))
                    ns = min(base[2][0], alt[2][0])
                    npar = min(base[2][1], alt[2][1])
                    reason = _degenerate(ns, npar)
                    key = dict(condition=condition, arch=arch, diversity=div, intervention=inter, baseline=baseline,
                               n_seeds=ns, n_parents=npar, n_crops=min(base[2][2], alt[2][2]))
                    cut = base[0] - alt[0]
                    cut_rep = base[1] - alt[1] if reps is not None else None
                    exceeds = bool(cost > base[0])
                    rows.append(_row(cut, cut_rep, level, reason, estimand="leak_cut", cost_exceeds_leak=exceeds,
                                     **key))
                    with np.errstate(invalid="ignore", divide="ignore"):
                        share = cut / base[0] if base[0] != 0 else np.nan
                        share_rep = cut_rep / base[1] if reps is not None else None
                    srow = _row(share, share_rep, level, reason, estimand="share_removed",
                                cost_exceeds_leak=exceeds, **key)
                    srow["p_value"] = np.nan
                    rows.append(srow)
                    ckey = {**key, "n_seeds": size[0], "n_parents": size[1], "n_crops": size[2]}
                    rows.append(_row(cost, cost_rep, level, _degenerate(size[0], size[1]), estimand="clean_cost",
                                     cost_exceeds_leak=exceeds, **ckey))
    rows += [{**r, "baseline": baseline} for r in _no_factorial_rows(pred, missing, "leak_cut")]
    return _finish(rows, INTERVENTION_COLUMNS)


# --- protocol effect -------------------------------------------------------------------------------

PROTOCOL_COLUMNS = LEAK_COLUMNS


def protocol_effect(predictions: pd.DataFrame, *, p1: str = "crop", p2: str = "parent", intervention: str = "none",
                    n_boot: int = 10_000, level: float = 0.95, seed: int = 0, pooled: bool = True) -> pd.DataFrame:
    """Protocol effect (the paper's H1, H2): accuracy of P1 models minus P2 models.

    P1 is the crop-level split (`protocol` == `p1`), P2 the parent-disjoint one (`p2`), each
    model scored on its own split's test crops (under `intervention`, default the unaltered
    crops). The estimate per condition x arch is the mean `correct` over every (seed, crop) of
    the P1 models minus the same for the P2 models; ``arch="pooled"`` is the unweighted mean
    over architectures.

    Inference: two-way cluster bootstrap. Seeds are drawn with replacement (a seed brings its
    P1 and its P2 model of every architecture: a seed fixes data and splits). The two test sets
    differ, so there is no crop-by-crop pairing; instead one parent draw is made over the union
    of the test parents of both protocols, and a parent drawn k times weighs k in whichever
    test set holds its crops. A parent scored under both protocols (P1's test crops come from
    almost every parent) thus keeps its shared difficulty in both; a parent in only one test
    set counts in that one only (for disjoint test sets this is close to independent draws
    within each protocol).

    Returns:
        Rows as in `leak_effect`, estimand 'protocol', intervention the one scored; n_seeds
        counts seeds with both protocols, n_parents the parents scored under either, n_crops the
        (seed, crop) pairs of both. A condition lacking one protocol gets a NaN row with reason.
    """
    pred = check_predictions(predictions)
    _check_unique(pred)
    pred = pred[pred["intervention"] == intervention]
    rows = []
    for condition, sub in pred.groupby("condition", sort=True):
        sub = sub[sub["protocol"].isin([p1, p2])]
        have = set(sub["protocol"].unique())
        if have != {p1, p2}:
            if len(set(pred.loc[pred["condition"] == condition, "protocol"].unique()) & {p1, p2}):
                lacking = ({p1, p2} - have).pop()
                rows.append(dict(estimand="protocol", condition=condition, arch="", diversity="",
                                 intervention=intervention, estimate=np.nan, n_seeds=0, n_parents=0, n_crops=0,
                                 n_boot=0, reason=f"no {lacking!r} protocol predictions"))
            continue
        cells = _Cells(sub, ["arch", "protocol"])
        point = cells.point()
        reps = cells.boot(n_boot, np.random.default_rng(seed)) if n_boot > 0 else None
        per = []
        for arch in sorted(sub["arch"].unique()):
            k1, k2 = cells.index.get((arch, p1)), cells.index.get((arch, p2))
            if k1 is None or k2 is None:
                rows.append(dict(estimand="protocol", condition=condition, arch=arch, diversity="",
                                 intervention=intervention, estimate=np.nan, n_seeds=0, n_parents=0, n_crops=0,
                                 n_boot=0, reason=f"no {p1 if k1 is None else p2!r} model for this architecture"))
                continue
            n1, n2 = cells.N[k1], cells.N[k2]
            ns = int(((n1.sum(1) > 0) & (n2.sum(1) > 0)).sum())
            npar = int(((n1 + n2).sum(0) > 0).sum())
            ncrop = int(n1.sum() + n2.sum())
            est = point[k1] - point[k2]
            rep = reps[:, k1] - reps[:, k2] if reps is not None else None
            per.append((est, rep, ns, npar, ncrop))
            rows.append(_row(est, rep, level, _degenerate(ns, npar),
                             estimand="protocol", condition=condition, arch=arch, diversity="",
                             intervention=intervention, n_seeds=ns, n_parents=npar, n_crops=ncrop))
        if pooled and len(per) > 1:
            est = float(np.mean([p[0] for p in per]))
            rep = np.mean([p[1] for p in per], axis=0) if reps is not None else None
            ns, npar = max(p[2] for p in per), max(p[3] for p in per)
            rows.append(_row(est, rep, level, _degenerate(ns, npar),
                             estimand="protocol", condition=condition, arch="pooled", diversity="",
                             intervention=intervention, n_seeds=ns, n_parents=npar, n_crops=sum(p[4] for p in per)))
    return _finish(rows, PROTOCOL_COLUMNS)


# --- Holm ------------------------------------------------------------------------------------------

def holm(pvalues, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down adjustment (Holm 1979), valid under any dependence between the tests.

    With the m finite p-values sorted p_(1) <= ... <= p_(m), the adjusted value of p_(i) is
    max_{j <= i} min(1, (m - j + 1) p_(j)); a hypothesis is rejected when its adjusted p is
    <= alpha. NaN p-values (no test) stay NaN, are never rejected and do not count in m.

    Args:
        pvalues: sequence of p-values in [0, 1] (NaN allowed).
        alpha: family-wise error rate.

    Returns:
        (adjusted, reject): float array and bool array, in the input order.

    Example:
        >>> adj, rej = holm([0.01, 0.04, 0.03, 0.005])
        >>> adj.round(3).tolist(), rej.tolist()
        ([0.03, 0.06, 0.06, 0.02], [True, False, False, True])
    """
    p = np.asarray(pvalues, dtype=np.float64).ravel()
    ok = np.isfinite(p)
    if ((p[ok] < 0) | (p[ok] > 1)).any():
        bad = p[ok][(p[ok] < 0) | (p[ok] > 1)][0]
        raise StatsError(f"holm: p-value {float(bad)!r} lies outside [0, 1]")
    adj = np.full_like(p, np.nan)
    q = p[ok]
    m = len(q)
    if m:
        order = np.argsort(q, kind="mergesort")
        stepped = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * q[order]))
        out = np.empty(m)
        out[order] = stepped
        adj[ok] = out
    reject = np.zeros(len(p), dtype=bool)
    reject[ok] = adj[ok] <= alpha
    return adj, reject


def add_holm(frame: pd.DataFrame, *, family: str | Sequence[str] = "family", p: str = "p_value",
             alpha: float = 0.05) -> pd.DataFrame:
    """Copy of `frame` with ``p_holm`` and ``reject`` (Holm within each family).

    Args:
        frame: tidy rows with a p-value column.
        family: column (or columns) naming the family; rows whose family is '' or NaN, or
            whose p-value is NaN, are in no family: p_holm NaN, reject False.
        p: the p-value column.
        alpha: family-wise error rate.
    """
    fams = [family] if isinstance(family, str) else list(family)
    _need(frame, fams + [p], "holm frame")
    out = frame.copy()
    out["p_holm"] = np.nan
    out["reject"] = False
    key = out[fams].astype(str).agg("\x1f".join, axis=1) if len(out) else pd.Series([], dtype=str)
    tested = ~out[fams].isna().any(axis=1) & (out[fams].astype(str) != "").all(axis=1)
    for _, idx in out[tested].groupby(key[tested]).groups.items():
        adj, rej = holm(out.loc[idx, p].to_numpy(dtype=float), alpha)
        out.loc[idx, "p_holm"] = adj
        out.loc[idx, "reject"] = rej
    out["reject"] = out["reject"].astype(bool)
    return out


# --- dose-response -------------------------------------------------------------------------------

DOSE_COLUMNS = ["estimand", "estimate", "intercept", "ci_low", "ci_high", "se", "p_value", "n_points", "n_clusters",
                "n_boot", "reason"]


def dose_response(frame: pd.DataFrame, *, x: str = "R", y: str = "gap", cluster: str | Sequence[str] = "seed",
                  by: Sequence[str] = (), n_boot: int = 10_000, level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """OLS slope of `y` on `x` with a cluster-bootstrap interval (the paper's F5-F8, "gap tracks R").

    The slope is cov(x, y) / var(x) over the points (one row each). Resamples draw the clusters
    (e.g. seeds: the points of one seed share its data and split) with replacement and refit;
    with per-cluster sums of 1, x, y, xy and x^2 every refit is a matrix product. Percentile
    interval and bootstrap p-value as in `bootstrap_summary`; resamples with no spread in x
    are left out (counted in n_boot).

    Args:
        frame: one row per point, with columns x, y, the cluster column(s) and `by`.
        x, y: regressor and response (e.g. R and the leak gap, both fractions).
        cluster: resampled unit(s).
        by: columns to fit separately (one row each).
        n_boot, level, seed: as in `leak_effect`.

    Returns:
        One row per group: `by` columns, estimand ('slope'), estimate, intercept, ci_low, ci_high,
        se, p_value, n_points, n_clusters, n_boot, reason.
    """
    clusters = [cluster] if isinstance(cluster, str) else list(cluster)
    by = list(by)
    _need(frame, [x, y] + clusters + by, "dose-response frame")
    for col in (x, y):
        vals = pd.to_numeric(frame[col], errors="coerce")
        bad = ~np.isfinite(vals.to_numpy(dtype=float))
        if bad.any():
            value = frame[col][bad].iloc[0]
            value = float(value) if isinstance(value, (float, np.floating)) else value
            raise StatsError(f"dose-response column {col!r} holds {value!r} in {_rows(bad)}; "
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
        elif G < 2:
            reason = f"{G} cluster(s) of {clusters}: no interval"
        if reason or n_boot <= 0:
            r = _row(est, None, level, reason, estimand="slope", **head)
        else:
            W = _multinomial_weights(np.random.default_rng(seed), G, n_boot)
            rep, _ = _slope(W @ parts)
            r = _row(est, rep, level, "", estimand="slope", **head)
        r.update(intercept=icpt, n_points=len(sub), n_clusters=G)
        rows.append(r)
    return _finish(rows, by + DOSE_COLUMNS)


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
    _need(results, ["model", "diagnostic", "metric", "setting", "value"], "results")
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


# --- the one table -----------------------------------------------------------------------------

def estimates(predictions: pd.DataFrame, results: pd.DataFrame | None = None, *, baseline: str = "none",
              p1: str = "crop", p2: str = "parent", n_boot: int = 10_000, level: float = 0.95, seed: int = 0,
              alpha: float = 0.05) -> pd.DataFrame:
    """Every estimand of a sweep in one tidy table, Holm-adjusted within families.

    Estimands (rows; all fractions) and their Holm families:

    - ``leak`` pooled over architectures (or the only architecture), intervention `baseline`:
      one test per condition x diversity, family ``leak`` (the headline test, H3);
    - ``leak`` per architecture, `baseline`: family ``leak:<condition>``;
    - ``leak`` under each other intervention: family ``leak_under:<condition>``;
    - ``diversity``: clean-high minus clean-low accuracy within clean models (the paper's
      diversity contrast), per architecture and pooled: family ``diversity:<condition>``;
    - ``leak_cut`` per intervention, architecture (and pooled) and diversity: family
      ``leak_cut:<condition>`` (one family per condition, as F2/F4 test each intervention
      once); ``clean_cost``: family ``clean_cost:<condition>``; ``share_removed``: no test;
    - ``protocol`` (P1 - P2) pooled: family ``protocol``; per architecture:
      ``protocol:<condition>``;
    - ``slope`` of the leak gap on R (`dose_points`, cluster = seed) per condition, when
      `results` holds R rows: family ``dose``.

    A condition with no factorial cells gets no leak rows (e.g. a protocol-only benchmark, as
    CRIC in the paper); one with neither factorial cells nor both protocols, and a sweep with no
    factorial at all, get a NaN row with a `reason`. Degenerate parts (one seed, a cell
    without its clean model) warn and give NaN intervals with a `reason`; none is dropped.

    Returns:
        `ESTIMATE_COLUMNS` (+ ``cost_exceeds_leak`` for the intervention rows, NA elsewhere).
    """
    pred = check_predictions(predictions)
    _check_unique(pred)
    parts = []
    kw = dict(n_boot=n_boot, level=level, seed=seed)
    is_fac = pred["exposure"].isin(["leak", "clean"])
    fac_conditions = set(pred.loc[is_fac, "condition"].unique())
    prot_conditions = {c for c, ps in pred.groupby("condition")["protocol"].unique().items() if {p1, p2} <= set(ps)}
    unused = sorted(set(pred["condition"].unique()) - fac_conditions - prot_conditions)
    if unused and fac_conditions | prot_conditions:
        warnings.warn(f"estimates: condition(s) {', '.join(map(repr, unused))} hold neither factorial cells nor both "
                      f"protocols {p1!r} and {p2!r}: no estimate", StatsWarning, stacklevel=2)
        parts.append(pd.DataFrame([dict(estimand="", family="", condition=c, arch="", diversity="", intervention="",
                                        estimate=np.nan, n_boot=0,
                                        reason=f"neither factorial cells nor both protocols {p1!r} and {p2!r}")
                                   for c in unused]))
    if fac_conditions:
        fac_pred = pred[pred["condition"].isin(fac_conditions)]
        shared = (fac_pred, _factorial_bootstrap(fac_pred, n_boot, seed))
        leak = leak_effect(fac_pred, **kw, _shared=shared)
        primary = leak["intervention"] == baseline
        n_arch = leak.groupby("condition")["arch"].transform(lambda a: (a != "pooled").sum())
        head = primary & ((leak["arch"] == "pooled") | (n_arch == 1))
        leak["family"] = np.where(head, "leak", np.where(primary, "leak:" + leak["condition"],
                                                          "leak_under:" + leak["condition"]))
        leak.loc[leak["reason"].str.startswith("no "), "family"] = ""
        parts.append(leak)
        parts.append(_diversity(pred, baseline, **kw))
        if (pred.loc[is_fac, "intervention"] != baseline).any():
            inter = intervention_effect(fac_pred, baseline=baseline, **kw, _shared=shared)
            inter["family"] = np.where(inter["estimand"] == "share_removed", "",
                                       inter["estimand"] + ":" + inter["condition"])
            parts.append(inter)
    else:
        warnings.warn("estimates: no factorial (no prediction with exposure 'leak' or 'clean'): no leak effect",
                      StatsWarning, stacklevel=2)
        parts.append(pd.DataFrame([dict(estimand="leak", family="", condition=c, arch="", diversity="",
                                        intervention=baseline, estimate=np.nan, n_boot=0,
                                        reason="no factorial: no prediction with exposure 'leak' or 'clean'")
                                   for c in sorted(pred["condition"].unique())]))
    if pred["protocol"].isin([p1, p2]).any():
        prot = protocol_effect(pred, p1=p1, p2=p2, intervention=baseline, **kw)
        prot["family"] = np.where(prot["arch"] == "pooled", "protocol", "protocol:" + prot["condition"])
        single = prot.groupby("condition")["arch"].transform("size") == 1
        prot.loc[single, "family"] = "protocol"
        parts.append(prot)
    if results is not None:
        pts = dose_points(pred, results, intervention=baseline)
        if pts.empty:
            warnings.warn("estimates: results hold no parent-probe R of a factorial leak model: no dose-response",
                          StatsWarning, stacklevel=2)
            parts.append(pd.DataFrame([dict(estimand="slope", family="", condition="", arch="", diversity="",
                                            intervention=baseline, estimate=np.nan, n_boot=0,
                                            reason="no parent-probe R row for a factorial leak model")]))
        else:
            dose = dose_response(pts, x="R", y="gap", cluster="seed", by=["condition"], **kw)
            dose = dose.assign(arch="pooled", diversity="", intervention=baseline, family="dose",
                               n_seeds=dose["n_clusters"], n_parents=np.nan, n_crops=np.nan)
            parts.append(dose.drop(columns=["intercept", "n_points", "n_clusters"]))
    table = pd.concat([p for p in parts if len(p)], ignore_index=True) if parts else pd.DataFrame()
    for col in ESTIMATE_COLUMNS:
        if col not in table.columns:
            table[col] = np.nan
    table["family"] = table["family"].fillna("")
    table = add_holm(table, family="family", alpha=alpha)
    extra = [c for c in ("baseline", "cost_exceeds_leak") if c in table.columns]
    return table[ESTIMATE_COLUMNS + extra].reset_index(drop=True)


def _diversity(pred, baseline, n_boot, level, seed):
    """Clean-high minus clean-low accuracy per condition x arch (and pooled), from clean models."""
    rows = []
    clean = pred[(pred["exposure"] == "clean") & (pred["intervention"] == baseline)]
    for condition, sub in clean.groupby("condition", sort=True):
        if not {"high", "low"} <= set(sub["diversity"].unique()):
            continue
        sub = sub[sub["diversity"].isin(["high", "low"])]
        cells = _Cells(sub, ["arch", "diversity"])
        point = cells.point()
        reps = cells.boot(n_boot, np.random.default_rng(seed)) if n_boot > 0 else None
        per = []
        for arch in sorted(sub["arch"].unique()):
            kh, kl = cells.index.get((arch, "high")), cells.index.get((arch, "low"))
            if kh is None or kl is None:
                continue
            ns, npar, ncrop = _clusters(cells, [kh, kl])
            est, rep = point[kh] - point[kl], (reps[:, kh] - reps[:, kl]) if reps is not None else None
            per.append((est, rep, ns, npar, ncrop))
            rows.append(_row(est, rep, level, _degenerate(ns, npar),
                             estimand="diversity", family=f"diversity:{condition}", condition=condition, arch=arch,
                             diversity="high-low", intervention=baseline, n_seeds=ns, n_parents=npar, n_crops=ncrop))
        if len(per) > 1:
            est = float(np.mean([p[0] for p in per]))
            rep = np.mean([p[1] for p in per], axis=0) if reps is not None else None
            ns, npar = max(p[2] for p in per), max(p[3] for p in per)
            rows.append(_row(est, rep, level, _degenerate(ns, npar),
                             estimand="diversity", family=f"diversity:{condition}", condition=condition,
                             arch="pooled", diversity="high-low", intervention=baseline, n_seeds=ns, n_parents=npar,
                             n_crops=sum(p[4] for p in per)))
    return _finish(rows, ["family"] + LEAK_COLUMNS)


# --- simulation with a known answer --------------------------------------------------------------

def simulate_factorial(*, n_seeds: int = 20, n_parents: int = 100, crops_per_parent: int = 5, archs: Sequence[str] = ("a",),
                       mu: float = 1.5, effect: float = 0.3, sd_seed: float = 0.3, sd_parent: float = 0.8,
                       sd_crop: float = 0.5, sd_model: float = 0.1, sd_seed_effect: float = 0.2,
                       sd_parent_effect: float = 0.4, test_fraction: float = 1.0, condition: str = "sim",
                       diversity: str = "high", seed: int = 0) -> pd.DataFrame:
    """A predictions table of one factorial cell with a known leak effect and cluster structure.

    For checking the statistics and for power analyses (the paper simulated its power). Model
    m of seed s with exposure e (1 leak, 0 clean) gets crop i of parent p right with probability
    ``expit(mu + a_s + b_p + g_i + u_m + e * (effect + c_s + d_p))``: a_s ~ N(0, sd_seed) is
    shared by every model of a seed, b_p ~ N(0, sd_parent) and g_i ~ N(0, sd_crop) by every
    model scoring the parent or crop, u_m ~ N(0, sd_model) is the model's own, and the leak's
    logit gain varies by seed (c_s ~ N(0, sd_seed_effect)) and parent (d_p ~
    N(0, sd_parent_effect)). `true_leak_effect` gives the population leak effect on the
    probability scale. Each seed tests a random `test_fraction` of the parents (all crops).

    Returns:
        The contract's predictions columns (protocol 'factorial', intervention 'none'; model,
        arch, exposure, id, parent and cell as categoricals of strings, for speed).
    """
    rng = np.random.default_rng(seed)
    A = len(archs)
    b, d = rng.normal(0, sd_parent, n_parents), rng.normal(0, sd_parent_effect, n_parents)
    parent = np.repeat(np.arange(n_parents), crops_per_parent)
    g = rng.normal(0, sd_crop, len(parent))
    n_test = max(1, int(round(test_fraction * n_parents)))
    cols = {k: [] for k in ("seed", "arch", "exposure", "crop", "correct")}
    for s in range(n_seeds):
        a_s, c_s = rng.normal(0, sd_seed), rng.normal(0, sd_seed_effect)
        test = np.sort(rng.choice(n_parents, n_test, replace=False)) if n_test < n_parents else np.arange(n_parents)
        crops = np.flatnonzero(np.isin(parent, test))
        base = mu + a_s + b[parent[crops]] + g[crops]
        leak = effect + c_s + d[parent[crops]]
        for arch in range(A):
            for e in (1, 0):
                eta = base + rng.normal(0, sd_model) + e * leak
                cols["correct"].append(rng.random(len(crops)) < 1 / (1 + np.exp(-eta)))
                cols["crop"].append(crops)
                n = len(crops)
                cols["seed"].append(np.full(n, s))
                cols["arch"].append(np.full(n, arch))
                cols["exposure"].append(np.full(n, e))
    seed_col, arch_col, exp_col = (np.concatenate(cols[k]) for k in ("seed", "arch", "exposure"))
    crop = np.concatenate(cols["crop"])
    # names of the few models, crops and parents, built once and indexed (string ops per row are slow)
    arch_names, exp_names = [str(a) for a in archs], ["clean", "leak"]
    models = [f"{a}-{e}-{s}" for a in archs for e in ("clean", "leak") for s in range(n_seeds)]
    crop_names = [f"c{i}" for i in range(len(parent))]
    parent_names = [f"p{j}" for j in range(n_parents)]
    cat = pd.Categorical.from_codes
    return pd.DataFrame({
        "model": cat((arch_col * 2 + exp_col) * n_seeds + seed_col, models), "condition": condition,
        "arch": cat(arch_col, arch_names), "seed": seed_col, "protocol": "factorial",
        "cell": cat(exp_col, [f"clean-{diversity}", f"leak-{diversity}"]), "exposure": cat(exp_col, exp_names),
        "diversity": diversity, "intervention": "none", "id": cat(crop, crop_names),
        "parent": cat(parent[crop], parent_names), "label": 0, "pred": 0,
        "correct": np.concatenate(cols["correct"]), "split_sha256": "",
    })


def true_leak_effect(*, mu: float = 1.5, effect: float = 0.3, sd_seed: float = 0.3, sd_parent: float = 0.8,
                     sd_crop: float = 0.5, sd_model: float = 0.1, sd_seed_effect: float = 0.2,
                     sd_parent_effect: float = 0.4, **_ignored) -> float:
    """Population leak effect of `simulate_factorial`'s model on the probability scale.

    E[expit(mu + effect + Z1)] - E[expit(mu + Z0)], with Z1, Z0 centred normals of the summed
    variances (leak: all six components; clean: the four without the leak's), by 200-point
    Gauss-Hermite quadrature (error far below 1e-10).
    """
    t, w = np.polynomial.hermite_e.hermegauss(200)
    w = w / w.sum()
    v0 = sd_seed ** 2 + sd_parent ** 2 + sd_crop ** 2 + sd_model ** 2
    v1 = v0 + sd_seed_effect ** 2 + sd_parent_effect ** 2

    def mean_expit(m, v):
        return float(np.sum(w / (1 + np.exp(-(m + math.sqrt(v) * t)))))

    return mean_expit(mu + effect, v1) - mean_expit(mu, v0)
def chance_level(test_labels, n_classes: int) -> float:
    """The chance level a retrained diagnostic is compared with: the largest class share of
    the test labels (what always predicting one class scores).

    On a balanced test side this is 1 / K; it is never below 1 / K, so a model that learned
    nothing but the majority class is never called "above chance".

    Args:
        test_labels: (n,) integer class codes of the scored crops.
        n_classes: K, the number of classes the model predicts.

    Returns:
        The share in [1 / K, 1]; NaN without test labels.
    """
    import numpy as np

    y = np.asarray(test_labels, dtype=np.int64)
    if len(y) == 0:
        return math.nan
    return float(max(np.bincount(y, minlength=n_classes).max() / len(y), 1.0 / n_classes))


def against_chance(k: int, n: int, chance: float, level: float = 0.95) -> dict:
    """An accuracy k / n against a chance level: Wilson interval and a one-sided exact test.

    Returns:
        ``accuracy``, ``k``, ``n``, ``chance``, ``ci_low``, ``ci_high`` (Wilson, `level`),
        ``above_chance`` (the interval lies above chance), ``p_value`` (exact binomial test of
        accuracy > chance, scipy). Both treat crops as independent trials; siblings are not, so
        they are optimistic.
    """
    from scipy.stats import binomtest

    lo, hi = wilson_interval(k, n, level)
    p = float(binomtest(int(k), int(n), min(max(chance, 0.0), 1.0), alternative="greater").pvalue) if n > 0 else math.nan
    return {
        "accuracy": k / n if n else math.nan,
        "k": int(k),
        "n": int(n),
        "chance": chance,
        "ci_low": lo,
        "ci_high": hi,
        "above_chance": bool(n > 0 and lo > chance),
        "p_value": p,
    }


def cluster_bootstrap_interval(correct, clusters, level: float = 0.95, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of an accuracy when trials come in clusters (crops in parents).

    Clusters are resampled with replacement (B = `n_boot` draws, seeded) and the accuracy
    recomputed as correct / crops over the drawn clusters. Siblings of one parent tend to be
    right or wrong together (a model that recognises the parent gives them one answer), so the
    effective sample size is nearer the number of parents than of crops; the Wilson interval,
    which counts crops, is then too narrow.

    Args:
        correct: (n,) bool or 0/1, one per scored crop.
        clusters: (n,) cluster (parent) labels of the crops.
        level: two-sided coverage.
        n_boot: bootstrap draws.
        seed: numpy seed of the draws.

    Returns:
        (low, high); (nan, nan) without crops; a single cluster gives its accuracy twice.
    """
    import numpy as np
    import pandas as pd

    c = np.asarray(correct, dtype=np.float64)
    if len(c) == 0:
        return (math.nan, math.nan)
    codes = pd.factorize(pd.Series(np.asarray(clusters, dtype=object)))[0]
    k = np.bincount(codes, weights=c)
    n = np.bincount(codes).astype(np.float64)
    m = len(n)
    w = np.random.default_rng(seed).multinomial(m, np.full(m, 1.0 / m), size=n_boot).astype(np.float64)
    acc = (w @ k) / (w @ n)
    a = (1 - level) / 2
    return (float(np.quantile(acc, a)), float(np.quantile(acc, 1 - a)))
