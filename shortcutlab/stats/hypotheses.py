"""The paper's registered hypotheses (Table 2 of reference 000), which estimates rows test them,
and the Holm families they were registered in.

A hypothesis label (``H1`` ... ``H5``, ``F1`` ... ``F8``, or a label of your own) names the
rows of an estimates table that test it, through a *selector*: a mapping of the table's
columns (``estimand``, ``condition``, ``arch``, ``diversity``, ``intervention``, ``recipe``)
to a value or a list of values. Columns a selector leaves out are narrowed to the headline
rows: ``arch`` and ``diversity`` to 'pooled' where a condition has a pooled row, and
``intervention`` to the baseline where the matched rows hold it. A label may select one row
per condition (one test per benchmark).

What a sweep produces by default (`default_hypotheses`; the rest needs results a sweep does
not compute and is left to a selector of your own, see docs/statistics.md, "The paper's registered tests"):

- ``H1``: the protocol effect (P1 - P2) pooled over architectures within seed, of the first
  condition (in the order of the predictions) with both protocols; ``H2``: the same for every
  further condition (the paper: SIPaKMeD and CRIC);
- ``H3``: the leak pooled over architectures and diversity levels (``leak_pooled``; with one
  diversity level, the ``leak`` row pooled over architectures), or with several recipes that
  of the baseline recipe (``recipe_leak``);
- ``F2``: the leak cut pooled over architectures and diversity, per intervention (re-scored
  models, ``leak_cut_pooled``; with one diversity level the pooled ``leak_cut`` row);
- ``F3``: the leak of a factorial retrained with masked backgrounds (``recipe_leak`` of a
  recipe holding ``mask_background=True``);
- ``F4``: the leak cut of a factorial retrained with HED jitter (``recipe_cut`` of a recipe
  holding ``augment=hed_jitter``);
- ``F8``: the slope of the leak gap on R (``slope``, pooled over the condition's models).

H4 (background transplants), H5 (gap tracks R under gradient reversal), F1 (CRIC's
slide-majority pull), F5-F7 (gap cut by LEACE, normalisation, the linear adversary) have no
default rows.

Families (`PAPER_FAMILIES`, Holm 1979 within each): H1 alone (``primary``), H2-H5 one family
(``study``), F1-F8 one family (``follow_up``), as the paper registered them.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from .errors import StatsError

__all__ = ["HYPOTHESES", "PAPER_FAMILIES", "SELECTOR_COLUMNS", "assign_hypotheses", "check_families",
           "check_hypotheses", "default_hypotheses", "registered_tests"]

#: The paper's registered hypotheses (Table 2), in its order, with its wording (no trailing
#: parenthesis: the report appends the intervention or recipe of a row in one).
HYPOTHESES = {
    "H1": "protocol effect, first benchmark: crop vs. parent split",
    "H2": "protocol effect, further benchmark",
    "H3": "leakage at matched size, pooled over diversity",
    "H4": "own-background route",
    "H5": "gap tracks R, gradient reversal",
    "F1": "slide-majority pull",
    "F2": "intervention cuts the leak, re-scored models",
    "F3": "leak with masked backgrounds, retrained",
    "F4": "HED jitter cuts the leak, retrained",
    "F5": "LEACE erasure cuts the gap",
    "F6": "normalisation cuts the gap",
    "F7": "gap tracks R, linear adversary",
    "F8": "gap tracks R, pooled",
}

#: The Holm families as the paper registered them: H1 alone, H2-H5, F1-F8.
PAPER_FAMILIES = {"primary": ("H1",), "study": ("H2", "H3", "H4", "H5"),
                  "follow_up": ("F1", "F2", "F3", "F4", "F5", "F6", "F7", "F8")}

#: The estimates columns a selector may name.
SELECTOR_COLUMNS = ("estimand", "condition", "arch", "diversity", "intervention", "recipe")


def check_hypotheses(hypotheses: Mapping | None) -> dict:
    """`hypotheses` as {label: {column: tuple of str}}, checked.

    Raises:
        StatsError: not a mapping, a selector that is not a mapping, a column not in
            `SELECTOR_COLUMNS`, or an empty selector; each naming the label and what came.
    """
    if hypotheses is None:
        return {}
    if not isinstance(hypotheses, Mapping):
        raise StatsError(f"hypotheses: expected a mapping of label -> selector; got {type(hypotheses).__name__}")
    out = {}
    for label, sel in hypotheses.items():
        if not isinstance(sel, Mapping) or not sel:
            raise StatsError(f"hypotheses.{label}: expected a non-empty mapping of column -> value(s) "
                             f"(columns: {', '.join(SELECTOR_COLUMNS)}); got {sel!r}")
        bad = [c for c in sel if c not in SELECTOR_COLUMNS]
        if bad:
            raise StatsError(f"hypotheses.{label}: unknown column(s) {', '.join(map(repr, bad))}; "
                             f"a selector names: {', '.join(SELECTOR_COLUMNS)}")
        out[str(label)] = {c: tuple(str(v) for v in (vals if isinstance(vals, (list, tuple)) else [vals]))
                           for c, vals in sel.items()}
    return out


def check_families(families: Mapping | None, labels: Sequence[str] = ()) -> dict:
    """`families` ({family: [labels]}; None: `PAPER_FAMILIES`) as {label: family}, checked.

    Args:
        families: the registered families.
        labels: labels known beyond the paper's (those of the `hypotheses` given).

    Raises:
        StatsError: not a mapping of lists, a label no hypothesis knows (naming every unknown
            one and the known ones), or a label in two families (naming both).
    """
    families = PAPER_FAMILIES if families is None else families
    if not isinstance(families, Mapping):
        raise StatsError(f"families: expected a mapping of family -> list of hypothesis labels; "
                         f"got {type(families).__name__}")
    known = list(HYPOTHESES) + [lab for lab in labels if lab not in HYPOTHESES]
    where, unknown = {}, []
    for fam, members in families.items():
        if isinstance(members, str) or not isinstance(members, (list, tuple)):
            raise StatsError(f"families.{fam}: expected a list of hypothesis labels; got {members!r}")
        for lab in map(str, members):
            if lab not in known:
                unknown.append(lab)
            elif lab in where:
                raise StatsError(f"families: hypothesis {lab!r} is in two families, {where[lab]!r} and {fam!r}; "
                                 f"a test belongs to one family")
            where[lab] = str(fam)
    if unknown:
        raise StatsError(f"families: unknown hypothesis label(s) {', '.join(map(repr, unknown))}; known: "
                         f"{', '.join(known)} (name your own in `hypotheses`)")
    return where


def default_hypotheses(table: pd.DataFrame, *, baseline_recipe: str | None = None,
                       conditions: Sequence[str] = ()) -> dict:
    """The paper's labels for the rows a sweep produces (see the module docstring), as
    selectors of `table` (an estimates table without labels); `conditions` gives the order
    of the benchmarks (H1 the first with a protocol effect; the rest in the table's order)."""
    est = table["estimand"].astype(str)
    sel: dict[str, dict] = {}
    prot = set(table.loc[(est == "protocol") & table["estimate"].notna(), "condition"].astype(str))
    conditions = [c for c in dict.fromkeys([*map(str, conditions), *sorted(prot)]) if c in prot]
    if conditions:
        sel["H1"] = {"estimand": ("protocol",), "condition": (conditions[0],)}
    if len(conditions) > 1:
        sel["H2"] = {"estimand": ("protocol",), "condition": tuple(conditions[1:])}
    recipes = sorted(set(table.loc[est == "recipe_leak", "recipe"].astype(str)))
    if recipes:
        base = recipes[0] if baseline_recipe is None else baseline_recipe
        sel["H3"] = {"estimand": ("recipe_leak",), "recipe": (base,)}
        masked = tuple(r for r in recipes if "mask_background=True" in r.split(","))
        hed = tuple(r for r in recipes if "augment=hed_jitter" in r.split(","))
        if masked:
            sel["F3"] = {"estimand": ("recipe_leak",), "recipe": masked}
        if hed:
            sel["F4"] = {"estimand": ("recipe_cut",), "recipe": hed}
    elif est.isin(["leak_pooled", "leak"]).any():
        sel["H3"] = {"estimand": ("leak_pooled", "leak")}
    if est.isin(["leak_cut_pooled", "leak_cut"]).any():
        sel["F2"] = {"estimand": ("leak_cut_pooled", "leak_cut")}
    if (est == "slope").any():
        sel["F8"] = {"estimand": ("slope",)}
    return sel


def _select(table: pd.DataFrame, sel: dict, baseline: str) -> np.ndarray:
    """Row positions of `table` one selector picks (narrowed to headline rows, see module)."""
    keep = np.ones(len(table), dtype=bool)
    for col, vals in sel.items():
        keep &= table[col].astype(str).isin(vals).to_numpy() if col in table.columns else False
    keep &= table["estimate"].notna().to_numpy()
    sub = table[keep]
    if "intervention" not in sel and (sub["intervention"].astype(str) == baseline).any():
        keep &= (table["intervention"].astype(str) == baseline).to_numpy()
    for col in ("arch", "diversity"):
        if col in sel:
            continue
        has_pooled = table[keep].groupby("condition")[col].agg(lambda v: (v.astype(str) == "pooled").any())
        pooled_cond = table["condition"].isin(has_pooled.index[has_pooled.astype(bool)]).to_numpy()
        keep &= ~pooled_cond | (table[col].astype(str) == "pooled").to_numpy()
    return np.flatnonzero(keep)


def assign_hypotheses(table: pd.DataFrame, hypotheses: Mapping | None = None, families: Mapping | None = None, *,
                      baseline: str = "none", baseline_recipe: str | None = None,
                      conditions: Sequence[str] = ()) -> pd.DataFrame:
    """`table` with ``hypothesis`` filled and the labelled rows moved into their registered family.

    Args:
        table: an estimates table (before Holm).
        hypotheses: {label: selector} (None: `default_hypotheses`; {}: no labels, today's
            descriptive families everywhere).
        families: {family: [labels]} (None: `PAPER_FAMILIES`). A label in no family is tested
            alone (its family is the label).
        baseline, baseline_recipe: the intervention and recipe of the headline rows.
        conditions: the benchmarks in the sweep's order (`default_hypotheses`).

    Raises:
        StatsError: as `check_hypotheses` and `check_families`; or a row selected by two labels.
    """
    given = check_hypotheses(hypotheses)
    fam_of = check_families(families, list(given))
    sel = (default_hypotheses(table, baseline_recipe=baseline_recipe, conditions=conditions) if hypotheses is None
           else given)
    out = table.copy()
    out["hypothesis"] = ""
    for label, s in sel.items():
        rows = _select(out, s, baseline)
        taken = out["hypothesis"].iloc[rows]
        if (taken != "").any():
            raise StatsError(f"hypotheses: {label!r} and {taken[taken != ''].iloc[0]!r} select the same row "
                             f"({_describe(out.iloc[rows[(taken != '').to_numpy()][0]])}); a row tests one hypothesis")
        col = out.columns.get_loc("hypothesis")
        out.iloc[rows, col] = label
        out.iloc[rows, out.columns.get_loc("family")] = fam_of.get(label, label)
    return out


def _describe(row) -> str:
    return ", ".join(f"{c}={row[c]}" for c in SELECTOR_COLUMNS if c in row.index and str(row[c]) not in ("", "nan"))


#: the sensitivity columns `registered_tests` joins from `sensitivity.sensitivity_summary`
SENSITIVITY_COLUMNS = ("p_sign_flip", "t", "df", "p_t", "p_glmm")


def registered_tests(table: pd.DataFrame, sensitivity: pd.DataFrame | None = None) -> pd.DataFrame:
    """The labelled rows of an estimates table in the paper's order (Table 2): hypothesis, its
    wording, condition, estimand, estimate, ci_low, ci_high, p_value, p_holm, family, reject,
    n_seeds, reason; with `sensitivity` (`shortcutlab.stats.sensitivity.sensitivity_summary`)
    also each row's sensitivity p-values (`SENSITIVITY_COLUMNS`, NaN where the row has none),
    joined on estimand, condition, arch, diversity and intervention."""
    if "hypothesis" not in table.columns:
        return pd.DataFrame(columns=["hypothesis", "name"])
    rows = table[table["hypothesis"].astype(str) != ""].copy()
    extra = []
    if sensitivity is not None:
        keys = ["estimand", "condition", "arch", "diversity", "intervention"]
        extra = [c for c in SENSITIVITY_COLUMNS if c in sensitivity.columns]
        sens = sensitivity[keys + extra].astype({k: str for k in keys}).drop_duplicates(keys)
        rows = rows.astype({k: str for k in keys}).merge(sens, on=keys, how="left")
    order = {lab: i for i, lab in enumerate(HYPOTHESES)}
    rows["_o"] = rows["hypothesis"].map(lambda h: order.get(h, len(order)))
    rows = rows.sort_values(["_o", "hypothesis"], kind="mergesort").drop(columns="_o")
    rows.insert(1, "name", rows["hypothesis"].map(lambda h: HYPOTHESES.get(h, "")))
    cols = ["hypothesis", "name", "condition", "estimand", "intervention", "recipe", "estimate", "ci_low", "ci_high",
            "p_value", "p_holm", "family", "reject", "n_seeds", "reason"] + extra
    return rows[[c for c in cols if c in rows.columns]].reset_index(drop=True)
