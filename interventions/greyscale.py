"""Greyscale: remove colour, keep luminance (the paper's F2 family of colour diagnostics).

Formula: Y = 0.299 R + 0.587 G + 0.114 B (ITU-R BT.601 luma, kornia's `rgb_to_grayscale`),
written to all three channels so the model still receives a (B, 3, H, W) input. Units: the
input's linear [0, 1] intensities; no gamma handling.

Example:
    >>> import torch
    >>> y = greyscale(torch.rand(1, 3, 8, 8))
    >>> bool(torch.equal(y[:, 0], y[:, 2]))
    True
"""

from __future__ import annotations

import torch
from kornia.color import rgb_to_grayscale

from .base import Intervention, check_image
from .registry import register


def greyscale(x: torch.Tensor) -> torch.Tensor:
    """Function twin of `Greyscale`: (B, 3, H, W) in [0, 1] -> BT.601 luma on all channels."""
    check_image(x)
    return rgb_to_grayscale(x).expand_as(x).contiguous().clamp(0.0, 1.0)


@register("greyscale")
class Greyscale(Intervention):
    """Replace every channel by the BT.601 luma (see the module docstring)."""

    label = "greyscale"

    def __init__(self) -> None:
        super().__init__()

    def apply(self, x, mask, params, **context):
        return rgb_to_grayscale(x).expand_as(x).contiguous()
