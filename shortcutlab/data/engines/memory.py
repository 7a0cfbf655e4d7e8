"""The in-memory engine: the table is read into a `CropTable` and the audit and the split run
as they always have (`data.audit.audit`, `data.splits.make_split`). It is the reference the
other engines must match, and the fastest while the table fits in memory."""

from __future__ import annotations

import os

from shortcutlab.io import atomic_dir, write_json
from shortcutlab.data.engines.base import AUDIT_KEYS, MANIFEST_ENTRIES, MANIFEST_KIND, Engine, TableSource, manifest_record, \
    side_folder, sidecar_of_folder
from shortcutlab.data.engines.registry import check_protocol, register
from shortcutlab.data.manifest import SIDES
from shortcutlab.data.table import CropTable


def load_table(source: TableSource) -> CropTable:
    """`source` read into a `CropTable` (Parquet by its extension or as a folder, else CSV)."""
    path = os.fspath(source.path)
    parquet = path.lower().endswith((".parquet", ".pq")) or os.path.isdir(path)
    read = CropTable.from_parquet if parquet else CropTable.from_csv
    return read(path, **source.columns())


@register("memory")
class MemoryEngine(Engine):
    """Everything in memory: the table as a `CropTable`."""

    protocols = ("crop", "parent")

    def __init__(self) -> None:  # no options: an explicit signature lets the registry refuse --threads and the like
        pass

    def audit(self, source: TableSource, test_fraction: float = 0.2) -> dict:
        from shortcutlab.data.exposure import summarize

        table = load_table(source)
        result = {k: v for k, v in summarize(table, test_fraction).to_dict().items() if k in AUDIT_KEYS}
        return {**result, "source": table.source, "engine": self.name}

    def split(self, source: TableSource, out: str, protocol: str = "parent", test_fraction: float = 0.2,
              val_fraction: float = 0.0, seed: int = 0, unit: str = "parent") -> dict:
        from shortcutlab.data.splits import make_split

        check_protocol(self, protocol)
        params = {"test_fraction": test_fraction, "val_fraction": val_fraction, "seed": seed}
        if protocol == "parent":
            params["unit"] = unit
        manifest = make_split(load_table(source), protocol, **params)
        record = manifest_record(manifest.protocol, manifest.metadata()["params"], manifest.metadata()["report"], manifest.hash,
                                 len(manifest.assignments), self.name)
        write_manifest_folder(out, manifest.assignments, record)
        return record


def write_manifest_folder(out: str, assignments, record: dict) -> None:
    """Write an in-memory manifest (columns id, split) as a manifest folder and its sidecar."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_dir(out, kind=MANIFEST_KIND, names=MANIFEST_ENTRIES) as tmp:
        for side in SIDES:
            ids = assignments.loc[assignments["split"] == side, "id"]
            if len(ids):
                os.makedirs(side_folder(tmp, side))
                pq.write_table(pa.table({"id": pa.array(ids.to_numpy(dtype=object), pa.string())}),
                               os.path.join(side_folder(tmp, side), "part-0.parquet"))
    write_json(sidecar_of_folder(out), record, sort_keys=True)
