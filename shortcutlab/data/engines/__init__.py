"""Engines: where a table's audit and parent split are computed.

- `memory` (the default): the table read into a `CropTable`;
- `duckdb`: out of core, for tables larger than memory (the ``duckdb`` extra): per-parent
  counts through SQL, pixel overlap one batch of whole parents at a time, the manifest
  written as partitioned Parquet;
- `ray`: on a Ray cluster (the ``ray`` extra), partitioned by parent, for cohorts no single
  machine holds (`ray_engine`).

The contract is in `base` (`Engine`, `TableSource`); engines register by name in `registry`
(``get_engine("duckdb", memory_limit="2GB")``). Third-party engines join through the
``shortcutlab.engines`` entry-point group.

Example:
    >>> import os, tempfile
    >>> from shortcutlab.data.random_tables import random_table
    >>> path = os.path.join(tempfile.mkdtemp(), "crops.csv")
    >>> random_table(20, seed=1).to_csv(path, index=False)
    >>> src = TableSource(path, id="id", box="x,y,w,h")
    >>> get_engine("memory").audit(src)["n_parents"]
    20
"""

from __future__ import annotations

from shortcutlab.data.engines.base import AUDIT_KEYS, Engine, EngineError, TableSource, sidecar_of_folder
from shortcutlab.data.engines.registry import DEFAULT_ENGINE, ENTRY_POINT_GROUP, available, check_protocol, engines_running, get_engine, \
    register, unregister

# Built-ins register themselves on import (duckdb is imported only when its engine runs).
from shortcutlab.data.engines.memory import MemoryEngine
from shortcutlab.data.engines.duckdb_engine import DuckDBEngine
from shortcutlab.data.engines.ray_engine import RayEngine  # Ray itself is imported only when the engine runs

__all__ = [
    "AUDIT_KEYS", "DEFAULT_ENGINE", "DuckDBEngine", "ENTRY_POINT_GROUP", "Engine", "EngineError", "MemoryEngine", "RayEngine",
    "TableSource", "available",
    "check_protocol", "engines_running", "get_engine", "register", "sidecar_of_folder", "unregister",
]
