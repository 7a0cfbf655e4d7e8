"""A short Markdown reporting card for an evaluation's split.

It states what a defensible evaluation reports (reference 003, "Reporting standard";
reference 002): the split unit and splitter with its parameters, the number of parents (and
patients), not only crops, the measured sibling share of the test set, and whether near-duplicate
merging preceded the split. Without a split it states the closed-form exposure a crop-level
split would have.

Its first section holds reference 002's four reporting items: acquisitions counted (parents,
not crops), whether the split came before or after augmentation (declared by the user: the
table cannot show it), the split unit, and the pixel-sibling share (test crops with a flipped,
rotated or re-exposed copy among the training crops, from `shortcutlab.data.siblings`, when the
table has images).
"""

from __future__ import annotations

import json


def _pct(x) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.2f}%"


_AUGMENTATION_TEXT = {
    "split-then-augment": "split before augmentation (declared): augmented copies stay on their source crop's side",
    "augment-then-split": "split after augmentation (declared): augmented copies of one source crop can sit on both sides; "
    "the test score measures recognition of near-duplicates (reference 002)",
    "no-augmentation": "no augmentation (declared)",
}


def _augmentation_text(order) -> str:
    if order is None:
        return ("not declared; state it (`shortcutlab audit --augmentation-order ...`): split first, then augment "
                "training crops only, so augmented copies stay on their source crop's side")
    return _AUGMENTATION_TEXT.get(order, str(order))


def _split_unit(split: dict) -> str:
    """The unit a split keeps whole: the manifest's ``unit`` parameter, else what its protocol implies."""
    unit = (split.get("params") or {}).get("unit")
    if unit is not None:
        return str(unit)
    implied = {"crop": "crop", "ladder": "crop (a share of parents may cross)", "factorial": "crop (parents chosen per cell)"}
    return implied.get(split.get("protocol"), "unknown (manifest without metadata)")


def _reference_002_items(r: dict) -> list[str]:
    """The four reporting items of reference 002."""
    split = r.get("split")
    groups = f" in {r['n_groups']:,} groups (patients)" if r.get("n_groups") else ""
    lines = [
        "## Reporting items (reference 002)",
        f"- Acquisitions counted: {r['n_parents']:,} independent acquisitions (parents){groups} behind "
        f"{r['n_crops']:,} crops; power and intervals rest on the acquisitions, not the crops",
        f"- Split before or after augmentation: {_augmentation_text(r.get('augmentation'))}",
    ]
    if split is None:
        lines.append("- Split unit: no split given (audit one with `--split MANIFEST.csv`)")
    else:
        lines.append(f"- Split unit: {_split_unit(split)}")
    sib = r.get("pixel_siblings")
    if not sib:
        why = "no split given" if split is None else "the table has no image column (--image COL)"
        lines.append(f"- Pixel-sibling share: not measured ({why})")
    else:
        for name, s in sib.items():
            where = f" (cell {_code(name)})" if name else ""
            if s.get("share") is None:
                lines.append(f"- Pixel-sibling share{where}: not measured (the split has no training or no test crops)")
                continue
            lines.append(
                f"- Pixel-sibling share{where}: {_pct(s['share'])} of test crops ({s['n_with_sibling']:,} of {s['n_test']:,}) "
                f"have a training crop within {s['threshold']} bits of the 64-bit pHash under flips and right-angle rotations"
            )
    return lines


def reporting_card(result: dict) -> str:
    """Render an `audit` result as Markdown.

    Args:
        result: the dict returned by `shortcutlab.data.audit.audit`.

    Returns:
        Markdown text.
    """
    r = result
    lines = [
        "# Evaluation reporting card",
        "",
        f"Table: {_code(r.get('source', '?'))}",
        "",
        *_reference_002_items(r),
        "",
        "## Acquisition structure",
        f"- Crops: {r['n_crops']:,}; parents (acquisitions): {r['n_parents']:,}"
        + (f"; groups (patients): {r['n_groups']:,}" if r.get("n_groups") else "; groups (patients): not given"),
        f"- Classes: {r['n_classes']}",
        f"- Crops whose parent holds another crop (sibling share): {_pct(r['sibling_share'])}",
        f"- A crop-level split with test fraction {r['test_fraction']:g} would expose "
        f"{_pct(r['exposure'])} of test crops to a training sibling"
        + (f" and {_pct(r['pixel_overlap'])} to a pixel-overlapping one" if r.get("pixel_overlap") is not None else ""),
        f"- Crop-level training sets would hold {r['diversity_ratio']:.3f}x the parents of a parent-level one of equal size",
    ]
    split = r.get("split")
    if split is None:
        lines += ["", "## Split", "- No split given: audit one with `--split MANIFEST.csv`."]
        return "\n".join(lines + _warning_lines(r)) + "\n"

    params = dict(split.get("params") or {})
    protocol = split.get("protocol", "external")
    unit = _split_unit(split)
    dedup = params.get("dedup")
    dedup_text = (
        f"yes, {dedup.get('method')} with Hamming threshold {dedup.get('max_distance')}"
        if dedup
        else ("no" if protocol != "external" else "unknown (manifest without metadata)")
    )
    shown = {k: v for k, v in params.items() if k != "dedup"}
    lines += [
        "",
        "## Split",
        f"- Split unit: {unit}",
        f"- Splitter: shortcutlab `{protocol}` with parameters `{json.dumps(shown, sort_keys=True)}`",
        f"- Manifest SHA-256: `{split.get('sha256')}`",
        f"- Near-duplicate merging before the split: {dedup_text}",
        f"- Augmentation relative to the split: {_augmentation_text(r.get('augmentation'))}",
    ]
    n_unassigned = split.get("n_unassigned")
    if n_unassigned:
        why = " (a factorial design trains on a subset by construction)" if protocol == "factorial" else " (state why they were left out)"
        lines.append(f"- Crops of the table in no row of the manifest: {n_unassigned:,}{why}")
    measured = r.get("measured") or {}
    cells = measured if "train" not in measured and measured and all(isinstance(v, dict) and "train" in v for v in measured.values()) else {"": measured}
    for name, m in cells.items():
        head = f"### Cell {_code(name)}" if name else "### Measured on this split"
        lines += ["", head, "", "| side | crops | parents | groups | with a training sibling | with an overlapping training sibling |", "|---|---|---|---|---|---|"]
        for side in ("train", "val", "test"):
            s = m.get(side)
            if not s:
                continue
            lines.append(
                f"| {side} | {s['n_crops']:,} | {s['n_parents']:,} | {s['n_groups'] if s['n_groups'] is not None else 'n/a'} | "
                f"{_pct(s.get('with_train_sibling')) if side != 'train' else ''} | "
                f"{_pct(s.get('with_overlapping_train_sibling')) if side != 'train' else ''} |"
            )
        lines.append("")
        lines.append(f"- Parents on more than one side: {m.get('parents_crossing')}")
        if m.get("groups_crossing") is not None:
            lines.append(f"- Groups (patients) on more than one side: {m.get('groups_crossing')}")
        if m.get("n_unassigned") and (name or m["n_unassigned"] != n_unassigned):
            lines.append(f"- Crops in the table but not in this split: {m['n_unassigned']:,}")
    return "\n".join(lines + _warning_lines(r)) + "\n"


def _code(text) -> str:
    """A Markdown code span holding `text` as typed (a cell name or path from the user's data):
    the fence is one backtick longer than any run inside it, so the text cannot close it."""
    import re

    t = " ".join(str(text).splitlines())
    fence = "`" * (max((len(m) for m in re.findall(r"`+", t)), default=0) + 1)
    pad = " " if t.startswith("`") or t.endswith("`") else ""
    return f"{fence}{pad}{t}{pad}{fence}"


def _warning_lines(r: dict) -> list[str]:
    """The audit's degenerate cases (one class, a side without crops), escaped: they quote labels."""
    from shortcutlab.markdown import md_escape

    if not r.get("warnings"):
        return []
    return ["", "## Warnings", ""] + [f"- {md_escape(w)}" for w in r["warnings"]]
