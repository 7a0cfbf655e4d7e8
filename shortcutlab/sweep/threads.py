"""How many torch threads each task of a sweep runs on.

A sweep's ``threads`` (the config's ``threads:``, or ``sweep --threads`` / ``demo --threads``)
is the number of torch threads the whole sweep may use on this machine at once; by default the
cores this process may run on (`available_cores`), or ``OMP_NUM_THREADS`` where that is set
(`default_threads`). An executor that runs ``workers`` tasks at
once in this machine's processes (the local executor) gives each task ``max(1, threads //
workers)`` threads (`task_threads`), so that the tasks together do not ask for more threads
than there are cores: threads beyond the cores wait on each other (on 2 cores shared with
other jobs, 2 threads per task made a small sweep take 6.6 min instead of 41 s with 1).

An executor without ``workers`` (Ray) schedules tasks by the CPUs each one reserves and runs
as many as its cluster holds; there ``threads`` is what each task reserves and runs on
(default 1), as before this module existed.

The threads a task ran on are recorded in its ``result.json`` (and a train task's ``run.json``);
the sweep's choice in ``sweep.json`` (`ThreadPlan.to_dict`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from shortcutlab.errors import ShortcutlabError


def available_cores() -> int:
    """The cores this process may run on: ``len(os.sched_getaffinity(0))`` where the system
    has it (Linux: it honours ``taskset`` and container CPU sets), else ``os.cpu_count()``
    (1 if unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """The threads of a sweep that does not say: ``OMP_NUM_THREADS`` where it is set to a
    positive integer (a limit the user or a scheduler set for this process, which torch
    honours too), else the cores available (`available_cores`)."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return available_cores()


def task_threads(threads: int, workers: int) -> int:
    """Torch threads of each of `workers` tasks running at once on `threads` threads in all:
    ``max(1, threads // workers)`` (a task never runs on fewer than one).

    >>> task_threads(8, 3), task_threads(2, 4)
    (2, 1)
    """
    return max(1, int(threads) // max(1, int(workers)))


def check_threads(value, flag: str = "--threads") -> int | None:
    """`value` if it is None or a positive integer; else a one-line `ShortcutlabError`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ShortcutlabError(f"{flag} takes the number of torch threads, a positive integer; got {value!r}")
    return value


@dataclass(frozen=True)
class ThreadPlan:
    """The threads of one sweep run.

    Attributes:
        per_task: torch threads each task runs on.
        total: the sweep's threads on this machine (None with an executor without ``workers``).
        workers: tasks the executor runs at once (None when it does not say: Ray).
        source: where `total` (or, without workers, `per_task`) came from: "given" (the
            config or a flag) or "default".
    """

    per_task: int
    total: int | None
    workers: int | None
    source: str

    def to_dict(self) -> dict:
        return {"per_task": self.per_task, "total": self.total, "workers": self.workers, "source": self.source}


def plan_threads(threads: int | None, workers: int | None) -> ThreadPlan:
    """The threads of a sweep given its ``threads`` (None: not given) and its executor's
    ``workers`` (None: an executor that schedules by reservation, such as Ray)."""
    source = "default" if threads is None else "given"
    if workers is None:
        return ThreadPlan(per_task=threads or 1, total=None, workers=None, source=source)
    total = default_threads() if threads is None else threads
    return ThreadPlan(per_task=task_threads(total, workers), total=total, workers=int(workers), source=source)
