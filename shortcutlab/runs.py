"""Read a run folder written by `shortcutlab train`: the model, its record, its data.

A run folder holds ``model.safetensors`` (the weights), ``logits.csv`` and ``run.json`` (the
`RunRecord`: config, classes, split hash, and, since this release, the crop manifest and split
manifest it was trained on). `load_run` rebuilds the trained model from them without
downloading anything, and `load_run_data` reloads its crops and split, checking the split's
hash against the one the run recorded.

Example:
    >>> from shortcutlab.runs import load_run, load_run_data      # doctest: +SKIP
    >>> run = load_run("runs/leak-low")
    >>> crops, split, side = load_run_data(run)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from .errors import ShortcutlabError


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
    if not os.path.isdir(run_dir):
        raise RunError(f"run folder {run_dir!r} does not exist or is not a folder")
    path = os.path.join(run_dir, "run.json")
    if not os.path.exists(path):
        raise RunError(f"{run_dir!r} is not a run folder: it has no run.json (train a model with `shortcutlab train` first)")
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"run record {path!r} is not valid JSON ({e})") from None
    for key in ("config", "classes"):
        if key not in record:
            raise RunError(f"run record {path!r} has no {key!r} entry; it was not written by `shortcutlab train`")
    return record


def _run_id(run_dir: str) -> str:
    parts = os.path.normpath(os.path.abspath(run_dir)).split(os.sep)
    return "/".join(parts[-2:])


def load_run(run_dir: str | os.PathLike, device: str | None = None) -> Run:
    """Rebuild the trained model of a run folder (architecture from run.json, local weights).

    Args:
        run_dir: a folder written by `shortcutlab train` (or `shortcutlab.recipe.train`).
        device: torch device for the model (default: CPU).

    Raises:
        RunError: no run.json, no model.safetensors, or weights that do not fit the architecture.
    """
    from .adapter import create_model, wrap

    run_dir = os.fspath(run_dir)
    record = read_record(run_dir)
    weights = os.path.join(run_dir, record.get("files", {}).get("weights", "model.safetensors"))
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
    from .audit import side_codes
    from .data import load_crops
    from .manifest import SplitManifest
    from .recipe import load_manifest_table

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
