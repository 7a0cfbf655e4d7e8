"""Executors run a list of tasks (dependencies first) with a task function.

The contract, shared by every executor:

- ``run(tasks, fn, on_done=None)``: ``tasks`` is a list of `Task` in a topological order whose
  ``deps`` name only tasks of the same list (finished tasks are left out beforehand, see
  `TaskGraph.subgraph`). ``fn(task)`` is a picklable module-level function that does the
  task, writes its outputs atomically itself, and returns a small JSON-able dict. A task
  starts only after all its deps returned. ``on_done(task, result)`` is called in the calling
  process as each task finishes (progress bars, bookkeeping).
- On a failure, no new task is started, the ones already running are allowed to finish (their
  ``on_done`` is still called), and `TaskFailed` is raised naming the task and the cause.
- ``fn`` must be deterministic given the task: whichever executor runs it, the outputs are the
  same.

The executors themselves: `local.LocalExecutor` and `ray.RayExecutor`, registered by name in
`registry` (plug-ins join through the entry-point group ``shortcutlab.executors``);
`get_executor` builds one by name. `shortcutlab.testing.check_executor` runs this contract on
any executor.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from shortcutlab.errors import ShortcutlabError
from shortcutlab.sweep.graph import Task

TaskFn = Callable[[Task], dict]
DoneFn = Callable[[Task, dict], None]


class ExecutorError(ShortcutlabError):
    """An unknown executor name, or an executor option it does not take or cannot use."""


class TaskFailed(ShortcutlabError):
    """A task of a sweep failed; ``task`` is the Task and ``cause`` the original exception."""

    def __init__(self, task: Task, cause: BaseException) -> None:
        self.task, self.cause = task, cause
        super().__init__(f"{task.kind} task {task.id} failed: {type(cause).__name__}: {cause}")


class Executor(Protocol):
    """What every executor has: a registry ``name`` and ``run`` (see the module docstring)."""

    name: str

    def run(self, tasks: Sequence[Task], fn: TaskFn, on_done: DoneFn | None = None) -> None: ...


def check_order(tasks: Sequence[Task]) -> None:
    """Refuse a task list that is not in a topological order or names a dependency outside it."""
    seen: set[str] = set()
    ids = {t.id for t in tasks}
    for t in tasks:
        for d in t.deps:
            if d not in ids:
                raise ValueError(f"task {t.id} depends on {d}, which is not in the list (drop finished deps with TaskGraph.subgraph)")
            if d not in seen:
                raise ValueError(f"task {t.id} comes before its dependency {d}: tasks must be in a topological order")
        seen.add(t.id)
