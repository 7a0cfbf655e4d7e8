"""Split protocols: crop-level (P1), parent-disjoint (P2), near-duplicate-merged (P3), the
leak/clean factorial (H3) and the relatedness ladder.

Every protocol takes a `CropTable` and a seed and returns a `SplitManifest`. Randomness comes
from independent named streams of ``numpy.random.default_rng([seed, stream])``, and tables are
sorted by crop id, so a split depends on the seed and the table's content, never on its row
order. The streams are shared on purpose: the ladder's level 0 equals the `parent` split and
its level 1 equals the `crop` split of the same seed.

A split that leaves its test or training side (or a requested validation side) empty is
refused with a `SplitError`. One that leaves a single class without crops on a side is made,
but warned about (`SplitWarning`, one line per class and side) and listed in the report as
``empty_class_sides``.

Example:
    >>> import pandas as pd
    >>> from shortcutlab.data.table import CropTable
    >>> df = pd.DataFrame({"id": range(8), "label": list("aabbaabb"), "parent": [0, 0, 1, 1, 2, 2, 3, 3]})
    >>> m = parent_split(CropTable.from_frame(df, id="id"), test_fraction=0.5, seed=0)
    >>> m.report["test_share"]
    0.5
"""

from __future__ import annotations

import inspect
import warnings
from typing import Callable, Mapping, Sequence, Union

import numpy as np
import pandas as pd
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow

from shortcutlab.errors import ShortcutlabError, SplitError, SplitWarning
from shortcutlab.data.exposure import check_q
from shortcutlab.data.manifest import SplitManifest
from shortcutlab.data.table import CropTable


# Named random streams (see module docstring).
_CROP_KEYS, _UNIT_SELECT, _LADDER_ORDER, _FACTORIAL = 1, 2, 3, 4

_PROTOCOLS: dict[str, Callable[..., SplitManifest]] = {}


def register_protocol(name: str):
    """Decorator adding a split protocol to the registry used by `make_split` and the CLI."""

    def deco(fn):
        if name in _PROTOCOLS:
            raise SplitError(f"split protocol {name!r} is registered twice ({_PROTOCOLS[name].__module__} and {fn.__module__})")
        _PROTOCOLS[name] = fn
        return fn

    return deco


def available_protocols() -> tuple[str, ...]:
    return tuple(_PROTOCOLS)


def get_protocol(name: str) -> Callable[..., SplitManifest] | None:
    """The function registered as split protocol `name`, or None when there is none."""
    return _PROTOCOLS.get(name)


def make_split(table: CropTable, protocol: str, **params) -> SplitManifest:
    """Run a protocol by name ('crop', 'parent', 'parent-dedup', 'factorial', 'ladder')."""
    if protocol not in _PROTOCOLS:
        import difflib

        close = difflib.get_close_matches(protocol, _PROTOCOLS, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise SplitError(f"unknown split protocol {protocol!r}; available: {', '.join(_PROTOCOLS)}{hint}")
    fn = _PROTOCOLS[protocol]
    accepted = [p for p in inspect.signature(fn).parameters if p != "table"]
    unknown = [k for k in params if k not in accepted]
    if unknown:
        raise SplitError(f"split protocol {protocol!r} takes no parameter {', '.join(map(repr, unknown))}; it takes: {', '.join(accepted)}")
    return fn(table, **params)


def _rng(seed: int, stream: int) -> np.random.Generator:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise SplitError(f"the seed must be a non-negative integer, got {seed!r}")
    return np.random.default_rng([int(seed), stream])


def _check_test_fraction(test_fraction: float) -> float:
    try:
        return check_q(test_fraction)
    except ShortcutlabError as e:  # the closed forms' check, raised as a split error here
        raise SplitError(str(e)) from None


def _check_fractions(test_fraction: float, val_fraction: float) -> tuple[float, float]:
    q = _check_test_fraction(test_fraction)
    try:
        v = float(val_fraction)
    except (TypeError, ValueError):
        raise SplitError(f"the validation fraction must be a number in [0, 1), got {val_fraction!r}") from None
    if not 0.0 <= v < 1.0 or q + v >= 1.0:
        raise SplitError(f"the validation fraction must be in [0, 1) with test + val < 1; got test {q}, val {v}")
    return q, v


def _check_unit(unit: str) -> None:
    if unit not in ("parent", "group", "patient"):
        raise SplitError(f"split unit must be 'parent' or 'group' (patient), got {unit!r}")


def _check_levels(levels) -> list[float]:
    try:
        levels = [float(f) for f in ([levels] if isinstance(levels, str) else levels)]
    except (TypeError, ValueError):
        raise SplitError(f"ladder levels must be numbers in [0, 1], got {list(levels) if not isinstance(levels, str) else levels!r}") from None
    if not levels or any(not 0.0 <= f <= 1.0 for f in levels):
        raise SplitError(f"ladder levels must lie in [0, 1], got {levels}")
    if len(set(levels)) != len(levels):
        raise SplitError(f"ladder levels must be distinct, got {levels}")
    return levels


def _check_factorial_params(test_parent_share, diversity_contrast, n_per_class, allocation, reserve_parent_share) -> None:
    if not 0.0 < test_parent_share < 1.0:
        raise SplitError(f"test_parent_share must lie in (0, 1), got {test_parent_share}")
    if not diversity_contrast >= 1.0:  # also refuses NaN
        raise SplitError(f"diversity_contrast must be >= 1, got {diversity_contrast}")
    if not 0.0 <= reserve_parent_share < 1.0:
        raise SplitError(f"reserve_parent_share must lie in [0, 1), got {reserve_parent_share}")
    if allocation not in ("balanced", "proportional"):
        raise SplitError(f"allocation must be 'balanced' or 'proportional', got {allocation!r}")
    if n_per_class is not None and int(n_per_class) < 1:
        raise SplitError(f"n_per_class must be >= 1, got {n_per_class}")


def check_params(protocol: str, **params) -> None:
    """Check a protocol's parameters without data, with the same checks (and messages) the
    protocol itself runs first, so a sweep config is refused at load time exactly when its
    split task would fail on them.

    Raises:
        SplitError: an unknown protocol or parameter, or a parameter out of its range.
    """
    if protocol not in _PROTOCOLS:
        raise SplitError(f"unknown split protocol {protocol!r}; available: {', '.join(_PROTOCOLS)}")
    sig = inspect.signature(_PROTOCOLS[protocol])
    unknown = [k for k in params if k not in sig.parameters or k == "table"]
    if unknown:
        raise SplitError(f"split protocol {protocol!r} takes no parameter {', '.join(map(repr, unknown))}")
    a = {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    a.update(params)
    if "seed" in a:
        _rng(a["seed"], 0)
    if protocol == "factorial":
        _check_factorial_params(a["test_parent_share"], a["diversity_contrast"], a["n_per_class"], a["allocation"],
                                a["reserve_parent_share"])
    elif protocol == "ladder":
        _check_test_fraction(a["test_fraction"])
        _check_levels(a["levels"])
    else:
        _check_fractions(a["test_fraction"], a.get("val_fraction", 0.0))
        if "unit" in a:
            _check_unit(a["unit"])
        if "max_distance" in a:
            from shortcutlab.data.dedup import check_distance

            check_distance(a["max_distance"])


# ---------------------------------------------------------------------------- building blocks
def _stratified_crop_sides(
    labels: np.ndarray, keys: np.ndarray, idx: np.ndarray, q: float, v: float
) -> np.ndarray:
    """Side codes (0 train, 1 val, 2 test) for crops `idx`, stratified by label.

    Within each class the crops are ordered by their random key; the first round(q n_c) go to
    test and the next round(v n_c) to validation.
    """
    out = np.zeros(len(idx), dtype=np.int8)
    if len(idx) == 0:
        return out
    lab = labels[idx]
    order = np.lexsort((keys[idx], lab))
    lab_sorted = lab[order]
    starts = np.r_[0, np.flatnonzero(np.diff(lab_sorted)) + 1]
    sizes = np.diff(np.r_[starts, len(order)])
    rank = np.arange(len(order)) - np.repeat(starts, sizes)
    n_c = np.repeat(sizes, sizes)
    n_test = np.rint(q * n_c)
    n_val = np.rint(v * n_c)
    side_sorted = np.where(rank < n_test, 2, np.where(rank < n_test + n_val, 1, 0)).astype(np.int8)
    out[order] = side_sorted
    return out


def _objective(d: np.ndarray, w: np.ndarray, w_all: float) -> np.ndarray:
    """Weighted deviation from the target: per-class relative error plus overall relative error."""
    return np.abs(d) @ w + np.abs(d.sum(axis=-1)) * w_all


def _select_units(
    V: np.ndarray,
    target: np.ndarray,
    rng: np.random.Generator,
    eligible: np.ndarray | None = None,
    max_iter: int = 400,
) -> np.ndarray:
    """Choose whole units (parents or patients) whose class counts sum close to `target`.

    A random prefix within each dominant-class stratum gets close; best-improvement toggles of
    single units then minimise sum_c |T_c - t_c| / t_c + |T - t| / t, so the achieved share is as
    close to the target as the unit sizes allow (up to that local search).

    Args:
        V: (U, C) crops of each class in each unit.
        target: (C,) desired crops per class on the selected side.
        rng: random stream.
        eligible: (U,) bool, units that may be selected.
        max_iter: bound on local-search moves.

    Returns:
        (U,) bool selection.
    """
    U, C = V.shape
    eligible = np.ones(U, dtype=bool) if eligible is None else eligible
    idx = np.flatnonzero(eligible)
    sel = np.zeros(U, dtype=bool)
    if len(idx) == 0 or target.sum() <= 0:
        return sel
    Ve = V[idx].astype(np.float64)
    size = Ve.sum(axis=1)
    share = float(target.sum() / max(size.sum(), 1.0))

    # Random prefix per dominant-class stratum.
    dom = np.argmax(Ve + rng.random(Ve.shape) * 1e-3, axis=1)
    key = rng.random(len(idx))
    order = np.lexsort((key, dom))
    dom_s = dom[order]
    size_s = size[order]
    starts = np.r_[0, np.flatnonzero(np.diff(dom_s)) + 1]
    lens = np.diff(np.r_[starts, len(order)])
    cum = np.cumsum(size_s)
    base = np.repeat(np.r_[0.0, cum[starts[1:] - 1]], lens)
    within = cum - base  # cumulative size inside the stratum, including this unit
    stratum_total = np.repeat(np.add.reduceat(size_s, starts), lens)
    goal = share * stratum_total
    before = within - size_s
    # Take a unit while the stratum is still nearer its goal with it than without it.
    take = np.abs(within - goal) <= np.abs(before - goal)
    take &= before < goal
    sel_e = np.zeros(len(idx), dtype=bool)
    sel_e[order[take]] = True

    w = 1.0 / np.maximum(target.astype(np.float64), 1.0)
    w_all = 1.0 / max(float(target.sum()), 1.0)
    d = Ve[sel_e].sum(axis=0) - target
    f = float(_objective(d, w, w_all))
    for _ in range(max_iter):
        sign = np.where(sel_e, -1.0, 1.0)
        cand = _objective(d[None, :] + sign[:, None] * Ve, w, w_all)
        best = int(np.argmin(cand))
        if cand[best] >= f - 1e-12:
            break
        sel_e[best] = ~sel_e[best]
        d = d + sign[best] * Ve[best]
        f = float(cand[best])
    sel[idx[sel_e]] = True
    return sel


def _side_counts(table: CropTable, side: np.ndarray) -> np.ndarray:
    """(3, C) int64 crops per side (0 train, 1 val, 2 test) and class; crops with side -1 are
    outside the design and not counted."""
    used = side >= 0
    flat = side[used].astype(np.int64) * table.n_classes + table.label_codes[used]
    return np.bincount(flat, minlength=3 * table.n_classes).reshape(3, table.n_classes)


def _side_report(table: CropTable, side: np.ndarray, names=("train", "val", "test")) -> dict:
    """Achieved shares: overall and per class, for each non-empty side."""
    n_c = np.bincount(table.label_codes, minlength=table.n_classes)
    return _shares_report(_side_counts(table, side), n_c, table.n_crops, table.classes, names)


def _shares_report(counts: np.ndarray, n_c: np.ndarray, n: int, classes: Sequence[str], names=("train", "val", "test")) -> dict:
    """`_side_report` from (3, C) crops per side and class, (C,) crops per class and N."""
    rep: dict = {}
    for code, name in enumerate(names):
        n_side = int(counts[code].sum())
        if n_side == 0 and name == "val":
            continue
        per = counts[code] / np.maximum(n_c, 1)
        rep[f"{name}_share"] = round(n_side / n, 6)
        rep[f"{name}_share_per_class"] = {str(c): round(float(s), 6) for c, s in zip(classes, per)}
        rep[f"n_{name}"] = n_side
    return rep


def _refuse_empty_sides(rep: dict, q: float, v: float, unit: str, sizes: np.ndarray, note: str = "") -> None:
    """Raise when the test or training side (or a requested validation side) holds no crop.

    Args:
        rep: a `_side_report`.
        unit: 'crop', 'parent' or 'group', for the message.
        sizes: crops per unit (per class for 'crop'), for the message.
    """
    empty = [name for name in ("train", "test") if rep.get(f"n_{name}", 0) == 0]
    if v > 0 and rep.get("n_val", 0) == 0:
        empty.append("val")
    if not empty:
        return
    val = f" and validation fraction {v}" if v > 0 else ""
    what = "a crop-level split" if unit == "crop" else f"a {unit}-disjoint split"
    if unit == "crop":
        detail = (
            f"each side gets round(fraction x crops of the class) crops, and the largest class has {int(np.max(sizes))} crops"
        )
    else:
        detail = f"the table has {len(sizes)} {unit}s of sizes up to {int(sizes.max())} crops"
    raise SplitError(f"{what} with test fraction {q}{val} left the {' and '.join(empty)} side empty{note}; {detail}")


def _empty_class_sides(
    table: CropTable, side: np.ndarray, has_val: bool, protocol: str, cell: str | None = None
) -> list[dict]:
    """Classes without a crop on a side the design has; each one is warned about.

    A class can vanish from a side when all its crops sit in one parent (a parent-disjoint
    split), when round(q n_c) is 0 (a tiny test fraction) or when test and validation take
    all of a small class. The split stays valid, but per-class figures on that side do not
    exist, so it is said (a `SplitWarning`) and recorded in the report.

    Args:
        side: (N,) side codes 0 train, 1 val, 2 test, -1 for crops outside the design.
        has_val: whether the design has a validation side.
        cell: the cell of a multi-cell design, named in the record and the warning.

    Returns:
        ``[{"class": c, "side": s}, ...]`` (with ``"cell"`` for a cell), in class then side order.
    """
    return _empty_class_sides_of(_side_counts(table, side), table.classes, has_val, protocol, cell)


def _empty_class_sides_of(counts: np.ndarray, classes: Sequence[str], has_val: bool, protocol: str,
                          cell: str | None = None) -> list[dict]:
    """`_empty_class_sides` from (3, C) crops per side and class."""
    names = ("train", "val", "test") if has_val else ("train", "test")
    out = []
    for c, name in enumerate(classes):
        for s in names:
            if counts[("train", "val", "test").index(s), c] == 0:
                rec = {"class": name, "side": s}
                where = f"{protocol} split"
                if cell is not None:
                    rec["cell"] = cell
                    where += f", cell {cell!r}"
                out.append(rec)
                n_c = int(counts[:, c].sum())
                warnings.warn(
                    f"{where}: class {name!r} has no crops on the {s} side ({n_c} crops of the class in the split)",
                    SplitWarning,
                    stacklevel=4,
                )
    return out


def _manifest(table: CropTable, side: np.ndarray, protocol: str, params: dict, report: dict) -> SplitManifest:
    names = np.array(["train", "val", "test"], dtype=object)
    df = pd.DataFrame({"id": table.ids, "split": names[side]})
    return SplitManifest(df, protocol=protocol, params=params, report=report)


# ---------------------------------------------------------------------------- P1
@register_protocol("crop")
def crop_split(table: CropTable, test_fraction: float = 0.2, val_fraction: float = 0.0, seed: int = 0) -> SplitManifest:
    """P1: stratified crop-level split; siblings land on both sides.

    Within each class, round(q n_c) crops go to test (and round(v n_c) to validation).
    """
    q, v = _check_fractions(test_fraction, val_fraction)
    keys = _rng(seed, _CROP_KEYS).random(table.n_crops)
    side = _stratified_crop_sides(table.label_codes, keys, np.arange(table.n_crops), q, v)
    rep = _side_report(table, side)
    _refuse_empty_sides(rep, q, v, "crop", np.bincount(table.label_codes))
    rep["empty_class_sides"] = _empty_class_sides(table, side, v > 0, "crop")
    params = {"test_fraction": q, "val_fraction": v, "seed": int(seed), "unit": "crop", "stratified_by": "label"}
    return _manifest(table, side, "crop", params, rep)


# ---------------------------------------------------------------------------- P2
def unit_sides_from_counts(V: np.ndarray, test_fraction: float, val_fraction: float = 0.0, seed: int = 0) -> np.ndarray:
    """The parent-level (or group-level) split from the class counts of its units alone.

    This is all `parent_split` needs of a table, so an engine that counts crops per unit and
    class out of core (SQL, a cluster) gets the in-memory split exactly.

    Args:
        V: (U, C) crops of each class in each unit; units in sorted-name order and classes
            sorted (as `CropTable.class_counts_per_unit`), since the random draws follow
            that order. A unit of zero crops is never selected.
        test_fraction, val_fraction: q and v, as `parent_split`.
        seed: random seed.

    Returns:
        (U,) int8 side of every unit: 0 train, 1 val, 2 test.

    Example:
        >>> V = np.array([[3, 0], [0, 2], [2, 0], [0, 3]])
        >>> unit_sides_from_counts(V, 0.5, seed=0).tolist()
        [2, 2, 0, 0]
    """
    q, v = _check_fractions(test_fraction, val_fraction)
    V = np.asarray(V)
    totals = V.sum(axis=0).astype(np.float64)
    rng = _rng(seed, _UNIT_SELECT)
    test_u = _select_units(V, q * totals, rng, eligible=V.sum(axis=1) > 0)
    val_u = np.zeros_like(test_u)
    if v > 0:
        val_u = _select_units(V, v * totals, rng, eligible=(V.sum(axis=1) > 0) & ~test_u)
    return np.where(test_u, 2, np.where(val_u, 1, 0)).astype(np.int8)


def parent_split_report(V: np.ndarray, side_u: np.ndarray, classes: Sequence[str], test_fraction: float,
                        val_fraction: float = 0.0, unit: str = "parent") -> dict:
    """The report of a parent-level split from its units' class counts and sides alone
    (`parent_split`'s report, for engines that never hold the crops).

    Args:
        V: (U, C) crops of each class in each unit.
        side_u: (U,) side of each unit (`unit_sides_from_counts`).
        classes: the C class names, in V's column order.
        test_fraction, val_fraction: q and v.
        unit: 'parent' or 'group', for the messages.

    Returns:
        shares overall and per class of each side, ``n_train``/``n_val``/``n_test``,
        ``max_class_deviation`` and ``empty_class_sides`` (each also warned about).

    Raises:
        SplitError: the test or training side (or a requested validation side) is empty.
    """
    q, v = _check_fractions(test_fraction, val_fraction)
    V = np.asarray(V, dtype=np.int64)
    side_u = np.asarray(side_u)
    counts = np.stack([V[side_u == code].sum(axis=0) for code in range(3)])
    n_c = V.sum(axis=0)
    rep = _shares_report(counts, n_c, int(n_c.sum()), classes)
    _refuse_empty_sides(rep, q, v, unit, V.sum(axis=1)[V.sum(axis=1) > 0])
    rep["max_class_deviation"] = round(max(abs(s - q) for s in rep["test_share_per_class"].values()), 6)
    rep["empty_class_sides"] = _empty_class_sides_of(counts, classes, v > 0, "parent")
    return rep


def _unit_sides(table: CropTable, q: float, v: float, seed: int, unit: str, units_mask=None):
    """Parent-level (or group-level) side for every crop, and the unit codes used."""
    codes = table.unit_codes(unit)
    V = table.class_counts_per_unit(unit)
    if units_mask is not None:
        V = V * units_mask[:, None]
    side_u = unit_sides_from_counts(V, q, v, seed)
    return side_u[codes], codes


@register_protocol("parent")
def parent_split(
    table: CropTable,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    seed: int = 0,
    unit: str = "parent",
) -> SplitManifest:
    """P2: parent-disjoint, class-stratified split with the test share as close to q as the
    parent sizes allow (the achieved share is reported, overall and per class).

    The split depends on the table only through its units' class counts
    (`unit_sides_from_counts`, `parent_split_report`).

    Args:
        table: the crops.
        test_fraction: q, the desired share of crops in test (and in every class).
        val_fraction: optional validation share, also parent-disjoint.
        seed: random seed.
        unit: 'parent', or 'group' to keep whole patients on one side.
    """
    q, v = _check_fractions(test_fraction, val_fraction)
    if unit in ("patient",):
        unit = "group"
    V = table.class_counts_per_unit(unit)
    side_u = unit_sides_from_counts(V, q, v, seed)
    rep = parent_split_report(V, side_u, table.classes, q, v, unit)
    params = {"test_fraction": q, "val_fraction": v, "seed": int(seed), "unit": unit, "stratified_by": "label"}
    return _manifest(table, side_u[table.unit_codes(unit)], "parent", params, rep)


# ---------------------------------------------------------------------------- P3
HashesById = Union[pd.Series, Mapping[str, object], str]


def _hashes_by_id(table: CropTable, hashes) -> np.ndarray:
    """(N,) uint64 hashes aligned with the table's (id-sorted) rows.

    `hashes` is keyed by crop id (a Series indexed by id, or a mapping id -> hash) or names a
    column of the table. A bare array or list is refused: the table sorts its rows by id, so
    its positions need not be the caller's rows, and a misaligned hash links unrelated parents
    while a real duplicate pair crosses the split.
    """
    from shortcutlab.data import dedup

    ids = table.ids
    if isinstance(hashes, str):
        if hashes not in table.frame.columns:
            raise SplitError(
                f"hash column {hashes!r} is not in the table; its columns are: {', '.join(table.frame.columns)} "
                "(give the hash column when building the table: phash=COL, or --hash-column COL)"
            )
        return dedup.hashes_for_ids(table.frame[hashes].to_numpy(dtype=object), ids, f"hash column {hashes!r}")
    if isinstance(hashes, pd.Series):
        if isinstance(hashes.index, pd.RangeIndex):
            raise SplitError(
                "hashes is a Series with a default RangeIndex (row positions), which cannot be matched to crop ids; "
                "index it by crop id (e.g. df.set_index('id')['phash']) or give the hash column when building the table"
            )
        keys, values = hashes.index.astype(str).to_numpy(dtype=object), hashes.to_numpy(dtype=object)
    elif isinstance(hashes, Mapping):
        keys = np.array([str(k) for k in hashes.keys()], dtype=object)
        values = np.array(list(hashes.values()), dtype=object)
    else:
        raise SplitError(
            f"hashes must be keyed by crop id (a pandas Series indexed by id, or a mapping id -> hash) or name a "
            f"column of the table; got {type(hashes).__name__}, whose positions cannot be matched to the table's "
            "id-sorted rows"
        )
    index = pd.Index(keys)
    if index.has_duplicates:
        dup = index[index.duplicated()].unique()[:5]
        raise SplitError(f"hashes give crop id(s) {list(dup)} more than once; give one hash per crop id")
    pos = index.get_indexer(ids)
    missing = pos < 0
    if missing.any():
        raise SplitError(
            f"hashes lack {int(missing.sum())} crop id(s) of the table, e.g. {[str(i) for i in ids[missing][:5]]}; "
            "give one hash per crop id"
        )
    if len(index) != len(ids):
        extra = index[~index.isin(ids)][:5]
        raise SplitError(
            f"hashes name {len(index) - len(ids)} id(s) that are not crops of the table, e.g. {list(extra)}; "
            "check that they are keyed by the table's id column"
        )
    return dedup.hashes_for_ids(values[pos], ids)


@register_protocol("parent-dedup")
def dedup_split(
    table: CropTable,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    seed: int = 0,
    hashes: HashesById | None = None,
    max_distance: int = 4,
    unit: str = "parent",
    invariant: bool = False,
) -> SplitManifest:
    """P3: merge parents linked by near-duplicate crops, then split parent-disjointly.

    Args:
        hashes: 64-bit perceptual hashes (uint64, int64 with the same bits, or 16-digit hex
            strings) keyed by crop id: a pandas Series indexed by id or a mapping id -> hash,
            or the name of a table column. A bare array is refused, because the table sorts
            its rows by id and positions would pair hashes with the wrong crops. Without
            `hashes` the table's phash column is used, else the crop images in its image
            column are hashed.
        max_distance: Hamming threshold (bits) under which two crops are near-duplicates.
        invariant: link a crop also to flipped and right-angle rotated copies of another
            (``min_g d(h(g x_i), h(x_j))`` over the eight dihedral transforms, as
            `shortcutlab.data.siblings`); needs the crop images (the image column), since the
            transformed hashes cannot be derived from stored 64-bit hashes.
        Other arguments as in `parent_split`.

    Raises:
        SplitError: the merged parents leave the test or training side empty (for example
            when near-duplicates chain every parent into one), or `hashes` cannot be
            matched to the crop ids.
        TableError: a hash is not 16 hex digits or a 64-bit integer (naming the crop id).

    Example:
        >>> df = pd.DataFrame({"id": ["b", "a", "d", "c"], "label": "x", "parent": ["p", "q", "r", "s"]})
        >>> h = pd.Series(["00000000000000ff", "00000000000000fe", "ff00000000000000", "0f0f0f0f0f0f0f0f"],
        ...               index=df["id"])
        >>> m = dedup_split(CropTable.from_frame(df, id="id"), 0.5, hashes=h, max_distance=1)
        >>> m.report["parents_after_merge"]   # p and q merge: crops b and a are 1 bit apart
        3
    """
    q, v = _check_fractions(test_fraction, val_fraction)
    _check_unit(unit)
    unit = "group" if unit in ("group", "patient") else "parent"
    res, method = _near_duplicate_links(table, hashes, max_distance, invariant)
    merged = _merge_linked_parents(table, res)
    side, codes = _unit_sides(merged, q, v, seed, unit)
    rep = _side_report(merged, side)
    _refuse_empty_sides(
        rep, q, v, unit, np.bincount(codes),
        f" after near-duplicate merging ({res.n_parents_before} parents became {res.n_parents_after})",
    )
    rep["max_class_deviation"] = round(max(abs(s - q) for s in rep["test_share_per_class"].values()), 6)
    rep.update(
        {
            "dedup_pairs": int(res.n_pairs),
            "parents_before_merge": int(res.n_parents_before),
            "parents_after_merge": int(res.n_parents_after),
        }
    )
    if table.has_group:
        rep.update({"groups_before_merge": int(table.n_groups), "groups_after_merge": int(merged.n_groups)})
    rep["empty_class_sides"] = _empty_class_sides(table, side, v > 0, "parent-dedup")
    params = {
        "test_fraction": q,
        "val_fraction": v,
        "seed": int(seed),
        "unit": unit,
        "stratified_by": "label",
        "dedup": {"method": method, "max_distance": int(max_distance), **({"invariant": True} if invariant else {})},
    }
    return _manifest(table, side, "parent-dedup", params, rep)


def _near_duplicate_links(table: CropTable, hashes: HashesById | None, max_distance: int, invariant: bool):
    """The parents linked by near-duplicate crops (a `dedup` link result) and the method's
    description for the manifest, from `hashes`, the phash column or the crop images
    (`dedup_split` says which wins)."""
    from shortcutlab.data import dedup

    if invariant:
        if hashes is not None or not table.has_images:
            raise SplitError(
                "parent-dedup with invariant=True (--invariant) hashes the crop images under flips and rotations: "
                "give an image column (--image COL), not stored hashes"
            )
        from shortcutlab.data.siblings import dihedral_hashes, read_image

        ids = table.ids
        variants = dihedral_hashes([read_image(p, ids[k]) for k, p in enumerate(table.frame["image"].tolist())])
        res = dedup.link_parents_dihedral(table.parent_codes, variants, max_distance=max_distance)
        return res, "phash-64 under the 8 dihedral transforms, multi-index hashing + connected components"
    if hashes is None and "phash" in table.frame.columns:
        hashes = "phash"
    if hashes is None:
        if not table.has_images:
            raise SplitError("parent-dedup needs perceptual hashes: give an image column (--image COL) or a hash column (--hash-column COL)")
        h = dedup.perceptual_hashes(table.frame["image"].tolist())
    else:
        h = _hashes_by_id(table, hashes)
    res = dedup.link_parents(table.parent_codes, h, max_distance=max_distance)
    return res, "phash-64 multi-index hashing + connected components"


def _merge_linked_parents(table: CropTable, res) -> CropTable:
    """`table` with each set of linked parents merged into one, named after its first member
    so that manifests stay readable; with a group column, parents merged across patients join
    those patients."""
    frame = table.to_frame()
    frame["parent"] = table.parents[res.first_parents[res.merged_codes]]
    if table.has_group:
        # Groups become the connected components of the merged-parent / group graph, named
        # after their first group.
        from scipy.sparse.csgraph import connected_components

        g = table.group_codes
        M, G = int(res.merged_codes.max()) + 1, int(g.max()) + 1
        graph = csr_matrix((np.ones(len(g)), (res.merged_codes, M + g)), shape=(M + G, M + G))
        _, comp = connected_components(graph, directed=False)
        first_group = pd.Series(g).groupby(comp[M + g]).transform("min").to_numpy()
        frame["group"] = table.groups[first_group]
    return CropTable(frame, source=table.source + " (near-duplicate parents merged)")


# ---------------------------------------------------------------------------- ladder
@register_protocol("ladder")
def ladder_split(
    table: CropTable,
    test_fraction: float = 0.2,
    seed: int = 0,
    levels: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
) -> SplitManifest:
    """The relatedness ladder (HSD-Bench, reference 001): from intact parents to crop-level.

    At level f a random share f of the parents may cross the split: their crops are assigned
    one by one (stratified by class), while the other parents stay whole (parent-disjoint
    selection). The crossing parents are nested across levels. Level 0 equals `parent_split`
    and level 1 equals `crop_split` with the same seed.

    Returns:
        A manifest with one cell per level (``level_0.25``) and a ``level`` column.
    """
    q = _check_test_fraction(test_fraction)
    levels = _check_levels(levels)
    P = table.n_parents
    order = _rng(seed, _LADDER_ORDER).permutation(P)
    rank = np.empty(P, dtype=np.int64)
    rank[order] = np.arange(P)
    keys = _rng(seed, _CROP_KEYS).random(table.n_crops)
    names = np.array(["train", "val", "test"], dtype=object)
    frames, rep = [], {"levels": {}, "empty_class_sides": []}
    from shortcutlab.data.exposure import sibling_exposure

    for f in sorted(levels):
        crossing_p = rank < int(round(f * P))
        crossing = crossing_p[table.parent_codes]
        side = np.zeros(table.n_crops, dtype=np.int8)
        idx = np.flatnonzero(crossing)
        side[idx] = _stratified_crop_sides(table.label_codes, keys, idx, q, 0.0)
        if (~crossing).any():
            side_intact, _ = _unit_sides(table, q, 0.0, seed, "parent", units_mask=~crossing_p)
            side[~crossing] = side_intact[~crossing]
        name = f"level_{f:.2f}"
        frames.append(pd.DataFrame({"id": table.ids, "split": names[side], "cell": name, "level": f}))
        r = _side_report(table, side)
        empty = [s for s in ("train", "test") if r[f"n_{s}"] == 0]
        if empty:
            raise SplitError(
                f"ladder level {f:g} with test fraction {q} left the {' and '.join(empty)} side empty; the table has "
                f"{P} parents of sizes up to {int(table.parent_sizes.max())} crops and {table.n_crops} crops"
            )
        rep["empty_class_sides"] += _empty_class_sides(table, side, False, "ladder", cell=name)
        r["crossing_parents"] = int(crossing_p.sum())
        r["test_with_train_sibling"] = round(sibling_exposure(table.parent_codes, side == 2, side == 0), 6)
        rep["levels"][name] = r
    params = {"test_fraction": q, "seed": int(seed), "levels": sorted(levels), "stratified_by": "label"}
    return SplitManifest(pd.concat(frames, ignore_index=True), protocol="ladder", params=params, report=rep)


# ---------------------------------------------------------------------------- factorial
FACTORIAL_CELLS = ("leak-high", "clean-high", "leak-low", "clean-low")


class _Uncovered(SplitError):
    """Some parents of a factorial cell cannot give a crop within the class targets."""

    def __init__(self, message: str, parents: np.ndarray):
        super().__init__(message)
        self.parents = parents


def _allocate_cell(
    parents: np.ndarray,
    avail: np.ndarray,
    must: np.ndarray,
    labels: np.ndarray,
    crop_parent: np.ndarray,
    prio: np.ndarray,
    targets: np.ndarray,
    cell: str,
    classes: Sequence[str],
) -> np.ndarray:
    """Pick exactly targets[c] crops of each class c from `parents`, at least one per parent.

    Args:
        parents: (F,) parent codes of the cell.
        avail: (N,) bool, crops that may train (test crops excluded).
        must: (N,) bool, crops preferred once every parent is covered (a leak cell's
            siblings of test parents).
        labels, crop_parent: (N,) class and parent codes.
        prio: (N,) random priority; lower first, shared by cells so common parents give
            the same crops where they can.
        targets: (C,) crops per class.
        cell, classes: names for messages.

    Returns:
        (N,) bool training mask.
    """
    in_cell = np.isin(crop_parent, parents) & avail
    chosen = np.zeros(len(labels), dtype=bool)
    C = len(targets)
    need = np.asarray(targets, dtype=np.int64).copy()
    # Which class each parent gives its first crop in is a flow problem: source -> parent
    # (capacity 1) -> class it holds crops of (1) -> sink (the class target). A maximum flow
    # covers every parent whenever any allocation can.
    parents = np.asarray(parents)
    F = len(parents)
    pos = np.full(crop_parent.max() + 1, -1, dtype=np.int64)
    pos[parents] = np.arange(F)
    cand = np.flatnonzero(in_cell)
    has = np.zeros((F, C), dtype=bool)
    has[pos[crop_parent[cand]], labels[cand]] = True
    src, sink = 0, F + C + 1
    pr, pc = np.nonzero(has)
    rows = np.r_[np.zeros(F, dtype=np.int64), 1 + pr, 1 + F + np.arange(C)]
    cols = np.r_[1 + np.arange(F), 1 + F + pc, np.full(C, sink)]
    caps = np.r_[np.ones(F + len(pr), dtype=np.int32), need.astype(np.int32)]
    graph = csr_matrix((caps, (rows, cols)), shape=(sink + 1, sink + 1))
    flow = maximum_flow(graph, src, sink)
    f = flow.flow.tocsr()[1 : F + 1, F + 1 : F + 1 + C].toarray()
    if flow.flow_value < F:
        raise _Uncovered(
            f"factorial cell {cell!r}: its {F} parents cannot each give a crop within the class targets "
            f"{dict(zip(classes, np.asarray(targets).tolist()))} ({flow.flow_value} can); with mixed-class parents "
            "use --allocation proportional, or choose a larger --n-per-class",
            parents[(f > 0).sum(axis=1) == 0],
        )
    give = np.argmax(f > 0, axis=1)  # each parent's class, exactly one unit of flow
    # The parent's highest-priority crop of that class.
    first = cand[np.lexsort((prio[cand], labels[cand], pos[crop_parent[cand]]))]
    key = pos[crop_parent[first]] * C + labels[first]
    uniq, idx = np.unique(key, return_index=True)
    pick = first[idx][np.searchsorted(uniq, np.arange(F) * C + give)]
    chosen[pick] = True
    need -= np.bincount(labels[pick], minlength=C)
    # After every parent is covered, a leak cell fills with the test parents' siblings first.
    rest = np.flatnonzero(in_cell & ~chosen)
    rest = rest[np.lexsort((prio[rest], ~must[rest], labels[rest]))]
    for c in range(C):
        if need[c] == 0:
            continue
        take = rest[labels[rest] == c][: need[c]]
        if len(take) < need[c]:
            raise SplitError(
                f"factorial cell {cell!r} has only {int(targets[c] - need[c] + len(take))} crops of class "
                f"{classes[c]!r} for a target of {int(targets[c])}; choose a smaller --n-per-class"
            )
        chosen[take] = True
        need[c] = 0
    return chosen


def _factorial_cells(
    others: np.ndarray,
    test_parents: np.ndarray,
    dom: np.ndarray,
    C: int,
    contrast: float,
    cap: np.ndarray,
    classes: Sequence[str],
) -> dict[str, np.ndarray]:
    """Parents of the four cells: per dominant class c, the first F_c other parents (clean)
    or the first F_c - L_c plus the L_c test parents (leak), F_c at most cap[c]."""
    cells: dict[str, np.ndarray] = {}
    for level, divisor in (("high", 1.0), ("low", contrast)):
        clean_p, leak_p = [], []
        for c in range(C):
            o_c = others[dom[others] == c]
            t_c = test_parents[dom[test_parents] == c]
            # A class with few parents keeps at least its test parents' worth of slots, so
            # the low level may be a little less contrasted; the achieved contrast is reported.
            f_c = max(int(round(min(len(o_c), int(cap[c])) / divisor)), len(t_c))
            if f_c > len(o_c):
                raise SplitError(
                    f"factorial class {classes[c]!r}: {len(o_c)} other parents cannot be swapped for "
                    f"{len(t_c)} test parents; lower --test-parent-share"
                )
            clean_p.append(o_c[:f_c])
            leak_p.append(np.r_[o_c[: f_c - len(t_c)], t_c])
        cells[f"clean-{level}"] = np.concatenate(clean_p)
        cells[f"leak-{level}"] = np.concatenate(leak_p)
    return cells


@register_protocol("factorial")
def factorial_split(
    table: CropTable,
    seed: int = 0,
    test_parent_share: float = 0.3,
    diversity_contrast: float = 1.43,
    n_per_class: int | None = None,
    allocation: str = "balanced",
    test_fraction: float | None = None,
    reserve_parent_share: float = 0.0,
) -> SplitManifest:
    """The leak/clean x diversity factorial of the main paper (H3).

    One common test set per seed: half the crops (k // 2) of a random `test_parent_share` of
    the multi-crop parents (drawn within each dominant class). Four training sets with the same
    crops per class (`allocation`):

    - ``clean-high``: the first F_c other parents of each dominant class c, in one permutation;
    - ``leak-high``: the same permutation with its last L_c parents swapped for the L_c test
      parents of class c, whose remaining siblings train;
    - ``clean-low`` / ``leak-low``: likewise with F_c / `diversity_contrast` parents.

    Within a level, leak and clean cells have equal crop count, parent count and crops per
    class; the function checks this (and that clean cells hold no test parent, leak cells a
    sibling of every test parent) and reports the counts.

    Args:
        test_parent_share: share of multi-crop parents that give half their crops to test.
        diversity_contrast: ratio of training parents between the high and low levels.
        n_per_class: with 'balanced' allocation, training crops of every class in every cell
            (default: the most all cells allow); with 'proportional', the training crops of the
            largest class (the others in proportion to the table's class counts).
        allocation: 'balanced' (the paper's equal crops per class, natural for single-class
            parents) or 'proportional' (class shares of the table; needed when parents mix
            classes, as in CRIC, and a rare class cannot cover every parent).
        test_fraction: accepted for CLI symmetry; the test size follows from test_parent_share.
        reserve_parent_share: share of the non-test parents of each dominant class kept out of
            every cell (in no row of the manifest), so that fields no model has seen remain:
            the targets of the paper's F2 colour transfer (`interventions.unseen_field_targets`).
            0 (the default) leaves the design, and its hash, as without the option.
    """
    _check_factorial_params(test_parent_share, diversity_contrast, n_per_class, allocation, reserve_parent_share)
    # The draws below share one generator in a fixed order (dominant-class tie-breaks, test
    # parents, crop priorities, the permutation of the other parents): reordering them would
    # change every design and its hash.
    rng = _rng(seed, _FACTORIAL)
    C = table.n_classes
    V = table.class_counts_per_unit("parent")
    dom = np.argmax(V + rng.random(V.shape) * 1e-3, axis=1)
    test_parents = _factorial_test_parents(rng, table.parent_sizes, dom, C, test_parent_share)
    is_test_parent = np.zeros(table.n_parents, dtype=bool)
    is_test_parent[test_parents] = True
    prio, test, sibling = _factorial_test_crops(rng, table, is_test_parent)
    others, reserved = _factorial_other_parents(rng, is_test_parent, dom, C, reserve_parent_share)
    class_n = np.bincount(table.label_codes, minlength=C).astype(np.float64)
    weight = np.ones(C) if allocation == "balanced" else class_n / np.maximum(class_n.max(), 1)
    masks, targets, n = _factorial_design(table, dom, test_parents, others, test, sibling, prio, weight,
                                          float(diversity_contrast), n_per_class)

    params = {
        "seed": int(seed),
        "test_parent_share": float(test_parent_share),
        "diversity_contrast": float(diversity_contrast),
        "n_per_class": n,
        "allocation": allocation,
        "unit": "crop (factorial)",
    }
    if reserve_parent_share > 0:
        params["reserve_parent_share"] = float(reserve_parent_share)
    report = _factorial_report(table, masks, test, is_test_parent, targets, n, len(test_parents),
                               len(reserved) if reserve_parent_share > 0 else None)
    frames = []
    ids = table.ids
    for name in FACTORIAL_CELLS:
        frames.append(pd.DataFrame({"id": ids[masks[name]], "split": "train", "cell": name}))
        frames.append(pd.DataFrame({"id": ids[test], "split": "test", "cell": name}))
    return SplitManifest(pd.concat(frames, ignore_index=True), protocol="factorial", params=params, report=report)


def _factorial_report(table: CropTable, masks: dict[str, np.ndarray], test: np.ndarray, is_test_parent: np.ndarray,
                      targets: np.ndarray, n: int, n_test_parents: int, n_reserved: int | None) -> dict:
    """The factorial manifest's report: `_check_factorial`'s counts (it raises if a matching
    constraint fails), the test set and targets, reserved parents (None: no reserve) and the
    empty class sides of every cell."""
    report = _check_factorial(table, masks, test, is_test_parent, targets)
    report.update(
        {
            "n_test": int(test.sum()),
            "n_test_parents": int(n_test_parents),
            "n_per_class": n,
            "train_crops_per_class": {c: int(t) for c, t in zip(table.classes, targets)},
        }
    )
    if n_reserved is not None:
        report["n_reserved_parents"] = int(n_reserved)
    report["empty_class_sides"] = []
    for name in FACTORIAL_CELLS:
        side = np.where(test, 2, np.where(masks[name], 0, -1)).astype(np.int8)
        report["empty_class_sides"] += _empty_class_sides(table, side, False, "factorial", cell=name)
    return report

def _factorial_test_parents(rng: np.random.Generator, k: np.ndarray, dom: np.ndarray, C: int, share: float) -> np.ndarray:
    """Sorted codes of the test parents: a `share` of the multi-crop parents (k >= 2) of each
    dominant class, drawn within the class so that every class keeps enough other parents to
    swap them for."""
    multi = np.flatnonzero(k >= 2)
    if len(multi) < 1:
        raise SplitError("the factorial needs multi-crop parents for its test set; every parent of this table has one crop")
    picks = []
    for c in range(C):
        m_c = multi[dom[multi] == c]
        n_c = int(round(share * len(m_c)))
        if n_c:
            picks.append(rng.choice(m_c, size=n_c, replace=False))
    test_parents = np.sort(np.concatenate(picks)) if picks else np.zeros(0, dtype=np.int64)
    if len(test_parents) < 1:
        raise SplitError(f"test_parent_share {share} selects no test parent among {len(multi)} multi-crop parents")
    return test_parents


def _factorial_test_crops(rng: np.random.Generator, table: CropTable, is_test_parent: np.ndarray):
    """(N,) crop priorities (a random permutation, lower first), the common test set (half of
    each test parent's crops, k // 2, in priority order) and the test parents' other crops
    (their siblings in training)."""
    N, crop_parent, k = table.n_crops, table.parent_codes, table.parent_sizes
    prio = rng.permutation(N)
    order = np.lexsort((prio, crop_parent))
    starts = np.r_[0, np.cumsum(k)[:-1]]
    rank_in_parent = np.empty(N, dtype=np.int64)
    rank_in_parent[order] = np.arange(N) - np.repeat(starts, k)
    test = is_test_parent[crop_parent] & (rank_in_parent < (k // 2)[crop_parent])
    sibling = is_test_parent[crop_parent] & ~test
    return prio, test, sibling


def _factorial_other_parents(rng: np.random.Generator, is_test_parent: np.ndarray, dom: np.ndarray, C: int,
                             reserve_share: float) -> tuple[np.ndarray, np.ndarray]:
    """The non-test parents in random order (cells take them from the front), and the sorted
    reserved ones: the first `reserve_share` of each dominant class in the same permutation
    (no extra draw, so the default design is unchanged)."""
    others = np.flatnonzero(~is_test_parent)
    others = others[rng.permutation(len(others))]
    keep = np.ones(len(others), dtype=bool)
    for c in range(C):
        pos = np.flatnonzero(dom[others] == c)
        keep[pos[: int(round(reserve_share * len(pos)))]] = False
    return others[keep], np.sort(others[~keep])


def _factorial_design(table: CropTable, dom: np.ndarray, test_parents: np.ndarray, others: np.ndarray, test: np.ndarray,
                      sibling: np.ndarray, prio: np.ndarray, weight: np.ndarray, contrast: float,
                      n_per_class: int | None) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """(cell -> (N,) bool training mask, (C,) training crops per class, n per class) of the
    largest consistent design, or of the one `n_per_class` asks for.

    Each parent of a cell gives at least one crop, so a class cannot hold more parents than
    crops. The parent counts and the crops per class depend on each other; shrinking both
    from "all other parents" reaches the largest consistent design in a few rounds.
    """
    C, N, crop_parent, labels = table.n_classes, table.n_crops, table.parent_codes, table.label_codes
    avail = ~test
    cap = np.full(C, np.iinfo(np.int64).max)
    for _ in range(200):
        cells = _factorial_cells(others, test_parents, dom, C, contrast, cap, table.classes)
        n = n_per_class
        if n is None:
            n = _factorial_largest_n(table, cells, avail, weight)
        if int(n) < 1:
            raise SplitError(f"n_per_class must be >= 1, got {n}")
        targets = np.floor(weight * int(n) + 1e-9).astype(np.int64)
        high = np.bincount(dom[cells["clean-high"]], minlength=C)
        try:
            masks = {}
            for name in FACTORIAL_CELLS:
                must = sibling if name.startswith("leak") else np.zeros(N, dtype=bool)
                masks[name] = _allocate_cell(cells[name], avail, must, labels, crop_parent, prio, targets, name, table.classes)
            return masks, targets, int(n)
        except _Uncovered as e:
            if n_per_class is not None:
                raise
            # Fewer parents of the classes whose parents found no room, then try again.
            short = np.bincount(dom[e.parents], minlength=C)
            new_cap = np.where(short > 0, np.minimum(cap, np.maximum(high - short, 1)), cap)
            if (new_cap == cap).all():
                raise
            cap = new_cap
    raise SplitError("the factorial found no feasible design in 200 rounds; pass --n-per-class explicitly")


def _factorial_largest_n(table: CropTable, cells: dict[str, np.ndarray], avail: np.ndarray, weight: np.ndarray) -> int:
    """The largest scale n (class targets ``floor(weight * n)``) that every cell's available
    crops can supply in every class."""
    crop_parent, labels, C = table.parent_codes, table.label_codes, table.n_classes
    scale = np.inf
    for ps in cells.values():
        m = np.isin(crop_parent, ps) & avail
        have = np.bincount(labels[m], minlength=C)
        scale = min(scale, float(np.min(have / weight)))
    return int(np.floor(scale + 1e-9))


def _check_factorial(table, masks, test, is_test_parent, targets) -> dict:
    """Verify the design's matching constraints; raise if any fails; return the counts."""
    from shortcutlab.data.exposure import sibling_exposure

    crop_parent, labels, C = table.parent_codes, table.label_codes, table.n_classes
    rep: dict = {"cells": {}}
    for name, m in masks.items():
        if (m & test).any():
            raise SplitError(f"internal check failed: factorial cell {name!r} trains on test crops")
        per_class = np.bincount(labels[m], minlength=C)
        if not (per_class == targets).all():
            raise SplitError(f"internal check failed: cell {name!r} has crops per class {per_class.tolist()}, expected {targets.tolist()}")
        parents = np.unique(crop_parent[m])
        n_test_par_in_train = int(is_test_parent[parents].sum())
        rep["cells"][name] = {
            "n_crops": int(m.sum()),
            "n_parents": int(len(parents)),
            "crops_per_class": {c: int(x) for c, x in zip(table.classes, per_class)},
            "test_parents_in_training": n_test_par_in_train,
            "test_with_train_sibling": round(sibling_exposure(crop_parent, test, m), 6),
        }
    for level in ("high", "low"):
        a, b = rep["cells"][f"leak-{level}"], rep["cells"][f"clean-{level}"]
        for key in ("n_crops", "n_parents", "crops_per_class"):
            if a[key] != b[key]:
                raise SplitError(f"internal check failed: leak-{level} and clean-{level} differ in {key}: {a[key]} vs {b[key]}")
        if b["test_parents_in_training"] != 0:
            raise SplitError(f"internal check failed: clean-{level} trains on test parents")
        if a["test_parents_in_training"] != int(is_test_parent.sum()):
            raise SplitError(f"internal check failed: leak-{level} lacks siblings of some test parents")
    hi, lo = rep["cells"]["clean-high"]["n_parents"], rep["cells"]["clean-low"]["n_parents"]
    rep["achieved_diversity_contrast"] = round(hi / lo, 4) if lo else None
    rep["matched"] = True
    return rep
