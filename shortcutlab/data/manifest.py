"""Split manifests: which crop goes where, with a content hash to register and verify.

A manifest is a tidy table, one row per (cell, crop): columns ``id``, ``split`` (train, val or
test) and, for designs with several training sets, ``cell`` (and ``level`` for the ladder).
It is written as CSV plus a JSON sidecar (``<name>.json``) that records the protocol, its
parameters, the achieved figures and the hash.

The hash is the SHA-256 of the rows sorted by (cell, id), so it does not depend on the row
order of the file; it covers the assignment, not the metadata.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from shortcutlab.errors import ManifestHashError, SplitError, first_rows
from shortcutlab.io import atomic_files, to_json

Side = Literal["train", "val", "test"]
SIDES: tuple[str, ...] = ("train", "val", "test")
_COLUMNS = ("id", "split", "cell", "level")


def content_hash(assignments: pd.DataFrame) -> str:
    """SHA-256 of a manifest's rows, independent of their order.

    Args:
        assignments: columns id, split and optionally cell, level.

    Returns:
        64 hex digits.
    """
    cols = [c for c in _COLUMNS if c in assignments.columns]
    key = ["cell", "id"] if "cell" in cols else ["id"]
    frame = pd.DataFrame({c: assignments[c].astype(str).to_numpy(dtype=object) for c in cols}).sort_values(key, kind="stable")
    hasher = ContentHasher(cols)
    hasher.update(frame)
    return hasher.hexdigest()


class ContentHasher:
    """`content_hash` fed in batches, for manifests too large to hold: the rows must arrive
    sorted by (cell,) id over all batches (an engine's ``ORDER BY id``), and the digest
    then equals `content_hash` of their concatenation.

    Args:
        columns: the manifest's columns, in `content_hash`'s order (id, split[, cell][, level]).

    Example:
        >>> df = pd.DataFrame({"id": ["a", "b", "c"], "split": ["train", "test", "train"]})
        >>> h = ContentHasher(["id", "split"])
        >>> h.update(df.iloc[:1]); h.update(df.iloc[1:])
        >>> h.hexdigest() == content_hash(df)
        True
    """

    def __init__(self, columns=("id", "split")) -> None:
        self.columns = [str(c) for c in columns]
        unknown = [c for c in self.columns if c not in _COLUMNS]
        if unknown or self.columns[:2] != ["id", "split"]:
            raise SplitError(f"manifest hash columns must be id, split[, cell][, level]; got {self.columns}")
        self._h = hashlib.sha256()
        self._h.update(("\t".join(self.columns) + "\n").encode())

    def update(self, rows) -> None:
        """Add rows (a DataFrame, or a pyarrow Table or RecordBatch) holding `columns`,
        in sorted order after the rows added before."""
        if isinstance(rows, pd.DataFrame):
            if len(rows) == 0:
                return
            body = rows[self.columns[0]].astype(str)
            for c in self.columns[1:]:
                body = body.str.cat(rows[c].astype(str), sep="\t")
            self._h.update(("\n".join(body.tolist()) + "\n").encode())
            return
        self.update_lines(_arrow_lines(rows, self.columns))

    def update_lines(self, lines) -> None:
        """Add rows already joined into lines (a pyarrow string array of "id\tsplit\n"
        values): the array's value buffer is hashed as it lies, without a Python string
        per row."""
        import pyarrow as pa

        if len(lines) == 0:
            return
        if lines.null_count:
            raise SplitError("a manifest row to hash is missing (null); every crop needs an id and a side")
        if lines.type not in (pa.string(), pa.large_string()):
            lines = lines.cast(pa.large_string())
        offsets = lines.buffers()[1]
        width = 4 if lines.type == pa.string() else 8
        start = int.from_bytes(offsets[lines.offset * width:(lines.offset + 1) * width], "little", signed=True)
        end_at = (lines.offset + len(lines)) * width
        end = int.from_bytes(offsets[end_at:end_at + width], "little", signed=True)
        self._h.update(memoryview(lines.buffers()[2])[start:end])

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _arrow_lines(rows, columns: list[str]):
    """The rows of an Arrow table or batch as "a\tb\n" lines (one string array)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = [rows.column(c).cast(pa.large_string()) for c in columns]
    if isinstance(parts[0], pa.ChunkedArray):
        parts = [p.combine_chunks() for p in parts]
    tab, newline, empty = (pa.scalar(t, pa.large_string()) for t in ("\t", "\n", ""))
    joined = pc.binary_join_element_wise(*parts, tab) if len(parts) > 1 else parts[0]
    return pc.binary_join_element_wise(joined, empty, newline)


def _check_assignments(df: pd.DataFrame, where: str) -> pd.DataFrame:
    for c in ("id", "split"):
        if c not in df.columns:
            raise SplitError(f"manifest column {c!r} is missing in {where}; columns are: {', '.join(map(str, df.columns))}")
    extra = [c for c in df.columns if c not in _COLUMNS]
    if extra:
        raise SplitError(f"manifest {where} has unexpected columns {extra}; expected {list(_COLUMNS)}")
    df = df.reset_index(drop=True)
    for c in df.columns:
        if c == "level":
            continue
        v = df[c].to_numpy(dtype=object)
        bad = pd.isna(v) | (v == "")
        if bad.any():
            raise SplitError(f"manifest column {c!r} is empty in {where}, {first_rows(bad)}")
    bad = ~df["split"].isin(SIDES).to_numpy()
    if bad.any():
        vals = sorted(set(df["split"][bad].astype(str)))[:5]
        raise SplitError(f"manifest column 'split' must be one of {SIDES}; {where} has {vals} in {first_rows(bad)}")
    key = ["cell", "id"] if "cell" in df.columns else ["id"]
    dup = df.duplicated(key, keep=False).to_numpy()
    if dup.any():
        raise SplitError(f"manifest {where} assigns a crop twice{' in one cell' if 'cell' in key else ''}: {first_rows(dup, df['id'].to_numpy())}")
    out = pd.DataFrame({c: df[c].astype(str).to_numpy(dtype=object) for c in df.columns if c != "level"})
    if "level" in df.columns:
        out["level"] = pd.to_numeric(df["level"]).to_numpy(dtype=float)
    return out[[c for c in _COLUMNS if c in out.columns]]


@dataclass(frozen=True, eq=False)
class SplitManifest:
    """A split: crop ids assigned to train/val/test, per cell of a design.

    Attributes:
        assignments: tidy DataFrame with columns id, split[, cell][, level].
        protocol: the protocol that made it ('crop', 'parent', 'parent-dedup', 'factorial',
            'ladder', or 'external' for a manifest read without metadata).
        params: protocol parameters (seed, test fraction, unit, ...).
        report: what the protocol achieved (shares, counts, checks).
    """

    assignments: pd.DataFrame
    protocol: str = "external"
    params: dict = field(default_factory=dict)
    report: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "assignments", _check_assignments(self.assignments, "assignments"))

    @property
    def hash(self) -> str:
        """SHA-256 content hash (see `content_hash`)."""
        return content_hash(self.assignments)

    @property
    def cells(self) -> tuple[str, ...]:
        """Cell names, in order of first appearance; ('',) for a single split."""
        if "cell" not in self.assignments.columns:
            return ("",)
        return tuple(pd.unique(self.assignments["cell"]))

    def cell(self, name: str | None = None) -> pd.DataFrame:
        """The id/split rows of one cell (all rows for a single split).

        Raises:
            SplitError: unknown cell name, or a name is needed because there are several.
        """
        a = self.assignments
        if "cell" not in a.columns:
            if name not in (None, ""):
                raise SplitError(f"this manifest has no cells, got cell {name!r}")
            return a[["id", "split"]]
        if name is None:
            if len(self.cells) == 1:
                name = self.cells[0]
            else:
                raise SplitError(f"this manifest has {len(self.cells)} cells; choose one with --cell: {', '.join(self.cells)}")
        rows = a[a["cell"] == name]
        if rows.empty:
            raise SplitError(f"unknown cell {name!r}; cells are: {', '.join(self.cells)}")
        return rows[["id", "split"]].reset_index(drop=True)

    def metadata(self) -> dict:
        """JSON-ready sidecar content."""
        from shortcutlab.version import __version__

        return {
            "protocol": self.protocol,
            "params": _jsonable(self.params),
            "report": _jsonable(self.report),
            "sha256": self.hash,
            "n_rows": int(len(self.assignments)),
            "cells": [c for c in self.cells if c],
            "shortcutlab_version": __version__,
        }

    def to_csv(self, path: str | os.PathLike) -> str:
        """Write the CSV and its JSON sidecar, both or neither; return the hash.

        Both files are written under temporary names beside their targets and renamed into
        place only when both are complete (the sidecar last), so a failure leaves any
        previous pair as it was.

        Raises:
            OutputError: a path cannot be written (its folder is a file, it is a folder, ...).
        """
        path = os.fspath(path)
        with atomic_files() as stage:
            self.assignments.to_csv(stage.path(path), index=False)
            meta = self.metadata()
            with open(stage.path(sidecar_path(path)), "w", encoding="utf-8") as f:
                f.write(to_json(meta, sort_keys=True))
        return meta["sha256"]

    @classmethod
    def read(cls, path: str | os.PathLike) -> "SplitManifest":
        """Read a manifest CSV, or a manifest folder of Parquet files (``split=<side>/*.parquet``,
        as the engines write), and its sidecar if present."""
        path = os.fspath(path)
        if not os.path.exists(path):
            raise SplitError(f"manifest file {path!r} does not exist")
        if os.path.isdir(path):
            path = path.rstrip(os.sep) or path
            df = _read_manifest_folder(path)
        else:
            df = _read_manifest_csv(path)
        protocol, params, report = "external", {}, {}
        meta = read_sidecar(path)
        if meta is not None:
            protocol = meta.get("protocol", protocol)
            params = meta.get("params", {})
            report = meta.get("report", {})
        try:
            return cls(df, protocol=protocol, params=params, report=report)
        except SplitError as e:
            raise SplitError(f"{path}: {e}") from None

    def summary(self) -> pd.DataFrame:
        """Crops per cell and side, as a tidy table."""
        a = self.assignments
        keys = ["cell", "split"] if "cell" in a.columns else ["split"]
        return a.groupby(keys, sort=False).size().rename("n_crops").reset_index()


def _read_manifest_folder(path: str) -> pd.DataFrame:
    """The id/split rows of a manifest folder: one ``split=<side>`` folder of Parquet files
    (column ``id``) per side."""
    import glob

    import pyarrow.parquet as pq

    parts = []
    for side in SIDES:
        for f in sorted(glob.glob(os.path.join(glob.escape(path), f"split={side}", "*.parquet"))):
            try:
                ids = pq.read_table(f, columns=["id"]).column("id").to_pandas().astype(str)
            except Exception as e:  # pyarrow raises several kinds for a damaged file
                raise SplitError(f"manifest file {f!r} is not a readable Parquet file with an 'id' column: {' '.join(str(e).split())}") from None
            parts.append(pd.DataFrame({"id": ids.to_numpy(dtype=object), "split": side}))
    if not parts:
        raise SplitError(f"manifest path {path!r} is a folder without split=train/, split=val/ or split=test/ Parquet files; "
                         "give a manifest CSV or a manifest folder an engine wrote")
    return pd.concat(parts, ignore_index=True)


def _read_manifest_csv(path: str) -> pd.DataFrame:
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        raise SplitError(f"manifest file {path!r} is empty") from None
    except UnicodeDecodeError as e:
        raise SplitError(f"manifest file {path!r} is not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset {e.start})") from None
    except pd.errors.ParserError as e:
        raise SplitError(f"manifest file {path!r} is not a valid CSV: {' '.join(str(e).split())}") from None


def sidecar_path(path: str) -> str:
    root, _ = os.path.splitext(path)
    return root + ".json"


def read_sidecar(path: str | os.PathLike) -> dict | None:
    """The JSON sidecar of manifest `path` as a dict, or None when there is none.

    Raises:
        SplitError: the sidecar is not UTF-8 JSON, or not an object with the expected fields,
            naming the file and what is wrong.
    """
    side = sidecar_path(os.fspath(path).rstrip(os.sep) or os.fspath(path))
    if not os.path.exists(side):
        return None
    try:
        with open(side, encoding="utf-8") as f:
            meta = json.load(f)
    except json.JSONDecodeError as e:
        raise SplitError(f"manifest sidecar {side!r} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except UnicodeDecodeError as e:
        raise SplitError(f"manifest sidecar {side!r} is not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset {e.start})") from None
    except IsADirectoryError:
        raise SplitError(f"manifest sidecar {side!r} is a folder, not a JSON file") from None
    if not isinstance(meta, dict):
        raise SplitError(f"manifest sidecar {side!r} must hold a JSON object; got a {type(meta).__name__}")
    for key, kind in (("protocol", str), ("params", dict), ("report", dict), ("sha256", str)):
        if key in meta and not isinstance(meta[key], kind):
            raise SplitError(
                f"manifest sidecar {side!r}: {key!r} must be a JSON {'string' if kind is str else 'object'}; got {meta[key]!r}"
            )
    return meta


def folder_hash(path: str | os.PathLike, batch_rows: int = 1_000_000) -> str:
    """`content_hash` of a manifest folder (``split=<side>/*.parquet``), computed in Arrow:
    the ids are sorted once and hashed in slices, with no Python object per row (a 1e8-row
    manifest needs about 3 GB, not the ~10 GB of `SplitManifest.read`).

    Raises:
        SplitError: no manifest files, an empty id, or an id on two rows (naming it).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    path = os.fspath(path).rstrip(os.sep) or os.fspath(path)
    ids, codes = [], []
    for code, side in enumerate(SIDES):
        col = _side_ids(path, side)
        if col is not None:
            ids.append(col)
            codes.append(np.full(len(col), code, dtype=np.int8))
    if not ids:
        raise SplitError(f"manifest path {path!r} is a folder without split=train/, split=val/ or split=test/ Parquet files; "
                         "give a manifest CSV or a manifest folder an engine wrote")
    id_arr = pa.chunked_array(ids).combine_chunks()
    order = pc.sort_indices(id_arr).to_numpy()
    srt, side = id_arr.take(pa.array(order)), np.concatenate(codes)[order]
    if pc.any(pc.fill_null(pc.equal(pc.binary_length(srt), 0), True)).as_py():
        raise SplitError(f"manifest column 'id' is empty in {path}")
    if len(srt) > 1 and pc.any(pc.equal(srt.slice(1), srt.slice(0, len(srt) - 1))).as_py():
        same = pc.equal(srt.slice(1), srt.slice(0, len(srt) - 1)).to_numpy(zero_copy_only=False)
        raise SplitError(f"manifest {path} assigns a crop twice: id {srt[int(np.flatnonzero(same)[0])].as_py()!r}")
    names = pa.array(SIDES, pa.large_string())
    hasher = ContentHasher(["id", "split"])
    for lo in range(0, len(srt), batch_rows):
        part = pa.table({"id": srt.slice(lo, batch_rows), "split": names.take(pa.array(side[lo:lo + batch_rows]))})
        hasher.update(part)
    return hasher.hexdigest()


def _side_ids(path: str, side: str):
    """The ids of one side of a manifest folder as one Arrow large_string array, or None."""
    import glob

    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(glob.glob(os.path.join(glob.escape(path), f"split={side}", "*.parquet")))
    if not files:
        return None
    try:
        cols = [pq.read_table(f, columns=["id"]).column("id").cast(pa.large_string()) for f in files]
    except Exception as e:  # pyarrow raises several kinds for a damaged file
        raise SplitError(f"manifest folder {path!r}: split={side} holds a file that is not Parquet with an 'id' column: "
                         f"{' '.join(str(e).split())}") from None
    return pa.chunked_array(cols).combine_chunks()


def verify(path: str | os.PathLike, expected: str | None = None) -> str:
    """Recompute a manifest's hash and compare it with `expected` (or with its sidecar's).

    Returns:
        The recomputed hash.

    Raises:
        ManifestHashError: on a mismatch, or when there is nothing to compare with.
        SplitError: the manifest or its sidecar cannot be read (naming the file).
    """
    got = folder_hash(path) if os.path.isdir(path) else SplitManifest.read(path).hash
    if expected is None:
        side = sidecar_path(os.fspath(path).rstrip(os.sep) or os.fspath(path))
        meta = read_sidecar(path)
        if meta is None:
            raise ManifestHashError(f"no hash given and no sidecar {side!r} to compare with; pass --hash")
        expected = meta.get("sha256")
        if not expected:
            raise ManifestHashError(f"sidecar {side!r} holds no 'sha256'")
    expected = expected.strip().lower()
    if got != expected:
        raise ManifestHashError(f"manifest {os.fspath(path)!r} has hash {got}, expected {expected}")
    return got


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    return obj
