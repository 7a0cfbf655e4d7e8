"""The layout of a sweep folder: the one place that knows where a sweep's files lie.

A sweep folder ``DIR`` (written by `shortcutlab sweep`, read by `shortcutlab results`,
`shortcutlab report` and the demo) holds:

- ``sweep.json``: the resolved config, the task counts, the model entries and the versions;
- ``.sweep.lock``: the lock of the sweep process running there;
- ``.shortcutlab-output.json``: the output marker (`shortcutlab.io.MARKER`);
- ``tasks/<kind>/.<id>.progress.json``: while a task runs, how far it is (the progress bar);
- ``tasks/<kind>/<id>/``: one folder per task (`TaskFolder`), with ``result.json`` (the task
  is done when it exists) and the task's outputs: ``benchmark/`` (synthesise; its crop
  manifest ``benchmark/manifest.csv``), ``split.csv`` (split), a run folder (train: the files
  of `models.recipe.train`, ``run.json`` and ``logits.csv`` among them),
  ``predictions.parquet`` (score), ``rows.json`` (diagnose);
- ``predictions.parquet`` / ``.csv`` and ``results.parquet`` / ``.csv``: the tidy tables;
- ``splits.json``: every split's hash and parameters;
- ``registration.json``: a copy of the registration the sweep was checked against
  (`sweep.registration`; only with ``sweep --registration``);
- ``report/``: the default folder of its report (`shortcutlab.report.build_report`).

Every module that opens or writes a file in a sweep folder takes its path from `SweepLayout`
(or `TaskFolder` for a task's folder, final or temporary), so a change of layout is made here.

Example:
    >>> layout = SweepLayout("runs/sweep")
    >>> layout.config
    'runs/sweep/sweep.json'
    >>> layout.task("split", "0123456789abcdef").split
    'runs/sweep/tasks/split/0123456789abcdef/split.csv'
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shortcutlab.io import MARKER, claim_output_dir, read_json_object, write_marker

if TYPE_CHECKING:
    from shortcutlab.sweep.graph import Task

CONFIG = "sweep.json"
LOCK = ".sweep.lock"
TASKS = "tasks"
SPLITS = "splits.json"
REGISTRATION = "registration.json"
REPORT = "report"
#: the tidy tables (stems), each written as Parquet and as CSV
TABLES = ("predictions", "results")
TABLE_FORMATS = ("parquet", "csv")

#: what a sweep writes in its folder (``name/``: a folder it owns whole); ``report/`` is the
#: default folder of its report
SWEEP_FILES = (CONFIG, LOCK, TASKS + "/", "predictions.parquet", "predictions.csv", "results.parquet",
               "results.csv", SPLITS, REPORT + "/", REGISTRATION)

#: the end of a running task's progress file's name (`SweepLayout.progress`)
PROGRESS_SUFFIX = ".progress.json"
RESULT = "result.json"
BENCHMARK = "benchmark"
#: the crop manifest of a synthesise task's benchmark, relative to the task's folder
BENCHMARK_MANIFEST = os.path.join(BENCHMARK, "manifest.csv")
SPLIT = "split.csv"
SCORE_PREDICTIONS = "predictions.parquet"
DIAGNOSE_ROWS = "rows.json"
RUN_RECORD = "run.json"
RUN_LOGITS = "logits.csv"

#: per task kind, what the sweep itself writes in a task's folder (``name/``: a folder written
#: whole by another output: the benchmark by `synth.write_synth`); a train task's folder is
#: also a run folder, whose files `models.recipe.train` writes
TASK_FILES = {
    "synthesise": (RESULT, BENCHMARK + "/"),
    "split": (RESULT, SPLIT),
    "train": (RESULT,),
    "score": (RESULT, SCORE_PREDICTIONS),
    "diagnose": (RESULT, DIAGNOSE_ROWS),
}


@dataclass(frozen=True)
class TaskFolder:
    """The files of one task's folder (``DIR/tasks/<kind>/<id>/``, or the temporary folder a
    task is built in before it is renamed into place).

    Attributes:
        path: the folder, as given (not made absolute).
    """

    path: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", os.fspath(self.path))

    @property
    def result(self) -> str:
        """``result.json``: the task's record (id, kind, params, deps, result, seconds)."""
        return os.path.join(self.path, RESULT)

    @property
    def benchmark(self) -> str:
        """``benchmark/``: a synthesise task's benchmark folder (`synth.write_synth`)."""
        return os.path.join(self.path, BENCHMARK)

    @property
    def benchmark_manifest(self) -> str:
        """``benchmark/manifest.csv``: the crop manifest of a synthesise task's benchmark."""
        return os.path.join(self.path, BENCHMARK_MANIFEST)

    @property
    def split(self) -> str:
        """``split.csv``: a split task's split manifest (with its sidecar beside it)."""
        return os.path.join(self.path, SPLIT)

    @property
    def predictions(self) -> str:
        """``predictions.parquet``: a score task's per-crop predictions."""
        return os.path.join(self.path, SCORE_PREDICTIONS)

    @property
    def rows(self) -> str:
        """``rows.json``: a diagnose task's rows."""
        return os.path.join(self.path, DIAGNOSE_ROWS)

    @property
    def run_record(self) -> str:
        """``run.json``: the record of a train task's run folder (written last: it marks the
        run complete)."""
        return os.path.join(self.path, RUN_RECORD)

    @property
    def run_logits(self) -> str:
        """``logits.csv``: the per-crop logits of a train task's run folder."""
        return os.path.join(self.path, RUN_LOGITS)


@dataclass(frozen=True)
class SweepLayout:
    """The paths of a sweep folder's files (nothing is read or checked on creation).

    Args:
        root: the sweep folder; paths are joined to it as given (make it absolute first
            where the paths are recorded or compared).
    """

    root: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", os.fspath(self.root))

    def _path(self, *names: str) -> str:
        return os.path.join(self.root, *names)

    # --- files at the top ------------------------------------------------------------------
    @property
    def config(self) -> str:
        """``sweep.json``."""
        return self._path(CONFIG)

    @property
    def lock(self) -> str:
        """``.sweep.lock``."""
        return self._path(LOCK)

    @property
    def marker(self) -> str:
        """The output marker (`shortcutlab.io.MARKER`)."""
        return self._path(MARKER)

    @property
    def splits(self) -> str:
        """``splits.json``."""
        return self._path(SPLITS)

    @property
    def registration(self) -> str:
        """``registration.json``: the copy of the registration the sweep was checked against."""
        return self._path(REGISTRATION)

    @property
    def report(self) -> str:
        """``report/``: the default folder of the sweep's report."""
        return self._path(REPORT)

    def table(self, stem: str, ext: str = "parquet") -> str:
        """A tidy table: `stem` in `TABLES`, `ext` in `TABLE_FORMATS` (``predictions.parquet``)."""
        return self._path(f"{stem}.{ext}")

    def outputs(self) -> dict[str, str]:
        """The files `runner.gather` writes together, by file name: the four tables, then
        ``splits.json``."""
        names = [f"{stem}.{ext}" for stem in TABLES for ext in TABLE_FORMATS] + [SPLITS]
        return {name: self._path(name) for name in names}

    # --- the task folders ------------------------------------------------------------------
    @property
    def tasks(self) -> str:
        """``tasks/``."""
        return self._path(TASKS)

    def kind_dir(self, kind: str) -> str:
        """``tasks/<kind>/``: the folders of one kind's tasks (and their temporaries)."""
        return self._path(TASKS, kind)

    @staticmethod
    def task_relpath(kind: str, tid: str) -> str:
        """``tasks/<kind>/<id>``, relative to the sweep folder (for `paths.inside` checks)."""
        return os.path.join(TASKS, kind, tid)

    def task_dir(self, kind: str, tid: str) -> str:
        """``tasks/<kind>/<id>/``."""
        return self._path(self.task_relpath(kind, tid))

    def task(self, kind: str, tid: str) -> TaskFolder:
        """The files of one task's folder."""
        return TaskFolder(self.task_dir(kind, tid))

    def progress(self, kind: str, tid: str) -> str:
        """``tasks/<kind>/.<id>.progress.json``: how far a running task is (a train task:
        ``{"epoch": done, "epochs": all}``), read by the sweep's progress bar; removed when
        the task ends (a killed sweep's are removed when it starts again)."""
        return os.path.join(self.kind_dir(kind), f".{tid}{PROGRESS_SUFFIX}")

    def is_done(self, kind: str, tid: str) -> bool:
        """Whether the task's folder holds its ``result.json`` (a task folder appears whole)."""
        return os.path.isfile(self.task(kind, tid).result)

    def read_result(self, kind: str, tid: str) -> dict:
        """The ``result`` entry of a finished task's ``result.json``."""
        with open(self.task(kind, tid).result, encoding="utf-8") as f:
            return json.load(f)["result"]


def task_dir(root: str, kind: str, tid: str) -> str:
    """``root/tasks/<kind>/<id>``: the folder of one task (`SweepLayout.task_dir`)."""
    return SweepLayout(root).task_dir(kind, tid)


def is_done(root: str, task: Task) -> bool:
    """Whether `task` (a `graph.Task`) of the sweep in `root` is finished (`SweepLayout.is_done`)."""
    return SweepLayout(root).is_done(task.kind, task.id)


def read_result(root: str, kind: str, tid: str) -> dict:
    """The recorded result of a finished task of the sweep in `root` (`SweepLayout.read_result`)."""
    return SweepLayout(root).read_result(kind, tid)


def is_legacy_sweep(out_dir: str) -> bool:
    """A sweep folder written before output markers: its sweep.json is a sweep's (or it holds
    only the lock of a sweep killed before it wrote one)."""
    layout = SweepLayout(out_dir)
    if not os.path.exists(layout.config):
        return os.listdir(out_dir) == [LOCK]
    d = read_json_object(layout.config)
    return d is not None and isinstance(d.get("config"), dict) and isinstance(d.get("tasks"), list)


def claim_sweep_dir(out_dir: str) -> None:
    """Refuse a folder holding files that no sweep wrote (`io.claim_output_dir`), and mark a
    new (or earlier, unmarked) sweep folder as one before anything else is written there, so
    that a sweep killed at any point can resume."""
    claim_output_dir(out_dir, "sweep", SWEEP_FILES, is_legacy_sweep)
    os.makedirs(out_dir, exist_ok=True)
    write_marker(out_dir, "sweep", SWEEP_FILES)
