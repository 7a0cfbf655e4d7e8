"""The report's answer, first: a few sentences read from the numbers and a verdict table.

Everything here is read from tables the report already holds: the estimates (the headline
leak rows), the validity table (`tables.validity_table`: each intervention's verdict and
clean-model cost, each diagnostic's verdict) and the leak on the pixel-free test crops
(`pixel_free.pixel_free_leak`). The words are the readings' (`readings.removal_phrase`,
`readings.moves_verdict`'s verdicts), so the same numbers get the same words in every section.

The rules, stated once:

- **A leak** (`leak_verdict`): the leak's interval lies above 0 ("leak"); it lies below 0
  ("negative leak": leak models score lower than clean ones); it includes 0 ("no leak": no
  leak is shown, and the interval's upper end bounds the leaks still compatible); no interval
  (fewer than 3 seeds or test parents: "no interval", neither called a leak nor ruled out).
- **An acceptable clean cost** (`acceptable_cost`): the intervention's accuracy cost on clean
  models has an interval that includes 0, or its estimate is below half the leak. An
  intervention "removes the leak at an acceptable clean cost" when its validity verdict is
  'removed' or 'partly removed' and its cost is acceptable.
- **Thin evidence**: fewer than `FEW_SEEDS` seeds is said in the summary; so is every leak
  without an interval, with why.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from shortcutlab.report.figures import Section
from shortcutlab.report.readings import headline_arch, intervention_label, removal_phrase
from shortcutlab.stats.bootstrap import MIN_CLUSTERS
from shortcutlab.stats.units import ci_pp, is_nan, pct, pp, pp_number

#: "removes the leak at an acceptable clean cost" needs a cost below this share of the leak
#: (or a cost interval that includes 0)
ACCEPTABLE_COST_SHARE = 0.5
#: fewer seeds than this are named in the summary as thin evidence
FEW_SEEDS = 5
#: validity verdicts that count as removing (part of) a leak
REMOVING = ("removed", "partly removed")
#: the validity table's kinds that remove a leak at test time (an erasure, which refits heads,
#: is read with the diagnostics: "moving" when it removes the refitted heads' leak)
REMOVER_KINDS = ("intervention",)

#: columns of `verdict_rows` (fractions), the report's ``verdicts.csv``
VERDICT_COLUMNS = ["condition", "diversity", "arch", "leak", "leak_ci_low", "leak_ci_high", "leak_verdict", "n_seeds",
                   "n_parents", "reason", "pixel_free_leak", "pixel_free_ci_low", "pixel_free_ci_high",
                   "pixel_free_verdict", "pixel_free_n_crops", "removed_by", "removed_at_a_cost", "n_removers_tried",
                   "moving", "not_moving"]


def leak_verdict(estimate: float, low: float, high: float) -> str:
    """'leak' (interval above 0), 'negative leak' (below 0), 'no leak' (includes 0), 'no
    interval', or 'no estimate'."""
    if is_nan(estimate):
        return "no estimate"
    if is_nan(low) or is_nan(high):
        return "no interval"
    if low > 0:
        return "leak"
    if high < 0:
        return "negative leak"
    return "no leak"


def acceptable_cost(cost: float, cost_low: float, cost_high: float, leak: float) -> bool:
    """Whether an intervention's clean-model cost is acceptable against `leak`: its interval
    includes 0, or the cost is below `ACCEPTABLE_COST_SHARE` of the leak (fractions)."""
    if not (is_nan(cost_low) or is_nan(cost_high)) and cost_low <= 0 <= cost_high:
        return True
    return not (is_nan(cost) or is_nan(leak)) and cost < ACCEPTABLE_COST_SHARE * leak


# --- the verdict rows (numbers) ------------------------------------------------------------------

def headline_leaks(est: pd.DataFrame, baseline: str = "none") -> pd.DataFrame:
    """The estimates' headline leak rows: per condition and diversity level, the leak on the
    unaltered crops at the condition's headline architecture (`readings.headline_arch`)."""
    leak = est[(est["estimand"] == "leak") & (est["intervention"].astype(str) == baseline)]
    keep = [str(r.arch) == str(headline_arch(est, r.condition)) for r in leak.itertuples()]
    return leak[np.array(keep, dtype=bool)].sort_values(["condition", "diversity"]).reset_index(drop=True)


def verdict_rows(est: pd.DataFrame, validity: pd.DataFrame, pixel_free: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per condition and diversity level: the headline leak and its verdict, the leak on
    the pixel-free test crops, which interventions remove it at an acceptable clean cost, and
    which diagnostics move with it (an erasure counts as moving when it removes the refitted
    heads' leak).

    Args:
        est: the estimates (`stats.estimates`).
        validity: `tables.validity_table`.
        pixel_free: `pixel_free.pixel_free_leak` rows, or None.

    Returns:
        `VERDICT_COLUMNS`; fractions. ``removed_by`` / ``removed_at_a_cost``: the validity
        items (intervention settings) joined by ';'; ``moving`` / ``not_moving``: the
        diagnostic items ('<item>: <verdict>' for the latter) joined by ';'.
    """
    rows = []
    for r in headline_leaks(est).to_dict("records"):
        row = {k: r.get(k) for k in ("condition", "diversity", "arch", "n_seeds", "n_parents", "reason")}
        row.update(leak=r["estimate"], leak_ci_low=r["ci_low"], leak_ci_high=r["ci_high"],
                   leak_verdict=leak_verdict(r["estimate"], r["ci_low"], r["ci_high"]))
        row.update(_pixel_free(pixel_free, r))
        row.update(_removers(validity, r))
        row.update(_movers(validity, r))
        rows.append(row)
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS)


def _same_cell(frame: pd.DataFrame | None, r: dict) -> pd.DataFrame:
    if frame is None or frame.empty:
        return pd.DataFrame()
    m = ((frame["condition"].astype(str) == str(r["condition"])) & (frame["diversity"].astype(str) == str(r["diversity"]))
         & (frame["arch"].astype(str) == str(r["arch"])))
    return frame[m]


def _pixel_free(pixel_free: pd.DataFrame | None, r: dict) -> dict:
    sub = _same_cell(pixel_free, r)
    if sub.empty:
        return dict(pixel_free_leak=np.nan, pixel_free_ci_low=np.nan, pixel_free_ci_high=np.nan, pixel_free_verdict="",
                    pixel_free_n_crops=np.nan)
    p = sub.iloc[0]
    return dict(pixel_free_leak=p["estimate"], pixel_free_ci_low=p["ci_low"], pixel_free_ci_high=p["ci_high"],
                pixel_free_verdict=leak_verdict(p["estimate"], p["ci_low"], p["ci_high"]), pixel_free_n_crops=p["n_crops"])


def _removers(validity: pd.DataFrame, r: dict) -> dict:
    sub = _same_cell(validity, r)
    sub = sub[sub["kind"].isin(REMOVER_KINDS)] if len(sub) else sub
    ok, costly = [], []
    for v in sub.to_dict("records"):
        if v["verdict"] in REMOVING:
            fine = acceptable_cost(v["clean_cost"], v["cost_ci_low"], v["cost_ci_high"], r["estimate"])
            (ok if fine else costly).append(str(v["item"]))
    return dict(removed_by=";".join(ok), removed_at_a_cost=";".join(costly), n_removers_tried=len(sub))


def _movers(validity: pd.DataFrame, r: dict) -> dict:
    sub = _same_cell(validity, r)
    sub = sub[~sub["kind"].isin(REMOVER_KINDS)] if len(sub) else sub
    moves = ("moves",) + REMOVING
    moving = [str(v["item"]) for v in sub.to_dict("records") if v["verdict"] in moves]
    other = [f"{v['item']}: {v['verdict']}" for v in sub.to_dict("records") if v["verdict"] not in moves]
    return dict(moving=";".join(moving), not_moving=";".join(other))


# --- the sentences -------------------------------------------------------------------------------

def _where(r: dict, several_levels: bool) -> str:
    return f"{r['condition']} ({r['diversity']} diversity)" if several_levels and str(r["diversity"]) else str(r["condition"])


def _interval_why(r: dict) -> str:
    n = 0 if is_nan(r.get("n_seeds")) else int(r["n_seeds"])
    if n < MIN_CLUSTERS:
        return f"{n} seed{'s' if n != 1 else ''}; an interval needs {MIN_CLUSTERS}"
    return str(r.get("reason") or "too few test parents")


def leak_clause(estimate: float, low: float, high: float, verdict: str, level: float = 0.95, why: str = "") -> str:
    """'+33.9 pp (95% CI +28.0 to +39.8 pp): leak'; without an interval '+33.9 pp (no interval:
    why): no interval, so neither called a leak nor ruled out'."""
    if verdict == "no estimate":
        return "no estimate"
    if verdict == "no interval":
        return f"{pp(estimate)} (no interval{': ' + why if why else ''}): neither called a leak nor ruled out"
    return f"{pp(estimate)} ({ci_pp(low, high, level)}): {verdict}"


def _leak_sentence(rows: list[dict], several: bool, level: float) -> str:
    whys = {_interval_why(r) for r in rows}
    if all(r["leak_verdict"] == "no interval" for r in rows) and len(whys) == 1:   # said once, not per row
        return ("Leak (leak-model minus clean-model accuracy on the common test crops): "
                + "; ".join(f"{_where(r, several)} {pp(r['leak'])}" for r in rows)
                + f"; no interval ({whys.pop()}), so "
                + ("it is neither called a leak nor ruled out." if len(rows) == 1 else "no leak is called one or ruled out."))
    parts = [f"{_where(r, several)} {leak_clause(r['leak'], r['leak_ci_low'], r['leak_ci_high'], r['leak_verdict'], level, _interval_why(r))}"
             for r in rows]
    return "Leak (leak-model minus clean-model accuracy on the common test crops): " + "; ".join(parts) + "."


def _pixel_free_sentence(rows: list[dict], several: bool, level: float) -> str | None:
    have = [r for r in rows if r["pixel_free_verdict"]]
    if not have:
        return None
    parts = [f"{_where(r, several)} {leak_clause(r['pixel_free_leak'], r['pixel_free_ci_low'], r['pixel_free_ci_high'], r['pixel_free_verdict'], level, 'too few seeds or parents')}"
             f" ({int(r['pixel_free_n_crops']):,} test crops over {_seeds(r)})" for r in have]
    return ("On the test crops that share no pixel with a leak training crop (memorised pixels ruled out): "
            + "; ".join(parts) + ".")


def _remover_sentence(rows: list[dict], validity: pd.DataFrame, several: bool, level: float) -> str:
    leaks = [r for r in rows if r["leak_verdict"] == "leak"]
    if not leaks:
        return "No leak is shown, so no intervention is read as removing one."
    parts = []
    for r in leaks:
        sub = _same_cell(validity, r)
        sub = sub[sub["kind"].isin(REMOVER_KINDS)] if len(sub) else sub
        if sub.empty:
            parts.append(f"{_where(r, several)}: no intervention was scored")
            continue
        by_item = {str(v["item"]): v for v in sub.to_dict("records")}
        ok = [i for i in r["removed_by"].split(";") if i]
        costly = [i for i in r["removed_at_a_cost"].split(";") if i]
        clauses = [_removal_words(by_item[i], level) + f" at a clean-model cost of {pp(by_item[i]['clean_cost'])}" for i in ok]
        clauses += [_removal_words(by_item[i], level) + f" but costs clean models {pp(by_item[i]['clean_cost'])}, too much"
                    for i in costly]
        if not ok:
            counts = pd.Series([v["verdict"] for v in by_item.values()]).value_counts()
            clauses.insert(0, f"nothing removes it at an acceptable cost (of {len(by_item)}: "
                              + ", ".join(f"{n} {k}" for k, n in counts.items()) + ")")
        parts.append(f"{_where(r, several)}: " + "; ".join(clauses))
    return ("Removed at an acceptable clean cost (the clean-model cost's interval includes 0, or the cost is below "
            f"{pct(ACCEPTABLE_COST_SHARE)} of the leak)? " + "; ".join(parts) + ".")


def _removal_words(v: dict, level: float) -> str:
    """`readings.removal_phrase` of one validity row (an intervention setting, or an erasure)."""
    cut = dict(estimate=v["estimate"], ci_low=v["ci_low"], ci_high=v["ci_high"])
    share = dict(estimate=v["share"], ci_low=v["share_ci_low"], ci_high=v["share_ci_high"])
    cost = dict(estimate=v["clean_cost"], ci_low=v["cost_ci_low"], ci_high=v["cost_ci_high"])
    return removal_phrase(str(v["item"]), v["verdict"], cut, share, cost, level)


def _diagnostic_sentence(rows: list[dict], validity: pd.DataFrame, several: bool) -> str | None:
    diag = validity[~validity["kind"].isin(REMOVER_KINDS)] if len(validity) else validity
    if diag.empty:
        return None
    where = {(str(r["condition"]), str(r["diversity"])): _where(r, several) for r in rows}
    parts = []
    for item in dict.fromkeys(diag["item"].astype(str)):
        sub = diag[diag["item"].astype(str) == item]
        by_verdict: dict[str, list[str]] = {}
        for v in sub.to_dict("records"):
            words = v["verdict"] if v["verdict"] != "n/a" else "has no interval"
            by_verdict.setdefault(words, []).append(where.get((str(v["condition"]), str(v["diversity"])), str(v["condition"])))
        parts.append(f"{item}: " + ", ".join(f"{k} in {', '.join(c)}" for k, c in by_verdict.items()))
    return ("Do the diagnostics move with the leak (leak-model minus clean-model, paired by seed)? "
            + "; ".join(parts) + ".")


def _seeds(r: dict) -> str:
    n = 0 if is_nan(r.get("n_seeds")) else int(r["n_seeds"])
    return f"{n} seed{'s' if n != 1 else ''}"


def _evidence_sentence(rows: list[dict], level: float) -> str:
    seeds = [int(r["n_seeds"]) for r in rows if not is_nan(r.get("n_seeds"))]
    n = min(seeds) if seeds else 0
    text = f"The evidence rests on {n} seed{'s' if n != 1 else ''} per condition"
    if n < MIN_CLUSTERS:
        text += f": too few for any interval (an interval needs {MIN_CLUSTERS}), so nothing here is called a leak or ruled out"
    elif n < FEW_SEEDS:
        text += f" (few: fewer than {FEW_SEEDS})"
    bounds = [f"{r['condition']} up to {pp(r['leak_ci_high'])}" for r in rows if r["leak_verdict"] == "no leak"]
    if bounds:
        text += "; 'no leak' means the interval includes 0, not that a leak is ruled out (" + ", ".join(bounds) + " remains compatible)"
    return text + "."


def summary_sentences(rows: pd.DataFrame, validity: pd.DataFrame, level: float = 0.95) -> list[str]:
    """Three to five sentences from `verdict_rows`: the leak per condition with its interval; on
    the pixel-free crops (where measured); what removes it at an acceptable clean cost; whether
    the diagnostics move with it (where run); how much evidence there is."""
    recs = rows.to_dict("records")
    if not recs:
        return ["No leak was estimated: the sweep holds no leak/clean factorial (no prediction with exposure "
                "'leak' or 'clean')."]
    several = rows["diversity"].astype(str).nunique() > 1
    out = [_leak_sentence(recs, several, level), _pixel_free_sentence(recs, several, level),
           _remover_sentence(recs, validity, several, level), _diagnostic_sentence(recs, validity, several),
           _evidence_sentence(recs, level)]
    return [s for s in out if s]


# --- the verdict table (display) -----------------------------------------------------------------

def _cell(estimate, low, high) -> str:
    if is_nan(estimate):
        return "n/a"
    ci = "no interval" if is_nan(low) or is_nan(high) else f"{pp_number(low)} to {pp_number(high)}"
    return f"{pp_number(estimate)} ({ci})"


def verdict_display(rows: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """`verdict_rows` as display strings, one row per condition (and diversity level)."""
    several = rows["diversity"].astype(str).nunique() > 1
    ci = f"pp, {level * 100:.0f}% CI"
    out = []
    for r in rows.to_dict("records"):
        nsp = ("n/a (no boxes)" if not r["pixel_free_verdict"] else
               f"{_cell(r['pixel_free_leak'], r['pixel_free_ci_low'], r['pixel_free_ci_high'])}: {r['pixel_free_verdict']}")
        ok = [intervention_label(i) for i in r["removed_by"].split(";") if i]
        moving = [i for i in r["moving"].split(";") if i]
        n_diag = len(moving) + len([i for i in r["not_moving"].split(";") if i])
        removed = (", ".join(ok) if ok else f"none (of {r['n_removers_tried']})") if r["leak_verdict"] == "leak" else \
            "- (no leak shown)"
        out.append({"condition": _where(r, several), "seeds": "" if is_nan(r["n_seeds"]) else int(r["n_seeds"]),
                    f"leak ({ci})": _cell(r["leak"], r["leak_ci_low"], r["leak_ci_high"]),
                    "verdict": r["leak_verdict"],
                    f"leak on test crops sharing no pixel with a training crop ({ci})": nsp,
                    "removed at an acceptable clean cost by": removed,
                    "diagnostics that move with it": (", ".join(moving) if moving else f"none (of {n_diag})") if n_diag else
                    "- (none run)"})
    return pd.DataFrame(out)


def summary_section(est: pd.DataFrame, validity: pd.DataFrame, pixel_free: pd.DataFrame | None = None,
                    level: float = 0.95) -> tuple[Section, pd.DataFrame]:
    """The report's opening section (sentences, then the verdict table) and its rows
    (`verdict_rows`, written as ``verdicts.csv``)."""
    rows = verdict_rows(est, validity, pixel_free)
    sec = Section("summary", "Summary", reading="\n".join(summary_sentences(rows, validity, level)),
                  table=verdict_display(rows, level) if len(rows) else None)
    sec.notes.append(f"Rules: a leak when its {level * 100:.0f}% interval lies above 0, 'no leak' when it includes 0, no "
                     f"verdict without an interval (fewer than {MIN_CLUSTERS} seeds or test parents); an intervention "
                     f"removes the leak at an acceptable clean cost when its verdict (Validity, below) is 'removed' or 'partly "
                     f"removed' and its cost on clean models has an interval including 0 or is below "
                     f"{pct(ACCEPTABLE_COST_SHARE)} of the leak; a diagnostic moves when its leak-minus-clean interval "
                     f"excludes 0 and reaches 1 point. The pixel-free leak is the same estimand on the test crops sharing no "
                     f"pixel with any training crop of the leak cell (the same crops for both models of a seed).")
    return sec, rows


__all__ = ["ACCEPTABLE_COST_SHARE", "FEW_SEEDS", "VERDICT_COLUMNS", "acceptable_cost", "headline_leaks", "leak_clause",
           "leak_verdict", "summary_section", "summary_sentences", "verdict_display", "verdict_rows"]
