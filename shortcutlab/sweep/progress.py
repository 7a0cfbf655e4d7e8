"""The sweep's progress bar: tasks done, and the epochs of the train tasks that are running.

A train task can take minutes; a bar that counts only finished tasks stands still meanwhile.
Each train task writes how far it is to its progress file (`SweepLayout.progress`: ``{"epoch":
done, "epochs": all}``, after every epoch) wherever it runs; `SweepProgress` reads these files
every `POLL_S` seconds on a thread of the sweep's process and moves the bar by the share of
the task done (a train task at epoch 3 of 12 counts a quarter of a task), with the epochs in
the bar's postfix ("train 3/12 epochs"). A file is the one channel every executor shares with
the process that started it: the local executor in this process or in its pool's, Ray on this
machine or on a cluster whose nodes share the sweep folder. (On a cluster that does not share
it, the bar counts finished tasks only.)
"""

from __future__ import annotations

import threading
from typing import Sequence

from shortcutlab.io import read_json_object
from shortcutlab.sweep.folder import SweepLayout
from shortcutlab.sweep.graph import Task

#: seconds between two reads of the running tasks' progress files
POLL_S = 1.0

#: the bar shows tasks with one decimal: the share of the running train tasks
BAR_FORMAT = "{l_bar}{bar}| {n:.1f}/{total_fmt} tasks [{elapsed}<{remaining}{postfix}]"


def epoch_share(record: dict | None) -> tuple[float, str] | None:
    """(share of the task done, postfix text) from a progress file's content; None for a file
    that is missing or not one (a task not started, one being written).

    >>> epoch_share({"epoch": 3, "epochs": 12})
    (0.25, 'train 3/12 epochs')
    """
    if not record:
        return None
    done, epochs = record.get("epoch"), record.get("epochs")
    if not isinstance(done, int) or not isinstance(epochs, int) or epochs < 1 or not 0 <= done <= epochs:
        return None
    return done / epochs, f"train {done}/{epochs} epochs"


class SweepProgress:
    """Move `bar` (a tqdm bar over tasks) as tasks finish (`done`) and as the train tasks of
    `tasks` advance their epochs (`poll`, on a thread between `start` and `stop`).

    Args:
        bar: a tqdm bar whose total counts tasks.
        root: the sweep folder.
        tasks: the tasks to run; the train tasks among them are watched.
        poll_s: seconds between reads of the progress files.
    """

    def __init__(self, bar, root: str, tasks: Sequence[Task], poll_s: float = POLL_S) -> None:
        self.bar = bar
        self.layout = SweepLayout(root)
        self.watched = [t.id for t in tasks if t.kind == "train"]
        self.shown: dict[str, float] = {}
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> None:
        """Read the progress files of the watched train tasks; move the bar by what they did
        since the last read."""
        with self._lock:
            notes = []
            for tid in list(self.watched):
                got = epoch_share(read_json_object(self.layout.progress("train", tid)))
                if got is None:
                    continue
                share, note = got
                notes.append(note)
                step = share - self.shown.get(tid, 0.0)
                if step > 0:
                    self.shown[tid] = share
                    self.bar.update(step)
            if notes:
                self.bar.set_postfix_str(", ".join(notes))

    def done(self, task: Task) -> None:
        """A task finished: the rest of its share (all of it for a task not seen running)."""
        with self._lock:
            if task.id in self.watched:
                self.watched.remove(task.id)
            self.bar.set_postfix_str(task.kind, refresh=False)
            self.bar.update(1.0 - self.shown.pop(task.id, 0.0))

    def start(self) -> "SweepProgress":
        """Poll on a daemon thread until `stop` (nothing to watch: no thread)."""
        if self.watched and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="shortcutlab-sweep-progress", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()
