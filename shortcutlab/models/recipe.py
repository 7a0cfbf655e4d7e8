"""The main paper's training recipe, deterministic on CPU.

AdamW (lr 1e-4, weight decay 0.01), batch 64, a fixed number of epochs, random resized crop
and flips, scored at the final epoch with no model selection. One function trains any cell of
any split manifest, so the leak and clean models of a factorial are trained the same way.

Training-time variants that later studies need:

- ``mask_background``: every crop (training and scoring) has its background replaced by
  ``background_fill`` outside the cell mask (the paper's F3);
- ``augment`` (a registered intervention name with ``augment_params``, recorded in run.json)
  or ``augmentation`` (any callable ``fn(x, mask=m) -> x`` on float (B, 3, H, W) batches in
  [0, 1]): applied to training batches after the geometric augmentation, with the mask
  cropped and flipped together with the image. Random interventions draw from the run's
  generator, so runs stay deterministic. HED jitter for F4 plugs in here
  (``TrainConfig(augment="hed_jitter", augment_params={"sigma_alpha": 0.2})``);
- ``adversary_weight``: a gradient-reversal parent adversary (Ganin & Lempitsky, DANN): a
  linear head on the pooled features predicts the training crop's parent, and its gradient
  reaches the backbone multiplied by -lambda(p), with the DANN schedule
  ``lambda(p) = adversary_weight * (2 / (1 + exp(-10 p)) - 1)``, p = step / (steps - 1), from 0
  at the first optimiser step to 1 at the last. Its loss and parent accuracy per epoch are in
  run.json (``adversary``).

Determinism: the model is initialised, batches are shuffled and augmentations are drawn from
generators seeded by ``seed`` only, and torch's deterministic algorithms are enforced while
training, so the same seed gives the same logits on CPU. On CUDA, `train` also sets
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` before CUDA starts and turns off cuDNN's autotuner, so
that runs can repeat on the same GPU and software (`benchmarks/gpu_check.py` checks it;
results differ across GPU models).

Example:
    >>> from shortcutlab.models.recipe import TrainConfig, train        # doctest: +SKIP
    >>> record = train("bench/manifest.csv", "split.csv", "runs/a", TrainConfig(arch="test_resnet", epochs=5))
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from shortcutlab.data.images import CropImages, load_crops, load_manifest_table
from shortcutlab.errors import ShortcutlabError
from shortcutlab.models.grad_reverse import GradReverse as _GradReverse  # module attribute: tests spy on it
from shortcutlab.models.grad_reverse import dann_lambda
from shortcutlab.models.devices import resolve_device
from shortcutlab.models.runs import mask_background, preprocess_for, resize_crops
from shortcutlab.io import OutputError, atomic_files, claim_output_dir, read_json_object, to_json, write_marker, write_text
from shortcutlab.data.manifest import SplitManifest
from shortcutlab.data.table import CropTable
from shortcutlab.models.train_config import TrainConfig  # declared without torch, so the CLI builds its options light

Augmentation = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class RunRecord:
    """What a run did: config, data, results, versions and durations (also run.json).

    ``empty_masks`` is None when the run used no cell masks; otherwise ``{"count", "checked",
    "ids", "used_by"}``: how many of the crops that went through a mask (all crops trained or
    scored with `mask_background`, training crops with a mask-based augmentation) had an
    all-zero mask, the first 20 of their ids, and what used the masks.

    ``adversary`` is None without a parent adversary; otherwise the number of training parents,
    the chance-level loss log(n_parents), and per epoch the adversary's mean cross-entropy and
    its accuracy at naming the parent of the (augmented) training crops, measured on each
    batch before its update: an adversary that learns nothing stays at chance, and one that
    wins against the reversed gradient falls well below it.

    ``data`` names the crop manifest and split manifest files the run was trained on (absolute
    paths; None for data given in memory), so that `shortcutlab diagnose RUN` finds them.

    ``weights_fit`` is None without a weights file; otherwise how the file went into the model
    (`shortcutlab.models.adapter.WeightsFit`: its route, "strict" or "new_head", and the keys
    of the file that were dropped, the model's keys that were re-initialised and those timm
    adapted to another shape).
    """

    config: dict
    split_sha256: str
    cell: str | None
    classes: list[str]
    n_crops: dict
    accuracy: dict
    epoch_loss: list[float]
    durations_s: dict
    versions: dict
    out_dir: str
    files: dict = field(default_factory=dict)
    empty_masks: dict | None = None
    adversary: dict | None = None
    data: dict = field(default_factory=dict)
    weights_fit: dict | None = None
    #: torch threads the run trained and scored on (float reductions, hence the last digits
    #: of the logits, depend on it); None in runs written before it was recorded
    threads: int | None = None


def random_resized_crop(
    x: torch.Tensor, scale: tuple[float, float], ratio: tuple[float, float], generator: torch.Generator
) -> torch.Tensor:
    """Per-sample random resized crop back to the input size, parameters drawn from `generator`.

    The boxes follow torchvision's RandomResizedCrop (area share in `scale`, log-uniform aspect
    in `ratio`, clipped to the image); all crops are resampled bilinearly in one batched
    `torchvision.ops.roi_align` call instead of a per-image loop.

    Args:
        x: (B, C, H, W) float tensor.
        scale: range of the crop's area as a share of the image.
        ratio: range of the crop's aspect ratio (width / height).
        generator: CPU generator the parameters are drawn from.

    Returns:
        (B, C, H, W) tensor on x's device.
    """
    from torchvision.ops import roi_align

    B, _, H, W = x.shape
    area = H * W
    u = torch.rand(B, 4, generator=generator, dtype=torch.float64)
    s = scale[0] + (scale[1] - scale[0]) * u[:, 0]
    log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * u[:, 1]
    r = torch.exp(log_r)
    w = torch.clamp(torch.round(torch.sqrt(s * area * r)), 1, W)
    h = torch.clamp(torch.round(torch.sqrt(s * area / r)), 1, H)
    top = torch.floor(u[:, 2] * (H - h + 1))
    left = torch.floor(u[:, 3] * (W - w + 1))
    boxes = torch.stack([torch.arange(B, dtype=torch.float64), left, top, left + w, top + h], dim=1)
    return roi_align(x, boxes.to(device=x.device, dtype=x.dtype), output_size=(H, W), spatial_scale=1.0, sampling_ratio=1, aligned=True)


def _flip(x: torch.Tensor, dim: int, generator: torch.Generator) -> torch.Tensor:
    do = torch.rand(x.shape[0], generator=generator) < 0.5
    if do.any():
        x = x.clone()
        x[do] = x[do].flip(dim)
    return x


def _versions() -> dict:
    import timm

    from shortcutlab.version import __version__

    return {
        "shortcutlab": __version__,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


@contextlib.contextmanager
def _deterministic():
    previous = torch.are_deterministic_algorithms_enabled()
    previous_benchmark = torch.backends.cudnn.benchmark
    torch.use_deterministic_algorithms(True)
    # cuDNN's autotuner may pick another (deterministic) algorithm from run to run.
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)
        torch.backends.cudnn.benchmark = previous_benchmark


def _resolve_augmentation(config: TrainConfig, augmentation: Augmentation | None, has_masks: bool):
    """The training augmentation: the callable given, or the intervention named in the config."""
    if config.augment and augmentation is not None:
        raise ShortcutlabError("give either TrainConfig.augment (a registered intervention) or augmentation= (a callable), not both")
    if config.augment:
        import interventions

        augmentation = interventions.get(config.augment, **config.augment_params)
    if augmentation is None:
        return None
    if getattr(augmentation, "label_conditioned", False):
        raise ShortcutlabError(f"{getattr(augmentation, 'name', augmentation)!r} is label-conditioned (it needs per-crop test-time targets) and cannot be a training augmentation")
    if getattr(augmentation, "requires_mask", False) and not has_masks:
        raise ShortcutlabError(f"augmentation {getattr(augmentation, 'name', augmentation)!r} needs cell masks: give the manifest a mask column")
    return augmentation


def _count_empty_masks(crops: CropImages, side: np.ndarray, config: TrainConfig, augmentation) -> dict | None:
    """Count the crops whose all-zero mask a masked step would treat as 'no cell' (and warn).

    `mask_background` turns such a crop into a uniform fill (training and scoring); a
    mask-based augmentation sees no cell in it. Returns None when the run uses no masks.
    """
    used_by, checked = [], np.zeros(len(side), dtype=bool)
    if config.mask_background:
        used_by.append("mask_background")
        checked |= side >= 0
    if augmentation is not None and getattr(augmentation, "requires_mask", False):
        used_by.append(f"augmentation {getattr(augmentation, 'name', type(augmentation).__name__)!r}")
        checked |= side == 0
    if not used_by or crops.masks is None:
        return None
    idx = np.flatnonzero(checked)
    empty = idx[~crops.masks[torch.from_numpy(idx)].flatten(1).any(1).numpy()]
    ids = [str(i) for i in crops.table.ids[empty]]
    if len(empty):
        shown = ", ".join(repr(i) for i in ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        warnings.warn(
            f"{len(empty)} of {len(idx)} crops used with masks have an empty (all-zero) mask: {shown}; "
            f"{' and '.join(used_by)} find no cell in them (mask_background turns such a crop into a uniform fill). "
            "The count is recorded in run.json (empty_masks).",
            stacklevel=3,
        )
    return {"count": int(len(empty)), "checked": int(len(idx)), "ids": ids[:20], "used_by": used_by}


def _augment(augmentation, x: torch.Tensor, m: torch.Tensor | None, gen: torch.Generator) -> torch.Tensor:
    from interventions.base import InterventionWarning

    # Random interventions draw from the run's generator so that a seed fixes the whole run.
    # Empty masks are counted once per run (run.json), so the per-batch warnings are muted.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterventionWarning)
        if getattr(augmentation, "stochastic", False):
            return augmentation(x, mask=m, generator=gen)
        return augmentation(x, mask=m)


class _Moments:
    """Per-channel count, mean and sum of squared deviations, merged batch by batch in float64.

    Batches are merged with Chan, Golub & LeVeque's pairwise update, which equals the totals of
    sums and sums of squares but does not lose digits to cancellation when the mean is large
    compared with the spread; the result does not depend on the order of the batches.
    """

    def __init__(self) -> None:
        self.n = 0
        self.mean: torch.Tensor | None = None
        self.m2: torch.Tensor | None = None
        self.batches = 0

    def update(self, x: torch.Tensor) -> None:
        # x: (N, C, *) as a BatchNorm layer sees it; every dimension but 1 is a sample.
        n_b = x.numel() // max(x.shape[1], 1)
        if n_b == 0:
            return
        dims = [0, *range(2, x.dim())]
        z = x.detach().to(torch.float64)
        mean_b = z.mean(dims)
        m2_b = (z - mean_b.view(1, -1, *([1] * (x.dim() - 2)))).square_().sum(dims)
        if self.mean is None:
            self.n, self.mean, self.m2 = n_b, mean_b, m2_b
        else:
            n = self.n + n_b
            delta = mean_b - self.mean
            self.mean = self.mean + delta * (n_b / n)
            self.m2 = self.m2 + m2_b + delta.square() * (self.n * n_b / n)
            self.n = n
        self.batches += 1


def precise_batchnorm(model: torch.nn.Module, batches, forward: Callable | None = None) -> int:
    """Set every BatchNorm layer's running statistics to the exact moments of its input.

    PreciseBN (Wu & Johnson, "Rethinking 'Batch' in BatchNorm", 2021): the model runs in train
    mode, so each layer normalises with its batch's statistics as in training, while a forward
    pre-hook on every BatchNorm layer accumulates the per-channel count, mean and sum of
    squared deviations of that layer's input over all batches (float64). Afterwards
    ``running_mean`` is the mean and ``running_var`` the unbiased variance of everything the
    layer saw, exactly as if the inputs had been concatenated: batches of unequal size weigh
    by their size, the spread between batches is kept, and the order of the batches does not
    matter. (A layer's input still depends on how samples are grouped into batches, since the
    layers before it normalise with batch statistics.)

    Momentum, train/eval mode and everything else are restored afterwards; if a batch fails,
    the running statistics are restored too. Layers without running statistics
    (``track_running_stats=False``) and layers the batches never reach are left as they were.

    Args:
        model: any module; its BatchNorm layers (`torch.nn.modules.batchnorm._BatchNorm`,
            including SyncBatchNorm) are recalibrated.
        batches: an iterable of inputs, each passed to `forward`.
        forward: callable run on each batch (default: `model`), e.g. an adapter's `logits`.

    Returns:
        The number of BatchNorm layers recalibrated.
    """
    layers = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats and m.running_mean is not None]
    if not layers:
        return 0
    forward = model if forward is None else forward
    saved = [(m.running_mean.clone(), m.running_var.clone(), None if m.num_batches_tracked is None else m.num_batches_tracked.clone()) for m in layers]
    moments = [_Moments() for _ in layers]
    handles = [m.register_forward_pre_hook(lambda mod, inp, acc=acc: acc.update(inp[0])) for m, acc in zip(layers, moments)]
    was_training = model.training
    model.train()
    ok = False
    try:
        with torch.no_grad():
            for batch in batches:
                forward(batch)
        ok = True
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
        # The layers' own moving-average updates during the pass are discarded either way.
        for m, (mean, var, nbt) in zip(layers, saved):
            m.running_mean.copy_(mean)
            m.running_var.copy_(var)
            if nbt is not None:
                m.num_batches_tracked.copy_(nbt)
    done = 0
    if ok:
        for m, acc in zip(layers, moments):
            if acc.mean is None:
                continue
            m.running_mean.copy_(acc.mean.to(m.running_mean.dtype))
            m.running_var.copy_((acc.m2 / max(acc.n - 1, 1)).to(m.running_var.dtype))
            if m.num_batches_tracked is not None:
                m.num_batches_tracked.fill_(acc.batches)
            done += 1
    return done


def recalibrate_batchnorm(adapter, crops: CropImages, idx: np.ndarray, config: TrainConfig, device: torch.device, batch_size: int | None = None) -> int:
    """PreciseBN over training crops `idx`: every BatchNorm layer gets its input's exact moments.

    The crops are taken as they are scored (no augmentation; the run's preprocess), in
    batches like the training batches: of ``config.batch_size`` crops (or `batch_size`),
    shuffled with a generator seeded by ``config.seed``, so that the layers before each
    BatchNorm layer normalise with statistics of mixed batches as in training (crops in id
    order would give batches of mostly one class). The result depends only on the set of
    crops and the seed, not on the order of `idx`. See `precise_batchnorm`.

    Returns:
        The number of BatchNorm layers recalibrated (0 for a model without any).
    """
    size = config.batch_size if batch_size is None else batch_size
    order = np.sort(np.asarray(idx, dtype=np.int64))
    order = order[torch.randperm(len(order), generator=torch.Generator().manual_seed(config.seed)).numpy()]

    starts = list(range(0, len(order), size))
    if len(starts) > 1 and len(order) - starts[-1] == 1:
        starts.pop()  # a last batch of one crop joins the one before (BatchNorm cannot take it in train mode)
    ends = starts[1:] + [len(order)]
    pre = preprocess_for({"config": config.to_dict()})

    def batches():
        for b, e in zip(starts, ends):
            x, m = crops.float_batch(torch.from_numpy(order[b:e]), device=device)
            yield x if pre is None else pre(x, m)

    return precise_batchnorm(adapter.model, batches(), forward=adapter.logits)


def _check_out_dir(out_dir: str | os.PathLike) -> None:
    """Refuse a run folder that cannot be written before any training time is spent.

    Nothing is created here: the folder appears only when the run's files are written.
    """
    out = os.fspath(out_dir)
    if not out:
        raise OutputError("the run folder (out_dir) is empty")
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputError(f"cannot write the run folder {out!r}: it is a file, not a folder")
    probe = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise OutputError(f"cannot write the run folder {out!r}: {probe!r} is a file, not a folder")
    target = out if os.path.isdir(out) else probe
    if not os.access(target, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write the run folder {out!r}: folder {target!r} is not writable")
    claim_output_dir(out, "run", RUN_FILES, _is_legacy_run)


#: what a run folder holds: `train`'s files, those `shortcutlab diagnose` adds (and its feature
#: cache), and a sweep's record of its train task
RUN_FILES = ("model.safetensors", "logits.csv", "run.json", "diagnostics.csv", "diagnostics.json", ".features/", "result.json")


def _is_legacy_run(out: str) -> bool:
    """A run folder written before output markers: its run.json is a run record."""
    d = read_json_object(os.path.join(out, "run.json"))
    return d is not None and isinstance(d.get("config"), dict) and isinstance(d.get("files"), dict)


def train(
    manifest: str | CropTable | CropImages,
    split: str | SplitManifest,
    out_dir: str,
    config: TrainConfig = TrainConfig(),
    cell: str | None = None,
    augmentation: Augmentation | None = None,
    progress: bool = True,
    on_epoch: Callable[[int, int], None] | None = None,
) -> RunRecord:
    """Train one model on the training side of a split and score every crop of the split.

    The steps: check the device and the run folder, load the crops and the split
    (`_load_inputs`), fit the model (`_fit`, with `_ParentAdversary` when
    ``adversary_weight > 0``), recalibrate BatchNorm if asked, score every crop of the split
    (`_score`) and write the run folder (`_write_run`).

    Args:
        manifest: crop manifest CSV (id, path, mask, label, parent), a `CropTable` with an image
            column, or crops already loaded with `load_crops`.
        split: split manifest CSV or `SplitManifest` (any protocol; `cell` picks a cell).
        out_dir: run folder; receives model.safetensors, logits.csv and run.json, written
            under temporary names and renamed into place together (run.json last), so a run
            that fails leaves the previous run's files or none. A folder that cannot be
            written is refused before training.
        config: the recipe's settings.
        cell: the cell of a multi-cell manifest (factorial, ladder).
        augmentation: optional ``fn(x, mask) -> x`` applied to training batches.
        progress: show tqdm progress bars.
        on_epoch: called as ``on_epoch(done, epochs)`` after each training epoch (a sweep's
            progress bar advances with it).

    Returns:
        The run record (also written to run.json).
    """
    t0 = time.perf_counter()
    # Before anything can start CUDA (CUBLAS_WORKSPACE_CONFIG) and before any work is done.
    device = resolve_device(config.device)
    _check_out_dir(out_dir)
    crops, split, side, train_idx, data_files = _load_inputs(manifest, split, cell, config)
    table, classes = crops.table, list(crops.table.classes)
    augmentation = _resolve_augmentation(config, augmentation, crops.masks is not None)
    empty_masks = _count_empty_masks(crops, side, config, augmentation)
    t_load = time.perf_counter() - t0

    with torch.random.fork_rng(devices=[]), _deterministic():
        model, weights_fit, adapter, adversary = _build_model(config, len(classes), table.parent_codes, train_idx, device)
        t1 = time.perf_counter()
        epoch_loss = _fit(adapter, adversary, crops, train_idx, config, augmentation, device, progress, on_epoch)
        if config.precise_bn:
            recalibrate_batchnorm(adapter, crops, train_idx, config, device)
        t2 = time.perf_counter()
        t_train = t2 - t1
        scored, logits_all = _score(adapter, crops, side, config, device)
        t_eval = time.perf_counter() - t2

    frame, accuracy, n_crops = _logits_table(table, classes, side, scored, logits_all)
    record = RunRecord(
        config=asdict(config),
        split_sha256=split.hash,
        cell=cell,
        classes=classes,
        n_crops=n_crops,
        accuracy=accuracy,
        epoch_loss=[round(v, 6) for v in epoch_loss],
        durations_s={"load": round(t_load, 3), "train": round(t_train, 3), "score": round(t_eval, 3), "train_crops_per_s": round(config.epochs * len(train_idx) / max(t_train, 1e-9), 1)},
        versions=_versions(),
        out_dir=os.path.abspath(out_dir),
        files={"weights": "model.safetensors", "logits": "logits.csv", "record": "run.json"},
        empty_masks=empty_masks,
        adversary=adversary.log if adversary is not None else None,
        data=data_files,
        weights_fit=weights_fit.to_dict() if weights_fit is not None else None,
        threads=torch.get_num_threads(),
    )
    _write_run(out_dir, frame, model, record)
    return record


def _build_model(config: TrainConfig, n_classes: int, parent_codes: np.ndarray, train_idx: np.ndarray, device: torch.device):
    """The model (with its weights file's fit, `create_model_fit`), its adapter on `device`,
    and the parent adversary when ``adversary_weight > 0`` (else None). The global generator,
    seeded here with ``config.seed``, initialises the model and then the adversary."""
    from shortcutlab.models.adapter import create_model_fit, input_size_kw, wrap

    torch.manual_seed(config.seed)
    model, weights_fit = create_model_fit(config.arch, n_classes, config.weights, **input_size_kw(config.arch, config.input_size))
    model.to(device)
    adapter = wrap(model, device=device)
    adversary = _ParentAdversary(parent_codes, train_idx, adapter.num_features, device) if config.adversary_weight > 0 else None
    return model, weights_fit, adapter, adversary


def _load_inputs(manifest, split, cell: str | None, config: TrainConfig):
    """Step 1 of `train`: the crops, the split manifest, every crop's side code (0 train,
    1 val, 2 test, -1 unused), the training rows, and the data files to record in run.json.

    Raises:
        ShortcutlabError: a split (cell) without training crops, or `mask_background`
            without cell masks.
    """
    from shortcutlab.data.audit import side_codes

    if isinstance(manifest, CropImages):
        crops = manifest
    else:
        table = manifest if isinstance(manifest, CropTable) else load_manifest_table(manifest)
        crops = load_crops(table)
    table = crops.table
    source = getattr(table, "source", None)
    data_files = {
        "manifest": os.path.abspath(manifest) if isinstance(manifest, (str, os.PathLike))
        else (os.path.abspath(source) if isinstance(source, str) and os.path.isfile(source) else None),
        "split": os.path.abspath(split) if isinstance(split, (str, os.PathLike)) else None,
    }
    if isinstance(split, (str, os.PathLike)):
        split = SplitManifest.read(split)
    side = side_codes(table, split.cell(cell))
    train_idx = np.flatnonzero(side == 0)
    if len(train_idx) == 0:
        raise ShortcutlabError(f"the split{' cell ' + repr(cell) if cell else ''} has no training crops")
    if config.mask_background and crops.masks is None:
        raise ShortcutlabError("mask_background needs cell masks: the manifest has no mask column")
    return crops, split, side, train_idx, data_files


class _ParentAdversary:
    """The gradient-reversal parent adversary of `train` (DANN): a linear head on the pooled
    features names the training crop's parent; `log` becomes run.json's ``adversary``.

    Args:
        parent_codes: (n_crops,) parent code of every crop of the table.
        train_idx: the training rows; their parents are the adversary's classes.
        num_features: width of the pooled features.
        device: where the head lives.
    """

    def __init__(self, parent_codes: np.ndarray, train_idx: np.ndarray, num_features: int, device: torch.device) -> None:
        codes, uniq = np.unique(parent_codes[train_idx], return_inverse=True)
        self.parents = torch.full((len(parent_codes),), -1, dtype=torch.long)
        self.parents[torch.from_numpy(train_idx)] = torch.from_numpy(uniq.astype(np.int64))
        self.head = torch.nn.Linear(num_features, len(codes)).to(device)
        self.log = {"n_parents": int(len(codes)), "chance_loss": round(math.log(len(codes)), 6), "epoch_loss": [], "epoch_accuracy": []}
        self._loss_sum, self._correct = 0.0, 0

    def loss(self, feats: torch.Tensor, idx: torch.Tensor, lam: float) -> torch.Tensor:
        """Cross-entropy of the head on `feats`, whose gradient reaches them times -`lam`; the
        batch's loss and hits are added to the epoch's tally."""
        adv = self.head(_GradReverse.apply(feats, lam))
        z = self.parents[idx].to(feats.device)
        adv_loss = F.cross_entropy(adv, z)
        self._loss_sum += float(adv_loss.detach()) * len(idx)
        self._correct += int((adv.detach().argmax(1) == z).sum())
        return adv_loss

    def end_epoch(self, seen: int) -> None:
        """Log the epoch's mean loss and accuracy over `seen` crops; start a new tally."""
        self.log["epoch_loss"].append(round(self._loss_sum / seen, 6))
        self.log["epoch_accuracy"].append(round(self._correct / seen, 6))
        self._loss_sum, self._correct = 0.0, 0


def _batch_count(n_train: int, batch_size: int) -> int:
    """Training batches per epoch. A last batch of one crop cannot train BatchNorm (one value
    per channel after global pooling): it joins the batch before it. Every other size keeps
    its batches."""
    n_batches = math.ceil(n_train / batch_size)
    if n_batches > 1 and n_train % batch_size == 1:
        n_batches -= 1
    return n_batches


def _fit(adapter, adversary: _ParentAdversary | None, crops: CropImages, train_idx: np.ndarray, config: TrainConfig,
         augmentation, device: torch.device, progress: bool, on_epoch: Callable[[int, int], None] | None = None) -> list[float]:
    """Step 2 of `train`: AdamW over `config.epochs` epochs of shuffled, augmented batches.

    Shuffling and augmentation draw from one generator seeded by ``config.seed``.

    Returns:
        The mean training loss of every epoch (with the adversary's loss when there is one).
    """
    from tqdm.auto import tqdm

    model = adapter.model
    labels = torch.from_numpy(crops.table.label_codes)
    params = list(model.parameters()) + (list(adversary.head.parameters()) if adversary is not None else [])
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    gen = torch.Generator().manual_seed(config.seed)
    n_batches = _batch_count(len(train_idx), config.batch_size)
    total = config.epochs * n_batches
    step = 0
    epoch_loss = []
    bar = tqdm(total=total, desc=f"train {config.arch}", disable=not progress, leave=False)
    for epoch in range(config.epochs):
        model.train()
        order = torch.from_numpy(train_idx)[torch.randperm(len(train_idx), generator=gen)]
        running, seen = 0.0, 0
        for b in range(n_batches):
            idx = order[b * config.batch_size : (b + 1) * config.batch_size if b < n_batches - 1 else len(order)]
            x = _training_batch(crops, idx, config, augmentation, gen).to(device)
            lam = dann_lambda(step / max(total - 1, 1), config.adversary_weight) if adversary is not None else 0.0
            running += _train_step(adapter, adversary, opt, x, labels[idx].to(device), idx, lam) * len(idx)
            seen += len(idx)
            step += 1
            bar.update(1)
        epoch_loss.append(running / seen)
        if adversary is not None:
            adversary.end_epoch(seen)
        bar.set_postfix(epoch=epoch + 1, loss=f"{epoch_loss[-1]:.3f}")
        if on_epoch is not None:
            on_epoch(epoch + 1, config.epochs)
    bar.close()
    return epoch_loss


def _training_batch(crops: CropImages, idx: torch.Tensor, config: TrainConfig, augmentation, gen: torch.Generator) -> torch.Tensor:
    """One training batch, (B, 3, H, W) in [0, 1] on the CPU: the background masked if asked,
    then random resized crop, flips and the augmentation, all drawn from `gen`, and last the
    resize to ``input_size`` (the model's input, as in scoring)."""
    x, m = crops.float_batch(idx)
    if config.mask_background:
        x = mask_background(x, m, config.background_fill)
    # The mask travels with the image through crop and flips (one 4-channel tensor).
    xm = x if m is None else torch.cat([x, m], dim=1)
    xm = random_resized_crop(xm, config.rrc_scale, config.rrc_ratio, gen)
    if config.hflip:
        xm = _flip(xm, -1, gen)
    if config.vflip:
        xm = _flip(xm, -2, gen)
    x, m = (xm, None) if m is None else (xm[:, :3], xm[:, 3:].clamp_(0.0, 1.0))
    x = x.clamp_(0.0, 1.0)
    if augmentation is not None:
        x = _augment(augmentation, x, m, gen)
    if config.input_size is not None:
        x = resize_crops(x, config.input_size)
    return x.clamp_(0.0, 1.0)


def _train_step(adapter, adversary: _ParentAdversary | None, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                idx: torch.Tensor, lam: float) -> float:
    """One optimiser step on batch `x` with labels `y`; returns the batch's loss."""
    feats = adapter.features(x)
    loss = F.cross_entropy(adapter.head(feats), y)
    if adversary is not None:
        loss = loss + adversary.loss(feats, idx, lam)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


def _score(adapter, crops: CropImages, side: np.ndarray, config: TrainConfig, device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """Step 3 of `train`: the logits of every crop of the split in eval mode, un-augmented,
    through the run's preprocess (`preprocess_for`: masked if `mask_background`, resized to
    `input_size`), as `load_run` will score them. Returns the scored rows and their
    (n, n_classes) logits."""
    scored = np.flatnonzero(side >= 0)
    pre = preprocess_for({"config": config.to_dict()})
    adapter.model.eval()
    out_logits = []
    with torch.no_grad():
        for b in range(0, len(scored), 256):
            idx = torch.from_numpy(scored[b : b + 256])
            x, m = crops.float_batch(idx, device=device)
            if pre is not None:
                x = pre(x, m)
            out_logits.append(adapter.logits(x).cpu())
    return scored, torch.cat(out_logits).numpy()


def _logits_table(table: CropTable, classes: list[str], side: np.ndarray, scored: np.ndarray, logits_all: np.ndarray):
    """logits.csv's rows (id, split, label, pred, one logit per class), and the accuracy and
    crop count per side."""
    sides = np.array(["train", "val", "test"], dtype=object)
    frame = pd.DataFrame({"id": table.ids[scored], "split": sides[side[scored]], "label": np.asarray(classes, dtype=object)[table.label_codes[scored]]})
    pred = logits_all.argmax(1)
    frame["pred"] = np.asarray(classes, dtype=object)[pred]
    for k, c in enumerate(classes):
        frame[f"logit_{c}"] = logits_all[:, k]
    correct = pred == table.label_codes[scored]
    accuracy = {s: float(correct[frame["split"].to_numpy() == s].mean()) for s in ("train", "val", "test") if (frame["split"] == s).any()}
    n_crops = {s: int((frame["split"] == s).sum()) for s in ("train", "val", "test")}
    return frame, accuracy, n_crops


def _write_run(out_dir: str, frame: pd.DataFrame, model: torch.nn.Module, record: RunRecord) -> None:
    """Step 4 of `train`: the run folder's three files appear together or not at all; run.json,
    which marks a complete run, is renamed into place last."""
    from safetensors.torch import save_file

    with atomic_files() as stage:
        frame.to_csv(stage.path(os.path.join(out_dir, "logits.csv")), index=False)
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, stage.path(os.path.join(out_dir, "model.safetensors")))
        write_text(stage.path(os.path.join(out_dir, "run.json")), to_json(asdict(record)))
    write_marker(out_dir, "run", ["model.safetensors", "logits.csv", "run.json"])
