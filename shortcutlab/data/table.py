"""The crop table: one row per crop, with its label and its acquisition parent.

A `CropTable` is the input to everything else in shortcutlab. It holds canonical columns

========  ==========================================================================
id        crop identifier (string, unique)
label     class (string)
parent    acquisition parent: microscope field, slide image, ... (string)
group     optional higher unit, e.g. patient (string); every parent lies in one group
image     optional path of the crop image
mask      optional path of the crop's cell mask
phash     optional 64-bit perceptual hash of the crop image, 16 hex digits (for P3)
x, y      optional box top-left corner in parent pixel coordinates (float)
w, h      optional box width and height in pixels (float, > 0)
========  ==========================================================================

Rows are kept sorted by id so that every computation (and every seeded split) is independent
of the row order of the file the table came from.

Surrounding whitespace is stripped from id, label, parent, group and phash values, wherever
the table comes from: ``'HSIL '`` and ``'HSIL'`` are one class, ``' 12'`` and ``'12'`` one
parent. A value that is only whitespace counts as empty and is refused. Image and mask paths
are kept exactly as written.

Example:
    >>> import pandas as pd
    >>> df = pd.DataFrame({"cell": [1, 2, 3], "cls": ["a", "a", "b"], "img": [7, 7, 8]})
    >>> t = CropTable.from_frame(df, id="cell", label="cls", parent="img")
    >>> t.n_crops, t.n_parents, t.classes
    (3, 2, ('a', 'b'))
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np
import pandas as pd

from shortcutlab.errors import TableError, first_rows

ColumnSpec = str | Sequence[str] | None

_STRING_COLUMNS = ("id", "label", "parent", "group", "image", "mask", "phash")
# Names, not paths: ' HSIL' and 'HSIL' are one class, so surrounding whitespace is dropped.
_STRIPPED_COLUMNS = ("id", "label", "parent", "group", "phash")
_GEOMETRY = ("x", "y", "w", "h")


def _as_columns(spec: ColumnSpec, n: int | None, what: str) -> list[str] | None:
    """Turn 'A,B' or ['A', 'B'] into a list of column names, checking the count."""
    if spec is None:
        return None
    cols = [c.strip() for c in spec.split(",")] if isinstance(spec, str) else [str(c) for c in spec]
    if any(not c for c in cols):
        raise TableError(f"{what} has an empty column name: {spec!r}")
    if n is not None and len(cols) != n:
        raise TableError(f"{what} needs {n} column names, got {len(cols)}: {spec!r}")
    return cols


@dataclass(frozen=True)
class _Roles:
    """Which columns of a source table play which role (the keywords of `CropTable.from_frame`,
    checked): `optional` maps group / image / mask / phash to their column where given;
    `crop_size` is a number or None when the size is the column `size_col`."""

    label: str
    parent: str
    id: list[str] | None
    optional: dict[str, str]
    box: list[str] | None
    center: list[str] | None
    size_col: str | None
    crop_size: float | str | None

    @classmethod
    def of(cls, id: ColumnSpec = None, label: str = "label", parent: str = "parent",
           group: str | None = None, image: str | None = None, mask: str | None = None,
           phash: str | None = None, box: ColumnSpec = None, center: ColumnSpec = None,
           crop_size: float | str | None = None) -> "_Roles":
        if box is not None and center is not None:
            raise TableError("give the geometry either as a box (x,y,w,h) or as a center plus crop size, not both")
        if center is not None and crop_size is None:
            raise TableError("a center (cx,cy) needs a crop size (--crop-size S)")
        if crop_size is not None and center is None:
            raise TableError("a crop size needs a center (--center CX,CY)")
        size_col = crop_size if isinstance(crop_size, str) else None
        if isinstance(size_col, str):
            try:
                crop_size = float(size_col)
                size_col = None
            except ValueError:
                pass
        optional = {"group": group, "image": image, "mask": mask, "phash": phash}
        return cls(label=label, parent=parent, id=_as_columns(id, None, "id"),
                   optional={k: v for k, v in optional.items() if v is not None},
                   box=_as_columns(box, 4, "box (x,y,w,h)"), center=_as_columns(center, 2, "center (cx,cy)"),
                   size_col=size_col, crop_size=crop_size)

    def wanted(self) -> dict[str, list[str]]:
        """Role -> the column names it reads, in the order missing columns are reported."""
        wanted = {"label": [self.label], "parent": [self.parent]}
        if self.id:
            wanted["id"] = self.id
        wanted.update({name: [col] for name, col in self.optional.items()})
        if self.box:
            wanted["box"] = self.box
        if self.center:
            wanted["center"] = self.center
        if self.size_col:
            wanted["crop size"] = [self.size_col]
        return wanted

    def text_columns(self) -> list[str]:
        """The source columns read as text (id parts, label, parent, the optional roles)."""
        return list(dict.fromkeys([*(self.id or []), self.label, self.parent, *self.optional.values()]))

    def number_columns(self) -> list[str]:
        """The source columns read as numbers (box, center, crop size)."""
        return list(dict.fromkeys([*(self.box or []), *(self.center or []), *([self.size_col] if self.size_col else [])]))


@dataclass(frozen=True, eq=False)
class CropTable:
    """A validated crop -> parent table.

    Build one with `CropTable.from_csv` or `CropTable.from_frame`; the constructor takes an
    already canonical frame (see the module docstring) and validates it again. Ids, labels,
    parents, groups and hashes lose surrounding whitespace; image and mask paths do not.

    Attributes:
        frame: the canonical DataFrame, sorted by id, with a default RangeIndex.
        source: where the table came from (a path or 'DataFrame'), for messages and reports.
    """

    frame: pd.DataFrame
    source: str = "DataFrame"

    def __post_init__(self) -> None:
        object.__setattr__(self, "frame", _validate(self.frame))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_frame(
        cls,
        df: pd.DataFrame,
        *,
        id: ColumnSpec = None,
        label: str = "label",
        parent: str = "parent",
        group: str | None = None,
        image: str | None = None,
        mask: str | None = None,
        phash: str | None = None,
        box: ColumnSpec = None,
        center: ColumnSpec = None,
        crop_size: float | str | None = None,
        source: str = "DataFrame",
    ) -> "CropTable":
        """Map the columns of `df` onto a crop table.

        Args:
            df: one row per crop.
            id: column holding the crop id, or several columns joined with '/' (for example
                ``["image_id", "cell_id"]``). Without it the row number is the id, which then
                depends on the row order of `df`.
            label: class column.
            parent: acquisition-parent column.
            group: optional higher-level unit (patient) column.
            image, mask: optional path columns.
            phash: optional column of precomputed perceptual hashes (16 hex digits).
            box: four columns ``x, y, w, h`` (top-left corner and size, parent pixels).
            center: two columns ``cx, cy``; needs `crop_size`.
            crop_size: side of a square crop in pixels (a number), or a column name.
            source: description kept for messages.

        Raises:
            TableError: naming the column and the first offending rows.
        """
        if not isinstance(df, pd.DataFrame):
            raise TableError(f"expected a pandas DataFrame, got {type(df).__name__}")
        roles = _Roles.of(id=id, label=label, parent=parent, group=group, image=image, mask=mask,
                          phash=phash, box=box, center=center, crop_size=crop_size)
        _require_columns(df, roles.wanted(), source)
        out = _text_columns(df, roles.id, label, parent, roles.optional)
        if roles.box:
            for key, c in zip(_GEOMETRY, roles.box):
                out[key] = _as_number(df[c], f"box column {c!r}")
        elif roles.center:
            out.update(_boxes_from_centers(df, roles.center, roles.size_col, roles.crop_size))

        # `.array` keeps Arrow strings as they are (no Python object per value) and drops the index.
        frame = pd.DataFrame({k: v.array if isinstance(v, pd.Series) else np.asarray(v) for k, v in out.items()}, copy=False)
        return cls(frame, source=source)

    @classmethod
    def from_csv(cls, path: str | os.PathLike, **columns) -> "CropTable":
        """Read a CSV file and map its columns (same keywords as `from_frame`).

        Only empty cells count as missing: a label spelled 'NA' stays a label.
        """
        path = os.fspath(path)
        if not os.path.exists(path):
            raise TableError(f"table file {path!r} does not exist")
        if os.path.isdir(path):
            raise TableError(f"table file {path!r} is a folder; give the CSV file inside it")
        roles = _Roles.of(**columns)
        frame = _canonical_frame(_csv_batches(path, roles), roles)
        if frame is not None:
            return cls._trusted(frame, path)
        # Something in the file is not as the fast path expects (or a check failed): the
        # readers below read it whole and name the problem with its row numbers.
        dtype = {c: str for c in roles.text_columns()}
        df = _read_csv_arrow(path, list(dtype))
        if df is not None:
            return cls.from_frame(df, source=path, **columns)
        try:
            # Arrow could not read it: pandas' C reader either reads it or names the problem.
            # Only the string roles are read as text; geometry is parsed by the C reader.
            df = pd.read_csv(path, dtype=dtype, keep_default_na=False, na_values=[""])
        except pd.errors.EmptyDataError:
            raise TableError(f"table file {path!r} is empty") from None
        except UnicodeDecodeError:
            raise TableError(_not_utf8(path)) from None
        except pd.errors.ParserError as e:
            reason = " ".join(str(e).split()).removeprefix("Error tokenizing data. C error: ")
            raise TableError(f"table file {path!r} is not a readable CSV file: {reason}") from None
        except OSError as e:
            raise TableError(f"table file {path!r} cannot be read: {e.strerror or e}") from None
        return cls.from_frame(df, source=path, **columns)

    @classmethod
    def from_parquet(cls, path: str | os.PathLike, **columns) -> "CropTable":
        """Read a Parquet file (or a folder of Parquet files, one dataset) and map its columns
        (same keywords as `from_frame` and `from_csv`).

        Text columns stay Arrow strings from the file to the validated table. Missing values
        are Parquet nulls; an empty string in a text column is refused like an empty CSV cell.

        Example:
            >>> import tempfile, os
            >>> df = pd.DataFrame({"cell": ["a", "b"], "cls": ["x", "y"], "img": ["f1", "f1"]})
            >>> path = os.path.join(tempfile.mkdtemp(), "crops.parquet")
            >>> df.to_parquet(path)
            >>> CropTable.from_parquet(path, id="cell", label="cls", parent="img").n_parents
            1
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = os.fspath(path)
        if not os.path.exists(path):
            raise TableError(f"table file {path!r} does not exist")
        roles = _Roles.of(**columns)
        frame = _canonical_frame(_parquet_batches(path, roles), roles)
        if frame is not None:
            return cls._trusted(frame, path)
        try:
            arrow = pq.read_table(path)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            reason = " ".join(str(e).split())
            raise TableError(f"table file {path!r} is not a readable Parquet file: {reason}") from None
        except OSError as e:
            raise TableError(f"table file {path!r} cannot be read: {e.strerror or e}") from None
        df = arrow.to_pandas(types_mapper={pa.string(): _text_dtype(), pa.large_string(): _text_dtype()}.get)
        return cls.from_frame(df, source=path, **columns)

    @classmethod
    def _trusted(cls, frame: pd.DataFrame, source: str) -> "CropTable":
        """A table around a frame that `_canonical_frame` built and checked (canonical, sorted
        by id, valid), without validating it a second time."""
        table = cls.__new__(cls)
        object.__setattr__(table, "frame", frame)
        object.__setattr__(table, "source", source)
        return table

    # ------------------------------------------------------------------ views
    def __len__(self) -> int:
        return len(self.frame)

    def __repr__(self) -> str:
        geo = ", geometry" if self.has_geometry else ""
        grp = f", {self.n_groups} groups" if self.has_group else ""
        return (
            f"CropTable({self.n_crops} crops, {self.n_parents} parents{grp}, "
            f"{self.n_classes} classes{geo}; from {self.source})"
        )

    @property
    def ids(self) -> np.ndarray:
        """Crop ids, sorted (object array of str)."""
        return self.frame["id"].to_numpy(dtype=object)

    @property
    def has_geometry(self) -> bool:
        return "x" in self.frame.columns

    @property
    def has_group(self) -> bool:
        return "group" in self.frame.columns

    @property
    def has_images(self) -> bool:
        return "image" in self.frame.columns

    @cached_property
    def _parent_factor(self) -> tuple[np.ndarray, np.ndarray]:
        codes, uniques = pd.factorize(self.frame["parent"], sort=True)
        return codes.astype(np.int64), np.asarray(uniques, dtype=object)

    @cached_property
    def _label_factor(self) -> tuple[np.ndarray, np.ndarray]:
        codes, uniques = pd.factorize(self.frame["label"], sort=True)
        return codes.astype(np.int64), np.asarray(uniques, dtype=object)

    @cached_property
    def _group_factor(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.has_group:
            raise TableError("this table has no group (patient) column; pass --group COL")
        codes, uniques = pd.factorize(self.frame["group"], sort=True)
        return codes.astype(np.int64), np.asarray(uniques, dtype=object)

    @property
    def parent_codes(self) -> np.ndarray:
        """(N,) int64 index of each crop's parent into `parents`."""
        return self._parent_factor[0]

    @property
    def parents(self) -> np.ndarray:
        """(P,) sorted parent names."""
        return self._parent_factor[1]

    @property
    def label_codes(self) -> np.ndarray:
        """(N,) int64 index of each crop's label into `classes`."""
        return self._label_factor[0]

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(str(c) for c in self._label_factor[1])

    @property
    def group_codes(self) -> np.ndarray:
        """(N,) int64 index of each crop's group (patient) into `groups`."""
        return self._group_factor[0]

    @property
    def groups(self) -> np.ndarray:
        """(G,) sorted group (patient) names."""
        return self._group_factor[1]

    @cached_property
    def parent_sizes(self) -> np.ndarray:
        """(P,) number of crops k_p of every parent."""
        return np.bincount(self.parent_codes, minlength=len(self.parents))

    @property
    def n_crops(self) -> int:
        return len(self.frame)

    @property
    def n_parents(self) -> int:
        return len(self.parents)

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def n_groups(self) -> int | None:
        return len(self._group_factor[1]) if self.has_group else None

    @property
    def boxes(self) -> np.ndarray:
        """(N, 4) float64 boxes x, y, w, h in parent pixels."""
        if not self.has_geometry:
            raise TableError("this table has no crop geometry; pass --box X,Y,W,H or --center CX,CY --crop-size S")
        return self.frame[list(_GEOMETRY)].to_numpy(dtype=np.float64)

    @cached_property
    def overlap_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Index pairs (i, j) of sibling crops whose boxes intersect (see `overlap`), cached."""
        from shortcutlab.data.overlap import overlapping_pairs

        return overlapping_pairs(self.parent_codes, self.boxes)

    def unit_codes(self, unit: str = "parent") -> np.ndarray:
        """(N,) codes of the split unit: 'parent' or 'group' (patient)."""
        if unit == "parent":
            return self.parent_codes
        if unit in ("group", "patient"):
            return self.group_codes
        raise TableError(f"split unit must be 'parent' or 'group', got {unit!r}")

    def class_counts_per_unit(self, unit: str = "parent") -> np.ndarray:
        """(U, C) int64 matrix: crops of each class in each unit."""
        codes = self.unit_codes(unit)
        u = int(codes.max()) + 1 if len(codes) else 0
        flat = codes * self.n_classes + self.label_codes
        return np.bincount(flat, minlength=u * self.n_classes).reshape(u, self.n_classes)

    def with_parents(self, parent: np.ndarray | pd.Series, source_note: str = "") -> "CropTable":
        """A copy whose parent column is replaced (for example merged near-duplicate parents)."""
        frame = self.frame.copy()
        frame["parent"] = np.asarray(parent, dtype=object).astype(str)
        return CropTable(frame, source=self.source + source_note)

    def to_frame(self) -> pd.DataFrame:
        """A copy of the canonical frame."""
        return self.frame.copy()


# ---------------------------------------------------------------------- helpers
def _require_columns(df: pd.DataFrame, wanted: dict[str, list[str]], source: str) -> None:
    """A `TableError` naming the first column of `wanted` (role -> column names) that `df`
    lacks, and the columns it has."""
    columns = [str(c) for c in df.columns]
    for role, cols in wanted.items():
        for c in cols:
            if c not in df.columns:
                raise TableError(
                    f"{role} column {c!r} is missing from {source}; columns are: {', '.join(columns)}"
                )


def _text_columns(df: pd.DataFrame, id_cols: list[str] | None, label: str, parent: str,
                  optional: dict[str, str | None]) -> dict[str, object]:
    """The table's text columns read from `df`: id (joined from `id_cols` with '/', or the row
    number), label, parent and each `optional` role (group, image, mask, phash) given a
    column."""
    out: dict[str, object] = {}
    if id_cols:
        parts = [_as_string(df[c], f"id column {c!r}") for c in id_cols]
        ids = parts[0]
        for p in parts[1:]:
            ids = ids.str.cat(p, sep="/")
        out["id"] = ids
    else:
        out["id"] = pd.Series(np.arange(len(df)).astype(str), index=df.index)
    out["label"] = _as_string(df[label], f"label column {label!r}")
    out["parent"] = _as_string(df[parent], f"parent column {parent!r}")
    for role, col in optional.items():
        if col is not None:
            out[role] = _as_string(df[col], f"{role} column {col!r}")
    return out


def _boxes_from_centers(df: pd.DataFrame, center_cols: list[str], size_col: str | None, crop_size) -> dict[str, object]:
    """Box columns x, y, w, h of square crops centred on the `center_cols` (cx, cy), of side
    `crop_size` (a number) or the `size_col` column."""
    n = len(df)
    cx = _as_number(df[center_cols[0]], f"center column {center_cols[0]!r}")
    cy = _as_number(df[center_cols[1]], f"center column {center_cols[1]!r}")
    if size_col:
        size = _as_number(df[size_col], f"crop size column {size_col!r}")
    else:
        size = float(crop_size)
        if not np.isfinite(size) or size <= 0:
            raise TableError(f"crop size must be a positive number of pixels, got {crop_size!r}")
    out: dict[str, object] = {"x": cx - np.asarray(size) / 2.0, "y": cy - np.asarray(size) / 2.0}
    out["w"] = np.broadcast_to(np.asarray(size, dtype=float), (n,)).copy() if np.ndim(size) == 0 else size
    out["h"] = out["w"].copy() if isinstance(out["w"], np.ndarray) else out["w"]
    return out


def _read_csv_arrow(path: str, text_columns: list[str]) -> pd.DataFrame | None:
    """The CSV read by Arrow's reader, the `text_columns` as Arrow strings and only empty
    cells missing; None when Arrow cannot read it or would read it otherwise than pandas
    (repeated column names, which pandas renames), so that pandas' reader reads it or names
    the problem in its own words.

    Arrow's reader runs 3x faster than pandas' with ``dtype=str`` (1.1 s against 3.2 s for
    5M crops on 2 cores) and keeps the strings in Arrow buffers.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    options = pacsv.ConvertOptions(column_types={c: pa.string() for c in text_columns},
                                   null_values=[""], strings_can_be_null=True)
    try:
        arrow = pacsv.read_csv(path, convert_options=options)
    except (pa.ArrowException, OSError):
        return None
    if len(set(arrow.column_names)) != len(arrow.column_names):
        return None
    text = _text_dtype()
    return arrow.to_pandas(types_mapper={pa.string(): text, pa.large_string(): text}.get, self_destruct=True)


# ---------------------------------------------------------------------- the fast path
# A table is read in Arrow batches, and each batch is converted to canonical columns and
# checked as it arrives, so that the file's own columns are dropped batch by batch instead
# of being held whole beside the converted ones (5M crops: a peak of 0.8 GB, as pd.read_csv's,
# against 1.8 GB for read-everything-then-convert). The fast path only decides *that* a table is valid: on
# anything unexpected it gives up (None), and the readers above read the table whole and
# name the problem, with the file's row numbers, in the words they always have.

#: CSV bytes per Arrow batch: large enough that per-batch calls cost nothing, small enough
#: that one batch's raw columns are a small part of the peak.
_BLOCK_BYTES = 16 << 20


def _csv_batches(path: str, roles: _Roles):
    """Yield the CSV's batches with only the columns `roles` reads: text as Arrow strings,
    numbers as float64 (declared, so Arrow infers nothing), only empty cells null. Yields
    nothing when the header repeats a name (pandas would rename it), lacks a column, or a
    column would be both text and number."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    text, numbers = roles.text_columns(), roles.number_columns()
    if set(text) & set(numbers):
        return
    try:
        with pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=1 << 16)) as head:
            names = head.schema.names
    except (pa.ArrowException, OSError):
        return
    if len(set(names)) != len(names) or not set(text + numbers) <= set(names):
        return
    types = {c: pa.large_string() for c in text} | {c: pa.float64() for c in numbers}
    options = pacsv.ConvertOptions(column_types=types, include_columns=list(types),
                                   null_values=[""], strings_can_be_null=True)
    with pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=_BLOCK_BYTES),
                        convert_options=options) as reader:
        yield from reader


def _parquet_batches(path: str, roles: _Roles):
    """Yield the Parquet file's (or folder's) batches with only the columns `roles` reads;
    nothing when one is missing or a column would be both text and number."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    text, numbers = roles.text_columns(), roles.number_columns()
    if set(text) & set(numbers):
        return
    try:
        data = pads.dataset(path, format="parquet", partitioning="hive")
    except (pa.ArrowException, OSError):
        return
    names = data.schema.names
    if len(set(names)) != len(names) or not set(text + numbers) <= set(names):
        return
    # One batch read ahead, not 16: the read-ahead batches are memory the table does not need.
    yield from data.to_batches(columns=text + numbers, batch_size=1 << 20, batch_readahead=1, fragment_readahead=1)


def _canonical_frame(batches, roles: _Roles) -> pd.DataFrame | None:
    """The canonical frame, sorted by id, of a table given as Arrow `batches`; None when the
    batches cannot be read or a check fails (empty text, a repeated id, bad geometry, a
    parent in two groups, no rows)."""
    import pyarrow as pa

    parts: dict[str, list] = {}
    n = 0
    pool = pa.default_memory_pool()
    try:
        for batch in batches:
            columns = _canonical_batch(batch, roles, n)
            if columns is None:
                return None
            for key, values in columns.items():
                parts.setdefault(key, []).append(values)
            n += batch.num_rows
    except (pa.ArrowException, OSError):
        return None
    pool.release_unused()  # the raw batches' pages back to the system, not kept for reuse
    return _sorted_frame(parts) if n else None


def _canonical_batch(batch, roles: _Roles, start: int) -> dict[str, object] | None:
    """One batch's canonical columns (text as Arrow arrays, stripped where names; geometry as
    float64 arrays), or None when a value fails a check. `start`: rows before this batch."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out: dict[str, object] = {}
    if roles.id:
        parts = [_arrow_text(batch.column(c)) for c in roles.id]
        if any(p is None for p in parts):
            return None
        out["id"] = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, pa.scalar("/", pa.large_string()))
    else:
        out["id"] = pa.array(np.arange(start, start + batch.num_rows)).cast(pa.large_string())
    out["label"] = _arrow_text(batch.column(roles.label))
    out["parent"] = _arrow_text(batch.column(roles.parent))
    out.update({role: _arrow_text(batch.column(col)) for role, col in roles.optional.items()})
    for role, values in out.items():
        if values is None:
            return None
        if role in _STRIPPED_COLUMNS:
            out[role] = values = pc.utf8_trim_whitespace(values)
        if values.null_count or pc.any(pc.equal(pc.binary_length(values), 0)).as_py():
            return None
    geometry = _batch_geometry(batch, roles)
    if geometry is None:
        return None
    out.update(geometry)
    return out


def _batch_geometry(batch, roles: _Roles) -> dict[str, np.ndarray] | None:
    """x, y, w, h of one batch as `from_frame` computes them (none without box or center);
    None when a value is missing, not finite, or a size is not positive."""
    if roles.box:
        geo = {key: _arrow_number(batch.column(c)) for key, c in zip(_GEOMETRY, roles.box)}
    elif roles.center:
        cx, cy = (_arrow_number(batch.column(c)) for c in roles.center)
        size = _arrow_number(batch.column(roles.size_col)) if roles.size_col else float(roles.crop_size)
        if cx is None or cy is None or size is None:
            return None
        w = np.full(len(cx), size) if np.ndim(size) == 0 else size
        geo = {"x": cx - np.asarray(size) / 2.0, "y": cy - np.asarray(size) / 2.0, "w": w, "h": w.copy()}
    else:
        return {}
    if any(v is None or not np.isfinite(v).all() for v in geo.values()):
        return None
    return geo if (geo["w"] > 0).all() and (geo["h"] > 0).all() else None


def _one_group_per_parent(parent: list, group: list) -> bool:
    """Whether every parent's crops lie in one group (`parent`, `group`: Arrow text chunks).
    Each parent remembers one of its groups; every crop must then agree with it. (Arrow's
    group-by with a distinct count takes 10x longer on 500,000 parents.)"""
    import pyarrow as pa
    import pyarrow.compute as pc

    p = pc.dictionary_encode(pa.chunked_array(parent).combine_chunks()).indices.to_numpy()
    g = pc.dictionary_encode(pa.chunked_array(group).combine_chunks()).indices.to_numpy()
    seen = np.empty(int(p.max()) + 1, dtype=g.dtype)
    seen[p] = g
    return bool((seen[p] == g).all())


def _arrow_text(values):
    """Arrow text as large strings (pandas' own type), integers written in decimal as Python
    writes them (Parquet ids and parents are often integers); None for anything else, whose
    text `_as_string` decides."""
    import pyarrow as pa

    kind = values.type
    if pa.types.is_dictionary(kind):
        values, kind = values.dictionary_decode(), kind.value_type
    if pa.types.is_string(kind) or pa.types.is_integer(kind):
        return values.cast(pa.large_string())
    return values if pa.types.is_large_string(kind) else None


def _arrow_number(values) -> np.ndarray | None:
    """Arrow integers or floats as a float64 array; None for nulls or anything else."""
    import pyarrow as pa

    kind = values.type
    if values.null_count or not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        return None
    return values.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


def _sorted_frame(parts: dict[str, list]) -> pd.DataFrame | None:
    """The frame of the batches' columns (`parts`: column -> one array per batch) sorted by
    id; None if an id repeats or a parent lies in two groups. Each column is reordered and
    its batches dropped in turn, so the peak holds one column twice, not the table. A table
    already in id order (one written from a `CropTable`) is not reordered at all."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = pa.chunked_array(parts.pop("id"))
    n = len(ids)
    in_order = n < 2 or pc.all(pc.less_equal(ids.slice(0, n - 1), ids.slice(1))).as_py()
    order = None if in_order else pc.sort_indices(ids)
    if order is not None:
        ids = ids.take(order)
    pool = pa.default_memory_pool()
    pool.release_unused()  # the unsorted ids' pages back to the system, not kept for reuse
    if n > 1 and pc.any(pc.equal(ids.slice(1), ids.slice(0, n - 1))).as_py():
        return None
    if "group" in parts and not _one_group_per_parent(parts["parent"], parts["group"]):
        return None
    frame = {"id": pd.array(ids, dtype=_text_dtype())}
    del ids
    rows = None if order is None else order.to_numpy()
    for key in list(parts):
        chunks = parts.pop(key)
        if key in _GEOMETRY:
            frame[key] = np.concatenate(chunks) if rows is None else np.concatenate(chunks)[rows]
        else:
            text = pa.chunked_array(chunks)
            frame[key] = pd.array(text if order is None else text.take(order), dtype=_text_dtype())
        del chunks
        pool.release_unused()
    return pd.DataFrame(frame, copy=False)


def _not_utf8(path: str) -> str:
    """Message for a table that is not UTF-8: the first bad byte, its offset and its line."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        return (
            f"table file {path!r} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} "
            f"(line {line}) ({e.reason}); save it as UTF-8"
        )
    return f"table file {path!r} is not UTF-8 text; save it as UTF-8"


def _text_dtype() -> pd.StringDtype:
    """Arrow-backed strings with NaN for missing (pandas 3's default ``str``), so that text
    columns are stripped, compared and sorted in Arrow without a Python object per value."""
    try:
        return pd.StringDtype("pyarrow", na_value=np.nan)
    except TypeError:  # pandas < 2.3 has no na_value; its NA-valued Arrow strings also work here
        return pd.StringDtype("pyarrow")


def _as_string(col: pd.Series, what: str) -> pd.Series:
    """Arrow strings, with missing values kept missing (validated later).

    Integer-valued floats (an int column that pandas widened because of a missing cell) are
    written without the '.0', so ids and parents read the same from CSV and from a frame.
    """
    if isinstance(col.dtype, pd.StringDtype):
        return col.astype(_text_dtype()).rename(what)
    missing = col.isna().to_numpy()
    if pd.api.types.is_float_dtype(col.dtype):
        v = col.to_numpy(dtype=np.float64)
        finite = np.isfinite(v)
        if np.all(v[finite] == np.floor(v[finite])):
            col = pd.Series(np.where(finite, v, 0).astype(np.int64), index=col.index)
    text = col.astype(str).astype(_text_dtype())
    if missing.any():
        text = text.mask(missing)
    return text.rename(what)


def _as_number(col: pd.Series, what: str) -> np.ndarray:
    values = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        raise TableError(
            f"{what} must hold finite numbers; {first_rows(bad)} hold "
            + ", ".join(repr(v) for v in col.to_numpy()[np.flatnonzero(bad)[:5]].tolist())  # nan, not np.float64(nan)
        )
    return values


def _validate(frame: pd.DataFrame) -> pd.DataFrame:
    """Check a canonical frame and return it sorted by id with a fresh index.

    Text columns become Arrow strings; stripping, the empty and duplicate checks and the sort
    run in Arrow, so a table of millions of crops never holds a Python object per value.
    """
    if not isinstance(frame, pd.DataFrame):
        raise TableError(f"expected a pandas DataFrame, got {type(frame).__name__}")
    for col in ("id", "label", "parent"):
        if col not in frame.columns:
            raise TableError(f"column {col!r} is missing; columns are: {', '.join(map(str, frame.columns))}")
    if len(frame) == 0:
        raise TableError("the crop table has no rows")
    unknown = [c for c in frame.columns if c not in _STRING_COLUMNS + _GEOMETRY]
    if unknown:
        raise TableError(f"unexpected canonical columns {unknown}; expected a subset of {_STRING_COLUMNS + _GEOMETRY}")
    frame = frame.reset_index(drop=True)
    for col in _STRING_COLUMNS:
        if col in frame.columns:
            text = _as_string(frame[col], col)
            frame[col] = text.str.strip() if col in _STRIPPED_COLUMNS else text
    ids = frame["id"]
    for col in _STRING_COLUMNS:
        if col in frame.columns:
            empty = _empty(frame[col])
            if empty.any():
                raise TableError(f"column {col!r} is empty or NaN in {first_rows(empty, ids if col != 'id' else None)}")
    order, sorted_ids = _sorted_unique_ids(ids)
    geo = _check_geometry(frame, ids)
    if "group" in frame.columns:
        _check_one_group_per_parent(frame, ids)
    columns = list(frame.columns)
    # The ids come sorted from the check; the other columns follow the same order.
    frame = frame.drop(columns="id").take(order).reset_index(drop=True)
    frame["id"] = pd.array(sorted_ids, dtype=_text_dtype())
    frame = frame[columns]
    for c in geo:
        frame[c] = frame[c].astype(np.float64)
    return frame


def _empty(values: pd.Series) -> np.ndarray:
    """(N,) bool: missing or empty strings (byte length 0, counted in Arrow)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    length = pc.binary_length(pa.array(values.array))
    return pc.fill_null(pc.equal(length, 0), True).to_numpy(zero_copy_only=False)


def _sorted_unique_ids(ids: pd.Series) -> tuple[np.ndarray, object]:
    """The row order that sorts `ids` (by code point, as Python sorts str) and the sorted ids
    (an Arrow array), after checking that no id repeats: in sorted order a repeat sits next to
    its twin."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = pa.array(ids.array)  # ids are Arrow strings here (`_as_string`)
    order = pc.sort_indices(arr).to_numpy()
    srt = arr.take(pa.array(order))
    if len(srt) > 1:
        same = pc.equal(srt.slice(1), srt.slice(0, len(srt) - 1)).to_numpy(zero_copy_only=False)
        if same.any():
            dup_sorted = np.zeros(len(srt), dtype=bool)
            dup_sorted[1:] |= same
            dup_sorted[:-1] |= same
            dup = np.zeros(len(srt), dtype=bool)
            dup[order] = dup_sorted
            first = ids.iloc[int(np.flatnonzero(dup)[0])]
            raise TableError(
                f"crop ids must be unique; id {first!r} and others repeat in {first_rows(dup, ids)}"
            )
    return order, srt


def _check_geometry(frame: pd.DataFrame, ids: pd.Series) -> list[str]:
    """The geometry columns of `frame` (none, or all of x, y, w, h), checked finite with
    positive sizes."""
    geo = [c for c in _GEOMETRY if c in frame.columns]
    if not geo:
        return geo
    if len(geo) != 4:
        raise TableError(f"geometry needs all of x, y, w, h; got {geo}")
    for c in _GEOMETRY:
        v = frame[c].to_numpy(dtype=np.float64)
        if not np.isfinite(v).all():
            raise TableError(f"geometry column {c!r} is NaN or infinite in {first_rows(~np.isfinite(v), ids)}")
    for c in ("w", "h"):
        v = frame[c].to_numpy(dtype=np.float64)
        if (v <= 0).any():
            raise TableError(
                f"crop sizes must be positive; {c!r} is <= 0 in {first_rows(v <= 0, ids)}"
            )
    return geo


def _check_one_group_per_parent(frame: pd.DataFrame, ids: pd.Series) -> None:
    """A `TableError` naming the first parent whose crops lie in more than one group."""
    per_parent = frame.groupby("parent", sort=True)["group"].nunique()
    bad = per_parent[per_parent > 1]
    if len(bad):
        p = bad.index[0]
        groups = sorted(frame.loc[frame["parent"] == p, "group"].unique())[:5]
        rows = np.flatnonzero((frame["parent"] == p).to_numpy())
        raise TableError(
            f"parent {p!r} has crops in {len(groups)} different groups (patients) {groups}; "
            f"a parent must belong to one group ({first_rows(rows, ids)}); "
            f"{len(bad)} parent(s) disagree in all"
        )
