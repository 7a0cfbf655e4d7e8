"""The corner-patch litmus test (reference 004) as a training diagnostic.

Reference 004 cuts 20 x 20 px patches from five fixed positions of every image (the four
corners and the centre), trains a classifier on the patches alone and finds accuracies far
above chance: a patch that holds no diagnostic content can only carry acquisition bias. Here
the test runs under a given split: for each position the recipe (`shortcutlab.models.recipe.train`)
is trained on that patch only, and its test accuracy is set against chance with a binomial
interval. Under a parent-disjoint split no test crop's acquisition was seen in training, so
every position should score near chance; under a split that lets siblings cross (crop-level),
a model can recognise the acquisition from its background and recall its label.

How the patch is fed: every crop, in training and scoring, is replaced by the
`corner_patches` intervention's output (the patch resized back to the crop's H x W,
bilinear), *before* the recipe's geometric augmentation; that transform is deterministic, so
it is applied batch by batch (`TransformedCrops`) and the recipe then crops and flips the
patch as it would a crop. A random resized crop of the resized patch keeps 50-100% of the
patch's area and flips keep all of it, so every training input still shows only the patch's
pixels. The cell mask, when the crops have one, goes through the same cut and resize so that
mask-based options stay aligned.

Rows, one per position: ``accuracy`` = correct / scored test crops (a share, 0-1), ``k``,
``n``, ``chance`` (the largest class share of the test side, `shortcutlab.stats.chance_level`:
1 / K on a balanced test side, never below it), the binomial (Wilson) interval (``ci_low``,
``ci_high``) and one-sided exact ``p_value``, which count crops as independent trials, the
cluster-bootstrap interval over test parents (``cluster_ci_low``, ``cluster_ci_high``),
``above_chance`` (the cluster interval lies above chance; ``above_chance_wilson`` the same on
the Wilson interval), ``cell_coverage`` (mean share of the patch covered by the cell mask over
the split's crops; NaN without masks) and ``cell_free_share`` (crops whose patch holds no cell
pixel). A model that recognises a parent answers its siblings together, so the effective
sample is nearer the number of test parents than of crops: read the cluster interval.

Example:
    >>> from shortcutlab.studies.litmus import litmus                                # doctest: +SKIP
    >>> res = litmus(crops, split, positions=("top_left", "centre"), size=20,
    ...              config=TrainConfig(arch="test_resnet", epochs=20, lr=1e-3))
    >>> res.frame()[["position", "accuracy", "chance", "ci_low", "above_chance"]]
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from shortcutlab.data.images import CropImages
from shortcutlab.errors import ShortcutlabError
from shortcutlab.data.manifest import SplitManifest
from shortcutlab.models.recipe import TrainConfig, train
from shortcutlab.stats import against_chance, chance_level

POSITIONS: tuple[str, ...] = ("top_left", "top_right", "bottom_left", "bottom_right", "centre")


class LitmusError(ShortcutlabError):
    """Bad input to the litmus test or the deleted-signal control."""


@dataclass(frozen=True, eq=False)
class TransformedCrops(CropImages):
    """Crops that pass through a fixed, deterministic transform whenever a batch is drawn.

    ``float_batch`` returns ``transform(x, m)`` (and ``mask_transform(m)`` for the mask), so
    `shortcutlab.models.recipe.train` trains and scores on the transformed crops without a second
    copy of the images in memory. The transform must not draw random numbers.

    Attributes:
        transform: ``fn(x, mask, index) -> x`` on float (B, 3, H, W) batches in [0, 1]; mask
            is the float (B, 1, H, W) cell mask or None, index the (B,) crop rows (a transform
            that needs per-crop randomness seeds it from them, so a crop looks the same in
            every epoch and at scoring).
        mask_transform: ``fn(mask) -> mask`` applied to the mask, or None to keep it.
    """

    transform: Callable | None = None
    mask_transform: Callable | None = None

    def float_batch(self, index: torch.Tensor, device: torch.device | str = "cpu"):
        x, m = super().float_batch(index, device=device)
        y = x if self.transform is None else self.transform(x, m, index)
        if m is not None and self.mask_transform is not None:
            m = self.mask_transform(m)
        return y, m


def check_split_sides(crops: CropImages, split: SplitManifest, cell: str | None, what: str) -> np.ndarray:
    """(N,) side codes of the split on the crops; a split without a training or test side is refused."""
    from shortcutlab.data.audit import side_codes

    side = side_codes(crops.table, split.cell(cell))
    where = f" (cell {cell!r})" if cell else ""
    for code, name in ((0, "training"), (2, "test")):
        if not (side == code).any():
            raise LitmusError(f"{what} needs a {name} side, but the split{where} has no {name} crops; make one with `shortcutlab split`")
    return side


def one_class_note(crops: CropImages, side: np.ndarray, cell: str | None) -> str | None:
    """A line saying that the training side holds one class (a valid but degenerate retraining:
    the model answers that class everywhere and its accuracy measures the class shares), or None."""
    present = np.unique(crops.table.label_codes[side == 0])
    if len(present) > 1:
        return None
    where = f" (cell {cell!r})" if cell else ""
    what = "the table holds one class" if crops.table.n_classes < 2 else "the training side holds one class"
    return (f"{what}{where} ({crops.table.classes[present[0]]!r}): a model trained on it answers that class for every crop, "
            "so its accuracy against chance says nothing about a shortcut")


def retrain_and_score(crops: CropImages, split: SplitManifest, config: TrainConfig, cell: str | None = None,
                      run_dir: str | None = None, progress: bool = False) -> dict:
    """Train the recipe on the training side of `split` and score its test side.

    Args:
        crops: the crops (possibly `TransformedCrops`).
        split: the split manifest.
        config: the recipe's settings.
        cell: cell of a multi-cell manifest.
        run_dir: keep the run folder here; None trains in a temporary folder that is removed.
        progress: tqdm bars.

    Returns:
        ``record`` (the `RunRecord`), ``test_labels`` and ``test_pred`` ((n,) class codes of
        the scored test crops), ``test_parents`` (their parents), ``n_classes``.
    """
    def go(folder: str) -> dict:
        rec = train(crops, split, folder, config, cell=cell, progress=progress)
        logits = pd.read_csv(os.path.join(folder, "logits.csv"), dtype={"id": str, "label": str, "pred": str}, keep_default_na=False)
        test = logits[logits["split"] == "test"]
        code = {c: k for k, c in enumerate(rec.classes)}
        table = crops.table
        rows = pd.Index(table.ids).get_indexer(test["id"].to_numpy(dtype=object))
        return {
            "record": rec,
            "test_parents": table.parents[table.parent_codes[rows]],
            "test_labels": test["label"].map(code).to_numpy(dtype=np.int64),
            "test_pred": test["pred"].map(code).to_numpy(dtype=np.int64),
            "n_classes": len(rec.classes),
        }

    if run_dir is not None:
        return go(run_dir)
    with tempfile.TemporaryDirectory(prefix="shortcutlab-retrain-") as tmp:
        return go(os.path.join(tmp, "run"))


def score_row(fit: dict, seed: int = 0) -> dict:
    """Accuracy of a `retrain_and_score` result against chance.

    The fields of `stats.against_chance` (Wilson interval ``ci_low``/``ci_high`` and exact
    binomial ``p_value``, both counting crops as independent trials), plus
    ``cluster_ci_low``/``cluster_ci_high`` (`stats.cluster_bootstrap_interval` over test
    parents) and ``n_test_parents``. ``above_chance`` is decided on the cluster interval:
    siblings are answered together, so the Wilson interval is too narrow (on the synthetic
    benchmark a parent split's corner patch scored 0.247 against chance 0.333 with a Wilson
    interval of [0.185, 0.321], from 150 crops of 36 parents).
    """
    from shortcutlab.stats import cluster_bootstrap_interval

    y, p = fit["test_labels"], fit["test_pred"]
    row = against_chance(int((y == p).sum()), len(y), chance_level(y, fit["n_classes"]))
    lo, hi = cluster_bootstrap_interval(y == p, fit["test_parents"], seed=seed)
    row["above_chance_wilson"] = row.pop("above_chance")
    row["cluster_ci_low"], row["cluster_ci_high"] = lo, hi
    row["above_chance"] = bool(lo > row["chance"])
    row["n_test_parents"] = int(len(set(fit["test_parents"].tolist())))
    rec = fit["record"]
    row["train_accuracy"] = rec.accuracy.get("train", math.nan)
    row["n_train"] = rec.n_crops["train"]
    row["final_loss"] = rec.epoch_loss[-1] if rec.epoch_loss else math.nan
    return row


def check_positions(positions: Sequence[str]) -> tuple[str, ...]:
    if isinstance(positions, str):
        positions = [p.strip() for p in positions.split(",") if p.strip()]
    positions = tuple(positions)
    if not positions:
        raise LitmusError(f"give at least one patch position of {', '.join(POSITIONS)}")
    for p in positions:
        if p not in POSITIONS:
            import difflib

            close = difflib.get_close_matches(str(p), POSITIONS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise LitmusError(f"unknown patch position {p!r}; positions are {', '.join(POSITIONS)}{hint}")
    if len(set(positions)) != len(positions):
        raise LitmusError(f"patch positions repeat: {', '.join(positions)}")
    return positions


def check_size(size, crops: CropImages) -> int:
    H, W = crops.images.shape[-2:]
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise LitmusError(f"patch size must be a positive whole number of pixels; got {size!r}")
    if size > H or size > W:
        raise LitmusError(f"patch size {int(size)} does not fit inside the {H} x {W} crops; use a size <= {min(H, W)}")
    return int(size)


def patch_transforms(position: str, size: int) -> tuple[Callable, Callable]:
    """The image and mask transforms that keep the patch at `position` (resized to the crop)."""
    from interventions.corner_patches import corner_patches

    def image(x, m, index=None):
        return corner_patches(x, position, size=size)

    def mask(m):
        # The same cut and resize as the image, kept in [0, 1] (soft at the patch's edges).
        return corner_patches(m.expand(-1, 3, -1, -1), position, size=size)[:, :1]

    return image, mask


def patch_coverage(crops: CropImages, idx: np.ndarray, size: int) -> dict[str, tuple[float, float]] | None:
    """Per position, (mean cell-mask share inside the patch, share of crops whose patch holds no
    cell pixel) over crops `idx`; None without masks."""
    import warnings

    from interventions.base import InterventionWarning
    from interventions.corner_patches import patch_mask_coverage

    if crops.masks is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterventionWarning)  # empty masks are the recipe's to count
        cov = patch_mask_coverage(crops.masks[torch.from_numpy(np.asarray(idx, dtype=np.int64))], size=size).double().numpy()
    return {p: (float(cov[:, k].mean()), float((cov[:, k] == 0).mean())) for k, p in enumerate(POSITIONS)}


@dataclass(frozen=True)
class LitmusResult:
    """Outcome of `litmus`: one row per position, plus what was run.

    Attributes:
        rows: dicts with ``position``, ``size`` and the fields of `score_row`, plus
            ``cell_coverage`` and ``cell_free_share``.
        size: patch side in pixels.
        crop_size: (H, W) of the crops.
        config: the recipe's settings (as a dict).
        split: protocol, params and SHA-256 of the split, and the cell.
        chance_rule: how ``chance`` was computed.
    """

    rows: list
    size: int
    crop_size: tuple
    config: dict
    split: dict
    chance_rule: str = "largest class share of the test side (1/K on a balanced test side, never below 1/K)"
    notes: list = field(default_factory=list)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def to_dict(self) -> dict:
        return asdict(self)


def litmus(crops: CropImages, split: SplitManifest, positions: Sequence[str] = POSITIONS, size: int = 20,
           config: TrainConfig = TrainConfig(), cell: str | None = None, progress: bool = False,
           run_root: str | None = None) -> LitmusResult:
    """Train the recipe on one fixed patch per position and score each against chance.

    Args:
        crops: the crops (`shortcutlab.data.images.load_crops`), with masks for the coverage.
        split: a split manifest; its training side trains, its test side is scored.
        positions: any of `POSITIONS` (default all five).
        size: patch side in pixels (reference 004: 20); must fit inside the crops.
        config: the recipe's settings; one model per position, same seed.
        cell: cell of a multi-cell manifest.
        progress: tqdm bars.
        run_root: keep each position's run folder under ``run_root/<position>``; None trains
            in temporary folders.

    Returns:
        A `LitmusResult`.

    Raises:
        LitmusError: an unknown position, a size that does not fit, a split without a
            training or test side.

    Warns:
        SplitWarning: the training side holds one class (`one_class_note`, also in ``notes``).
    """
    positions = check_positions(positions)
    size = check_size(size, crops)
    side = check_split_sides(crops, split, cell, "the litmus test")
    notes = []
    note = one_class_note(crops, side, cell)
    if note:
        import warnings

        from shortcutlab.errors import SplitWarning

        warnings.warn(note, SplitWarning, stacklevel=2)
        notes.append(note)
    coverage = patch_coverage(crops, np.flatnonzero(side >= 0), size)
    rows = []
    for position in positions:
        image_t, mask_t = patch_transforms(position, size)
        patched = TransformedCrops(crops.images, crops.masks, crops.table, transform=image_t, mask_transform=mask_t)
        fit = retrain_and_score(patched, split, config, cell=cell, progress=progress,
                                run_dir=None if run_root is None else os.path.join(run_root, position))
        row = {"position": position, "size": size, **score_row(fit)}
        cov = coverage[position] if coverage else (math.nan, math.nan)
        row["cell_coverage"], row["cell_free_share"] = cov
        rows.append(row)
    return LitmusResult(
        rows=rows,
        size=size,
        crop_size=tuple(int(v) for v in crops.images.shape[-2:]),
        config=asdict(config),
        split={"protocol": split.protocol, "params": split.params, "sha256": split.hash, "cell": cell},
        notes=notes,
    )
