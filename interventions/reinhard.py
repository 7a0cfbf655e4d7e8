"""Reinhard colour transfer in CIELAB, and the paper's F2 target policy (an unseen field).

Formula (Reinhard et al. 2001, in CIELAB as in most stain work): per image and per channel
k in (L*, a*, b*),

    y_k = (x_k - mu_k) / sd_k * sd_tgt_k + mu_tgt_k,

where mu_k and sd_k are the mean and the (population) standard deviation of channel k over
the image's cell pixels (weighted by the mask; all pixels without a mask, or when a crop's
mask is empty: such crops are flagged False in `last_applicable`, and each call warns with
their count) and the transfer is applied to every pixel, background included. Units: CIELAB
with the D65 white and the 2-degree observer, L* in [0, 100], a* and b* roughly in
[-128, 127]; the input is sRGB in [0, 1] (kornia's `rgb_to_lab` convention, itself
scikit-image's `rgb2lab`). The result goes back to sRGB and is clamped to [0, 1], so pixels
pushed out of gamut are clipped and the output's statistics then differ from the target's.
A channel whose spread sd_k is below `FLAT_STD` (0.01 LAB units, in every dtype) counts as
flat and maps to the target mean, whatever float rounding left in it: a white crop stays the
target's mean colour instead of having its rounding noise scaled by 1e5.

Targets are given directly (`target_mean`, `target_std`: 3 LAB values each) or fitted with
`Reinhard().fit(images, masks)`, which pools every cell pixel of the given crops (one field,
say; a crop whose mask is empty has no cell pixel and is skipped and counted). The label-conditioned variant `ReinhardToField` (registered as
``reinhard_unseen_field``) takes per-crop targets ``target_mean=(B, 3)``,
``target_std=(B, 3)`` at call time; `unseen_field_targets` chooses them the way the paper's F2
did (each test crop gets a field of its own class that no compared training cell has seen) and
`field_lab_statistics` / `field_target_tensors` turn the chosen fields into target tensors
(`unseen_field_target_tensors`, which the class's `targets_for` hook returns, does all three).

Speed: kornia's LAB conversion is the bottleneck (on CPU its `rgb_to_lab` + `lab_to_rgb`
alone take longer than torchstain's per-image numpy Reinhard): it evaluates both branches of
every piecewise function with `torch.where` (slow on CPU), allocates a new tensor per step
and materialises LAB. Here the same formulas, constants and knees run branch-free
(``max``/``min`` clamps, in place, in two reused buffers), powers are exp2(p log2 t) (half the
time of float32 `pow`), the statistics come from kornia's intermediate f-space (LAB is an
affine map of f = (f_x, f_y, f_z): the per-image LAB mean and variance come from the mean of
f and the per-pixel LAB deviations T (f - mean), one batched 3 x 3 product and two sums, see
`_lab_moments` for why not from the 3 x 3 covariance of f), the transfer is one batched 3 x 3 affine
map of f, and on CPU the batch goes in chunks of about 128K pixels per thread so the buffers
stay in cache. LAB values equal kornia's `rgb_to_lab` to 1e-12 in float64 and 2e-4 LAB units in
float32, and `tests/test_interventions_reinhard.py` checks this and the whole transfer against
a kornia-built reference.

Example:
    >>> import torch
    >>> x = torch.rand(2, 3, 16, 16)
    >>> y = reinhard(x, target_mean=(60.0, 15.0, -10.0), target_std=(12.0, 6.0, 5.0))
    >>> tuple(y.shape)
    (2, 3, 16, 16)
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from .base import Intervention, InterventionError, InterventionWarning, SplitRequirementError, check_image, check_mask, warn_not_applicable
from .memory import new_output
from .registry import register

# kornia.color constants (translated there from scikit-image): linear sRGB -> XYZ (D65),
# its inverse, and the D65 reference white.
_RGB_TO_XYZ = np.array([[0.412453, 0.357580, 0.180423], [0.212671, 0.715160, 0.072169], [0.019334, 0.119193, 0.950227]])
_XYZ_TO_RGB = np.array(
    [
        [3.2404813432005266, -1.5371515162713185, -0.4985363261688878],
        [-0.9692549499965682, 1.8759900014898907, 0.0415559265582928],
        [0.0556466391351772, -0.2040413383665112, 1.0573110696453443],
    ]
)
_WHITE = np.array([0.95047, 1.0, 1.08883])
# (L*, a*, b*) = _F_TO_LAB @ (f_x, f_y, f_z) + _LAB_OFFSET
_F_TO_LAB = np.array([[0.0, 116.0, 0.0], [500.0, -500.0, 0.0], [0.0, 200.0, -200.0]])
_LAB_OFFSET = np.array([-16.0, 0.0, 0.0])
_LAB_TO_F = np.linalg.inv(_F_TO_LAB)
_RGB_TO_XYZN = _RGB_TO_XYZ / _WHITE[:, None]  # XYZ already divided by the white
_XYZN_TO_RGB = _XYZ_TO_RGB * _WHITE[None, :]

# Knees of kornia's piecewise functions.
_SRGB_KNEE = 0.04045  # sRGB -> linear
_LAB_KNEE = 0.008856  # XYZ/white -> f
_F_KNEE = 0.2068966  # f -> XYZ/white
_LIN_KNEE = 0.0031308  # linear -> sRGB
# kornia's two branches miss each other at the knees by these gaps (rounded constants); the
# branch-free forward conversion takes them back below the knee in float64, so that the LAB
# statistics equal kornia's (in float32 they are below its agreement, see _srgb_to_f; the
# inverse's gaps, below 5e-8, move the output by less than 1e-6).
_LAB_KNEE_GAP = _LAB_KNEE ** (1.0 / 3.0) - (7.787 * _LAB_KNEE + 4.0 / 29.0)  # 3.3e-7
_SRGB_KNEE_GAP = ((_SRGB_KNEE + 0.055) / 1.055) ** 2.4 - _SRGB_KNEE / 12.92  # 2.3e-9
# sRGB's (. / 1.055) ** 2.4 and its inverse 1.055 (.) ** (1 / 2.4) as factors of the 3 x 3
# matrices next to them (see _srgb_to_f and _f_to_srgb)
_SRGB_POW_SCALE = 1.055 ** -2.4
_SRGB_INV_SCALE = 1.055 ** 2.4

LAB_CHANNELS = ("L", "a", "b")
# LAB units: a source channel with a smaller spread counts as flat and maps to the target mean.
# Above what arithmetic leaves in a flat channel (float32 rounding of the pixels, about 3e-5)
# and what the rounded sRGB/D65 constants give a neutral grey ramp (a*, b* spread up to 1.3e-3,
# scikit-image's too), so that grey stays grey in every dtype; 100 times below a just
# noticeable colour difference (about 1 LAB unit).
FLAT_STD = 1e-2
_CPU_CHUNK_PIXELS = 1 << 17  # pixels per CPU chunk and thread (two float32 buffers of 1.5 MB)
_POLICY_STREAM = 5  # numpy random stream of unseen_field_targets (splits use 1-4)


def _const(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(a, dtype=like.dtype, device=like.device)


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


# ------------------------------------------------------------------ colour conversion
def _pow_(t: torch.Tensor, p: float) -> torch.Tensor:
    """t ** p in place for t > 0, as exp2(p log2 t): about half the time of torch's float32
    `pow` on CPU, and within about 1e-6 relative of it on the clamped ranges used here."""
    return t.log2_().mul_(p).exp2_()


def _srgb_to_f(x: torch.Tensor, out: torch.Tensor | None = None, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """(B, 3, N) sRGB in [0, 1] -> (B, 3, N) f-values of CIELAB (kornia's formulas, branch-free).

    kornia: lin = ((x + 0.055) / 1.055) ** 2.4 above the knee, x / 12.92 below; here
    ((max(x, k) + 0.055) / 1.055) ** 2.4 + (min(x, k) - k) / 12.92, less the knee gap below it.
    The division by 1.055 is a factor S = 1.055 ** -2.4 of the power, which goes into the
    RGB -> XYZ matrix (the linear branch's terms are divided by S to match): the same values to
    float rounding, one pass over the pixels fewer. Fresh CPU allocations of this size cost page
    faults, so the work happens in two buffers: f is written to `out` and `scratch` is
    overwritten (both allocated when not given).

    The two knee gaps are taken back in float64 only (where LAB equals kornia's to 1e-12): in
    float32 they move L* by less than 4e-5 (the f gap, 3.3e-7, times 116; the linear one, 2.3e-9,
    much less), a tenth of float32's own 2e-4 agreement, and taking them back costs four of the
    conversion's passes over the pixels (about 10% of the transfer's time at 224 px).
    """
    exact = x.dtype == torch.float64
    k = _SRGB_KNEE
    a = _pow_(torch.clamp(x, min=k, out=out).add_(0.055), 2.4)  # lin / S above the knee
    b = torch.clamp(x, max=k, out=scratch).sub_(k)
    a.add_(b, alpha=1.0 / (12.92 * _SRGB_POW_SCALE))
    if exact:
        a.add_(b.sign_(), alpha=_SRGB_KNEE_GAP / _SRGB_POW_SCALE)  # exact below the knee (sign -1), as for f below
    t = torch.matmul(_const(_RGB_TO_XYZN * _SRGB_POW_SCALE, x), a, out=b)
    e = _LAB_KNEE
    f = _pow_(torch.clamp(t, min=e, out=a), 1.0 / 3.0)
    # kornia: 7.787 t + 4/29 below the knee = e^(1/3) + 7.787 (t - e) - _LAB_KNEE_GAP
    low = t.clamp_(max=e).sub_(e)
    f.add_(low, alpha=7.787)
    if exact:
        f.add_(low.sign_(), alpha=_LAB_KNEE_GAP)  # sign is -1 below the knee, 0 above
    return f


def _f_to_srgb(f: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """(B, 3, N) f-values -> (B, 3, N) sRGB, not clamped, written to `out`; f is overwritten.

    kornia: 1.055 lin ** (1 / 2.4) - 0.055 above the knee c, 12.92 lin below. The factor 1.055
    is a factor Q = 1.055 ** 2.4 of lin, which goes into the XYZ -> RGB matrix (the knee and the
    linear branch scaled to match, its offset taking the - 0.055): the same values to float
    rounding, two passes fewer.
    """
    f[:, 2].clamp_(min=0.0)  # kornia: "if color data out of range: Z < 0"
    k = _F_KNEE
    t = torch.clamp(f, min=k, out=out).pow_(3)
    t.add_(f.clamp_(max=k).sub_(k), alpha=1.0 / 7.787)  # kornia: (f - 4/29) / 7.787 below the knee
    lin = torch.matmul(_const(_XYZN_TO_RGB * _SRGB_INV_SCALE, f), t, out=f)  # Q lin
    c = _LIN_KNEE * _SRGB_INV_SCALE
    alpha = 12.92 / _SRGB_INV_SCALE
    rgb = _pow_(torch.clamp(lin, min=c, out=t), 1.0 / 2.4)
    # + 12.92 (min(lin, knee) - knee) - 0.055, in Q lin
    rgb.add_(lin.clamp_(max=c).sub_(c + 0.055 / alpha), alpha=alpha)
    return rgb


def rgb_to_lab(x: torch.Tensor) -> torch.Tensor:
    """sRGB (*, 3, H, W) in [0, 1] -> CIELAB (*, 3, H, W); kornia's `rgb_to_lab`, faster (see above)."""
    if x.ndim < 3 or x.shape[-3] != 3:
        raise InterventionError(f"rgb_to_lab expects shape (*, 3, H, W); got {tuple(x.shape)}")
    dt = _work_dtype(x)
    x3 = x.to(dt).reshape(-1, 3, x.shape[-2] * x.shape[-1])
    f = _srgb_to_f(x3)
    lab = torch.matmul(_const(_F_TO_LAB, f), f).add_(_const(_LAB_OFFSET, f)[:, None])
    return lab.reshape(x.shape).to(x.dtype)


def lab_to_rgb(lab: torch.Tensor) -> torch.Tensor:
    """CIELAB (*, 3, H, W) -> sRGB in [0, 1]; kornia's `lab_to_rgb` (clip=True) to 1e-5."""
    if lab.ndim < 3 or lab.shape[-3] != 3:
        raise InterventionError(f"lab_to_rgb expects shape (*, 3, H, W); got {tuple(lab.shape)}")
    dt = _work_dtype(lab)
    l3 = lab.to(dt).reshape(-1, 3, lab.shape[-2] * lab.shape[-1])
    f = torch.matmul(_const(_LAB_TO_F, l3), l3 - _const(_LAB_OFFSET, l3)[:, None])
    return _f_to_srgb(f).clamp_(0.0, 1.0).reshape(lab.shape).to(lab.dtype)


# ------------------------------------------------------------------ statistics
def _lab_moments(
    f: torch.Tensor,
    w: torch.Tensor | None,
    scratch: torch.Tensor | None = None,
    scratch2: torch.Tensor | None = None,
    empty_uses_all: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weighted LAB moments of every crop from its f-values.

    Corrected two-pass in LAB coordinates: with m_f the (weighted) mean of f and per pixel
    d = T (f - m_f) (the LAB deviation; T is `_F_TO_LAB`), the LAB mean is T m_f + t0 + <d> and
    the variance <d^2> - <d>^2 (<.> the weighted mean over pixels). Two things keep a channel
    without spread at (close to) zero spread in float32, where rounding would otherwise make it
    1e-5 to 0.05 LAB: the deviations are taken per pixel in LAB, not from the 3 x 3 covariance of
    f (a* = 500 (f_x - f_y) of a grey crop cancels there), and the correction term <d>^2 takes
    out a first-pass mean that rounding put off by delta (every d of a constant channel is then
    the same -T delta, which <d^2> - <d>^2 cancels).

    Args:
        f: (B, 3, N) f-values.
        w: (B, 1, N) pixel weights (the cell mask) or None (all pixels).
        scratch, scratch2: optional buffers like f, overwritten.
        empty_uses_all: a crop whose weights sum to 0 uses all its pixels (True, the transfer)
            or gets weight 0, mean and variance 0 (False, pooling).

    Returns:
        W (B,) total weight, mean (B, 3) and population variance (B, 3) in LAB units, and
        empty (B,) bool: the crop's weights summed to 0.
    """
    B, _, N = f.shape
    T = _const(_F_TO_LAB, f)
    if w is None:
        W = f.new_full((B,), float(N))
        empty = torch.zeros(B, dtype=torch.bool, device=f.device)
        mean_f = f.mean(-1, keepdim=True)
        dl = torch.matmul(T, torch.sub(f, mean_f, out=scratch), out=scratch2)
        s1 = dl.mean(-1)
        s2 = dl.square_().mean(-1)
    else:
        W = w.sum(-1)[:, 0]
        empty = W <= 0
        if empty_uses_all and bool(empty.any()):
            w = torch.where(empty[:, None, None], torch.ones_like(w), w)
            W = w.sum(-1)[:, 0]
        den = torch.where(W > 0, W, torch.ones_like(W))[:, None]  # (B, 1); empty crops give 0
        # The first-pass mean may be off (a float32 bmm over 512 x 512 pixels was, by 1e-4
        # relative): <d> corrects it. The second-pass sums must not be: torch's sum adds
        # pairwise (float32 error ~ eps log N), where a bmm left a flat channel 1e-3 LAB of spread.
        mean_f = torch.bmm(f, w.transpose(1, 2)) / den[:, :, None]
        dl = torch.matmul(T, torch.sub(f, mean_f, out=scratch), out=scratch2)
        dw = torch.mul(dl, w, out=scratch)
        s1 = dw.sum(-1) / den
        s2 = dw.mul_(dl).sum(-1) / den
    mean = (T @ mean_f)[..., 0] + _const(_LAB_OFFSET, f) + s1
    var = (s2 - s1 * s1).clamp_(min=0.0)
    if not empty_uses_all and bool(empty.any()):
        mean = torch.where(empty[:, None], torch.zeros_like(mean), mean)
    return W, mean, var, empty


def _chunk(B: int, HW: int, device: torch.device) -> int:
    """Crops per chunk: the whole batch on an accelerator; on CPU about _CPU_CHUNK_PIXELS pixels
    per torch thread, so that the two float buffers stay in cache and are reused instead of
    page-faulted anew, while each parallel step still has work for every thread."""
    return B if device.type != "cpu" else max(1, min(B, _CPU_CHUNK_PIXELS * torch.get_num_threads() // max(HW, 1)))


def _transfer(x: torch.Tensor, w: torch.Tensor | None, tgt_mean: torch.Tensor, tgt_std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Reinhard map for a validated batch; targets (B, 3) of x's working dtype.

    Returns:
        The output (B, 3, H, W) and the (B,) bool flags of crops whose mask was empty (their
        statistics came from all pixels).
    """
    B, _, H, Wd = x.shape
    HW = H * Wd
    x3 = x.reshape(B, 3, HW)
    w3 = None if w is None else w.reshape(B, 1, HW)
    # the output is made in its final shape and worked on as (B, 3, H*W); each chunk is clamped
    # while in cache (the modules' `output_in_range`)
    result = new_output(x.shape, x.dtype, x.device)
    out = result.view(B, 3, HW)
    empty_all = torch.zeros(B, dtype=torch.bool, device=x.device)
    step = _chunk(B, HW, x.device)
    buf_a = torch.empty((step, 3, HW), dtype=x.dtype, device=x.device)
    buf_b = torch.empty_like(buf_a)
    T, Ti, t0 = _const(_F_TO_LAB, x), _const(_LAB_TO_F, x), _const(_LAB_OFFSET, x)
    for i in range(0, B, step):
        j = min(i + step, B)
        a, b = buf_a[: j - i], buf_b[: j - i]
        f = _srgb_to_f(x3[i:j].contiguous(), out=a, scratch=b)  # contiguous: a channels-last input
        # out[i:j] is free until the last step: the LAB deviations go there
        _, mean, var, empty = _lab_moments(f, None if w3 is None else w3[i:j], scratch=b, scratch2=out[i:j])
        empty_all[i:j] = empty
        sd = var.sqrt_()
        # a channel without spread maps to the target mean (scale 0), whatever rounding left in it
        s = torch.where(sd < FLAT_STD, torch.zeros_like(sd), tgt_std[i:j] / sd.clamp(min=FLAT_STD))  # (n, 3)
        o = tgt_mean[i:j] - s * mean
        # y_lab = s * (T f + t0) + o  <=>  f' = Ti diag(s) T f + Ti (s t0 + o - t0)
        A = Ti @ (s[:, :, None] * T)
        c = (s * t0 + o - t0) @ Ti.T
        f2 = torch.baddbmm(c[:, :, None].expand(j - i, 3, HW), A, f, out=b)
        _f_to_srgb(f2, out=out[i:j]).clamp_(0.0, 1.0)
    return result, empty_all


def _as_target(value: Any, name: str, B: int, like: torch.Tensor, per_sample: bool) -> torch.Tensor:
    """Validate a target (3,) or (B, 3) and return it as (B, 3) of like's dtype and device."""
    try:
        t = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value, dtype=np.float64))
    except (TypeError, ValueError):
        raise InterventionError(f"{name} must hold numbers (L*, a*, b*); got {value!r}") from None
    shape = tuple(t.shape)
    if per_sample:
        if t.ndim != 2 or shape[1] != 3 or shape[0] not in (1, B):
            raise InterventionError(f"{name} must have one (L*, a*, b*) row per image, shape (B, 3) = ({B}, 3); got {shape}")
    elif not (shape == (3,) or (t.ndim == 2 and shape[1] == 3 and shape[0] in (1, B))):
        raise InterventionError(f"{name} must hold 3 LAB values (L*, a*, b*) or one row per image (B, 3) = ({B}, 3); got shape {shape}")
    t = t.to(device=like.device, dtype=like.dtype).reshape(-1, 3).expand(B, 3)
    if not bool(torch.isfinite(t).all()):
        raise InterventionError(f"{name} must be finite; got {t.tolist()}")
    if name.endswith("std") and not bool((t > 0).all()):
        raise InterventionError(f"{name} must be positive (a standard deviation in LAB units); got {t.tolist()}")
    return t


_EMPTY_MASK = "have an empty cell mask, so their statistics came from all their pixels"


def _run(x, mask, target_mean, target_std, per_sample, owner) -> tuple[torch.Tensor, torch.Tensor]:
    """The transfer of a validated batch and its (B,) applicable flags (False: empty mask), warned."""
    dt = _work_dtype(x)
    xw = x.to(dt)
    B = x.shape[0]
    tm = _as_target(target_mean, "target_mean", B, xw, per_sample)
    ts = _as_target(target_std, "target_std", B, xw, per_sample)
    w = None if mask is None else mask.to(dt)
    y, empty = _transfer(xw, w, tm, ts)
    ok = ~empty
    warn_not_applicable(owner, ok, _EMPTY_MASK)
    return y.to(x.dtype), ok


def reinhard(x: torch.Tensor, target_mean, target_std, mask: torch.Tensor | None = None, *, return_applicable: bool = False):
    """Function twin of `Reinhard`: transfer each image's LAB statistics to the target's.

    Args:
        x: (B, 3, H, W) sRGB in [0, 1].
        target_mean, target_std: (L*, a*, b*) mean and standard deviation in LAB units, 3
            values for the whole batch or (B, 3) per image.
        mask: optional (B, 1, H, W) cell mask; the source statistics are taken over it (over
            all pixels of a crop whose mask is empty: flagged and warned).
        return_applicable: also return the (B,) bool flags (False: empty mask).

    Returns:
        (B, 3, H, W) in [0, 1], x's dtype and device; with `return_applicable`, the tuple
        (output, applicable).
    """
    check_image(x)
    if mask is not None:
        mask = check_mask(mask, x)
    # no input clamp needed: both branches of every knee accept the tolerated overshoot
    y, ok = _run(x, mask, target_mean, target_std, per_sample=False, owner="reinhard")
    return (y, ok) if return_applicable else y


def reinhard_unseen_field(x: torch.Tensor, target_mean, target_std, mask: torch.Tensor | None = None, *, return_applicable: bool = False):
    """Function twin of `ReinhardToField`: per-image targets ``(B, 3)`` (see `unseen_field_targets`);
    `mask` and `return_applicable` as in `reinhard`."""
    check_image(x)
    if mask is not None:
        mask = check_mask(mask, x)
    y, ok = _run(x, mask, target_mean, target_std, per_sample=True, owner="reinhard_unseen_field")
    return (y, ok) if return_applicable else y


# ------------------------------------------------------------------ fitting targets
def _as_float_batch(images: torch.Tensor, name: str = "images") -> torch.Tensor:
    if isinstance(images, torch.Tensor) and images.dtype == torch.uint8:
        images = images.to(torch.float32).div_(255.0)
    check_image(images, name)
    return images.clamp(0.0, 1.0)


def _crop_moments(
    images: torch.Tensor, masks: torch.Tensor | None, batch_size: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-crop LAB moments over the cell pixels, float64: weight W (N,), mean (N, 3), sum of
    squared deviations M2 (N, 3), and empty (N,) bool. A crop whose mask is empty has no cell
    pixel: it gets W = 0 (mean and M2 0), so pooling skips it, and empty = True."""
    n = len(images)
    if batch_size is None:
        batch_size = _chunk(n, images.shape[-2] * images.shape[-1], images.device)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InterventionError(f"batch_size must be a positive integer; got {batch_size!r}")
    if masks is not None and (not isinstance(masks, torch.Tensor) or len(masks) != n):
        got = tuple(masks.shape) if isinstance(masks, torch.Tensor) else type(masks).__name__
        raise InterventionError(f"masks must be a (N, 1, H, W) tensor with one mask per image (N = {n}); got {got}")
    Ws, means, m2s, empties = [], [], [], []
    for start in range(0, n, batch_size):
        x = _as_float_batch(images[start : start + batch_size])
        m = None if masks is None else check_mask(masks[start : start + batch_size].to(x.device), x, "masks")
        dt = _work_dtype(x)
        B, _, H, Wd = x.shape
        f = _srgb_to_f(x.to(dt).reshape(B, 3, H * Wd))
        W, mean, var, empty = _lab_moments(f, None if m is None else m.to(dt).reshape(B, 1, H * Wd), empty_uses_all=False)
        W64 = W.double().cpu().numpy()
        Ws.append(W64)
        means.append(mean.double().cpu().numpy())
        m2s.append(var.double().cpu().numpy() * W64[:, None])
        empties.append(empty.cpu().numpy())
    if not Ws:
        return np.zeros(0), np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0, dtype=bool)
    return np.concatenate(Ws), np.concatenate(means), np.concatenate(m2s), np.concatenate(empties)


def _pool(W: np.ndarray, mean: np.ndarray, M2: np.ndarray, groups: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pool per-crop moments by group (Chan et al.'s parallel variance): W, mean, std per group."""
    Wg = np.bincount(groups, weights=W, minlength=n_groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = np.stack([np.bincount(groups, weights=W * mean[:, k], minlength=n_groups) for k in range(3)], 1) / Wg[:, None]
        dev = M2 + W[:, None] * (mean - mu[groups]) ** 2
        var = np.stack([np.bincount(groups, weights=dev[:, k], minlength=n_groups) for k in range(3)], 1) / Wg[:, None]
    return Wg, mu, np.sqrt(np.maximum(var, 0.0))


@register("reinhard")
class Reinhard(Intervention):
    """Reinhard colour transfer to fixed target statistics (see the module docstring).

    Args:
        target_mean: (L*, a*, b*) target mean in LAB units, or None to `fit` it.
        target_std: (L*, a*, b*) target standard deviation in LAB units, or None to `fit` it.

    Attributes (after `fit`):
        target_mean_, target_std_: (3,) float64 pooled LAB statistics of the target crops.
        n_pixels_: the (mask-weighted) number of pixels pooled.
        n_empty_masks_: the number of crops skipped for an empty mask.

    Example:
        >>> import torch
        >>> target = torch.rand(8, 3, 16, 16)
        >>> t = Reinhard().fit(target)
        >>> t(torch.rand(2, 3, 16, 16)).shape
        torch.Size([2, 3, 16, 16])
    """

    label = "Reinhard colour transfer"
    output_in_range = True  # `_transfer` clamps each chunk

    def __init__(self, target_mean: Sequence[float] | None = None, target_std: Sequence[float] | None = None) -> None:
        super().__init__()
        if (target_mean is None) != (target_std is None):
            raise InterventionError("reinhard takes target_mean and target_std together (or neither, then call fit(images, masks))")
        if target_mean is not None:
            probe = torch.zeros(1, dtype=torch.float64)
            _as_target(target_mean, "target_mean", 1, probe, per_sample=False)
            _as_target(target_std, "target_std", 1, probe, per_sample=False)
        self.target_mean = target_mean
        self.target_std = target_std

    def fit(self, images: torch.Tensor, masks: torch.Tensor | None = None, batch_size: int | None = None) -> "Reinhard":
        """Pool the LAB mean and standard deviation over all cell pixels of `images`.

        Args:
            images: (N, 3, H, W) uint8 or float in [0, 1] (for example the crops of one field).
            masks: optional (N, 1, H, W) cell masks; without them all pixels count. A crop whose
                mask is empty has no cell pixel and adds nothing: it is skipped, counted in
                `n_empty_masks_` and warned about.
            batch_size: crops converted at a time (default: about 128K pixels on CPU).

        Returns:
            self, with `target_mean_`, `target_std_`, `n_pixels_` and `n_empty_masks_` set.

        Raises:
            InterventionError: no cell pixel at all (every mask empty), or no colour spread.
        """
        if not isinstance(images, torch.Tensor) or images.ndim != 4 or len(images) == 0:
            raise InterventionError(f"fit needs a non-empty (N, 3, H, W) tensor of images; got {getattr(images, 'shape', type(images).__name__)}")
        W, mean, M2, empty = _crop_moments(images, masks, batch_size)
        n_empty = int(empty.sum())
        if n_empty == len(W):
            raise InterventionError(f"reinhard.fit: all {n_empty} crop(s) have an empty cell mask, so there is no cell pixel to take the target statistics from")
        if n_empty:
            warnings.warn(f"reinhard.fit: {n_empty} of {len(W)} crop(s) have an empty cell mask and were skipped (n_empty_masks_)", InterventionWarning, stacklevel=2)
        Wg, mu, sd = _pool(W, mean, M2, np.zeros(len(W), dtype=np.int64), 1)
        if not (sd[0] > 0).all():
            raise InterventionError(f"the target crops have no colour spread in some LAB channel (std {sd[0].tolist()}); fit on more varied crops")
        self.target_mean_ = mu[0]
        self.target_std_ = sd[0]
        self.n_pixels_ = float(Wg[0])
        self.n_empty_masks_ = n_empty
        return self

    def _targets(self):
        if hasattr(self, "target_mean_"):
            return self.target_mean_, self.target_std_
        if self.target_mean is None:
            raise InterventionError("reinhard has no target: pass target_mean and target_std, or call fit(images, masks) first")
        return self.target_mean, self.target_std

    def apply(self, x, mask, params, **context):
        if context:
            raise InterventionError(f"reinhard takes no per-crop context (got {sorted(context)}); per-crop targets are for 'reinhard_unseen_field'")
        tm, ts = self._targets()
        y, self.last_applicable = _run(x, mask, tm, ts, per_sample=False, owner=self.name)
        return y

    def extra_repr(self) -> str:
        if hasattr(self, "target_mean_"):
            return f"target_mean_={np.round(self.target_mean_, 3).tolist()}, target_std_={np.round(self.target_std_, 3).tolist()}"
        return f"target_mean={self.target_mean}, target_std={self.target_std}"


@register("reinhard_unseen_field")
class ReinhardToField(Intervention):
    """Reinhard transfer to per-crop targets chosen from the labels (the paper's F2).

    Call it as ``t(x, mask, target_mean=(B, 3), target_std=(B, 3))``, with the LAB statistics of
    the field that `unseen_field_targets` chose for each crop (`targets_for(crops, split, seed)`
    builds them for every crop). The target depends on the label, so accuracy after
    this transfer is a controlled diagnostic, not an unconditional test-time transform.
    """

    label = "Reinhard transfer to an unseen field"
    label_conditioned = True
    output_in_range = True  # `_transfer` clamps each chunk

    def __init__(self) -> None:
        super().__init__()

    @classmethod
    def targets_for(cls, crops, split, seed: int = 0) -> dict[str, torch.Tensor]:
        """The F2 targets of every crop: `unseen_field_target_tensors` over all the split's cells.

        Returns:
            ``{"target_mean": (N, 3), "target_std": (N, 3)}`` float32 LAB statistics, aligned
            with the table's rows (see `unseen_field_target_tensors`).

        Raises:
            InterventionError: some test crop's class has no field unseen by every cell's training side.
        """
        return unseen_field_target_tensors(crops, split, seed=seed)

    @classmethod
    def check_split(cls, protocol: str, params: dict[str, Any]) -> None:
        """Only a factorial with ``reserve_parent_share > 0`` is sure to leave, for every test
        crop, fields of its class that no cell trained on; any other split raises
        `SplitRequirementError` (``param`` None for the protocol, else the parameter)."""
        if protocol != "factorial":
            raise SplitRequirementError(f"{cls.name!r} needs fields no model trained on; the {protocol!r} split "
                                        "leaves none: use split.protocol factorial with params.reserve_parent_share > 0 (e.g. 0.2)")
        share = params.get("reserve_parent_share") or 0
        if not share > 0:
            raise SplitRequirementError(f"{cls.name!r} needs fields no model trained on; got reserve_parent_share {share!r}: "
                                        "give a share > 0 (e.g. 0.2) to keep fields out of every cell", param="reserve_parent_share")

    def apply(self, x, mask, params, target_mean=None, target_std=None, **context):
        if context:
            raise InterventionError(f"reinhard_unseen_field takes only target_mean and target_std as context; got also {sorted(context)}")
        if target_mean is None or target_std is None:
            raise InterventionError(
                "reinhard_unseen_field needs per-crop targets: call it as f(x, mask, target_mean=(B, 3), target_std=(B, 3)); "
                "build them with unseen_field_targets, field_lab_statistics and field_target_tensors"
            )
        y, self.last_applicable = _run(x, mask, target_mean, target_std, per_sample=True, owner=self.name)
        return y


# ------------------------------------------------------------------ F2: fields and targets
def field_lab_statistics(crops, parents: Iterable[str] | None = None, batch_size: int | None = None, device: torch.device | str = "cpu") -> pd.DataFrame:
    """LAB mean and standard deviation of every field, pooled over its crops' cell pixels.

    Args:
        crops: a `shortcutlab.data.images.CropImages` (uint8 images, optional masks, the table).
        parents: the parents (fields) to describe (default: all of the table's).
        batch_size: crops converted at a time (default: about 128K pixels on CPU).
        device: where to compute.

    Returns:
        A DataFrame indexed by parent name with columns L_mean, a_mean, b_mean, L_std, a_std,
        b_std (LAB units), n_crops, n_empty_masks (crops skipped because their mask is empty:
        they have no cell pixel) and n_pixels (mask-weighted cell pixel count). A field whose
        every mask is empty has n_pixels 0 and NaN statistics; skipped crops are warned about.

    Raises:
        InterventionError: a requested parent is not in the table.
    """
    table = crops.table
    names = np.asarray(table.parents, dtype=object)
    codes = table.parent_codes
    if parents is None:
        want = np.arange(len(names))
    else:
        req = [str(p) for p in parents]
        pos = pd.Index(names).get_indexer(req)
        if (pos < 0).any():
            bad = [p for p, i in zip(req, pos) if i < 0][:5]
            raise InterventionError(f"field_lab_statistics: parent(s) {bad} are not in the table ({len(names)} parents)")
        want = np.unique(pos)
    rows = np.flatnonzero(np.isin(codes, want))
    idx = torch.from_numpy(rows)
    images = crops.images[idx].to(device)
    masks = None if crops.masks is None else crops.masks[idx].to(device)
    W, mean, M2, empty = _crop_moments(images, masks, batch_size)
    local = np.searchsorted(want, codes[rows])
    Wg, mu, sd = _pool(W, mean, M2, local, len(want))
    out = pd.DataFrame(
        np.c_[mu, sd], index=pd.Index(names[want].astype(str), name="parent"), columns=[f"{c}_mean" for c in LAB_CHANNELS] + [f"{c}_std" for c in LAB_CHANNELS]
    )
    out["n_crops"] = np.bincount(local, minlength=len(want))
    out["n_empty_masks"] = np.bincount(local, weights=empty.astype(np.int64), minlength=len(want)).astype(np.int64)
    out["n_pixels"] = Wg
    if empty.any():
        bare = out.index[Wg <= 0].tolist()
        none = f"; field(s) {bare[:5]} have no cell pixel at all (NaN statistics)" if bare else ""
        warnings.warn(
            f"field_lab_statistics: {int(empty.sum())} of {len(empty)} crop(s) have an empty cell mask and were skipped (column n_empty_masks){none}",
            InterventionWarning,
            stacklevel=2,
        )
    return out


def field_target_tensors(
    stats: pd.DataFrame, target_parents: Sequence[str], dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-crop targets for `ReinhardToField` from `field_lab_statistics` rows.

    Args:
        stats: the frame returned by `field_lab_statistics`.
        target_parents: (B,) chosen field of each crop of a batch (the `target_parent` column
            of `unseen_field_targets`).

    Returns:
        target_mean, target_std: (B, 3) tensors in LAB units.
    """
    keys = [str(p) for p in np.asarray(target_parents, dtype=object)]
    pos = stats.index.get_indexer(keys)
    if (pos < 0).any():
        bad = sorted({k for k, i in zip(keys, pos) if i < 0})[:5]
        raise InterventionError(f"no LAB statistics for target field(s) {bad}; compute them with field_lab_statistics(crops, parents=...)")
    mean = stats[[f"{c}_mean" for c in LAB_CHANNELS]].to_numpy(np.float64)[pos]
    std = stats[[f"{c}_std" for c in LAB_CHANNELS]].to_numpy(np.float64)[pos]
    bad_rows = ~(np.isfinite(mean).all(1) & np.isfinite(std).all(1))
    if bad_rows.any():
        bad = sorted({k for k, b in zip(keys, bad_rows) if b})[:5]
        raise InterventionError(f"target field(s) {bad} have no LAB statistics (NaN: every crop's cell mask is empty, no cell pixel); choose fields with cell pixels")
    return torch.as_tensor(mean, dtype=dtype, device=device), torch.as_tensor(std, dtype=dtype, device=device)


def unseen_field_target_tensors(crops, split, cells: Sequence[str] | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """Per-crop targets of `ReinhardToField` for every crop of `crops`, as the paper's F2 chose them.

    Every test crop gets the LAB statistics of a field of its own class that no compared cell
    trained on (`unseen_field_targets`); other crops get their own field's statistics (they
    are never scored). For a factorial made with ``reserve_parent_share`` every test crop has
    such a field.

    Args:
        crops: a `shortcutlab.data.images.CropImages`.
        split: a `shortcutlab.data.manifest.SplitManifest` or the path of its CSV.
        cells, seed: as for `unseen_field_targets`.

    Returns:
        ``{"target_mean": (N, 3), "target_std": (N, 3)}`` float32 tensors aligned with the
        table's rows.

    Raises:
        InterventionError: as `unseen_field_targets`.
    """
    from shortcutlab.data.manifest import SplitManifest

    if isinstance(split, (str, os.PathLike)):
        split = SplitManifest.read(split)
    table = crops.table
    chosen = unseen_field_targets(table, split, cells=cells, seed=seed)
    target = pd.Series(np.asarray(table.parents, dtype=object)[table.parent_codes], index=table.ids)
    target.loc[chosen["id"].astype(str).to_numpy()] = chosen["target_parent"].astype(str).to_numpy()
    stats = field_lab_statistics(crops, parents=sorted(set(target.to_numpy())))
    mean, std = field_target_tensors(stats, target.to_numpy(), dtype=torch.float32)
    return {"target_mean": mean, "target_std": std}


def unseen_field_targets(table, split, cells: Sequence[str] | None = None, seed: int = 0, exclude_sides: Sequence[str] = ("train",)) -> pd.DataFrame:
    """The F2 target policy: for every test crop, a field of its class no compared cell trained on.

    A field (parent) qualifies for a test crop of class c when it holds at least one crop of
    class c, is not the crop's own parent, and gave no crop to the `exclude_sides` (training,
    by default) of any of the compared `cells`. Among the qualifying fields one is drawn
    uniformly, independently per crop, from ``numpy.random.default_rng([seed, 5])`` in crop-id
    order, so the choice depends only on the table, the split, the cells and the seed. With
    mixed-class parents (CRIC), a field qualifies for every class it holds.

    Args:
        table: the `shortcutlab.data.table.CropTable` the split was made from.
        split: a `shortcutlab.data.manifest.SplitManifest`.
        cells: the cells being compared (default: all of the manifest's; for a factorial all of
            `shortcutlab.data.splits.FACTORIAL_CELLS`). Test crops are those on the test side of any.
        seed: non-negative integer.
        exclude_sides: sides whose parents count as seen: ("train",) or ("train", "val").

    Returns:
        A DataFrame, one row per test crop in id order, with columns id, label, parent and
        target_parent.

    Raises:
        InterventionError: some class has no qualifying field for some test crop (the message
            names the class), or the cells hold no test crop.
    """
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise InterventionError(f"seed must be a non-negative integer; got {seed!r}")
    exclude = tuple(exclude_sides)
    if not exclude or any(s not in ("train", "val") for s in exclude):
        raise InterventionError(f"exclude_sides must name 'train' and optionally 'val'; got {exclude!r}")
    cells = tuple(split.cells) if cells is None else tuple(cells)
    if not cells:
        raise InterventionError("unseen_field_targets needs at least one cell to compare")
    seen, test = _seen_fields_and_test_crops(table, split, cells, exclude)
    where = "the split" if cells == ("",) else f"cell(s) {list(cells)}"
    if not test.any():
        raise InterventionError(f"{where} hold(s) no test crop")
    labels = table.label_codes
    holds = table.class_counts_per_unit("parent") > 0  # (P, C)
    rng = np.random.default_rng([int(seed), _POLICY_STREAM])
    test_idx = np.flatnonzero(test)
    u = rng.random(len(test_idx))
    target = np.empty(len(test_idx), dtype=np.int64)
    for c in range(table.n_classes):
        sel = np.flatnonzero(labels[test_idx] == c)
        if len(sel):
            target[sel] = _draw_unseen(table, c, test_idx[sel], u[sel], holds[:, c] & ~seen, exclude, where)
    return pd.DataFrame(
        {
            "id": table.ids[test_idx],
            "label": np.asarray(table.classes, dtype=object)[labels[test_idx]],
            "parent": table.parents[table.parent_codes[test_idx]],
            "target_parent": table.parents[target],
        }
    )


def _seen_fields_and_test_crops(table, split, cells: tuple, exclude: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(P,) whether a parent gave a crop to an `exclude` side of any of `cells`, and (N,)
    whether a crop is on the test side of any."""
    from shortcutlab.data.audit import side_codes
    from shortcutlab.data.manifest import SIDES

    pc = table.parent_codes
    seen = np.zeros(table.n_parents, dtype=bool)
    test = np.zeros(table.n_crops, dtype=bool)
    for name in cells:
        side = side_codes(table, split.cell(name or None))
        for s in exclude:
            seen[pc[side == SIDES.index(s)]] = True
        test |= side == SIDES.index("test")
    return seen, test


def _draw_unseen(table, c: int, crops: np.ndarray, u: np.ndarray, qualifies: np.ndarray, exclude: tuple, where: str) -> np.ndarray:
    """One qualifying field per test crop of class `c` (not its own parent), chosen by its
    uniform draw `u`: the draw indexes the qualifying fields with the crop's own left out."""
    pc = table.parent_codes
    K = np.flatnonzero(qualifies)
    own = pc[crops]
    pos = np.searchsorted(K, own)
    own_in = (pos < len(K)) & (K[np.minimum(pos, max(len(K) - 1, 0))] == own) if len(K) else np.zeros(len(crops), dtype=bool)
    n_avail = len(K) - own_in.astype(np.int64)
    if (n_avail <= 0).any():
        bad = table.ids[crops[n_avail <= 0]]
        only = f"; its only one is the crop's own parent {table.parents[K[0]]!r}" if len(K) == 1 else ""
        raise InterventionError(
            f"class {table.classes[c]!r} has no field unseen by the {'/'.join(exclude)} side of {where}{only}, "
            f"so {int((n_avail <= 0).sum())} test crop(s) of that class (e.g. {list(map(str, bad[:3]))}) get no F2 target; "
            "the transfer needs at least one left-out field of every class (for a factorial, build it with "
            "reserve_parent_share > 0, CLI --reserve-parent-share)"
        )
    r = np.minimum(np.floor(u * n_avail).astype(np.int64), n_avail - 1)
    r += (own_in & (r >= pos)).astype(np.int64)
    return K[r]
