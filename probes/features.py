"""Frozen pooled features of a wrapped model, batched, with an on-disk cache.

Every probe reads the same penultimate features (`ModelAdapter.features`), so they are
computed once per model and crop set: in memory within a run, and on disk across runs when a
cache folder is given. The cache key is the SHA-256 of the model's weights (every tensor of its
state dict, names included), of the adapter's input normalisation and feature source (its mean
and std are buffers outside the model's state dict, and one model wrapped with another
``feature_layer=`` gives other features), of the crops' ids and pixels (and masks, when a
transform may use them), of the input size, and of the transform's name, so a changed
checkpoint, wrapping, crop or intervention never reads stale features.

Example (``cache_dir="runs/a/.features"`` would keep them on disk):
    >>> import torch
    >>> from shortcutlab.models.adapter import create_model, wrap
    >>> adapter = wrap(create_model("test_resnet", num_classes=3).eval())
    >>> crops = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    >>> F = extract_features(adapter, crops, batch_size=4)
    >>> F.shape, F.dtype
    ((8, 96), dtype('float32'))
"""

from __future__ import annotations

import hashlib
import os
from typing import Callable

import numpy as np
import torch

from .errors import DiagnosticError
from shortcutlab.models.adapter import eval_mode


def weights_hash(model: torch.nn.Module) -> str:
    """SHA-256 of a model's state dict (names, dtypes, shapes and values)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _as_images(crops) -> tuple[torch.Tensor, torch.Tensor | None, list[str] | None]:
    """(images, masks, ids) of a CropImages, a CropTable with images, or a tensor."""
    from shortcutlab.data.images import CropImages, load_crops
    from shortcutlab.data.table import CropTable

    if isinstance(crops, CropTable):
        crops = load_crops(crops)
    if isinstance(crops, CropImages):
        return crops.images, crops.masks, [str(i) for i in crops.table.ids]
    if isinstance(crops, torch.Tensor):
        if crops.ndim != 4 or crops.shape[1] != 3:
            hint = " (channels-last? use crops.permute(0, 3, 1, 2))" if crops.ndim == 4 and crops.shape[-1] == 3 else ""
            raise DiagnosticError(f"crops must be a (N, 3, H, W) tensor; got shape {tuple(crops.shape)}{hint}")
        if crops.dtype != torch.uint8 and not crops.is_floating_point():
            raise DiagnosticError(f"crops must be uint8 (0-255) or float in [0, 1]; got dtype {crops.dtype}")
        return crops, None, None
    raise DiagnosticError(f"crops must be CropImages, a CropTable with an image column, or a (N, 3, H, W) tensor; got {type(crops).__name__}")


def _check_index(index, n: int) -> np.ndarray | None:
    """`index` as int64 row positions in [0, n) (a boolean mask of length n is accepted)."""
    if index is None:
        return None
    idx = np.asarray(index)
    if idx.dtype == bool:
        if idx.shape != (n,):
            raise DiagnosticError(f"index as a boolean mask must have one entry per crop, shape ({n},); got {idx.shape}")
        return np.flatnonzero(idx)
    if idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
        raise DiagnosticError(f"index must be a 1-D array of row positions (or a boolean mask); got shape {idx.shape}, dtype {idx.dtype}")
    idx = idx.astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise DiagnosticError(f"index must hold row positions in [0, {n}); got values in [{idx.min()}, {idx.max()}]")
    return idx


def _batch(images: torch.Tensor, idx: torch.Tensor, device) -> torch.Tensor:
    x = images[idx].to(device)
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x


def _adapter_fingerprint(adapter) -> bytes:
    """What else than the weights changes an adapter's features: normalisation and source."""
    h = hashlib.sha256()
    for t in (adapter.mean, adapter.std):
        h.update(t.detach().cpu().to(torch.float64).contiguous().numpy().tobytes())
    h.update(adapter.extra_repr().encode())
    return h.digest()


def cache_key(model: torch.nn.Module, images: torch.Tensor, ids, masks=None, transform_key: str | None = None) -> str:
    """The cache key of one model x crop set x transform (see the module docstring).

    Args:
        model: a `ModelAdapter` (its model's weights, normalisation and feature source) or a
            plain module (its weights).
        images: (N, 3, H, W) crops.
        ids: crop ids or None.
        masks: (N, 1, H, W) masks, hashed with a transform only.
        transform_key: the transform's name, or None.
    """
    from shortcutlab.models.adapter import ModelAdapter

    h = hashlib.sha256()
    if isinstance(model, ModelAdapter):
        h.update(weights_hash(model.model).encode())
        h.update(_adapter_fingerprint(model))
    else:
        h.update(weights_hash(model).encode())
    h.update(f"|{tuple(images.shape)}|{images.dtype}|".encode())
    h.update(hashlib.sha256(images.detach().cpu().contiguous().numpy().tobytes()).digest())
    if ids is not None:
        h.update("\x1f".join(ids).encode())
    if transform_key:
        h.update(f"|transform={transform_key}|".encode())
        if masks is not None:
            h.update(hashlib.sha256(masks.detach().cpu().contiguous().numpy().tobytes()).digest())
    return h.hexdigest()


def _load_cached(path: str) -> np.ndarray:
    """The (N, D) float features of a cache file, or a `DiagnosticError` naming the file and the
    way out when it cannot be read as one (truncated, overwritten, not a .npy file)."""
    why = None
    try:
        feats = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        why = f"{type(e).__name__}: {e}".splitlines()[0]
    else:
        if not isinstance(feats, np.ndarray) or feats.ndim != 2 or not np.issubdtype(feats.dtype, np.floating):
            why = f"it holds {getattr(feats, 'dtype', type(feats).__name__)} of shape {getattr(feats, 'shape', '?')}, not (N, D) float features"
    if why is not None:
        raise DiagnosticError(
            f"feature cache file {path} is corrupt ({why}); delete it (it is recomputed), "
            "or run without the cache (shortcutlab diagnose --no-cache; cache_dir=None)"
        )
    return feats


def extract_features(
    adapter,
    crops,
    *,
    index: np.ndarray | None = None,
    batch_size: int = 256,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = False,
    transform: Callable | None = None,
    transform_key: str | None = None,
) -> np.ndarray:
    """(N, D) float32 pooled features of every crop (or of `index`), computed in eval mode.

    Args:
        adapter: a `ModelAdapter` (or a model `shortcutlab.wrap` can wrap as it is).
        crops: `CropImages`, a `CropTable` with an image column, or a (N, 3, H, W) tensor
            (uint8 0-255 or float in [0, 1]).
        index: rows to compute (default all); the cache always covers all rows.
        batch_size: crops per forward pass.
        cache_dir: folder for ``<key>.npy`` files (None: no disk cache).
        progress: show a tqdm progress bar.
        transform: optional ``fn(x, mask) -> x`` applied to each float batch first.
        transform_key: the transform's name in the cache key (required with a cache and a
            transform).

    Returns:
        float32 numpy array (N, D), rows aligned with the crops (or with `index`).
    """
    from tqdm.auto import tqdm

    from shortcutlab.models.adapter import ModelAdapter, wrap

    if not isinstance(adapter, ModelAdapter):
        adapter = wrap(adapter)
    if int(batch_size) < 1:
        raise DiagnosticError(f"batch_size must be >= 1; got {batch_size}")
    images, masks, ids = _as_images(crops)
    index = _check_index(index, images.shape[0])
    if transform is not None and cache_dir is not None and not transform_key:
        raise DiagnosticError("a feature cache with a transform needs transform_key= naming it")
    path = None
    if cache_dir is not None:
        key = cache_key(adapter, images, ids, masks, transform_key if transform is not None else None)
        path = os.path.join(os.fspath(cache_dir), f"{key}.npy")
        if os.path.exists(path):
            feats = _load_cached(path)
            if feats.shape[0] == images.shape[0]:
                return feats if index is None else feats[np.asarray(index)]
    rows = np.arange(images.shape[0]) if (index is None or path is not None) else np.asarray(index)
    device = adapter.device
    out = []
    with eval_mode(adapter), torch.no_grad():  # every module's mode restored exactly afterwards
        for b in tqdm(range(0, len(rows), batch_size), desc="features", disable=not progress, leave=False):
            idx = torch.from_numpy(rows[b : b + batch_size])
            x = _batch(images, idx, device).to(adapter.dtype)
            if transform is not None:
                m = None if masks is None else masks[idx].to(device=device, dtype=x.dtype)
                x = transform(x, m)
            out.append(adapter.features(x).float().cpu())
    d = adapter.num_features
    feats = torch.cat(out).numpy() if out else np.zeros((0, d), dtype=np.float32)
    if path is not None:
        from shortcutlab.io import atomic_path

        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.save(f, feats)
        return feats if index is None else feats[np.asarray(index)]
    return feats
