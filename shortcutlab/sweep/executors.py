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

`LocalExecutor(workers=1)` runs in this process; ``workers=N`` uses a process pool (spawned
processes, so it is safe with torch) whose workers exit when the process that started them
dies, even by SIGKILL (`_watch_parent`). `get_executor` builds one by name.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import sys
import threading
import time
from typing import Any, Callable, Protocol, Sequence

from ..errors import ShortcutlabError
from .graph import Task

TaskFn = Callable[[Task], dict]
DoneFn = Callable[[Task, dict], None]


class TaskFailed(ShortcutlabError):
    """A task of a sweep failed; ``task`` is the Task and ``cause`` the original exception."""

    def __init__(self, task: Task, cause: BaseException) -> None:
        self.task, self.cause = task, cause
        super().__init__(f"{task.kind} task {task.id} failed: {type(cause).__name__}: {cause}")


class Executor(Protocol):
    name: str

    def run(self, tasks: Sequence[Task], fn: TaskFn, on_done: DoneFn | None = None) -> None: ...


def _check_order(tasks: Sequence[Task]) -> None:
    seen: set[str] = set()
    ids = {t.id for t in tasks}
    for t in tasks:
        for d in t.deps:
            if d not in ids:
                raise ValueError(f"task {t.id} depends on {d}, which is not in the list (drop finished deps with TaskGraph.subgraph)")
            if d not in seen:
                raise ValueError(f"task {t.id} comes before its dependency {d}: tasks must be in a topological order")
        seen.add(t.id)


#: seconds between a worker's checks that its parent is alive
PARENT_POLL_S = 0.5


def _set_pdeathsig() -> None:
    """Linux: ask the kernel to send SIGTERM to this process when its parent exits; the handler
    ends this worker's children and exits. (Not SIGKILL: that would orphan the children. The
    polling thread of `_watch_parent` is the portable mechanism and the fallback when the
    main thread is busy in C code and cannot run the handler.)"""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        signal.signal(signal.SIGTERM, lambda *_: _orphaned())
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError, ValueError):
        pass


def _orphaned() -> None:
    """The parent is gone: end this worker's own children (torch's data loader workers, any
    spawned process) and exit at once, without running the task's cleanup."""
    for child in mp.active_children():
        try:
            child.kill()
        except OSError:
            pass
    os._exit(1)


def _watch_parent(parent_pid: int, poll_s: float = PARENT_POLL_S) -> None:
    """Pool-worker initializer: exit when `parent_pid` dies. A daemon thread polls
    ``os.getppid()`` (a dead parent's children are re-parented, on every POSIX system; on
    Windows the parent's pid is polled with OpenProcess), so a SIGKILLed sweep leaves no
    worker running; on Linux PR_SET_PDEATHSIG is set as well. Polling is independent of what
    the worker is doing: a task in the middle of training is stopped too."""
    _set_pdeathsig()
    if os.getppid() != parent_pid and os.name != "nt":  # the parent died before the prctl took effect
        _orphaned()

    def alive() -> bool:
        if os.name == "nt":
            import ctypes

            h = ctypes.windll.kernel32.OpenProcess(0x100000, False, parent_pid)  # SYNCHRONIZE
            if not h:
                return False
            try:
                return ctypes.windll.kernel32.WaitForSingleObject(h, 0) != 0  # WAIT_OBJECT_0: exited
            finally:
                ctypes.windll.kernel32.CloseHandle(h)
        return os.getppid() == parent_pid

    def loop() -> None:
        while alive():
            time.sleep(poll_s)
        _orphaned()

    threading.Thread(target=loop, name="shortcutlab-parent-watch", daemon=True).start()


class LocalExecutor:
    """Run tasks in this process (``workers=1``) or on a pool of ``workers`` spawned processes."""

    name = "local"

    def __init__(self, workers: int = 1) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ShortcutlabError(f"workers must be a positive integer; got {workers!r}")
        self.workers = workers

    def run(self, tasks: Sequence[Task], fn: TaskFn, on_done: DoneFn | None = None) -> None:
        tasks = list(tasks)
        _check_order(tasks)
        if self.workers == 1:
            for t in tasks:
                try:
                    result = fn(t)
                except Exception as e:
                    raise TaskFailed(t, e) from e
                if on_done:
                    on_done(t, result)
            return
        self._run_pool(tasks, fn, on_done)

    def _run_pool(self, tasks: list[Task], fn: TaskFn, on_done: DoneFn | None) -> None:
        done: set[str] = set()
        pending = list(tasks)
        failure: TaskFailed | None = None
        with cf.ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context("spawn"),
                                    initializer=_watch_parent, initargs=(os.getpid(),)) as pool:
            running: dict[cf.Future, Task] = {}
            while pending or running:
                if failure is None:
                    ready = [t for t in pending if all(d in done for d in t.deps)]
                    for t in ready:
                        if len(running) >= self.workers:
                            break
                        running[pool.submit(fn, t)] = t
                        pending.remove(t)
                if not running:
                    break
                finished, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                for fut in finished:
                    t = running.pop(fut)
                    try:
                        result = fut.result()
                    except Exception as e:
                        if failure is None:
                            failure = TaskFailed(t, e)
                        continue
                    done.add(t.id)
                    if on_done:
                        on_done(t, result)
        if failure is not None:
            raise failure from failure.cause


def get_executor(name: str = "local", **options: Any) -> Executor:
    """An executor by name: 'local' (options: workers) or 'ray' (options: address, ...)."""
    if name == "local":
        return LocalExecutor(**options)
    if name == "ray":
        from .ray_executor import RayExecutor

        return RayExecutor(**options)
    raise ShortcutlabError(f"unknown executor {name!r}; expected 'local' or 'ray'")
