"""A toy executor plug-in: runs a sweep's tasks one after another in this process and records
each task it ran (kind, id), in order, on the class, so a test can compare them with the plan."""

from __future__ import annotations

from shortcutlab.sweep import executors
from shortcutlab.sweep.executors import TaskFailed, check_order

NAME = "toy_serial"


class ToySerialExecutor:
    """Tasks in the given (topological) order, in this process; ``ran`` lists (kind, id) of
    every task run since `register`."""

    name = NAME
    ran: list = []

    def run(self, tasks, fn, on_done=None) -> None:
        tasks = list(tasks)
        check_order(tasks)
        for t in tasks:
            try:
                result = fn(t)
            except Exception as e:
                raise TaskFailed(t, e) from e
            type(self).ran.append((t.kind, t.id))
            if on_done:
                on_done(t, result)


def register() -> type[ToySerialExecutor]:
    """Register `ToySerialExecutor` as ``toy_serial`` (its record cleared)."""
    ToySerialExecutor.ran = []
    executors.register(NAME)(ToySerialExecutor)
    return ToySerialExecutor


def unregister() -> None:
    executors.unregister(NAME)
