"""Everything the report knows about a sweep folder's layout, in one class.

A sweep folder (written by `shortcutlab sweep`) holds ``sweep.json`` (the resolved config,
the model entries, versions), ``predictions.parquet`` (or ``.csv``), ``results.parquet`` (or
``.csv``) and ``tasks/<kind>/<id>/`` folders. The rest of the report reads the folder only
through `SweepFolder`, which takes every path from the sweep's own layout
(`shortcutlab.sweep.folder.SweepLayout`), so a change of layout is made there.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pandas as pd

from shortcutlab.errors import ShortcutlabError
from shortcutlab.io import load_json_object
from shortcutlab.paths import TASK_ID, check_id, inside, wrong_kind
from shortcutlab.sweep.folder import SweepLayout, TaskFolder


class ReportError(ShortcutlabError):
    """A sweep folder cannot be reported on: missing, without predictions, or unreadable."""


@dataclass(frozen=True)
class ModelRef:
    """One trained model of the sweep, with the folders the report may open.

    Attributes:
        model: the model id (the `model` column of the tables).
        condition, arch, seed, exposure, cell: its key columns.
        run_dir: its run folder (`shortcutlab.models.runs.load_run`), or None when not on disk.
        manifest: the crop manifest CSV of its benchmark, or None.
        split: the split manifest CSV it was trained on, or None.
        columns: the crop manifest's columns (id, label, parent, image, mask), or None.
        geometry: the crop manifest has boxes (x, y, w, h).
    """

    model: str
    condition: str
    arch: str
    seed: int
    exposure: str
    cell: str
    run_dir: str | None
    manifest: str | None
    split: str | None
    columns: dict | None = None
    geometry: bool = False


def _read_table(folder: str, stem: str, required: bool) -> pd.DataFrame | None:
    """``stem.parquet`` (else ``stem.csv``) of the folder; one-line errors for a corrupt file."""
    for ext in ("parquet", "csv"):
        path = SweepLayout(folder).table(stem, ext)
        if not os.path.isfile(path):
            continue
        try:
            if ext == "parquet":
                return pd.read_parquet(path)
            frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
            if "correct" in frame and not (pd.api.types.is_bool_dtype(frame["correct"])
                                           or pd.api.types.is_numeric_dtype(frame["correct"])):
                # one bad value makes the whole column text: turn the good ones back into
                # booleans, so that the check names the bad row, not every row
                words = {"True": True, "False": False, "true": True, "false": False}
                frame["correct"] = frame["correct"].astype(object).map(lambda v: words.get(v, v) if isinstance(v, str) else v)
            return frame
        except Exception as e:  # noqa: BLE001 - whatever pyarrow or the CSV reader says, name the file
            what = "Parquet" if ext == "parquet" else "CSV"
            raise ReportError(f"{path!r} is not a readable {what} file ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:160]})") from None
    if required:
        raise ReportError(f"sweep folder {folder!r} holds no {stem}.parquet or {stem}.csv: it is not a finished sweep "
                          f"folder (run `shortcutlab sweep CONFIG --out {folder}` first)")
    return None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class SweepFolder:
    """Read-only view of a sweep folder: its config, its two tables, and its models' folders.

    Args:
        path: the sweep folder.

    Attributes:
        path: the sweep folder, absolute.
        layout: its `SweepLayout` (where each of its files lies).
        meta: sweep.json ({} when the folder has none).
        predictions, results: its two tables (results None when it has none).

    Raises:
        ReportError: the folder is missing, holds no predictions table, or a table or
            sweep.json is corrupt.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.layout = SweepLayout(self.path)
        if wrong_kind(self.path, "folder"):
            raise ReportError(f"sweep folder {os.fspath(path)!r} {wrong_kind(self.path, 'folder')}")
        self.meta = self._read_meta()
        self.predictions = _read_table(self.path, "predictions", required=True)
        missing = [c for c in ("model", "condition", "arch", "seed", "exposure", "intervention", "id", "parent", "correct")
                   if c not in self.predictions.columns]
        if missing:
            raise ReportError(f"{self.path}/predictions holds no column {missing[0]!r}; it was not written by "
                              f"`shortcutlab sweep` (columns: {', '.join(map(str, self.predictions.columns))})")
        if len(self.predictions) == 0:
            raise ReportError(f"{self.path}/predictions holds no rows: the sweep scored no crops, so there is nothing to "
                              f"report (run `shortcutlab sweep CONFIG --out {self.path}` again)")
        for col in ("cell", "exposure", "diversity", "protocol"):
            if col in self.predictions.columns:
                self.predictions[col] = self.predictions[col].fillna("").astype(str)
        self._entries = self._model_entries()  # a bad record is named before any task folder is opened
        self.results = _read_table(self.path, "results", required=False)
        if self.results is not None:
            for col in ("setting", "exposure", "diversity", "cell"):
                if col in self.results.columns:
                    self.results[col] = self.results[col].fillna("").astype(str)

    def _read_meta(self) -> dict:
        path = self.layout.config
        if not os.path.isfile(path):
            return {}
        return load_json_object(path, "", ReportError, "the sweep's record (a JSON object)")

    # --- the config -----------------------------------------------------------------------
    @property
    def config(self) -> dict:
        return self.meta.get("config") or {}

    @property
    def versions(self) -> dict:
        return self.meta.get("versions") or {}

    def intervention_settings(self) -> list[tuple[str, str, dict]] | None:
        """(setting, intervention name, params) the sweep scored, or None when not recorded."""
        ivs = self.config.get("interventions")
        if not isinstance(ivs, list):
            return None
        return [(d["setting"], d["name"], dict(d.get("params") or {})) for d in ivs if isinstance(d, dict) and "name" in d]

    # --- the task folders -----------------------------------------------------------------
    def _task(self, kind: str, tid: str) -> str:
        """The folder of a task whose id was checked (`_model_entries`): it stays inside the sweep folder."""
        inside(self.path, self.layout.task_relpath(kind, tid), f"the folder of {kind} task {tid!r}", ReportError)
        return self.layout.task_dir(kind, tid)

    def _model_entries(self) -> list[dict]:
        """sweep.json's model entries, checked before any path is built from them: the ids are
        task ids (hex), the seed a whole number. Without sweep.json, the predictions table's
        models (ids of another form, as in a hand-made table, have no task folder)."""
        entries = self.meta.get("models")
        if not isinstance(entries, list):
            if "models" in self.meta:
                raise ReportError(f"{self.path}/sweep.json: 'models' is {_short(entries)}; expected a list of model entries")
            keys = ["model", "condition", "arch", "seed", "exposure"] + (["cell"] if "cell" in self.predictions else [])
            rows = self.predictions[keys].drop_duplicates("model").to_dict("records")
            return [dict(r, model=str(r["model"]), task=TASK_ID.pattern.fullmatch(str(r["model"])) is not None) for r in rows]
        out = []
        for k, m in enumerate(entries):
            where = f"{self.path}/sweep.json: models[{k}]"
            if not isinstance(m, dict):
                raise ReportError(f"{where} is {_short(m)}; expected a model entry (a JSON object with 'model', 'seed', ...)")
            check_id(m.get("model"), TASK_ID, "model id", where, ReportError)
            if m.get("split_id"):
                check_id(m["split_id"], TASK_ID, "split_id", where, ReportError)
            seed = m.get("seed", 0)
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise ReportError(f"{where}: seed is {_short(seed)}; expected a whole number")
            out.append(dict(m, task=True))
        return out

    def _split_files(self, split_id: str) -> dict:
        """The crop manifest, split manifest, manifest columns and geometry flag of a split
        task (None / {} where not on disk)."""
        task = TaskFolder(self._task("split", split_id))
        split = task.split
        try:
            with open(task.result, encoding="utf-8") as f:
                res = json.load(f)["result"]
            manifest = res["manifest"]
        except (OSError, KeyError, TypeError, json.JSONDecodeError):
            res, manifest = {}, None
        if isinstance(manifest, str) and not os.path.isabs(manifest):
            # a benchmark the sweep made lies inside it (a user's own manifest is recorded absolute)
            inside(self.path, manifest, f"{task.result}: crop manifest", ReportError)
            manifest = os.path.join(self.path, manifest)
        elif not isinstance(manifest, str):
            manifest = None
        return dict(manifest=manifest if manifest and os.path.isfile(manifest) else None,
                    split=split if os.path.isfile(split) else None,
                    columns=res.get("columns") if isinstance(res.get("columns"), dict) else None,
                    geometry=bool(res.get("geometry")))

    def models(self) -> list[ModelRef]:
        """Every model sweep.json lists (or, without it, every model of the predictions table)."""
        out = []
        for m in self._entries:
            tid = m["model"]
            run = self._task("train", tid) if m["task"] else None
            files = self._split_files(m["split_id"]) if m.get("split_id") else dict(manifest=None, split=None)
            out.append(ModelRef(model=tid, condition=str(m.get("condition", "")), arch=str(m.get("arch", "")),
                                seed=int(m.get("seed", 0)), exposure=str(m.get("exposure") or ""), cell=str(m.get("cell") or ""),
                                run_dir=run if run and os.path.isfile(TaskFolder(run).run_record) else None,
                                **files))
        return out

    def example_pair(self, condition: str | None = None) -> tuple[ModelRef | None, ModelRef | None]:
        """A leak model with a run folder on disk and the clean model of the same condition,
        seed and architecture (or None), preferring a condition with planted mechanisms."""
        models = [m for m in self.models() if m.run_dir]
        leaks = [m for m in models if m.exposure == "leak" and (condition is None or m.condition == condition)]
        if not leaks:
            return None, None
        leaks.sort(key=lambda m: (m.condition == "none", m.condition, m.seed, m.arch, m.cell))
        leak = leaks[0]
        clean = [m for m in models if m.exposure == "clean" and (m.condition, m.seed, m.arch) == (leak.condition, leak.seed, leak.arch)]
        clean.sort(key=lambda m: (m.cell.split("-")[-1] != leak.cell.split("-")[-1], m.cell))
        return leak, (clean[0] if clean else None)

    def benchmarks(self) -> dict[str, ModelRef]:
        """Per condition, one model (lowest seed) whose benchmark and split are on disk."""
        out: dict[str, ModelRef] = {}
        for m in sorted(self.models(), key=lambda m: (m.condition, m.seed, m.exposure != "leak", m.model)):
            if m.manifest and m.split and m.condition not in out:
                out[m.condition] = m
        return out
