"""Corner patches: keep one small patch of the crop, the background-only litmus test.

Reference 004 (CVPR 2025, "Unmasking Biases and Reliability Concerns in CNN Analysis of
Cancer Pathology Images") cuts 20 x 20 px patches from five fixed positions of every image,
the four corners and the centre, and finds that classifiers trained on them still score far
above chance: the patches hold no diagnostic content, so what they carry is acquisition bias.

`corner_patches` keeps the patch at one `position` and resizes it back to the crop's H x W
(bilinear, pixel-centre aligned, i.e. ``align_corners=False``), so an unchanged model receives
its usual input size. Boxes are half-open pixel ranges; the centre box starts at
((H - size) // 2, (W - size) // 2), rounding towards the top left when H - size is odd.
`patch_mask_coverage` reports which share of each patch the cell mask covers, so that the
test can be restricted to patches that really are background.

Units: pixels for `size` and the boxes; [0, 1] intensities in and out.

Example:
    >>> patch_boxes(64, 64, 20)["centre"]
    (22, 22, 42, 42)
    >>> import torch
    >>> corner_patches(torch.rand(2, 3, 64, 64), "bottom_right", size=20).shape
    torch.Size([2, 3, 64, 64])
"""

from __future__ import annotations

from typing import Literal

import warnings

import torch
import torch.nn.functional as F

from .base import Intervention, InterventionError, InterventionWarning, check_image
from .registry import register

Position = Literal["top_left", "top_right", "bottom_left", "bottom_right", "centre"]
POSITIONS: tuple[str, ...] = ("top_left", "top_right", "bottom_left", "bottom_right", "centre")


def _check_size(size, H: int | None = None, W: int | None = None) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InterventionError(f"corner_patches size must be a positive whole number of pixels; got {size!r}")
    if H is not None and W is not None and (size > H or size > W):
        raise InterventionError(f"corner_patches size {size} does not fit inside a {H} x {W} crop; use size <= {min(H, W)}")
    return size


def _check_position(position) -> str:
    if position not in POSITIONS:
        raise InterventionError(f"corner_patches position must be one of {', '.join(map(repr, POSITIONS))}; got {position!r}")
    return position


def patch_boxes(H: int, W: int, size: int = 20) -> dict[str, tuple[int, int, int, int]]:
    """The five patch boxes of an H x W crop, in the order of `POSITIONS`.

    Args:
        H: crop height in pixels.
        W: crop width in pixels.
        size: patch side in pixels (must fit inside the crop).

    Returns:
        position -> (top, left, bottom, right), half-open: the patch is
        ``x[..., top:bottom, left:right]``.

    Raises:
        InterventionError: the size is not a positive integer or does not fit.
    """
    size = _check_size(size, H, W)
    ct, cl = (H - size) // 2, (W - size) // 2
    corners = {
        "top_left": (0, 0),
        "top_right": (0, W - size),
        "bottom_left": (H - size, 0),
        "bottom_right": (H - size, W - size),
        "centre": (ct, cl),
    }
    return {p: (t, l, t + size, l + size) for p, (t, l) in ((p, corners[p]) for p in POSITIONS)}


def patch_mask_coverage(mask: torch.Tensor, size: int = 20) -> torch.Tensor:
    """Share of each of the five patches covered by the cell mask.

    Args:
        mask: (B, 1, H, W) or (B, H, W) cell mask, bool, 0/1 or floats in [0, 1] (1 = cell).
        size: patch side in pixels.

    Returns:
        (B, 5) tensor, columns in the order of `POSITIONS`: the mean of the mask over each patch
        (0 = pure background, 1 = all cell); float32 for bool or integer masks, else the mask's
        dtype. A crop whose mask is empty gets 0 everywhere, which says that its mask found no
        cell, not that its patches are background (a failed segmentation looks the same): each
        call warns once with the count of such crops (`InterventionWarning`).

    Example:
        >>> m = torch.zeros(1, 1, 40, 40); m[..., 10:30, 10:30] = 1
        >>> patch_mask_coverage(m, size=20).tolist()
        [[0.25, 0.25, 0.25, 0.25, 1.0]]
    """
    if not isinstance(mask, torch.Tensor):
        raise InterventionError(f"mask must be a torch.Tensor of shape (B, 1, H, W); got {type(mask).__name__}")
    if mask.ndim == 3:
        mask = mask.unsqueeze(1)
    if mask.ndim != 4 or mask.shape[1] != 1:
        raise InterventionError(f"mask must have shape (B, 1, H, W) or (B, H, W); got {tuple(mask.shape)}")
    m = mask if mask.is_floating_point() else mask.to(torch.float32)
    if m.numel() and not (float(m.min()) >= 0 and float(m.max()) <= 1):
        raise InterventionError(f"mask must hold values in [0, 1]; got min {float(m.min()):.4g}, max {float(m.max()):.4g}")
    boxes = patch_boxes(m.shape[-2], m.shape[-1], size)
    empty = int((m.flatten(1).amax(1) <= 0).sum()) if m.numel() else 0
    if empty:
        warnings.warn(
            f"patch_mask_coverage: {empty} of {m.shape[0]} crop(s) have an empty cell mask, so their coverage 0 says the mask found no cell, "
            "not that their patches are background",
            InterventionWarning,
            stacklevel=2,
        )
    return torch.stack([m[:, 0, t:b, l:r].mean(dim=(-2, -1)) for t, l, b, r in boxes.values()], dim=1)


def _patch(x: torch.Tensor, position: str, size: int) -> torch.Tensor:
    H, W = x.shape[-2:]
    t, l, b, r = patch_boxes(H, W, size)[position]
    patch = x[..., t:b, l:r]
    if (size, size) == (H, W):
        return patch.clone()
    return F.interpolate(patch, size=(H, W), mode="bilinear", align_corners=False)


def corner_patches(x: torch.Tensor, position: Position = "top_left", size: int = 20) -> torch.Tensor:
    """Function twin of `CornerPatches`: keep the patch at `position`, resized back to H x W.

    Args:
        x: (B, 3, H, W) float images in [0, 1].
        position: one of `POSITIONS`.
        size: patch side in pixels (<= H and <= W).

    Returns:
        (B, 3, H, W) tensor of x's dtype and device.
    """
    check_image(x)
    position, size = _check_position(position), _check_size(size)
    return _patch(x.clamp(0.0, 1.0), position, size).clamp(0.0, 1.0)


@register("corner_patches")
class CornerPatches(Intervention):
    """Keep one fixed size x size patch and resize it to the crop (see the module docstring).

    The mask, if given, is ignored: the test's point is a fixed position, whatever lies there;
    use `patch_mask_coverage` to check that the patches are background.

    Args:
        position: "top_left", "top_right", "bottom_left", "bottom_right" or "centre".
        size: patch side in pixels (default 20, as in reference 004); must fit inside the crop.
    """

    label = "corner patches"

    def __init__(self, position: Position = "top_left", size: int = 20) -> None:
        super().__init__()
        self.position, self.size = _check_position(position), _check_size(size)

    def apply(self, x, mask, params, **context):
        return _patch(x, self.position, self.size)

    def extra_repr(self) -> str:
        return f"position={self.position!r}, size={self.size}"
