"""The estimands of a sweep, registered with their unit and reading, and `estimates`, the one
table that holds them all.

An estimand is a function ``fn(ctx) -> rows`` registered with `register_estimand` under its
name, its unit (how a reading prints it: ``"pp"``, ``"share"``, see `shortcutlab.stats.units`)
and its reading (a sentence template or a function that reads one row). `estimates` runs every
registered estimand in registration order on one `EstimandContext` (the checked predictions,
the results, the bootstrap settings, the factorial's draws made once), concatenates their rows
and Holm-adjusts the p-values within families. Third-party estimands join through the
entry-point group ``shortcutlab.estimands`` (an entry point naming a module whose import
registers them).

Built-in estimands, in order: ``leak``, ``leak_pooled``, ``leak_x_diversity``,
``leak_cut_pooled``, ``recipe_leak``, ``recipe_cut``, ``diversity``, ``leak_cut``,
``share_removed``, ``clean_cost``, ``protocol``, ``slope`` (see `estimates`). The rows that test
one of the paper's registered hypotheses carry its label in ``hypothesis`` and are Holm-adjusted
in its registered family (`shortcutlab.stats.hypotheses`).

Example:
    >>> import pandas as pd
    >>> from shortcutlab.stats import estimates, register_estimand, simulate_factorial, unregister_estimand
    >>> @register_estimand("leak_accuracy", unit="share",
    ...                    reading="leak models score {estimate} on their test crops")
    ... def leak_accuracy(ctx):
    ...     leak = ctx.pred[(ctx.pred["exposure"] == "leak") & (ctx.pred["intervention"] == ctx.baseline)]
    ...     return pd.DataFrame({"condition": [c for c, _ in leak.groupby("condition")],
    ...                          "estimate": leak.groupby("condition")["correct"].mean().to_numpy()})
    >>> table = estimates(simulate_factorial(n_seeds=3, n_parents=10), n_boot=0)
    >>> "leak_accuracy" in set(table["estimand"])
    True
    >>> unregister_estimand("leak_accuracy")
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Mapping

import numpy as np
import pandas as pd

from shortcutlab.plugins import Registry

from .bootstrap import DEFAULT_INTERVAL, check_interval
from .dose import MIN_SLOPE_SEEDS, dose_points, dose_response, slope_interval_problem
from .effects import diversity_rows, h3_rows, intervention_table, protocol_effect, recipe_rows
from .errors import StatsError, StatsWarning
from .factorial import factorial_bootstrap, leak_table
from .hypotheses import assign_hypotheses
from .multiple import add_holm
from .predictions import check_predictions, check_unique
from .units import ci_pp, format_interval, format_value, is_nan, pp, pp_shown

__all__ = ["ENTRY_POINT_GROUP", "ESTIMATE_COLUMNS", "LEAK_STATUSES", "Estimand", "EstimandContext", "available_estimands",
           "estimand_units", "estimates", "get_estimand", "leak_status", "read_row", "register_estimand", "unregister_estimand"]

#: Columns of `estimates`' table, in order.
ESTIMATE_COLUMNS = ["hypothesis", "estimand", "family", "condition", "arch", "diversity", "intervention", "recipe", "estimate",
                    "ci_low", "ci_high", "se", "p_value", "p_holm", "reject", "n_seeds", "n_parents", "n_crops",
                    "n_boot", "reason", "interval_method"]

ENTRY_POINT_GROUP = "shortcutlab.estimands"


class Estimand:
    """One registered estimand (`register_estimand` makes the subclass from a function).

    Class attributes:
        name: the registry name, the value of the ``estimand`` column of its rows.
        unit: how its estimates are printed (`shortcutlab.stats.units`): ``"pp"`` for a
            difference of fractions, ``"share"`` for a ratio, or another unit's name.
        reading: how the report reads one row: a template for `str.format` with the row's
            columns, ``{estimate}`` and ``{interval}`` printed in `unit` (and ``{level}``), or a
            function ``(row: dict, level: float) -> str``.
        section: the key of the report section whose figure reads these rows ('leak_effect',
            'accuracy', 'dose_response'), 'table' when the report leaves them to
            ``estimates.csv``, or None: the report's 'Further estimates' section reads each row
            with `reading`.
    """

    name: ClassVar[str] = ""
    unit: ClassVar[str] = "pp"
    reading: ClassVar[str | Callable | None] = None
    section: ClassVar[str | None] = None

    @staticmethod
    def compute(ctx: "EstimandContext") -> pd.DataFrame | None:
        """The estimand's rows (columns of `ESTIMATE_COLUMNS`, the missing ones NaN)."""
        raise NotImplementedError

    @classmethod
    def read(cls, row, level: float = 0.95) -> str:
        """The reading of one row (a mapping of the table's columns)."""
        row = dict(row)
        if callable(cls.reading):
            return cls.reading(row, level)
        template = cls.reading or "{estimand} is {estimate} ({interval})"
        values = {**row, "level": level, "estimate": format_value(row.get("estimate"), cls.unit),
                  "interval": format_interval(row.get("ci_low"), row.get("ci_high"), cls.unit, level)}
        return template.format_map(values)


REGISTRY = Registry("estimand", Estimand, ENTRY_POINT_GROUP, StatsError)


def register_estimand(name: str, *, unit: str, reading: str | Callable, section: str | None = None) -> Callable:
    """Function decorator: register ``fn(ctx) -> DataFrame`` as the estimand `name`.

    Args:
        name: the estimand's name (an identifier; its rows' ``estimand``, filled in where the
            rows leave it out).
        unit: how it is printed ('pp', 'share', ...; `Estimand.unit`).
        reading: a template or a function reading one row (`Estimand.reading`).
        section: which report section reads it (`Estimand.section`; None: 'Further estimates').

    Returns:
        The decorator; it returns the function unchanged.

    Raises:
        StatsError: the name is taken by another estimand (naming both) or is no identifier.
    """

    def deco(fn: Callable) -> Callable:
        cls = type(f"{name}_estimand", (Estimand,), {
            "unit": unit, "reading": staticmethod(reading) if callable(reading) else reading, "section": section,
            "compute": staticmethod(fn), "__doc__": fn.__doc__, "__module__": fn.__module__,
            "__qualname__": getattr(fn, "__qualname__", name)})
        REGISTRY.add(name, cls)
        return fn

    return deco


def unregister_estimand(name: str) -> None:
    """Remove a registered estimand (for tests and interactive work)."""
    REGISTRY.unregister(name)


def get_estimand(name: str) -> type[Estimand]:
    """The `Estimand` registered as `name`; an unknown name lists the close matches."""
    return REGISTRY.get_class(name)


def available_estimands() -> list[str]:
    """The registered estimand names, in the order `estimates` runs them."""
    return list(REGISTRY.classes())


def estimand_units(table: pd.DataFrame) -> dict[str, str]:
    """{estimand: unit} of the registered estimands that `table` (an estimates table) holds."""
    known = REGISTRY.classes()
    return {n: known[n].unit for n in dict.fromkeys(table["estimand"].astype(str)) if n in known}


def read_row(row, level: float = 0.95) -> str:
    """The reading of one estimates row by its estimand's registered `reading`."""
    return get_estimand(str(row["estimand"])).read(row, level)


@dataclass
class EstimandContext:
    """What every estimand is computed from: checked predictions, results, the bootstrap.

    Attributes:
        pred: the checked predictions (`check_predictions`; string keys, 0/1 `correct`).
        results: the diagnostics' results rows, or None.
        baseline: the intervention name of the unaltered crops.
        p1, p2: the protocols compared by the protocol effect.
        n_boot, level, seed: the bootstrap (resamples, interval coverage, seed).
        interval: the interval method ("cgm" or "pigeonhole", `shortcutlab.stats.bootstrap`).
        baseline_recipe: the recipe whose factorial the retrained ones are compared with
            (`recipe_rows`; None: the first recipe in sorted order).
    """

    pred: pd.DataFrame
    results: pd.DataFrame | None = None
    baseline: str = "none"
    p1: str = "crop"
    p2: str = "parent"
    n_boot: int = 10_000
    level: float = 0.95
    seed: int = 0
    interval: str = DEFAULT_INTERVAL
    baseline_recipe: str | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def boot(self) -> dict:
        """The bootstrap keywords of the effect functions: n_boot, level, seed."""
        return dict(n_boot=self.n_boot, level=self.level, seed=self.seed)

    @property
    def factorial_conditions(self) -> set:
        """Conditions with factorial predictions (exposure 'leak' or 'clean')."""
        return set(self.pred.loc[self.pred["exposure"].isin(["leak", "clean"]), "condition"].unique())

    def joint(self, key: str, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        """Rows computed once for several estimands (e.g. the leak cut, the share removed and
        the clean cost, from one pass): `estimates` keeps them in the order `compute` gave,
        whichever estimand returns them (a filter of the frame keeps its order)."""
        if key not in self._cache:
            rows = compute()
            self._cache[key] = rows.assign(_joint=key, _seq=np.arange(len(rows)))
        return self._cache[key]

    def factorial(self):
        """The factorial's predictions and bootstrap draws, made once for every estimand that
        reads them (`prepare_factorial`'s pair)."""
        def draw():
            fac_pred = self.pred[self.pred["condition"].isin(self.factorial_conditions)]
            return fac_pred, factorial_bootstrap(fac_pred, self.n_boot, self.seed, self.interval)

        if ("factorial",) not in self._cache:
            self._cache[("factorial",)] = draw()
        return self._cache[("factorial",)]


# --- the built-in estimands ------------------------------------------------------------------------

#: What `leak_status` can say of a leak row (the report's rules, `shortcutlab.report.readings`).
LEAK_STATUSES = ("leak", "no leak", "negative", "no interval", "no estimate")


def leak_status(estimate: float, ci_low: float, ci_high: float) -> str:
    """Which case of the report's rules a leak (leak minus clean accuracy) is, decided on the
    numbers as printed (pp, one decimal: `units.pp_shown`):

    - ``"no estimate"``: no estimate;
    - ``"no interval"``: an estimate without an interval (too few seeds or parents);
    - ``"leak"``: the interval lies above 0 (its lower end prints above +0.0);
    - ``"negative"``: the interval lies below 0: the clean models score higher;
    - ``"no leak"``: the interval includes 0 (as printed).

    Example:
        >>> leak_status(0.13, 0.091, 0.168), leak_status(-0.033, -0.05, -0.016), leak_status(0.01, 0.0004, 0.02)
        ('leak', 'negative', 'no leak')
    """
    if is_nan(estimate):
        return "no estimate"
    if is_nan(ci_low) or is_nan(ci_high):
        return "no interval"
    if pp_shown(ci_low) > 0:
        return "leak"
    if pp_shown(ci_high) < 0:
        return "negative"
    return "no leak"


def leak_phrase(row, level: float = 0.95) -> str:
    """'the leak is +13.0 pp (95% CI +9.1 to +16.8 pp)', with the caveats of the report's rules
    (`shortcutlab.report.readings`, by `leak_status`): no interval, an interval that includes
    zero ('not distinguishable from zero'), one below zero ('the clean models score higher')."""
    est = row["estimate"]
    status = leak_status(est, row["ci_low"], row["ci_high"])
    if status == "no estimate":
        return f"the leak could not be estimated ({row.get('reason') or 'no data'})"
    if status == "no interval":
        why = row.get("reason") or "no resamples"
        return f"the leak is {pp(est)} (no interval: {why})"
    text = f"the leak is {pp(est)} ({ci_pp(row['ci_low'], row['ci_high'], level)})"
    if status == "no leak":
        text += ", not distinguishable from zero"
    elif status == "negative":
        text += ": the clean models score higher than the leak models"
    return text


def protocol_phrase(row, level: float = 0.95) -> str:
    """'crc: +6.1 pp (95% CI +2.0 to +9.9 pp)': one condition's P1 - P2 accuracy."""
    return f"{row['condition']}: {pp(row['estimate'])} ({ci_pp(row['ci_low'], row['ci_high'], level)})"


def slope_phrase(row, level: float = 0.95) -> str:
    """'color: +1.2 pp per 0.1 of R (95% CI ...)': one condition's slope of the leak gap on R,
    per 0.1 of R; with fewer than `MIN_SLOPE_SEEDS` seeds no interval is stated."""
    if is_nan(row["estimate"]):
        return f"{row['condition']}: no slope ({row.get('reason') or 'no data'})"
    per = pp(row["estimate"] * 0.1)
    if row.get("n_clusters", 3) < MIN_SLOPE_SEEDS:
        n = row["n_clusters"]
        return f"{row['condition']}: {per} per 0.1 of R (no interval with {int(n)} seed{'s' if n != 1 else ''})"
    if is_nan(row["ci_low"]):
        why = row.get("reason")
        return f"{row['condition']}: {per} per 0.1 of R (no interval{': ' + str(why) if isinstance(why, str) and why else ''})"
    return f"{row['condition']}: {per} per 0.1 of R ({ci_pp(row['ci_low'] * 0.1, row['ci_high'] * 0.1, level)})"


@register_estimand("leak", unit="pp", reading=leak_phrase, section="leak_effect")
def leak_estimand(ctx: EstimandContext) -> pd.DataFrame:
    """Leak-model minus clean-model accuracy (`leak_effect`), with its Holm families: the
    headline (pooled or only architecture, baseline) ``leak``, per architecture
    ``leak:<condition>``, under other interventions ``leak_under:<condition>``."""
    if not ctx.factorial_conditions:
        warnings.warn("estimates: no factorial (no prediction with exposure 'leak' or 'clean'): no leak effect",
                      StatsWarning, stacklevel=4)
        return pd.DataFrame([dict(estimand="leak", family="", condition=c, arch="", diversity="",
                                  intervention=ctx.baseline, estimate=np.nan, n_boot=0,
                                  reason="no factorial: no prediction with exposure 'leak' or 'clean'")
                             for c in sorted(ctx.pred["condition"].unique())])
    leak = leak_table(ctx.factorial(), level=ctx.level, interval=ctx.interval)
    primary = leak["intervention"] == ctx.baseline
    n_arch = leak.groupby("condition")["arch"].transform(lambda a: (a != "pooled").sum())
    head = primary & ((leak["arch"] == "pooled") | (n_arch == 1))
    leak["family"] = np.where(head, "leak", np.where(primary, "leak:" + leak["condition"],
                                                      "leak_under:" + leak["condition"]))
    leak.loc[leak["reason"].str.startswith("no "), "family"] = ""
    return leak


def _h3(ctx: EstimandContext) -> pd.DataFrame | None:
    """`h3_rows` (pooled leak, leak x diversity, pooled cuts), computed once for the three
    estimands, with their descriptive families (a registered hypothesis replaces them)."""
    if not ctx.factorial_conditions:
        return None

    def compute():
        rows = h3_rows(ctx.factorial(), baseline=ctx.baseline, level=ctx.level, interval=ctx.interval)
        fam = {"leak_pooled": "leak_pooled", "leak_x_diversity": "leak_x_diversity"}
        rows["family"] = [fam.get(e, f"{e}:{c}") for e, c in zip(rows["estimand"], rows["condition"])]
        return rows

    return ctx.joint("h3", compute)


def _joint_rows(name: str, joint: Callable[[EstimandContext], pd.DataFrame | None]) -> Callable:
    def rows(ctx: EstimandContext) -> pd.DataFrame | None:
        frame = joint(ctx)
        return None if frame is None else frame[frame["estimand"] == name]

    rows.__doc__ = f"The {name} rows of {joint.__name__.strip('_')} (computed once with its siblings)."
    rows.__qualname__ = f"{name}_estimand"
    return rows


register_estimand("leak_pooled", unit="pp", section="table",
                  reading="the leak pooled over architectures and diversity levels is {estimate} ({interval})"
                  )(_joint_rows("leak_pooled", _h3))
register_estimand("leak_x_diversity", unit="pp", section="table",
                  reading="the leak is {estimate} larger at high than at low diversity ({interval})"
                  )(_joint_rows("leak_x_diversity", _h3))
register_estimand("leak_cut_pooled", unit="pp", section="table",
                  reading="{intervention} cuts the leak pooled over architectures and diversity by {estimate} ({interval})"
                  )(_joint_rows("leak_cut_pooled", _h3))


def _recipes(ctx: EstimandContext) -> pd.DataFrame | None:
    """`recipe_rows` (the factorial retrained under other recipes), computed once; None
    without recipes (a predictions table without a ``recipe`` column, or a single recipe)."""
    if "recipe" not in ctx.pred.columns or not ctx.factorial_conditions:
        return None

    def compute():
        rows = recipe_rows(ctx.pred, baseline=ctx.baseline, baseline_recipe=ctx.baseline_recipe, **ctx.boot,
                           interval=ctx.interval)
        rows["family"] = rows["estimand"] + ":" + rows["condition"]
        return rows

    return ctx.joint("recipes", compute)


register_estimand("recipe_leak", unit="pp", section="table",
                  reading="models trained with {recipe} show a leak of {estimate} ({interval})")(_joint_rows("recipe_leak", _recipes))
register_estimand("recipe_cut", unit="pp", section="table",
                  reading="training with {recipe} cuts the leak by {estimate} ({interval})")(_joint_rows("recipe_cut", _recipes))


@register_estimand("diversity", unit="pp", section="table",
                   reading="clean models score {estimate} more on high- than on low-diversity data ({interval})")
def diversity_estimand(ctx: EstimandContext) -> pd.DataFrame | None:
    """Clean-high minus clean-low accuracy (`diversity_rows`: `diversity_effect`'s definition
    from the factorial's draws, paired with the leak), family ``diversity:<condition>``."""
    if not ctx.factorial_conditions:
        return None
    return diversity_rows(ctx.factorial(), baseline=ctx.baseline, level=ctx.level, interval=ctx.interval)


def _interventions(ctx: EstimandContext) -> pd.DataFrame | None:
    """The leak cut, share removed and clean cost rows (`intervention_table`), computed once
    for the three estimands; None without a factorial intervention other than the baseline."""
    is_fac = ctx.pred["exposure"].isin(["leak", "clean"])
    if not is_fac.any() or not (ctx.pred.loc[is_fac, "intervention"] != ctx.baseline).any():
        return None

    def compute():
        inter = intervention_table(ctx.factorial(), baseline=ctx.baseline, level=ctx.level, interval=ctx.interval)
        inter["family"] = np.where(inter["estimand"] == "share_removed", "", inter["estimand"] + ":" + inter["condition"])
        return inter

    return ctx.joint("interventions", compute)


register_estimand("leak_cut", unit="pp", section="leak_effect",
                  reading="{intervention} cuts the leak by {estimate} ({interval})")(_joint_rows("leak_cut", _interventions))
register_estimand("share_removed", unit="share", section="leak_effect",
                  reading="{intervention} removes {estimate} of the leak ({interval})")(_joint_rows("share_removed", _interventions))
register_estimand("clean_cost", unit="pp", section="leak_effect",
                  reading="{intervention} costs clean models {estimate} ({interval})")(_joint_rows("clean_cost", _interventions))


@register_estimand("protocol", unit="pp", reading=protocol_phrase, section="accuracy")
def protocol_estimand(ctx: EstimandContext) -> pd.DataFrame | None:
    """P1 minus P2 accuracy (`protocol_effect`): family ``protocol`` pooled (or for a single
    architecture), ``protocol:<condition>`` per architecture."""
    if not ctx.pred["protocol"].isin([ctx.p1, ctx.p2]).any():
        return None
    prot = protocol_effect(ctx.pred, p1=ctx.p1, p2=ctx.p2, intervention=ctx.baseline, **ctx.boot, interval=ctx.interval)
    prot["family"] = np.where(prot["arch"] == "pooled", "protocol", "protocol:" + prot["condition"])
    single = prot.groupby("condition")["arch"].transform("size") == 1
    prot.loc[single, "family"] = "protocol"
    return prot


@register_estimand("slope", unit="pp per unit of R", reading=slope_phrase, section="dose_response")
def slope_estimand(ctx: EstimandContext) -> pd.DataFrame | None:
    """The slope of the leak gap on R (`dose_points`, `dose_response` clustered by seed) per
    condition, family ``dose``; only with results. Where `slope_interval_problem` finds the points
    unable to carry an interval (fewer than `MIN_SLOPE_SEEDS` seeds: resampling two clusters
    gives at most three distinct slopes, so the interval was [x, x]; R at fewer than 3 values,
    spread over less than 0.1 of R, or in two separated clumps) the slope is stated with no
    interval and no p-value (the reason, a warning), so it enters no Holm family as a test."""
    if ctx.results is None:
        return None
    pts = dose_points(ctx.pred, ctx.results, intervention=ctx.baseline)
    if pts.empty:
        warnings.warn("estimates: results hold no parent-probe R of a factorial leak model: no dose-response",
                      StatsWarning, stacklevel=4)
        return pd.DataFrame([dict(estimand="slope", family="", condition="", arch="", diversity="",
                                  intervention=ctx.baseline, estimate=np.nan, n_boot=0,
                                  reason="no parent-probe R row for a factorial leak model")])
    dose = dose_response(pts, x="R", y="gap", cluster="seed", by=["condition"], **ctx.boot)
    # (dose_response already gives no interval below MIN_CLUSTERS = 3 clusters.) Where the points
    # cannot carry an interval (`slope_interval_problem`: fewer than MIN_SLOPE_SEEDS seeds, R at
    # fewer than 3 values, over less than 0.1, or in two clumps), the slope is stated with no
    # interval and no p-value, so it enters no Holm family as a test: resampling such points gave
    # intervals such as -1638 to +1564 pp per unit of R.
    why = pd.Series([slope_interval_problem(pts.loc[pts["condition"] == c, "R"], pts.loc[pts["condition"] == c, "seed"])
                     if np.isfinite(est) else "" for c, est in zip(dose["condition"], dose["estimate"])], index=dose.index)
    few = why != ""
    if few.any():
        dose.loc[few, ["ci_low", "ci_high", "se", "p_value"]] = np.nan
        dose.loc[few, "reason"] = why[few]
        dose.loc[few, "n_boot"] = 0
        warnings.warn(f"estimates: slope of {', '.join(map(str, dose.loc[few, 'condition']))}: no interval "
                      f"({why[few].iloc[0]})", StatsWarning, stacklevel=4)
    dose = dose.assign(arch="pooled", diversity="", intervention=ctx.baseline, family="dose",
                       n_seeds=dose["n_clusters"], n_parents=np.nan, n_crops=np.nan)
    return dose.drop(columns=["intercept", "n_points", "n_clusters"])


# --- the one table -----------------------------------------------------------------------------

def estimates(predictions: pd.DataFrame, results: pd.DataFrame | None = None, *, baseline: str = "none",
              p1: str = "crop", p2: str = "parent", n_boot: int = 10_000, level: float = 0.95, seed: int = 0,
              alpha: float = 0.05, hypotheses: Mapping | None = None, families: Mapping | None = None,
              baseline_recipe: str | None = None, interval: str = DEFAULT_INTERVAL) -> pd.DataFrame:
    """Every registered estimand of a sweep in one tidy table, Holm-adjusted within families.

    Built-in estimands (rows; all fractions) and their Holm families:

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

    - ``leak_pooled``: the leak pooled over architectures and diversity levels (one row per
      condition: the paper's H3), ``leak_x_diversity`` (leak at high minus at low diversity)
      and ``leak_cut_pooled`` (per intervention, pooled likewise: F2), all from the draws of
      ``leak`` (`h3_rows`); descriptive families ``leak_pooled``, ``leak_x_diversity``,
      ``leak_cut_pooled:<condition>``;
    - ``recipe_leak`` and ``recipe_cut``: with several training recipes in a condition (the
      predictions' ``recipe`` column, ``arch=`` left out), each recipe's pooled leak and its
      cut from `baseline_recipe`'s (F3, F4; `recipe_rows`); the other factorial estimands pool
      the recipes.

    Estimands registered with `register_estimand` follow, in registration order.

    **Registered tests.** Rows testing one of the paper's hypotheses get its label in
    ``hypothesis`` (`shortcutlab.stats.hypotheses`: by default H1/H2 the pooled protocol effect
    per benchmark, H3 ``leak_pooled``, F2 ``leak_cut_pooled``, F3/F4 the masked-background and
    HED-jitter recipes, F8 ``slope``) and are Holm-adjusted within their registered family
    (default the paper's: H1 alone, H2-H5, F1-F8); the other rows keep the descriptive
    families above.

    Args:
        predictions, results: the sweep's tables.
        baseline: the intervention of the unaltered crops.
        p1, p2: the protocols of the protocol effect.
        n_boot, level, seed: the two-way bootstrap.
        alpha: the family-wise error rate of Holm's `reject`.
        hypotheses: {label: selector} naming the rows each hypothesis tests (see
            `shortcutlab.stats.hypotheses`); None: the paper's defaults; {}: no labels.
        families: {family: [labels]}, e.g. ``{"primary": ["H1"], "study": ["H2", "H3"]}``;
            None: `PAPER_FAMILIES`. Unknown labels are an error naming them.
        baseline_recipe: the recipe the retrained factorials are compared with (None: the
            first in sorted order).
        interval: "cgm" (Cameron-Gelbach-Miller, calibrated) or "pigeonhole" (conservative; see
            `shortcutlab.stats.bootstrap`), recorded in ``interval_method``; <3 seeds: no interval.

    A condition with no factorial cells gets no leak rows (e.g. a protocol-only benchmark, as
    CRIC in the paper); one with neither factorial cells nor both protocols, and a sweep with no
    factorial at all, get a NaN row with a `reason`. Degenerate parts (one seed, a cell
    without its clean model) warn and give NaN intervals with a `reason`; none is dropped.

    Returns:
        `ESTIMATE_COLUMNS` (+ ``cost_exceeds_leak`` for the intervention rows, NA elsewhere).
        The unit of each estimand: `estimand_units`.
    """
    pred = check_predictions(predictions)
    check_unique(pred)
    if "recipe" in predictions.columns:
        pred["recipe"] = [recipe_without_arch(r) for r in predictions["recipe"].astype(str).to_numpy()]
    ctx = EstimandContext(pred, results, baseline=baseline, p1=p1, p2=p2, n_boot=n_boot, level=level, seed=seed,
                          baseline_recipe=baseline_recipe, interval=check_interval(interval))
    parts = [_unused_conditions(ctx)]
    parts += _registered_parts(ctx)

    def label(table):
        return assign_hypotheses(table, hypotheses, families, baseline=baseline, baseline_recipe=baseline_recipe,
                                 conditions=list(dict.fromkeys(pred["condition"].astype(str))))

    return _table(parts, alpha, label)


def recipe_without_arch(recipe: str) -> str:
    """A sweep's ``recipe`` ('arch=resnet18,mask_background=True') without its ``arch=`` part:
    the architecture is a column of its own, so a factorial retrained under another recipe is
    told apart from the same recipe on another architecture."""
    parts = re.split(r",(?=[A-Za-z_][A-Za-z0-9_]*=)", recipe) if recipe else []
    return ",".join(p for p in parts if not p.startswith("arch="))


def _unused_conditions(ctx: EstimandContext) -> pd.DataFrame:
    """NaN rows (warned) of conditions holding neither factorial cells nor both protocols."""
    pred, p1, p2 = ctx.pred, ctx.p1, ctx.p2
    fac_conditions = ctx.factorial_conditions
    prot_conditions = {c for c, ps in pred.groupby("condition")["protocol"].unique().items() if {p1, p2} <= set(ps)}
    unused = sorted(set(pred["condition"].unique()) - fac_conditions - prot_conditions)
    if not (unused and fac_conditions | prot_conditions):
        return pd.DataFrame()
    warnings.warn(f"estimates: condition(s) {', '.join(map(repr, unused))} hold neither factorial cells nor both "
                  f"protocols {p1!r} and {p2!r}: no estimate", StatsWarning, stacklevel=3)
    return pd.DataFrame([dict(estimand="", family="", condition=c, arch="", diversity="", intervention="",
                              estimate=np.nan, n_boot=0, reason=f"neither factorial cells nor both protocols {p1!r} and {p2!r}")
                         for c in unused]).assign(_rank=-1, _seq=np.arange(len(unused)))


def _registered_parts(ctx: EstimandContext) -> list[pd.DataFrame]:
    """Each registered estimand's rows, tagged for `_table`'s order: rows computed jointly
    (`EstimandContext.joint`) keep their joint order at the place of the first estimand
    returning them; other rows follow in registration order."""
    parts, rank = [], {}
    for i, (name, est) in enumerate(REGISTRY.classes().items()):
        rows = est.compute(ctx)
        if rows is not None and not isinstance(rows, pd.DataFrame):
            raise StatsError(f"estimand {name!r} ({est.__module__}.{est.__qualname__}) returned {type(rows).__name__}; "
                             f"expected a pandas DataFrame of rows (or None: no rows)")
        if rows is None or not len(rows):
            continue
        rows = rows.copy()
        if "estimand" not in rows.columns:
            rows["estimand"] = name
        joint = rows["_joint"].iloc[0] if "_joint" in rows.columns else name
        rows["_rank"] = rank.setdefault(joint, i)
        if "_seq" not in rows.columns:
            rows["_seq"] = np.arange(len(rows))
        parts.append(rows.drop(columns=["_joint"], errors="ignore"))
    return parts


def _table(parts: list[pd.DataFrame], alpha: float, label: Callable | None = None) -> pd.DataFrame:
    """The parts as one table in their order, every column of `ESTIMATE_COLUMNS`, labelled with
    their hypotheses (`label`) and Holm-adjusted."""
    parts = [p for p in parts if len(p)]
    table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["_rank", "_seq"])
    table = table.sort_values(["_rank", "_seq"], kind="mergesort").drop(columns=["_rank", "_seq"])
    table = table.reset_index(drop=True)
    for col in ESTIMATE_COLUMNS:
        if col not in table.columns:
            table[col] = np.nan
    table["family"] = table["family"].fillna("")
    table["interval_method"] = table["interval_method"].fillna("")
    table["recipe"] = table["recipe"].astype(object).fillna("")
    if label is not None:
        table = label(table)
    table["hypothesis"] = table["hypothesis"].astype(object).fillna("")
    table = add_holm(table, family="family", alpha=alpha)
    extra = [c for c in ("baseline", "cost_exceeds_leak") if c in table.columns]
    return table[ESTIMATE_COLUMNS + extra].reset_index(drop=True)
