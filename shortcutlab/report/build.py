"""`build_report`: read a sweep folder, estimate, draw, and write the report as one set."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pandas as pd

from shortcutlab.io import OutputError, atomic_dir, claim_output_dir
from shortcutlab.report import readings as rd
from shortcutlab.report.figures import Section, accuracy_section, dose_section, examples_section, forest_section, gradcam_section, left_out
from shortcutlab.report.folder import ReportError, SweepFolder
from shortcutlab.report.pixel_free import pixel_free_crops, pixel_free_leak
from shortcutlab.report.render import to_html, to_markdown
from shortcutlab.report.sensitivity import sensitivity_section, sensitivity_summary_of
from shortcutlab.report.summary import summary_section
from shortcutlab.report.tables import audit_card, dose_pairs, registered_table, validity_table
from shortcutlab.stats.bootstrap import MIN_CLUSTERS
from shortcutlab.stats.units import format_interval, format_value, is_nan, pp_number

TITLE = "shortcutlab report"


def _ci(lo, hi, unit="pp") -> str:
    if is_nan(lo) or is_nan(hi):
        return "no interval"
    if unit == "%":
        return f"{rd.pct(lo)} to {rd.pct(hi)}"
    return f"{pp_number(lo)} to {pp_number(hi)}"


def validity_display(table: pd.DataFrame) -> pd.DataFrame:
    """The validity table as display strings (pp and %)."""
    rows = []
    for r in table.itertuples(index=False):
        item = rd.intervention_label(r.item) if r.kind == "intervention" else r.item
        rows.append({
            "condition": r.condition, "diversity": r.diversity, "arch": r.arch,
            "leak (pp, CI)": f"{pp_number(r.leak)} ({_ci(r.leak_ci_low, r.leak_ci_high)})",
            "intervention / diagnostic": item,
            "effect (pp, CI)": f"{pp_number(r.estimate)} ({_ci(r.ci_low, r.ci_high)})" if not is_nan(r.estimate) else "n/a",
            "share of leak removed (CI)": _share_cell(r),
            "clean-model cost (pp, CI)": (f"{pp_number(r.clean_cost)} ({_ci(r.cost_ci_low, r.cost_ci_high)})"
                                          if not is_nan(r.clean_cost) else ""),
            "verdict": r.verdict,
        })
    return pd.DataFrame(rows)


def _share_cell(r) -> str:
    """The share removed with its interval; where the leak is not a leak, why none is shown
    (`readings.share_note`); '' for a row without a share (a diagnostic)."""
    if not is_nan(r.share):
        return f"{rd.pct(r.share)} ({_ci(r.share_ci_low, r.share_ci_high, '%')})"
    if r.kind in ("intervention", "erasure"):
        return rd.share_note(r.leak, r.leak_ci_low, r.leak_ci_high)
    return ""


def validity_section(est: pd.DataFrame, results: pd.DataFrame | None, n_boot: int, seed: int, level: float) -> tuple[Section, pd.DataFrame]:
    key, title = "validity", "Validity: what each intervention and diagnostic does to the leak"
    table = validity_table(est, results, n_boot=n_boot, seed=seed, level=level)
    if table.empty:
        return left_out(key, title, "the estimates hold no leak (no factorial, or no estimate)"), table
    sec = Section(key, title, reading=validity_reading(table), table=validity_display(table))
    sec.notes.append("Effects are leak minus clean, in pp; an intervention's effect is the leak cut (leak on unaltered "
                     "crops minus leak under it); the share of the leak removed is shown only where the leak's interval "
                     "lies above 0.")
    sec.notes.append(rd.verdict_notes())
    return sec, table


def validity_reading(table: pd.DataFrame) -> str:
    """The validity section's sentence: the intervention verdicts counted, then each
    diagnostic's verdicts per condition: R first, the diagnostics' leak metrics (named by
    their classes: 'the Grad-CAM outside mass'), the erasure last."""
    parts = []
    inter = table[table["kind"] == "intervention"]
    if len(inter):
        v = inter["verdict"].value_counts()
        parts.append("Of " + f"{len(inter)} intervention reading{'s' if len(inter) != 1 else ''}: "
                     + ", ".join(f"{n} {k}" for k, n in v.items()))
    diag = table[table["kind"] != "intervention"]
    groups = sorted(dict.fromkeys(zip(diag["kind"], diag["item"])), key=lambda g: {"R": 0, "erasure": 2}.get(g[0], 1))
    for kind, item in groups:
        sub = diag[(diag["kind"] == kind) & (diag["item"] == item)]
        parts.append(f"{_diagnostic_phrase(kind, item)}: "
                     + ", ".join(f"{r.condition} ({r.diversity}) {_verdict_words(r.verdict, r.n_seeds)}"
                                 for r in sub.itertuples()))
    return "; ".join(parts) + "." if parts else ""


def _verdict_words(verdict: str, n_seeds) -> str:
    """A diagnostic's verdict in the reading; 'n/a' (no interval) says why: too few seeds."""
    if verdict != "n/a":
        return verdict
    n = int(n_seeds) if not is_nan(n_seeds) else 0
    return (f"has no interval ({n} seed{'s' if n != 1 else ''}; an interval needs {MIN_CLUSTERS})" if n < MIN_CLUSTERS
            else "has no interval (the seeds' values do not vary)")


def _diagnostic_phrase(kind: str, item: str) -> str:
    """How the validity reading names a diagnostic row: R by the metric label of the
    "recoverability" supplier its item names, the erasure by the label of the erasure's
    supplier ('LEACE erasure'), a leak metric by its item ('the Grad-CAM outside mass')."""
    if kind == "R":
        for name, metric in rd.suppliers("recoverability"):
            if item.startswith(rd.diagnostic_label(name, metric) + " ("):
                return rd.diagnostic_class(name).metric_label(metric)
        return "R"
    if kind == "erasure":
        names = [n for n, _ in rd.suppliers("head_accuracy_before_erasure") if item.startswith(rd.diagnostic_label(n) + " ")]
        return f"{rd.diagnostic_label(names[0]) if names else item.split(' ')[0]} erasure"
    return f"the {item}"


def audit_section(folder: SweepFolder, results: pd.DataFrame | None) -> Section:
    """The audit card: per condition (one seed's benchmark and split) the data in one sentence,
    and a row per cell a model was trained on (a factorial's cells that no model trained are
    left out: they describe nothing the report measures)."""
    key, title = "audit", "Audit card of the data"
    refs = folder.benchmarks()
    if not refs:
        return left_out(key, title, "no benchmark and split of the sweep are on disk (tasks/split/<id>/ with its manifest)")
    trained: dict[str, set] = {}
    for m in folder.models():
        if m.cell:      # a model listed without its cell (an older sweep.json) leaves its condition's cells all shown
            trained.setdefault(m.condition, set()).add(m.cell)
    rows, notes, sentences = [], [], []
    for cond, ref in sorted(refs.items()):
        try:
            card = audit_card(ref.manifest, ref.split, ref.columns, ref.geometry, results, cells=trained.get(cond))
        except Exception as e:  # noqa: BLE001 - one benchmark's failure is named, the rest shown
            notes.append(f"{cond}: the audit failed ({' '.join(str(e).split())[:200]}).")
            continue
        rows += _audit_rows(cond, ref.seed, card)
        sentences.append((cond, _audit_sentence(card)))
    if not rows:
        sec = left_out(key, title, "no benchmark of the sweep could be audited")
        sec.notes = notes
        return sec
    groups: dict[str, list[str]] = {}  # conditions whose audits read the same share one sentence
    for cond, s in sentences:
        groups.setdefault(s, []).append(str(cond))
    reading = "; ".join(f"{', '.join(conds)}: {s}" for s, conds in groups.items()) + "."
    sec = Section(key, title, reading=reading, table=pd.DataFrame(rows), notes=notes)
    sec.notes.append("Audited on one seed's benchmark and split per condition (the lowest seed), for the cells a model was "
                     "trained on; sibling share = crops whose parent holds another; shares of test crops are measured on "
                     "the split (shortcutlab.data.audit).")
    return sec


def _audit_rows(cond: str, seed: int, card: dict) -> list[dict]:
    """The audit table's rows of one condition: one per trained cell."""
    rows = []
    for cell, c in sorted(card["cells"].items()):
        row = {"condition": cond, "seed": seed, "cell": cell or "-", "train crops": c["n_train"], "test crops": c["n_test"],
               "test parents": c["test_parents"], "test with a training sibling": rd.pct(c["with_train_sibling"]),
               "test with a pixel-overlapping training sibling": rd.pct(c["with_overlapping_train_sibling"])
               if c["with_overlapping_train_sibling"] is not None else "n/a (no boxes)"}
        if "siblings_share" in card:
            row["siblings diagnostic share"] = rd.pct(card["siblings_share"])
        rows.append(row)
    return rows


def _audit_sentence(card: dict) -> str:
    """One condition's audit in words: the data, how it was split, and its cells' sibling shares."""
    cells = card["cells"]
    leak = [c for n, c in cells.items() if n.startswith("leak")]
    clean = [c for n, c in cells.items() if n.startswith("clean")]
    s = (f"{card['n_crops']:,} crops from {card['n_parents']:,} parents in {card['n_classes']} classes "
         f"({rd.pct(card['sibling_share'])} of crops have a sibling); split {card['split_text']}")
    if leak and clean:
        s += (f"; in leak cells {rd.pct(np.mean([c['with_train_sibling'] for c in leak]))} of test crops have a training "
              f"sibling, in clean cells {rd.pct(np.mean([c['with_train_sibling'] for c in clean]))}")
        ov = [c["with_overlapping_train_sibling"] for c in leak if c["with_overlapping_train_sibling"] is not None]
        if ov:
            s += f", and {rd.pct(np.mean(ov))} share pixels with one in leak cells"
    elif cells:
        c = next(iter(cells.values()))
        s += f"; {rd.pct(c['with_train_sibling'])} of test crops have a training sibling"
    return s


def _slopes(pairs: pd.DataFrame, n_boot: int, seed: int, level: float) -> pd.DataFrame | None:
    from shortcutlab.stats import dose_response

    if pairs.empty:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dose_response(pairs[["condition", "seed", "R", "gap"]], x="R", y="gap", cluster="seed", by=["condition"],
                             n_boot=n_boot, level=level, seed=seed)


#: what `build_report` writes in its folder (``name/``: a folder it owns whole)
REPORT_FILES = ("report.html", "report.md", "estimates.csv", "validity.csv", "verdicts.csv", "figures/")


def _is_legacy_report(out: str) -> bool:
    """A report folder written before output markers: its report.html is one of ours."""
    try:
        with open(os.path.join(out, "report.html"), encoding="utf-8") as f:
            head = f.read(4096)
    except (OSError, UnicodeDecodeError):
        return False
    return f"<title>{TITLE}</title>" in head


def _check_out(out: str) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputError(f"--out {out!r} is a file; give a folder for the report")
    claim_output_dir(out, "report", REPORT_FILES, _is_legacy_report)


def build_report(sweep_dir: str | os.PathLike, out: str | os.PathLike | None = None, *, n_boot: int = 2000, seed: int = 0,
                 level: float = 0.95, examples: bool = True, device: str = "cpu", analysis: dict | None = None,
                 interval: str = "cgm") -> dict:
    """Write the report of a sweep folder: ``report.html`` (self-contained), ``report.md`` with
    ``figures/*.png``, and the tables it reads from (``estimates.csv``, ``validity.csv``,
    ``verdicts.csv``). The report opens with its answer (`summary.summary_section`): a few
    sentences and the verdict table, then the audit card and the rest.

    The folder `out` (default ``DIR/report``) is built under a temporary name and swapped in
    whole (`io.atomic_dir`): a failed report leaves the previous one.

    Args:
        sweep_dir: the sweep folder.
        out: the report folder (new, or an earlier report's).
        n_boot, seed, level: the bootstrap of the estimates (`shortcutlab.stats.estimates`).
        interval: their interval method ("cgm", default, or "pigeonhole"; `estimates`).
        examples: draw the example crops (loads two models; CPU, a few crops).
        device: where the example models run.
        analysis: analysis settings (`sweep.registration.sweep_analysis`); when given, they
            replace `n_boot`, `seed` and `level`, and their interval method, hypotheses and
            families reach `estimates` (`sweep.registration.estimates_options`); only their
            estimands' rows are kept.
        interval: the interval method without `analysis` ("cgm", default, or "pigeonhole").

    Returns:
        dict of paths: dir, html, markdown, figures (list), estimates, validity, verdicts (the
        summary's verdict table in numbers, `summary.VERDICT_COLUMNS`).

    Raises:
        ReportError: the folder is missing, has no predictions, or a table is corrupt.
        OutputError: `out` is a file, or a folder holding a file shortcutlab did not write as
            a report (`io.claim_output_dir`).
    """
    folder = SweepFolder(sweep_dir)
    out = os.path.abspath(os.fspath(out) if out is not None else folder.layout.report)
    _check_out(out)
    pred = folder.predictions
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        if analysis is not None:
            n_boot, seed, level = analysis["n_boot"], analysis["seed"], analysis["level"]
        interval = analysis.get("interval") or interval if analysis is not None else interval
        est = _estimates(pred, folder.results, analysis, n_boot, seed, level, interval)
        sections, vtable = _sections(folder, est, n_boot, seed, level, examples, device)
        free, free_note = _pixel_free(folder, pred, n_boot, seed, level, interval)
        lead, verdicts = summary_section(est, vtable, free, level)
        lead.notes += free_note
    caught = _caught(w)
    intro = _intro(folder, n_boot, seed, level, interval) + [_registration_line(folder.path, analysis)]
    html_text = to_html(TITLE, intro, sections, caught, lead=lead)
    md_text = to_markdown(TITLE, intro, sections, caught, lead=lead)
    return _write(out, [lead] + sections, est, vtable, html_text, md_text, verdicts)


def _pixel_free(folder: SweepFolder, pred: pd.DataFrame, n_boot: int, seed: int, level: float,
                interval: str) -> tuple[pd.DataFrame | None, list[str]]:
    """The leak on the pixel-free test crops (`pixel_free.pixel_free_leak`), and a note where it
    could not be measured: no benchmark with boxes on disk, or its files failed to read."""
    try:
        crops = pixel_free_crops(folder)
    except Exception as e:  # noqa: BLE001 - the summary stands without it, saying why
        return None, [f"The leak on test crops sharing no pixel with a training crop was not measured: reading the "
                      f"benchmark and split failed ({' '.join(str(e).split())[:200]})."]
    if crops.empty:
        return None, ["The leak on test crops sharing no pixel with a training crop was not measured: no leak model's "
                      "benchmark with crop boxes (x, y, w, h) and split is in the sweep folder."]
    return pixel_free_leak(pred, crops, n_boot=n_boot, seed=seed, level=level, interval=interval), []


# --- registration and the config's analysis settings (issue 23, item 5) -------------------
def _estimates(pred: pd.DataFrame, results: pd.DataFrame | None, analysis: dict | None, n_boot: int, seed: int,
               level: float, interval: str = "cgm") -> pd.DataFrame:
    """The estimates of the predictions and the results (the slope of the gap on R, F8, needs
    the parent probe's R), with the analysis settings' keywords where given (only the
    registered estimands' rows kept): the same table `shortcutlab results` prints."""
    from shortcutlab.stats import estimates
    from shortcutlab.sweep.registration import estimates_options, keep_estimands

    if analysis is None:
        return estimates(pred, results, n_boot=n_boot, level=level, seed=seed, interval=interval)
    return keep_estimands(estimates(pred, results, **estimates_options(analysis)), analysis)


def _registration_line(path: str, analysis: dict | None = None) -> str:
    """The report's statement on the registration (`sweep.registration.registration_statement`),
    and whether the estimates use the config's analysis settings."""
    from shortcutlab.sweep.registration import registration_statement

    line = registration_statement(path)
    if analysis is not None:
        line += " The estimates use the config's analysis section."
    return line


def _sections(folder: SweepFolder, est: pd.DataFrame, n_boot: int, seed: int, level: float, examples: bool,
              device: str) -> tuple[list[Section], pd.DataFrame]:
    """Every section of the report, in order, and the validity table."""
    pred, results = folder.predictions, folder.results
    pairs = dose_pairs(pred, results) if results is not None else pd.DataFrame()
    slopes = _slopes(pairs, n_boot, seed, level)
    validity, vtable = validity_section(est, results, n_boot, seed, level)
    sens = sensitivity_summary_of(pred, est, seed)
    sections = [
        audit_section(folder, results),
        registered_section(est, level, sens),
        accuracy_section(pred, est),
        forest_section(est, level),
        validity,
        dose_section(pred, results, slopes, level),
        gradcam_section(results),
    ]
    further = further_section(est, level)
    if further is not None:
        sections.append(further)
    sections.append(sensitivity_section(pred, est, seed, summary=sens))
    if examples:
        sections.append(examples_section(folder, device=device))
    else:
        sections.append(left_out("examples", "Example crops: masks, interventions and Grad-CAM",
                                 "it was not requested (--no-examples)"))
    return sections, vtable


def registered_section(est: pd.DataFrame, level: float = 0.95, sensitivity: pd.DataFrame | None = None) -> Section:
    """The registered tests as the paper's Table 2 (`registered_table`): each hypothesis the
    sweep's rows test, its estimate, interval, p, Holm-adjusted p within its registered family
    and the verdict, with the sensitivity analyses' p-values beside them where `sensitivity`
    (`sensitivity_summary_of`) is given; before every other estimate."""
    key, title = "registered_tests", "Registered tests"
    table = registered_table(est, level, sensitivity)
    if table.empty:
        return left_out(key, title, "no estimate tests a registered hypothesis (no protocol pair, factorial or "
                                    "dose-response; or the hypotheses were switched off)")
    return Section(key, title, reading=rd.registered_reading(table), table=table,
                   notes=["Which rows test which hypothesis, and the families: shortcutlab.stats.hypotheses "
                          "(the paper's by default: H1 alone, H2-H5, F1-F8). Every other estimate below is descriptive, "
                          "Holm-adjusted within its own family in estimates.csv."])


def further_section(est: pd.DataFrame, level: float = 0.95) -> Section | None:
    """The rows of every registered estimand that no figure reads (`Estimand.section` None),
    one line each in the estimand's own reading, with a table in its unit; None when the
    estimates hold none (the built-in estimands are all read by a figure or left to the
    table)."""
    from shortcutlab.stats import available_estimands, get_estimand, read_row

    names = [n for n in available_estimands() if get_estimand(n).section is None]
    rows = est[est["estimand"].isin(names)]
    if rows.empty:
        return None
    lines, table = [], []
    for r in rows.to_dict("records"):
        unit = get_estimand(r["estimand"]).unit
        where = ", ".join(str(r[k]) for k in ("condition", "diversity", "arch") if str(r.get(k) or "") not in ("", "nan"))
        lines.append(f"{where}: {read_row(r, level)}" if where else read_row(r, level))
        table.append({"estimand": r["estimand"], "condition": _blank(r["condition"]), "arch": _blank(r["arch"]), "unit": unit,
                      "estimate": format_value(r["estimate"], unit),
                      "interval": format_interval(r["ci_low"], r["ci_high"], unit, level)})
    return Section("further_estimates", "Further estimates", reading="\n".join(lines), table=pd.DataFrame(table))


def _blank(value) -> str:
    """A table cell: '' where an estimand's row leaves the column out (NaN), else the value."""
    return "" if is_nan(value) else value


def _caught(records) -> list[str]:
    """The warnings raised while the report was computed, each once, as one line."""
    caught: list[str] = []
    for item in records:
        text = f"{item.category.__name__}: {' '.join(str(item.message).split())}"
        if text not in caught:
            caught.append(text)
    return caught


#: How the introduction names each interval method of the estimates.
INTERVAL_INTRO = {"cgm": "two-way (Cameron-Gelbach-Miller) cluster-bootstrap intervals",
                  "pigeonhole": "percentile pigeonhole bootstrap (conservative)"}


def _intro(folder: SweepFolder, n_boot: int, seed: int, level: float, interval: str = "cgm") -> list[str]:
    """The report's opening paragraphs: what the sweep holds, how intervals are made."""
    pred, results = folder.predictions, folder.results
    n_models = pred["model"].nunique()
    v = folder.versions
    return [
        f"Sweep folder: {folder.path}. {n_models} models, {pred['condition'].nunique()} condition(s) "
        f"({', '.join(sorted(map(str, pred['condition'].unique())))}), {pred['seed'].nunique()} seed(s), "
        f"{pred['intervention'].nunique() - 1 if 'none' in set(pred['intervention']) else pred['intervention'].nunique()} "
        f"intervention setting(s); {'a results table with ' + str(len(results)) + ' rows' if results is not None else 'no results table'}.",
        f"Intervals: {level * 100:.0f}% {INTERVAL_INTRO.get(interval, interval)} over seeds and test parents "
        f"({n_boot} resamples, seed {seed}); none from fewer than 3 seeds or test parents; "
        f"effects in percentage points (pp)." + (f" Versions: {', '.join(f'{k} {x}' for k, x in sorted(v.items()))}." if v else ""),
    ]


def _write(out: str, sections: list[Section], est: pd.DataFrame, vtable: pd.DataFrame, html_text: str,
           md_text: str, verdicts: pd.DataFrame) -> dict:
    """Write the report's files into `out` as one set (`io.atomic_dir`); their paths."""
    paths = {"dir": out, "html": os.path.join(out, "report.html"), "markdown": os.path.join(out, "report.md"),
             "estimates": os.path.join(out, "estimates.csv"), "validity": os.path.join(out, "validity.csv"),
             "verdicts": os.path.join(out, "verdicts.csv"), "figures": []}
    with atomic_dir(out, "report", REPORT_FILES, _is_legacy_report) as tmp:
        os.makedirs(os.path.join(tmp, "figures"))
        for s in sections:
            if s.png is not None:
                with open(os.path.join(tmp, "figures", f"{s.key}.png"), "wb") as f:
                    f.write(s.png)
                paths["figures"].append(os.path.join(out, "figures", f"{s.key}.png"))
        est.to_csv(os.path.join(tmp, "estimates.csv"), index=False)
        vtable.to_csv(os.path.join(tmp, "validity.csv"), index=False)
        verdicts.to_csv(os.path.join(tmp, "verdicts.csv"), index=False)
        with open(os.path.join(tmp, "report.md"), "w", encoding="utf-8") as f:
            f.write(md_text)
        with open(os.path.join(tmp, "report.html"), "w", encoding="utf-8") as f:
            f.write(html_text)
    return paths


__all__ = ["ReportError", "SweepFolder", "build_report", "further_section", "validity_display", "validity_reading"]
