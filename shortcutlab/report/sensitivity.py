"""The report's "Sensitivity analyses" section: beside each primary estimate, the sign-flip test
over seeds, the t on per-seed differences and the binomial mixed model
(`shortcutlab.stats.sensitivity`), as the paper's table lists them."""

from __future__ import annotations

import math

import pandas as pd

from shortcutlab.report.figures import Section, left_out
from shortcutlab.report.readings import intervention_label
from shortcutlab.stats.sensitivity import sensitivity_summary, sensitivity_table
from shortcutlab.stats.units import is_nan, pp

__all__ = ["sensitivity_display", "sensitivity_section"]

KEY, TITLE = "sensitivity", "Sensitivity analyses"


def _p(v) -> str:
    """A p-value for the table: '' when there is none, '<0.0001' below."""
    if is_nan(v):
        return ""
    return "<0.0001" if v < 1e-4 else f"{v:.4f}"


def sensitivity_display(summary: pd.DataFrame) -> pd.DataFrame:
    """`sensitivity_summary`'s rows as display strings: where (condition, diversity level, the
    intervention by its registered label), the estimate in pp, the p-values, t with its df, the
    mixed model's log-odds, and the notes (why an analysis has no result)."""
    rows = []
    for r in summary.to_dict("records"):
        parts = [str(r["condition"]), str(r["diversity"]), intervention_label(r["intervention"])]
        where = ", ".join(p for p in parts if p not in ("", "nan"))
        rows.append({"estimand": r["estimand"], "where": where, "arch": r["arch"], "estimate": pp(r["estimate"]),
                     "p bootstrap": _p(r["p_bootstrap"]), "p sign-flip": _p(r["p_sign_flip"]),
                     "t (df)": "" if is_nan(r["t"]) else f"{r['t']:+.2f} ({r['df']:.1f})", "p t": _p(r["p_t"]),
                     "GLMM log-odds": "" if is_nan(r["glmm_log_odds"]) else f"{r['glmm_log_odds']:+.3f}",
                     "p GLMM": _p(r["p_glmm"]), "notes": r["notes"]})
    return pd.DataFrame(rows)


def sensitivity_summary_of(pred: pd.DataFrame, est: pd.DataFrame, seed: int = 0, baseline: str = "none") -> pd.DataFrame:
    """`sensitivity_summary` of the sweep's predictions beside its estimates (computed once for
    the registered tests' table and this section)."""
    return sensitivity_summary(sensitivity_table(pred, baseline=baseline, seed=seed), est)


def sensitivity_section(pred: pd.DataFrame, est: pd.DataFrame, seed: int = 0, baseline: str = "none",
                        summary: pd.DataFrame | None = None) -> Section:
    """The section: one table row per primary estimate (the leak pooled over architectures per
    diversity level and pooled over levels, the leak cut of each intervention, the protocol
    effect), with a reading that says how many of them every analysis rejects at 0.05.
    `summary`: `sensitivity_summary_of` made already (computed here when None)."""
    if summary is None:
        summary = sensitivity_summary_of(pred, est, seed, baseline)
    if summary.empty:
        return left_out(KEY, TITLE, "the sweep holds no primary estimate (no factorial and no protocol pair)")
    cols = ["p_bootstrap", "p_sign_flip", "p_t", "p_glmm"]
    agree = int(summary[cols].lt(0.05).all(axis=1).sum())
    tested = int(summary[cols].notna().all(axis=1).sum())
    reading = (f"{len(summary)} primary estimate(s); {agree} of the {tested} with every analysis at p < 0.05 by all of "
               f"them. Sign-flip: randomisation over seeds (exact up to 16 seeds); t: on per-seed differences, S - 1 df "
               f"in the balanced design (what Satterthwaite and Kenward-Roger give), a Satterthwaite df otherwise; "
               f"GLMM: binomial mixed model with crossed seed and parent random intercepts, log-odds scale, "
               f"variational posterior z.")
    notes = []
    if math.isfinite(summary["df"].min()) and summary["df"].min() < 2:
        notes.append("With two seeds the t has 1 df and the exact sign-flip p cannot fall below 0.5.")
    return Section(KEY, TITLE, reading=reading, table=sensitivity_display(summary), notes=notes)
