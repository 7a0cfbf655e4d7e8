"""Power of the leak test for a planned factorial: variance components of the leak effect,
the design simulated from them, power with its Monte Carlo error, and closed forms.

The paper sized its studies this way ("twelve architectures and twenty seeds gave a simulated
power of 0.977 for a 0.8-pp effect", reference 000, "One test per benchmark"): variance
components from a pilot, the planned design simulated from them, the registered test run on
each simulated data set.

The model, on the probability scale (fractions, not pp). In seed s, architecture a and test
parent p the leak effect (leak-model minus clean-model accuracy) has the mean

    m_sap = effect + u_s + v_p + w_sp + x_sa,

u_s ~ N(0, sd_seed^2) (the leak varies between seeds: a seed fixes the data and split, shared
by every architecture), v_p ~ N(0, sd_parent^2) (between test parents, shared by every seed
and architecture testing the parent), w_sp ~ N(0, sd_seed_parent^2) (the seed x parent
interaction), x_sa ~ N(0, sd_seed_arch^2) (between architectures within a seed). A crop's
difference D = correct_leak - correct_clean in {-1, 0, 1} has the mean m_sap and the variance
sd_crop^2 (the binomial part: about the share of crops on which the two models disagree).
`baseline` is the clean models' accuracy (it fixes the concordant crops; the leak tests do not
read it).

Functions: `LeakComponents` (the components, stated or estimated), `estimate_components` (from
a pilot's predictions, by moments), `Design`, `simulate_cells` (the design's per-cell counts),
`simulate_power` (the power table), `t_power` and `normal_power` (closed forms).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from .errors import StatsError, StatsWarning
from .predictions import check_predictions, check_unique

__all__ = ["COMPONENT_NAMES", "POWER_COLUMNS", "TESTS", "Design", "LeakComponents", "PowerError", "estimate_components",
           "normal_power", "parse_params", "simulate_cells", "simulate_power", "t_power", "two_way_se"]

#: the stated parameters, by name (`parse_params`, ``shortcutlab power --params``)
COMPONENT_NAMES = ("baseline", "sd_seed", "sd_parent", "sd_seed_parent", "sd_seed_arch", "sd_crop")
#: the tests `simulate_power` runs
TESTS = ("t", "bootstrap")
POWER_COLUMNS = ["test", "n_seeds", "n_archs", "n_parents", "crops_per_parent", "n_pool", "effect", "power", "mc_se", "n_sim",
                 "alpha", "closed_form", "normal_power"]


class PowerError(StatsError):
    """A power analysis got a parameter, a design or a pilot it cannot use."""


@dataclass(frozen=True)
class LeakComponents:
    """Variance components of the leak effect on the probability scale (see the module).

    Attributes:
        baseline: the clean models' accuracy, in (0, 1).
        sd_seed, sd_parent, sd_seed_parent, sd_seed_arch: SDs of the leak effect between
            seeds, test parents, seed x parent cells and architectures within a seed
            (fractions: 0.004 is 0.4 pp).
        sd_crop: SD of one crop's leak difference (correct_leak - correct_clean) within its
            cell, in [0, 1].
        pilot_effect: the pilot's pooled leak effect (NaN for stated parameters).
        notes: how each estimate was made or why it was set to 0.
    """

    baseline: float = 0.85
    sd_seed: float = 0.0
    sd_parent: float = 0.0
    sd_seed_parent: float = 0.0
    sd_seed_arch: float = 0.0
    sd_crop: float = 0.3
    pilot_effect: float = float("nan")
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in COMPONENT_NAMES:
            value = getattr(self, name)
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise PowerError(f"variance component {name!r} must be a number; got {value!r}") from None
            if not math.isfinite(value):
                raise PowerError(f"variance component {name!r} must be finite; got {value!r}")
            object.__setattr__(self, name, value)
        if not 0 < self.baseline < 1:
            raise PowerError(f"variance component 'baseline' is the clean models' accuracy, in (0, 1); got {self.baseline!r}")
        for name in COMPONENT_NAMES[1:]:
            if getattr(self, name) < 0:
                raise PowerError(f"variance component {name!r} is a standard deviation, >= 0; got {getattr(self, name)!r}")
        if self.sd_crop > 1:
            raise PowerError(f"variance component 'sd_crop' is the SD of a crop's leak difference (-1, 0 or 1), at most 1; "
                             f"got {self.sd_crop!r}")

    def as_dict(self) -> dict:
        """The components and notes as plain values (for components.json)."""
        d = asdict(self)
        d["notes"] = list(self.notes)
        if not math.isfinite(self.pilot_effect):
            d["pilot_effect"] = None          # JSON has no NaN
        return d


def parse_params(text: str) -> LeakComponents:
    """Stated components from ``"sd_seed=0.004,sd_crop=0.35,..."`` (names in `COMPONENT_NAMES`;
    those not given keep `LeakComponents`' defaults).

    Raises:
        PowerError: a part without '=', an unknown name (listing the known ones), a repeated
            name or a value that is not a number in range.
    """
    values: dict[str, float] = {}
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq:
            raise PowerError(f"--params part {part!r} is not name=value (in {text!r}); names: {', '.join(COMPONENT_NAMES)}")
        if key not in COMPONENT_NAMES:
            raise PowerError(f"--params name {key!r} is unknown (in {text!r}); expected one of {', '.join(COMPONENT_NAMES)}")
        if key in values:
            raise PowerError(f"--params gives {key!r} twice (in {text!r})")
        try:
            values[key] = float(value)
        except ValueError:
            raise PowerError(f"--params {key}={value.strip()!r} is not a number (in {text!r})") from None
    return LeakComponents(**values)


@dataclass(frozen=True)
class Design:
    """A planned factorial: seeds (each a leak and a clean model per architecture), architectures,
    test parents per seed and crops per parent. Each seed tests `n_parents` parents drawn from
    a pool of `n_pool` (default `n_parents`: the same parents in every seed, a crossed design;
    a larger pool: each seed its own random test parents, as the factorial split draws them)."""

    n_seeds: int
    n_archs: int
    n_parents: int
    crops_per_parent: int
    n_pool: int | None = None

    def __post_init__(self) -> None:
        if self.n_pool is None:
            object.__setattr__(self, "n_pool", self.n_parents)
        least = {"n_seeds": 2, "n_archs": 1, "n_parents": 2, "crops_per_parent": 1, "n_pool": self.n_parents}
        for name, low in least.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                why = " (no test has a seed-level variance with one seed)" if name == "n_seeds" else ""
                raise PowerError(f"design {name} must be an integer >= {low}{why}; got {value!r}")
            object.__setattr__(self, name, int(value))


# ------------------------------------------------------------------------------- simulation
def simulate_cells(comp: LeakComponents, design: Design, effect: float, n_sim: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """Draw `n_sim` data sets of `design` and count, per (seed, arch, parent) cell, the crops
    the leak model gets right and the clean one wrong (n_plus) and the reverse (n_minus).

    A crop's difference D is drawn with P(D = 1) = (q + m)/2, P(D = -1) = (q - m)/2 and
    q = sd_crop^2 + m^2, so that D has the cell's mean m and the variance sd_crop^2 exactly
    (where m is so large that a probability leaves [0, 1] it is clipped, and counted).

    Returns:
        (n_plus, n_minus, n_clipped, parents): int arrays (n_sim, n_seeds, n_archs, n_parents),
        the number of cells whose probabilities were clipped, and (n_sim, n_seeds, n_parents)
        the pool index of each seed's test parents.
    """
    S, A, P, C = design.n_seeds, design.n_archs, design.n_parents, design.crops_per_parent
    v = rng.normal(0, comp.sd_parent, (n_sim, design.n_pool))
    if design.n_pool > P:
        parents = np.sort(np.argsort(rng.random((n_sim, S, design.n_pool)), axis=2)[:, :, :P], axis=2)
    else:
        parents = np.broadcast_to(np.arange(P), (n_sim, S, P))
    v_tested = np.take_along_axis(v[:, None, :], parents, axis=2)[:, :, None, :]      # (n_sim, S, 1, P)
    m = (effect + rng.normal(0, comp.sd_seed, (n_sim, S, 1, 1)) + v_tested
         + rng.normal(0, comp.sd_seed_parent, (n_sim, S, 1, P)) + rng.normal(0, comp.sd_seed_arch, (n_sim, S, A, 1)))
    m = np.broadcast_to(m, (n_sim, S, A, P))
    q = comp.sd_crop ** 2 + m ** 2
    p_plus, p_minus = (q + m) / 2, (q - m) / 2
    bad = (p_plus < 0) | (p_minus < 0) | (p_plus + p_minus > 1)
    p_plus = np.clip(p_plus, 0, 1)
    p_minus = np.clip(np.minimum(p_minus, 1 - p_plus), 0, 1)
    n_plus = rng.binomial(C, p_plus)
    rest = np.where(p_plus < 1, p_minus / np.where(p_plus < 1, 1 - p_plus, 1), 0.0)
    n_minus = rng.binomial(C - n_plus, np.clip(rest, 0, 1))
    return n_plus, n_minus, int(bad.sum()), parents


def paired_t_reject(n_plus: np.ndarray, n_minus: np.ndarray, n_crops: int, alpha: float) -> np.ndarray:
    """Two-sided paired t test on the per-seed leak effects (pooled over architectures and crops):
    (n_sim,) booleans. A data set whose seeds all agree exactly (SD 0) is not rejected."""
    from scipy import stats

    d = (n_plus - n_minus).sum(axis=(2, 3)) / n_crops              # (n_sim, S)
    S = d.shape[1]
    sd = d.std(axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = d.mean(axis=1) / (sd / math.sqrt(S))
    p = 2 * stats.t.sf(np.abs(t), S - 1)
    return np.isfinite(p) & (p < alpha)


def predictions_frame(n_plus: np.ndarray, n_minus: np.ndarray, parents: np.ndarray, comp: LeakComponents,
                      crops_per_parent: int, rng: np.random.Generator) -> pd.DataFrame:
    """One simulated data set's counts (S, A, P) as a predictions table of one factorial cell
    (condition 'power', diversity 'high', intervention 'none'; `parents` (S, P): the pool index
    of each seed's test parents, which names them): in each cell the first n_plus
    crops right for the leak model only, the next n_minus right for the clean model only, the
    rest right for both with probability (baseline - P(D = -1)) / P(D = 0), else wrong for both."""
    S, A, P = n_plus.shape
    C = crops_per_parent
    k = np.arange(C)
    plus = k[None, None, None, :] < n_plus[..., None]                          # (S, A, P, C)
    minus = ~plus & (k[None, None, None, :] < (n_plus + n_minus)[..., None])
    tie = ~plus & ~minus
    discordant = (n_plus + n_minus).sum() / n_plus.size / C
    both = max(0.0, min(1.0, (comp.baseline - n_minus.sum() / n_plus.size / C) / max(1e-12, 1 - discordant)))
    both_right = tie & (rng.random(tie.shape) < both)
    leak_ok, clean_ok = plus | both_right, minus | both_right
    seed, arch, slot, crop = (a.ravel() for a in np.meshgrid(np.arange(S), np.arange(A), np.arange(P), k, indexing="ij"))
    parent = parents[seed, slot]
    pool = int(parents.max()) + 1
    n = seed.size
    cat = pd.Categorical.from_codes
    archs = [f"a{i}" for i in range(A)]
    frames = []
    for e, ok in ((1, leak_ok), (0, clean_ok)):
        frames.append(pd.DataFrame({
            "model": cat((arch * 2 + e) * S + seed, [f"a{a}-{x}-{s}" for a in range(A) for x in ("clean", "leak")
                                                    for s in range(S)]),
            "condition": "power", "arch": cat(arch, archs), "seed": seed, "protocol": "factorial",
            "exposure": cat(np.full(n, e), ["clean", "leak"]), "diversity": "high", "intervention": "none",
            "id": cat(parent * C + crop, [f"c{i}" for i in range(pool * C)]),
            "parent": cat(parent, [f"p{j}" for j in range(pool)]),
            "correct": ok.ravel()}))
    return pd.concat(frames, ignore_index=True)


def bootstrap_reject(n_plus, n_minus, parents, comp, design: Design, alpha: float, n_boot: int, rng) -> np.ndarray:
    """The registered primary test on each simulated data set: `leak_effect`'s two-way cluster
    bootstrap p-value of the pooled row (the one architecture's row with one), below alpha."""
    from .factorial import leak_effect

    out = np.zeros(len(n_plus), dtype=bool)
    for i in range(len(n_plus)):
        frame = predictions_frame(n_plus[i], n_minus[i], parents[i], comp, design.crops_per_parent, rng)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StatsWarning)
            rows = leak_effect(frame, n_boot=n_boot, seed=int(rng.integers(2 ** 31)))
        row = rows[rows["arch"] == ("pooled" if design.n_archs > 1 else "a0")].iloc[0]
        out[i] = bool(np.isfinite(row["p_value"]) and row["p_value"] < alpha)
    return out


def _check_power_args(test: str, n_sim: int, alpha: float, n_boot: int, effects: Sequence[float]) -> None:
    if test not in TESTS:
        raise PowerError(f"test {test!r} is unknown; expected one of {', '.join(TESTS)}")
    if isinstance(n_sim, bool) or not isinstance(n_sim, (int, np.integer)) or n_sim < 1:
        raise PowerError(f"n_sim (simulated data sets per design and effect) must be an integer >= 1; got {n_sim!r}")
    if not 0 < alpha < 1:
        raise PowerError(f"alpha must be in (0, 1); got {alpha!r}")
    if test == "bootstrap" and (isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 19):
        raise PowerError(f"n_boot must be an integer >= 19 for a bootstrap p-value below 0.1; got {n_boot!r}")
    for effect in effects:
        if not (isinstance(effect, (int, float, np.floating, np.integer)) and -1 < float(effect) < 1):
            raise PowerError(f"effect {effect!r} is not a leak effect; expected a fraction in (-1, 1) (0.008 is 0.8 pp)")


def simulate_power(comp: LeakComponents, designs: Iterable[Design], effects: Sequence[float], *, test: str = "t",
                   n_sim: int = 500, alpha: float = 0.05, n_boot: int = 200, seed: int = 0,
                   chunk: int = 50) -> pd.DataFrame:
    """Power of the leak test for each design and effect, by simulation.

    Each of `n_sim` data sets is drawn from the components (`simulate_cells`) with the target
    effect, and the test is run at `alpha`; power is the share rejected, with its Monte Carlo
    standard error sqrt(power (1 - power) / n_sim).

    The tests:

    - ``"t"`` (the default): the two-sided paired t on the per-seed leak effects (pooled over
      architectures), S - 1 degrees of freedom: the sensitivity analysis the paper names
      (Satterthwaite and Kenward-Roger give S - 1 in this balanced design). It is the default
      because it costs microseconds per data set, so 500 data sets of every design run in
      seconds; it treats the test parents as fixed, so where the leak varies between parents
      (sd_parent > 0) it rejects more often than alpha at effect 0 (the `closed_form` column
      says by how much).
    - ``"bootstrap"``: the registered primary test, `leak_effect`'s two-way cluster bootstrap
      (seeds and parents resampled) with `n_boot` resamples, on a predictions table built from
      each data set: about 0.1-1 s per data set, so use it to confirm a design chosen with the
      t test, with fewer data sets.

    Args:
        comp: the variance components.
        designs: the designs to simulate.
        effects: target leak effects (fractions: 0.008 is 0.8 pp).
        test: ``"t"`` or ``"bootstrap"``.
        n_sim: data sets per design and effect.
        alpha: the test's level.
        n_boot: bootstrap resamples (``test="bootstrap"`` only).
        seed: seed of the simulation; each (design, effect) gets its own stream.
        chunk: data sets drawn at once at most (fewer where a data set has over 40,000 cells).

    Returns:
        One row per design x effect (`POWER_COLUMNS`): test, the design, effect, power, mc_se,
        n_sim, alpha, closed_form (`t_power` for the t test, NaN for the bootstrap) and
        normal_power (`normal_power` with the estimator's true two-way SE: what a test with
        exactly calibrated intervals reaches).
    """
    effects = list(effects)
    _check_power_args(test, n_sim, alpha, n_boot, effects)
    rows, clipped = [], 0
    designs = list(designs)
    for i, design in enumerate(designs):
        # about 2 million cells at once at most (a dozen float arrays of them are alive)
        step = max(1, min(chunk, 2_000_000 // (design.n_seeds * design.n_archs * design.n_parents)))
        for j, effect in enumerate(effects):
            rng = np.random.default_rng([seed, i, j])
            hits = 0
            for start in range(0, n_sim, step):
                n_plus, n_minus, bad, parents = simulate_cells(comp, design, float(effect), min(step, n_sim - start), rng)
                clipped += bad
                if test == "t":
                    n_crops = design.n_archs * design.n_parents * design.crops_per_parent
                    hits += int(paired_t_reject(n_plus, n_minus, n_crops, alpha).sum())
                else:
                    hits += int(bootstrap_reject(n_plus, n_minus, parents, comp, design, alpha, n_boot, rng).sum())
            power = hits / n_sim
            rows.append(dict(test=test, **asdict(design), effect=float(effect), power=power,
                             mc_se=math.sqrt(power * (1 - power) / n_sim), n_sim=n_sim, alpha=alpha,
                             closed_form=t_power(comp, design, float(effect), alpha) if test == "t" else np.nan,
                             normal_power=normal_power(float(effect), two_way_se(comp, design), alpha)))
    if clipped:
        warnings.warn(f"power: {clipped} simulated cells had a mean leak effect too large for sd_crop "
                      f"{comp.sd_crop:g} (a probability outside [0, 1]) and were clipped; their crop variance is "
                      f"below sd_crop^2 and the power approximate (the model is for leaks of a few pp; a pilot whose "
                      f"crops of a parent are all right or all wrong together gives cells near +-1)",
                      StatsWarning, stacklevel=2)
    return pd.DataFrame(rows, columns=POWER_COLUMNS)


# ------------------------------------------------------------------------------- closed forms
def normal_power(effect: float, se: float, alpha: float = 0.05) -> float:
    """Power of a two-sided z test of an estimate ~ N(effect, se^2) at level alpha:
    Phi(effect/se - z) + Phi(-effect/se - z), z the 1 - alpha/2 normal quantile."""
    from scipy import stats

    if not se > 0:
        return float("nan")
    z = stats.norm.isf(alpha / 2)
    return float(stats.norm.cdf(effect / se - z) + stats.norm.cdf(-effect / se - z))


def two_way_se(comp: LeakComponents, design: Design) -> float:
    """The true standard error of the pooled leak estimate (the mean over every seed, architecture
    and crop) under the components: sqrt(sd_seed^2/S + sd_parent^2 (1 - f + S f)/(S P)
    + sd_seed_parent^2/(S P) + sd_seed_arch^2/(S A) + sd_crop^2/(S A P C)), f = P / n_pool the
    share of the pool each seed tests (a parent is tested by Binomial(S, f) seeds; f = 1, the
    crossed design: sd_parent^2 / P)."""
    S, A, P, C = design.n_seeds, design.n_archs, design.n_parents, design.crops_per_parent
    f = P / design.n_pool
    return math.sqrt(comp.sd_seed ** 2 / S + comp.sd_parent ** 2 * (1 - f + S * f) / (S * P)
                     + comp.sd_seed_parent ** 2 / (S * P)
                     + comp.sd_seed_arch ** 2 / (S * A) + comp.sd_crop ** 2 / (S * A * P * C))


def t_power(comp: LeakComponents, design: Design, effect: float, alpha: float = 0.05, n_nodes: int = 64) -> float:
    """Power of the two-sided paired t on per-seed leak effects, by the noncentral t.

    A seed's leak effect (the mean over its A architectures, P parents and C crops per parent)
    is, given the parents' shared mean vbar ~ N(0, sd_parent^2 / P), about normal with the mean
    effect + vbar and the variance tau^2 = sd_seed^2 + sd_seed_parent^2/P + sd_seed_arch^2/A +
    sd_crop^2/(A P C), independently between seeds; the t statistic is then noncentral t with
    S - 1 degrees of freedom and noncentrality (effect + vbar) sqrt(S) / tau, and the power is
    its two-sided rejection probability averaged over vbar (Gauss-Hermite quadrature). With
    sd_parent = 0 it is the textbook noncentral-t power. For a design whose seeds draw their
    parents from a larger pool the seeds share some parents and are not independent: NaN,
    unless sd_parent = 0.
    """
    from scipy import stats

    S, A, P, C = design.n_seeds, design.n_archs, design.n_parents, design.crops_per_parent
    tau = math.sqrt(comp.sd_seed ** 2 + comp.sd_seed_parent ** 2 / P + comp.sd_seed_arch ** 2 / A
                    + comp.sd_crop ** 2 / (A * P * C))
    if not tau > 0 or (design.n_pool > P and comp.sd_parent > 0):
        return float("nan")
    crit = stats.t.isf(alpha / 2, S - 1)
    nodes, weights = np.polynomial.hermite_e.hermegauss(n_nodes)
    weights = weights / weights.sum()
    shift = effect + comp.sd_parent / math.sqrt(P) * nodes if comp.sd_parent > 0 else np.array([effect])
    weights = weights if comp.sd_parent > 0 else np.array([1.0])
    nc = shift * math.sqrt(S) / tau
    # both tails as upper tails: scipy's nct.cdf returns NaN far in the lower tail, its sf does not
    power = stats.nct.sf(crit, S - 1, nc) + stats.nct.sf(crit, S - 1, -nc)
    return float(np.sum(weights * power))


# ------------------------------------------------------------------------------- from a pilot
def estimate_components(predictions: pd.DataFrame, *, condition: str | None = None,
                        baseline: str = "none") -> LeakComponents:
    """Variance components of the leak effect from a pilot's factorial predictions, by moments.

    Method: U-statistics of pairwise squared differences for crossed random effects (Gao and
    Owen 2017, "Efficient moment calculations for variance components in large unbalanced
    crossed random effects models"), chosen over MixedLM because they are unbiased in the
    unbalanced designs a sweep makes (each seed draws its own test parents, which overlap
    partly between seeds), closed-form, and take milliseconds. Per diversity level:

    1. the crop component sd_crop^2: the pooled within-cell variance of a crop's leak
       difference D (cell = seed x arch x parent);
    2. within each architecture (so its own mean cancels), over pairs of cell means y with the
       crop noise sd_crop^2 (1/n_i + 1/n_j)/2 taken off half their squared difference:
       pairs in one seed, other parents: g1 = sd_parent^2 + sd_seed_parent^2; one parent,
       other seeds: g2 = sd_seed^2 + sd_seed_arch^2 + sd_seed_parent^2; neither: g3 = all four;
       so sd_parent^2 = g3 - g2, sd_seed_parent^2 = g1 + g2 - g3;
    3. sd_seed_arch^2: half the variance between seeds of each architecture pair's mean
       difference over the seed's parents, less its crop noise, averaged over pairs; then
       sd_seed^2 = g3 - g1 - sd_seed_arch^2.

    Variances are averaged over diversity levels; a negative one is set to 0 (noted). Where no
    parent is tested in two seeds the parent and seed x parent parts cannot be told apart: both
    go to sd_parent (which lowers power most: conservative), noted; with one architecture
    sd_seed_arch is part of sd_seed.

    Args:
        predictions: the pilot sweep's predictions table.
        condition: the factorial condition (needed when there are several).
        baseline: the intervention of the unaltered crops.

    Returns:
        `LeakComponents` with baseline (the clean models' accuracy), pilot_effect (the mean
        crop leak difference) and notes.

    Raises:
        PowerError: no factorial rows, an unknown or unchosen condition, fewer than 2 seeds or
            2 parents in a diversity level.
    """
    d, condition = _crop_differences(predictions, condition, baseline)
    notes: list[str] = []
    per_level = [_level_variances(sub, condition, div, notes) for div, sub in d.groupby("diversity", sort=True)]
    var = {k: float(np.mean([v[k] for v in per_level])) for k in per_level[0]}
    if len(per_level) > 1:
        notes.append(f"variances averaged over {len(per_level)} diversity levels")
    for k in ("sd_seed", "sd_parent", "sd_seed_parent", "sd_seed_arch"):
        if var[k] < 0:
            notes.append(f"{k}: the moment estimate of its variance was {var[k]:.3g} < 0, set to 0")
    sds = {k: math.sqrt(max(0.0, v)) for k, v in var.items()}
    return LeakComponents(baseline=float(d["clean"].mean()), sd_crop=min(1.0, sds.pop("sd_crop")), **sds,
                          pilot_effect=float(d["D"].mean()), notes=tuple(dict.fromkeys(notes)))


def _crop_differences(predictions, condition, baseline) -> tuple[pd.DataFrame, str]:
    """The pilot's crops scored by both models of a seed's pair: diversity, seed, arch, parent,
    clean (0/1) and D = leak - clean, for one condition under `baseline`."""
    pred = check_predictions(predictions)
    check_unique(pred)
    fac = pred[pred["exposure"].isin(["leak", "clean"]).to_numpy() & (pred["intervention"] == baseline).to_numpy()]
    if fac.empty:
        raise PowerError(f"the pilot holds no factorial prediction (exposure 'leak' or 'clean') under intervention "
                         f"{baseline!r}; a pilot for power is a sweep with a leak/clean factorial")
    conditions = sorted(map(str, fac["condition"].unique()))
    if condition is None and len(conditions) > 1:
        raise PowerError(f"the pilot has {len(conditions)} factorial conditions ({', '.join(conditions)}); choose one "
                         f"(--condition)")
    condition = conditions[0] if condition is None else str(condition)
    if condition not in conditions:
        raise PowerError(f"the pilot has no factorial condition {condition!r}; it has {', '.join(conditions)}")
    fac = fac[(fac["condition"] == condition).to_numpy()]
    keys = ["diversity", "seed", "arch", "parent", "id"]
    wide = fac.pivot_table(index=keys, columns="exposure", values="correct", aggfunc="first", observed=True)
    wide = wide.dropna().reset_index() if {"leak", "clean"} <= set(wide.columns) else wide.iloc[:0].reset_index()
    if wide.empty:
        raise PowerError(f"the pilot's condition {condition!r} has no crop scored by both a leak and a clean model of one "
                         f"seed and architecture")
    wide["D"] = wide["leak"] - wide["clean"]
    return wide[["diversity", "seed", "arch", "parent", "clean", "D"]], condition


def _pair_sums(cells: pd.DataFrame, keys: list[str], crop_var: float) -> tuple[float, float]:
    """Over pairs of cells sharing `keys`: the sum of (y_i - y_j)^2 / 2 less the crop noise
    crop_var (1/n_i + 1/n_j) / 2, and the number of pairs."""
    g = cells.groupby(keys, sort=False, observed=True).agg(k=("y", "size"), sy=("y", "sum"), syy=("yy", "sum"),
                                                           sinv=("inv", "sum"))
    k = g["k"].to_numpy(np.float64)
    ss = 0.5 * (k * g["syy"] - g["sy"] ** 2) - 0.5 * crop_var * (k - 1) * g["sinv"]
    return float(ss.sum()), float((k * (k - 1) / 2).sum())


def _level_variances(d: pd.DataFrame, condition, div, notes: list[str]) -> dict:
    """The variances of one diversity level (see `estimate_components`)."""
    where = f"the pilot's condition {condition!r}, diversity {div!r}"
    for what, col in (("seed(s)", "seed"), ("test parent(s)", "parent")):
        if d[col].nunique() < 2:
            raise PowerError(f"{where} has {d[col].nunique()} {what}; the variance components need at least 2")
    cells = d.groupby(["seed", "arch", "parent"], sort=False, observed=True)["D"].agg(["size", "sum", "var"]).reset_index()
    n = cells["size"].to_numpy(np.float64)
    within = np.nansum(cells["var"].to_numpy() * (n - 1))
    if (n > 1).any():
        crop_var = float(within / (n - 1).sum())
    else:
        crop_var = float(d["D"].var(ddof=1))
        notes.append("one crop per parent: sd_crop is the SD of all crop differences (it includes the cells' spread)")
    cells = cells.assign(y=cells["sum"] / n, inv=1.0 / n)
    cells["yy"] = cells["y"] ** 2
    all_ss, all_n = _pair_sums(cells, ["arch"], crop_var)
    s_ss, s_n = _pair_sums(cells, ["arch", "seed"], crop_var)
    p_ss, p_n = _pair_sums(cells, ["arch", "parent"], crop_var)
    if s_n == 0 or all_n - s_n - p_n <= 0:
        raise PowerError(f"{where} has no two cells of one architecture in one seed and other parents; the variance "
                         f"components need at least 2 test parents per seed")
    g1, g3 = s_ss / s_n, (all_ss - s_ss - p_ss) / (all_n - s_n - p_n)
    if p_n > 0:
        g2 = p_ss / p_n
        out = dict(sd_parent=g3 - g2, sd_seed_parent=g1 + g2 - g3)
    else:
        notes.append("no test parent is tested in two seeds: the parent and seed x parent parts cannot be told apart; "
                     "both are in sd_parent (conservative)")
        out = dict(sd_parent=g1, sd_seed_parent=0.0)
    seed_arch = _seed_arch_variance(cells, crop_var)
    if seed_arch is None:
        notes.append("one architecture (or one seed with several): sd_seed_arch is part of sd_seed")
        seed_arch = 0.0
    return dict(out, sd_seed=g3 - g1 - seed_arch, sd_seed_arch=seed_arch, sd_crop=crop_var)


def _seed_arch_variance(cells: pd.DataFrame, crop_var: float) -> float | None:
    """Half the between-seed variance of each architecture pair's mean difference over common
    parents, less its crop noise, averaged over pairs; None with one architecture or no pair
    seen in two seeds."""
    wide_y = cells.pivot_table(index=["seed", "parent"], columns="arch", values="y", observed=True)
    wide_inv = cells.pivot_table(index=["seed", "parent"], columns="arch", values="inv", observed=True)
    archs = list(wide_y.columns)
    seeds = wide_y.index.get_level_values("seed")
    out = []
    for i, a in enumerate(archs):
        for b in archs[i + 1:]:
            both = wide_y[a].notna() & wide_y[b].notna()
            both = both.to_numpy()
            by_seed = pd.DataFrame({"diff": (wide_y[a] - wide_y[b]).to_numpy()[both],
                                    "noise": (wide_inv[a] + wide_inv[b]).to_numpy()[both] * crop_var,
                                    "seed": seeds[both]}).groupby("seed")
            mean_diff = by_seed["diff"].mean()
            k = by_seed["diff"].size()
            if len(mean_diff) < 2:
                continue
            noise_var = (by_seed["noise"].sum() / k ** 2).mean()
            out.append(0.5 * (mean_diff.var(ddof=1) - noise_var))
    return float(np.mean(out)) if out else None
