"""How a trained run is loaded and scores its crops: the model, its record, its data, its preprocess.

A run folder holds ``model.safetensors`` (the weights), ``logits.csv`` and ``run.json`` (the
`RunRecord`: config, classes, split hash, and, since this release, the crop manifest and split
manifest it was trained on). `load_run` rebuilds the trained model from them without
downloading anything, on the device asked for, and `load_run_data` reloads its crops and split,
checking the split's hash against the one the run recorded. `Run.from_weights` makes the same
`Run` of a model trained elsewhere (a timm architecture and a local weight file).

A run scores its crops as it was trained on them: `Run.preprocess` (`preprocess_for` of its
record) is the ``fn(x, mask) -> x`` every batch goes through first, e.g. `mask_background` for a
run trained with masked backgrounds, then `Resize` for a run trained with ``input_size`` (the
crops resized to the model's input); training (`recipe.train`) calls the same `mask_background`
and `resize_crops`.

Example:
    >>> from shortcutlab.models.runs import load_run, load_run_data      # doctest: +SKIP
    >>> run = load_run("runs/leak-low", device="cuda")                  # doctest: +SKIP
    >>> crops, split, side = load_run_data(run)                          # doctest: +SKIP
    >>> run.preprocess      # None, or MaskBackground(fill=0.5) when trained with it  # doctest: +SKIP
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from shortcutlab.errors import ShortcutlabError
from shortcutlab.io import load_json_object
from shortcutlab.paths import inside, need_folder, wrong_kind

if TYPE_CHECKING:
    import torch


class RunError(ShortcutlabError):
    """A run folder is missing a file or holds something that does not fit."""


def mask_background(x: torch.Tensor, mask: torch.Tensor | None, fill: float) -> torch.Tensor:
    """Replace the background outside the cell mask by a grey level (the paper's F3).

    The one implementation of ``TrainConfig(mask_background=True)``: training batches
    (`recipe.train`) and every batch a run trained with it scores (`MaskBackground`, the
    run's `Run.preprocess`) go through it. It is the ``background_removal`` intervention with a
    constant fill; the tensors stay on their device.

    Args:
        x: (B, 3, H, W) float crops in [0, 1].
        mask: (B, 1, H, W) cell masks (1 on the cell), on the device of `x`.
        fill: the grey level (0-1) painted outside the mask.

    Returns:
        ``x * mask + fill * (1 - mask)``, the shape, dtype and device of `x`.

    Raises:
        ShortcutlabError: no masks (`mask` is None).
    """
    # F3 is the background_removal intervention with a constant fill, in training and scoring.
    from interventions import background_removal

    from interventions.base import InterventionWarning

    if mask is None:
        raise ShortcutlabError("mask_background needs cell masks: give the manifest a mask column (--mask COL)")
    # Empty masks are counted and warned about once per run (run.json's empty_masks), not once
    # per batch.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterventionWarning)
        return background_removal(x, mask, fill="constant", value=fill)


@dataclass(frozen=True)
class MaskBackground:
    """The preprocess of a run trained with ``mask_background``: ``fn(x, mask) -> x``.

    Scoring and diagnostics (`probes.DiagnosticContext`'s ``preprocess``) call it on every
    batch before anything else, so the run sees its crops as it was trained on them.

    Attributes:
        fill: the grey level (0-1) outside the cell mask (the run's ``background_fill``).
    """

    fill: float

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return mask_background(x, mask, self.fill)

    @property
    def key(self) -> str:
        """Names the preprocess in feature caches (``mask_background=<fill>``)."""
        return f"mask_background={self.fill}"


def resize_crops(x: torch.Tensor, size: int) -> torch.Tensor:
    """Crops resized to ``size`` x ``size``, bilinear and antialiased (``--input-size``).

    The one implementation of ``TrainConfig(input_size=N)``: training batches (after their
    augmentation), scoring and every diagnostic batch go through it. Bilinear weights are
    convex, so values stay in [0, 1]. Crops of that size already come back unchanged.

    Args:
        x: (B, C, H, W) float crops.
        size: N, the side in pixels of the model's input.

    Returns:
        (B, C, N, N), the dtype and device of `x`.
    """
    import torch.nn.functional as F

    if tuple(x.shape[-2:]) == (size, size):
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)


@dataclass(frozen=True)
class Resize:
    """The preprocess of a run trained with ``input_size``: ``fn(x, mask) -> x`` of size N x N.

    Masks are not resized here: a caller that needs them beside the resized crops resizes
    them with nearest-neighbour (`probes.DiagnosticContext.batch` does).

    Attributes:
        size: N, the model's input side in pixels (the run's ``input_size``).
    """

    size: int

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return resize_crops(x, self.size)

    @property
    def key(self) -> str:
        """Names the preprocess in feature caches (``input_size=<N>``)."""
        return f"input_size={self.size}"


@dataclass(frozen=True)
class Chain:
    """Preprocess steps applied in order (the background masked at the crop's size, then the
    resize to the model's input), each ``fn(x, mask) -> x`` with the crop's mask."""

    steps: tuple

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for step in self.steps:
            x = step(x, mask)
        return x

    @property
    def key(self) -> str:
        """Names the preprocess in feature caches (its steps' keys joined by '+')."""
        return "+".join(step.key for step in self.steps)


def preprocess_for(record: dict) -> MaskBackground | Resize | Chain | None:
    """What every batch of a run goes through before the model, read from its record.

    Args:
        record: a run record (run.json as a dict; `Run.record`).

    Returns:
        `MaskBackground` of the run's ``background_fill`` (default 0.5) when its config has
        ``mask_background`` set, `Resize` when it has an ``input_size``, both in a `Chain`
        (masking first) when it has both, else None (the crops are scored as they are).

    Example:
        >>> preprocess_for({"config": {"mask_background": True, "background_fill": 0.25}}).key
        'mask_background=0.25'
        >>> preprocess_for({"config": {"mask_background": True, "input_size": 224}}).key
        'mask_background=0.5+input_size=224'
    """
    cfg = record.get("config", {})
    steps: list = []
    if cfg.get("mask_background"):
        steps.append(MaskBackground(float(cfg.get("background_fill", 0.5))))
    if cfg.get("input_size"):
        steps.append(Resize(int(cfg["input_size"])))
    if not steps:
        return None
    return steps[0] if len(steps) == 1 else Chain(tuple(steps))


@dataclass(frozen=True, eq=False)
class Run:
    """A trained model rebuilt from its run folder (`load_run`) or its weights (`from_weights`).

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

    @property
    def preprocess(self) -> MaskBackground | Resize | Chain | None:
        """``fn(x, mask) -> x`` applied to every batch before the model, as the run was
        trained (`preprocess_for` of its record), or None. It carries a ``key`` naming it."""
        return preprocess_for(self.record)

    @property
    def device(self) -> torch.device:
        """Where the model is (and where its input batches must be)."""
        return self.adapter.device

    @classmethod
    def from_weights(cls, arch: str, weights: str, classes: Sequence[str], *, order: Sequence[str] | None = None,
                     path: str | None = None, run_id: str | None = None, device: str | torch.device | None = None) -> Run:
        """The run of a model trained elsewhere: a timm architecture and a local weight file.

        Its record holds the architecture and classes only (``{"config": {"arch": ...},
        "classes": [...], "files": {}}``): no preprocess, no recorded data.

        Args:
            arch: timm model name.
            weights: local weight file (safetensors or a torch state dict; never downloaded).
            classes: class names in the model's logit order.
            order: the class order its logits should follow (e.g. the data's, by name): the
                classifier's rows are reordered to it. Default: `classes` (as they are).
            path: the folder the run stands for (default: the weight file's folder).
            run_id: its name in rows (default: `arch`).
            device: torch device for the model (default: CPU); checked by `resolve_device`.

        Raises:
            RunError: `order` names other classes than `classes`.
            ShortcutlabError: a device that is not here; weights that do not fit `arch`.

        Example:
            >>> run = Run.from_weights("resnet18", "ext.pt", ["a", "b"], device="cuda")   # doctest: +SKIP
        """
        import torch

        from shortcutlab.models.adapter import create_model

        classes = list(classes)
        order = classes if order is None else list(order)
        if sorted(classes) != sorted(order):
            raise RunError(f"the model's classes {classes} differ from the data's {order}")
        model = create_model(arch, num_classes=len(classes), pretrained=weights, new_head=False)
        perm = [classes.index(c) for c in order]
        if perm != list(range(len(classes))):
            head = model.get_classifier()
            with torch.no_grad():
                head.weight.copy_(head.weight[perm])
                if head.bias is not None:
                    head.bias.copy_(head.bias[perm])
        record = {"config": {"arch": arch}, "classes": order, "files": {}}
        return cls(path=path or os.path.dirname(os.path.abspath(weights)), record=record, adapter=_placed(model, device),
                   run_id=run_id or arch)


def _placed(model, device: str | torch.device | None):
    """`model` wrapped, in eval mode, on `device` (default CPU), checked by `resolve_device`."""
    from shortcutlab.models.adapter import wrap
    from shortcutlab.models.devices import resolve_device

    return wrap(model, device=resolve_device("cpu" if device is None else device)).eval()


def read_record(run_dir: str | os.PathLike) -> dict:
    """run.json of a run folder, with one-line errors for a missing or corrupt file."""
    run_dir = os.fspath(run_dir)
    need_folder(run_dir, "run folder", RunError)
    path = os.path.join(run_dir, "run.json")
    if not os.path.exists(path):
        raise RunError(f"{run_dir!r} is not a run folder: it has no run.json (train a model with `shortcutlab train` first)")
    if wrong_kind(path, "file"):
        raise RunError(f"run record {path!r} {wrong_kind(path, 'file')}")
    record = load_json_object(path, "run record ", RunError, "a JSON object written by `shortcutlab train`")
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
    size = cfg.get("input_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise bad("config.input_size", size, "a positive whole number (pixels) or null")
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


def load_run(run_dir: str | os.PathLike, device: str | torch.device | None = None) -> Run:
    """Rebuild the trained model of a run folder (architecture from run.json, local weights).

    Args:
        run_dir: a folder written by `shortcutlab train` (or `shortcutlab.models.recipe.train`).
        device: torch device for the model (default: CPU), checked by `resolve_device`; score
            its crops there (`Run.device`; `probes.DiagnosticContext` moves batches to it).

    Raises:
        RunError: no run.json, no model.safetensors, or weights that do not fit the architecture.
        ShortcutlabError: a device that is not here (named with the ones that are).
    """
    from shortcutlab.models.adapter import create_model, input_size_kw

    run_dir = os.fspath(run_dir)
    record = read_record(run_dir)
    weights = weights_path(run_dir, record)
    if not os.path.exists(weights):
        raise RunError(f"run folder {run_dir!r} has no model weights ({os.path.basename(weights)} is missing)")
    arch = record["config"].get("arch")
    size = record["config"].get("input_size")
    model = create_model(arch, num_classes=len(record["classes"]), pretrained=weights, new_head=False, **input_size_kw(arch, size))
    return Run(path=os.path.abspath(run_dir), record=record, adapter=_placed(model, device), run_id=_run_id(run_dir))


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
    from shortcutlab.data.images import load_crops, load_manifest_table
    from shortcutlab.data.manifest import SplitManifest

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
