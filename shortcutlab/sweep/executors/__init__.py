"""Executors: what runs a sweep's tasks. The contract is in `base`; `local` and `ray` follow it.
"""

from __future__ import annotations

from typing import Any

from shortcutlab.errors import ShortcutlabError
from shortcutlab.sweep.executors.base import DoneFn, Executor, TaskFailed, TaskFn, check_order
from shortcutlab.sweep.executors.local import LocalExecutor


def get_executor(name: str = "local", **options: Any) -> Executor:
    """An executor by name: 'local' (options: workers) or 'ray' (options: address, ...)."""
    if name == "local":
        return LocalExecutor(**options)
    if name == "ray":
        from shortcutlab.sweep.executors.ray import RayExecutor

        return RayExecutor(**options)
    raise ShortcutlabError(f"unknown executor {name!r}; expected 'local' or 'ray'")


__all__ = ["DoneFn", "Executor", "LocalExecutor", "TaskFailed", "TaskFn", "check_order", "get_executor"]
