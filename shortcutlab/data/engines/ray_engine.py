"""The Ray engine: a table's audit and parent split on a Ray cluster (Ray Data), partitioned
by parent, for cohorts no single machine holds (the ``ray`` extra).

What runs where:

1. **Read and canonicalise** (workers, `ROWS_PER_BATCH` rows at a time): ``ray.data.read_parquet``
   of a file, a folder or a glob, only the columns the options name; each batch becomes
   canonical columns through `CropTable.from_frame`, so ids, labels and parents are converted,
   stripped and checked exactly as the in-memory table does them.
2. **Per parent** (workers, one partition of whole parents at a time): the rows are
   hash-partitioned by parent and sorted within each partition (what
   ``groupby("parent").map_groups`` does), and each partition is reduced to one row per
   (parent, class): the crop count, the group, and the overlap sums the closed form needs
   (crops whose box meets a sibling's, and ``sum 1 - q^(m_i)``, with m_i from the shared
   `overlap.overlap_counts_by_parent`). The partition is reduced with array operations over
   all its parents at once, not a Python call per parent.
3. **Closed forms and the split's sides** (driver, one row per (parent, class), see
   `ParentCounts`): sizes, class counts
   V, `exposure`'s closed forms and `splits.unit_sides_from_counts`, the very functions the
   in-memory engine runs, on the same parents in the same (sorted) order.
4. **Assignment** (workers, `ROWS_PER_BATCH` rows at a time): the unit -> side table is put in
   Ray's object store once and joined to every batch; the manifest is written as Hive-
   partitioned Parquet (``split=train/`` ...) into a temporary folder renamed into place.
5. **Hash** (driver, serial): the written ids are sorted by Ray and streamed through
   `manifest.ContentHasher` in id order; a repeated id is found here, next to its twin. (The
   audit finds repeated ids with a group-by on the id column, unless ``check_ids=False``.)

Results equal the in-memory engine's: the same figures (to rounding in the last digits of
the overlap sums, which are added in another order) and the same manifest hash.

Example:
    >>> from shortcutlab.data.engines import TableSource, get_engine     # doctest: +SKIP
    >>> eng = get_engine("ray", address="auto")                           # doctest: +SKIP
    >>> eng.audit(TableSource("crops/", id="id", box="x,y,w,h"))          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import glob as globmod
import logging
import os
import uuid
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np
import pandas as pd

from shortcutlab.environ import environ
from shortcutlab.warnings_summary import quiet_logger
from shortcutlab.errors import TableError
from shortcutlab.io import atomic_dir, write_json
from shortcutlab.data.engines.base import AUDIT_KEYS, MANIFEST_ENTRIES, MANIFEST_KIND, Engine, EngineError, TableSource, \
    manifest_record, sidecar_of_folder
from shortcutlab.data.engines.registry import check_protocol, register
from shortcutlab.data.manifest import SIDES, ContentHasher
from shortcutlab.data.table import CropTable

_INSTALL = 'pip install "shortcutlab[ray]"'
_GEOMETRY = ("x", "y", "w", "h")
#: Rows per partition of the per-parent step when `partitions` is not given: small enough
#: that a partition's boxes and overlap pairs sit comfortably in one worker.
ROWS_PER_PARTITION = 1_000_000
#: Rows a worker canonicalises or assigns at once (bounds its memory, whatever Ray's blocks hold).
ROWS_PER_BATCH = 200_000


class RayEngineError(EngineError):
    """Ray is missing, an option is invalid, or the cluster cannot be reached."""


def _ray():
    try:
        import ray
        import ray.data  # noqa: F401  (Ray Data ships with ray[data])
    except ImportError as e:
        raise RayEngineError(f"the ray engine needs Ray Data, which is not installed ({e}); install it with {_INSTALL}") from None
    return ray


# ---------------------------------------------------------------------------- worker steps
def _text_dtype():
    try:
        return pd.StringDtype("pyarrow", na_value=np.nan)
    except TypeError:  # pandas < 2.3
        return pd.StringDtype("pyarrow")


def canonical_block(block, columns: Mapping[str, Any], source: str, keep: tuple[str, ...]):
    """One block of the source's rows as canonical crop-table columns (an Arrow table).

    The block goes through `CropTable.from_frame` with the source's column options, so the
    conversions and checks are the in-memory table's (whitespace stripped, numbers written as
    text, empty values and bad boxes refused with its messages); ids repeated within the block
    are refused there too (repeats across blocks are found when the ids are sorted).

    Args:
        block: a pyarrow Table of the source's columns.
        columns: `TableSource.columns()`.
        source: the path, for messages.
        keep: the canonical columns to return (``parent``, ``label``, ``id``, ``group``, x, y, w, h).
    """
    import pyarrow as pa

    text = _text_dtype()
    df = block.to_pandas(types_mapper={pa.string(): text, pa.large_string(): text}.get)
    try:
        frame = CropTable.from_frame(df, source=source, **columns).frame
    except TableError as e:
        where = " (rows count from the start of one block of rows Ray read, not of the file; the ids name the crops)"
        raise TableError(f"{source}: {e}{where if ' row' in str(e) else ''}") from None
    return pa.Table.from_pandas(frame[list(keep)], preserve_index=False)


def per_parent_rows(block, test_fraction: float | None, geometry: bool, has_group: bool):
    """Reduce a partition of whole parents to one row per (parent, class).

    Args:
        block: a pyarrow Table with columns parent, label[, group][, x, y, w, h][, id]; every
            parent wholly inside it (an id found twice in it is refused).
        test_fraction: q for the overlap term ``1 - q^(m_i)`` (None: no overlap columns).
        geometry: whether the block has boxes.
        has_group: whether the block has a group column.

    Returns:
        Arrow table: parent, label, n (crops), group (or null), n_overlap (crops whose box meets a
        sibling's), overlap_term (``sum 1 - q^(m_i)``), piece (an id of this partition, so the
        driver can tell a parent that was cut between partitions).

    Raises:
        TableError: a parent lies in more than one group, or an id repeats in the partition.
    """
    import pyarrow as pa

    from shortcutlab.data.overlap import overlap_counts_by_parent

    if "id" in block.column_names:
        _refuse_repeated_ids(block)
    pcode, parents = pd.factorize(block.column("parent").to_pandas(), sort=False)
    lcode, labels = pd.factorize(block.column("label").to_pandas(), sort=False)
    C = max(len(labels), 1)
    flat = pcode.astype(np.int64) * C + lcode
    keys, inverse = np.unique(flat, return_inverse=True)
    n = np.bincount(inverse, minlength=len(keys))
    out = {"parent": pa.array(np.asarray(parents, dtype=object)[keys // C], pa.string()),
           "label": pa.array(np.asarray(labels, dtype=object)[keys % C], pa.string()),
           "n": pa.array(n, pa.int64())}
    if has_group:
        gcode, groups = pd.factorize(block.column("group").to_pandas(), sort=False)
        lo = np.full(len(parents), np.iinfo(np.int64).max)
        hi = np.full(len(parents), -1)
        np.minimum.at(lo, pcode, gcode)
        np.maximum.at(hi, pcode, gcode)
        bad = np.flatnonzero(lo != hi)
        if len(bad):
            p = parents[bad[0]]
            seen = sorted(set(np.asarray(groups, dtype=object)[gcode[pcode == bad[0]]]))[:5]
            raise TableError(f"parent {p!r} has crops in {len(seen)} different groups (patients) {seen}; "
                             "a parent must belong to one group")
        out["group"] = pa.array(np.asarray(groups, dtype=object)[lo[keys // C]], pa.string())
    if geometry and test_fraction is not None:
        boxes = np.column_stack([block.column(c).to_numpy() for c in _GEOMETRY]).astype(np.float64)
        m = overlap_counts_by_parent(pcode, boxes)
        out["n_overlap"] = pa.array(np.bincount(inverse, weights=(m > 0), minlength=len(keys)).astype(np.int64))
        out["overlap_term"] = pa.array(np.bincount(inverse, weights=1.0 - float(test_fraction) ** m.astype(np.float64),
                                                   minlength=len(keys)))
    out["piece"] = pa.array(np.full(len(keys), uuid.uuid4().int >> 65, dtype=np.int64))
    return pa.table(out)


def _refuse_repeated_ids(block) -> None:
    """A `TableError` naming an id that occurs twice in `block` (a partition of whole parents)."""
    import pyarrow.compute as pc

    ids = block.column("id")
    if len(pc.unique(ids)) == len(ids):
        return
    srt = ids.take(pc.sort_indices(ids)).combine_chunks()
    same = pc.equal(srt.slice(1), srt.slice(0, len(srt) - 1)).to_numpy(zero_copy_only=False)
    dup = srt[int(np.flatnonzero(same)[0])].as_py()
    parents = sorted(set(block.column("parent").filter(pc.equal(ids, dup)).to_pylist()))
    raise TableError(f"crop ids must be unique; id {dup!r} repeats (parent(s) {', '.join(map(repr, parents))})")


def assign_block(block, sides, unit: str):
    """Rows of one block as manifest rows (id, split): each crop takes its unit's side.

    Args:
        block: Arrow table with columns id and `unit` (parent or group).
        sides: Arrow table with columns unit (names) and side (0 train, 1 val, 2 test).
        unit: the column of `block` to join on.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if not isinstance(sides, pa.Table):  # the object-store reference, read without a copy
        import ray

        sides = ray.get(sides)
    pos = pc.index_in(block.column(unit), value_set=sides.column("unit").combine_chunks())
    code = sides.column("side").combine_chunks().take(pos)
    names = pa.array(list(SIDES), pa.string())
    return pa.table({"id": block.column("id"), "split": names.take(code)})


# ---------------------------------------------------------------------------- the engine
@register("ray")
class RayEngine(Engine):
    """Audit and parent split on Ray Data: a local Ray, or a cluster's.

    Args:
        address: None starts a local Ray for each call (shut down after it); "auto" joins the
            cluster this machine belongs to (``ray start``); "HOST:PORT" or "ray://HOST:PORT"
            a cluster's head. Default: the ``RAY_ADDRESS`` environment variable, else None.
            If this process is already connected to Ray, that connection is used.
        threads: CPUs a local Ray offers (default: all of this machine's); local only (the
            CLI's ``--threads``, as for duckdb).
        partitions: partitions of the per-parent step (default: one per
            `ROWS_PER_PARTITION` rows, at least two per CPU of the cluster).
        check_ids: the audit also refuses an id shared by crops of different parents (a
            distributed group-by on the id column: one more shuffle, which doubled the audit's
            time and memory at 10M crops). Without it the audit refuses an id repeated within a
            parent (a row read twice) as the rows are partitioned; the split always refuses
            every repeat, at no extra cost, while it hashes the manifest in id order.
        runtime_env: Ray's runtime environment for the workers (``py_modules``, ``pip``, ...),
            to ship shortcutlab to a cluster that does not have it installed.
        quiet: keep Ray's logs and progress bars out of the terminal.
    """

    protocols = ("parent",)

    def __init__(self, address: str | None = None, threads: int | None = None, partitions: int | None = None,
                 check_ids: bool = False, runtime_env: Mapping[str, Any] | None = None, quiet: bool = True) -> None:
        if address is None:
            address = os.environ.get("RAY_ADDRESS") or None
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise RayEngineError(f"the Ray address must be 'auto', 'HOST:PORT' or 'ray://HOST:PORT'; got {address!r}")
        for key, value in (("threads", threads), ("partitions", partitions)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise RayEngineError(f"{key} must be a positive integer; got {value!r}")
        if threads is not None and address is not None:
            raise RayEngineError(f"threads applies to a local Ray only; the cluster at {address!r} has its own CPUs")
        self.address = address.strip() if address else None
        self.threads, self.partitions = threads, partitions
        self.check_ids, self.quiet = bool(check_ids), bool(quiet)
        self.runtime_env = dict(runtime_env) if runtime_env else None

    # --- connection -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def connected(self) -> Iterator[Any]:
        """Ray, connected for the block: an existing connection is used as it is; otherwise
        one is opened (a local Ray started) and closed after the block."""
        ray = _ray()
        with warnings.catch_warnings():
            # Ray Data warns about its own deprecated settings whenever it copies its context.
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\.")
            with self._connection(ray) as connected:
                yield connected

    @contextlib.contextmanager
    def _connection(self, ray) -> Iterator[Any]:
        if ray.is_initialized():
            yield ray
            return
        opts: dict[str, Any] = {"include_dashboard": False, "log_to_driver": not self.quiet}
        if self.quiet:
            opts["logging_level"] = logging.ERROR
        if self.runtime_env:
            opts["runtime_env"] = self.runtime_env
        env = {"RAY_USAGE_STATS_ENABLED": os.environ.get("RAY_USAGE_STATS_ENABLED", "0")}
        if self.address is None:
            opts["num_cpus"] = self.threads
            # A local Ray's workers start from this environment: let them import this shortcutlab.
            here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
            env["PYTHONPATH"] = os.pathsep.join([here] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
        else:
            opts["address"] = self.address
        try:
            with environ(**env), quiet_logger("ray", self.quiet), quiet_logger("ray._private.authentication.authentication_token_setup", self.quiet):
                ray.init(**opts)
        except (ConnectionError, TimeoutError, RuntimeError) as e:
            where = f"the Ray cluster at {self.address!r}" if self.address else "a local Ray"
            raise RayEngineError(f"cannot start or reach {where}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
        try:
            yield ray
        finally:
            ray.shutdown()


    # --- steps -----------------------------------------------------------------------------------
    def read(self, ray, source: TableSource, paths: list[str], keep: tuple[str, ...]):
        """The source as a Ray Dataset of canonical columns `keep` (step 1), and its row count
        (from the Parquet footers)."""
        ctx = ray.data.DataContext.get_current()
        # Ray 2.60's new Parquet reader sizes its batches from the chunk's row-group count
        # instead of its rows on files of several row groups (3 rows a batch, measured), which
        # took minutes and gigabytes for 1M crops; the first reader reads them in row groups.
        if hasattr(ctx, "use_datasource_v2"):
            ctx.use_datasource_v2 = False
        if self.quiet:
            ctx.enable_progress_bars = False
            # A worker's error is raised here as one line (`user_errors`); Ray's own report of it
            # and its progress lines would only repeat it.
            logging.getLogger("ray.data").setLevel(logging.CRITICAL)
        ds = ray.data.read_parquet(paths).select_columns(sorted({c for _, c in source_columns(source)}))
        return ds.count(), ds.map_batches(canonical_block, batch_format="pyarrow", batch_size=ROWS_PER_BATCH,
                                          fn_kwargs={"columns": source.columns(), "source": os.fspath(source.path), "keep": keep})

    def parent_table(self, ray, ds, n_rows: int, test_fraction: float | None, geometry: bool, has_group: bool) -> "ParentCounts":
        """Step 2: the per-(parent, class) rows of the canonical dataset, collected on the driver."""
        cpus = int(ray.cluster_resources().get("CPU", 1))
        parts = self.partitions or max(2 * cpus, -(-n_rows // ROWS_PER_PARTITION))
        rows = ds.repartition(parts, keys=["parent"], sort=True).map_batches(
            per_parent_rows, batch_format="pyarrow", batch_size=None,
            fn_kwargs={"test_fraction": test_fraction, "geometry": geometry, "has_group": has_group})
        return collect_parent_rows(rows.iter_batches(batch_size=None, batch_format="pyarrow"))

    def check_unique_ids(self, ds, source: TableSource) -> None:
        """Refuse a repeated crop id (a group-by on the id column)."""
        import pyarrow.compute as pc

        counts = ds.select_columns(["id"]).groupby("id").count()
        rep = counts.map_batches(lambda b: b.filter(pc.greater(b.column("count()"), 1)), batch_format="pyarrow").take(5)
        if rep:
            shown = ", ".join(repr(r["id"]) for r in rep)
            raise TableError(f"crop ids must be unique in {source.path}; id(s) {shown} repeat")

    # --- the contract ------------------------------------------------------------------------------
    def audit(self, source: TableSource, test_fraction: float = 0.2) -> dict:
        from shortcutlab.data.exposure import check_q

        q = check_q(test_fraction)
        geometry = source.has_geometry
        keep = ("parent", "label") + (("group",) if source.group else ()) + (_GEOMETRY if geometry else ())
        paths = check_source(source)
        with self.connected() as ray, user_errors():
            n_rows, ds = self.read(ray, source, paths, keep + (("id",) if source.id is not None else ()))
            if self.check_ids and source.id is not None:
                self.check_unique_ids(ds, source)
            counts = self.parent_table(ray, ds, n_rows, q, geometry, source.group is not None)
        return {**closed_forms(counts, q, geometry), "source": os.fspath(source.path),
                "engine": self.name}

    def split(self, source: TableSource, out: str, protocol: str = "parent", test_fraction: float = 0.2,
              val_fraction: float = 0.0, seed: int = 0, unit: str = "parent") -> dict:
        from shortcutlab.data.splits import check_params, parent_split_report, unit_sides_from_counts

        check_protocol(self, protocol)
        check_params("parent", test_fraction=test_fraction, val_fraction=val_fraction, seed=seed, unit=unit)
        unit = "group" if unit in ("group", "patient") else unit
        if source.id is None:
            raise TableError("the ray engine's split needs an id column (--id COL): row numbers are not defined across the "
                             "blocks of a distributed dataset")
        if unit == "group" and source.group is None:
            raise TableError("this table has no group (patient) column; pass --group COL")
        has_group = source.group is not None
        paths = check_source(source)
        with self.connected() as ray, user_errors():
            n_rows, ds = self.read(ray, source, paths, ("id", "parent", "label") + (("group",) if has_group else ()))
            counts = self.parent_table(ray, ds, n_rows, None, False, has_group)
            units, classes, V = class_counts(counts, unit)
            side_u = unit_sides_from_counts(V, test_fraction, val_fraction, seed)
            report = parent_split_report(V, side_u, classes, test_fraction, val_fraction, unit)
            sha, n_rows = self.write_manifest(ray, ds, out, units, side_u, unit, source)
        params = {"test_fraction": float(test_fraction), "val_fraction": float(val_fraction), "seed": int(seed), "unit": unit,
                  "stratified_by": "label"}
        record = manifest_record("parent", params, report, sha, n_rows, self.name)
        write_json(sidecar_of_folder(out), record, sort_keys=True)
        return record

    def write_manifest(self, ray, ds, out: str, units, side_u, unit: str, source: TableSource) -> tuple[str, int]:
        """Steps 4 and 5: assign, write the manifest folder, hash it in id order."""
        import pyarrow as pa

        sides = ray.put(pa.table({"unit": units, "side": pa.array(side_u, pa.int8())}))
        assigned = ds.map_batches(assign_block, batch_format="pyarrow", batch_size=ROWS_PER_BATCH,
                                  fn_kwargs={"sides": sides, "unit": unit})
        with atomic_dir(out, kind=MANIFEST_KIND, names=MANIFEST_ENTRIES) as tmp:
            assigned.write_parquet(tmp, partition_cols=["split"])
            sha, n_rows = hash_in_id_order(ray, tmp, source)
        return sha, n_rows


# ---------------------------------------------------------------------------- driver steps
def parquet_paths(path) -> list[str]:
    """A Parquet file, a folder (one dataset) or a glob, as the paths Ray reads.

    Raises:
        TableError: nothing there, or a glob that matches nothing.
    """
    path = os.fspath(path)
    if "://" in path:  # a remote filesystem: Ray resolves it
        return [path]
    if any(ch in path for ch in "*?["):
        found = sorted(globmod.glob(path))
        if not found:
            raise TableError(f"table pattern {path!r} matches no file")
        return found
    if not os.path.exists(path):
        raise TableError(f"table file {path!r} does not exist")
    if os.path.isfile(path) and not path.lower().endswith((".parquet", ".pq")):
        raise TableError(f"the ray engine reads Parquet (a file, a folder or a glob); {path!r} is not a .parquet file")
    return [path]


def check_source(source: TableSource) -> list[str]:
    """The paths Ray reads, after the checks that need no cluster: the files exist and (for
    local files) hold every column the options name.

    Raises:
        TableError: no such file, not Parquet, a glob matching nothing, a missing column.
    """
    import pyarrow as pa
    import pyarrow.dataset as pads

    paths = parquet_paths(source.path)
    if "://" in paths[0]:
        return paths
    try:
        names = pads.dataset(paths if len(paths) > 1 else paths[0], format="parquet").schema.names
    except (pa.ArrowInvalid, OSError) as e:
        raise TableError(f"table file {source.path!r} is not a readable Parquet dataset: {' '.join(str(e).split())}") from None
    for role, c in source_columns(source):
        if c not in names:
            raise TableError(f"{role} column {c!r} is missing from {source.path}; columns are: {', '.join(names)}")
    return paths


def source_columns(source: TableSource) -> list[tuple[str, str]]:
    """(role, column) pairs the source's options name, in the in-memory table's order."""
    cols: list[tuple[str, str]] = [("label", source.label), ("parent", source.parent)]
    if source.id is not None:
        cols += [("id", c.strip()) for c in str(source.id).split(",")]
    if source.group is not None:
        cols.append(("group", source.group))
    if source.box is not None:
        cols += [("box", c.strip()) for c in str(source.box).split(",")]
    if source.center is not None:
        cols += [("center", c.strip()) for c in str(source.center).split(",")]
        if isinstance(source.crop_size, str):
            try:
                float(source.crop_size)
            except ValueError:
                cols.append(("crop size", source.crop_size))
    return cols


@dataclass(frozen=True)
class ParentCounts:
    """What the driver holds: one row per (parent, class) present, in compact columns, and the
    two overlap sums.

    Attributes:
        parent: (R,) Arrow strings, the parent of each row.
        label: (R,) int16 codes into `classes`.
        classes: the class names, sorted (code point order, as `CropTable.classes`).
        n: (R,) int64 crops of the row's parent and class.
        group: (R,) Arrow strings, the parent's group (None without groups).
        n_overlap: crops whose box meets a sibling's.
        overlap_term: ``sum_i 1 - q^(m_i)`` over all crops.
    """

    parent: Any
    label: np.ndarray
    classes: tuple[str, ...]
    n: np.ndarray
    group: Any
    n_overlap: int
    overlap_term: float


def collect_parent_rows(batches) -> ParentCounts:
    """Gather step 2's output batch by batch into `ParentCounts` (class names turned into
    small codes, the overlap sums added up as they come); refuse a parent found in two
    partitions (its overlap counts would be partial)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parents, labels, counts, groups = [], [], [], []
    classes: list[str] = []
    n_overlap, term, pieces = 0, 0.0, 0
    for b in batches:
        if b.num_rows == 0:
            continue
        pieces += b.group_by(["piece", "parent"]).aggregate([]).num_rows
        new = [c for c in pc.unique(b.column("label")).to_pylist() if c not in classes]
        classes += new
        labels.append(pc.index_in(b.column("label"), value_set=pa.array(classes, pa.string())).to_numpy().astype(np.int16))
        parents.append(b.column("parent").combine_chunks() if isinstance(b.column("parent"), pa.ChunkedArray) else b.column("parent"))
        counts.append(b.column("n").to_numpy())
        if "group" in b.column_names:
            groups.append(b.column("group"))
        if "n_overlap" in b.column_names:
            n_overlap += int(pc.sum(b.column("n_overlap")).as_py())
            term += float(pc.sum(b.column("overlap_term")).as_py())
    if not parents:
        raise TableError("the crop table has no rows")
    parent = pa.chunked_array(parents).combine_chunks()
    n_parents = len(pc.unique(parent))
    if pieces != n_parents:
        raise RayEngineError("internal check failed: a parent was cut between partitions of the per-parent step, so its overlap "
                             "would be wrong; report this with your Ray version")
    order = sorted(range(len(classes)), key=lambda i: classes[i])
    recode = np.empty(len(classes), dtype=np.int16)
    recode[order] = np.arange(len(classes), dtype=np.int16)
    return ParentCounts(parent=parent, label=recode[np.concatenate(labels)], classes=tuple(classes[i] for i in order),
                        n=np.concatenate(counts).astype(np.int64),
                        group=pa.chunked_array(groups).combine_chunks() if groups else None, n_overlap=n_overlap,
                        overlap_term=term)


def sorted_codes(values) -> tuple[Any, np.ndarray]:
    """The sorted distinct values of an Arrow string array (code point order, as
    `pd.factorize(sort=True)` orders Python strings) and each value's code into them."""
    import pyarrow.compute as pc

    uniq = pc.unique(values)
    uniq = uniq.take(pc.sort_indices(uniq))
    return uniq, pc.index_in(values, value_set=uniq).to_numpy()


def closed_forms(counts: ParentCounts, q: float, geometry: bool) -> dict:
    """The audit's figures from the per-(parent, class) rows of step 2."""
    from shortcutlab.data.exposure import diversity_ratio, exposure, sibling_share

    parents, code = sorted_codes(counts.parent)
    sizes = np.bincount(code, weights=counts.n, minlength=len(parents)).astype(np.int64)
    n = int(sizes.sum())
    out = {"n_crops": n, "n_parents": int(len(sizes)), "n_classes": len(counts.classes),
           "n_groups": len(sorted_codes(counts.group)[0]) if counts.group is not None else None, "test_fraction": q,
           "sibling_share": sibling_share(sizes), "exposure": exposure(sizes, q), "diversity_ratio": diversity_ratio(sizes, q),
           "pixel_overlap": None, "overlap_share": None}
    if geometry:
        out["pixel_overlap"] = counts.overlap_term / n
        out["overlap_share"] = counts.n_overlap / n
    return {k: out[k] for k in AUDIT_KEYS}


def class_counts(counts: ParentCounts, unit: str) -> tuple[Any, tuple[str, ...], np.ndarray]:
    """(U,) unit names (Arrow strings), (C,) classes and the (U, C) class counts V, units and
    classes in sorted (code point) order as `CropTable.class_counts_per_unit` has them."""
    units, code = sorted_codes(counts.parent if unit == "parent" else counts.group)
    C = len(counts.classes)
    flat = code.astype(np.int64) * C + counts.label
    V = np.bincount(flat, weights=counts.n, minlength=len(units) * C).astype(np.int64).reshape(len(units), C)
    return units, counts.classes, V


def hash_in_id_order(ray, folder: str, source: TableSource) -> tuple[str, int]:
    """`content_hash` of the manifest written in `folder`, streamed over its rows sorted by id
    (the one serial step); refuses a repeated id.

    Returns:
        (hash, rows).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = ray.data.read_parquet(folder, partitioning=ray.data.datasource.Partitioning("hive")).select_columns(["id", "split"])
    hasher = ContentHasher(["id", "split"])
    last, n = None, 0
    for batch in rows.sort("id").iter_batches(batch_size=1 << 18, batch_format="pyarrow"):
        ids = batch.column("id").combine_chunks() if isinstance(batch.column("id"), pa.ChunkedArray) else batch.column("id")
        if len(ids) == 0:
            continue
        same = pc.equal(ids.slice(1), ids.slice(0, len(ids) - 1)).to_numpy(zero_copy_only=False)
        if same.any() or ids[0].as_py() == last:
            dup = last if ids[0].as_py() == last else ids[int(np.flatnonzero(same)[0])].as_py()
            raise TableError(f"crop ids must be unique in {source.path}; id {dup!r} repeats")
        last = ids[len(ids) - 1].as_py()
        hasher.update(batch.select(["id", "split"]))
        n += len(ids)
    return hasher.hexdigest(), n


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Re-raise a shortcutlab error that a Ray worker raised (a bad value in a block) as itself,
    one line, instead of Ray's wrapped traceback; Ray keeps only its text, so it is read back
    from there."""
    import ray

    try:
        yield
    except ray.exceptions.RayError as e:
        err = worker_error(str(e))
        if err is None:
            raise
        raise err from None


def worker_error(text: str) -> Exception | None:
    """The last ``shortcutlab.errors.<Name>: message`` line of a worker's traceback `text`, as
    that exception; None if there is none."""
    import re

    import sys

    from shortcutlab.errors import ShortcutlabError

    errors = sys.modules[ShortcutlabError.__module__]
    found = None
    for m in re.finditer(r"^shortcutlab\.errors\.(\w+): (.*)$", text, flags=re.M):
        cls = getattr(errors, m.group(1), None)
        if isinstance(cls, type) and issubclass(cls, ShortcutlabError):
            found = cls(m.group(2))
    return found

