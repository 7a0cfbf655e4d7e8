"""Low-pass filtering: a Gaussian blur that removes fine texture, keeping shape and colour.

Formula: y = G_sigma * x per channel, with a separable Gaussian of standard deviation `sigma`
pixels (kornia's sampled, normalised kernel), kernel width 2 * ceil(3 sigma) + 1 (covering
+-3 sigma) at every crop size, and mirror padding at the border: the crop is reflected about
its edge pixels (d c b | a b c d | c b a), as torch's and kornia's ``reflect`` and
scipy.ndimage's ``mode='mirror'``. Where the kernel radius reaches past the crop (a crop of
ceil(3 sigma) pixels or fewer along a side) the reflection repeats, period 2 (n - 1), exactly
as scipy's mirror mode extends; a side of one pixel is constant. So the kernel is never cut
short and tiny crops are blurred, not returned as they came. The amplitude response at
spatial frequency f (cycles/pixel) is exp(-2 pi^2 sigma^2 f^2): sigma = 2 px keeps 50% of
the amplitude at f ~ 0.066.

Example:
    >>> import torch
    >>> low_pass(torch.rand(1, 3, 16, 16), sigma=1.5).shape
    torch.Size([1, 3, 16, 16])
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from kornia.filters import filter2d_separable, get_gaussian_kernel1d

from .base import Intervention, InterventionError, check_image
from .registry import register


def _check_sigma(sigma: float) -> float:
    if isinstance(sigma, bool) or not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
        raise InterventionError(f"low_pass sigma must be a positive number of pixels; got {sigma!r}")
    return float(sigma)


def mirror_index(n: int, r: int, device: torch.device | None = None) -> torch.Tensor:
    """Source index of each of the n + 2 r positions -r .. n + r - 1 under mirror padding.

    Reflection about the edge pixels, repeated with period 2 (n - 1) when r >= n (scipy's
    ``mode='mirror'``); all zeros for n == 1.
    """
    i = torch.arange(-r, n + r, device=device)
    if n == 1:
        return torch.zeros_like(i)
    period = 2 * (n - 1)
    i = i.remainder(period)
    return torch.where(i >= n, period - i, i)


def mirror_pad(x: torch.Tensor, r: int) -> torch.Tensor:
    """Pad the last two dimensions of x by r on every side with mirror padding (any r >= 0)."""
    H, W = x.shape[-2:]
    if r < H and r < W:  # torch's reflect padding covers it
        return F.pad(x, (r, r, r, r), mode="reflect")
    return x.index_select(-2, mirror_index(H, r, x.device)).index_select(-1, mirror_index(W, r, x.device))


def _blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    if x.numel() == 0:
        return x.clone()
    r = math.ceil(3 * sigma)
    work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    k = get_gaussian_kernel1d(2 * r + 1, sigma, device=x.device, dtype=work)  # (1, 2r + 1)
    y = filter2d_separable(mirror_pad(x.to(work), r), k, k, padding="valid")
    return y.to(x.dtype)


def low_pass(x: torch.Tensor, sigma: float = 2.0) -> torch.Tensor:
    """Function twin of `LowPass`: Gaussian blur with standard deviation `sigma` pixels."""
    check_image(x)
    return _blur(x, _check_sigma(sigma)).clamp(0.0, 1.0)


@register("low_pass")
class LowPass(Intervention):
    """Gaussian low-pass filter (see the module docstring).

    Args:
        sigma: standard deviation of the Gaussian in pixels (> 0).
    """

    label = "low-pass blur"

    def __init__(self, sigma: float = 2.0) -> None:
        super().__init__()
        self.sigma = _check_sigma(sigma)

    def apply(self, x, mask, params, **context):
        return _blur(x, self.sigma)

    def extra_repr(self) -> str:
        return f"sigma={self.sigma}"
