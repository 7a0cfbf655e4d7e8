"""A real sweep on a tiny benchmark: its tables against hand computations from the trained
runs, identical tables whatever the executor's worker count, and resume after SIGKILL."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import yaml

from shortcutlab.sweep import LocalExecutor
from shortcutlab.sweep.config import validate
from shortcutlab.sweep.runner import results_table, run_sweep
from shortcutlab.sweep.folder import task_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = {
    "data": {"synthetic": {"mechanisms": ["color"], "fields_per_class": 8, "crop_size": 16, "field_size": 64}},
    "split": {"protocol": "factorial"},
    "seeds": [0],
    "models": [{"arch": "test_resnet", "epochs": 1, "lr": 0.001, "batch_size": 32}],
    "cells": ["leak-high", "clean-low"],
    "interventions": {"names": ["greyscale"]},
    "diagnostics": "none",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tiny"))
    summary = run_sweep(validate(TINY), out, progress=False)
    return out, summary


def test_predictions_match_the_trained_runs_logits(tiny):
    import torch

    from shortcutlab.models.runs import load_run

    out, summary = tiny
    assert summary["counts"] == {"synthesise": 1, "split": 1, "train": 2, "score": 2}
    pred = pd.read_parquet(os.path.join(out, "predictions.parquet"))
    assert pred.duplicated(["model", "intervention", "id"]).sum() == 0
    test_ids = None
    for model, g in pred.groupby("model"):
        run_dir = task_dir(out, "train", model)
        logits = pd.read_csv(os.path.join(run_dir, "logits.csv"), dtype={"id": str})
        test = logits[logits["split"] == "test"].set_index("id")
        classes = sorted(test["label"].unique())
        none = g[g["intervention"] == "none"].set_index("id")
        # the same crops, labels and predictions as the run scored (label names -> codes)
        assert sorted(none.index) == sorted(test.index)
        logit_cols = [f"logit_{c}" for c in classes]
        hand_pred = test[logit_cols].to_numpy().argmax(1)
        assert (none.loc[test.index, "pred"].to_numpy() == hand_pred).all()
        assert (none.loc[test.index, "label"].to_numpy() == test["label"].map(classes.index).to_numpy()).all()
        run_acc = float((test["label"] == test["pred"]).mean())
        assert none["correct"].mean() == pytest.approx(run_acc, abs=1e-12)
        # greyscale by hand (BT.601 luma on all channels), scored by the reloaded model
        grey = g[g["intervention"] == "greyscale"].set_index("id")
        run = load_run(run_dir)
        from shortcutlab.data.images import load_manifest_table
        from shortcutlab.data.images import load_crops

        crops = load_crops(load_manifest_table(run.record["data"]["manifest"]))
        rows = torch.as_tensor(np.searchsorted(crops.table.ids.astype(str), grey.index.to_numpy()))
        x = crops.images[rows].double() / 255.0
        luma = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1).repeat(1, 3, 1, 1).float()
        with torch.no_grad():
            hand = run.adapter.logits(luma).argmax(1).numpy()
        assert (grey["pred"].to_numpy() == hand).mean() >= 0.99  # float rounding may flip a near tie
        # the common test set: every cell of the factorial scores the same crops
        test_ids = test_ids if test_ids is not None else set(test.index)
        assert set(test.index) == test_ids
    assert set(pred["cell"]) == {"leak-high", "clean-low"}
    assert set(zip(pred["cell"], pred["exposure"], pred["diversity"])) == {("leak-high", "leak", "high"), ("clean-low", "clean", "low")}
    # the accuracy rows of results agree with the predictions
    res = pd.read_parquet(os.path.join(out, "results.parquet"))
    acc = res[res["metric"] == "accuracy"].set_index(["model", "setting"])["value"]
    per = pred.groupby(["model", "intervention"])["correct"].mean()
    for (model, iv), v in per.items():
        assert acc[(model, f"intervention={iv}")] == pytest.approx(v, abs=1e-12)
    # the estimates table: mean accuracy per cell and intervention
    table = results_table(out).set_index(["cell", "intervention"])
    assert table.loc[("leak-high", "none"), "accuracy"] == pytest.approx(per[pred[pred["cell"] == "leak-high"]["model"].iat[0], "none"])
    assert (table["n_models"] == 1).all()
    # the CSV twins hold the same rows
    assert len(pd.read_csv(os.path.join(out, "predictions.csv"))) == len(pred)


def test_a_second_run_redoes_nothing_and_gives_the_same_tables(tiny, tmp_path):
    out, _ = tiny
    before = pd.read_parquet(os.path.join(out, "predictions.parquet"))
    again = run_sweep(validate(TINY), out, progress=False)
    assert again["done_before"] == again["counts"]
    pd.testing.assert_frame_equal(pd.read_parquet(os.path.join(out, "predictions.parquet")), before)


@pytest.mark.slow
def test_one_and_two_workers_give_identical_tables(tiny, tmp_path):
    # the two workers share the sweep's threads (`sweep.threads`): twice those of the one-worker
    # sweep give each task the same torch threads, hence the same float reductions
    out, summary = tiny
    per_task = summary["threads"]["per_task"]
    again = run_sweep(validate(TINY), str(tmp_path), LocalExecutor(workers=2), progress=False, threads=2 * per_task)
    assert again["threads"]["per_task"] == per_task
    for name in ("predictions.parquet", "results.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / name), pd.read_parquet(os.path.join(out, name)))


def test_every_file_in_a_sweep_folder_is_one_its_layout_names(tiny):
    # the folder walked on disk (os.walk, not the layout) against the names SweepLayout gives,
    # with the files of the outputs nested in task folders named by their own modules
    from shortcutlab.data.manifest import sidecar_path
    from shortcutlab.io import MARKER
    from shortcutlab.models.recipe import RUN_FILES
    from shortcutlab.sweep.folder import SweepLayout, TaskFolder
    from shortcutlab.sweep.plan import build_plan
    from shortcutlab.synth import SYNTH_FILES

    out, _ = tiny
    layout = SweepLayout(out)
    on_disk = {os.path.relpath(os.path.join(d, n), out) for d, _, names in os.walk(out) for n in names}
    named = {layout.config, layout.lock, layout.marker, *layout.outputs().values()}
    nested = {}  # a folder another output writes whole -> the top names that output may hold
    for t in build_plan(validate(TINY)).graph.ordered():
        task = layout.task(t.kind, t.id)
        named.add(task.result)
        if t.kind == "synthesise":
            nested[task.benchmark] = {n.rstrip("/") for n in SYNTH_FILES} | {MARKER}
        elif t.kind == "split":
            named |= {task.split, sidecar_path(task.split)}
        elif t.kind == "train":
            named |= {task.run_record, task.run_logits}
            nested[task.path] = {n.rstrip("/") for n in RUN_FILES} | {MARKER}
        elif t.kind == "score":
            named.add(task.predictions)
    named_rel = {os.path.relpath(p, out) for p in named}
    assert named_rel <= on_disk  # everything the layout names for this sweep was written
    for rel in sorted(on_disk - named_rel):
        owner = next((f for f in nested if os.path.join(out, rel).startswith(f + os.sep)), None)
        assert owner is not None, f"{rel} is in the sweep folder but its layout does not name it"
        assert os.path.relpath(os.path.join(out, rel), owner).split(os.sep)[0] in nested[owner], rel
    # the same names, by hand from docs/sweeps.md's description of the folder
    assert TaskFolder("t").benchmark_manifest == os.path.join("t", "benchmark", "manifest.csv")
    assert layout.task("score", "ab").predictions == os.path.join(out, "tasks", "score", "ab", "predictions.parquet")
    assert layout.table("results", "csv") == os.path.join(out, "results.csv")
    assert layout.report == os.path.join(out, "report") and layout.splits == os.path.join(out, "splits.json")


def test_the_report_reads_the_paths_of_the_layout_wherever_the_folder_lies(tiny, tmp_path):
    # a sweep folder moved elsewhere: the report's view of it points where the moved layout says
    import shutil

    from shortcutlab.report import SweepFolder
    from shortcutlab.sweep.folder import SweepLayout
    from shortcutlab.sweep.plan import build_plan

    out, _ = tiny
    moved = str(tmp_path / "moved")
    shutil.copytree(out, moved, symlinks=True)
    layout = SweepLayout(moved)
    plan = build_plan(validate(TINY))
    synth = next(t.id for t in plan.graph.ordered() if t.kind == "synthesise")
    models = SweepFolder(moved).models()
    assert sorted(m.model for m in models) == sorted(m["model"] for m in plan.models)
    for m in models:
        entry = next(e for e in plan.models if e["model"] == m.model)
        assert m.run_dir == layout.task_dir("train", m.model) and os.path.isfile(os.path.join(m.run_dir, "run.json"))
        assert m.split == layout.task("split", entry["split_id"]).split and os.path.isfile(m.split)
        assert m.manifest == layout.task("synthesise", synth).benchmark_manifest and os.path.isfile(m.manifest)
        assert m.run_dir.startswith(moved + os.sep)


def _task_folders(out: str, kind: str) -> tuple[list[str], list[str]]:
    folder = os.path.join(out, "tasks", kind)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    done = [n for n in names if not n.startswith(".") and os.path.isfile(os.path.join(folder, n, "result.json"))]
    return done, [n for n in names if n.startswith(".")]


@pytest.mark.slow
def test_resume_after_sigkill_gives_exactly_the_rows_of_an_uninterrupted_run(tmp_path):
    cfg = dict(TINY, cells=["leak-high", "clean-high", "leak-low", "clean-low"], models=[{"arch": "test_resnet", "epochs": 3, "lr": 0.001}])
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(cfg))
    killed = str(tmp_path / "killed")
    cmd = [sys.executable, "-m", "shortcutlab.cli", "sweep", str(path), "--out", killed, "--quiet"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if len(_task_folders(killed, "train")[0]) >= 1:
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"the sweep ended before it could be killed: {proc.stderr.read().decode()[-500:]}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    done_trains = _task_folders(killed, "train")[0]
    assert 1 <= len(done_trains) < 4 and not os.path.exists(os.path.join(killed, "predictions.parquet"))
    # start again: only the missing tasks run
    rc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert rc.returncode == 0, rc.stderr
    import re

    already = int(re.search(r"(\d+) already done", rc.stdout).group(1))
    assert 2 + len(done_trains) <= already < 2 + 4 + 4  # the benchmark, the split and the finished models were kept
    for kind in ("synthesise", "split", "train", "score"):
        assert _task_folders(killed, kind)[1] == []  # no temporary folder left, none counted as done
    # an uninterrupted run of the same config, in this process
    whole = str(tmp_path / "whole")
    run_sweep(validate(cfg), whole, progress=False)
    for name in ("predictions.parquet", "results.parquet"):
        a, b = pd.read_parquet(os.path.join(killed, name)), pd.read_parquet(os.path.join(whole, name))
        pd.testing.assert_frame_equal(a, b)
    pred = pd.read_parquet(os.path.join(killed, "predictions.parquet"))
    assert pred.duplicated(["model", "intervention", "id"]).sum() == 0
    assert pred["model"].nunique() == 4


def test_results_command_prints_the_bootstrap_leak_effect(tmp_path, capsys):
    # a sweep folder holding only a predictions table (simulated factorial): `shortcutlab
    # results` prints the leak effect, which must equal leak minus clean accuracy computed by
    # hand with pandas, in pp, with an interval around it
    from shortcutlab.cli import main
    from shortcutlab.stats import simulate_factorial

    pred = simulate_factorial(n_seeds=6, n_parents=30, crops_per_parent=3, effect=0.8, seed=4)
    for c in pred.columns:
        if isinstance(pred[c].dtype, pd.CategoricalDtype):
            pred[c] = pred[c].astype(str)
    pred.to_parquet(tmp_path / "predictions.parquet", index=False)
    hand = 100 * (pred.loc[pred["exposure"] == "leak", "correct"].mean() - pred.loc[pred["exposure"] == "clean", "correct"].mean())
    assert main(["results", str(tmp_path), "--n-boot", "300"]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.split()[:3] == ["H3", "leak", "study"])   # H3, in the H2-H5 family
    m = re.search(r"([+-]\d+\.\d)\s+\[([+-]\d+\.\d), ([+-]\d+\.\d)\]", line)
    assert m, line
    est, lo, hi = map(float, m.groups())
    assert est == pytest.approx(hand, abs=0.051) and lo < est < hi


@pytest.mark.slow
def test_ray_executor_gives_the_tables_of_the_local_one(tiny, tmp_path):
    # the check: the same sweep on a local Ray instance (2 CPUs, started by the test)
    # and in process gives identical predictions and results tables
    pytest.importorskip("ray")
    from shortcutlab.sweep.executors.ray import RayExecutor

    local_out, summary = tiny
    out = str(tmp_path / "ray")
    per_task = summary["threads"]["per_task"]
    with RayExecutor(num_cpus=max(2, per_task)) as ex:  # Ray's tasks run on the threads given per task: the local run's
        run_sweep(validate(TINY), out, ex, progress=False, threads=per_task)
    for name in ("predictions", "results"):
        a = pd.read_parquet(os.path.join(local_out, f"{name}.parquet"))
        b = pd.read_parquet(os.path.join(out, f"{name}.parquet"))
        sort = [c for c in ("model", "intervention", "id", "diagnostic", "setting", "metric") if c in a.columns]
        a = a.sort_values(sort).reset_index(drop=True)
        b = b.sort_values(sort).reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b)
    assert len(a) > 0


def test_dry_run_shows_the_device_of_each_train_task_and_models_trained_on_another(tiny, tmp_path, capsys):
    # the device is part of a train task's id: a run with another device retrains; --dry-run says so
    from shortcutlab.cli import main
    from shortcutlab.sweep.runner import trained_on_other_devices

    out, _ = tiny
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(TINY))
    assert main(["sweep", str(path), "--out", out, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    trains = [l for l in lines if l.split()[1:2] == ["train"]]
    assert len(trains) == 2 and all(l.split()[0] == "done" and l.endswith("device=cpu") for l in trains)
    assert not any(l.startswith("note:") for l in lines)  # same device: nothing to retrain
    assert trained_on_other_devices(out, "cpu") == {}
    assert trained_on_other_devices(out, "cuda:0") == {"cpu": 2}


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if rest[0] != "Z":  # a zombie has exited already
                children.setdefault(int(rest[1]), []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the process table from /proc")
def test_sigkill_of_a_sweep_with_two_workers_leaves_no_process_behind(tmp_path):
    # issue 20: both workers of `sweep --workers 2` outlived a SIGKILLed parent forever
    cfg = dict(TINY, seeds=[0, 1], models=[{"arch": "test_resnet", "epochs": 200, "lr": 0.001}])
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = str(tmp_path / "out")
    cmd = [sys.executable, "-m", "shortcutlab", "sweep", str(path), "--out", out, "--workers", "2", "--quiet"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    below: list[int] = []
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:  # until both workers have run a task
            below = _descendants(proc.pid)
            workers = [p for p in below if "spawn_main" in _cmdline(p)]
            if len(workers) == 2 and len(_task_folders(out, "synthesise")[0]) == 2:
                break
            time.sleep(0.1)
        assert proc.poll() is None, f"the sweep ended before it could be killed: {proc.stderr.read().decode()[-500:]}"
        assert len(workers) == 2
        below = _descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 10  # the workers poll their parent every 0.5 s
        while time.time() < deadline and any(map(_alive, below)):
            time.sleep(0.1)
        left = [(p, _cmdline(p)) for p in below if _alive(p)]
        assert left == []
    finally:
        for p in [proc.pid, *below]:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


# --- issue 21: score and diagnose tasks run their model on the sweep's device -------------
class _Ran(BaseException):
    """Raised at a watched model's first forward pass: the task stops there (a BaseException,
    so that a diagnostic's own failure handling does not catch it)."""


def _watch_models(monkeypatch, stop: bool) -> list:
    """Every model wrapped from now on records (its parameters' device, its input's device) at
    each forward pass of its first layer with parameters; with `stop`, the first pass raises
    `_Ran`. The hook sits on that layer because every output (logits, features) passes it."""
    import shortcutlab.models.adapter as adapter

    seen: list = []
    real = adapter.wrap

    def spy(model, **kw):
        first = next(m for m in model.modules() if any(True for _ in m.parameters(recurse=False)))

        def hook(module, args):
            seen.append((next(module.parameters()).device, args[0].device))
            if stop:
                raise _Ran

        first.register_forward_pre_hook(hook)
        return real(model, **kw)

    monkeypatch.setattr(adapter, "wrap", spy)
    return seen


def test_the_sweeps_device_reaches_its_score_and_diagnose_tasks(monkeypatch):
    import torch

    from shortcutlab.sweep.plan import build_plan

    diag = {**TINY, "diagnostics": {"only": ["parent_probe"]}}
    with monkeypatch.context() as m:  # a machine with one GPU, for the config's device check
        m.setattr(torch.cuda, "is_available", lambda: True)
        m.setattr(torch.cuda, "device_count", lambda: 1)
        gpu = build_plan(validate({**diag, "device": "cuda:0"}))
    tasks = [t for t in gpu.graph.ordered() if t.kind in ("score", "diagnose")]
    assert sorted(t.kind for t in tasks) == ["diagnose", "diagnose", "score", "score"]
    assert all(t.params["device"] == "cuda:0" and t.resources["gpu"] == 1 for t in tasks)
    # on the CPU the parameters (and so the ids of earlier sweep folders) have no device
    cpu = [t for t in build_plan(validate(diag)).graph.ordered() if t.kind in ("score", "diagnose")]
    assert len(cpu) == 4 and not any("device" in t.params for t in cpu)


def test_score_and_diagnose_tasks_load_and_run_their_model_on_the_task_device(tiny, monkeypatch):
    # The bug: these tasks reserved the sweep's GPU but loaded their model on the CPU. Here
    # the device a task names must reach the model load (resolve_device sees it), and the
    # model's parameters and its input batches must be where it sends them: torch's "meta"
    # device, which a CPU-only machine has (shapes without data: the task stops at the
    # model's first forward pass). Every route: a model the sweep trained, a checkpoint (a
    # run folder) and a model trained elsewhere (weights, arch, classes).
    import json

    import torch

    import shortcutlab.models.devices as devices
    from shortcutlab.sweep.graph import Task
    from shortcutlab.sweep.plan import build_plan
    from shortcutlab.sweep.tasks import run_task

    out, _ = tiny
    trained = next(t for t in build_plan(validate(TINY)).graph.ordered() if t.kind == "score")
    run_dir = task_dir(out, "train", trained.params["inputs"]["train"])
    with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
        classes = json.load(f)["classes"]
    others = validate({**TINY, "models": [{"checkpoint": run_dir}, {"weights": os.path.join(run_dir, "model.safetensors"),
                                                                    "arch": "test_resnet", "classes": classes, "name": "ext"}]})
    scores = [t for t in build_plan(others).graph.ordered() if t.kind == "score"]
    routes = {"train": trained, **{next(k for k in ("checkpoint", "wrap") if k in t.params["inputs"]): t for t in scores}}
    assert sorted(routes) == ["checkpoint", "train", "wrap"]
    diagnose = {"only": ["parent_probe"], "params": {}, "seed": 0, "batch_size": 256, "inputs": trained.params["inputs"]}
    asked: list = []
    monkeypatch.setattr(devices, "resolve_device", lambda name: asked.append(str(name)) or torch.device("meta"))
    seen = _watch_models(monkeypatch, stop=True)
    jobs = [(f"score-{r}", "score", t.params, t.deps) for r, t in routes.items()] + [("diagnose-train", "diagnose", diagnose, trained.deps)]
    for name, kind, params, deps in jobs:
        asked.clear(), seen.clear()
        task = Task(id=f"device-{name}", kind=kind, params={**params, "device": "cuda:1"}, deps=deps)
        with pytest.raises(_Ran):
            run_task(task, out)
        assert asked == ["cuda:1"], name
        assert seen == [(torch.device("meta"), torch.device("meta"))], name
        assert not os.path.exists(task_dir(out, kind, task.id))  # stopped: no task folder left


@pytest.mark.device
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_sweep_scores_its_models_on_cuda(tmp_path, monkeypatch):
    # on a GPU: the score task's model and batches are on CUDA (so are training's), and its
    # predictions are those of the same run scored on the CPU, but for near ties, which
    # CUDA's kernels (TF32 convolutions) may flip
    import torch

    from shortcutlab.data.images import load_crops, load_manifest_table
    from shortcutlab.models.runs import load_run

    seen = _watch_models(monkeypatch, stop=False)
    out = str(tmp_path / "gpu")
    run_sweep(validate({**TINY, "cells": ["leak-high"], "device": "cuda"}), out, progress=False)
    assert seen and all(p.type == "cuda" and x.type == "cuda" for p, x in seen)
    pred = pd.read_parquet(os.path.join(out, "predictions.parquet"))
    none = pred[pred["intervention"] == "none"]
    run = load_run(task_dir(out, "train", none["model"].iat[0]), device="cpu")
    crops = load_crops(load_manifest_table(run.record["data"]["manifest"]))
    rows = torch.as_tensor(np.searchsorted(crops.table.ids.astype(str), none["id"].astype(str).to_numpy()))
    with torch.no_grad():
        logits = run.adapter.logits(crops.images[rows].float() / 255.0)
    top2 = logits.topk(2, dim=1).values
    near_tie = (top2[:, 0] - top2[:, 1]).numpy() < 0.05
    assert len(none) and ((none["pred"].to_numpy() == logits.argmax(1).numpy()) | near_tie).all()
