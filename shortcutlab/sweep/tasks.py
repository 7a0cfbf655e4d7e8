"""The tasks of a sweep: the function that runs one task, for every kind of task.

Kinds, each reading its inputs from the folders of the tasks it depends on:

- ``synthesise`` (one per data condition and seed): the benchmark folder (`write_synth`);
- ``split`` (per benchmark or manifest, split setting and seed): ``split.csv`` and its sidecar;
- ``train`` (per split, model and cell): the run folder of `recipe.train`;
- ``score`` (per trained model or checkpoint): per-crop predictions of the test side, unaltered
  and under each intervention (`probes.interventions_accuracy.score_interventions`);
- ``diagnose`` (per trained model or checkpoint): the rows of `probes.diagnose`.

The graph of these tasks is the config's plan (`plan.build_plan`). `run_task` writes the
task's folder ``DIR/tasks/<kind>/<id>/`` (`folder.SweepLayout`) as a whole (built under a
temporary name and renamed, `io.atomic_dir`) with ``result.json`` inside; a task is done when
its folder holds ``result.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

from shortcutlab.io import atomic_dir, file_sha256, to_json
from shortcutlab.sweep.folder import BENCHMARK_MANIFEST, SweepLayout, TaskFolder
from shortcutlab.sweep.graph import Task
from shortcutlab.sweep.plan import checkpoint_key, wrapped_model_id

KINDS = ("synthesise", "split", "train", "score", "diagnose")


# ------------------------------------------------------------------------------- running
class TaskRunner:
    """``fn(task)`` for the executors: runs one task of the sweep rooted at `root` (picklable)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def __call__(self, task: Task) -> dict:
        return run_task(task, self.root)


def run_task(task: Task, root: str) -> dict:
    """Run one task: build its folder under a temporary name, rename it into place.

    Runs torch on ``task.resources["cpu"]`` threads (restored afterwards; the runner sets
    them, `sweep.threads`), recorded as ``threads`` in ``result.json``. Float reductions, hence
    the last digits of a model's logits, depend on the thread count. A task whose folder is
    already complete is not run again; its recorded result is returned.
    """
    import torch

    root = os.path.abspath(root)
    layout = SweepLayout(root)
    final = layout.task_dir(task.kind, task.id)
    if layout.is_done(task.kind, task.id):
        return layout.read_result(task.kind, task.id)
    fn = RUNNERS[task.kind]
    old = torch.get_num_threads()
    threads = max(1, int(task.resources.get("cpu", 1)))
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        with atomic_dir(final) as tmp:
            result = fn(task, root, tmp, final)
            with open(TaskFolder(tmp).result, "w", encoding="utf-8") as f:
                f.write(to_json({"id": task.id, "kind": task.kind, "params": task.params, "deps": list(task.deps),
                                 "result": result, "seconds": round(time.perf_counter() - t0, 3), "threads": threads}))
    finally:
        torch.set_num_threads(old)
    return result


def _split_files(root: str, split_id: str) -> tuple[dict, str]:
    layout = SweepLayout(root)
    return layout.read_result("split", split_id), layout.task("split", split_id).split


def _manifest_path(root: str, res: dict) -> str:
    from shortcutlab.paths import inside

    p = res["manifest"]  # a benchmark the sweep made is recorded relative and lies inside it
    if os.path.isabs(p):
        return p
    inside(root, p, f"{root}/tasks/split result: crop manifest")
    return os.path.join(root, p)


def _table(root: str, res: dict, box: bool = False):
    from shortcutlab.data.table import CropTable

    c = res["columns"]
    kw = {"box": "x,y,w,h"} if box and res.get("geometry") else {}
    return CropTable.from_csv(_manifest_path(root, res), id=c["id"], label=c["label"], parent=c["parent"], image=c["image"],
                              mask=c["mask"], **kw)


def _run_synthesise(task: Task, root: str, tmp: str, final: str) -> dict:
    from shortcutlab.synth import SynthConfig, synthesize, write_synth

    threads = max(1, int(task.resources.get("cpu", 1)))
    data = synthesize(SynthConfig.from_dict(task.params["synth"]), workers=threads)
    write_synth(data, TaskFolder(tmp).benchmark, workers=threads)
    return {"n_crops": len(data), "n_parents": int(data.table["parent"].nunique()), "manifest": BENCHMARK_MANIFEST}


def _run_split(task: Task, root: str, tmp: str, final: str) -> dict:
    from shortcutlab.data.splits import make_split

    p = task.params
    data = p["data"]
    if data["kind"] == "synthetic":
        sid = p["inputs"]["synthesise"]
        manifest = os.path.relpath(SweepLayout(root).task("synthesise", sid).benchmark_manifest, root)
        res = {"manifest": manifest, "geometry": True,
               "columns": {"id": "id", "label": "label", "parent": "parent", "image": "path", "mask": "mask"}}
    else:
        if file_sha256(data["path"]) != data["sha256"]:
            from shortcutlab.errors import ShortcutlabError

            raise ShortcutlabError(f"crop manifest {data['path']!r} changed since the sweep was planned; start the sweep again")
        res = {"manifest": data["path"], "geometry": False, "columns": {k: data[k] for k in ("id", "label", "parent", "image", "mask")}}
    table = _table(root, res, box=True)
    split = make_split(table, p["protocol"], **p["params"])
    sha = split.to_csv(TaskFolder(tmp).split)
    return {**res, "sha256": sha, "cells": [c for c in split.cells if c], "n_rows": int(len(split.assignments))}


def _run_train(task: Task, root: str, tmp: str, final: str) -> dict:
    from shortcutlab.models.recipe import TrainConfig, train

    from shortcutlab.io import write_json

    p = task.params
    res, split_path = _split_files(root, p["inputs"]["split"])
    progress = SweepLayout(root).progress("train", task.id)

    def on_epoch(done: int, epochs: int) -> None:  # read by the sweep's progress bar, in any process
        write_json(progress, {"epoch": done, "epochs": epochs})

    try:
        rec = train(_table(root, res), split_path, tmp, TrainConfig.from_dict(p["train"]), cell=p["cell"], progress=False,
                    on_epoch=on_epoch)
    finally:
        with contextlib.suppress(OSError):
            os.remove(progress)
    # run.json names the folder it was written in: the final one, not the temporary one.
    path = TaskFolder(tmp).run_record
    with open(path, encoding="utf-8") as f:
        run = json.load(f)
    run["out_dir"] = final
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_json(run))
    return {"accuracy": rec.accuracy, "n_crops": rec.n_crops, "split_sha256": rec.split_sha256, "classes": rec.classes}


def _context(task: Task, root: str):
    """The DiagnosticContext of the model a score or diagnose task reads, the model loaded on
    the task's device (``params["device"]``, the sweep's; CPU when absent)."""
    import numpy as np

    import probes
    from probes.base import DiagnosticContext

    from shortcutlab.data.audit import side_codes
    from shortcutlab.data.images import load_crops
    from shortcutlab.data.manifest import SplitManifest
    from shortcutlab.models.runs import load_run, load_run_data

    p = task.params
    inputs = p["inputs"]
    device = p.get("device", "cpu")
    if "checkpoint" in inputs:
        run = load_run(inputs["checkpoint"], device=device)
        crops, split, side = load_run_data(run)
        model_id = checkpoint_key(inputs["checkpoint"])["model"]
    elif "wrap" in inputs:
        res, split_path = _split_files(root, inputs["split"])
        table = _table(root, res)
        run = _wrapped_run(inputs["wrap"], list(table.classes), device)
        crops = load_crops(table)
        split = SplitManifest.read(split_path)
        side = np.asarray(side_codes(table, split.cell(inputs.get("side_cell"))))
        model_id = wrapped_model_id(inputs["wrap"], inputs["split"])
    else:
        run = load_run(SweepLayout(root).task_dir("train", inputs["train"]), device=device)
        res, split_path = _split_files(root, inputs["split"])
        table = _table(root, res)
        crops = load_crops(table)
        split = SplitManifest.read(split_path)
        side = np.asarray(side_codes(table, split.cell(run.record.get("cell"))))
        model_id = inputs["train"]
    names = [n for _, n, _ in p.get("interventions", [])]
    targets = probes.intervention_targets(crops, split, names=names, seed=p["seed"]) if names else {}
    ctx = DiagnosticContext(run.adapter, crops, side, run_id=model_id, split_sha256=split.hash, batch_size=p["batch_size"],
                            seed=p["seed"], targets=targets, preprocess=run.preprocess)
    return ctx, run, split


def _wrapped_run(wrap: dict, classes: list[str], device: str = "cpu"):
    """A `Run` of a model trained elsewhere, on `device`, its logits in the data's class order
    (classes by name): the classifier's rows are reordered when the model's logit order differs."""
    from shortcutlab.errors import ShortcutlabError
    from shortcutlab.models.runs import Run

    if file_sha256(wrap["weights"]) != wrap["weights_sha256"]:
        raise ShortcutlabError(f"weights file {wrap['weights']!r} changed since the sweep was planned; start the sweep again")
    return Run.from_weights(wrap["arch"], wrap["weights"], wrap["classes"], order=classes, path=os.path.dirname(wrap["weights"]),
                            device=device)


def _run_score(task: Task, root: str, tmp: str, final: str) -> dict:
    from probes.interventions_accuracy import score_interventions

    ctx, run, split = _context(task, root)
    frame = score_interventions(ctx, [tuple(s) for s in task.params["interventions"]])
    frame["label_name"] = [ctx.classes[k] for k in frame["label"]]
    frame.to_parquet(TaskFolder(tmp).predictions, index=False)
    acc = {s: [int(g["correct"].sum()), int(len(g))] for s, g in frame.groupby("intervention", sort=False)}
    return {"split_sha256": split.hash, "correct_n": acc, "classes": ctx.classes}


def _run_diagnose(task: Task, root: str, tmp: str, final: str) -> dict:
    import math

    import probes

    ctx, run, split = _context(task, root)
    p = task.params
    log: list = []
    rows = probes.diagnose(ctx.adapter, ctx.crops, ctx.side, only=p["only"], params=p["params"], run_id=ctx.run_id,
                           batch_size=p["batch_size"], seed=p["seed"], preprocess=ctx.preprocess, log=log)
    records = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows.to_dict("records")]
    with open(TaskFolder(tmp).rows, "w", encoding="utf-8") as f:
        f.write(to_json(records))
    return {"split_sha256": split.hash, "n_rows": len(records), "log": log}


#: the function of each task kind: ``fn(task, root, tmp, final) -> result``, writing the task's
#: files in `tmp` (its folder under a temporary name; `final` is the name it will have)
RUNNERS = {"synthesise": _run_synthesise, "split": _run_split, "train": _run_train, "score": _run_score, "diagnose": _run_diagnose}
