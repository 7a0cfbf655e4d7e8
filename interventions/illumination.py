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

Speed: the Gaussian of the normalised convolution spans most of the crop at a quarter of its
side (2 x 168 + 1 taps at 224 px), which made kornia's separable convolution cost 45 ms a crop.
It runs instead as matrix products along each axis with the same taps and zero padding
(`_AxisBlur`: the uncut Gaussian's 12-18 leading eigenvectors less the two corner blocks
beyond the cut, equal to the convolution to float64 rounding); the least-squares surfaces come
from one product per crop with the monomials' pairwise products (normal equations in
float64), and on CPU the batch goes in chunks of about 10 crops of 224 px, written straight into
the output. `tests/test_interventions_illumination.py` checks the result against the same
formula built on scipy's `gaussian_filter`.

Example:
    >>> import torch
    >>> u = torch.linspace(0.6, 1.0, 32).view(1, 1, 1, 32)
    >>> x = (0.8 * u).expand(1, 3, 32, 32)               # a flat background under a gradient
    >>> y = illumination_flattening(x)
    >>> float(y.std()) < 1e-4
    True
"""

from __future__ import annotations

import functools
import math

import torch
from kornia.filters import get_gaussian_kernel1d

from .background import LOCAL_PRIOR_WEIGHT, check_sigma, default_sigma
from .base import Intervention, InterventionError, check_image, check_mask, warn_not_applicable
from .memory import Workspace, new_output
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


@functools.lru_cache(maxsize=16)
def _basis_cached(H: int, W: int, degree: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(K, H*W) monomials 1, u, v[, u^2, u v, v^2] on coordinates in [-1, 1], their (H*W, P)
    pairwise products phi_i phi_j for i <= j (the Gram matrix of a crop is its weights times
    these: one product, over the P = K (K + 1) / 2 distinct entries of the symmetric matrix),
    and the (K*K,) index of each Gram entry among them."""
    v = torch.linspace(-1.0, 1.0, H, dtype=dtype, device=device).view(H, 1).expand(H, W)
    u = torch.linspace(-1.0, 1.0, W, dtype=dtype, device=device).view(1, W).expand(H, W)
    terms = [torch.ones_like(u)]
    if degree >= 1:
        terms += [u, v]
    if degree >= 2:
        terms += [u * u, u * v, v * v]
    phi = torch.stack(terms).reshape(len(terms), H * W)
    K = len(terms)
    iu, ju = torch.triu_indices(K, K)
    pairs = (phi[iu] * phi[ju]).T.contiguous()
    index = torch.zeros((K, K), dtype=torch.long)
    index[iu, ju] = index[ju, iu] = torch.arange(len(iu))
    return phi, pairs, index.reshape(-1).to(device)


def polynomial_surface(x: torch.Tensor, w: torch.Tensor, degree: int, out: torch.Tensor | None = None, work: Workspace | None = None) -> torch.Tensor:
    """Weighted least-squares polynomial surface per crop and channel, evaluated on the grid.

    The normal equations of every crop come from two matrix products (the weights times the
    pairwise products of the monomials, and the weighted values times the monomials), are
    solved batched in float64 and the surface is one product of the coefficients with the
    monomials in x's dtype.

    Args:
        x: (B, C, H, W) values.
        w: (B, 1, H, W) weights in [0, 1] (the background); a crop with zero total weight gets
            a zero surface.
        degree: 0 (constant: the weighted mean), 1 (plane a + b u + c v) or 2 (quadratic).
        out: optional contiguous (B, C, H, W) tensor of x's dtype to write the surface to.
        work: optional `memory.Workspace` whose buffers the large intermediates reuse.

    Returns:
        (B, C, H, W) surface in x's dtype; u, v run over [-1, 1] across the crop.
    """
    B, C, H, W = x.shape
    wdt = torch.float32 if x.device.type == "mps" else torch.float64  # mps has no float64
    phi, pairs, index = _basis_cached(H, W, degree, wdt, str(x.device))
    K = phi.shape[0]
    ww = w.reshape(B, H * W).to(wdt) if work is None else work.take("surface_w", (B, H * W), wdt, x.device).copy_(w.reshape(B, H * W))
    total = ww.sum(1)  # (B,)
    has_bg = total > 0
    norm = torch.where(has_bg, total, torch.ones_like(total)).view(B, 1, 1)
    gram = (ww @ pairs)[:, index].view(B, K, K) / norm
    # the product is in float64, in memory marked for huge pages (see `memory`)
    xw = new_output((B, C, H * W), wdt, x.device) if work is None else work.take("surface_xw", (B, C, H * W), wdt, x.device)
    xw.copy_(x.reshape(B, C, H * W)).mul_(ww[:, None, :])  # (a mixed-dtype product casts slowly)
    rhs = torch.matmul(xw, phi.T).transpose(1, 2) / norm  # (B, K, C)
    ridge = torch.full((K,), _RIDGE, dtype=wdt, device=x.device)
    ridge[0] = 0.0
    eye = torch.eye(K, dtype=wdt, device=x.device)
    gram = torch.where(has_bg.view(B, 1, 1), gram + torch.diag(ridge), eye)
    coef = torch.linalg.solve(gram, rhs)  # (B, K, C)
    coef = torch.where(has_bg.view(B, 1, 1), coef, torch.zeros_like(coef))  # no background: a zero surface
    if out is None:
        out = torch.empty((B, C, H, W), dtype=x.dtype, device=x.device)
    torch.matmul(coef.transpose(1, 2).to(x.dtype), _basis_as(H, W, degree, wdt, x.dtype, str(x.device)), out=out.view(B, C, H * W))
    return out


@functools.lru_cache(maxsize=16)
def _basis_as(H: int, W: int, degree: int, wdt: torch.dtype, dtype: torch.dtype, device: str) -> torch.Tensor:
    """`_basis_cached`'s monomials (made in wdt) cast to dtype, kept for the next chunk."""
    return _basis_cached(H, W, degree, wdt, device)[0].to(dtype)


class _AxisBlur:
    """The Gaussian of `background.gaussian_smooth` along one axis of n pixels, as a matrix.

    kornia's taps (``get_gaussian_kernel1d``: exp(-d^2 / 2 sigma^2) for |d| <= R, R = 3 sigma
    rounded up and cut at n - 1, normalised to sum 1) with zero padding make the blur of a
    (H, W) image X the product G_H X G_W^T with G[i, j] = g(i - j) [|i - j| <= R]. At a
    quarter of the crop, R spans most of the crop, so G is dense; but G = F - T, where F is the
    same Gaussian without the cut (smooth, so of numerically low rank: 12-18 eigenvalues above
    1e-13 of the largest whenever sigma is a quarter of n) and T the part beyond the cut, two
    (n - R - 1)-sided corner blocks. Applying U diag(lam) U^T (F's leading eigenpairs) and the
    corners costs 3-4 times fewer multiplications than the dense G at 224 px, and agrees with it
    to rounding. Where the rank is not low (a small sigma), the dense matrix is used.
    """

    def __init__(self, n: int, sigma: float, dtype: torch.dtype, device: str) -> None:
        k = min(2 * math.ceil(3 * sigma) + 1, 2 * n - 1)
        R = k // 2
        g = get_gaussian_kernel1d(k, sigma, dtype=torch.float64).reshape(-1)
        i = torch.arange(n)
        d = i[None, :] - i[:, None]
        self.dense = None
        self.R, self.m = R, n - R - 1
        full = torch.exp(-(d.to(torch.float64) ** 2) / (2.0 * sigma * sigma)) * g[R]  # F: the same taps, uncut
        lam, vec = torch.linalg.eigh(full)
        keep = lam.abs() > _LOW_RANK_TOL * lam.abs().max()
        r = int(keep.sum())
        if 2 * r + 2 * max(self.m, 0) ** 2 / n > n / 2:  # not cheaper than the dense product
            inside = d.abs() <= R
            self.dense = torch.where(inside, full, torch.zeros((), dtype=torch.float64)).to(dtype=dtype, device=device)
            return
        self.U = vec[:, keep].to(dtype=dtype, device=device)  # (n, r)
        self.LUt = (lam[keep, None] * vec[:, keep].T).to(dtype=dtype, device=device)  # diag(lam) U^T, (r, n)
        # T's upper-right block: T[i, R + 1 + j] for i, j < m (zero where the offset is within R)
        corner = full[: self.m, R + 1 :]
        self.TU = torch.where(d[: self.m, R + 1 :] > R, corner, torch.zeros((), dtype=torch.float64)).to(dtype=dtype, device=device)

    def last(self, x: torch.Tensor, work: Workspace | None = None) -> torch.Tensor:
        """x (..., n) times G (G is symmetric): the blur along the last axis (the result in a
        buffer of `work` when given)."""
        if self.dense is not None:
            return torch.matmul(x, self.dense)
        x2 = x.reshape(-1, x.shape[-1])
        y = None if work is None else work.take("blur_last", x2.shape, x.dtype, x.device)
        y = torch.matmul(torch.matmul(x2, self.U), self.LUt, out=y)
        if self.m > 0:  # less the corners beyond the cut, added in place into column slices
            R, m = self.R, self.m
            y[:, :m].addmm_(x2[:, R + 1 :], self.TU.T, alpha=-1.0)
            y[:, R + 1 :].addmm_(x2[:, :m], self.TU, alpha=-1.0)
        return y.view(x.shape)

    def rows(self, x: torch.Tensor, work: Workspace | None = None) -> torch.Tensor:
        """G times x (..., n, W): the blur along the second-last axis (the result in a buffer
        of `work` when given)."""
        if self.dense is not None:
            return torch.matmul(self.dense, x)
        x3 = x.reshape(-1, *x.shape[-2:])
        y = None if work is None else work.take("blur_rows", x3.shape, x.dtype, x.device)
        y = torch.matmul(self.LUt.T, torch.matmul(self.U.T, x3), out=y)
        if self.m > 0:  # (a product with the corner broadcast over the batch and a subtraction: an
            # in-place baddbmm with a stride-0 batch runs as one small addmm per image, 4x slower)
            R, m = self.R, self.m
            shape = (x3.shape[0], m, x3.shape[2])
            t = None if work is None else work.take("blur_corner", shape, x.dtype, x.device)
            y[:, :m].sub_(torch.matmul(self.TU, x3[:, R + 1 :], out=t))
            t = None if work is None else work.take("blur_corner", shape, x.dtype, x.device)
            y[:, R + 1 :].sub_(torch.matmul(self.TU.T, x3[:, :m], out=t))
        return y.view(x.shape)


_LOW_RANK_TOL = 1e-13  # eigenvalues of the uncut Gaussian kept, relative to the largest: float64 rounding


@functools.lru_cache(maxsize=16)
def _axis_blur(n: int, sigma: float, dtype: torch.dtype, device: str) -> _AxisBlur:
    return _AxisBlur(n, sigma, dtype, device)


def _smooth(p: torch.Tensor, sigma: float, work: Workspace | None = None) -> torch.Tensor:
    """`background.gaussian_smooth` of (B, C, H, W) as matrix products along each axis (same
    taps, same zero padding; see `_AxisBlur`): at a quarter of the crop the kernel spans the
    crop, where kornia's separable convolution with its 2 x 168 + 1 taps (224 px) is slow."""
    H, W = p.shape[-2:]
    dev = str(p.device)
    return _axis_blur(H, sigma, p.dtype, dev).rows(_axis_blur(W, sigma, p.dtype, dev).last(p, work), work)


def _weighted_mean(x: torch.Tensor, w: torch.Tensor, total: torch.Tensor, work: Workspace | None = None) -> torch.Tensor:
    """(B, C, 1, 1) means of x (B, C, H, W) weighted by w (B, 1, H, W), over `total` (B, 1, 1, 1).
    A product and torch's pairwise sum, not a bmm: in float32 a bmm's running sum over a 224 x 224
    crop drifts by 1e-4 relative, which the output then carries."""
    wx = torch.mul(w, x) if work is None else torch.mul(w, x, out=work.take("weighted", x.shape, x.dtype, x.device))
    return wx.sum(dim=(2, 3), keepdim=True) / total


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
    w = torch.ones_like(x[:, :1]) if mask is None else 1.0 - mask
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return _illumination(x, w, mask is not None, default_sigma(x, sigma), degree, min_background, out)


def _illumination(x: torch.Tensor, w: torch.Tensor, masked: bool, sigma: float, degree: int, min_background: float, out: torch.Tensor,
                  work: Workspace | None = None) -> torch.Tensor:
    """`estimate_illumination` with the background weights w (B, 1, H, W) given, written to `out`
    (contiguous, like x); `work` the buffers the chunks of one call reuse, or None."""
    B, C, H, W = x.shape
    if not masked:
        degree = min(degree, 1)  # a quadratic would fit the (unmasked) cell as a bump
    share = w.sum(dim=(2, 3)).view(B) / float(H * W)
    surface = polynomial_surface(x, w, degree, out=out, work=work).clamp_min_(ILLUMINATION_FLOOR)
    # normalised convolution of x / Q with the fallback 1 (`background.normalised_convolution`),
    # numerator and denominator blurred together: (G*(w x/Q) + lam) / (G*w + lam)
    stack = new_output((B, C + 1, H, W), x.dtype, x.device) if work is None else work.take("stack", (B, C + 1, H, W), x.dtype, x.device)
    torch.div(x, surface, out=stack[:, :C]).mul_(w)
    stack[:, C:] = w
    blurred = _smooth(stack, sigma, work).add_(LOCAL_PRIOR_WEIGHT)
    few = torch.nonzero(share < min_background)[:, 0]
    plane = None
    if len(few):  # too little background to smooth: the plane alone
        plane = surface[few] if degree <= 1 else polynomial_surface(x[few], w[few], 1)
    illum = surface.mul_(blurred[:, :C].div_(blurred[:, C:]))
    if plane is not None:
        illum[few] = plane
    return illum.clamp_min_(ILLUMINATION_FLOOR)


_NO_BACKGROUND = "have no background pixel (mask 1 everywhere), so they were returned unchanged"
_CPU_CHUNK_PIXELS = 1 << 19  # pixels per CPU chunk (10 crops of 224 x 224): measured fastest of 2^16-2^21


def _flatten(
    x: torch.Tensor, mask: torch.Tensor | None, sigma: float | None, degree: int, min_background: float, target: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The flattened batch (a new contiguous tensor, clamped to [0, 1]) and the (B,) flags of
    crops with some background (the others unchanged); on CPU in chunks of about
    `_CPU_CHUNK_PIXELS` pixels (every step is per crop), each written straight into the output
    and clamped there while it is in cache."""
    B, _, H, W = x.shape
    out = new_output(x.shape, x.dtype, x.device)
    ok = torch.empty(B, dtype=torch.bool, device=x.device)
    step = B if x.device.type != "cpu" else max(1, min(B, _CPU_CHUNK_PIXELS // max(H * W, 1)))
    s = default_sigma(x, sigma)
    work = Workspace()  # the chunks' large intermediates, reused from chunk to chunk
    for i in range(0, max(B, 1), step):
        j = min(i + step, B)
        w = work.take("w", (j - i, 1, H, W), x.dtype, x.device)
        if mask is None:
            w.fill_(1.0)
        else:
            w.copy_(mask[i:j]).neg_().add_(1.0)  # 1 - mask, exactly as 1.0 - mask
        ok[i:j] = _flatten_chunk(x[i:j], w, mask is not None, s, degree, min_background, target, out[i:j], work)
    return out, ok


def _flatten_chunk(
    x: torch.Tensor, w: torch.Tensor, masked: bool, sigma: float, degree: int, min_background: float, target: float | None, out: torch.Tensor,
    work: Workspace | None = None,
) -> torch.Tensor:
    """Flatten x (B, 3, H, W) with background weights w into `out` (`work`: reused buffers, or
    None); returns the (B,) flags of crops with some background."""
    total = w.sum(dim=(2, 3), keepdim=True)
    has_bg = total > 0
    total = torch.where(has_bg, total, torch.ones_like(total))
    ratio = _illumination(x, w, masked, sigma, degree, min_background, out, work)
    ratio = torch.div(x, ratio, out=ratio)
    level = _weighted_mean(x, w, total, work)
    if target is not None:  # the background's colour, at mean brightness `target`
        level = level * (target / level.mean(dim=1, keepdim=True).clamp_min(ILLUMINATION_FLOOR))
    ratio_level = _weighted_mean(ratio, w, total, work)
    valid = has_bg & (level > ILLUMINATION_FLOOR) & (ratio_level > 0)
    scale = torch.where(valid, level / torch.where(valid, ratio_level, torch.ones_like(ratio_level)), torch.ones_like(level))
    y = ratio.mul_(scale).clamp_(0.0, 1.0)
    if not bool(valid.all()):
        y.copy_(torch.where(valid, y, x))
    return has_bg.view(-1)


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
    lo, hi = check_image(x)
    if mask is not None:
        mask = check_mask(mask, x)
    sigma, degree, min_background = _check_settings(sigma, degree, min_background)
    y, ok = _flatten(x if 0.0 <= lo and hi <= 1.0 else x.clamp(0.0, 1.0), mask, sigma, degree, min_background, _check_level(level))
    warn_not_applicable("illumination_flattening", ok, _NO_BACKGROUND)
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
    output_in_range = True  # `_flatten` clamps each chunk

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
