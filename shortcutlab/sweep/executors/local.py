"""`LocalExecutor`: runs a sweep's tasks in this process or a pool of spawned processes.

``workers=1`` runs in this process; ``workers=N`` uses a process pool (spawned processes, so it
is safe with torch) whose workers exit when the process that started them dies, even by
SIGKILL (`_watch_parent`). The contract it follows is in `shortcutlab.sweep.executors.base`.
"""


from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import sys
import threading
import time
from typing import Sequence

from shortcutlab.sweep.executors.base import DoneFn, ExecutorError, TaskFailed, TaskFn, check_order
from shortcutlab.sweep.executors.registry import register
from shortcutlab.sweep.graph import Task


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


@register("local")
class LocalExecutor:
    """Run tasks in this process (``workers=1``) or on a pool of ``workers`` spawned processes."""

    name = "local"

    def __init__(self, workers: int = 1) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ExecutorError(f"workers must be a positive integer; got {workers!r}")
        self.workers = workers

    def run(self, tasks: Sequence[Task], fn: TaskFn, on_done: DoneFn | None = None) -> None:
        tasks = list(tasks)
        check_order(tasks)
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
