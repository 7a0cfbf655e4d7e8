"""Read a run folder written by `shortcutlab train`: the model, its record, its data.

A run folder holds ``model.safetensors`` (the weights), ``logits.csv`` and ``run.json`` (the
`RunRecord`: config, classes, split hash, and, since this release, the crop manifest and split
manifest it was trained on). `load_run` rebuilds the trained model from them without
downloading anything, and `load_run_data` reloads its crops and split, checking the split's
hash against the one the run recorded.

Example:
    >>> from shortcutlab.models.runs import load_run, load_run_data      # doctest: +SKIP
    >>> run = load_run("runs/leak-low")
    >>> crops, split, side = load_run_data(run)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from shortcutlab.errors import ShortcutlabError
from shortcutlab.paths import inside, need_folder, wrong_kind


class RunError(ShortcutlabError):
    """A run folder is missing a file or holds something that does not fit."""


@dataclass(frozen=True, eq=False)
class Run:
    """A trained model rebuilt from its run folder.

    Attributes:
        path: the run folder.
        record: run.json as a dict.
        adapter: the wrapped model, in eval mode, on the requested device.
        run_id: a short name for rows (the folder's last two parts).
    """

    path: str
    record: dict
    adapter: object
    run_id: str


def read_record(run_dir: str | os.PathLike) -> dict:
    """run.json of a run folder, with one-line errors for a missing or corrupt file."""
    run_dir = os.fspath(run_dir)
    need_folder(run_dir, "run folder", RunError)
    path = os.path.join(run_dir, "run.json")
    if not os.path.exists(path):
        raise RunError(f"{run_dir!r} is not a run folder: it has no run.json (train a model with `shortcutlab train` first)")
    if wrong_kind(path, "file"):
        raise RunError(f"run record {path!r} {wrong_kind(path, 'file')}")
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"run record {path!r} is not valid JSON ({e})") from None
    if not isinstance(record, dict):
        raise RunError(f"run record {path!r} holds a {type(record).__name__}; expected a JSON object written by `shortcutlab train`")
    for key in ("config", "classes"):
        if key not in record:
            raise RunError(f"run record {path!r} has no {key!r} entry; it was not written by `shortcutlab train`")
    _check_record(record, path)
    return record


def _check_record(record: dict, path: str) -> None:
    """The entries `load_run` builds the model from have the types `shortcutlab train` writes."""
    def bad(entry: str, value, expected: str) -> RunError:
        return RunError(f"run record {path!r}: {entry} is {value!r}; expected {expected}")

    cfg = record["config"]
    if not isinstance(cfg, dict):
        raise bad("'config'", cfg, "a JSON object (the training config)")
    if not isinstance(cfg.get("arch"), str):
        raise bad("config.arch", cfg.get("arch"), "a timm model name (a string)")
    if "seed" in cfg and (isinstance(cfg["seed"], bool) or not isinstance(cfg["seed"], int)):
        raise bad("config.seed", cfg["seed"], "a whole number")
    classes = record["classes"]
    if not isinstance(classes, list) or not classes or not all(isinstance(c, (str, int)) for c in classes):
        raise bad("'classes'", classes, "a non-empty list of class names")
    files = record.get("files", {})
    if not isinstance(files, dict):
        raise bad("'files'", files, "a JSON object naming the run's files ({\"weights\": \"model.safetensors\", ...})")
    if "weights" in files and not isinstance(files["weights"], str):
        raise bad("files.weights", files["weights"], "a file name inside the run folder")
    data = record.get("data")
    if data is not None and not isinstance(data, dict):
        raise bad("'data'", data, "a JSON object naming the crop manifest and split files")
    for key in ("manifest", "split"):
        if (data or {}).get(key) is not None and not isinstance(data[key], str):
            raise bad(f"data.{key}", data[key], "a file path (a string)")
    if record.get("cell") is not None and not isinstance(record["cell"], str):
        raise bad("'cell'", record["cell"], "a cell name (a string) or null")


def weights_path(run_dir: str | os.PathLike, record: dict) -> str:
    """The weights file a run record names (default ``model.safetensors``), resolved.

    Raises:
        RunError: the record names a file outside the run folder (refused before anything
            there is opened).
    """
    name = record.get("files", {}).get("weights", "model.safetensors")
    return inside(run_dir, name, f"run record {os.path.join(os.fspath(run_dir), 'run.json')!r}: weights file", RunError)


def _run_id(run_dir: str) -> str:
    parts = os.path.normpath(os.path.abspath(run_dir)).split(os.sep)
    return "/".join(parts[-2:])


def load_run(run_dir: str | os.PathLike, device: str | None = None) -> Run:
    """Rebuild the trained model of a run folder (architecture from run.json, local weights).

    Args:
        run_dir: a folder written by `shortcutlab train` (or `shortcutlab.models.recipe.train`).
        device: torch device for the model (default: CPU).

    Raises:
        RunError: no run.json, no model.safetensors, or weights that do not fit the architecture.
    """
    from shortcutlab.models.adapter import create_model, wrap

    run_dir = os.fspath(run_dir)
    record = read_record(run_dir)
    weights = weights_path(run_dir, record)
    if not os.path.exists(weights):
        raise RunError(f"run folder {run_dir!r} has no model weights ({os.path.basename(weights)} is missing)")
    arch = record["config"].get("arch")
    model = create_model(arch, num_classes=len(record["classes"]), pretrained=weights)
    adapter = wrap(model, device=device or "cpu").eval()
    return Run(path=os.path.abspath(run_dir), record=record, adapter=adapter, run_id=_run_id(run_dir))


def load_run_data(run: Run, manifest: str | None = None, split: str | None = None, cell: str | None = None):
    """The crops and split a run was trained on: (CropImages, SplitManifest, side codes).

    Args:
        run: from `load_run`.
        manifest: crop manifest CSV (default: the one run.json records).
        split: split manifest CSV (default: the one run.json records).
        cell: the cell of a multi-cell split (default: the run's).

    Raises:
        RunError: the run does not record its data and none was given, or the split's hash
            differs from the one the run was trained on.
    """
    from shortcutlab.data.audit import side_codes
    from shortcutlab.data.images import load_crops
    from shortcutlab.data.manifest import SplitManifest
    from shortcutlab.models.recipe import load_manifest_table

    data = run.record.get("data") or {}
    manifest = manifest or data.get("manifest")
    split = split or data.get("split")
    if not manifest or not split:
        raise RunError(
            f"run {run.path!r} does not record its crop manifest and split; give them with --manifest and --split"
        )
    table = load_manifest_table(manifest)
    crops = load_crops(table)
    sm = SplitManifest.read(split)
    recorded = run.record.get("split_sha256")
    if recorded and sm.hash != recorded:
        raise RunError(f"split {split!r} has hash {sm.hash[:12]}... but run {run.path!r} was trained on {recorded[:12]}...; give the run's split")
    cell = run.record.get("cell") if cell is None else cell
    side = side_codes(table, sm.cell(cell))
    if list(table.classes) != list(run.record["classes"]):
        raise RunError(f"the manifest's classes {list(table.classes)} differ from the run's {run.record['classes']}")
    return crops, sm, np.asarray(side)
