"""Effects beyond the leak: what an intervention does to the leak and costs clean models
(the paper's F2, F4), the protocol effect (H1, H2) and the diversity contrast."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from .bootstrap import DEFAULT_INTERVAL, Cells, check_interval, degenerate_reason, estimate_row, finish_rows, paired_support
from .errors import StatsWarning
from .factorial import LEAK_COLUMNS, factorial_rows, leak_rows, no_factorial_rows, prepare_factorial
from .predictions import check_predictions, check_unique

__all__ = ["INTERVENTION_COLUMNS", "PROTOCOL_COLUMNS", "diversity_effect", "diversity_rows", "h3_rows",
           "intervention_effect", "intervention_table", "protocol_effect", "recipe_rows"]

INTERVENTION_COLUMNS = LEAK_COLUMNS[:5] + ["baseline"] + LEAK_COLUMNS[5:] + ["cost_exceeds_leak"]


def intervention_effect(predictions: pd.DataFrame, *, baseline: str = "none", n_boot: int = 10_000,
                        level: float = 0.95, seed: int = 0, pooled: bool = True,
                        interval: str = DEFAULT_INTERVAL) -> pd.DataFrame:
    """What each intervention does to the leak, and what it costs clean models.

    Per condition x arch (and pooled) x diversity x intervention other than `baseline`, three
    estimands, all from the same draws as the leak effect (the differences are paired):

    - ``leak_cut``: leak effect under `baseline` minus leak effect under the intervention
      (positive: the intervention removes part of the leak; the paper's F2 and F4, e.g. color
      transfer cut the leak from 1.72 to 0.46 pp, F2 = 1.27 pp);
    - ``share_removed``: leak_cut / leak effect under `baseline` (the interval of the
      `interval` method applied to the ratio's resamples; no p-value: a ratio near a zero
      denominator is no test);
    - ``clean_cost``: clean-model accuracy under `baseline` minus under the intervention
      (positive: the intervention costs accuracy). `cost_exceeds_leak` is True where this cost
      is larger than the leak effect under `baseline`: such an intervention damages the crops
      more than the leak is worth, and a cut of the leak says little.

    Args:
        predictions: the sweep's predictions table.
        baseline: the intervention name of the unaltered crops.
        n_boot, level, seed, pooled, interval: as in `leak_effect`.

    Returns:
        Tidy rows: estimand, condition, arch, diversity, intervention, baseline, estimate,
        ci_low, ci_high, se, p_value, n_seeds, n_parents, n_crops, n_boot, reason,
        interval_method, cost_exceeds_leak.
    """
    return intervention_table(prepare_factorial(predictions, n_boot, seed, interval), baseline=baseline, level=level,
                              pooled=pooled, interval=interval)


def intervention_table(prepared, *, baseline: str = "none", level: float = 0.95, pooled: bool = True,
                       interval: str = DEFAULT_INTERVAL) -> pd.DataFrame:
    """`intervention_effect`'s rows from draws made once (`prepare_factorial`, with the same
    `interval`), which `estimates` shares with `leak_table`."""
    pred, (boots, missing) = prepared
    rows = []
    for condition, (cells, point, reps, archs) in boots.items():
        _, leak = leak_rows(cells, condition, archs, level, reps, point, pooled, interval=interval)
        inters = sorted(set(cells.table["intervention"]) - {baseline})
        if baseline not in set(cells.table["intervention"]):
            rows += [dict(estimand="leak_cut", condition=condition, arch="", diversity="", intervention=inter,
                          baseline=baseline, estimate=np.nan, n_seeds=0, n_parents=0, n_crops=0, n_boot=0,
                          reason=f"no prediction under the baseline intervention {baseline!r}") for inter in inters]
            continue
        draws = (cells, point, reps, leak, interval)
        archs = list(archs) + (["pooled"] if pooled and len(archs) > 1 else [])
        for div in sorted(set(cells.table["diversity"])):
            for inter in inters:
                rows += _setting_rows(draws, condition, archs, div, inter, baseline, level)
    rows += [{**r, "baseline": baseline} for r in no_factorial_rows(pred, missing, "leak_cut")]
    return finish_rows(rows, INTERVENTION_COLUMNS)


def _setting_rows(draws, condition, archs, div, inter, baseline, level) -> list[dict]:
    """leak_cut, share_removed and clean_cost of one intervention setting and diversity level,
    per architecture and then pooled (the mean of the architectures' clean costs)."""
    cells, point, reps, leak, interval = draws
    rows, clean_pool = [], []
    for arch in archs:
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
            size = paired_support(cells, [kb, ki])
            clean_pool.append((cost, cost_rep, size[2]))
        key = dict(condition=condition, arch=arch, diversity=div, intervention=inter, baseline=baseline,
                   n_seeds=min(base[2][0], alt[2][0]), n_parents=min(base[2][1], alt[2][1]),
                   n_crops=min(base[2][2], alt[2][2]))
        rows += _cut_rows(base, alt, (cost, cost_rep, size), key, level, interval)
    return rows


def _cut_rows(base, alt, clean, key: dict, level: float, interval: str) -> list[dict]:
    """The three rows of one setting and architecture: the leak cut (leak under the baseline
    minus under the intervention), the share of the leak it removes, and the clean cost."""
    cost, cost_rep, size = clean
    reason = degenerate_reason(key["n_seeds"], key["n_parents"])
    cut = base[0] - alt[0]
    cut_rep = base[1] - alt[1] if base[1] is not None else None
    exceeds = bool(cost > base[0])
    rows = [estimate_row(cut, cut_rep, level, reason, interval, estimand="leak_cut", cost_exceeds_leak=exceeds, **key)]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = cut / base[0] if base[0] != 0 else np.nan
        share_rep = cut_rep / base[1] if cut_rep is not None else None
    srow = estimate_row(share, share_rep, level, reason, interval, estimand="share_removed", cost_exceeds_leak=exceeds, **key)
    srow["p_value"] = np.nan
    rows.append(srow)
    ckey = {**key, "n_seeds": size[0], "n_parents": size[1], "n_crops": size[2]}
    rows.append(estimate_row(cost, cost_rep, level, degenerate_reason(size[0], size[1]), interval, estimand="clean_cost",
                             cost_exceeds_leak=exceeds, **ckey))
    return rows


# --- protocol effect -------------------------------------------------------------------------------

PROTOCOL_COLUMNS = LEAK_COLUMNS


def protocol_effect(predictions: pd.DataFrame, *, p1: str = "crop", p2: str = "parent", intervention: str = "none",
                    n_boot: int = 10_000, level: float = 0.95, seed: int = 0, pooled: bool = True,
                    interval: str = DEFAULT_INTERVAL) -> pd.DataFrame:
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
    within each protocol). `interval` as in `leak_effect` ("cgm": the three one-way
    bootstraps of that draw; "pigeonhole": one two-way draw).

    Returns:
        Rows as in `leak_effect`, estimand 'protocol', intervention the one scored; n_seeds
        counts seeds with both protocols, n_parents the parents scored under either, n_crops the
        (seed, crop) pairs of both. A condition lacking one protocol gets a NaN row with reason.
    """
    check_interval(interval)
    pred = check_predictions(predictions)
    check_unique(pred)
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
        cells = Cells(sub, ["arch", "protocol"])
        point = cells.point()
        reps = cells.boot(n_boot, np.random.default_rng(seed), interval=interval) if n_boot > 0 else None
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
            rows.append(estimate_row(est, rep, level, degenerate_reason(ns, npar), interval,
                             estimand="protocol", condition=condition, arch=arch, diversity="",
                             intervention=intervention, n_seeds=ns, n_parents=npar, n_crops=ncrop))
        if pooled and len(per) > 1:
            est = float(np.mean([p[0] for p in per]))
            rep = np.mean([p[1] for p in per], axis=0) if reps is not None else None
            ns, npar = max(p[2] for p in per), max(p[3] for p in per)
            rows.append(estimate_row(est, rep, level, degenerate_reason(ns, npar), interval,
                             estimand="protocol", condition=condition, arch="pooled", diversity="",
                             intervention=intervention, n_seeds=ns, n_parents=npar, n_crops=sum(p[4] for p in per)))
    return finish_rows(rows, PROTOCOL_COLUMNS)



def diversity_effect(pred, baseline, n_boot, level, seed, interval: str = DEFAULT_INTERVAL):
    """Clean-high minus clean-low accuracy per condition x arch (and pooled), from clean models.

    The paper's diversity contrast: the two-way bootstrap of `leak_effect` over the clean
    models' high- and low-diversity cells of each condition (conditions lacking one are
    skipped); ``arch="pooled"`` is the unweighted mean over architectures.

    Args:
        pred: checked predictions (`check_predictions`).
        baseline: the intervention of the unaltered crops (the rows read).
        n_boot, level, seed, interval: as in `leak_effect`.

    Returns:
        Rows as in `leak_effect` plus ``family`` (``diversity:<condition>``), estimand
        'diversity', diversity 'high-low'.
    """
    check_interval(interval)
    rows = []
    clean = pred[(pred["exposure"] == "clean") & (pred["intervention"] == baseline)]
    for condition, sub in clean.groupby("condition", sort=True):
        if not {"high", "low"} <= set(sub["diversity"].unique()):
            continue
        sub = sub[sub["diversity"].isin(["high", "low"])]
        cells = Cells(sub, ["arch", "diversity"])
        point = cells.point()
        reps = cells.boot(n_boot, np.random.default_rng(seed), interval=interval) if n_boot > 0 else None
        per = []
        for arch in sorted(sub["arch"].unique()):
            kh, kl = cells.index.get((arch, "high")), cells.index.get((arch, "low"))
            if kh is None or kl is None:
                continue
            ns, npar, ncrop = paired_support(cells, [kh, kl])
            est, rep = point[kh] - point[kl], (reps[:, kh] - reps[:, kl]) if reps is not None else None
            per.append((est, rep, ns, npar, ncrop))
            rows.append(estimate_row(est, rep, level, degenerate_reason(ns, npar), interval,
                             estimand="diversity", family=f"diversity:{condition}", condition=condition, arch=arch,
                             diversity="high-low", intervention=baseline, n_seeds=ns, n_parents=npar, n_crops=ncrop))
        if len(per) > 1:
            est = float(np.mean([p[0] for p in per]))
            rep = np.mean([p[1] for p in per], axis=0) if reps is not None else None
            ns, npar = max(p[2] for p in per), max(p[3] for p in per)
            rows.append(estimate_row(est, rep, level, degenerate_reason(ns, npar), interval,
                             estimand="diversity", family=f"diversity:{condition}", condition=condition,
                             arch="pooled", diversity="high-low", intervention=baseline, n_seeds=ns, n_parents=npar,
                             n_crops=sum(p[4] for p in per)))
    return finish_rows(rows, ["family"] + LEAK_COLUMNS)


# --- the paper's H3 as one test, and the retrained recipes (F3, F4) -----------------------------------

def _arch_pooled(effects: dict, archs, div, inter):
    """The leak (estimate, replicates, size) of one diversity level and intervention pooled over
    architectures (`leak_rows`' ``pooled`` entry, or the only architecture's); None if absent."""
    if ("pooled", div, inter) in effects:
        return effects[("pooled", div, inter)]
    present = [effects[(a, div, inter)] for a in archs if (a, div, inter) in effects]
    return present[0] if len(present) == 1 else None


def _combine(parts, weights) -> tuple:
    """sum_i w_i * part_i of (estimate, replicates or None, size) triples, with the size of the
    combination: the fewest seeds and parents of any part, the crops of all parts."""
    est = float(sum(w * p[0] for p, w in zip(parts, weights)))
    rep = None if parts[0][1] is None else sum(w * p[1] for p, w in zip(parts, weights))
    size = (min(p[2][0] for p in parts), min(p[2][1] for p in parts), int(sum(p[2][2] for p in parts)))
    return est, rep, size


def _pooled_row(combo, level: float, interval: str = DEFAULT_INTERVAL, **key) -> dict:
    """One `estimate_row` of a combination from `_combine`, with its degenerate reason
    (`interval`: the method its replicates were drawn for)."""
    est, rep, (ns, npar, ncrop) = combo
    return estimate_row(est, rep, level, degenerate_reason(ns, npar), interval, n_seeds=ns, n_parents=npar,
                        n_crops=ncrop, **key)


def h3_rows(prepared, *, baseline: str = "none", level: float = 0.95, interval: str = DEFAULT_INTERVAL) -> pd.DataFrame:
    """The paper's H3 as one test per condition, and what the paper reports beside it.

    From the factorial's draws (`prepare_factorial`: every cell of a condition resampled under
    the same seed and parent draws, so all differences are paired), on the `baseline`
    intervention, per condition:

    - ``leak_pooled``: the leak effect (leak minus clean accuracy) pooled over architectures
      and diversity levels: the unweighted mean over diversity levels of the mean over
      architectures, i.e. the main effect of leak with the +-1/2 coding of the paper's mixed
      model (H3: 1.73 pp). Only with two or more diversity levels: with one, the ``leak``
      row pooled over architectures is already that number;
    - ``leak_x_diversity``: the leak effect at high minus at low diversity, pooled over
      architectures (the paper: -0.20 pp, p = 0.60); only with both levels;
    - ``leak_cut_pooled``: per intervention other than `baseline`, the leak under `baseline`
      minus the leak under the intervention, pooled over architectures and diversity levels
      (the paper's F2, color transfer: 1.27 pp); likewise only with two or more levels.

    The diversity effect within clean cells is the ``diversity`` estimand (`diversity_rows`).

    Args:
        prepared: `prepare_factorial`'s (predictions, draws).
        baseline: the intervention of the unaltered crops.
        level: interval coverage.
        interval: the method `prepared` was drawn for (`prepare_factorial`).

    Returns:
        Rows of `LEAK_COLUMNS`: arch 'pooled', diversity 'pooled' ('high-low' for the
        interaction), intervention the one scored (the cut's: the intervention).
    """
    _, (boots, _missing) = prepared
    rows = []
    for condition, (cells, point, reps, archs) in boots.items():
        effects = leak_rows(cells, condition, archs, level, reps, point, True, interval=interval)[1]
        divs = sorted(set(cells.table["diversity"]))
        key = dict(condition=condition, arch="pooled")
        base = [_arch_pooled(effects, archs, d, baseline) for d in divs]
        if len(base) < 2 or any(b is None for b in base):
            continue
        rows.append(_pooled_row(_combine(base, [1 / len(base)] * len(base)), level, interval, estimand="leak_pooled",
                                diversity="pooled", intervention=baseline, **key))
        if {"high", "low"} <= set(divs):
            hi, lo = base[divs.index("high")], base[divs.index("low")]
            rows.append(_pooled_row(_combine([hi, lo], [1, -1]), level, interval=interval, estimand="leak_x_diversity",
                                    diversity="high-low", intervention=baseline, **key))
        for inter in sorted(set(cells.table["intervention"]) - {baseline}):
            alt = [_arch_pooled(effects, archs, d, inter) for d in divs]
            if any(a is None for a in alt):
                continue
            w = [1 / len(divs)] * len(divs)
            rows.append(_pooled_row(_combine(base + alt, w + [-x for x in w]), level, interval=interval, estimand="leak_cut_pooled",
                                    diversity="pooled", intervention=inter, **key))
    return finish_rows(rows, LEAK_COLUMNS)


def diversity_rows(prepared, *, baseline: str = "none", level: float = 0.95,
                   interval: str = DEFAULT_INTERVAL) -> pd.DataFrame:
    """Clean-high minus clean-low accuracy from the factorial's draws (as `diversity_effect`,
    whose definition it keeps: clean models only, per architecture and pooled as the unweighted
    mean over architectures), so that it is paired with the leak and the interaction of
    `h3_rows` (the paper estimates diversity within clean cells: 0.00 pp).

    Args:
        prepared: `prepare_factorial`'s (predictions, draws).
        baseline, level, interval: as in `h3_rows`.

    Returns:
        Rows as `diversity_effect`'s (``family`` ``diversity:<condition>``).
    """
    _, (boots, _missing) = prepared
    rows = []
    for condition, (cells, point, reps, archs) in boots.items():
        per = []
        for arch in archs:
            kh, kl = cells.index.get((arch, "high", baseline, "clean")), cells.index.get((arch, "low", baseline, "clean"))
            if kh is None or kl is None:
                continue
            size = paired_support(cells, [kh, kl])
            per.append((point[kh] - point[kl], reps[:, kh] - reps[:, kl] if reps is not None else None, size))
            rows.append(_pooled_row(per[-1], level, interval=interval, estimand="diversity", family=f"diversity:{condition}",
                                    condition=condition, arch=arch, diversity="high-low", intervention=baseline))
        if len(per) > 1:
            rows.append(_pooled_row(_combine(per, [1 / len(per)] * len(per)), level, interval, estimand="diversity",
                                    family=f"diversity:{condition}", condition=condition, arch="pooled",
                                    diversity="high-low", intervention=baseline))
    return finish_rows(rows, ["family"] + LEAK_COLUMNS)


def _recipe_leak(cells: Cells, point, reps, recipe: str, archs, divs):
    """One recipe's leak pooled over architectures (per diversity level) and then diversity
    levels, as `_combine`'s triple; None where a level has no leak/clean pair."""
    per_div = []
    for div in divs:
        per_arch = []
        for arch in archs:
            kl, kc = cells.index.get((recipe, arch, div, "leak")), cells.index.get((recipe, arch, div, "clean"))
            if kl is not None and kc is not None:
                per_arch.append((point[kl] - point[kc], reps[:, kl] - reps[:, kc] if reps is not None else None,
                                 paired_support(cells, [kl, kc])))
        if not per_arch:
            return None
        per_div.append(_combine(per_arch, [1 / len(per_arch)] * len(per_arch)))
    return _combine(per_div, [1 / len(per_div)] * len(per_div))


def recipe_rows(pred: pd.DataFrame, *, baseline: str = "none", baseline_recipe: str | None = None, n_boot: int = 10_000,
                level: float = 0.95, seed: int = 0, interval: str = DEFAULT_INTERVAL) -> pd.DataFrame:
    """The leak of factorials retrained under other recipes (the paper's F3, F4), paired.

    The paper retrained the whole factorial with masked backgrounds (F3: the leak persisted,
    1.86 pp) and with strong HED colour jitter (F4: the leak cut, -0.23 pp). In a sweep such a
    factorial is another model entry of the same condition, told apart by the predictions'
    ``recipe`` column (the settings that vary between model entries, ``arch`` left out). Per
    condition with two or more recipes, on the `baseline` intervention, one two-way bootstrap
    over cells (recipe x arch x diversity x exposure): all recipes share the seed and parent
    draws (a seed fixes the split every recipe trains on), so the cut is paired.

    - ``recipe_leak``: each recipe's leak pooled over architectures and diversity levels (as
      `h3_rows`' ``leak_pooled``);
    - ``recipe_cut``: the leak under `baseline_recipe` minus the leak under each other recipe.

    Args:
        pred: checked predictions with a ``recipe`` column (arch left out).
        baseline: the intervention of the unaltered crops.
        baseline_recipe: the recipe the cuts are taken from (None: the first in sorted order,
            so '' -- the entry that sets none of the varying settings -- when there is one).
        n_boot, level, seed, interval: the bootstrap (`leak_effect`).

    Returns:
        Rows of `LEAK_COLUMNS` + ``recipe``; none for a condition with a single recipe.
    """
    with warnings.catch_warnings():     # crops left out of the pairing: the leak estimand already warned
        warnings.simplefilter("ignore", StatsWarning)
        fac = factorial_rows(pred)[0]
    fac = fac[fac["intervention"] == baseline]
    rows = []
    for condition, sub in fac.groupby("condition", sort=True):
        recipes = sorted(sub["recipe"].astype(str).unique())
        if len(recipes) < 2:
            continue
        base_recipe = recipes[0] if baseline_recipe is None else baseline_recipe
        cells = Cells(sub, ["recipe", "arch", "diversity", "exposure"])
        point = cells.point()
        reps = cells.boot(n_boot, np.random.default_rng(seed), interval=interval) if n_boot > 0 else None
        archs, divs = sorted(sub["arch"].unique()), sorted(sub["diversity"].unique())
        leaks = {r: _recipe_leak(cells, point, reps, r, archs, divs) for r in recipes}
        key = dict(condition=condition, arch="pooled", diversity="pooled", intervention=baseline)
        for r in recipes:
            if leaks[r] is not None:
                rows.append(_pooled_row(leaks[r], level, interval=interval, estimand="recipe_leak", recipe=r, **key))
            else:
                rows.append(dict(estimand="recipe_leak", recipe=r, **key, estimate=np.nan, n_seeds=0, n_parents=0,
                                 n_crops=0, n_boot=0, reason="no leak/clean pair of this recipe at every diversity level "
                                                             f"({', '.join(divs)}) of the condition"))
        for r in recipes:
            if r != base_recipe and leaks[r] is not None and leaks.get(base_recipe) is not None:
                rows.append(_pooled_row(_combine([leaks[base_recipe], leaks[r]], [1, -1]), level, interval=interval,
                                        estimand="recipe_cut", recipe=r, **key))
    return finish_rows(rows, LEAK_COLUMNS + ["recipe"])
