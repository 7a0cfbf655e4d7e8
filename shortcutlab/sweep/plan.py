"""The plan of a sweep: the task graph a config expands to, and one entry per model.

`build_plan(cfg)` turns a validated `SweepConfig` into a `Plan`: the `TaskGraph` of its
synthesise, split, train, score and diagnose tasks (dependencies first; see `tasks` for what
each kind does), one entry per model (its key columns, as in the sweep's tables, and the ids
of its score and diagnose tasks) and one entry per split. A task's parameters carry
everything it needs, including the ids of its inputs (``params["inputs"]``), so that two grid
points needing the same benchmark, split or model name the same task.

Example:
    >>> from shortcutlab.sweep.config import load_config          # doctest: +SKIP
    >>> plan = build_plan(load_config("examples/sweep_minimal.yaml"))
    >>> plan.graph.counts(), len(plan.models)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from shortcutlab.io import file_sha256
from shortcutlab.sweep.config import SweepConfig
from shortcutlab.sweep.graph import TaskGraph, task_id

#: crops per batch when a score or diagnose task runs a model
SCORE_BATCH = 256


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
    # the runner sets each task's threads for its executor (`sweep.threads`); this is what a
    # task reserves where nothing else says (the config's threads, else 1)
    res = {"cpu": cfg.threads or 1, "gpu": 1 if cfg.device.startswith("cuda") else 0}
    light = {"cpu": cfg.threads or 1, "gpu": 0}
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
        key = checkpoint_key(m.checkpoint)
        if key["model"] in seen_models:
            continue
        seen_models.add(key["model"])
        inputs = {"checkpoint": m.checkpoint, "weights_sha256": key.pop("weights_sha256")}
        plan.models.append(_model_tasks(cfg, g, key, inputs, [], key["seed"], ivs, res))
    return plan


def wrapped_model_id(wrap: dict, split_id: str) -> str:
    """The `model` of a model trained elsewhere, scored on one split: a hash of its weights,
    architecture, classes and the split (one scoring unit per split, as a trained model is)."""
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
    # The model is scored on the sweep's device. Off the CPU the device joins the parameters
    # (and so the id): CPU sweeps keep their task ids, and a GPU sweep's models, scored on
    # the CPU before the device reached these tasks, are scored again on the GPU.
    on = {} if cfg.device == "cpu" else {"device": cfg.device}
    score = g.add("score", {"interventions": ivs, "seed": seed, "batch_size": SCORE_BATCH, "inputs": inputs, **on}, deps,
                  resources=res)
    diag = ""
    if cfg.diagnostics:
        diag = g.add("diagnose", {"only": list(cfg.diagnostics), "params": cfg.diagnostic_params, "seed": seed,
                                  "batch_size": SCORE_BATCH, "inputs": inputs, **on}, deps, resources=res)
    return {**key, "score": score, "diagnose": diag}


def checkpoint_key(path: str) -> dict:
    """The model entry of a run folder trained elsewhere (a config's ``checkpoint:``): its key
    columns from run.json and its split's sidecar, its `model` id (a hash of the weights) and
    ``weights_sha256``.

    Raises:
        RunError: the run folder has no readable run.json or no weights file.
    """
    from shortcutlab.data.manifest import read_sidecar
    from shortcutlab.models.runs import read_record, weights_path

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

