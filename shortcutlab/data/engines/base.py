"""The engine contract: where the audit and the parent split of a table are computed.

An engine takes a `TableSource` (a file or dataset and its column options, as the CLI's
``audit`` and ``split`` take them) and returns the same figures as the in-memory code: the
audit's closed forms (`audit`) and a parent-level split written as a partitioned Parquet
manifest with its JSON sidecar (`split`). Every engine must give results identical to the
``memory`` engine (figures, manifest hash); `tests/test_engines.py` checks each registered one.

A manifest folder holds one Parquet folder per side, ``split=train/``, ``split=val/``,
``split=test/`` (Hive partitioning), each file with one column ``id``; the sidecar
``<folder>.json`` holds the protocol, parameters, report and the content hash
(`manifest.content_hash` of the id/split rows), and `SplitManifest.read` reads the folder back.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import ClassVar

from shortcutlab.errors import ShortcutlabError

#: The audit's keys every engine returns (`data.audit.audit` without a split).
AUDIT_KEYS: tuple[str, ...] = ("n_crops", "n_parents", "n_classes", "n_groups", "test_fraction", "sibling_share", "exposure",
                               "diversity_ratio", "pixel_overlap", "overlap_share")

MANIFEST_KIND = "split-manifest"
#: What a manifest folder holds (for `io.atomic_dir`'s claim on an existing folder).
MANIFEST_ENTRIES: tuple[str, ...] = ("split=train/", "split=val/", "split=test/")


class EngineError(ShortcutlabError):
    """An engine cannot do what was asked (an unknown engine, a protocol it does not run)."""


@dataclass(frozen=True)
class TableSource:
    """A crop table on disk and how its columns map onto the crop table's roles.

    Attributes:
        path: a CSV file, a Parquet file, a folder of Parquet files (one dataset) or a glob.
        id: crop id column, or several joined with commas (their values joined with '/').
        label, parent: class and acquisition-parent columns.
        group: optional higher unit (patient) column.
        box: 'X,Y,W,H' box columns; or `center` 'CX,CY' with `crop_size` (a number or a column).
    """

    path: str
    label: str = "label"
    parent: str = "parent"
    id: str | None = None
    group: str | None = None
    box: str | None = None
    center: str | None = None
    crop_size: str | float | None = None

    def columns(self) -> dict:
        """The column keywords of `CropTable.from_csv` / `from_parquet`."""
        d = asdict(self)
        d.pop("path")
        return d

    @property
    def has_geometry(self) -> bool:
        return self.box is not None or self.center is not None


class Engine(ABC):
    """Computes a table's audit and parent split; options (memory, threads) go to `__init__`.

    Subclasses register with `@engines.register("name")` and set `protocols`, the split
    protocols they run; any other protocol is refused with the engines that run it.
    """

    name: ClassVar[str] = ""
    protocols: ClassVar[tuple[str, ...]] = ("parent",)

    @abstractmethod
    def audit(self, source: TableSource, test_fraction: float = 0.2) -> dict:
        """The closed forms of `source` at test fraction q: a dict with `AUDIT_KEYS` (and
        ``source``, ``engine``), equal to `data.audit.audit`'s without a split."""

    @abstractmethod
    def split(self, source: TableSource, out: str, protocol: str = "parent", test_fraction: float = 0.2,
              val_fraction: float = 0.0, seed: int = 0, unit: str = "parent") -> dict:
        """Write the split of `source` as a manifest folder `out` and its sidecar; return the
        sidecar's record (protocol, params, report, sha256, n_rows, ...)."""


def sidecar_of_folder(out: str) -> str:
    """The sidecar path of manifest folder `out`: ``<out without extension>.json``."""
    from shortcutlab.data.manifest import sidecar_path

    return sidecar_path(os.fspath(out).rstrip(os.sep) or os.fspath(out))


def side_folder(out: str, side: str) -> str:
    """The folder of one side's files in manifest folder `out`."""
    return os.path.join(out, f"split={side}")


def manifest_record(protocol: str, params: dict, report: dict, sha256: str, n_rows: int, engine: str) -> dict:
    """The sidecar of a manifest folder: `SplitManifest.metadata`'s fields plus the engine
    and the format."""
    from shortcutlab.version import __version__

    return {"protocol": protocol, "params": params, "report": report, "sha256": sha256, "n_rows": int(n_rows), "cells": [],
            "shortcutlab_version": __version__, "engine": engine, "format": "parquet"}
