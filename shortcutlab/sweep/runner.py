"""Run a sweep: plan the tasks, skip the finished ones, run the rest, gather tidy tables.

`run_sweep(config, out_dir)` writes, in ``out_dir``:

- ``sweep.json``: the resolved config, the task counts, the model entries and the package
  versions (written first, before any task runs);
- ``tasks/<kind>/<id>/``: one folder per task (see `tasks`; the layout is `folder.SweepLayout`);
- ``predictions.parquet`` / ``.csv``: one row per model x intervention x test crop;
- ``results.parquet`` / ``.csv``: one row per model x diagnostic x setting x metric;
- ``splits.json``: every split's hash and parameters.

The four tables and splits.json are written together, atomically, by `gather`, a pure
function of the task folders: a sweep killed at any point and started again redoes only the
missing tasks, and its tables never lose or duplicate a row.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import time
from dataclasses import replace
from typing import Any

import pandas as pd

from shortcutlab.errors import ShortcutlabError
from shortcutlab.io import atomic_files, check_writable, write_json
from shortcutlab.paths import wrong_kind
from shortcutlab.sweep.config import SweepConfig, load_config
from shortcutlab.sweep.executors import Executor, LocalExecutor
from shortcutlab.sweep.folder import PROGRESS_SUFFIX, SweepLayout, claim_sweep_dir, is_done
from shortcutlab.sweep.plan import Plan, build_plan
from shortcutlab.sweep.progress import BAR_FORMAT, SweepProgress
from shortcutlab.sweep.tasks import KINDS, TaskRunner
from shortcutlab.sweep.threads import check_threads, plan_threads

#: the key columns of every model, in the tables' order
KEY_COLUMNS = ("model", "condition", "arch", "seed", "protocol", "cell", "exposure", "diversity")
PREDICTION_COLUMNS = KEY_COLUMNS + ("intervention", "id", "parent", "label", "pred", "correct", "split_sha256")
EXTRA_KEY_COLUMNS = ("recipe", "split_setting", "split_id")


class SweepError(ShortcutlabError):
    """A sweep folder is missing, locked by another sweep, or holds something unreadable."""


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("shortcutlab", "torch", "timm", "numpy", "pandas", "pyarrow", "scikit-learn", "concept-erasure", "ray"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    if "shortcutlab" not in out:
        from shortcutlab.version import __version__

        out["shortcutlab"] = __version__
    return out


@contextlib.contextmanager
def _lock(out_dir: str):
    """One sweep process per folder: an exclusive lock on DIR/.sweep.lock (released by the
    kernel if the process dies, so a killed sweep never leaves a stale lock)."""
    import fcntl

    path = SweepLayout(out_dir).lock
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SweepError(f"another sweep is running in {out_dir!r} (it holds {path}); wait for it or choose another --out") from None
        yield
    finally:
        os.close(fd)


def _clean_temporaries(out_dir: str) -> int:
    """Remove the temporary folders and progress files a killed sweep left beside its task folders."""
    n = 0
    for kind in KINDS:
        folder = SweepLayout(out_dir).kind_dir(kind)
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if name.startswith(".") and (name.endswith(".tmp") or name.endswith(".old") or name.endswith(PROGRESS_SUFFIX)):
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:  # a progress file, or the temporary of one
                    with contextlib.suppress(OSError):
                        os.remove(path)
                n += 1
    return n


def describe(plan: Plan, out_dir: str | None = None) -> list[dict]:
    """One dict per task (kind, id, done, key parameters), in run order."""
    rows = []
    for t in plan.graph.ordered():
        p = t.params
        if t.kind == "synthesise":
            s = p["synth"]
            key = f"mechanisms={'+'.join(s['mechanisms'])} seed={s['seed']} fields_per_class={s['fields_per_class']} crop={s['crop_size']}"
        elif t.kind == "split":
            key = f"{p['protocol']} " + " ".join(f"{k}={v}" for k, v in sorted(p["params"].items()))
        elif t.kind == "train":
            tr = p["train"]
            key = f"{tr['arch']} cell={p['cell'] or '-'} seed={tr['seed']} epochs={tr['epochs']} lr={tr['lr']} device={tr['device']}"
        elif t.kind == "score":
            key = f"interventions={len(p['interventions'])} seed={p['seed']}"
        else:
            key = f"{','.join(p['only'])} seed={p['seed']}"
        rows.append({"kind": t.kind, "id": t.id, "done": bool(out_dir) and is_done(out_dir, t), "params": key})
    return rows


def trained_on_other_devices(out_dir: str, device: str) -> dict[str, int]:
    """Finished train tasks in a sweep folder whose device differs from `device`, counted per
    device. The device is part of a train task's id (results can differ across devices), so
    a sweep run again with another device trains these models anew."""
    import json

    layout = SweepLayout(out_dir)
    folder = layout.kind_dir("train")
    out: dict[str, int] = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = layout.task("train", name).result
        if name.startswith(".") or not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)["params"]["train"]["device"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if d != device:
            out[d] = out.get(d, 0) + 1
    return out


def run_sweep(config: SweepConfig | str, out_dir: str, executor: Executor | None = None, *, progress: bool = True,
              dry_run: bool = False, registration: dict | None = None, threads: int | None = None) -> dict[str, Any]:
    """Run (or, with `dry_run`, list) the tasks of a sweep and gather its tables.

    Args:
        config: a validated `SweepConfig` or the path of a YAML config.
        out_dir: the sweep folder (created; an earlier run of any sweep there is reused).
        executor: runs the tasks (default `LocalExecutor(workers=1)`).
        progress: one tqdm bar over the tasks, with an ETA.
        dry_run: plan only: return the task list and counts, write nothing.
        registration: what `registration.check_registration` returned (path, sha256) for a
            sweep checked against its registration: the file is copied into the folder and
            its hash recorded in sweep.json; None removes an earlier copy.
        threads: torch threads of the whole sweep (None: the config's ``threads``, else the
            cores available); each of the executor's ``workers`` gets ``threads // workers``
            (`sweep.threads`, recorded in sweep.json).

    Returns:
        A summary: counts per kind (all and done before this run), the tasks (dry run) or the
        paths of the tables, and the seconds taken.

    Raises:
        SweepConfigError: a bad config (before anything is written).
        OutputError: `out_dir` holds a file that no sweep wrote (before anything is written).
        TaskFailed: a task failed (the finished ones are kept; start again to resume).
    """
    from tqdm.auto import tqdm

    cfg = load_config(config) if isinstance(config, (str, os.PathLike)) else config
    t0 = time.perf_counter()
    plan = build_plan(cfg)
    out_dir = os.path.abspath(os.fspath(out_dir))
    tasks = plan.graph.ordered()
    done = {t.id for t in tasks if is_done(out_dir, t)} if os.path.isdir(out_dir) else set()
    counts = plan.graph.counts()
    done_counts = {k: sum(1 for t in tasks if t.kind == k and t.id in done) for k in counts}
    summary: dict[str, Any] = {"counts": counts, "done_before": done_counts, "n_tasks": len(tasks), "n_models": len(plan.models)}
    if dry_run:
        summary["tasks"] = describe(plan, out_dir if os.path.isdir(out_dir) else None)
        summary["other_devices"] = trained_on_other_devices(out_dir, cfg.device)
        return summary
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise SweepError(f"sweep folder {out_dir!r} is a file; choose a folder")
    check_writable(SweepLayout(out_dir).config)
    claim_sweep_dir(out_dir)
    executor = executor or LocalExecutor(workers=1)
    threads_used = plan_threads(check_threads(threads) if threads is not None else cfg.threads, getattr(executor, "workers", None))
    summary["threads"] = threads_used.to_dict()
    with _lock(out_dir):
        _clean_temporaries(out_dir)
        reg = _record_registration(out_dir, registration)
        write_json(SweepLayout(out_dir).config, {
            "config": cfg.to_dict(), "config_file": cfg.raw, "counts": counts, "models": plan.models, "splits": plan.splits,
            "tasks": [{"id": t.id, "kind": t.kind, "deps": list(t.deps)} for t in tasks],
            "versions": versions(), "executor": getattr(executor, "name", type(executor).__name__),
            "threads": threads_used.to_dict(), **reg,
        })
        todo = [replace(t, resources={**t.resources, "cpu": threads_used.per_task})
                for t in plan.graph.subgraph([t.id for t in tasks if t.id not in done])]
        bar = tqdm(total=len(tasks), initial=len(done), desc="sweep", unit="task", disable=not progress, smoothing=0.1,
                   bar_format=BAR_FORMAT)
        watch = SweepProgress(bar, out_dir, todo if progress else [])
        try:
            if todo:
                watch.start()
                executor.run(todo, TaskRunner(out_dir), lambda task, result: watch.done(task))
        finally:
            watch.stop()
            bar.close()
        paths = gather(out_dir, plan)
    summary["files"] = paths
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    return summary


def _record_registration(out_dir: str, registration: dict | None) -> dict:
    """Keep a copy of the registration file the sweep was checked against in the folder
    (`SweepLayout.registration`), or remove an earlier copy when the sweep runs without one
    (its new tasks were not checked); the entry sweep.json records (path and sha256)."""
    from shortcutlab.io import write_bytes

    path = SweepLayout(out_dir).registration
    if registration is None:
        if os.path.isfile(path):
            os.remove(path)
        return {}
    with open(registration["path"], "rb") as f:
        write_bytes(path, f.read())
    return {"registration": {"path": registration["path"], "sha256": registration["sha256"]}}


def _frame_types(frame: pd.DataFrame) -> pd.DataFrame:
    """Object columns holding several types (a diagnostic's extra column) become strings, so
    that Parquet can store them; missing values stay missing."""
    for c in frame.columns:
        if frame[c].dtype == object:
            kinds = {type(v) for v in frame[c] if v is not None and not (isinstance(v, float) and v != v)}
            if len(kinds) > 1 or (kinds and not kinds <= {str}):
                frame[c] = frame[c].map(lambda v: v if v is None or (isinstance(v, float) and v != v) else str(v))
    return frame


def gather(out_dir: str, plan: Plan) -> dict[str, str]:
    """Collect every model's score and diagnose outputs into the tidy tables (atomically).

    A pure function of the task folders and the plan: the same folders give the same tables.
    """
    import json

    import numpy as np

    from probes.base import ROW_COLUMNS

    from shortcutlab.stats import wilson_interval

    layout = SweepLayout(out_dir)
    preds, results, splits = [], [], {}
    keys, shas, n_pred, n_res = [], [], [], []
    for m in plan.models:
        keys.append({k: m[k] for k in KEY_COLUMNS + EXTRA_KEY_COLUMNS})
        sres = layout.read_result("score", m["score"])
        sha = sres["split_sha256"]
        shas.append(sha)
        if m["split_id"]:
            splits[m["split_id"]] = sha
        p = pd.read_parquet(layout.task("score", m["score"]).predictions)
        preds.append(p.drop(columns=["row", "label_name"], errors="ignore"))
        n_pred.append(len(p))
        rows = []
        base = None
        for setting, (k, n) in sres["correct_n"].items():
            acc = k / n if n else np.nan
            lo, hi = wilson_interval(k, n) if n else (np.nan, np.nan)
            rows.append({"diagnostic": "interventions", "setting": f"intervention={setting}", "metric": "accuracy",
                         "value": acc, "ci_low": lo, "ci_high": hi, "n": n})
            if setting == "none":
                base = acc
            else:
                rows.append({"diagnostic": "interventions", "setting": f"intervention={setting}",
                             "metric": "accuracy_change", "value": acc - base, "ci_low": np.nan, "ci_high": np.nan, "n": n})
        if m["diagnose"]:
            with open(layout.task("diagnose", m["diagnose"]).rows, encoding="utf-8") as f:
                rows += json.load(f)
        results.extend(rows)
        n_res.append(len(rows))

    def with_keys(frame: pd.DataFrame, counts: list[int]) -> pd.DataFrame:
        # key columns for all models at once (one column per key, not one per model and key)
        cols = {k: np.repeat(np.array([kd[k] for kd in keys], dtype=object), counts) for k in KEY_COLUMNS + EXTRA_KEY_COLUMNS}
        cols["split_sha256"] = np.repeat(np.array(shas, dtype=object), counts)
        extra = pd.DataFrame(cols, index=frame.index)
        return pd.concat([frame.drop(columns=[c for c in cols if c in frame.columns]), extra], axis=1)

    if preds:
        preds = [with_keys(pd.concat(preds, ignore_index=True), n_pred)]
    if results:
        r = pd.DataFrame(results)
        r["run_id"] = np.repeat(np.array([kd["model"] for kd in keys], dtype=object), n_res)
        results = [with_keys(r, n_res)]
    pcols = list(PREDICTION_COLUMNS) + list(EXTRA_KEY_COLUMNS)
    pred = pd.concat(preds, ignore_index=True)[pcols] if preds else pd.DataFrame(columns=pcols)
    res = pd.concat(results, ignore_index=True) if results else pd.DataFrame(columns=list(ROW_COLUMNS))
    lead = list(ROW_COLUMNS) + list(KEY_COLUMNS) + list(EXTRA_KEY_COLUMNS) + ["split_sha256"]
    res = res[lead + [c for c in res.columns if c not in lead]]
    # the key columns have one type in both tables (seed an integer), so they can be joined
    res["seed"] = pd.to_numeric(res["seed"]).astype("int64")
    res = _frame_types(res)
    for c in ("value", "ci_low", "ci_high"):
        res[c] = pd.to_numeric(res[c], errors="coerce").astype(float)
    res["n"] = pd.to_numeric(res["n"], errors="coerce").fillna(-1).astype("int64")
    pred = pred.astype({"seed": "int64", "label": "int64", "pred": "int64", "correct": bool})
    split_rows = [{**s, "sha256": splits.get(s["split"]) or layout.read_result("split", s["split"])["sha256"]} for s in plan.splits]
    paths = layout.outputs()
    with atomic_files() as stage:
        pred.to_parquet(stage.path(paths["predictions.parquet"]), index=False)
        pred.to_csv(stage.path(paths["predictions.csv"]), index=False)
        res.to_parquet(stage.path(paths["results.parquet"]), index=False)
        res.to_csv(stage.path(paths["results.csv"]), index=False)
        write_json(stage.path(paths["splits.json"]), split_rows)
    return paths


def _read_parquet(out_dir: str, name: str, required: bool = True) -> pd.DataFrame | None:
    out_dir = os.fspath(out_dir)
    path = SweepLayout(out_dir).table(name)
    if not os.path.isdir(out_dir):
        raise SweepError(f"sweep folder {out_dir!r} {wrong_kind(out_dir, 'folder')}")
    if not os.path.isfile(path):
        if not required:
            return None
        raise SweepError(f"{out_dir!r} holds no {name}.parquet: it is not a finished sweep folder (run `shortcutlab sweep CONFIG --out {out_dir}`)")
    try:
        return pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - a corrupt file is named, whatever pyarrow says
        raise SweepError(f"{path!r} is not a readable Parquet file ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


def read_predictions(out_dir: str) -> pd.DataFrame:
    """predictions.parquet of a finished sweep folder, checked for the key columns."""
    pred = _read_parquet(out_dir, "predictions")
    missing = [c for c in ("model", "condition", "arch", "cell", "intervention", "correct") if c not in pred.columns]
    if missing:
        path = SweepLayout(out_dir).table("predictions")
        raise SweepError(f"{path!r} lacks the columns {', '.join(missing)}; it was not written by `shortcutlab sweep`")
    from shortcutlab.stats import StatsError, correct_as_float

    path = SweepLayout(out_dir).table("predictions")
    if len(pred) == 0:
        raise SweepError(f"{path!r} holds no rows: the sweep scored no crops, so there is nothing to summarise")
    try:
        pred["correct"] = correct_as_float(pred["correct"])
    except StatsError as e:
        raise SweepError(f"{path!r}: {e}") from None
    return pred


def estimates_table(out_dir: str, n_boot: int = 10_000, seed: int = 0, *, analysis: dict | None = None,
                    interval: str = "cgm") -> pd.DataFrame:
    """The estimates of a sweep folder (`shortcutlab.stats.estimates` on its predictions and
    results tables): leak effects, leak cuts and clean costs per intervention, the protocol
    effect and the dose-response slope, each with its two-way cluster-bootstrap interval,
    p-value and Holm-adjusted p within its family; `interval` the interval method ("cgm" or
    "pigeonhole", `shortcutlab.stats.estimates`).

    Args:
        analysis: analysis settings (`registration.sweep_analysis`: the config's `analysis:`
            with the command line's overrides); when given, `n_boot` and `seed` are taken from
            it, its interval method, hypotheses and families are passed to `estimates`
            (`registration.estimates_options`) and only its estimands' rows are kept.
        interval: the interval method without `analysis` ("cgm" or "pigeonhole").

    Raises:
        SweepError: the folder is missing or holds no readable predictions.parquet.
    """
    from shortcutlab.stats import estimates

    pred = read_predictions(out_dir)
    results = _read_parquet(out_dir, "results", required=False)
    if analysis is None:
        return estimates(pred, results, n_boot=n_boot, seed=seed, interval=interval)
    from shortcutlab.sweep.registration import estimates_options, keep_estimands

    return keep_estimands(estimates(pred, results, **estimates_options(analysis)), analysis)


def results_table(out_dir: str) -> pd.DataFrame:
    """Mean test accuracy and number of models per condition x arch x cell x intervention of a
    sweep folder (from predictions.parquet).

    Raises:
        SweepError: the folder is missing or holds no readable predictions.parquet.
    """
    pred = read_predictions(out_dir)
    per_model = pred.groupby(["condition", "arch", "cell", "intervention", "model"], sort=False)["correct"].mean().rename("accuracy").reset_index()
    table = per_model.groupby(["condition", "arch", "cell", "intervention"], sort=False).agg(
        accuracy=("accuracy", "mean"), n_models=("model", "nunique")).reset_index()
    return table
