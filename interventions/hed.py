"""HED colour deconvolution (Ruifrok & Johnston 2001) and HED stain jitter (the paper's F4).

Convention. Optical density per RGB channel, natural log: OD = -ln(max(x, 1e-6)) for x in
[0, 1] (incident light 1; the 1e-6 floor is scikit-image's). Stain concentrations
c = (c_H, c_E, c_D) solve OD = c @ M per pixel, with M = `RGB_FROM_HED`, scikit-image's
Ruifrok-Johnston matrix (rows: the OD vectors of haematoxylin, eosin and DAB), so

    c = OD @ inv(M),        x = exp(-(c @ M))    (clamped to [0, 1]).

Concentrations are in natural-log OD units and are not clipped, so `hed_to_rgb` inverts
`rgb_to_hed` exactly for x >= 1e-6. scikit-image >= 0.19 divides by ln(1e6) and clips at 0:
``skimage.color.rgb2hed(x) == max(rgb_to_hed(x) / ln(1e6), 0)`` (``SKIMAGE_HED_SCALE``
= ln(1e6) = 13.8155...).

HED jitter (Tellez et al. 2018): per image and stain, c -> alpha c + beta with
alpha ~ U(1 - sigma_alpha, 1 + sigma_alpha) (dimensionless) and beta ~ U(-sigma_beta,
sigma_beta) in the natural-log OD units above (multiply a beta given in scikit-image's
rgb2hed units by ``SKIMAGE_HED_SCALE``). Every pixel is transformed, background included, and
there is no per-image min-max rescaling afterwards, only the clamp to [0, 1]. Defaults
sigma_alpha = sigma_beta = 0.05: a mild jitter, a +-5% change of every stain's amount plus an
offset of up to 0.05 OD (about 5% of the light each stain transmits). The main paper does not
give its "strong" setting (F4); pass larger values (0.2 is common in the stain-augmentation
literature) and record them: they are part of the run record when used through the recipe. Code that adds U(-0.05, 0.05) to scikit-image's rgb2hed output
shifts ln(1e6) = 13.8 times more; ``sigma_beta=0.05 * SKIMAGE_HED_SCALE`` reproduces it.
The jitter is one affine map of OD per image, so it runs as
x' = exp(ln(max(x, eps)) @ A_b - o_b) with A_b = inv(M) diag(alpha_b) M and o_b = beta_b @ M:
a log, a batched 3 x 3 product and an exp (base 2, in cache-sized chunks on CPU).

Example:
    >>> import torch
    >>> x = torch.rand(2, 3, 8, 8) * 0.9 + 0.05
    >>> torch.allclose(hed_to_rgb(rgb_to_hed(x)), x, atol=1e-5)
    True
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .base import Intervention, InterventionError, check_image, uniform
from .memory import new_output
from .registry import register

# scikit-image's rgb_from_hed (rows: haematoxylin, eosin, DAB OD vectors over R, G, B).
RGB_FROM_HED = np.array([[0.65, 0.70, 0.29], [0.07, 0.99, 0.11], [0.27, 0.57, 0.78]])
HED_FROM_RGB = np.linalg.inv(RGB_FROM_HED)
OD_EPS = 1e-6  # intensity floor before the log, as in scikit-image
SKIMAGE_HED_SCALE = math.log(1e6)  # rgb2hed(x) == max(rgb_to_hed(x) / SKIMAGE_HED_SCALE, 0)


def _as_pixels(t: torch.Tensor, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.ndim < 3 or t.shape[-3] != 3:
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise InterventionError(f"{what} must be a float tensor of shape (*, 3, H, W); got {got}")
    return t.reshape(-1, 3, t.shape[-2] * t.shape[-1])


def _mat(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(a, dtype=like.dtype, device=like.device)


def rgb_to_hed(x: torch.Tensor) -> torch.Tensor:
    """RGB (*, 3, H, W) in [0, 1] -> HED concentrations (*, 3, H, W) in natural-log OD units.

    c = OD @ inv(M) with OD = -ln(max(x, 1e-6)); not clipped (see the module docstring for
    the relation to scikit-image's `rgb2hed`).
    """
    p = _as_pixels(x, "rgb_to_hed input")
    od = p.clamp(min=OD_EPS).log_().neg_()
    return torch.matmul(_mat(HED_FROM_RGB.T, p), od).reshape(x.shape)


def hed_to_rgb(c: torch.Tensor) -> torch.Tensor:
    """HED concentrations (*, 3, H, W) in natural-log OD units -> RGB in [0, 1]: exp(-(c @ M))."""
    p = _as_pixels(c, "hed_to_rgb input")
    return torch.matmul(_mat(-RGB_FROM_HED.T, p), p).exp_().clamp_(0.0, 1.0).reshape(c.shape)


def _check_sigmas(sigma_alpha: float, sigma_beta: float) -> tuple[float, float]:
    for name, v, hi in (("sigma_alpha", sigma_alpha, 1.0), ("sigma_beta", sigma_beta, math.inf)):
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v < hi):
            raise InterventionError(f"hed_jitter {name} must be a number in [0, {hi}); got {v!r}")
    return float(sigma_alpha), float(sigma_beta)


def _draw(x: torch.Tensor, sigma_alpha: float, sigma_beta: float, generator: torch.Generator | None) -> dict[str, torch.Tensor]:
    B = x.shape[0]
    return {
        "alpha": uniform(1.0 - sigma_alpha, 1.0 + sigma_alpha, (B, 3), generator, like=x),
        "beta": uniform(-sigma_beta, sigma_beta, (B, 3), generator, like=x),
    }


def _check_params(params: dict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    B = x.shape[0]
    if not isinstance(params, dict) or set(params) != {"alpha", "beta"}:
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise InterventionError(f"hed_jitter params must be a dict with keys 'alpha' and 'beta', each (B, 3); got {got}")
    out = []
    for k in ("alpha", "beta"):
        v = torch.as_tensor(params[k])
        if tuple(v.shape) != (B, 3):
            raise InterventionError(f"hed_jitter params[{k!r}] must have shape (B, 3) = ({B}, 3); got {tuple(v.shape)}")
        out.append(v.to(device=x.device, dtype=x.dtype))
    return out[0], out[1]


_CPU_CHUNK_PIXELS = 1 << 17  # pixels per CPU chunk and thread: the buffers stay in cache and are reused


def _jitter(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """x' = exp(-((alpha * (OD @ Minv) + beta) @ M)) as one affine map of log2 x per image."""
    if x.dtype in (torch.float16, torch.bfloat16):  # half precision in, float32 inside
        return _jitter(x.float(), alpha.float(), beta.float()).to(x.dtype)
    B, _, H, W = x.shape
    HW = H * W
    M, Minv = _mat(RGB_FROM_HED, x), _mat(HED_FROM_RGB, x)
    # OD' = OD @ A + beta @ M, so with pixels as columns and base-2 logs (exp2 is the fast one):
    # log2 x' = A^T log2 x - (beta @ M) / ln 2
    At = ((Minv[None] * alpha[:, None, :]) @ M).transpose(1, 2)
    o = (beta @ M).div_(-math.log(2.0))[:, :, None]
    x3 = x.reshape(B, 3, HW)
    # the output is made in its final shape and worked on as (B, 3, H*W); each chunk is clamped
    # while in cache (the module's `output_in_range`)
    result = new_output(x.shape, x.dtype, x.device)
    out = result.view(B, 3, HW)
    step = B if x.device.type != "cpu" else max(1, min(B, _CPU_CHUNK_PIXELS * torch.get_num_threads() // max(HW, 1)))
    buf = torch.empty((step, 3, HW), dtype=x.dtype, device=x.device)
    for i in range(0, B, step):
        j = min(i + step, B)
        lg = torch.clamp(x3[i:j], min=OD_EPS, out=buf[: j - i]).log2_()
        torch.baddbmm(o[i:j].expand(j - i, 3, HW), At[i:j], lg, out=out[i:j]).exp2_().clamp_(0.0, 1.0)
    return result


def hed_jitter(
    x: torch.Tensor,
    sigma_alpha: float = 0.05,
    sigma_beta: float = 0.05,
    generator: torch.Generator | None = None,
    *,
    alpha: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
) -> torch.Tensor:
    """Function twin of `HEDJitter`: random per-image, per-stain scale and shift of HED concentrations.

    Args:
        x: (B, 3, H, W) in [0, 1].
        sigma_alpha: half-width of the uniform scale around 1 (dimensionless).
        sigma_beta: half-width of the uniform shift, natural-log OD units.
        generator: CPU generator for the draw.
        alpha, beta: (B, 3) values to use instead of a draw (both or neither).

    Returns:
        (B, 3, H, W) in [0, 1].
    """
    check_image(x)
    sa, sb = _check_sigmas(sigma_alpha, sigma_beta)
    if (alpha is None) != (beta is None):
        raise InterventionError("hed_jitter takes alpha and beta together (or neither, to draw them)")
    params = _draw(x, sa, sb, generator) if alpha is None else {"alpha": alpha, "beta": beta}
    a, b = _check_params(params, x)
    return _jitter(x, a, b)  # no input clamp needed: the floor and the output clamp cover it


@register("hed_jitter")
class HEDJitter(Intervention):
    """HED stain jitter (see the module docstring). The mask is not used: every pixel changes.

    Args:
        sigma_alpha: alpha ~ U(1 - sigma_alpha, 1 + sigma_alpha) per image and stain, in [0, 1).
        sigma_beta: beta ~ U(-sigma_beta, sigma_beta), natural-log OD units, >= 0.
        generator: default CPU generator for the draws.

    The draw is ``{"alpha": (B, 3), "beta": (B, 3)}`` (columns H, E, D), kept in `last_params`.
    """

    label = "HED jitter"
    stochastic = True
    output_in_range = True  # `_jitter` clamps each chunk

    def __init__(self, sigma_alpha: float = 0.05, sigma_beta: float = 0.05, generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        self.sigma_alpha, self.sigma_beta = _check_sigmas(sigma_alpha, sigma_beta)

    def draw_params(self, x, generator):
        return _draw(x, self.sigma_alpha, self.sigma_beta, generator)

    def apply(self, x, mask, params, **context):
        if context:
            raise InterventionError(f"hed_jitter takes no per-crop context; got {sorted(context)}")
        a, b = _check_params(params, x)
        return _jitter(x, a, b)

    def extra_repr(self) -> str:
        return f"sigma_alpha={self.sigma_alpha}, sigma_beta={self.sigma_beta}, " + super().extra_repr()
