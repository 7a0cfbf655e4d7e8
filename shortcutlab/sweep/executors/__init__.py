"""Executors: what runs a sweep's tasks. The contract is in `base`; `local` and `ray` follow it
and are registered by name in `registry` (``get_executor("local", workers=2)``).
"""

from __future__ import annotations

from shortcutlab.sweep.executors.base import DoneFn, Executor, ExecutorError, TaskFailed, TaskFn, check_order
from shortcutlab.sweep.executors.registry import DEFAULT_EXECUTOR, ENTRY_POINT_GROUP, available, get_class, get_executor, load_entry_points, options, register, unregister

# Built-ins register themselves on import (the ray module imports Ray only when one is made).
from shortcutlab.sweep.executors.local import LocalExecutor
from shortcutlab.sweep.executors.ray import RayExecutor  # registers "ray"

__all__ = [
    "DEFAULT_EXECUTOR", "DoneFn", "ENTRY_POINT_GROUP", "Executor", "ExecutorError", "LocalExecutor", "RayExecutor", "TaskFailed", "TaskFn",
    "available", "check_order", "get_class", "get_executor", "load_entry_points", "options", "register", "unregister",
]
