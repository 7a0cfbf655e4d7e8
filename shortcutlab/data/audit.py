"""Audit a crop table and, optionally, an existing split of it.

`audit` returns the closed-form exposure (see `exposure`) and, given a manifest, the same
figures measured on that split: the share of evaluation crops with a training sibling, with a
pixel-overlapping training sibling, parents and patients per side, parents crossing sides and
the class balance of every side.

Example:
    >>> import pandas as pd
    >>> from shortcutlab.data.table import CropTable
    >>> from shortcutlab.data.splits import crop_split
    >>> df = pd.DataFrame({"id": range(6), "label": list("ababab"), "parent": [0, 0, 0, 1, 1, 1]})
    >>> t = CropTable.from_frame(df, id="id")
    >>> r = audit(t, split=crop_split(t, test_fraction=0.5, seed=1))
    >>> r["measured"]["test"]["with_train_sibling"]
    1.0
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from shortcutlab.errors import SplitError
from shortcutlab.data.exposure import sibling_exposure, summarize
from shortcutlab.data.manifest import SIDES, SplitManifest
from shortcutlab.data.overlap import has_overlapping_partner
from shortcutlab.data.table import CropTable


def side_codes(table: CropTable, assignment: pd.DataFrame) -> np.ndarray:
    """Map a manifest's id/split rows onto the table: (N,) codes 0 train, 1 val, 2 test, -1 unused.

    Raises:
        SplitError: the manifest names crops the table does not have.
    """
    ids = pd.Index(table.ids)
    pos = ids.get_indexer(assignment["id"].to_numpy(dtype=object))
    missing = pos < 0
    if missing.any():
        bad = assignment["id"].to_numpy()[missing][:5]
        raise SplitError(
            f"the manifest names {int(missing.sum())} crop id(s) that are not in the table, e.g. {list(map(str, bad))}; "
            "check that --id matches the column the split was made with"
        )
    side = np.full(table.n_crops, -1, dtype=np.int8)
    side[pos] = pd.Categorical(assignment["split"], categories=list(SIDES)).codes
    return side


def no_shared_pixel_ids(table: CropTable, split: SplitManifest, cell: str | None = None) -> set[str]:
    """Ids of the test crops of `split` (of its `cell`) that share no pixel with any of that
    cell's training crops: the paper's exploratory pixel-free subset, where a leak cannot
    come from memorised pixels, only from the seen parent.

    Args:
        table: the crops, with boxes (`CropTable.overlap_pairs`; two crops share pixels when
            they share a parent and their boxes intersect with positive area).
        split: the manifest.
        cell: one cell of a multi-cell manifest (a factorial's ``leak-high``), None for a
            single-cell one.

    Returns:
        the ids, as strings.

    Raises:
        SplitError: the manifest names crops the table does not have, or `cell` is unknown.
    """
    side = side_codes(table, split.cell(cell))
    shared = has_overlapping_partner(table.overlap_pairs, side == 2, side == 0)
    return set(table.ids[(side == 2) & ~shared].astype(str))


def measure_split(table: CropTable, assignment: pd.DataFrame) -> dict:
    """Figures measured on one split (one cell of a manifest).

    Returns:
        A dict with ``n_unassigned``, per side (train/val/test) ``n_crops``, ``n_parents``,
        ``n_groups`` and ``class_share``, for each evaluation side ``with_train_sibling`` and
        ``with_overlapping_train_sibling`` (shares, None without geometry), plus
        ``parents_crossing`` (parents with crops on more than one side) and
        ``groups_crossing``.
    """
    side = side_codes(table, assignment)
    pc = table.parent_codes
    out: dict = {"n_unassigned": int((side < 0).sum())}
    train = side == 0
    for code, name in enumerate(SIDES):
        m = side == code
        if not m.any():
            continue
        labels = table.label_codes[m]
        share = np.bincount(labels, minlength=table.n_classes) / m.sum()
        rec = {
            "n_crops": int(m.sum()),
            "n_parents": int(len(np.unique(pc[m]))),
            "n_groups": int(len(np.unique(table.group_codes[m]))) if table.has_group else None,
            "class_share": {c: round(float(s), 6) for c, s in zip(table.classes, share)},
        }
        if name != "train":
            rec["with_train_sibling"] = round(sibling_exposure(pc, m, train), 6)
            if table.has_geometry:
                hit = has_overlapping_partner(table.overlap_pairs, m, train)
                rec["with_overlapping_train_sibling"] = round(float(hit[m].mean()), 6)
            else:
                rec["with_overlapping_train_sibling"] = None
        out[name] = rec
    assigned = side >= 0
    sides_per_parent = pd.Series(side[assigned]).groupby(pc[assigned]).nunique()
    out["parents_crossing"] = int((sides_per_parent > 1).sum())
    if table.has_group:
        sides_per_group = pd.Series(side[assigned]).groupby(table.group_codes[assigned]).nunique()
        out["groups_crossing"] = int((sides_per_group > 1).sum())
    else:
        out["groups_crossing"] = None
    return out


AUGMENTATION_ORDERS: tuple[str, ...] = ("split-then-augment", "augment-then-split", "no-augmentation")
"""What a user may declare about augmentation and the split (reference 002): split first and
augment each side (sound), augment and then split the augmented pool (siblings cross by
construction), or no augmentation."""


def pixel_sibling_shares(table: CropTable, split: SplitManifest, cell: str | None = None, threshold: int | None = None,
                         root: str | None = None) -> dict:
    """Reference 002's sibling check on a split's images: per cell, the share of test crops
    with a training crop within `threshold` bits of the 64-bit pHash under the eight flips and
    right-angle rotations whose aligned detail correlates >= `siblings.DEFAULT_CONFIRM`
    (`shortcutlab.data.siblings`; the hash alone links look-alike distinct crops).

    Args:
        table: a table with an image column (paths relative to the table's folder or `root`).
        split: the split manifest.
        cell: one cell (default: every cell).
        threshold: Hamming threshold (default `siblings.DEFAULT_THRESHOLD`).
        root: folder relative image paths start from.

    Returns:
        {cell name ('' for a one-cell manifest): {"share", "n_test", "n_with_sibling",
        "threshold", "confirm", "n_hash_candidates" (test crops with a hash candidate,
        confirmed or not)}}; a cell without a training or test side gets share None.
    """
    import os

    from shortcutlab.errors import TableError
    from shortcutlab.data.siblings import DEFAULT_CONFIRM, DEFAULT_THRESHOLD, ImageSet, check_threshold, hash_image_set, search_confirmed

    if not table.has_images:
        raise TableError("the pixel-sibling share needs the crops' images: give the table an image column (--image COL)")
    t = DEFAULT_THRESHOLD if threshold is None else check_threshold(threshold)
    if root is None:
        root = os.path.dirname(os.path.abspath(table.source)) if os.path.exists(str(table.source)) else os.getcwd()
    paths = [p if os.path.isabs(p) else os.path.join(root, p) for p in table.frame["image"].tolist()]
    images = ImageSet(list(table.ids), paths, str(table.source))
    variants = hash_image_set(images, variants=True)  # column 0: the image itself
    cells = [cell] if cell is not None or len(split.cells) == 1 else list(split.cells)
    out = {}
    for c in cells:
        side = side_codes(table, split.cell(c))
        train, test = np.flatnonzero(side == 0), np.flatnonzero(side == 2)
        name = c if c is not None and len(split.cells) > 1 else ""
        if len(train) == 0 or len(test) == 0:
            out[name] = {"share": None, "n_test": int(len(test)), "n_with_sibling": 0, "threshold": t}
            continue
        res = search_confirmed(variants[train, 0], variants[test], t, lambda i: images.read(int(test[i])),
                               lambda j: images.read(int(train[j])), DEFAULT_CONFIRM)
        out[name] = {"share": round(res.share, 6), "n_test": int(len(test)), "n_with_sibling": int(res.is_sibling.sum()), "threshold": t,
                     "confirm": DEFAULT_CONFIRM, "n_hash_candidates": int((res.n_siblings > 0).sum())}
    return out


def audit(
    table: CropTable,
    test_fraction: float = 0.2,
    split: SplitManifest | None = None,
    cell: str | None = None,
    augmentation: str | None = None,
    pixel_siblings: bool | None = None,
) -> dict:
    """Closed-form exposure of `table` and, with `split`, the figures measured on it.

    Args:
        table: the crops.
        test_fraction: q for the closed forms.
        split: an optional manifest; with several cells every cell is measured unless `cell`
            names one.
        cell: one cell of a multi-cell manifest.
        augmentation: the user's declaration of where augmentation sits relative to the split,
            one of `AUGMENTATION_ORDERS` (None: not declared); recorded for the card.
        pixel_siblings: measure reference 002's pixel-sibling share of the split
            (`pixel_sibling_shares`); None = when the table has images and a split is given.

    Returns:
        JSON-ready dict: ``n_crops``, ``n_parents``, ``n_classes``, ``n_groups``,
        ``test_fraction``, ``sibling_share``, ``exposure``, ``diversity_ratio``,
        ``pixel_overlap`` (None without geometry), ``overlap_share`` and, with a split,
        ``measured`` (per cell when there are several; each with ``n_unassigned``, the table's
        crops outside that cell) and ``split`` (protocol, params, hash, and ``n_unassigned``:
        the table's crops in no row of the manifest, over all cells), ``augmentation``
        (the declaration or None) and, when measured, ``pixel_siblings`` (per cell, see
        `pixel_sibling_shares`); ``warnings``: the degenerate cases below, one line each.

    Warns:
        UserWarning: the manifest leaves crops of the table out (except a factorial design,
            whose cells train on a subset by construction); the count is in
            ``result["split"]["n_unassigned"]``.
        SplitWarning: the table holds one class; the split (a cell) has no training or no
            test crops (also listed in ``result["warnings"]``).
    """
    from shortcutlab.errors import ShortcutlabError

    if augmentation is not None and augmentation not in AUGMENTATION_ORDERS:
        raise ShortcutlabError(f"augmentation order must be one of {', '.join(AUGMENTATION_ORDERS)}; got {augmentation!r}")
    from shortcutlab.errors import SplitWarning

    result = summarize(table, test_fraction).to_dict()
    result["source"] = table.source
    notes = []
    if table.n_classes < 2:
        notes.append(f"the table holds one class ({table.classes[0]!r}): there is nothing for a classifier to tell apart, "
                     "so class shares and any accuracy on this table are degenerate")
    result["augmentation"] = augmentation
    if split is not None:
        cells = split.cells
        if cell is not None or len(cells) == 1:
            result["measured"] = measure_split(table, split.cell(cell))
        else:
            result["measured"] = {c: measure_split(table, split.cell(c)) for c in cells}
        result["split"] = _split_record(table, split)
        notes += _empty_side_notes(result["measured"])
        if pixel_siblings or (pixel_siblings is None and table.has_images):
            result["pixel_siblings"] = pixel_sibling_shares(table, split, cell)
    for n in notes:
        warnings.warn(n, SplitWarning, stacklevel=2)
    result["warnings"] = notes
    return result


def assigned_mask(ids: pd.Series, assigned: pd.Series) -> np.ndarray:
    """(N,) bool: which of `ids` appear among `assigned` (both compared as strings).

    Set membership in Arrow (`pyarrow.compute.is_in`): ``pd.Index.isin`` on an object array
    builds a Python (on pandas 3, a pyarrow scalar) object per value, 12x slower at 1M crops.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    def arrow(values: pd.Series) -> pa.Array:
        text = values.astype(str)
        arr = pa.array(text.to_numpy(dtype=object) if text.dtype == object else text.array)
        return arr.cast(pa.large_string())

    return pc.is_in(arrow(ids), value_set=arrow(assigned)).to_numpy(zero_copy_only=False)


def _split_record(table: CropTable, split: SplitManifest) -> dict:
    """The audit's ``split`` entry (protocol, params, hash, crops in no row of the manifest);
    warns (at the audit's caller) when a manifest other than a factorial leaves crops out."""
    in_manifest = assigned_mask(table.frame["id"], split.assignments["id"])
    n_unassigned = int((~in_manifest).sum())
    if n_unassigned and split.protocol != "factorial":
        warnings.warn(
            f"the split leaves {n_unassigned} of the table's {table.n_crops} crops unassigned (in no row of the "
            f"manifest), e.g. {[str(i) for i in table.frame['id'][~in_manifest].head(3)]}; were they dropped on purpose?",
            UserWarning,
            stacklevel=3,
        )
    return {"protocol": split.protocol, "params": split.params, "sha256": split.hash, "n_unassigned": n_unassigned}


def _empty_side_notes(measured: dict) -> list[str]:
    """One note per cell of `measured` (one cell's figures, or cell -> figures) without a
    training or test side."""
    notes = []
    cells_measured = {"": measured} if "parents_crossing" in measured else measured
    for c, m in cells_measured.items():
        where = f" (cell {c!r})" if c else ""
        for side in ("train", "test"):
            if side not in m:
                notes.append(f"the split{where} has no {side} crops: {'nothing is held out, so no test figure is measured' if side == 'test' else 'no test crop can have a training sibling'}")
    return notes
