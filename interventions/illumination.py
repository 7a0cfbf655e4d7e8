"""Illumination flattening: divide out the smooth illumination field estimated from the background.

Uneven illumination (vignetting, a tilted lamp, a gradient across the field) is shared by all
crops of one acquisition and is a candidate for the leak the paper looks for. This intervention
estimates the illumination per crop and per channel from the background pixels, weighted by
w = 1 - mask (w = 1 everywhere without a mask; then the cell itself enters the estimate and
loses some contrast, so pass a mask where you have one), and divides it out:

    y = (x / I) * L / mean_bg(x / I),        L = mean_bg(x),

where mean_bg is the w-weighted mean over the crop. Dividing keeps the multiplicative model of
illumination (transmitted light scales the specimen's transmittance); the factor L / mean_bg(x/I)
rescales so that the background keeps its mean brightness exactly (before the final clamp to
[0, 1]). Units: the input's linear [0, 1] intensities; `sigma` in pixels.

Keeping L removes the SHAPE of the illumination within the crop but not its level: a gain
that a whole field shares (lamp power, exposure time) survives, and so does any leak it
carries. With ``level=t``, L is replaced by L * t / mean_c(L): the background keeps its colour
(channel ratios) but every crop's background gets the same mean brightness t, so the gain
goes too (and with it the grey part of any white-balance or background-tint difference).

The illumination I comes from one of two paths:

1. Smooth path (visible background share >= `min_background`):
   I = Q * NC(x / Q), with Q the least-squares polynomial surface of degree `degree` in the
   pixel coordinates, fitted to the background pixels (weights w), and NC the normalised
   convolution NC(r) = (G_s * (w r) + lam) / (G_s * w + lam) with a Gaussian G_s of standard
   deviation `sigma` pixels (default: a quarter of the crop's shorter side) and lam = 0.01 of
   the kernel mass. NC adds what the surface misses; where G_s * w is too small locally (deep
   inside a large cell) it falls back smoothly to 1, that is, to the surface Q.
   With ``degree=0`` (Q = the background mean) this is exactly the plain normalised convolution
   I = G_s * (w x) / G_s * w. The default ``degree=2`` is there because plain normalised
   convolution at a quarter of the crop is biased wherever the illumination bends or meets the
   border: on a 64 px crop with a masked cell it cut the background's coefficient of variation
   only 1.2x under a centred 45 % vignette and 3.6x under a 40 % linear ramp, whereas the
   quadratic surface removes both exactly (down to the 0.5 % pixel noise of that test image:
   16x and 25x) and NC then only corrects what remains. Without a mask the degree is capped
   at 1: a quadratic would fit the cell itself as a bump and flatten it away.
2. Fallback (visible background share below `min_background`, default 0.1): too little
   background to smooth, so I is the least-squares plane a + b u + c v (``degree`` capped at 1)
   fitted to the background pixels, and no NC.

Polynomial fits are weighted least squares on coordinates u, v in [-1, 1] across the crop,
solved batched through the normal equations in float64 with a tiny ridge (1e-6) on the
non-constant terms, so that a background confined to a line or a few pixels still gives a
finite, flat-as-possible fit. I is floored at 1/255 before dividing. A crop with no
background at all (mask 1 everywhere), or whose background is black in a channel, is returned
unchanged in that crop (or channel); crops without background are flagged False in
`last_applicable` and each call warns once with their count.

Example:
    >>> import torch
    >>> u = torch.linspace(0.6, 1.0, 32).view(1, 1, 1, 32)
    >>> x = (0.8 * u).expand(1, 3, 32, 32)               # a flat background under a gradient
    >>> y = illumination_flattening(x)
    >>> float(y.std()) < 1e-4
    True
"""

from __future__ import annotations

import torch

from .background import check_sigma, default_sigma, normalised_convolution
from .base import Intervention, InterventionError, check_image, check_mask, warn_not_applicable
from .registry import register

# Illumination below one 8-bit grey level carries no signal; dividing by less only amplifies noise.
ILLUMINATION_FLOOR = 1.0 / 255.0
_RIDGE = 1e-6


def _check_level(level) -> float | None:
    if level is None:
        return None
    if isinstance(level, bool) or not (isinstance(level, (int, float)) and 0.0 < level <= 1.0):
        raise InterventionError(f"illumination_flattening level must be None (keep each crop's background brightness) or the "
                                f"background's mean brightness to set, in (0, 1]; got {level!r}")
    return float(level)


def _check_settings(sigma, degree, min_background) -> tuple[float | None, int, float]:
    sigma = check_sigma(sigma, "illumination_flattening")
    if isinstance(degree, bool) or degree not in (0, 1, 2):
        raise InterventionError(f"illumination_flattening degree must be 0 (plain normalised convolution), 1 (plane) or 2 (quadratic surface); got {degree!r}")
    if isinstance(min_background, bool) or not (isinstance(min_background, (int, float)) and 0.0 <= min_background <= 1.0):
        raise InterventionError(f"illumination_flattening min_background must be a share of the crop's pixels in [0, 1]; got {min_background!r}")
    return sigma, int(degree), float(min_background)


def _basis(H: int, W: int, degree: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(K, H, W) monomials 1, u, v[, u^2, u v, v^2] on coordinates in [-1, 1]."""
    v = torch.linspace(-1.0, 1.0, H, dtype=dtype, device=device).view(H, 1).expand(H, W)
    u = torch.linspace(-1.0, 1.0, W, dtype=dtype, device=device).view(1, W).expand(H, W)
    terms = [torch.ones_like(u)]
    if degree >= 1:
        terms += [u, v]
    if degree >= 2:
        terms += [u * u, u * v, v * v]
    return torch.stack(terms)


def polynomial_surface(x: torch.Tensor, w: torch.Tensor, degree: int) -> torch.Tensor:
    """Weighted least-squares polynomial surface per crop and channel, evaluated on the grid.

    Args:
        x: (B, C, H, W) values.
        w: (B, 1, H, W) weights in [0, 1] (the background); a crop with zero total weight gets
            a zero surface.
        degree: 0 (constant: the weighted mean), 1 (plane a + b u + c v) or 2 (quadratic).

    Returns:
        (B, C, H, W) surface in x's dtype; u, v run over [-1, 1] across the crop.
    """
    B, C, H, W = x.shape
    work = torch.float32 if x.device.type == "mps" else torch.float64  # mps has no float64
    phi = _basis(H, W, degree, work, x.device)  # (K, H, W)
    K = phi.shape[0]
    xw, ww = x.to(work), w.to(work)[:, 0]
    total = ww.sum(dim=(1, 2))  # (B,)
    has_bg = total > 0
    norm = torch.where(has_bg, total, torch.ones_like(total)).view(B, 1, 1)
    gram = torch.einsum("bhw,khw,lhw->bkl", ww, phi, phi) / norm
    rhs = torch.einsum("bhw,khw,bchw->bkc", ww, phi, xw) / norm.view(B, 1, 1)
    ridge = torch.full((K,), _RIDGE, dtype=work, device=x.device)
    ridge[0] = 0.0
    eye = torch.eye(K, dtype=work, device=x.device)
    gram = torch.where(has_bg.view(B, 1, 1), gram + torch.diag(ridge), eye)
    coef = torch.linalg.solve(gram, rhs)  # (B, K, C)
    surface = torch.einsum("bkc,khw->bchw", coef, phi)
    return torch.where(has_bg.view(B, 1, 1, 1), surface, torch.zeros_like(surface)).to(x.dtype)


def _weighted_mean(x: torch.Tensor, w: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    return (w * x).sum(dim=(2, 3), keepdim=True) / total


def estimate_illumination(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    sigma: float | None = None,
    degree: int = 2,
    min_background: float = 0.1,
) -> torch.Tensor:
    """The illumination field I of the module docstring (both paths), without dividing it out.

    Args:
        x: (B, 3, H, W) float images in [0, 1].
        mask: optional (B, 1, H, W) float cell mask in [0, 1] (1 = cell).
        sigma: Gaussian standard deviation in pixels (default: a quarter of the shorter side).
        degree: degree of the polynomial surface of the smooth path (0, 1 or 2; at most 1
            without a mask).
        min_background: visible background share below which a crop takes the plane fallback.

    Returns:
        (B, 3, H, W) illumination, floored at 1/255; arbitrary for crops without background.
    """
    B, C, H, W = x.shape
    w = torch.ones_like(x[:, :1]) if mask is None else 1.0 - mask
    if mask is None:
        degree = min(degree, 1)  # a quadratic would fit the (unmasked) cell as a bump
    share = w.sum(dim=(2, 3), keepdim=True) / float(H * W)
    surface = polynomial_surface(x, w, degree).clamp_min(ILLUMINATION_FLOOR)
    smooth = surface * normalised_convolution(x / surface, w, default_sigma(x, sigma), prior=torch.ones((), dtype=x.dtype, device=x.device))
    plane = surface if degree <= 1 else polynomial_surface(x, w, 1).clamp_min(ILLUMINATION_FLOOR)
    return torch.where(share < min_background, plane, smooth).clamp_min(ILLUMINATION_FLOOR)


_NO_BACKGROUND = "have no background pixel (mask 1 everywhere), so they were returned unchanged"


def _flatten(
    x: torch.Tensor, mask: torch.Tensor | None, sigma: float | None, degree: int, min_background: float, target: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The flattened batch and the (B,) flags of crops with some background (the others unchanged)."""
    w = torch.ones_like(x[:, :1]) if mask is None else 1.0 - mask
    total = w.sum(dim=(2, 3), keepdim=True)
    has_bg = total > 0
    total = torch.where(has_bg, total, torch.ones_like(total))
    ratio = x / estimate_illumination(x, mask, sigma, degree, min_background)
    level = _weighted_mean(x, w, total)
    if target is not None:  # the background's colour, at mean brightness `target`
        level = level * (target / level.mean(dim=1, keepdim=True).clamp_min(ILLUMINATION_FLOOR))
    ratio_level = _weighted_mean(ratio, w, total)
    valid = has_bg & (level > ILLUMINATION_FLOOR) & (ratio_level > 0)
    scale = torch.where(valid, level / torch.where(valid, ratio_level, torch.ones_like(ratio_level)), torch.ones_like(level))
    return torch.where(valid, ratio * scale, x), has_bg.view(-1)


def illumination_flattening(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    sigma: float | None = None,
    degree: int = 2,
    min_background: float = 0.1,
    level: float | None = None,
    *,
    return_applicable: bool = False,
):
    """Function twin of `IlluminationFlattening`: divide out the background's smooth illumination.

    Args:
        x: (B, 3, H, W) float images in [0, 1].
        mask: optional (B, 1, H, W) cell mask (1 = cell); recommended.
        sigma: Gaussian standard deviation in pixels (default: a quarter of the shorter side).
        degree: polynomial surface degree of the smooth path (0: plain normalised convolution).
        min_background: background share below which the plane fallback is used.
        level: None (default) keeps each crop's background mean brightness, so only the shape
            of the illumination goes; a number in (0, 1] sets the background's mean brightness
            over channels to it, keeping the background's colour, so that a gain shared by the
            crop (a lamp or exposure setting) goes too.
        return_applicable: also return the (B,) bool flags (False: no background pixel, the
            crop came back unchanged; warned).

    Returns:
        (B, 3, H, W) tensor of x's dtype and device with values in [0, 1]; with
        `return_applicable`, the tuple (output, applicable).
    """
    check_image(x)
    if mask is not None:
        mask = check_mask(mask, x)
    sigma, degree, min_background = _check_settings(sigma, degree, min_background)
    y, ok = _flatten(x.clamp(0.0, 1.0), mask, sigma, degree, min_background, _check_level(level))
    warn_not_applicable("illumination_flattening", ok, _NO_BACKGROUND)
    y = y.clamp(0.0, 1.0)
    return (y, ok) if return_applicable else y


@register("illumination_flattening")
class IlluminationFlattening(Intervention):
    """Flatten the illumination estimated from the background (see the module docstring).

    Args:
        sigma: Gaussian standard deviation in pixels for the normalised convolution (default:
            a quarter of the crop's shorter side).
        degree: degree of the least-squares polynomial surface the smooth path starts from
            (0: plain normalised convolution, 1: plane, 2: quadratic surface).
        min_background: visible background share (0 to 1) below which the plane fit is used
            alone.
        level: None (default) keeps each crop's background mean brightness (only the shape of
            the illumination goes); a number in (0, 1] sets the background's mean brightness
            over channels to it, keeping its colour, so that a per-field gain goes too.
    """

    label = "illumination flattening"

    def __init__(self, sigma: float | None = None, degree: int = 2, min_background: float = 0.1, level: float | None = None) -> None:
        super().__init__()
        self.sigma, self.degree, self.min_background = _check_settings(sigma, degree, min_background)
        self.level = _check_level(level)

    def apply(self, x, mask, params, **context):
        y, self.last_applicable = _flatten(x, mask, self.sigma, self.degree, self.min_background, self.level)
        warn_not_applicable(self.name, self.last_applicable, _NO_BACKGROUND)
        return y

    def extra_repr(self) -> str:
        return f"sigma={self.sigma}, degree={self.degree}, min_background={self.min_background}, level={self.level}"
