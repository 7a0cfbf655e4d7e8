"""Threads and progress of a sweep (`sweep.threads`, `sweep.progress`, `recipe.train`'s
`on_epoch`): the default thread count is the process's CPU affinity (mocked), tasks running at
once share the threads (checked against integer division by hand), the thread count reaches
every task's and run's record, and a training reports every epoch."""

from __future__ import annotations

import json
import os

import pytest

from shortcutlab.sweep import threads as th
from shortcutlab.sweep.progress import SweepProgress, epoch_share


def test_the_default_thread_count_is_the_process_affinity(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert th.available_cores() == 3 and th.default_threads() == 3
    assert th.plan_threads(None, 1) == th.ThreadPlan(per_task=3, total=3, workers=1, source="default")
    assert th.plan_threads(None, 2) == th.ThreadPlan(per_task=1, total=3, workers=2, source="default")


@pytest.mark.parametrize("env, expected", [("2", 2), (" 5 ", 5), ("0", 3), ("", 3), ("four", 3), ("2,1", 3)])
def test_an_omp_num_threads_limit_is_the_default_where_it_is_a_positive_integer(monkeypatch, env, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", env)
    assert th.default_threads() == expected


def test_without_affinity_the_default_is_the_cpu_count(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert th.available_cores() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert th.available_cores() == 1


@pytest.mark.parametrize("threads, workers, per_task", [(8, 3, 2), (8, 4, 2), (2, 4, 1), (1, 1, 1), (7, 2, 3), (16, 1, 16)])
def test_tasks_running_at_once_share_the_threads(threads, workers, per_task):
    assert th.task_threads(threads, workers) == per_task
    assert th.plan_threads(threads, workers) == th.ThreadPlan(per_task, threads, workers, "given")
    assert per_task * workers <= max(threads, workers)   # never more threads than given, but one each


def test_an_executor_without_workers_reserves_the_given_threads_per_task(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(12)), raising=False)
    assert th.plan_threads(None, None) == th.ThreadPlan(1, None, None, "default")   # Ray: one CPU per task
    assert th.plan_threads(4, None) == th.ThreadPlan(4, None, None, "given")


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_threads_must_be_a_positive_integer(bad):
    from shortcutlab.errors import ShortcutlabError

    with pytest.raises(ShortcutlabError, match=f"--threads takes the number of torch threads, a positive integer; got {bad!r}"):
        th.check_threads(bad)


class _Bar:
    """What SweepProgress needs of a tqdm bar, with its position kept exactly."""

    def __init__(self) -> None:
        self.n, self.postfix = 0.0, ""

    def update(self, k: float) -> None:
        self.n += k

    def set_postfix_str(self, s: str, refresh: bool = True) -> None:
        self.postfix = s


def test_the_bar_moves_by_the_share_of_epochs_done_and_completes_each_task_once(tmp_path):
    from shortcutlab.io import write_json
    from shortcutlab.sweep.folder import SweepLayout
    from shortcutlab.sweep.graph import Task

    layout = SweepLayout(str(tmp_path))
    os.makedirs(layout.kind_dir("train"))
    train, score = Task("t1", "train", {}), Task("s1", "score", {})
    bar = _Bar()
    watch = SweepProgress(bar, str(tmp_path), [train, score])
    watch.poll()
    assert bar.n == 0                                   # not started: no file
    write_json(layout.progress("train", "t1"), {"epoch": 3, "epochs": 12})
    watch.poll()
    watch.poll()                                        # read twice, counted once
    assert bar.n == pytest.approx(0.25) and bar.postfix == "train 3/12 epochs"
    write_json(layout.progress("train", "t1"), {"epoch": 12, "epochs": 12})
    watch.poll()
    assert bar.n == pytest.approx(1.0)
    watch.done(train)
    watch.done(score)
    assert bar.n == pytest.approx(2.0) and bar.postfix == "score"
    watch.poll()                                        # a finished task's stale file moves nothing
    assert bar.n == pytest.approx(2.0)


@pytest.mark.parametrize("record", [None, {}, {"epoch": 13, "epochs": 12}, {"epoch": 1, "epochs": 0}, {"epoch": "1", "epochs": 2}])
def test_a_progress_file_that_is_not_one_moves_nothing(record):
    assert epoch_share(record) is None


def test_training_calls_on_epoch_once_per_epoch(tmp_path):
    """A 3-epoch training on 32 tiny crops calls back (1, 3), (2, 3), (3, 3), and run.json
    records the threads it ran on."""
    import numpy as np
    import pandas as pd
    import torch
    from PIL import Image

    from shortcutlab.data.images import load_manifest_table
    from shortcutlab.data.splits import parent_split
    from shortcutlab.models.recipe import TrainConfig, train

    rng = np.random.default_rng(0)
    os.makedirs(tmp_path / "crops")
    rows = []
    for i in range(32):
        Image.fromarray((rng.random((16, 16, 3)) * 255).astype(np.uint8)).save(tmp_path / "crops" / f"c{i}.png")
        rows.append({"id": f"c{i}", "path": f"crops/c{i}.png", "label": f"k{i % 2}", "parent": f"p{i // 4}"})
    pd.DataFrame(rows).to_csv(tmp_path / "m.csv", index=False)
    parent_split(load_manifest_table(str(tmp_path / "m.csv")), 0.25, seed=0).to_csv(tmp_path / "split.csv")
    calls = []
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        rec = train(str(tmp_path / "m.csv"), str(tmp_path / "split.csv"), str(tmp_path / "run"),
                    TrainConfig(arch="test_resnet", epochs=3, batch_size=16), progress=False,
                    on_epoch=lambda done, epochs: calls.append((done, epochs)))
    finally:
        torch.set_num_threads(before)
    assert calls == [(1, 3), (2, 3), (3, 3)]
    assert rec.threads == 1 and json.loads((tmp_path / "run" / "run.json").read_text())["threads"] == 1


def test_a_sweep_gives_each_task_its_share_records_it_and_reports_each_epoch(tmp_path, monkeypatch):
    """A tiny sweep (one model, 2 epochs) with threads=7 on an executor running 3 tasks at once:
    every task gets 7 // 3 = 2 threads, recorded in sweep.json, each result.json and run.json;
    the train task writes its progress after each of its 2 epochs and leaves no file behind."""
    import shortcutlab.io as sio
    from shortcutlab.sweep import LocalExecutor
    from shortcutlab.sweep.config import validate
    from shortcutlab.sweep.folder import PROGRESS_SUFFIX, SweepLayout
    from shortcutlab.sweep.runner import run_sweep

    class Recording:
        name, workers = "recording", 3

        def __init__(self) -> None:
            self.cpus: list = []

        def run(self, tasks, fn, on_done=None):
            self.cpus = [t.resources["cpu"] for t in tasks]
            LocalExecutor(workers=1).run(tasks, fn, on_done)

    written = []
    write_json = sio.write_json
    monkeypatch.setattr(sio, "write_json", lambda path, obj, **kw: (written.append((os.fspath(path), obj)), write_json(path, obj, **kw)))
    cfg = validate({"data": {"synthetic": {"mechanisms": ["color"], "fields_per_class": 6, "crop_size": 16, "field_size": 64}},
                    "split": {"protocol": "factorial"}, "seeds": [0], "cells": ["leak-high"], "interventions": "none",
                    "diagnostics": "none", "models": [{"arch": "test_resnet", "epochs": 2, "batch_size": 32}]})
    ex = Recording()
    out = str(tmp_path / "sweep")
    summary = run_sweep(cfg, out, ex, progress=False, threads=7)
    assert ex.cpus == [2] * summary["n_tasks"] and summary["threads"] == {"per_task": 2, "total": 7, "workers": 3, "source": "given"}
    layout = SweepLayout(out)
    assert json.loads(open(layout.config).read())["threads"]["per_task"] == 2
    kinds = {"synthesise", "split", "train", "score"}
    for kind in kinds:
        for tid in [n for n in os.listdir(layout.kind_dir(kind)) if not n.startswith(".")]:
            assert json.loads(open(layout.task(kind, tid).result).read())["threads"] == 2
            if kind == "train":
                assert json.loads(open(layout.task(kind, tid).run_record).read())["threads"] == 2
    progress = [obj for path, obj in written if path.endswith(PROGRESS_SUFFIX)]
    assert progress == [{"epoch": 1, "epochs": 2}, {"epoch": 2, "epochs": 2}]
    assert not [n for n in os.listdir(layout.kind_dir("train")) if n.startswith(".")]
