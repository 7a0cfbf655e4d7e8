"""The DuckDB engine: the audit and the parent split of a table larger than memory.

DuckDB reads the table (a Parquet file, a folder or glob of Parquet files, or a CSV) where
it lies; no step loads the crops into pandas. What Python holds:

- the per-unit class counts V (parents x classes, from a SQL ``GROUP BY``), from which the
  closed forms, the split's sides (`splits.unit_sides_from_counts`) and its report come;
- one batch of whole parents' boxes at a time (``ORDER BY parent``, streamed as Arrow
  batches), whose overlap counts m_i (`overlap.overlap_counts_by_parent`) are kept only as a
  histogram of m;
- one batch of manifest rows at a time while the hash streams (``ORDER BY id``,
  `manifest.ContentHasher`).

DuckDB itself stays within ``memory_limit``, spilling sorts and aggregates to
``temp_directory``. Values are read as the in-memory `CropTable` reads them: text trimmed of
surrounding whitespace (Python's `str.isspace` set), integer-valued floats written without
'.0', ids of several columns joined with '/', units and classes in code-point order (DuckDB's
binary collation, checked against `pandas.factorize` in the tests).
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time

import numpy as np
import pandas as pd

from shortcutlab.errors import TableError
from shortcutlab.io import atomic_dir, write_json
from shortcutlab.data.engines.base import MANIFEST_ENTRIES, MANIFEST_KIND, Engine, EngineError, TableSource, manifest_record, \
    sidecar_of_folder
from shortcutlab.data.engines.registry import check_protocol, register
from shortcutlab.data.exposure import check_q, diversity_ratio, exposure, pixel_overlap_from_counts, sibling_share
from shortcutlab.data.manifest import ContentHasher
from shortcutlab.data.overlap import overlap_counts_by_parent
from shortcutlab.data.splits import parent_split_report, unit_sides_from_counts

#: Python's whitespace (`str.strip`'s set), trimmed from text values as `CropTable` does.
_SPACE = "".join(c for c in map(chr, range(0x3000 + 1)) if c.isspace())
# DuckDB's trim with a character set costs 30x a plain scan, so it runs only on the values
# a regular expression finds with whitespace at an end.
_SPACE_CLASS = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in _SPACE) + "]"
_SIDE_NAMES = ("train", "val", "test")


def _trim(expr: str) -> str:
    """SQL: `expr` without surrounding whitespace (Python's `str.strip`)."""
    ends = _literal(f"^{_SPACE_CLASS}|{_SPACE_CLASS}$")
    return f"(CASE WHEN regexp_matches({expr}, {ends}) THEN trim({expr}, {_literal(_SPACE)}) ELSE {expr} END)"


def _quote(name: str) -> str:
    """A SQL identifier."""
    return '"' + str(name).replace('"', '""') + '"'


def _literal(text: str) -> str:
    """A SQL string literal."""
    return "'" + str(text).replace("'", "''") + "'"


def _require_duckdb():
    try:
        import duckdb
    except ImportError:
        raise EngineError("the duckdb engine needs the duckdb package: pip install 'shortcutlab[duckdb]'") from None
    return duckdb


def _scan(path: str) -> tuple[str, bool]:
    """The DuckDB table function reading `path`, and whether it is Parquet (with file row
    numbers) rather than CSV (every column read as text, as `CropTable.from_csv` does)."""
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(glob.escape(path), "**", "*.parquet"), recursive=True))
        if not files:
            raise TableError(f"table folder {path!r} holds no .parquet files")
        parquet, target = True, os.path.join(path, "**", "*.parquet")
    elif any(ch in path for ch in "*?["):
        files = sorted(glob.glob(path, recursive=True))
        if not files:
            raise TableError(f"table pattern {path!r} matches no file")
        parquet, target = all(f.lower().endswith((".parquet", ".pq")) for f in files), path
    else:
        if not os.path.exists(path):
            raise TableError(f"table file {path!r} does not exist")
        parquet, target = path.lower().endswith((".parquet", ".pq")), path
    if parquet:
        return f"read_parquet({_literal(target)}, filename=true, file_row_number=true, union_by_name=true)", True
    return f"read_csv({_literal(target)}, all_varchar=true, header=true)", False


class _Columns:
    """SQL expressions for the crop table's roles over the scan of one source."""

    def __init__(self, source: TableSource, types: dict[str, str], parquet: bool) -> None:
        self.source, self.types, self.parquet = source, types, parquet
        where = source.path
        wanted = {"label": [source.label], "parent": [source.parent]}
        if source.id is None:
            raise TableError(f"the duckdb engine needs --id for {where}: a row number is not a stable crop id across files and readers")
        wanted["id"] = _split(source.id)
        if source.group:
            wanted["group"] = [source.group]
        if source.box is not None and source.center is not None:
            raise TableError("give the geometry either as a box (x,y,w,h) or as a center plus crop size, not both")
        if source.box is not None:
            wanted["box"] = _split(source.box, 4, "box (x,y,w,h)")
        if source.center is not None:
            if source.crop_size is None:
                raise TableError("a center (cx,cy) needs a crop size (--crop-size S)")
            wanted["center"] = _split(source.center, 2, "center (cx,cy)")
            if _size_column(source.crop_size):
                wanted["crop size"] = [str(source.crop_size)]
        for role, cols in wanted.items():
            for c in cols:
                if c not in types:
                    raise TableError(f"{role} column {c!r} is missing from {where}; columns are: {', '.join(t for t in types if t not in ('filename', 'file_row_number'))}")
        self.wanted = wanted
        self.text_roles = {"id": None, "label": source.label, "parent": source.parent}
        if "group" in wanted:
            self.text_roles["grp"] = source.group
        #: canonical text columns (id, label, parent, grp) with a value to trim; None: not yet known.
        self.padded: set[str] | None = None

    def text(self, col: str, strip: bool = True) -> str:
        """A column as text: integer-valued floats without '.0', trimmed like `CropTable`."""
        q, kind = _quote(col), self.types[col].upper()
        if kind in ("DOUBLE", "FLOAT", "REAL") or kind.startswith("DECIMAL"):
            expr = f"(CASE WHEN isfinite({q}) AND {q} = trunc({q}) THEN CAST(CAST({q} AS HUGEINT) AS VARCHAR) ELSE CAST({q} AS VARCHAR) END)"
        else:
            expr = f"CAST({q} AS VARCHAR)"
        return _trim(expr) if strip else expr

    def number(self, col: str) -> str:
        q = _quote(col)
        return f"TRY_CAST({q} AS DOUBLE)"  # DuckDB's cast itself skips surrounding spaces

    def untrimmed(self) -> dict[str, str]:
        """Canonical text column -> its value as text, before trimming."""
        ids = self.wanted["id"]
        out = {"id": "(" + f" || {_literal('/')} || ".join(self.text(c, strip=False) for c in ids) + ")"}
        out.update({k: self.text(c, strip=False) for k, c in self.text_roles.items() if c is not None})
        return out

    def select(self) -> str:
        """The SELECT list of the canonical crops: id, label, parent[, grp][, x, y, w, h],
        the raw geometry text, ``_row`` and ``_file``; while `padded` is unknown, also
        ``_padded_<column>`` (the value has whitespace to trim)."""
        raw = self.untrimmed()
        trim = set(raw) if self.padded is None else self.padded
        cols = [f"{_trim(e) if k in trim else e} AS {k}" for k, e in raw.items()]
        if self.padded is None:
            ends = _literal(f"^{_SPACE_CLASS}|{_SPACE_CLASS}$")
            cols += [f"regexp_matches({e}, {ends}) AS _padded_{k}" for k, e in raw.items()]
        cols += [f"{e} AS {k}" for k, e in self.geometry().items()]
        cols += [f"CAST({_quote(c)} AS VARCHAR) AS _raw_{k}" for k, c in self.raw().items() if c is not None]
        cols.append("file_row_number AS _row, filename AS _file" if self.parquet else "NULL::BIGINT AS _row, NULL::VARCHAR AS _file")
        return ", ".join(cols)

    def geometry(self) -> dict[str, str]:
        if "box" in self.wanted:
            return dict(zip("xywh", (self.number(c) for c in self.wanted["box"])))
        if "center" not in self.wanted:
            return {}
        cx, cy = (self.number(c) for c in self.wanted["center"])
        size = self.number(str(self.source.crop_size)) if "crop size" in self.wanted else repr(float(self.source.crop_size))
        return {"x": f"({cx} - ({size}) / 2.0)", "y": f"({cy} - ({size}) / 2.0)", "w": f"({size})", "h": f"({size})"}

    def raw(self) -> dict[str, str]:
        """Geometry role -> the column whose value a message should show."""
        if "box" in self.wanted:
            return dict(zip("xywh", self.wanted["box"]))
        if "center" in self.wanted:
            cx, cy = self.wanted["center"]
            size = self.wanted.get("crop size", [None])[0]
            return {"x": cx, "y": cy, "w": size, "h": size}
        return {}


def _one(con, sql: str):
    """The first row of `sql`'s result (None when empty), the result read to its end (DuckDB
    refuses new work on a connection with an unfinished result)."""
    rows = con.execute(sql).fetchall()
    return rows[0] if rows else None


def _split(spec: str, n: int | None = None, what: str = "id") -> list[str]:
    cols = [c.strip() for c in str(spec).split(",")]
    if any(not c for c in cols):
        raise TableError(f"{what} has an empty column name: {spec!r}")
    if n is not None and len(cols) != n:
        raise TableError(f"{what} needs {n} column names, got {len(cols)}: {spec!r}")
    return cols


def _size_column(crop_size) -> bool:
    try:
        float(crop_size)
        return False
    except (TypeError, ValueError):
        return True


@register("duckdb")
class DuckDBEngine(Engine):
    """Out of core: DuckDB reads and aggregates the table; Python holds per-unit counts and
    one batch of whole parents.

    Args:
        memory_limit: DuckDB's memory limit (``'2GB'``); sorts and aggregates beyond it spill.
        threads: DuckDB threads (default: the cores available to this process).
        temp_directory: where DuckDB spills (default: a temporary folder beside the split's
            output folder, or in the system's temporary folder for an audit); removed after.
        batch_rows: rows per streamed batch of boxes or manifest rows.

    Attributes:
        timings_: seconds per step of the last `audit` or `split` (validation, counts,
            overlap, manifest), for benchmarks.
    """

    protocols = ("parent",)

    def __init__(self, memory_limit: str = "2GB", threads: int | None = None, temp_directory: str | None = None,
                 batch_rows: int = 1_000_000) -> None:
        self.memory_limit = str(memory_limit)
        self.threads = threads
        self.temp_directory = temp_directory
        self.batch_rows = int(batch_rows)
        self.timings_: dict[str, float] = {}
        if self.batch_rows < 1:
            raise EngineError(f"batch_rows must be a positive integer, got {batch_rows!r}")
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
            raise EngineError(f"threads must be a positive integer, got {threads!r}")

    # ---------------------------------------------------------------- connection
    def _timed(self, step: str, fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self.timings_[step] = round(time.perf_counter() - t0, 3)
        return out

    def _threads(self) -> int:
        if self.threads is not None:
            return self.threads
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def _connect(self, spill: str):
        duckdb = _require_duckdb()
        con = duckdb.connect(":memory:")
        threads = self._threads()
        try:
            con.execute(f"SET memory_limit = {_literal(self.memory_limit)}")
        except duckdb.Error as e:
            raise EngineError(f"the duckdb engine's memory limit {self.memory_limit!r} is not a size DuckDB reads (say '2GB'): {e}") from None
        con.execute(f"SET threads = {int(threads)}")
        con.execute(f"SET temp_directory = {_literal(spill)}")
        con.execute("SET preserve_insertion_order = false")
        con.execute("SET enable_progress_bar = false")
        return con

    def _open(self, con, source: TableSource, check_ids: bool = True) -> _Columns:
        """Create the view ``crops`` (canonical columns) over `source` and validate it."""
        path = os.fspath(source.path)
        scan, parquet = _scan(path)
        duckdb = _require_duckdb()
        try:
            described = con.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall()
        except duckdb.Error as e:
            raise TableError(f"table file {path!r} is not a readable {'Parquet' if parquet else 'CSV'} file: {str(e).strip().splitlines()[0]}") from None
        types = {row[0]: row[1] for row in described}
        cols = _Columns(source, types, parquet)
        # Checked through a view that trims every text value; the view the work reads trims
        # only the columns that hold a value to trim (a regular expression per value, saved).
        con.execute(f"CREATE VIEW crops AS SELECT {cols.select()} FROM {scan}")
        cols.padded = self._timed("check values", _validate_values, con, cols, path)
        con.execute(f"CREATE OR REPLACE VIEW crops AS SELECT {cols.select()} FROM {scan}")
        self._timed("check ids and groups", _validate_keys, con, cols, path, check_ids)
        return cols

    def _spill_dir(self, beside: str | None) -> str:
        if self.temp_directory:
            return tempfile.mkdtemp(prefix="shortcutlab-duckdb-", dir=self.temp_directory)
        return tempfile.mkdtemp(prefix=".shortcutlab-duckdb-", suffix=".tmp", dir=beside)

    # ---------------------------------------------------------------- audit
    def audit(self, source: TableSource, test_fraction: float = 0.2) -> dict:
        q = check_q(test_fraction)
        self.timings_ = {}
        spill = self._spill_dir(None)
        try:
            con = self._connect(spill)
            cols = self._open(con, source)
            V, _, _ = self._timed("counts", unit_class_counts, con, "parent")
            n_groups = _one(con, "SELECT count(DISTINCT grp) FROM crops")[0] if "group" in cols.wanted else None
            pix = share = None
            if cols.geometry():
                m_values, n_with = self._timed("overlap", overlap_histogram, con, self.batch_rows, workers=self._threads())
                pix = pixel_overlap_from_counts(m_values, q, n_crops=n_with)
                share = float(n_with[m_values > 0].sum() / n_with.sum())
            con.close()
        finally:
            shutil.rmtree(spill, ignore_errors=True)
        k = V.sum(axis=1)
        result = {"n_crops": int(k.sum()), "n_parents": int(len(k)), "n_classes": int(V.shape[1]), "n_groups": None if n_groups is None else int(n_groups),
                  "test_fraction": q, "sibling_share": sibling_share(k), "exposure": exposure(k, q), "diversity_ratio": diversity_ratio(k, q),
                  "pixel_overlap": pix, "overlap_share": share}
        return {**result, "source": os.fspath(source.path), "engine": self.name}

    # ---------------------------------------------------------------- split
    def split(self, source: TableSource, out: str, protocol: str = "parent", test_fraction: float = 0.2,
              val_fraction: float = 0.0, seed: int = 0, unit: str = "parent") -> dict:
        check_protocol(self, protocol)
        self.timings_ = {}
        unit = "group" if unit in ("group", "patient") else unit
        if unit not in ("parent", "group"):
            raise EngineError(f"split unit must be 'parent' or 'group', got {unit!r}")
        out = os.fspath(out).rstrip(os.sep) or os.fspath(out)
        beside = os.path.dirname(os.path.abspath(out))
        os.makedirs(beside, exist_ok=True)
        spill = self._spill_dir(beside)
        try:
            con = self._connect(spill)
            cols = self._open(con, source, check_ids=False)
            if unit == "group" and "group" not in cols.wanted:
                raise TableError("this table has no group (patient) column; pass --group COL")
            V, names, classes = self._timed("counts", unit_class_counts, con, unit)
            side_u = unit_sides_from_counts(V, test_fraction, val_fraction, seed)
            report = parent_split_report(V, side_u, classes, test_fraction, val_fraction, unit)
            with atomic_dir(out, kind=MANIFEST_KIND, names=MANIFEST_ENTRIES) as tmp:
                digest, n_rows = _write_manifest(con, unit, names, side_u, tmp, self.batch_rows, self._timed)
                if digest is None:  # a repeated id, found in id order
                    raise _repeated_id(con, n_rows, os.fspath(source.path))
            con.close()
        finally:
            shutil.rmtree(spill, ignore_errors=True)
        params = {"test_fraction": float(test_fraction), "val_fraction": float(val_fraction), "seed": int(seed), "unit": unit,
                  "stratified_by": "label"}
        record = manifest_record("parent", params, report, digest, n_rows, self.name)
        write_json(sidecar_of_folder(out), record, sort_keys=True)
        return record


# -------------------------------------------------------------------- validation
def _validate_values(con, cols: _Columns, path: str) -> set[str]:
    """The `CropTable` checks of single values, in SQL (one scan): empty text, non-finite or
    non-positive geometry; one line naming the file, column, a row and the value. Returns the
    text columns with a value to trim."""
    checks: list[tuple[str, str | None, str]] = []  # (condition, raw value shown, message start)
    text = dict(cols.text_roles, id=",".join(cols.wanted["id"]))
    for key, col in text.items():
        checks.append((f"{key} IS NULL OR {key} = ''", None, f"column {col!r} is empty or NaN"))
    raw = cols.raw()
    for key in cols.geometry():
        shown = f"_raw_{key}" if raw[key] is not None else None
        checks.append((f"{key} IS NULL OR NOT isfinite({key})", shown, f"geometry column {raw[key] or key!r} must hold finite numbers"))
    for key in ("w", "h") if cols.geometry() else ():
        checks.append((f"{key} <= 0", f"_raw_{key}" if raw[key] is not None else None, f"crop sizes must be positive; {raw[key] or key!r} is <= 0"))
    padded = [f"count_if(_padded_{k})" for k in text]
    counts = _one(con, "SELECT " + ", ".join([f"count_if({c})" for c, _, _ in checks] + padded) + " FROM crops")
    for (cond, col, msg), n in zip(checks, counts):
        if n:
            where = _first_row(con, cond, col, path)
            raise TableError(f"{msg} in {where}; {n} row(s) in all")
    return {k for k, n in zip(text, counts[len(checks):]) if n}


def _validate_keys(con, cols: _Columns, path: str, ids: bool = True) -> None:
    """The checks across rows: a repeated id (unless `ids` is False: the split finds one in
    its id-ordered hash stream instead of a ``GROUP BY`` of its own), a parent in several
    groups."""
    dup = _one(con, "SELECT id FROM crops GROUP BY id HAVING count(*) > 1 ORDER BY id LIMIT 1") if ids else None
    if dup:
        raise _repeated_id(con, dup[0], path)
    if "group" in cols.wanted:
        bad = _one(con, "SELECT parent, count(DISTINCT grp) FROM crops GROUP BY parent HAVING count(DISTINCT grp) > 1 ORDER BY parent LIMIT 1")
        if bad:
            raise TableError(f"parent {bad[0]!r} has crops in {bad[1]} different groups (patients) in {path}; a parent must belong to one group")


def _repeated_id(con, crop_id: str, path: str) -> TableError:
    """The error for an id on several rows, naming up to 5 of them."""
    n = _one(con, f"SELECT count(*) FROM crops WHERE id = {_literal(crop_id)}")[0]
    rows = con.execute(f"SELECT _file, _row FROM crops WHERE id = {_literal(crop_id)} ORDER BY _file, _row LIMIT 5").fetchall()
    where = "; ".join(f"{os.path.basename(f)} row {r}" for f, r in rows if r is not None) or path
    return TableError(f"crop ids must be unique; id {crop_id!r} repeats {n} times in {path} ({where})")


def _first_row(con, cond: str, shown: str | None, path: str) -> str:
    """'FILE row R (id 'X'): VALUE' for the first row (by file, row and id) meeting `cond`;
    the row where the reader gives one (Parquet), the value where there is one to show."""
    value = shown or "NULL"
    f, r, i, v = _one(con, f"SELECT _file, _row, id, {value} FROM crops WHERE {cond} ORDER BY _file, _row, id LIMIT 1")
    where = f"{os.path.basename(f)} row {r}" if r is not None else path
    if i not in (None, ""):
        where += f" (id {i!r})"
    return where + ((f": {v!r}" if v is not None else ": empty") if shown else "")


# -------------------------------------------------------------------- counts and overlap
def unit_class_counts(con, unit: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """(U, C) crops per unit and class from ``GROUP BY``, units and classes sorted by code
    point (as `CropTable.class_counts_per_unit`), with the unit names and the classes."""
    key = "parent" if unit == "parent" else "grp"
    df = con.execute(f"SELECT {key} AS unit, label, count(*) AS n FROM crops GROUP BY ALL").df()
    u_codes, units = pd.factorize(df["unit"].astype(object), sort=True)
    c_codes, classes = pd.factorize(df["label"].astype(object), sort=True)
    V = np.zeros((len(units), len(classes)), dtype=np.int64)
    V[u_codes, c_codes] = df["n"].to_numpy(dtype=np.int64)
    return V, np.asarray(units, dtype=object), tuple(str(c) for c in classes)


def overlap_histogram(con, batch_rows: int, workers: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Values of m (same-parent crops whose box intersects a crop's) and the crops holding
    each, from boxes streamed in parent order; the crops of the last parent of a batch wait
    for the next batch, so m is always counted over whole parents. Up to `workers` batches
    are counted at once (numpy releases the GIL), at most 2 x `workers` held."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    hist = np.zeros(1, dtype=np.int64)
    pending: deque = deque()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for codes, boxes in _whole_parent_batches(con, batch_rows):
            pending.append(pool.submit(_histogram, codes, boxes))
            while len(pending) > 2 * max(1, workers):
                hist = _add(hist, pending.popleft().result())
        while pending:
            hist = _add(hist, pending.popleft().result())
    values = np.flatnonzero(hist)
    return values, hist[values]


def _whole_parent_batches(con, batch_rows: int):
    """(codes, boxes) of batches of whole parents: parent runs numbered from 0, (n, 4) boxes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    reader = con.sql("SELECT parent, x, y, w, h FROM crops ORDER BY parent").to_arrow_reader(batch_rows)
    carry_parent, carry_boxes = None, np.zeros((0, 4))
    for batch in reader:
        parent = batch.column(0)
        boxes = np.column_stack([batch.column(i).to_numpy(zero_copy_only=False) for i in range(1, 5)])
        if carry_parent is not None:
            parent = pa.concat_arrays([carry_parent, parent.cast(carry_parent.type)])
            boxes = np.concatenate([carry_boxes, boxes])
        n = len(parent)
        new_run = pc.not_equal(parent.slice(1), parent.slice(0, n - 1)).to_numpy(zero_copy_only=False) if n > 1 else np.zeros(0, bool)
        codes = np.r_[0, np.cumsum(new_run)]
        cut = int(np.searchsorted(codes, codes[-1]))  # first crop of the last parent
        if cut:
            yield codes[:cut], boxes[:cut]
        carry_parent, carry_boxes = parent.slice(cut), boxes[cut:]
    if carry_parent is not None and len(carry_parent):
        yield np.zeros(len(carry_parent), dtype=np.int64), carry_boxes


def _histogram(codes: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    return np.bincount(overlap_counts_by_parent(codes, boxes))


def _add(hist: np.ndarray, add: np.ndarray) -> np.ndarray:
    if len(add) > len(hist):
        hist = np.concatenate([hist, np.zeros(len(add) - len(hist), dtype=np.int64)])
    hist[: len(add)] += add
    return hist


def _write_manifest(con, unit: str, names: np.ndarray, side_u: np.ndarray, folder: str, batch_rows: int, timed) -> tuple[str, int]:
    """Every crop's side by a join on its unit, written as ``split=<side>/`` Parquet folders
    in `folder`; then the content hash streamed from those files in id order."""
    key = "parent" if unit == "parent" else "grp"
    sides = pd.DataFrame({"unit": pd.Series(names, dtype=object), "split": np.array(_SIDE_NAMES, dtype=object)[side_u]})
    con.register("unit_sides", sides)
    timed("write manifest", con.execute, f"COPY (SELECT c.id, s.split FROM crops c JOIN unit_sides s ON c.{key} = s.unit) "
          f"TO {_literal(folder)} (FORMAT parquet, PARTITION_BY (split), OVERWRITE_OR_IGNORE true)")
    con.unregister("unit_sides")
    return timed("hash", _hash_manifest, con, folder, batch_rows)


def _hash_manifest(con, folder: str, batch_rows: int) -> tuple[str | None, int | str]:
    """The content hash of the manifest files in `folder` (read back in id order) and their
    rows; (None, id) when an id repeats (adjacent in id order)."""
    import pyarrow.compute as pc

    files = os.path.join(folder, "split=*", "*.parquet")
    hasher = ContentHasher(["id", "split"])
    reader = con.sql(f"SELECT id, id || chr(9) || split || chr(10) AS line FROM read_parquet({_literal(files)}, hive_partitioning=true) "
                     "ORDER BY id").to_arrow_reader(batch_rows)
    n, last = 0, None
    for batch in reader:
        ids = batch.column(0)
        if len(ids) and last is not None and ids[0].as_py() == last:
            return None, last
        if len(ids) > 1:
            same = pc.equal(ids.slice(1), ids.slice(0, len(ids) - 1))
            if pc.any(same).as_py():
                return None, ids[int(np.flatnonzero(same.to_numpy(zero_copy_only=False))[0])].as_py()
        last = ids[len(ids) - 1].as_py() if len(ids) else last
        hasher.update_lines(batch.column(1))
        n += batch.num_rows
    return hasher.hexdigest(), n
