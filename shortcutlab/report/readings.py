"""One-sentence readings of the report's figures, generated from the numbers.

Every number is taken from the estimates table (`shortcutlab.stats.estimates`, fractions) or
from the results rows, and printed in percentage points (pp, one decimal) or percent; an
interval is the table's (95% by default) two-way interval (CGM by default, or the pigeonhole
bootstrap's percentile interval; `shortcutlab.stats.estimates`' `interval`).

The rules, stated once and used everywhere (the validity table's notes are built from
`VERDICT_RULES`, which states the same table in one line per verdict).

**Decided on the numbers as printed.** Every comparison below is made on the value as the
report prints it (pp with one decimal, `units.pp_shown`; shares in whole percent,
`units.pct_shown`), so two rows that print alike always read alike: an interval printed
"-0.1 to +0.0" includes zero whatever the digits behind it.

**The leak** (leak minus clean accuracy, `leak_status`, worded by `leak_phrase` and
`leak_words`):

==============  ===============================  ===========================================
status          when                             words
==============  ===============================  ===========================================
leak            interval above 0                 "the leak is +13.0 pp (95% CI ...)"
no leak         interval includes 0              "..., not distinguishable from zero"
negative        interval below 0                 "...: the clean models score higher than
                                                 the leak models" (never "no leak")
no interval     estimate, no interval            "the leak is +10.0 pp (no interval: why)":
                (one seed, too few parents)      neither a leak nor "no leak"
no estimate     no estimate                      "the leak could not be estimated (why)"
==============  ===============================  ===========================================

**An intervention on the leak** (`removal_verdict`): the cut is leak on unaltered crops minus
leak under the intervention, the share removed is cut / leak, the clean cost is the
intervention's accuracy cost on clean models (positive = a loss, negative = a gain). The first
rule that holds gives the verdict:

==  ==============  ============================================================================
#   verdict         when
==  ==============  ============================================================================
0   no change       cut, both ends of its interval and the clean cost all print 0.0 (or the cut
                    and cost print 0.0 and the cut has no interval while the leak has one:
                    the statistics give none where no resample varies): the intervention
                    changed no accuracy, e.g. background removal on already masked
                    backgrounds; it says nothing about the leak, whatever the leak is
1   unclear         the leak has no interval (or no estimate)
2   no leak         the leak's status is ``no leak`` or ``negative``: there is nothing to
                    remove, and the intervention is not read against it ("no leak to
                    remove"), whatever its cost
3   uninformative   (a leak, interval above 0, from here on) the clean cost exceeds the leak
                    (point estimates): the intervention damages the crops more than the leak is
                    worth, so its cut says little. A negative cost (a gain) never does
4   unclear         the cut has no interval
5   removed         the cut's interval lies above 0 and the share removed is at least 50%
    partly removed  the cut's interval lies above 0 and the share is below 50% (or unknown)
6   increased       the cut's interval lies below 0: the leak grows under the intervention
7   not removed     otherwise: the cut's interval includes 0
==  ==============  ============================================================================

**The share of the leak removed** is stated only where the leak is a leak (status ``leak``):
elsewhere it divides by a leak that may be zero or negative ("187% (-200% to 867%)") and is
left blank with the reason (`share_note`).

**A diagnostic moving with the leak** (`moves_verdict`), on its leak-minus-clean
difference, paired by seed, on its own 0-1 scale (R, the Grad-CAM outside mass) printed in
points:

================  ===========================================================================
verdict           when
================  ===========================================================================
n/a               no interval (too few seeds, or the seeds' values do not vary)
does not move     the interval includes 0 (as printed)
moves negligibly  the interval excludes 0 but both ends lie within 1 point (0.01) of it
moves             the interval excludes 0 and one end reaches 1 point
================  ===========================================================================

**Other readings.**

- **The dose-response slope** (the models' leak gap on R, per 0.1 of R) is given with its
  seed-bootstrap interval only where the points can carry one (`slope_interval_problem`):
  three seeds or more (with two, half the resamples hold one seed and have no slope, and the
  rest repeat the estimate); R at three or more distinct values (to 0.01); R spread over at
  least 0.1 (the unit the slope is stated per; a narrower spread extrapolates); and no gap
  between neighbouring R values wider than half the spread (two separated clumps: the slope
  is a line between them). Otherwise the slope is stated with "no interval" and why.
- **Grad-CAM's randomised-head check passes** when the median Spearman correlation between
  the trained and the randomised-head maps is below 0.5 (the maps change when the head
  does); it is **undefined**, not passed, when more than half of the randomised-head maps
  are constant (or rho is undefined for more than half of the crops); the outside mass is
  said to match a randomised head's when the two means differ by less than 5 pp, and maps
  under 8 x 8 cells are called too coarse to tell the cell from its background. With a
  ``none`` control in the sweep, the outside mass is given per condition and against none's:
  a mechanism that moves it moves it in leak and clean models alike (both learn it).
"""

from __future__ import annotations

import pandas as pd

from shortcutlab.stats import get_estimand
from shortcutlab.stats.dose import slope_interval_problem
from shortcutlab.stats.estimands import leak_status
from shortcutlab.stats.hypotheses import HYPOTHESES
from shortcutlab.stats.units import ci_pct, ci_pp, is_nan, pct, pct_shown, pp, pp_number, pp_shown

#: How the report names the unaltered crops (setting "none"); interventions name themselves
#: with their class's `label` (`intervention_label`).
NONE_LABEL = "the unaltered crops"

REMOVED_SHARE = 0.5      # "removed" from this share of the leak up (with the cut's interval above 0)
NEGLIGIBLE = 0.01        # a diagnostic "moves" when its interval reaches this far from 0 (1 point)
HEAD_CHECK_RHO = 0.5     # Grad-CAM maps "change with the head" below this median Spearman rho
SAME_MASS = 0.05         # outside mass "the same as a randomised head's" within this difference


_nan, _num = is_nan, pp_number  # the units' formatting (shortcutlab.stats.units), as this module names it


def diagnostic_class(name: str):
    """The diagnostic class registered as `name` (`probes.get_class`), or None when none is."""
    import probes

    try:
        return probes.get_class(name)
    except probes.DiagnosticError:
        return None


def suppliers(quantity: str) -> list[tuple[str, str]]:
    """``(name, metric)`` of every registered diagnostic that supplies `quantity`, sorted by
    name (`probes.suppliers`; the quantities are `probes.QUANTITIES`)."""
    import probes

    return probes.suppliers(quantity)


def supplier_label(quantity: str) -> str:
    """How the report names the diagnostic that supplies `quantity` when the results do not
    say which: the label of the first registered supplier (`suppliers`), '' when none is."""
    found = suppliers(quantity)
    return diagnostic_label(found[0][0]) if found else ""


def diagnostic_label(name: str, metric: str | None = None) -> str:
    """How the report names a diagnostic ('parent probe'), or one of its metrics with it
    ('Grad-CAM outside mass'): its class's `display_label` and `metric_label`; an unregistered
    name with spaces for underscores."""
    cls = diagnostic_class(name)
    label = cls.display_label() if cls is not None else name.replace("_", " ")
    if metric is None:
        return label
    return f"{label} {cls.metric_label(metric) if cls is not None else metric.replace('_', ' ')}"


def intervention_label(setting: str) -> str:
    """'low_pass:sigma=2.0' -> 'low-pass blur (sigma=2.0)': the registered class's `label`
    (`interventions.display_label`); names that are not registered are kept, with spaces for
    underscores."""
    import interventions

    name, _, params = str(setting).partition(":")
    if name == "none":
        text = NONE_LABEL
    elif name in interventions.available():
        text = interventions.display_label(interventions.get_class(name))
    else:
        text = name.replace("_", " ")
    return f"{text} ({params})" if params else text


#: The verdicts, one line each: the rule table of the module docstring, for the report's notes.
VERDICT_RULES: dict[str, str] = {
    "no change": "cut, its interval and the clean-model cost all 0.0 pp: the intervention changed no accuracy",
    "unclear": "the leak (or the cut) has no interval",
    "no leak": "the leak's interval includes 0 or lies below it: nothing to remove",
    "uninformative": "against a leak (interval above 0): its clean-model cost exceeds the leak",
    "removed": "cut's interval above 0 and share removed >= 50%",
    "partly removed": "cut's interval above 0, share < 50%",
    "increased": "cut's interval below 0: the leak grows",
    "not removed": "cut's interval includes 0",
    "moves": "a diagnostic's leak-minus-clean interval excludes 0 and reaches 1 point",
    "moves negligibly": "excludes 0 but stays within 1 point of it",
    "does not move": "its interval includes 0",
    "n/a": "no interval",
}

#: How `leak_words` names each `leak_status`.
LEAK_WORDS = {"leak": "a leak", "no leak": "no leak (its interval includes 0)",
              "negative": "the clean models score higher", "no interval": "no interval (too few seeds or parents)",
              "no estimate": "no estimate"}


def verdict_notes() -> str:
    """The verdicts and their rules in one sentence (`VERDICT_RULES`), for a table's notes."""
    return ("Verdicts, decided on the numbers as printed: "
            + "; ".join(f"'{k}' ({v})" for k, v in VERDICT_RULES.items()) + ".")


def _shown_excludes_zero(lo, hi) -> bool:
    return not (_nan(lo) or _nan(hi)) and (pp_shown(lo) > 0 or pp_shown(hi) < 0)


# --- leak and interventions ------------------------------------------------------------------

def leak_phrase(row, level: float = 0.95) -> str:
    """'the leak is +13.0 pp (95% CI +9.1 to +16.8 pp)', with the caveats of the rules: the
    reading registered with the ``leak`` estimand (`shortcutlab.stats.get_estimand`)."""
    return get_estimand("leak").read(row, level)


def leak_words(row) -> str:
    """What a leak row is, in a few words ('a leak', 'the clean models score higher',
    ...): `LEAK_WORDS` of its `leak_status` (row: a mapping with estimate, ci_low, ci_high)."""
    return LEAK_WORDS[leak_status(row["estimate"], row["ci_low"], row["ci_high"])]


def share_note(leak: float, leak_low: float, leak_high: float) -> str:
    """'' where a share of this leak removed is stated (the leak's interval lies above 0);
    otherwise why it is not, e.g. 'no share: no leak'."""
    status = leak_status(leak, leak_low, leak_high)
    return "" if status == "leak" else f"no share: {LEAK_WORDS[status]}"


def removal_verdict(cut: float, cut_low: float, cut_high: float, share: float, leak: float, leak_low: float,
                    leak_high: float, clean_cost: float) -> str:
    """The verdict of one intervention on one leak (see the module docstring for the rules).

    Args:
        cut, cut_low, cut_high: the leak cut and its interval (fractions).
        share: the share of the leak removed (cut / leak).
        leak, leak_low, leak_high: the leak under the unaltered crops and its interval.
        clean_cost: the intervention's accuracy cost on clean models (fraction; positive = a loss).

    Returns:
        One of 'no change', 'unclear', 'no leak', 'uninformative', 'removed', 'partly removed',
        'increased', 'not removed'.
    """
    cut_s, lo_s, hi_s, cost_s = pp_shown(cut), pp_shown(cut_low), pp_shown(cut_high), pp_shown(clean_cost)
    status = leak_status(leak, leak_low, leak_high)
    no_spread = (lo_s == 0 and hi_s == 0) or (_nan(cut_low) and _nan(cut_high) and not _nan(leak_low))
    if cut_s == 0 and no_spread and cost_s == 0:
        return "no change"
    if status in ("no interval", "no estimate"):
        return "unclear"
    if status in ("no leak", "negative"):
        return "no leak"
    if not _nan(cost_s) and cost_s > pp_shown(leak):
        return "uninformative"
    if _nan(cut_low) or _nan(cut_high):
        return "unclear"
    if lo_s > 0:
        return "removed" if not _nan(share) and pct_shown(share) >= 100 * REMOVED_SHARE else "partly removed"
    if hi_s < 0:
        return "increased"
    return "not removed"


def removal_phrase(setting: str, verdict: str, cut: dict, share: dict, cost: dict, level: float = 0.95) -> str:
    """One clause per intervention, e.g. 'Reinhard transfer to an unseen field removes 70% of it
    (CI 45% to 95%)'. `cut`, `share`, `cost`: the estimate rows (estimate, ci_low, ci_high)."""
    name = intervention_label(setting)
    if verdict == "uninformative":
        return (f"{name} is uninformative (it costs clean models {pp(cost['estimate'], signed=False)}, more than the "
                f"leak)")
    if verdict == "no leak":
        return f"{name}: no leak to remove"
    if verdict == "no change":
        return (f"{name} changes no accuracy here (cut and clean-model cost 0.0 pp: it leaves these crops as they were), "
                "so it says nothing about the leak")
    cut_text = f"{pp(cut['estimate'])}, {ci_pp(cut['ci_low'], cut['ci_high'], level)}"
    if verdict == "removed":
        return f"{name} removes {pct(share['estimate'])} of it ({ci_pct(share['ci_low'], share['ci_high'])})"
    if verdict == "partly removed":
        return f"{name} removes part of it ({pct(share['estimate'])}; {cut_text})"
    if verdict == "increased":
        return f"{name} makes it larger (cut {cut_text})"
    if verdict == "unclear":
        if _nan(cut["ci_low"]) or _nan(cut["ci_high"]):
            return f"{name} cuts it by {pp(cut['estimate'])} (no interval)"
        return f"{name} cuts it by {cut_text} (not read: the leak has no interval)"
    return f"{name} does not remove it (cut {cut_text})"


def _where(condition: str, diversity: str, arch: str) -> str:
    parts = [str(condition)]
    if diversity and diversity != "high-low":
        parts.append(f"{diversity} diversity")
    if arch == "pooled":
        parts.append("pooled over architectures")
    elif arch:
        parts.append(str(arch))
    return ", ".join(parts)


def headline_arch(est: pd.DataFrame, condition: str) -> str | None:
    """The architecture of a condition's headline rows: 'pooled' where present, else the only one."""
    archs = set(est.loc[(est["estimand"] == "leak") & (est["condition"] == condition), "arch"].astype(str))
    if "pooled" in archs:
        return "pooled"
    archs.discard("")
    return sorted(archs)[0] if archs else None


def intervention_rows(est: pd.DataFrame, condition: str, diversity: str, arch: str) -> list[dict]:
    """Per intervention setting: {'setting', 'cut', 'share', 'cost', 'verdict'} (rows as dicts),
    sorted by setting; empty when the estimates hold no intervention rows there."""
    sel = est[(est["condition"] == condition) & (est["diversity"] == diversity) & (est["arch"] == arch)]
    leak = sel[(sel["estimand"] == "leak") & (sel["intervention"] == "none")]
    if leak.empty:
        return []
    leak = leak.iloc[0]
    out = []
    for setting in sorted(set(sel.loc[sel["estimand"] == "leak_cut", "intervention"])):
        rows = {e: sel[(sel["estimand"] == e) & (sel["intervention"] == setting)] for e in ("leak_cut", "share_removed", "clean_cost")}
        if any(r.empty for r in rows.values()):
            continue
        cut, share, cost = (rows[e].iloc[0].to_dict() for e in ("leak_cut", "share_removed", "clean_cost"))
        verdict = removal_verdict(cut["estimate"], cut["ci_low"], cut["ci_high"], share["estimate"], leak["estimate"],
                                  leak["ci_low"], leak["ci_high"], cost["estimate"])
        out.append(dict(setting=setting, cut=cut, share=share, cost=cost, verdict=verdict))
    return out


def leak_reading(est: pd.DataFrame, condition: str, diversity: str, arch: str | None = None, level: float = 0.95) -> str:
    """The forest plot's sentence for one condition and diversity level, e.g. 'color, high
    diversity: the leak is +13.0 pp (95% CI +9.1 to +16.8 pp); Reinhard transfer to an unseen
    field removes 70% of it (CI 45% to 95%); background removal does not remove it (cut
    +0.5 pp, 95% CI -1.0 to +2.0 pp).'

    Args:
        est: the estimates table.
        condition, diversity: which leak.
        arch: which architecture row (default: `headline_arch`).
    """
    arch = headline_arch(est, condition) if arch is None else arch
    sel = est[(est["estimand"] == "leak") & (est["condition"] == condition) & (est["diversity"] == diversity)
              & (est["arch"] == arch) & (est["intervention"] == "none")]
    if sel.empty:
        return f"{_where(condition, diversity, arch or '')}: no leak estimate."
    row = sel.iloc[0]
    clauses = [leak_phrase(row, level)]
    inter = intervention_rows(est, condition, diversity, arch)
    if inter and all(r["verdict"] == "no leak" for r in inter):
        clauses.append("the interventions are not read against it")
    else:
        clauses += [removal_phrase(r["setting"], r["verdict"], r["cut"], r["share"], r["cost"], level) for r in inter]
    return f"{_where(condition, diversity, arch)}: " + "; ".join(clauses) + "."


# --- accuracy, dose-response, Grad-CAM -------------------------------------------------------------

def accuracy_reading(per_model: pd.DataFrame, est: pd.DataFrame | None = None, level: float = 0.95,
                     chance: dict | None = None) -> str:
    """The accuracy figure's sentence: the best and worst group mean, chance, and the protocol
    effect.

    Args:
        per_model: one row per model with `group` (protocol or cell), `arch`, `condition` and
            `accuracy` (fraction).
        est: the estimates table, for ``protocol`` rows (P1 - P2) where present.
        chance: per condition, the accuracy of always answering the largest class (its share of
            the test crops; `figures.chance_levels`), drawn as the dashed line.
    """
    if per_model.empty:
        return "No model was scored on unaltered crops."
    g = per_model.groupby(["condition", "group", "arch"])["accuracy"].agg(["mean", "size"]).reset_index()
    hi, lo = g.loc[g["mean"].idxmax()], g.loc[g["mean"].idxmin()]

    def name(r):
        return f"{r['group']} ({r['arch']}, {r['condition']})"

    text = (f"Over {len(per_model)} models, mean test accuracy on unaltered crops ranges from {pct(lo['mean'])} "
            f"({name(lo)}, {int(lo['size'])} model{'s' if lo['size'] != 1 else ''}) to {pct(hi['mean'])} ({name(hi)}, "
            f"{int(hi['size'])} model{'s' if hi['size'] != 1 else ''})")
    if chance:
        levels = sorted(set(pct(v) for v in chance.values()))
        text += (f"; chance (always the largest class) is {levels[0]}" if len(levels) == 1 else
                 "; chance (always the largest class) is " + ", ".join(f"{pct(v)} in {c}" for c, v in sorted(chance.items())))
    if est is not None and not est.empty:
        prot = est[(est["estimand"] == "protocol") & est["estimate"].notna()]
        prot = prot[(prot["arch"] == "pooled") | ~prot["condition"].isin(prot.loc[prot["arch"] == "pooled", "condition"])]
        parts = [get_estimand("protocol").read(r, level) for _, r in prot.sort_values("condition").iterrows()]
        if parts:
            text += "; the crop-level split (P1) minus the parent-disjoint split (P2) is " + ", ".join(parts)
    return text + "."


def dose_reading(pairs: pd.DataFrame, slopes: pd.DataFrame | None = None, level: float = 0.95, rank: str = "",
                 erasure: str | None = None) -> str:
    """The R-versus-gap figure's sentence.

    Args:
        pairs: one row per leak/clean pair with `R`, `gap`, and optionally `R_after` and
            `gap_after` (erasure, refitted heads) and `gap_source` ('models' or 'refitted heads').
        slopes: the estimates' ``slope`` rows (gap on R), per condition.
        rank: the erasure's rank setting, for the text.
        erasure: how the text names the erasure (None: `supplier_label` of
            "recoverability_after_erasure", e.g. 'LEACE').
    """
    if pairs.empty:
        return "No leak/clean pair has a parent-recoverability R."
    text = (f"Over {len(pairs)} leak/clean pair{'s' if len(pairs) != 1 else ''}, the leak models' R averages "
            f"{pairs['R'].mean():.3f}")
    if "R_after" in pairs and pairs["R_after"].notna().any():
        ok = pairs.dropna(subset=["R_after"])
        erasure = supplier_label("recoverability_after_erasure") if erasure is None else erasure
        text += f" before and {ok['R_after'].mean():.3f} after {(erasure + ' ' + rank).strip()} erasure"
        if "gap_after" in ok and ok["gap_after"].notna().any():
            ok = ok.dropna(subset=["gap_after"])
            text += (f", while the gap of refitted heads goes from {pp(ok['gap_before'].mean())} to "
                     f"{pp(ok['gap_after'].mean())}")
    if slopes is not None and not slopes.empty:
        parts = [_slope_words(r, pairs[pairs["condition"].astype(str) == str(r["condition"])], level)
                 for _, r in slopes.sort_values("condition").iterrows()]
        text += "; the models' leak gap's slope on R is " + "; ".join(parts)
    return text + "."


def _slope_words(row, points: pd.DataFrame, level: float) -> str:
    """One condition's slope: the estimand's reading, or, where `slope_interval_problem` finds
    its interval meaningless, the slope with 'no interval' and why."""
    why = slope_interval_problem(points["R"], points["seed"]) if len(points) else ""
    if not why or _nan(row["estimate"]) or (_nan(row["ci_low"]) and row.get("reason")):
        return get_estimand("slope").read(row, level)
    return f"{row['condition']}: {pp(row['estimate'] * 0.1)} per 0.1 of R (no interval: {why})"


UNDEFINED_SHARE = 0.5    # the randomised-head check is "undefined" when more than this share of maps is constant
COARSE_CELLS = 8         # a saliency layer under this many cells a side "is coarse": the reading says so


def head_check_verdict(summary: dict) -> str:
    """The randomised-head check's verdict from `gradcam_summary`'s dict: 'undefined: N of M
    randomised-head maps are constant' (more than `UNDEFINED_SHARE` of them; or 'undefined:
    rho is undefined for N of M crops' where the trained maps are the constant ones), else
    'passes' (median rho below `HEAD_CHECK_RHO`) or 'fails'; 'n/a' without a rho or a count."""
    m = summary.get("maps")
    const, undefined = summary.get("randomized_constant_maps"), summary.get("randomized_undefined")
    if m:
        if const is not None and const / m > UNDEFINED_SHARE:
            return f"undefined: {const} of {m} randomised-head maps are constant"
        if undefined is not None and undefined / m > UNDEFINED_SHARE:
            return f"undefined: rho is undefined for {undefined} of {m} crops (a constant map)"
    rho = summary.get("randomized_head_spearman")
    if _nan(rho):
        return "n/a"
    return "passes" if rho < HEAD_CHECK_RHO else "fails"


def _outside_by_condition(by: dict) -> str:
    """The outside mass per condition and exposure, and against ``none`` where it is there:
    'Grad-CAM puts 74% (leak models) and 75% (clean models) of the attribution outside the
    cell under color, 70% and 71% under none; against none: +4.0 pp and +4.0 pp under color'."""
    texts = []
    for i, (cond, v) in enumerate(by.items()):
        if not v:
            texts.append(f"nothing under {cond}")
            continue
        if i == 0:
            shares = " and ".join(f"{pct(x)} ({e} models)" for e, x in v.items())
        else:
            shares = " and ".join(pct(x) for x in v.values())
        texts.append(f"{shares} under {cond}")
    text = "Grad-CAM puts " + texts[0].replace(" under ", " of the attribution outside the cell under ", 1)
    text += "".join(", " + t for t in texts[1:])
    control = by.get("none")
    diffs = []
    for cond, v in by.items():
        d = [pp(x - control[e]) for e, x in v.items() if control and cond != "none" and e in control]
        if d:
            diffs.append(f"{' and '.join(d)} under {cond}")
    if diffs:
        text += ("; against none: " + ", ".join(diffs) + " (leak and clean models train on the same mechanism and "
                 "learn it alike, so where it moves the mass it moves both, and leak and clean need not differ)")
    return text


def gradcam_reading(summary: dict) -> str:
    """The Grad-CAM figure's sentence, from `figures.gradcam_summary`'s dict (fractions, rhos,
    counts of constant maps, the saliency layer's cells)."""
    if not summary:
        return "No Grad-CAM rows."
    parts = []
    cells = summary.get("cam_cells")
    if cells and min(cells) < COARSE_CELLS:
        parts.append(f"the maps are at {cells[0]} x {cells[1]} cells of the saliency layer, upsampled to the crop, too coarse "
                     "to tell the cell from its background")
    om = summary.get("outside_mass", {})
    by = summary.get("outside_mass_by_condition") or {}
    if len(by) > 1 or om:
        if len(by) > 1:
            parts.append(_outside_by_condition(by))
        else:
            who = [f"{pct(v)} in {k} models" for k, v in om.items()]
            who = who[0] if len(who) == 1 else ", ".join(who[:-1]) + " and " + who[-1]
            parts.append(f"Grad-CAM puts {who.replace(' in ', ' of the attribution outside the cell in ', 1)}")
        rom = summary.get("randomized_outside_mass")
        if not _nan(rom):
            same = all(abs(v - rom) < SAME_MASS for v in om.values())
            parts[-1] += (f"; a randomised head gives {pct(rom)}"
                          + (", about the same, so the outside mass says little here" if same else ""))
    rho, pair = summary.get("randomized_head_spearman"), summary.get("random_pair_spearman")
    verdict = head_check_verdict(summary)
    if verdict.startswith("undefined"):
        parts.append(f"the randomised-head check is {verdict}, so it says nothing here")
    elif not _nan(rho):
        verdict = ("the maps change when the head is randomised (the check passes)" if verdict == "passes"
                   else "the maps barely change when the head is randomised (the check fails)")
        base = f" against {pair:.2f} between random pairs of crops" if not _nan(pair) else ""
        parts.append(f"trained and randomised-head maps correlate at median rho {rho:.2f}{base}: {verdict}")
    if parts and parts[0][:1].islower():
        parts[0] = parts[0][0].upper() + parts[0][1:]
    return "; ".join(parts) + "." if parts else "No Grad-CAM rows."


def moves_verdict(low: float, high: float, negligible: float = NEGLIGIBLE) -> str:
    """'moves' (interval excludes 0 and reaches `negligible`), 'moves negligibly' (excludes 0,
    but lies within `negligible` of it), 'does not move', or 'n/a' (no interval); decided on
    the ends as printed (points with one decimal), so '-0.1 to +0.0' does not move."""
    if _nan(low) or _nan(high):
        return "n/a"
    if not _shown_excludes_zero(low, high):
        return "does not move"
    return "moves" if max(abs(pp_shown(low)), abs(pp_shown(high))) >= pp_shown(negligible) else "moves negligibly"


def registered_reading(table: pd.DataFrame, alpha: float = 0.05) -> str:
    """The registered tests in one or two sentences, from `registered_table`'s display rows:
    'Rejected at a family-wise 5% (Holm within each registered family): H1 (crc), H3 (crc).
    Not rejected: F2 (crc, greyscale).'"""
    def name(r):       # a cut names its intervention, a retrained factorial its recipe: the test's (...) or [...]
        setting = r["test"][len(HYPOTHESES.get(r["hypothesis"], "")):].strip()
        setting = setting[1:-1] if setting[:1] in "([" and setting[-1:] in ")]" else setting
        return f"{r['hypothesis']} ({r['condition']}{', ' + setting if setting else ''})"

    done = table[table["reject"] != ""]
    yes = [name(r) for r in done.to_dict("records") if r["reject"] == "yes"]
    no = [name(r) for r in done.to_dict("records") if r["reject"] == "no"]
    untested = [name(r) for r in table.to_dict("records") if r["reject"] == ""]
    parts = [f"Rejected at a family-wise {alpha:.0%} (Holm within each registered family): "
             f"{', '.join(yes) if yes else 'none'}."]
    if no:
        parts.append(f"Not rejected: {', '.join(no)}.")
    if untested:
        parts.append(f"No test (no interval): {', '.join(untested)}.")
    return " ".join(parts)
