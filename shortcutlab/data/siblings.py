"""Pixel siblings: test images that are flipped, rotated or re-exposed copies of training images.

Reference 002's check, which needs no parent labels: augmenting a small set of acquisitions
and then splitting the augmented pool puts copies of one source image on both sides. For every
test image this module finds its nearest training image under a perceptual hash that does not
change under the eight flips and right-angle rotations (the dihedral group D4), and counts the
test images whose nearest training image lies within a Hamming threshold: the sibling share.

**Hash.** `dihedral_hashes` computes ``imagehash.phash`` bit for bit, vectorised: 8-bit grey
(Pillow's ITU-R 601-2 luma in fixed point), Pillow's Lanczos resize to 32 x 32 in its 22-bit
fixed-point arithmetic (two passes, horizontal first, rounded to 8 bits in between), the 2-D
DCT-II, the 8 x 8 lowest frequencies, each bit "coefficient above their median". The median
rule makes the hash invariant to a brightness scale and to contrast (up to clipping) and the
32-pixel low-pass to blur and JPEG artefacts. The eight transforms come from the DCT, not from
eight resizes: flipping rows (columns) multiplies coefficient (u, v) by (-1)^u ((-1)^v), and
Pillow's resize commutes with flips exactly (its kernels are mirror-symmetric), so flips cost
nothing; the four transforms that transpose the image take one more resize (of the transposed
image), because Pillow's rounding between its two passes does not commute with transposition.
Each of the eight columns is then exactly ``imagehash.phash`` of the transformed image (tested).

**Linking.** A test image t and a training image r are siblings when
``min_g d(h(t), h(g r)) <= threshold`` over the eight transforms g: every training image enters
the multi-index of `shortcutlab.data.dedup` eight times (`near_duplicates_between`), so the search
never compares all pairs.

**Confirmation.** A hash candidate counts as a sibling only when the fine detail of the
aligned pair correlates (`detail_correlation` >= `DEFAULT_CONFIRM`, the best of every
candidate under every transform): the 8 x 8 hash links look-alike distinct crops, the detail
does not.

**Threshold.** `DEFAULT_THRESHOLD` was chosen on the synthetic benchmark (`calibrate_threshold`
in `shortcutlab.studies.sibling_calibration` reproduces it): see its docstring for the rule and
the distributions.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> from scipy.ndimage import gaussian_filter
    >>> train = (gaussian_filter(rng.random((4, 64, 64)), (0, 4, 4)) * 255 / 0.6).clip(0, 255).astype(np.uint8)
    >>> test = np.stack([np.rot90(train[2]), 255 - train[0]])
    >>> res = find_siblings(train, test)
    >>> res.share, res.nearest.tolist(), [TRANSFORMS[g] for g in res.transform[:1]]
    (0.5, [2, -1], ['rot270'])
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from shortcutlab.errors import ShortcutlabError

__all__ = [
    "DEFAULT_CONFIRM",
    "DEFAULT_THRESHOLD",
    "SiblingError",
    "SiblingResult",
    "TRANSFORMS",
    "apply_transform",
    "detail_correlation",
    "dihedral_hashes",
    "find_siblings",
    "phash_images",
]

TRANSFORMS: tuple[str, ...] = ("identity", "rot90", "rot180", "rot270", "flip_lr", "flip_ud", "transpose", "antitranspose")
"""The eight dihedral transforms, in the column order of `dihedral_hashes` (numpy semantics:
``rot90`` is ``np.rot90(x)``, counter-clockwise; ``flip_lr`` mirrors columns)."""

DEFAULT_THRESHOLD = 6
"""Hamming threshold (bits) used when none is given, chosen by `calibrate_threshold()` (seeds 0
and 1 pooled: 10,956 augmented copies, 903 distinct crops). Pooled precision / recall by
threshold: 2 bits 0.9998 / 0.965, 4 bits 0.998 / 0.988, **6 bits 0.991 / 0.994**, 8 bits 0.976 /
0.996, 10 bits 0.952 / 0.996. Dihedral copies are all at 0 bits; blur sigma 1 and brightness
x0.8 within 4; JPEG 75 within 6; brightness x1.2 (backgrounds clip at 255) and the combined
augmentation have tails to 14+ bits (the 0.4% the threshold misses). Distinct crops of the
benchmark look alike at 8 x 8 DCT resolution (a centred cell on a bright field): 85 of 903
found a training crop within 6 bits. Held out (seed 2): precision 0.993, recall 0.996; with
``ssim_min=0.7`` precision 0.999 at the same recall."""

DEFAULT_CONFIRM = 0.97
"""Detail correlation (`detail_correlation`) a hash candidate needs to count as a sibling when
none is given. The 64-bit pHash sees an 8 x 8 DCT of a 32 x 32 thumbnail: distinct crops of
one kind (a centred cell on a bright field) collide within 6 bits often; on the demo's 32 px
benchmark 133 of 175 test crops of fields never trained on had a hash candidate, and SSIM does
not separate them (their aligned SSIM reached 0.94, above blurred copies). A band of their
detail does: the grey image's difference of Gaussian blurs of sigma 0.7 and 2.0 px per 32 px
of the shorter side (`detail_band`), finer than the hash sees and coarser than JPEG's and a
light blur's changes, correlated over the pixels neither image clips. Measured on the
synthetic benchmark (copies of training crops against every crop of held-out fields):
- 32 px (the demo's size; colour, 30 fields per class, seeds 0-4 pooled, 834 distinct crops):
  0 false links at 0.97 (2 at 0.96, 7 at 0.95); recall 1.0 on JPEG 90, 0.985 on JPEG 75,
  0.995 on brightness x1.2, 0 on a Gaussian blur of sigma 1 px (a third of the cell's radius).
- 64 px, held out (`calibration_set(2)`): 0 of 435 distinct crops linked (33 unconfirmed);
  recall 1.0 on flips, rotations, brightness x0.8, blur sigma 1, JPEG 75 and JPEG 90, 0.972
  on brightness x1.2, 0.983 on all at once.
A high-pass detail (grey minus a blur of sigma 1.5 px, tried first) separated distinct crops
as well but confirmed only about a third of JPEG 90 copies. Give ``confirm=None``
(``--no-confirm``) to count every hash candidate, or a lower `confirm`, when heavier
augmentations are expected, at the price of look-alike links."""

_DETAIL_BAND = (0.7, 2.0)  # px at 32 px (the hash's thumbnail side), scaled with the image: the band compared
_HASH = 8  # hash side: 8 x 8 = 64 bits
_SIZE = 32  # imagehash's img_size = hash_size * highfreq_factor
_PRECISION_BITS = 32 - 8 - 2  # Pillow's Resample.c, 8 bits per channel
_CHUNK = 2048  # images resized at once (float64 temporaries ~ 70 MB at 64 x 64)
_SEARCH_PAIRS = 1 << 15  # candidate pairs checked at once: a few MB of temporaries (dedup's default,
# 2**20, held 100 MB, more than all else the command keeps at 20,000 images), no slower


class SiblingError(ShortcutlabError):
    """Bad input to the sibling check (images, folders, manifests, threshold)."""


# ---------------------------------------------------------------------------- transforms
def apply_transform(image: np.ndarray, g: int | str) -> np.ndarray:
    """Apply dihedral transform `g` (index into `TRANSFORMS` or its name) to an (H, W[, C]) image."""
    k = TRANSFORMS.index(g) if isinstance(g, str) else int(g)
    x = np.asarray(image)
    out = {
        0: lambda: x,
        1: lambda: np.rot90(x, 1),
        2: lambda: np.rot90(x, 2),
        3: lambda: np.rot90(x, 3),
        4: lambda: x[:, ::-1],
        5: lambda: x[::-1, :],
        6: lambda: np.swapaxes(x, 0, 1),
        7: lambda: np.swapaxes(x[::-1, ::-1], 0, 1),
    }[k]()
    return np.ascontiguousarray(out)


def inverse_transform(g: int) -> int:
    """Index of the transform that undoes `g` (rot90 and rot270 swap; the rest are involutions)."""
    return {1: 3, 3: 1}.get(int(g), int(g))


# ---------------------------------------------------------------------------- Pillow's resize
def _lanczos(x: np.ndarray) -> np.ndarray:
    out = np.sinc(x) * np.sinc(x / 3.0)
    return np.where((x >= -3.0) & (x < 3.0), out, 0.0)


def _resize_matrix(in_size: int, out_size: int = _SIZE) -> np.ndarray:
    """(out, in) fixed-point Lanczos weights of Pillow's ``precompute_coeffs`` +
    ``normalize_coeffs_8bpc`` (integers held as float64, exact)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 3.0 * filterscale
    w = np.zeros((out_size, in_size))
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size)
        x = np.arange(xmin, xmax)
        k = _lanczos((x - center + 0.5) * (1.0 / filterscale))  # Pillow multiplies by ss = 1 / filterscale
        total = k.sum()
        if total != 0.0:
            k = k / total
        w[xx, xmin:xmax] = k
    scaled = w * (1 << _PRECISION_BITS)
    # C's (int)(v + 0.5) for v >= 0 and (int)(v - 0.5) for v < 0: truncation toward zero.
    return np.trunc(np.where(scaled < 0, scaled - 0.5, scaled + 0.5))


_MATRICES: dict[int, np.ndarray] = {}


def _matrix(n: int) -> np.ndarray:
    if n not in _MATRICES:
        _MATRICES[n] = _resize_matrix(n)
    return _MATRICES[n]


def _clip8(acc: np.ndarray) -> np.ndarray:
    """In place: Pillow's ``clip8(2**21 + acc)``: 0 if <= 0, 255 if >= 2**30, else >> 22."""
    acc += float(1 << (_PRECISION_BITS - 1))
    acc *= 1.0 / (1 << _PRECISION_BITS)  # a power of two: exact
    np.floor(acc, out=acc)
    return np.clip(acc, 0.0, 255.0, out=acc)


def _vertical_first(h: int, w: int) -> bool:
    """Whether Pillow 13 runs the vertical pass first for an (h, w) -> (32, 32) resize.

    Found by comparing both orders with Pillow on every shape from 3 to 160 pixels a side (and
    random shapes up to 300): vertical first exactly when h > 32 and 2 w < h + 32. Square
    images always go horizontal first. The order matters because of the rounding between the
    passes.
    """
    return h > _SIZE and w != _SIZE and 2 * w < h + _SIZE


def _resize32(grey: np.ndarray, transposed: bool = False) -> np.ndarray:
    """(N, H, W) grey levels -> (N, 32, 32) float64 holding Pillow's 8-bit LANCZOS resize.

    Pillow resizes in two passes and rounds to 8 bits in between. With `transposed` the result
    is that of the transposed image, transposed back (the image's passes swap roles).
    """
    n, h, w = grey.shape
    x = grey if grey.dtype == np.float64 else grey.astype(np.float64)

    def along_w(a):
        return a if a.shape[2] == _SIZE else _clip8(a @ _matrix(a.shape[2]).T)

    def along_h(a):
        return a if a.shape[1] == _SIZE else _clip8(_matrix(a.shape[1]) @ a)

    vertical = _vertical_first(w, h) if transposed else _vertical_first(h, w)
    # "vertical" is relative to the image Pillow sees (x.T when transposed), i.e. along our w.
    first_h = vertical != transposed
    return along_w(along_h(x)) if first_h else along_h(along_w(x))


def _grey(images: np.ndarray) -> np.ndarray:
    """Pillow's ``convert('L')``, (R*19595 + G*38470 + B*7471 + 0x8000) >> 16, as float64.

    The weighted sum stays below 2**24, so float32 holds it exactly (and runs ~8x faster than
    integer arithmetic in numpy).
    """
    if images.ndim == 3:
        return images.astype(np.float64)
    f = images[..., 0] * np.float32(19595)
    f += images[..., 1] * np.float32(38470)
    f += images[..., 2] * np.float32(7471)
    f += np.float32(0x8000)
    f *= np.float32(1.0 / 65536)
    return np.floor(f, out=f).astype(np.float64)


# ---------------------------------------------------------------------------- hashes
_SIGN = (-1.0) ** np.arange(_HASH)
_BIT_WEIGHTS = (np.uint64(1) << np.arange(63, -1, -1, dtype=np.uint64)).reshape(_HASH, _HASH)


def _lowfreq(grey: np.ndarray, transposed: bool = False) -> np.ndarray:
    """(N, 8, 8) lowest DCT-II coefficients of the resized images, as imagehash computes them
    (with `transposed`: of the transposed images)."""
    r = _resize32(grey, transposed)
    if transposed:
        r = np.swapaxes(r, 1, 2)
    return _dct_lowfreq(r)


def _dct_lowfreq(thumbs: np.ndarray) -> np.ndarray:
    """(N, 32, 32) resized grey levels -> (N, 8, 8) lowest DCT-II coefficients (imagehash's)."""
    import scipy.fftpack  # imagehash's own DCT, so that median ties fall the same way

    r = thumbs if thumbs.dtype == np.float64 else thumbs.astype(np.float64)
    return scipy.fftpack.dct(scipy.fftpack.dct(r, axis=1), axis=2)[:, :_HASH, :_HASH]


def _pack(low: np.ndarray) -> np.ndarray:
    """(..., 8, 8) coefficients -> (...) uint64: bit 63 - (8 u + v) is 'coefficient > median'."""
    flat = low.reshape(*low.shape[:-2], _HASH * _HASH)
    med = np.median(flat, axis=-1, keepdims=True)
    bits = (flat > med).reshape(low.shape)
    return np.bitwise_or.reduce(np.where(bits, _BIT_WEIGHTS, np.uint64(0)), axis=(-2, -1))


def _as_batches(images) -> list[tuple[np.ndarray, np.ndarray]]:
    """(positions, stacked images) per image shape; accepts an array or a list of arrays."""
    if isinstance(images, np.ndarray) or hasattr(images, "numpy"):
        arr = np.asarray(images.numpy() if hasattr(images, "numpy") else images)
        if hasattr(images, "numpy") and arr.ndim == 4 and arr.shape[1] in (1, 3):
            arr = np.moveaxis(arr, 1, -1)  # torch crops are (N, C, H, W)
            if arr.shape[-1] == 1:
                arr = arr[..., 0]
        _check_stack(arr)
        return [(np.arange(len(arr)), arr)]
    items = [np.asarray(a) for a in images]
    groups: dict[tuple, list[int]] = {}
    for pos, a in enumerate(items):
        if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (3, 4)):
            raise SiblingError(f"image {pos} must be (H, W) grey or (H, W, 3) RGB; got shape {a.shape}")
        groups.setdefault(a.shape, []).append(pos)
    return [(np.array(p), np.stack([items[i] for i in p])) for p in groups.values()]


def _check_stack(arr: np.ndarray) -> None:
    if arr.ndim not in (3, 4) or (arr.ndim == 4 and arr.shape[3] not in (3, 4)):
        raise SiblingError(
            f"images must be (N, H, W) grey or (N, H, W, 3) RGB uint8 (or a (N, 3, H, W) torch tensor); got shape {arr.shape}"
        )
    if arr.dtype != np.uint8:
        raise SiblingError(f"images must be uint8 (0-255); got dtype {arr.dtype}")
    if arr.shape[1] < 1 or arr.shape[2] < 1:
        raise SiblingError(f"images have no pixels: shape {arr.shape}")


def _hash_all(images, variants: bool) -> np.ndarray:
    batches = _as_batches(images)
    n = sum(len(p) for p, _ in batches)
    out = np.zeros((n, 8 if variants else 1), dtype=np.uint64)
    for pos, arr in batches:
        _check_stack(arr)
        for lo in range(0, len(arr), _CHUNK):
            grey = _grey(arr[lo : lo + _CHUNK])
            low = _lowfreq(grey)
            rows = pos[lo : lo + _CHUNK]
            if not variants:
                out[rows, 0] = _pack(low)
                continue
            out[rows] = _pack_variants(low, _lowfreq(grey, transposed=True))
    return out


def _pack_variants(low: np.ndarray, low_t: np.ndarray) -> np.ndarray:
    """(N, 8) hashes in `TRANSFORMS` order from the (N, 8, 8) low frequencies of the images
    (`low`) and of their transposes (`low_t`): flipping rows (columns) multiplies coefficient
    (u, v) by (-1)^u ((-1)^v)."""
    su, sv = _SIGN[:, None], _SIGN[None, :]
    stack = np.stack(
        [
            low,  # identity
            low_t * su,  # rot90 = flip_ud(x.T)
            low * (su * sv),  # rot180
            low_t * sv,  # rot270 = flip_lr(x.T)
            low * sv,  # flip_lr
            low * su,  # flip_ud
            low_t,  # transpose
            low_t * (su * sv),  # antitranspose = rot180(x.T)
        ],
        axis=1,
    )
    return _pack(stack)


def phash_images(images) -> np.ndarray:
    """``imagehash.phash`` of each image, bit for bit, packed as in `dedup.perceptual_hashes`.

    Args:
        images: (N, H, W, 3) RGB or (N, H, W) grey uint8 array, a (N, 3, H, W) uint8 torch
            tensor, or a list of such single images of any sizes.

    Returns:
        (N,) uint64.
    """
    return _hash_all(images, variants=False)[:, 0]


def dihedral_hashes(images) -> np.ndarray:
    """The 64-bit pHash of each image under each of the eight dihedral transforms.

    Column g equals ``imagehash.phash(PIL.Image.fromarray(apply_transform(image, g)))`` packed
    into 64 bits (most significant bit = first grid cell), for every g.

    Args:
        images: as in `phash_images`.

    Returns:
        (N, 8) uint64, columns in the order of `TRANSFORMS`.

    Raises:
        SiblingError: wrong shape or dtype.
    """
    return _hash_all(images, variants=True)


# ---------------------------------------------------------------------------- search
@dataclass(frozen=True, eq=False)
class SiblingResult:
    """Outcome of `find_siblings` / `search_hashes`, one entry per test image.

    Attributes:
        threshold: Hamming threshold in bits.
        nearest: (T,) int64 index of the nearest training image within `threshold`, -1 if none.
        distance: (T,) int64 its distance in bits (min over the eight transforms), -1 if none.
        transform: (T,) int64 index into `TRANSFORMS` of the g with
            ``h(apply_transform(test, g))`` nearest to the training image's hash, -1 if none.
        n_siblings: (T,) int64 distinct training images within `threshold`.
        n_train: training images searched.
        ssim: (T,) float64 SSIM of the aligned nearest pair (NaN where not computed), or None.
        ssim_min: SSIM a hash sibling needs to count (`--ssim`), or None.
        detail: (T,) float64 detail correlation of the aligned nearest pair (NaN where not
            computed or where an image has no detail), or None.
        confirm: detail correlation a hash sibling needs to count, or None.
    """

    threshold: int
    nearest: np.ndarray
    distance: np.ndarray
    transform: np.ndarray
    n_siblings: np.ndarray
    n_train: int
    ssim: np.ndarray | None = None
    ssim_min: float | None = None
    detail: np.ndarray | None = None
    confirm: float | None = None

    @property
    def is_sibling(self) -> np.ndarray:
        """(T,) bool: a training image within the threshold (and SSIM >= ssim_min, detail
        correlation >= confirm when asked; NaN fails)."""
        ok = self.nearest >= 0
        if self.ssim_min is not None and self.ssim is not None:
            ok = ok & (self.ssim >= self.ssim_min)
        if self.confirm is not None and self.detail is not None:
            ok = ok & (self.detail >= self.confirm)
        return ok

    @property
    def share(self) -> float:
        """Share of test images with a training sibling (NaN without test images)."""
        return float(self.is_sibling.mean()) if len(self.nearest) else float("nan")

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(test, train) index pairs of the siblings, closest first (ties by test index)."""
        test = np.flatnonzero(self.is_sibling)
        test = test[np.lexsort((test, self.distance[test]))]
        return test, self.nearest[test]


def check_threshold(threshold) -> int:
    """The threshold as an int in 0..32 bits, or a one-line `SiblingError`."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, np.integer)):
        raise SiblingError(f"threshold must be an integer number of bits in 0..32; got {threshold!r}")
    if not 0 <= int(threshold) <= 32:
        raise SiblingError(f"threshold must be between 0 and 32 bits (of 64); got {int(threshold)}")
    return int(threshold)


def search_hashes(train_hashes: np.ndarray, test_variants: np.ndarray, threshold: int = DEFAULT_THRESHOLD) -> SiblingResult:
    """Nearest training hash of every test image under the eight transforms, within `threshold`.

    Args:
        train_hashes: (R,) uint64 pHashes of the training images (`phash_images`).
        test_variants: (T, 8) uint64 dihedral hashes of the test images (`dihedral_hashes`).
        threshold: Hamming threshold in bits.

    Returns:
        A `SiblingResult` without SSIM. Ties: smallest distance, then smallest training index,
        then transform order.
    """
    from shortcutlab.data.dedup import near_duplicate_batches_between

    t = check_threshold(threshold)
    train_hashes = np.asarray(train_hashes, dtype=np.uint64).reshape(-1)
    test_variants = np.asarray(test_variants, dtype=np.uint64)
    n_test, k = test_variants.shape
    n_train = len(train_hashes)
    sentinel = np.iinfo(np.int64).max
    best = np.full(n_test, sentinel, dtype=np.int64)
    pair_keys = []
    for i8, j, d in near_duplicate_batches_between(test_variants.ravel(), train_hashes, t, batch_pairs=_SEARCH_PAIRS):
        i, g = i8 // k, i8 % k
        np.minimum.at(best, i, (d * n_train + j) * k + g)
        pair_keys.append(np.unique(i * n_train + j))
    found = best != sentinel
    nearest = np.where(found, (best // k) % max(n_train, 1), -1)
    distance = np.where(found, best // k // max(n_train, 1), -1)
    transform = np.where(found, best % k, -1)
    if pair_keys:
        uniq = np.unique(np.concatenate(pair_keys))
        n_sib = np.bincount(uniq // n_train, minlength=n_test).astype(np.int64)
    else:
        n_sib = np.zeros(n_test, dtype=np.int64)
    return SiblingResult(t, nearest, distance, transform, n_sib, n_train)


def _grey_float(image: np.ndarray) -> np.ndarray:
    a = np.asarray(image)
    return _grey(a[None])[0] if a.ndim == 3 else a.astype(np.float64)


def aligned_ssim(test_image: np.ndarray, train_image: np.ndarray, g: int) -> float:
    """SSIM (scikit-image, grey levels, data range 255) of ``apply_transform(test, g)`` and the
    training image; the training image is resized (bilinear) when the sizes differ."""
    from PIL import Image
    from skimage.metrics import structural_similarity

    a = _grey_float(apply_transform(test_image, g))
    b = _grey_float(train_image)
    if a.shape != b.shape:
        b = np.asarray(Image.fromarray(b.astype(np.uint8)).resize(a.shape[::-1], Image.Resampling.BILINEAR), dtype=np.float64)
    win = min(7, min(a.shape) - (1 - min(a.shape) % 2))
    if win < 3:
        return float("nan")
    return float(structural_similarity(a, b, data_range=255.0, win_size=win))


def detail_band(shape: tuple[int, ...]) -> tuple[float, float]:
    """The Gaussian sigmas (px) whose difference is an image's "detail": `_DETAIL_BAND` at 32 px
    (the side of the hash's thumbnail), scaled with the image's shorter side, so that the band
    sits at the same place relative to the crop at every size (at 64 px: 1.4 and 4.0 px)."""
    scale = min(int(shape[0]), int(shape[1])) / _SIZE
    return _DETAIL_BAND[0] * scale, _DETAIL_BAND[1] * scale


def detail_correlation(test_image: np.ndarray, train_image: np.ndarray, g: int) -> float:
    """Pearson correlation of the detail of ``apply_transform(test, g)`` and the training
    image: each grey image (0-255) band-passed by a difference of Gaussian blurs
    (`detail_band`: sigma 0.7 and 2.0 px per 32 px of the shorter side), over the
    pixels where neither image has a channel at 0 or 255 (all pixels when fewer than 5% are
    left). A gain or offset of the brightness leaves it at 1: the pixels it clips are left
    out; distinct crops that only look alike at thumbnail scale decorrelate. The training
    image is resized (bilinear) when the sizes differ. NaN when an image has no detail."""
    from PIL import Image

    a = np.asarray(apply_transform(test_image, g))
    b = np.asarray(train_image)
    if a.shape[:2] != b.shape[:2]:
        b = np.asarray(Image.fromarray(np.asarray(b, dtype=np.uint8)).resize(a.shape[1::-1], Image.Resampling.BILINEAR))
    return _pair(_Detail.of(a), _Detail.of(b))


@dataclass(frozen=True, eq=False)
class _Detail:
    """An image's detail map, its saturated pixels and the detail scaled to unit norm (None
    for a flat image)."""

    d: np.ndarray
    sat: np.ndarray
    unit: np.ndarray | None

    @classmethod
    def of(cls, image: np.ndarray) -> "_Detail":
        from scipy.ndimage import gaussian_filter

        x = np.asarray(image)
        if x.ndim == 3:  # channel by channel: numpy reduces a length-3 last axis ~20x slower
            channels = [x[..., c] for c in range(x.shape[-1])]
            sat = (functools.reduce(np.maximum, channels) >= 255) | (functools.reduce(np.minimum, channels) <= 0)
        else:
            sat = (x >= 255) | (x <= 0)
        grey = _grey_float(x)
        fine, coarse = detail_band(grey.shape)
        d = gaussian_filter(grey, fine, mode="reflect") - gaussian_filter(grey, coarse, mode="reflect")
        return cls(d, sat, _unit(d - d.mean()))

    def transformed(self, g: int) -> "_Detail":
        # the blur commutes with flips and right-angle rotations (reflect mode, isotropic)
        return _Detail(apply_transform(self.d, g), apply_transform(self.sat, g),
                       None if self.unit is None else apply_transform(self.unit, g))


def _pair(a: _Detail, b: _Detail) -> float:
    """`detail_correlation` of two aligned detail maps of one shape."""
    if a.unit is None or b.unit is None:
        return float("nan")
    clipped = a.sat | b.sat
    keep = ~clipped
    if not clipped.any() or keep.sum() < 0.05 * keep.size:
        return float((a.unit * b.unit).sum())
    x, y = a.d[keep], b.d[keep]
    x, y = x - x.mean(), y - y.mean()
    n = float(np.sqrt((x * x).sum() * (y * y).sum()))
    return float((x * y).sum() / n) if n > 1e-12 * x.size else float("nan")


def check_confirm(value) -> float | None:
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise SiblingError(f"--confirm takes a correlation in [-1, 1]; got {value!r}") from None
    if not -1.0 <= v <= 1.0:
        raise SiblingError(f"--confirm takes a correlation in [-1, 1]; got {v}")
    return v


def candidate_pairs(train_hashes: np.ndarray, test_variants: np.ndarray, threshold: int = DEFAULT_THRESHOLD):
    """Every (test i, training j) pair within `threshold` bits under some transform.

    Returns:
        (i, j, d, g) int64 arrays, one entry per pair with its smallest distance d and the
        first transform g reaching it, sorted by (i, d, j).
    """
    from shortcutlab.data.dedup import near_duplicate_batches_between

    t = check_threshold(threshold)
    train_hashes = np.asarray(train_hashes, dtype=np.uint64).reshape(-1)
    test_variants = np.asarray(test_variants, dtype=np.uint64)
    k = test_variants.shape[1]
    parts = [(i8 // k, j, d, i8 % k) for i8, j, d in near_duplicate_batches_between(test_variants.ravel(), train_hashes, t, batch_pairs=_SEARCH_PAIRS)]
    if not parts:
        return tuple(np.zeros(0, dtype=np.int64) for _ in range(4))
    i, j, d, g = (np.concatenate([p[c] for p in parts]).astype(np.int64) for c in range(4))
    order = np.lexsort((g, j, d, i))
    i, j, d, g = i[order], j[order], d[order], g[order]
    # one entry per (i, j): its first occurrence in this order, i.e. its smallest d, then g
    _, keep = np.unique(i * len(train_hashes) + j, return_index=True)
    i, j, d, g = i[keep], j[keep], d[keep], g[keep]
    order = np.lexsort((j, d, i))
    return i[order], j[order], d[order], g[order]


_MAX_CANDIDATES = 256  # candidates of one test image checked, nearest first


_DETAIL_CACHE_BYTES = 16 << 20  # training images' detail maps kept for reuse (~70 KB each at 64 px)


def confirm_candidates(result: SiblingResult, candidates, test_image, train_image, confirm: float = DEFAULT_CONFIRM,
                       workers: int | None = None) -> SiblingResult:
    """Confirm hash candidates by the detail correlation of the aligned pair.

    For each test image its candidates (`candidate_pairs`) are checked nearest first (at most
    `_MAX_CANDIDATES`), each under the eight transforms;
    the most correlated pair becomes its nearest training image, with its transform and the
    pair's hash distance. Many distinct crops can
    share a hash with a copy's source (58 within 0 bits on the 32 px synthetic benchmark), so
    the hash-nearest one need not be the source. The image counts as having a sibling when
    that correlation reaches `confirm`. Images are fetched by index (``test_image(i)``,
    ``train_image(j)``, called from `workers` threads, default `default_workers`), so they need
    not be in memory; at most `_DETAIL_CACHE_BYTES` of training detail maps are kept.
    """
    confirm = check_confirm(confirm)
    ci, cj, cd, cg = candidates
    nearest, distance, transform = result.nearest.copy(), result.distance.copy(), result.transform.copy()
    detail = np.full(len(nearest), np.nan)
    bounds = np.searchsorted(ci, np.arange(len(nearest) + 1))
    cache: dict = {}
    held = [0]

    def train_detail(j):
        got = cache.get(j)
        if got is None:
            got = _Detail.of(train_image(int(j)))
            size = got.d.nbytes + got.sat.nbytes + (0 if got.unit is None else got.unit.nbytes)
            if held[0] + size > _DETAIL_CACHE_BYTES:
                cache.clear()  # a pure function of j: dropping entries changes nothing but time
                held[0] = 0
            cache[j] = got
            held[0] += size
        return got

    def best(i):
        """(candidate position, transform, correlation) of test image i's best pair, or None."""
        det = _Detail.of(test_image(int(i)))
        # every transform, not only the hash's: a near-symmetric crop hashes alike under several
        variants = [det.transformed(g) for g in range(len(TRANSFORMS))]
        ks = np.arange(bounds[i], min(bounds[i + 1], bounds[i] + _MAX_CANDIDATES))
        r = np.full((len(ks), len(TRANSFORMS)), -np.inf)
        for row, k in enumerate(ks):
            b = train_detail(cj[k])
            same = [g for g, v in enumerate(variants) if v.d.shape == b.d.shape]
            if same:
                r[row, same] = [_pair(variants[g], b) for g in same]
            else:  # sizes differ: the hash's transform, the training image resized
                r[row, int(cg[k])] = detail_correlation(test_image(int(i)), train_image(int(cj[k])), int(cg[k]))
        r[~np.isfinite(r)] = -np.inf
        if not np.isfinite(r).any():
            return None
        row, g = np.unravel_index(int(np.argmax(r)), r.shape)  # first maximum: nearest candidate
        return ks[row], g, r[row, g]

    todo = np.flatnonzero(bounds[1:] > bounds[:-1])
    for i, got in zip(todo, map_in_threads(best, todo, workers)):
        if got is not None:
            k, g, value = got
            nearest[i], distance[i], transform[i], detail[i] = cj[k], cd[k], g, value
    return replace(result, nearest=nearest, distance=distance, transform=transform, detail=detail, confirm=confirm)


def _unit(d: np.ndarray) -> np.ndarray | None:
    """The detail map scaled to unit norm (None for a flat image, which has no detail)."""
    n = float(np.sqrt((d * d).sum()))
    return None if n < 1e-6 * d.size else d / n


_TEST_BLOCK = 1 << 15  # test images searched at once: the multi-index over their eight hashes
# costs ~0.9 KB per test image, so a block bounds it (each test image's answer is its own)


def search_confirmed(train_hashes, test_variants, threshold: int, test_image, train_image,
                     confirm: float | None = DEFAULT_CONFIRM) -> SiblingResult:
    """`search_hashes`, then (unless `confirm` is None) `confirm_candidates` over every
    candidate pair; the test images in blocks of `_TEST_BLOCK` (the same result as one block:
    every test image's nearest training image, distance and candidates are its own)."""
    test_variants = np.asarray(test_variants, dtype=np.uint64)
    parts = []
    for lo in range(0, max(len(test_variants), 1), _TEST_BLOCK):
        block = test_variants[lo : lo + _TEST_BLOCK]
        res = search_hashes(train_hashes, block, threshold)
        if confirm is not None:
            res = confirm_candidates(res, candidate_pairs(train_hashes, block, threshold),
                                     lambda i, lo=lo: test_image(i + lo), train_image, confirm)
        parts.append(res)
    if len(parts) == 1:
        return parts[0]
    joined = {name: np.concatenate([getattr(p, name) for p in parts]) for name in ("nearest", "distance", "transform", "n_siblings")}
    if confirm is not None:
        joined["detail"] = np.concatenate([p.detail for p in parts])
    return replace(parts[0], **joined)


def check_ssim_min(value) -> float | None:
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise SiblingError(f"--ssim takes a number in [-1, 1]; got {value!r}") from None
    if not -1.0 <= v <= 1.0:
        raise SiblingError(f"--ssim takes a number in [-1, 1] (an SSIM); got {v}")
    return v


def with_ssim(result: SiblingResult, test_image, train_image, ssim_min: float) -> SiblingResult:
    """Add the SSIM of every hash sibling's aligned pair; images are fetched by index
    (``test_image(i)``, ``train_image(j)``), so they need not all be in memory."""
    ssim_min = check_ssim_min(ssim_min)
    ssim = np.full(len(result.nearest), np.nan)
    for i in np.flatnonzero(result.nearest >= 0):
        ssim[i] = aligned_ssim(test_image(int(i)), train_image(int(result.nearest[i])), int(result.transform[i]))
    return replace(result, ssim=ssim, ssim_min=ssim_min)


def find_siblings(train, test, threshold: int | None = None, ssim_min: float | None = None,
                  confirm: float | None = DEFAULT_CONFIRM) -> SiblingResult:
    """For every test image, its nearest training image under flips, rotations and the pHash.

    Args:
        train: training images: (R, H, W, 3) / (R, H, W) uint8, an (R, 3, H, W) uint8 tensor, or
            a list of images of any sizes.
        test: test images, same forms.
        threshold: Hamming threshold in bits (default `DEFAULT_THRESHOLD`).
        ssim_min: if given, a hash sibling counts only when the SSIM of the aligned pair
            reaches it.
        confirm: a hash sibling counts only when the detail correlation of the aligned pair
            reaches it (default `DEFAULT_CONFIRM`; None counts every hash candidate).

    Returns:
        A `SiblingResult`.
    """
    t = DEFAULT_THRESHOLD if threshold is None else check_threshold(threshold)
    confirm = check_confirm(confirm)
    get_test, get_train = _getter(test), _getter(train)
    res = search_confirmed(phash_images(train), dihedral_hashes(test), t, get_test, get_train, confirm)
    if ssim_min is not None:
        res = with_ssim(res, get_test, get_train, ssim_min)
    return res


def _getter(images):
    if hasattr(images, "numpy") and not isinstance(images, np.ndarray):
        arr = images.numpy()
        if arr.ndim == 4 and arr.shape[1] in (1, 3):
            arr = np.moveaxis(arr, 1, -1)
        return lambda i: arr[i]
    return lambda i: np.asarray(images[i])


# ---------------------------------------------------------------------------- inputs
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")


@dataclass(frozen=True, eq=False)
class ImageSet:
    """Images named by id, read lazily from `paths`."""

    ids: list
    paths: list
    source: str

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, k: int) -> np.ndarray:
        return read_image(self.paths[k], self.ids[k])


def read_image(path: str, image_id: str) -> np.ndarray:
    """(H, W, 3) uint8 pixels of one image file (16-bit grey scaled as `data.load_crops`)."""
    from shortcutlab.data.image_files import read_crop
    from shortcutlab.paths import need_file

    need_file(path, "image file", SiblingError, f" (id {image_id!r})")
    return read_crop(path, image_id)


def images_in_folder(folder: str) -> ImageSet:
    """Every image file under `folder`, recursively (png, jpg, tif, bmp), ids = relative paths."""
    from shortcutlab.paths import need_folder

    need_folder(folder, "image folder", SiblingError)
    found, ids = [], []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        rel = os.path.relpath(root, folder)  # once per folder: per file it cost more than the walk
        for f in sorted(files):
            if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith("."):
                found.append(os.path.join(root, f))
                ids.append(f if rel == os.curdir else os.path.join(rel, f))
    if not found:
        raise SiblingError(f"image folder {folder!r} holds no image files ({', '.join(IMAGE_EXTENSIONS)}, searched recursively)")
    return ImageSet(ids, found, folder)


def _read_csv(path: str):
    import pandas as pd

    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except UnicodeDecodeError:
        raise SiblingError(f"manifest {path!r} is not UTF-8 text") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise SiblingError(f"manifest {path!r} is not a readable CSV: {' '.join(str(e).split())}") from None


def images_in_manifest(path: str, image: str = "path", id: str = "id", frame=None) -> ImageSet:
    """The images of a crop manifest CSV (paths relative to the CSV's folder)."""
    df = _read_csv(path) if frame is None else frame
    if image not in df.columns:
        raise SiblingError(f"manifest {path!r} has no image column {image!r} (--image); its columns are: {', '.join(df.columns)}")
    if len(df) == 0:
        raise SiblingError(f"manifest {path!r} holds no rows")
    root = os.path.dirname(os.path.abspath(path))
    ids = df[id].tolist() if id in df.columns else [str(k) for k in range(len(df))]
    paths = [p if os.path.isabs(p) else os.path.join(root, p) for p in df[image].tolist()]
    return ImageSet(ids, paths, path)


def _is_split_manifest(path: str, image: str) -> bool:
    if not (os.path.isfile(path) and path.lower().endswith(".csv")):
        return False
    cols = _read_csv(path).columns
    return "split" in cols and image not in cols


def resolve_inputs(train: str, test: str | None, image: str = "path", id: str = "id", cell: str | None = None) -> tuple[ImageSet, ImageSet, str]:
    """The training and test images named on the command line, and how they were given.

    ``TRAIN TEST``: two folders or crop manifests. ``SPLIT CROPS`` (either order): a split
    manifest (columns id, split[, cell]) and the crop manifest its ids refer to.
    """
    for p in (train, test):
        if p is not None and not os.path.exists(p):
            raise SiblingError(f"{p!r} does not exist; give an image folder, a crop manifest CSV or a split manifest CSV")
    if test is None:
        raise SiblingError("give TRAIN and TEST (folders or crop manifests), or a split manifest and its crop manifest")
    split_first, split_second = _is_split_manifest(train, image), _is_split_manifest(test, image)
    if split_first or split_second:
        split_path, crops_path = (train, test) if split_first else (test, train)
        if os.path.isdir(crops_path) or _is_split_manifest(crops_path, image):
            raise SiblingError(f"split manifest {split_path!r} needs the crop manifest CSV its ids refer to (with an image column {image!r}); got {crops_path!r}")
        from shortcutlab.data.manifest import SplitManifest

        rows = SplitManifest.read(split_path).cell(cell)
        crops = _read_csv(crops_path)
        if id not in crops.columns:
            raise SiblingError(f"crop manifest {crops_path!r} has no id column {id!r} (--id) to match the split's ids")
        sets = []
        for side in ("train", "test"):
            ids = rows.loc[rows["split"] == side, "id"].tolist()
            if not ids:
                raise SiblingError(f"split manifest {split_path!r} has no {side} side{f' in cell {cell!r}' if cell else ''}; a sibling check needs both")
            sub = crops.set_index(id, drop=False).reindex(ids)
            missing = sub[image].isna()
            if missing.any():
                raise SiblingError(f"split manifest {split_path!r} names ids that are not in {crops_path!r}, e.g. {ids[int(np.flatnonzero(missing)[0])]!r}")
            sets.append(images_in_manifest(crops_path, image, id, frame=sub.reset_index(drop=True)))
        return sets[0], sets[1], "split manifest"

    def one(p):
        return images_in_folder(p) if os.path.isdir(p) else images_in_manifest(p, image, id)

    return one(train), one(test), "folders or manifests"


_FILE_TASK = 64  # images per thread-pool task (a future per image would cost as much as its hash)
_TASK_PIXELS = 1 << 18  # grey pixels a worker resizes at once: float64 temporaries of ~10 MB


def default_workers() -> int:
    """Decoding threads: the cores this process may use, at most 8. Pillow releases the GIL
    while it decodes and converts, and numpy while it multiplies matrices; Python's share of
    the work does not scale."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


def map_in_threads(fn, items, workers: int | None = None) -> list:
    """``[fn(x) for x in items]`` run by `workers` threads (default `default_workers`), in order.

    The first error is raised as soon as its turn comes, and the tasks not yet started are
    cancelled: a bad file early in a million does not wait for the rest to be hashed.
    """
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(default_workers() if workers is None else max(1, int(workers)))
    try:
        out = list(pool.map(fn, items))
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return out


def _hash_files(images: ImageSet, ks: range, variants: bool) -> np.ndarray:
    """(len(ks), 8 or 1) hashes of the files `ks` of `images`, as `dihedral_hashes` /
    `phash_images` of their pixels (`read_image`). Runs in a worker thread.

    Each file is decoded to its grey levels (Pillow's ``convert("L")``, as ``imagehash``
    does); images of one shape are resized together as soon as `_TASK_PIXELS` are waiting,
    so a worker holds a few decoded images at a time, whatever their number and size.
    """
    from shortcutlab.data.image_files import read_grey
    from shortcutlab.paths import need_file

    out = np.zeros((len(ks), 8 if variants else 1), dtype=np.uint64)
    waiting: dict[tuple, list] = {}

    def flush():
        for items in waiting.values():
            rows = [r for r, _ in items]
            grey = np.stack([g for _, g in items]).astype(np.float64)
            low = _lowfreq(grey)
            out[rows] = _pack_variants(low, _lowfreq(grey, transposed=True)) if variants else _pack(low)[:, None]
        waiting.clear()

    held = 0
    for row, k in enumerate(ks):
        path, image_id = images.paths[k], images.ids[k]
        need_file(path, "image file", SiblingError, f" (id {image_id!r})")
        grey = np.asarray(read_grey(path, image_id))
        waiting.setdefault(grey.shape, []).append((row, grey))
        held += grey.size
        if held >= _TASK_PIXELS:
            flush()
            held = 0
    flush()
    return out


def hash_image_set(images: ImageSet, variants: bool, workers: int | None = None) -> np.ndarray:
    """(N,) pHashes or (N, 8) dihedral hashes of an image set's files, streamed.

    Files are decoded and hashed by `workers` threads (default `default_workers`), 64 files
    per task; a worker turns each decoded image into its hashes within a few images, so memory
    holds the hashes and a few decoded images per worker, never the image set. The hashes
    equal `phash_images` / `dihedral_hashes` of `read_image` of every file (tested), which
    equal ``imagehash.phash``. No reduced decoding (Pillow's JPEG draft mode, `Image.reduce`):
    it changes the pixels the 32 x 32 thumbnail is made from, and so the hash's bits.
    """
    n = len(images)
    tasks = [range(a, min(a + _FILE_TASK, n)) for a in range(0, n, _FILE_TASK)]
    parts = map_in_threads(lambda ks: _hash_files(images, ks, variants), tasks, workers)
    out = np.concatenate(parts) if parts else np.zeros((0, 8 if variants else 1), dtype=np.uint64)
    return out if variants else out[:, 0]


def _same_images(a: ImageSet, b: ImageSet) -> bool:
    """True when both sides name the same image files (compared by real path)."""
    if len(a) != len(b) or not len(a):
        return False
    return sorted(os.path.realpath(p) for p in a.paths) == sorted(os.path.realpath(p) for p in b.paths)


# ---------------------------------------------------------------------------- contact sheet
def contact_sheet(pairs: Sequence[tuple[np.ndarray, np.ndarray, str]], path: str, *, tile: int = 96, columns: int = 4, title: str = "") -> None:
    """Write a PNG of image pairs side by side (test | training), each with a caption; atomic.

    Args:
        pairs: (test image, training image, caption) triples, (H, W, 3) uint8.
        path: output PNG.
        tile: side of each image tile in pixels (nearest-neighbour scaling).
        columns: pairs per row.
        title: a line above the grid.
    """
    from PIL import Image, ImageDraw

    from shortcutlab.io import atomic_path

    cap, head, gap = 14, 18, 6
    rows = max(1, math.ceil(len(pairs) / columns))
    width = columns * (2 * tile + gap) + gap
    height = head + rows * (tile + cap + gap) + gap
    sheet = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(sheet)
    draw.text((gap, 3), title or ("no pairs to show" if not pairs else ""), fill="black")
    for k, (a, b, caption) in enumerate(pairs):
        r, c = divmod(k, columns)
        x0, y0 = gap + c * (2 * tile + gap), head + r * (tile + cap + gap)
        for off, img in ((0, a), (tile, b)):
            im = Image.fromarray(np.asarray(img, dtype=np.uint8)).convert("RGB").resize((tile, tile), Image.Resampling.NEAREST)
            sheet.paste(im, (x0 + off, y0))
        draw.text((x0, y0 + tile + 1), caption, fill="black")
    with atomic_path(path) as tmp:
        sheet.save(tmp, format="PNG")


def run(train: str, test: str | None, out: str, *, threshold: int | None = None, ssim_min: float | None = None,
        image: str = "path", id: str = "id", cell: str | None = None, n_sheet: int = 24,
        confirm: float | None = DEFAULT_CONFIRM) -> dict:
    """The `shortcutlab siblings` command: search, confirm each hash candidate by the detail
    correlation of the aligned pair (`confirm`, None: not confirmed), then write siblings.csv,
    siblings.json and contact_sheet.png into `out` (all three or none). Returns the JSON
    summary.

    Warns:
        SplitWarning: the training and test sides are the same images (every image is its
            own sibling), recorded as ``summary["same_images"]``. (A side without images is
            refused.)
    """
    import time

    from shortcutlab.io import atomic_files, to_json
    from shortcutlab.errors import SplitWarning

    t = DEFAULT_THRESHOLD if threshold is None else check_threshold(threshold)
    ssim_min = check_ssim_min(ssim_min)
    confirm = check_confirm(confirm)
    if isinstance(n_sheet, bool) or not isinstance(n_sheet, (int, np.integer)) or n_sheet < 0:
        raise SiblingError(f"--pairs takes the number of pairs on the contact sheet, an integer >= 0; got {n_sheet!r}")
    start = time.perf_counter()
    tr, te, given_as = resolve_inputs(train, test, image, id, cell)
    same = _same_images(tr, te)
    if same:
        warnings.warn(f"the training and test images are the same {len(te)} images ({train!r}, {test!r}): every test image is "
                      "its own training sibling; give the training side as TRAIN and the held-out side as TEST", SplitWarning, stacklevel=2)
    res = search_confirmed(hash_image_set(tr, False), hash_image_set(te, True), t, te.read, tr.read, confirm)
    if ssim_min is not None:
        res = with_ssim(res, te.read, tr.read, ssim_min)
    seconds = time.perf_counter() - start
    found = res.nearest >= 0
    by_transform = {TRANSFORMS[g]: int(((res.transform == g) & res.is_sibling).sum()) for g in range(8)}
    summary = {
        "share": res.share,
        "n_test": len(te), "n_train": len(tr), "n_with_sibling": int(res.is_sibling.sum()),
        "n_hash_siblings": int(found.sum()),
        "threshold": t,
        "threshold_source": "--threshold" if threshold is not None else
            "default: max min(precision, recall) on the synthetic augmentations (shortcutlab.studies.sibling_calibration.calibrate_threshold)",
        "ssim_min": ssim_min,
        "confirm": confirm,
        "confirm_rule": None if confirm is None else
            f"a hash candidate counts when the detail correlation of the aligned pair (grey's difference of Gaussian blurs, sigma {_DETAIL_BAND[0]} and {_DETAIL_BAND[1]} px per 32 px of the shorter side) "
            f"is >= {confirm}" + (" (default)" if confirm == DEFAULT_CONFIRM else ""),
        "same_images": same,
        "by_transform": by_transform,
        "hash": "imagehash.phash (64-bit DCT, 32 x 32 Lanczos grey), test image under 8 dihedral transforms vs training image",
        "inputs": {"train": train, "test": test, "given_as": given_as, "cell": cell},
        "seconds": round(seconds, 3),
    }
    test_idx, train_idx = res.pairs()
    shown = _sheet_pairs(res, tr, te, n_sheet)
    title = f"closest test | training pairs: {len(test_idx)} of {len(te)} test images have a sibling (<= {t} bits)"
    with atomic_files() as stage:
        _write_pairs(res, tr, te, stage.path(os.path.join(out, "siblings.csv")))
        contact_sheet(shown, stage.path(os.path.join(out, "contact_sheet.png")), title=title)
        with open(stage.path(os.path.join(out, "siblings.json")), "w", encoding="utf-8") as f:
            f.write(to_json(summary))
    return summary


PAIRS_COLUMNS = ("test_id", "test_path", "train_id", "train_path", "distance", "transform", "n_train_siblings")
"""siblings.csv's leading columns; ``ssim`` and ``detail_correlation`` follow when computed,
then ``is_sibling``."""


def _pair_rows(res, tr, te):
    """siblings.csv's rows: one per test image with its nearest training image (empty where
    none is within the threshold), distance, transform, sibling count, the confirmation
    figures (rounded to 4 decimals, empty where not computed) and ``is_sibling``."""

    def fig(v):
        return "" if not np.isfinite(v) else float(np.round(v, 4))

    sib = res.is_sibling
    for i in range(len(res.nearest)):
        j = int(res.nearest[i])
        row = [te.ids[i], te.paths[i], tr.ids[j] if j >= 0 else "", tr.paths[j] if j >= 0 else "",
               int(res.distance[i]) if j >= 0 else "", TRANSFORMS[res.transform[i]] if res.transform[i] >= 0 else "",
               int(res.n_siblings[i])]
        if res.ssim is not None:
            row.append(fig(res.ssim[i]))
        if res.detail is not None:
            row.append(fig(res.detail[i]))
        row.append(bool(sib[i]))
        yield row


def _write_pairs(res, tr, te, path: str) -> None:
    """Write siblings.csv row by row (the csv module: no frame of every test image is built)."""
    import csv

    header = list(PAIRS_COLUMNS) + (["ssim"] if res.ssim is not None else []) + (["detail_correlation"] if res.detail is not None else [])
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header + ["is_sibling"])
        w.writerows(_pair_rows(res, tr, te))


def _sheet_pairs(res, tr, te, n_sheet: int) -> list[tuple]:
    """The first `n_sheet` sibling pairs as (test image, training image, caption) for the
    contact sheet."""
    test_idx, train_idx = res.pairs()
    shown = []
    for i, j in zip(test_idx[:n_sheet], train_idx[:n_sheet]):
        cap = (f"d={res.distance[i]} {TRANSFORMS[res.transform[i]]}" + (f" ssim {res.ssim[i]:.2f}" if res.ssim is not None else "")
               + (f" r {res.detail[i]:.2f}" if res.detail is not None else ""))
        shown.append((te.read(int(i)), tr.read(int(j)), cap))
    return shown
