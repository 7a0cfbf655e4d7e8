"""The tasks of a sweep: the graph a config expands to, and the function that runs one task.

Kinds, each reading its inputs from the folders of the tasks it depends on:

- ``synthesise`` (one per data condition and seed): the benchmark folder (`write_synth`);
- ``split`` (per benchmark or manifest, split setting and seed): ``split.csv`` and its sidecar;
- ``train`` (per split, model and cell): the run folder of `recipe.train`;
- ``score`` (per trained model or checkpoint): per-crop predictions of the test side, unaltered
  and under each intervention (`probes.interventions_accuracy.score_interventions`);
- ``diagnose`` (per trained model or checkpoint): the rows of `probes.diagnose`.

A task's parameters carry everything it needs, including the ids of its inputs
(``params["inputs"]``), so that two grid points needing the same benchmark, split or model name
the same task. `run_task` writes the task's folder ``DIR/tasks/<kind>/<id>/`` as a whole
(built under a temporary name and renamed, `io.atomic_dir`) with ``result.json`` inside; a
task is done when its folder holds ``result.json``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from shortcutlab.io import atomic_dir, file_sha256, to_json
from shortcutlab.sweep.config import SweepConfig
from shortcutlab.sweep.graph import Task, TaskGraph

KINDS = ("synthesise", "split", "train", "score", "diagnose")
SCORE_BATCH = 256


def task_dir(root: str, kind: str, tid: str) -> str:
    return os.path.join(root, "tasks", kind, tid)


def is_done(root: str, task: Task) -> bool:
    return os.path.isfile(os.path.join(task_dir(root, task.kind, task.id), "result.json"))


def read_result(root: str, kind: str, tid: str) -> dict:
    with open(os.path.join(task_dir(root, kind, tid), "result.json"), encoding="utf-8") as f:
        return json.load(f)["result"]


# ------------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    """The task graph of a config and one entry per model (its key columns and task ids)."""

    graph: TaskGraph
    models: list[dict] = field(default_factory=list)
    splits: list[dict] = field(default_factory=list)


def _varying(dicts: list[dict]) -> list[str]:
    keys = sorted({k for d in dicts for k in d})
    return [k for k in keys if len({json.dumps(d.get(k), sort_keys=True) for d in dicts}) > 1]


def _setting(d: dict, keys: list[str]) -> str:
    return ",".join(f"{k}={d[k]}" for k in keys if k in d)  # a setting the protocol does not take is left out


def _factorial_parts(cell: str) -> tuple[str, str]:
    if "-" in cell and cell.split("-")[0] in ("leak", "clean"):
        exposure, diversity = cell.split("-", 1)
        return exposure, diversity
    return "", ""


def build_plan(cfg: SweepConfig) -> Plan:
    """Expand a validated config into its task graph (dependencies first) and model entries."""
    g = TaskGraph()
    plan = Plan(g)
    res = {"cpu": cfg.threads, "gpu": 1 if cfg.device.startswith("cuda") else 0}
    light = {"cpu": cfg.threads, "gpu": 0}
    trains = [m.train for m in cfg.models if m.train is not None]
    recipe_keys = _varying(trains)
    split_keys = [k for k in _varying(list(cfg.split_params)) if k != "protocol"]
    ivs = [[s, n, p] for s, n, p in cfg.interventions]
    seen_models: set[str] = set()
    for cond in cfg.conditions:
        if cond.kind == "manifest":
            data = {"kind": "manifest", **cond.params, "sha256": file_sha256(cond.params["path"])}
        else:
            data = {"kind": "synthetic"}
        for seed in cfg.seeds:
            inputs: dict = {}
            deps: list[str] = []
            if cond.kind == "synthetic":
                sid = g.add("synthesise", {"synth": {**cond.params, "seed": seed}}, resources=light)
                inputs, deps = {"synthesise": sid}, [sid]
            for setting in cfg.split_params:
                protocol = setting["protocol"]
                sp = {k: v for k, v in setting.items() if k != "protocol"}
                params = {"data": data, "protocol": protocol, "params": {**sp, "seed": seed}, "inputs": inputs}
                split_id = g.add("split", params, deps, resources=light)
                plan.splits.append({"split": split_id, "condition": cond.name, "seed": seed, "protocol": protocol,
                                    "params": params["params"]})
                cells = cfg.cells if cfg.cells is not None and protocol in ("factorial", "ladder") else ("",)
                for m in cfg.models:
                    if m.wrap is not None:  # a model trained elsewhere: scored on this split's test side, not trained
                        plan.models.append(_wrapped_tasks(g, m.wrap, cond.name, seed, protocol, sp, split_keys, split_id, cells[0], ivs, res, cfg))
                for m in trains:
                    for cell in cells:
                        tcfg = {**m, "seed": seed, "device": cfg.device}
                        tid = g.add("train", {"train": tcfg, "cell": cell or None, "inputs": {"split": split_id}}, [split_id], resources=res)
                        if tid in seen_models:
                            continue
                        seen_models.add(tid)
                        exposure, diversity = _factorial_parts(cell) if protocol == "factorial" else ("", "")
                        key = {"model": tid, "condition": cond.name, "arch": m["arch"], "seed": seed, "protocol": protocol,
                               "cell": cell, "exposure": exposure, "diversity": diversity,
                               "recipe": _setting(m, recipe_keys), "split_setting": _setting(sp, split_keys), "split_id": split_id}
                        plan.models.append(_model_tasks(cfg, g, key, {"split": split_id, "train": tid}, [split_id, tid], seed, ivs, res))
    for m in cfg.models:
        if m.checkpoint is None:
            continue
        key = _checkpoint_key(m.checkpoint)
        if key["model"] in seen_models:
            continue
        seen_models.add(key["model"])
        inputs = {"checkpoint": m.checkpoint, "weights_sha256": key.pop("weights_sha256")}
        plan.models.append(_model_tasks(cfg, g, key, inputs, [], key["seed"], ivs, res))
    return plan


def wrapped_model_id(wrap: dict, split_id: str) -> str:
    """The `model` of a model trained elsewhere, scored on one split: a hash of its weights,
    architecture, classes and the split (one scoring unit per split, as a trained model is)."""
    from shortcutlab.sweep.graph import task_id

    return task_id("wrapped", {k: wrap[k] for k in ("arch", "classes", "weights_sha256")}, [split_id])


def _wrapped_tasks(g: TaskGraph, wrap: dict, condition: str, seed: int, protocol: str, sp: dict, split_keys: list, split_id: str,
                   side_cell: str, ivs: list, res: dict, cfg) -> dict:
    mid = wrapped_model_id(wrap, split_id)
    key = {"model": mid, "condition": condition, "arch": wrap["arch"], "seed": seed, "protocol": protocol, "cell": "",
           "exposure": "", "diversity": "", "recipe": f"weights={wrap['name']}", "split_setting": _setting(sp, split_keys),
           "split_id": split_id}
    # multi-cell splits share their test side (the common test set); the train side, which some
    # diagnostics read, is that of the first cell the sweep lists
    inputs = {"split": split_id, "wrap": {k: wrap[k] for k in ("arch", "weights", "classes", "weights_sha256")},
              "side_cell": side_cell or None}
    return _model_tasks(cfg, g, key, inputs, [split_id], seed, ivs, res)


def _model_tasks(cfg, g: TaskGraph, key: dict, inputs: dict, deps: list, seed: int, ivs: list, res: dict) -> dict:
    score = g.add("score", {"interventions": ivs, "seed": seed, "batch_size": SCORE_BATCH, "inputs": inputs}, deps, resources=res)
    diag = ""
    if cfg.diagnostics:
        diag = g.add("diagnose", {"only": list(cfg.diagnostics), "params": cfg.diagnostic_params, "seed": seed,
                                  "batch_size": SCORE_BATCH, "inputs": inputs}, deps, resources=res)
    return {**key, "score": score, "diagnose": diag}


def _checkpoint_key(path: str) -> dict:
    from shortcutlab.data.manifest import read_sidecar
    from shortcutlab.models.runs import read_record, weights_path
    from shortcutlab.sweep.graph import task_id

    rec = read_record(path)
    weights = weights_path(path, rec)
    if not os.path.isfile(weights):
        from shortcutlab.models.runs import RunError

        raise RunError(f"run folder {path!r} has no model weights ({os.path.basename(weights)} is missing)")
    sha = file_sha256(weights)
    cell = rec.get("cell") or ""
    split = (rec.get("data") or {}).get("split")
    meta = read_sidecar(split) if split and os.path.exists(split) else None
    protocol = (meta or {}).get("protocol", "")
    exposure, diversity = _factorial_parts(cell) if protocol == "factorial" else ("", "")
    return {"model": task_id("checkpoint", {"weights_sha256": sha}), "condition": os.path.basename(os.path.normpath(path)),
            "arch": rec["config"].get("arch", ""), "seed": int(rec["config"].get("seed", 0)), "protocol": protocol, "cell": cell,
            "exposure": exposure, "diversity": diversity, "recipe": "checkpoint", "split_setting": "", "split_id": "",
            "weights_sha256": sha}


# ------------------------------------------------------------------------------- running
class TaskRunner:
    """``fn(task)`` for the executors: runs one task of the sweep rooted at `root` (picklable)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def __call__(self, task: Task) -> dict:
        return run_task(task, self.root)


def run_task(task: Task, root: str) -> dict:
    """Run one task: build its folder under a temporary name, rename it into place.

    Runs torch on ``task.resources["cpu"]`` threads (restored afterwards), so results do not
    depend on the executor or its worker count. A task whose folder is already complete is
    not run again; its recorded result is returned.
    """
    import torch

    root = os.path.abspath(root)
    final = task_dir(root, task.kind, task.id)
    if is_done(root, task):
        return read_result(root, task.kind, task.id)
    fn = _RUNNERS[task.kind]
    old = torch.get_num_threads()
    torch.set_num_threads(max(1, int(task.resources.get("cpu", 1))))
    t0 = time.perf_counter()
    try:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        with atomic_dir(final) as tmp:
            result = fn(task, root, tmp, final)
            with open(os.path.join(tmp, "result.json"), "w", encoding="utf-8") as f:
                f.write(to_json({"id": task.id, "kind": task.kind, "params": task.params, "deps": list(task.deps),
                                 "result": result, "seconds": round(time.perf_counter() - t0, 3)}))
    finally:
        torch.set_num_threads(old)
    return result


def _split_files(root: str, split_id: str) -> tuple[dict, str]:
    res = read_result(root, "split", split_id)
    return res, os.path.join(task_dir(root, "split", split_id), "split.csv")


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
    write_synth(data, os.path.join(tmp, "benchmark"), workers=threads)
    return {"n_crops": len(data), "n_parents": int(data.table["parent"].nunique()), "manifest": "benchmark/manifest.csv"}


def _run_split(task: Task, root: str, tmp: str, final: str) -> dict:
    from shortcutlab.data.splits import make_split

    p = task.params
    data = p["data"]
    if data["kind"] == "synthetic":
        sid = p["inputs"]["synthesise"]
        manifest = os.path.relpath(os.path.join(task_dir(root, "synthesise", sid), "benchmark", "manifest.csv"), root)
        res = {"manifest": manifest, "geometry": True,
               "columns": {"id": "id", "label": "label", "parent": "parent", "image": "path", "mask": "mask"}}
    else:
        if file_sha256(data["path"]) != data["sha256"]:
            from shortcutlab.errors import ShortcutlabError

            raise ShortcutlabError(f"crop manifest {data['path']!r} changed since the sweep was planned; start the sweep again")
        res = {"manifest": data["path"], "geometry": False, "columns": {k: data[k] for k in ("id", "label", "parent", "image", "mask")}}
    table = _table(root, res, box=True)
    split = make_split(table, p["protocol"], **p["params"])
    sha = split.to_csv(os.path.join(tmp, "split.csv"))
    return {**res, "sha256": sha, "cells": [c for c in split.cells if c], "n_rows": int(len(split.assignments))}


def _run_train(task: Task, root: str, tmp: str, final: str) -> dict:
    from shortcutlab.models.recipe import TrainConfig, train

    p = task.params
    res, split_path = _split_files(root, p["inputs"]["split"])
    rec = train(_table(root, res), split_path, tmp, TrainConfig.from_dict(p["train"]), cell=p["cell"], progress=False)
    # run.json names the folder it was written in: the final one, not the temporary one.
    path = os.path.join(tmp, "run.json")
    with open(path, encoding="utf-8") as f:
        run = json.load(f)
    run["out_dir"] = final
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_json(run))
    return {"accuracy": rec.accuracy, "n_crops": rec.n_crops, "split_sha256": rec.split_sha256, "classes": rec.classes}


def _context(task: Task, root: str):
    """The DiagnosticContext of the model a score or diagnose task reads."""
    import numpy as np

    import probes
    from probes.base import DiagnosticContext

    from shortcutlab.data.audit import side_codes
    from shortcutlab.data.images import load_crops
    from shortcutlab.data.manifest import SplitManifest
    from shortcutlab.models.runs import load_run, load_run_data

    p = task.params
    inputs = p["inputs"]
    if "checkpoint" in inputs:
        run = load_run(inputs["checkpoint"])
        crops, split, side = load_run_data(run)
        model_id = _checkpoint_key(inputs["checkpoint"])["model"]
    elif "wrap" in inputs:
        res, split_path = _split_files(root, inputs["split"])
        table = _table(root, res)
        run = _wrapped_run(inputs["wrap"], list(table.classes))
        crops = load_crops(table)
        split = SplitManifest.read(split_path)
        side = np.asarray(side_codes(table, split.cell(inputs.get("side_cell"))))
        model_id = wrapped_model_id(inputs["wrap"], inputs["split"])
    else:
        run = load_run(task_dir(root, "train", inputs["train"]))
        res, split_path = _split_files(root, inputs["split"])
        table = _table(root, res)
        crops = load_crops(table)
        split = SplitManifest.read(split_path)
        side = np.asarray(side_codes(table, split.cell(run.record.get("cell"))))
        model_id = inputs["train"]
    cfg = run.record.get("config", {})
    preprocess = None
    if cfg.get("mask_background"):
        from shortcutlab.models.recipe import mask_background

        fill = float(cfg.get("background_fill", 0.5))
        preprocess = lambda x, m: mask_background(x, m, fill)  # noqa: E731 (scored as trained)
        preprocess.key = f"mask_background={fill}"
    targets = {}
    names = [n for _, n, _ in p.get("interventions", [])]
    if "reinhard_unseen_field" in names:
        targets = probes.unseen_field_targets_for(crops, split, seed=p["seed"])
    ctx = DiagnosticContext(run.adapter, crops, side, run_id=model_id, split_sha256=split.hash, batch_size=p["batch_size"],
                            seed=p["seed"], targets=targets, preprocess=preprocess)
    return ctx, run, split


def _wrapped_run(wrap: dict, classes: list[str]):
    """A `Run` of a model trained elsewhere, its logits in the data's class order (classes by
    name): the classifier's rows are reordered when the model's logit order differs."""
    import torch

    from shortcutlab.models.adapter import create_model, wrap as wrap_model
    from shortcutlab.errors import ShortcutlabError
    from shortcutlab.models.runs import Run

    if file_sha256(wrap["weights"]) != wrap["weights_sha256"]:
        raise ShortcutlabError(f"weights file {wrap['weights']!r} changed since the sweep was planned; start the sweep again")
    if sorted(wrap["classes"]) != sorted(classes):
        raise ShortcutlabError(f"the model's classes {wrap['classes']} differ from the data's {classes}")
    model = create_model(wrap["arch"], num_classes=len(classes), pretrained=wrap["weights"])
    perm = [wrap["classes"].index(c) for c in classes]
    if perm != list(range(len(classes))):
        head = model.get_classifier()
        with torch.no_grad():
            head.weight.copy_(head.weight[perm])
            if head.bias is not None:
                head.bias.copy_(head.bias[perm])
    record = {"config": {"arch": wrap["arch"]}, "classes": list(classes), "files": {}}
    return Run(path=os.path.dirname(wrap["weights"]), record=record, adapter=wrap_model(model).eval(), run_id=wrap["arch"])


def _run_score(task: Task, root: str, tmp: str, final: str) -> dict:
    from probes.interventions_accuracy import score_interventions

    ctx, run, split = _context(task, root)
    frame = score_interventions(ctx, [tuple(s) for s in task.params["interventions"]])
    frame["label_name"] = [ctx.classes[k] for k in frame["label"]]
    frame.to_parquet(os.path.join(tmp, "predictions.parquet"), index=False)
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
    with open(os.path.join(tmp, "rows.json"), "w", encoding="utf-8") as f:
        f.write(to_json(records))
    return {"split_sha256": split.hash, "n_rows": len(records), "log": log}


_RUNNERS = {"synthesise": _run_synthesise, "split": _run_split, "train": _run_train, "score": _run_score, "diagnose": _run_diagnose}
