"""Sensitivity analyses beside each primary estimate (the paper's "Satterthwaite, Kenward-Roger,
binomial-mixed-model and sign-flip tests as sensitivity analyses").

The primary inference is the two-way cluster bootstrap of `estimates`. Beside each primary
estimate -- the leak effect per condition pooled over architectures (per diversity level, and
pooled over diversity levels when there are several), the leak cut of each intervention per
diversity level pooled over architectures, and the protocol effect P1 - P2 per condition pooled
over architectures -- `sensitivity_table` computes three analyses that lean on other
assumptions:

- ``sign_flip``: a randomisation test over seeds (Fisher 1935; Good 2005). The per-seed
  differences D_s are flipped in sign; under the null each seed's difference is symmetric about
  zero. Exact over all 2^S sign patterns up to `MAX_EXACT_SEEDS` seeds, else Monte Carlo.
- ``paired_t``: a t-test on the per-seed differences. In the balanced design (equal crops per
  seed, no seed missing a cell) it is the one-sample t on D_s with S - 1 df, which is also what
  Satterthwaite and Kenward-Roger give for a linear mixed model with a seed random intercept
  (one difference per seed: the seed is the only error stratum). Where the design is not
  balanced, the estimate is the crop-weighted mean of D_s and its variance and df are the
  Bell-McCaffrey (2002) bias-reduced cluster variance with its Satterthwaite df
  (`weighted_t`).
- ``binomial_glmm``: a binomial (logit) mixed model with crossed seed and parent random
  intercepts and one fixed log-odds per cell (statsmodels `BinomialBayesMixedGLM`, variational
  Bayes), whose contrast gives the effect on the log-odds scale with a posterior-SD z
  (`binomial_glmm`). A fit that fails or does not converge is recorded in `reason`, never
  raised.

Statsmodels is imported lazily, only by the mixed model: the sign-flip and t analyses need
numpy and scipy alone, and without statsmodels the mixed-model row records why it is missing
(install the ``stats`` extra) instead of failing the whole table.

Example:
    >>> from shortcutlab.stats import simulate_factorial
    >>> from shortcutlab.stats.sensitivity import sensitivity_table
    >>> pred = simulate_factorial(n_seeds=6, n_parents=30, effect=1.0, seed=1)
    >>> table = sensitivity_table(pred, mixed_model=False)
    >>> list(table["analysis"])
    ['sign_flip', 'paired_t']
    >>> bool((table["p_value"] < 0.05).all())
    True
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

from .errors import StatsError, StatsWarning
from .factorial import factorial_rows
from .predictions import check_predictions, check_unique, group_codes

__all__ = ["ANALYSES", "KEYS", "MAX_EXACT_SEEDS", "MAX_GLMM_ROWS", "N_SIGN_FLIPS", "SENSITIVITY_COLUMNS",
           "SeedDifferences", "binomial_glmm", "primary_contrasts", "seed_differences", "sensitivity_summary", "sensitivity_table",
           "sign_flip_test", "weighted_t"]

#: Columns of `sensitivity_table`: the keys of the estimates row it sits beside, then the analysis.
SENSITIVITY_COLUMNS = ["estimand", "condition", "arch", "diversity", "intervention", "analysis", "scale", "estimate",
                       "statistic", "df", "p_value", "n_seeds", "method", "reason"]
#: The analyses, in the order of the table.
ANALYSES = ("sign_flip", "paired_t", "binomial_glmm")
#: Up to this many seeds the sign-flip test enumerates all 2^S patterns (65,536 at 16).
MAX_EXACT_SEEDS = 16
#: Random sign patterns of the Monte Carlo sign-flip test beyond `MAX_EXACT_SEEDS` seeds.
N_SIGN_FLIPS = 20_000
#: Crop-level rows above which the mixed model is not fitted by default: its time is linear in
#: the rows (about 40 s for 24,000 on one core), so 250,000 rows take several minutes.
MAX_GLMM_ROWS = 250_000


@dataclass(frozen=True)
class SeedDifferences:
    """The per-seed differences of one contrast and their weights.

    Attributes:
        seeds: (S,) the seeds holding at least one complete unit of the contrast.
        d: (S,) D_s, the contrast computed within seed s (e.g. the mean over architectures of
            leak-model minus clean-model accuracy on that seed's common test crops).
        w: (S,) W_s, the seed's share of the crops (summing to 1); ``sum(w * d)`` is the
            crop-weighted estimate, equal to the primary estimate for the factorial's contrasts.
    """

    seeds: np.ndarray
    d: np.ndarray
    w: np.ndarray

    @property
    def estimate(self) -> float:
        """The crop-weighted mean of the per-seed differences."""
        return float(np.sum(self.w * self.d)) if len(self.d) else math.nan

    @property
    def balanced(self) -> bool:
        """Every seed weighs the same (equal crops per seed, no seed missing a cell)."""
        return bool(len(self.w)) and bool(np.allclose(self.w, 1.0 / len(self.w), rtol=1e-9, atol=0))


def seed_differences(frame: pd.DataFrame) -> SeedDifferences:
    """Per-seed differences of a contrast given as signed terms within units.

    A contrast is the mean over units u (architectures; architecture x diversity level) of a
    signed sum of cell accuracies (the terms: leak minus clean; or leak minus clean under the
    baseline minus the same under an intervention). Within seed s, unit u has d_su = sum of
    sign x accuracy over its terms and n_su crops (the mean over its terms); a seed missing one
    of a unit's terms does not count for that unit. With r_su = n_su / sum_s n_su the unit's
    crop-weighted estimate is sum_s r_su d_su, and the contrast sum_s W_s D_s with
    W_s = mean_u r_su and D_s = mean_u (r_su d_su) / W_s. With equal crops per seed and no
    cell missing, W_s = 1/S and D_s = mean_u d_su.

    Args:
        frame: one row per scored crop with columns ``seed``, ``correct`` (0/1), ``unit``,
            ``term`` and ``sign`` (+1 or -1, constant within a term).

    Returns:
        `SeedDifferences` (empty arrays when no seed holds a complete unit).
    """
    seed_code, seeds = pd.factorize(frame["seed"], sort=True)
    cell = group_codes(frame, ["unit", "term"])
    K, S = (int(cell.max()) + 1, len(seeds)) if len(cell) else (0, 0)
    first = np.unique(cell, return_index=True)[1]
    unit_of = pd.factorize(frame["unit"].to_numpy()[first])[0]
    sign = frame["sign"].to_numpy(np.float64)[first]
    flat = cell * S + seed_code
    n = np.bincount(flat, minlength=K * S).reshape(K, S).astype(np.float64)
    hit = np.bincount(flat, weights=frame["correct"].to_numpy(np.float64), minlength=K * S).reshape(K, S)
    acc = np.divide(hit, n, out=np.zeros_like(hit), where=n > 0)
    to_unit = np.zeros((int(unit_of.max()) + 1 if K else 0, K))
    to_unit[unit_of, np.arange(K)] = 1.0
    n_terms = to_unit.sum(axis=1, keepdims=True)
    complete = (to_unit @ (n > 0)) == n_terms                     # (U, S): the seed holds every term of the unit
    d = to_unit @ (sign[:, None] * acc)                            # d_su
    n_us = np.where(complete, (to_unit @ n) / n_terms, 0.0)       # n_su
    used = n_us.sum(axis=1) > 0
    r = n_us[used] / n_us[used].sum(axis=1, keepdims=True)
    w = r.sum(axis=0) / max(int(used.sum()), 1)
    rd = (r * d[used]).sum(axis=0) / max(int(used.sum()), 1)
    keep = w > 0
    return SeedDifferences(np.asarray(seeds)[keep], rd[keep] / w[keep], w[keep])


def _checked_dw(d, w, what: str) -> tuple[np.ndarray, np.ndarray]:
    """d and w as float vectors, w normalised to sum to 1 (equal when None).

    Raises:
        StatsError: d or w is not one-dimensional, their lengths differ, a value is not finite,
            or a weight is negative or all are zero (naming the first offending position).
    """
    d = np.asarray(d, dtype=np.float64)
    w = np.full(len(d), 1.0) if w is None else np.asarray(w, dtype=np.float64)
    if d.ndim != 1 or w.ndim != 1 or len(d) != len(w):
        raise StatsError(f"{what}: per-seed differences d have shape {d.shape} and weights w shape {w.shape}; "
                         f"expected two vectors of one value per seed")
    for name, v in (("d", d), ("w", w)):
        bad = np.flatnonzero(~np.isfinite(v) | ((v < 0) if name == "w" else False))
        if len(bad):
            raise StatsError(f"{what}: {name}[{bad[0]}] is {v[bad[0]]!r}; expected a finite "
                             f"{'weight >= 0' if name == 'w' else 'difference'}")
    if len(w) and not w.sum() > 0:
        raise StatsError(f"{what}: every weight is 0; expected weights summing to more than 0")
    return d, (w / w.sum() if len(w) else w)


def sign_flip_test(d, w=None, *, max_exact: int = MAX_EXACT_SEEDS, n_flips: int = N_SIGN_FLIPS,
                   seed: int = 0) -> dict:
    """Two-sided sign-flip randomisation test of a weighted mean of per-seed differences.

    The statistic is T = sum_s w_s d_s. Under the null each d_s is symmetric about zero and
    independent across seeds, so every sign pattern e gives a T_e = sum_s w_s e_s d_s as likely
    as T. The p-value is the share of patterns with |T_e| >= |T| (a relative tolerance of 1e-9
    counts float ties). With S <= `max_exact` seeds all 2^S patterns are enumerated (exact; the
    smallest p is 2 / 2^S); beyond, `n_flips` random patterns and p = (1 + #{|T_e| >= |T|}) /
    (n_flips + 1), which is valid for a finite Monte Carlo sample.

    Args:
        d: (S,) per-seed differences.
        w: (S,) weights (default equal).
        max_exact: enumerate all patterns up to this many seeds.
        n_flips: random patterns beyond.
        seed: seed of the random patterns.

    Returns:
        dict: statistic (T), p_value, exact (bool), n_patterns.
    """
    d, w = _checked_dw(d, w, "sign_flip_test")
    S = len(d)
    wd = w * d
    t = float(wd.sum())
    tol = 1e-9 * max(float(np.abs(wd).sum()), 1e-300)
    if S <= max_exact:
        bits = (np.arange(2 ** S)[:, None] >> np.arange(S)[None, :]) & 1
        flips = np.abs((1 - 2 * bits) @ wd)
        return dict(statistic=t, p_value=float(np.mean(flips >= abs(t) - tol)), exact=True, n_patterns=2 ** S)
    rng = np.random.default_rng(seed)
    hits = 0
    for lo in range(0, n_flips, 4096):
        signs = rng.integers(0, 2, size=(min(4096, n_flips - lo), S)) * 2 - 1
        hits += int(np.count_nonzero(np.abs(signs @ wd) >= abs(t) - tol))
    return dict(statistic=t, p_value=(1 + hits) / (n_flips + 1), exact=False, n_patterns=n_flips)


def weighted_t(d, w=None) -> dict:
    """t-test of a weighted mean of per-seed differences, with a Satterthwaite df.

    The estimate is m = sum_s w_s d_s (weights summing to 1). Its variance is estimated by the
    bias-reduced cluster-robust estimator V = c sum_s w_s^2 (d_s - m)^2, with c chosen so that
    V is unbiased when the seeds' differences are independent with equal variance (Bell and
    McCaffrey 2002, the CR2 idea for one observation per cluster). V is a quadratic form d'Md,
    and its Satterthwaite df under that working model is tr(M)^2 / tr(M^2) (Bell and
    McCaffrey's df; Imbens and Kolesar 2016). With equal weights this is exactly the one-sample
    t on d with S - 1 df (what `scipy.stats.ttest_1samp` computes); with unequal weights (unequal
    crops per seed, a seed missing a cell) the df are below S - 1.

    Args:
        d: (S,) per-seed differences.
        w: (S,) weights (default equal); normalised to sum to 1.

    Returns:
        dict: estimate, se, statistic (t), df, p_value (two-sided), reason ('' or why there is
        no test: fewer than 2 seeds, no spread).
    """
    d, w = _checked_dw(d, w, "weighted_t")
    S = len(d)
    m = float(np.sum(w * d)) if S else math.nan
    out = dict(estimate=m, se=math.nan, statistic=math.nan, df=math.nan, p_value=math.nan, reason="")
    if S < 2:
        out["reason"] = f"{S} seed(s): no between-seed variance, no t-test"
        return out
    centre = np.eye(S) - np.outer(np.ones(S), w)          # d - m = centre @ d
    G = centre.T @ np.diag(w ** 2) @ centre
    M = G * (np.sum(w ** 2) / np.trace(G))                # E[d'Md] = sigma^2 sum w^2 when Var d = sigma^2 I
    var = float(d @ M @ d)
    out["df"] = float(np.trace(M) ** 2 / np.trace(M @ M))
    if not var > 1e-300:
        out["reason"] = "every seed gives the same difference: no spread, no t-test"
        return out
    out["se"] = math.sqrt(var)
    out["statistic"] = m / out["se"]
    out["p_value"] = float(2 * sps.t.sf(abs(out["statistic"]), out["df"]))
    return out


# --- the primary contrasts -------------------------------------------------------------------------

def _contrast(rows: pd.DataFrame, unit, term, sign) -> pd.DataFrame:
    """The frame `seed_differences` and `binomial_glmm` read: seed, parent, correct, unit, term, sign."""
    return pd.DataFrame({"seed": rows["seed"].to_numpy(), "parent": rows["parent"].astype(str).to_numpy(),
                         "correct": rows["correct"].to_numpy(np.float64), "unit": np.asarray(unit, dtype=object),
                         "term": np.asarray(term, dtype=object), "sign": np.asarray(sign, dtype=np.float64)})


def _pooled_arch(archs) -> str:
    """The arch key of a row pooled over `archs`: 'pooled', or the only architecture (as `estimates`)."""
    archs = sorted(set(map(str, archs)))
    return archs[0] if len(archs) == 1 else "pooled"


def _leak_contrasts(fac: pd.DataFrame, condition: str, baseline: str) -> list[tuple[dict, pd.DataFrame]]:
    """The leak (leak minus clean, pooled over architectures) per diversity level and, with
    several levels, pooled over them (``leak_pooled``, the paper's H3: every arch x level unit
    weighing the same, i.e. the mean over levels of the mean over architectures)."""
    out = []
    sub = fac[fac["intervention"] == baseline]
    sign = np.where(sub["exposure"].to_numpy() == "leak", 1.0, -1.0)
    arch, div, exp = (sub[c].astype(str).to_numpy() for c in ("arch", "diversity", "exposure"))
    for level in sorted(set(div)):
        m = div == level
        out.append((dict(estimand="leak", condition=condition, arch=_pooled_arch(arch[m]), diversity=level,
                         intervention=baseline), _contrast(sub[m], arch[m], exp[m], sign[m])))
    if len(set(div)) > 1:       # keyed as `estimates`' ``leak_pooled`` row (H3)
        out.append((dict(estimand="leak_pooled", condition=condition, arch="pooled", diversity="pooled",
                         intervention=baseline), _contrast(sub, arch + "|" + div, exp, sign)))
    return out


def _cut_contrasts(fac: pd.DataFrame, condition: str, baseline: str) -> list[tuple[dict, pd.DataFrame]]:
    """The leak cut of each intervention (leak under `baseline` minus leak under it), per
    diversity level pooled over architectures, and with several levels pooled over them too
    (``leak_cut_pooled``, the paper's F2)."""
    out = []
    inters = sorted(set(fac["intervention"].astype(str)) - {baseline})
    if baseline not in set(fac["intervention"].astype(str)):
        return out
    for inter in inters:
        sub = fac[fac["intervention"].isin([baseline, inter])]
        arch, div, exp, itv = (sub[c].astype(str).to_numpy() for c in ("arch", "diversity", "exposure", "intervention"))
        sign = np.where(exp == "leak", 1.0, -1.0) * np.where(itv == baseline, 1.0, -1.0)
        for level in sorted(set(div)):
            m = div == level
            out.append((dict(estimand="leak_cut", condition=condition, arch=_pooled_arch(arch[m]), diversity=level,
                             intervention=inter), _contrast(sub[m], arch[m], exp[m] + "|" + itv[m], sign[m])))
        if len(set(div)) > 1:   # keyed as `estimates`' ``leak_cut_pooled`` row (F2)
            out.append((dict(estimand="leak_cut_pooled", condition=condition, arch="pooled", diversity="pooled",
                             intervention=inter), _contrast(sub, arch + "|" + div, exp + "|" + itv, sign)))
    return out


def primary_contrasts(pred: pd.DataFrame, *, baseline: str = "none", p1: str = "crop",
                      p2: str = "parent") -> list[tuple[dict, pd.DataFrame]]:
    """The primary estimates that get sensitivity analyses, each as its key and contrast frame.

    Per condition: the leak effect pooled over architectures per diversity level (and pooled
    over levels when there are several: estimand ``leak_pooled``, diversity 'pooled') on the
    common test crops of each seed's leak/clean pair (`factorial_rows`); the leak cut of each
    intervention per diversity level (and ``leak_cut_pooled`` over levels); the protocol
    effect P1 - P2 under `baseline`, each model on its own test crops.

    Args:
        pred: checked predictions (`check_predictions`).
        baseline, p1, p2: as in `estimates`.

    Returns:
        [(key, frame)]: key holds estimand, condition, arch ('pooled' or the only architecture),
        diversity, intervention, as the estimates row it sits beside; frame the columns that
        `seed_differences` reads, plus ``parent``.
    """
    out = []
    is_fac = pred["exposure"].isin(["leak", "clean"])
    if is_fac.any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # `estimates` already warned about crops left out
            fac = factorial_rows(pred[is_fac])[0]
        for condition, sub in fac.groupby("condition", sort=True, observed=True):
            out += _leak_contrasts(sub, str(condition), baseline)
            out += _cut_contrasts(sub, str(condition), baseline)
    prot = pred[(pred["intervention"] == baseline) & pred["protocol"].isin([p1, p2])]
    for condition, sub in prot.groupby("condition", sort=True, observed=True):
        if set(sub["protocol"].unique()) != {p1, p2}:
            continue
        arch, proto = sub["arch"].astype(str).to_numpy(), sub["protocol"].astype(str).to_numpy()
        out.append((dict(estimand="protocol", condition=str(condition), arch=_pooled_arch(arch), diversity="",
                         intervention=baseline), _contrast(sub, arch, proto, np.where(proto == p1, 1.0, -1.0))))
    return out


# --- the binomial mixed model ------------------------------------------------------------------------

def _glmm_design(frame: pd.DataFrame):
    """(y, cell-mean design X, contrast c over X's columns, sparse seed+parent indicators Z, ident, names)."""
    from scipy import sparse

    cell = group_codes(frame, ["unit", "term"])
    K = int(cell.max()) + 1
    first = np.unique(cell, return_index=True)[1]
    keys = frame.iloc[first]
    n_units = keys["unit"].nunique()
    c = keys["sign"].to_numpy(np.float64) / n_units
    X = np.zeros((len(frame), K))
    X[np.arange(len(frame)), cell] = 1.0
    seed_code, seeds = pd.factorize(frame["seed"], sort=True)
    parent_code, parents = pd.factorize(frame["parent"], sort=True)
    n = len(frame)
    cols = np.concatenate([seed_code, len(seeds) + parent_code])
    rows = np.concatenate([np.arange(n), np.arange(n)])
    Z = sparse.csr_array((np.ones(2 * n), (rows, cols)), shape=(n, len(seeds) + len(parents)))
    ident = np.concatenate([np.zeros(len(seeds), dtype=int), np.ones(len(parents), dtype=int)])
    names = [f"{u}:{t}" for u, t in zip(keys["unit"], keys["term"])]
    return frame["correct"].to_numpy(np.float64), X, c, Z, ident, names


def binomial_glmm(frame: pd.DataFrame, *, seed: int = 0, max_iter: int | None = None,
                  max_rows: int = MAX_GLMM_ROWS) -> dict:
    """The contrast on the log-odds scale in a binomial mixed model with crossed random intercepts.

    Model: logit P(correct) = beta_cell + a_seed + b_parent, with one fixed log-odds beta per
    cell (unit x term: architecture x exposure, ...) and independent normal random intercepts
    for seeds (shared by every model of a seed: its data and split) and test parents (shared by
    every model scoring the parent's crops), crossed, not nested. The effect is the contrast
    sum over cells of sign x beta / number of units (e.g. the mean over architectures of the
    leak-minus-clean log-odds ratio). Fitted with statsmodels' `BinomialBayesMixedGLM`, the one
    statsmodels route with crossed random intercepts for a binary response (its frequentist
    `MixedLM` is Gaussian and nests; GEE has one cluster level), by its variational Bayes fit
    (`fit_vb`, mean-field Gaussian posterior; Blei et al. 2017) with statsmodels' default priors
    (fixed effects N(0, 2^2), log SDs N(0, 1)), which the thousands of crops per cell outweigh.
    The contrast's posterior SD is sqrt(sum c_k^2 sd_k^2) over the fixed effects' posterior SDs;
    the test is z = contrast / posterior SD, p = 2 Phi(-|z|). Not the Laplace fit (`fit_map`):
    the joint posterior mode over the random effects and their log SDs is degenerate (the
    "funnel" as a variance goes to 0) and it failed to converge on 4 of 4 small simulated
    factorials (6 seeds, 30 parents) where the variational fit converged in about 60 BFGS
    iterations. Mean-field SDs ignore posterior correlations and run smaller than the Laplace
    ones (0.028 against 0.038 for a leak log-odds ratio on 20,000 crops), so this z is, if
    anything, optimistic.

    The random intercepts do not let the effect vary by seed or parent: where it does, this
    model's SD is too small, and the sign-flip and t analyses (on per-seed differences) or the
    primary bootstrap are the ones to read.

    Args:
        frame: the contrast's rows (`primary_contrasts`): seed, parent, correct, unit, term, sign.
        seed: seed of the optimiser's random start of the random effects.
        max_iter: cap on the BFGS iterations (None: scipy's default).
        max_rows: a contrast with more crop-level rows is not fitted (recorded in `reason`).

    Returns:
        dict: estimate (log-odds), se (posterior SD), statistic (z), p_value, reason ('' or why
        there is no estimate: statsmodels missing, too large, did not converge, failed), method.
    """
    out = dict(estimate=math.nan, se=math.nan, statistic=math.nan, p_value=math.nan, reason="",
               method="variational posterior mean and SD (statsmodels BinomialBayesMixedGLM.fit_vb), "
                      "crossed seed and parent random intercepts")
    try:
        from statsmodels.genmod.bayes_mixed_glm import BinomialBayesMixedGLM
    except ImportError:
        out["reason"] = "statsmodels is not installed: pip install statsmodels (a dependency of shortcutlab) for the mixed model"
        return out
    if len(frame) > max_rows:
        out["reason"] = (f"not fitted: {len(frame)} crop-level rows exceed max_rows={max_rows} (the fit's time grows "
                         f"with the rows, about 40 s per 24,000); raise max_rows to fit it")
        return out
    y, X, c, Z, ident, names = _glmm_design(frame)
    model = BinomialBayesMixedGLM(y, X, Z, ident, fep_names=names, vcp_names=["seed", "parent"])
    opts = None if max_iter is None else {"maxiter": int(max_iter)}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # non-convergence is recorded below
            res = model.fit_vb(minim_opts=opts, rng=np.random.default_rng(seed))
    except (np.linalg.LinAlgError, ValueError, FloatingPointError, OverflowError) as e:
        out["reason"] = f"mixed model failed: {type(e).__name__}: {' '.join(str(e).split())}"
        return out
    return _glmm_summary(res, c, out)


def _glmm_summary(res, c: np.ndarray, out: dict) -> dict:
    """The contrast's posterior mean, SD and z from a `fit_vb` result, or why not.

    Converged: BFGS reported success, or stopped (precision loss) with a gradient norm under
    1e-3 on an evidence bound summed over thousands of crops, which is at its optimum to far
    below the posterior SD."""
    opt = res.optim_retvals
    grad = float(np.sqrt(np.sum(np.asarray(opt.jac) ** 2)))
    if not (opt.success or grad < 1e-3):
        out["reason"] = (f"mixed model did not converge after {opt.nit} BFGS iterations "
                         f"(|gradient| {grad:.2g}: {' '.join(str(opt.message).split())})")
        return out
    est = float(c @ np.asarray(res.fe_mean))
    var = float(np.sum(c ** 2 * np.asarray(res.fe_sd) ** 2))
    if not (np.isfinite(var) and var > 0 and np.isfinite(est)):
        out["reason"] = f"mixed model: no finite posterior SD of the contrast (variance {var:.3g})"
        return out
    out.update(estimate=est, se=math.sqrt(var), statistic=est / math.sqrt(var))
    out["p_value"] = float(2 * sps.norm.sf(abs(out["statistic"])))
    return out


# --- the table -----------------------------------------------------------------------------------------

def _seed_rows(key: dict, sd: SeedDifferences, *, max_exact: int, n_flips: int, seed: int) -> list[dict]:
    """The sign-flip and paired-t rows of one primary estimate from its per-seed differences."""
    S = len(sd.d)
    base = dict(key, scale="accuracy", estimate=sd.estimate, n_seeds=S)
    if S < 2:
        why = f"{S} seed(s) with the whole contrast: no test across seeds"
        return [dict(base, analysis=a, statistic=math.nan, df=math.nan, p_value=math.nan, method="", reason=why)
                for a in ANALYSES[:2]]
    flip = sign_flip_test(sd.d, sd.w, max_exact=max_exact, n_flips=n_flips, seed=seed)
    how = (f"exact: all {flip['n_patterns']} sign patterns of {S} seeds" if flip["exact"]
           else f"Monte Carlo: {flip['n_patterns']} random sign patterns of {S} seeds")
    rows = [dict(base, analysis="sign_flip", statistic=flip["statistic"], df=math.nan, p_value=flip["p_value"],
                 method=how + ("" if sd.balanced else ", crop-weighted per-seed differences"), reason="")]
    t = weighted_t(sd.d, sd.w)
    how = (f"one-sample t on {S} per-seed differences, {S - 1} df (balanced: Satterthwaite and Kenward-Roger "
           f"give S - 1)" if sd.balanced else
           f"crop-weighted t on {S} per-seed differences (unequal crops per seed or a seed missing a cell): "
           f"Bell-McCaffrey variance, Satterthwaite df {t['df']:.2f}")
    rows.append(dict(base, analysis="paired_t", statistic=t["statistic"], df=t["df"], p_value=t["p_value"],
                     method=how, reason=t["reason"]))
    return rows


def sensitivity_table(predictions: pd.DataFrame, *, baseline: str = "none", p1: str = "crop", p2: str = "parent",
                      mixed_model: bool = True, max_exact: int = MAX_EXACT_SEEDS, n_flips: int = N_SIGN_FLIPS,
                      seed: int = 0, max_iter: int | None = None, max_rows: int = MAX_GLMM_ROWS) -> pd.DataFrame:
    """The sensitivity analyses of every primary estimate, keyed like `estimates`' rows.

    For each primary estimate (`primary_contrasts`: the leak pooled over architectures per
    diversity level and pooled over levels, the leak cut of each intervention, the protocol
    effect) the per-seed differences (`seed_differences`) get a sign-flip randomisation test
    (`sign_flip_test`) and a t-test (`weighted_t`: S - 1 df when balanced, a Satterthwaite df
    when not), and the crop-level data a binomial mixed model with crossed seed and parent
    random intercepts (`binomial_glmm`, log-odds scale), each a row. The first two test the
    estimate on the accuracy scale (a fraction; for the factorial's contrasts the same number
    as the primary estimate); the mixed model tests its own log-odds contrast.

    Degenerate parts are rows with a `reason`, never errors: fewer than two seeds, no spread
    across seeds, a mixed model that fails or does not converge, statsmodels missing.

    Args:
        predictions: the sweep's predictions table (checked here).
        baseline, p1, p2: as in `estimates`.
        mixed_model: fit the binomial mixed model (its rows are left out when False).
        max_exact, n_flips, seed: the sign-flip test's settings (`sign_flip_test`); `seed` also
            seeds the mixed model's start.
        max_iter: the mixed model's BFGS iteration cap (None: scipy's default).
        max_rows: the mixed model is fitted up to this many crop-level rows per contrast
            (`MAX_GLMM_ROWS`); a larger one gets a row with the reason.

    Returns:
        `SENSITIVITY_COLUMNS`: estimand, condition, arch, diversity, intervention (the keys of
        the estimates row), analysis ('sign_flip', 'paired_t', 'binomial_glmm'), scale
        ('accuracy' or 'log-odds'), estimate, statistic (the weighted mean difference, t or
        z), df (t only), p_value (two-sided), n_seeds, method (what was computed), reason.
    """
    _check_settings(max_exact, n_flips, max_iter)
    pred = check_predictions(predictions)
    check_unique(pred)
    rows = []
    for key, frame in primary_contrasts(pred, baseline=baseline, p1=p1, p2=p2):
        sd = seed_differences(frame)
        rows += _seed_rows(key, sd, max_exact=max_exact, n_flips=n_flips, seed=seed)
        if mixed_model:
            g = binomial_glmm(frame, seed=seed, max_iter=max_iter, max_rows=max_rows)
            rows.append(dict(key, analysis="binomial_glmm", scale="log-odds", estimate=g["estimate"],
                             statistic=g["statistic"], df=math.nan, p_value=g["p_value"], n_seeds=len(sd.d),
                             method=g["method"] + ("; z = estimate / posterior SD" if not g["reason"] else ""),
                             reason=g["reason"]))
    table = pd.DataFrame(rows, columns=SENSITIVITY_COLUMNS)
    for r in table[table["reason"] != ""].itertuples():
        warnings.warn(f"sensitivity {r.analysis} of {r.estimand} condition={r.condition}, arch={r.arch}, "
                      f"diversity={r.diversity}, intervention={r.intervention}: {r.reason}", StatsWarning, stacklevel=2)
    return table


def _check_settings(max_exact, n_flips, max_iter) -> None:
    """Reject settings the analyses cannot run with, naming the value and what was expected."""
    if not isinstance(max_exact, (int, np.integer)) or not 0 <= max_exact <= 20:
        raise StatsError(f"sensitivity max_exact must be an integer from 0 to 20 (2^20 sign patterns at most); "
                         f"got {max_exact!r}")
    if not isinstance(n_flips, (int, np.integer)) or n_flips < 1:
        raise StatsError(f"sensitivity n_flips must be an integer >= 1 (random sign patterns); got {n_flips!r}")
    if max_iter is not None and (not isinstance(max_iter, (int, np.integer)) or max_iter < 1):
        raise StatsError(f"sensitivity max_iter must be None or an integer >= 1 (BFGS iterations); got {max_iter!r}")


#: Keys shared by the sensitivity and estimates tables.
KEYS = ["estimand", "condition", "arch", "diversity", "intervention"]


def sensitivity_summary(table: pd.DataFrame, estimates: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per primary estimate with every analysis side by side, as the paper's table.

    Args:
        table: `sensitivity_table`'s rows.
        estimates: `estimates`' table, or None; when given, its estimate and bootstrap p-value
            (the primary inference) are joined on the keys.

    Returns:
        The keys, then estimate (the primary's when `estimates` is given, else the per-seed
        mean), p_bootstrap, p_sign_flip, t, df, p_t, glmm_log_odds, p_glmm and notes (the
        reasons of analyses without a result, '; '-joined).
    """
    if table.empty:
        return pd.DataFrame(columns=KEYS + ["estimate", "p_bootstrap", "p_sign_flip", "t", "df", "p_t",
                                            "glmm_log_odds", "p_glmm", "notes"])
    rows = []
    for key, sub in table.groupby(KEYS, sort=False):
        by = {r["analysis"]: r for r in sub.to_dict("records")}
        flip, t, g = by.get("sign_flip", {}), by.get("paired_t", {}), by.get("binomial_glmm", {})
        notes = "; ".join(f"{a}: {r['reason']}" for a, r in by.items() if r["reason"])
        rows.append(dict(zip(KEYS, key), estimate=flip.get("estimate", math.nan), p_bootstrap=math.nan,
                         p_sign_flip=flip.get("p_value", math.nan), t=t.get("statistic", math.nan),
                         df=t.get("df", math.nan), p_t=t.get("p_value", math.nan),
                         glmm_log_odds=g.get("estimate", math.nan), p_glmm=g.get("p_value", math.nan), notes=notes))
    out = pd.DataFrame(rows)
    if estimates is not None and len(estimates):
        est = estimates[KEYS + ["estimate", "p_value"]].astype({k: str for k in KEYS})
        est = est.drop_duplicates(KEYS).rename(columns={"estimate": "_primary", "p_value": "_p"})
        out = out.merge(est, on=KEYS, how="left")
        out["estimate"] = out["_primary"].where(out["_primary"].notna(), out["estimate"])
        out["p_bootstrap"] = out["_p"]
        out = out.drop(columns=["_primary", "_p"])
    return out
