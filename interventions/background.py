"""Background interventions: remove the background around a cell, or give it another crop's.

They test whether a classifier reads the acquisition "leak" from the background rather than
from the cell (the paper's background removal and its H4 background transplant). All need a
cell mask m (1 = cell, 0 = background; soft values blend) and write

    y = m * x + (1 - m) * f,

so pixels with m == 1 stay bit-identical and pixels with m == 0 become exactly the fill f.
Statistics "of the background" are weighted by w = 1 - m: for a 0/1 mask they are the plain
mean and standard deviation over the mask == 0 pixels, per crop and per channel. Units: the
input's linear [0, 1] intensities.

- `background_removal` (deterministic): f is a constant grey or RGB `value`
  (``fill="constant"``), or the crop's own background mean colour (``fill="mean"``).
- `background_noise` (stochastic): f = clamp(mu + sd * z, 0, 1) with mu, sd the crop's own
  background mean and standard deviation per channel and z ~ N(0, 1) i.i.d. per pixel. It is
  a separate registered intervention because randomness is a class attribute
  (``stochastic``); the `background_removal` function also takes ``fill="noise"``.
- `background_transplant` (stochastic): f is another crop's background with that donor's own
  cell removed. The donor's cell pixels are filled from the donor's background by normalised
  convolution, F = (G_s * (w_d x_d) + lam mu_d) / (G_s * w_d + lam), a Gaussian-weighted mean
  of the nearby background that falls back smoothly to the donor's background mean mu_d where
  almost no background lies within reach of the Gaussian (lam = 0.01 of the kernel mass).
  Donors are a random derangement of the batch (no crop keeps its own background), or images
  given explicitly with ``donors=`` and ``donor_masks=``.

Crops without any background pixel (mask 1 everywhere) are returned unchanged by removal and
noise; such a crop cannot lend a background, and asking it to raises `InterventionError`.
A crop whose mask is empty (no cell pixel: a failed segmentation, or a tile of background)
has nothing to keep: removal and noise fill all of it and transplant gives it the donor's
background whole, so no trace of the crop's own background survives (an intervention that
removes the background must never let it through). Such crops are flagged False in
`last_applicable` (the function twins return the flags with ``return_applicable=True``), and
each call warns once with their count (`InterventionWarning`): drop or count them.

Example:
    >>> import torch
    >>> x = torch.rand(2, 3, 8, 8)
    >>> m = torch.zeros(2, 1, 8, 8); m[..., 2:6, 2:6] = 1
    >>> y = background_removal(x, m, fill="constant", value=0.5)
    >>> bool(torch.equal(y[..., 2:6, 2:6], x[..., 2:6, 2:6])), float(y[0, 0, 0, 0])
    (True, 0.5)
"""

from __future__ import annotations

import math
from typing import Any, Literal, Sequence

import torch
from kornia.filters import gaussian_blur2d

from .base import Intervention, InterventionError, check_image, check_mask, warn_not_applicable
from .registry import register

Fill = Literal["constant", "mean", "noise"]
FILLS = ("constant", "mean", "noise")

# Weight (in units of the Gaussian kernel's mass) below which normalised convolution leans on
# its fallback: at a local background share of lam it is half the local mean, half the fallback.
LOCAL_PRIOR_WEIGHT = 0.01


# -- shared helpers (also used by `interventions.illumination`) ---------------------------------
def check_sigma(sigma: float | None, owner: str) -> float | None:
    """Validate a Gaussian standard deviation in pixels (None: the intervention's default)."""
    if sigma is None:
        return None
    if isinstance(sigma, bool) or not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
        raise InterventionError(f"{owner} sigma must be a positive number of pixels (or None for a quarter of the crop's shorter side); got {sigma!r}")
    return float(sigma)


def default_sigma(x: torch.Tensor, sigma: float | None) -> float:
    """`sigma`, or a quarter of the crop's shorter side in pixels (at least 0.5)."""
    return sigma if sigma is not None else max(min(x.shape[-2:]) / 4.0, 0.5)


def gaussian_smooth(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Gaussian blur with zero padding, for normalised convolution.

    Zero padding is what normalised convolution wants: numerator and denominator see the same
    missing pixels beyond the border, so their ratio averages the pixels inside only. The kernel
    spans +-3 sigma, cut at the image extent (wider taps would only multiply padding).

    Args:
        x: (B, C, H, W) tensor.
        sigma: standard deviation in pixels.
    """
    H, W = x.shape[-2:]
    k = 2 * math.ceil(3 * sigma) + 1
    ky, kx = min(k, 2 * H - 1), min(k, 2 * W - 1)
    if ky == 1 and kx == 1:
        return x
    return gaussian_blur2d(x, (ky, kx), (sigma, sigma), border_type="constant")


def normalised_convolution(x: torch.Tensor, w: torch.Tensor, sigma: float, prior: torch.Tensor, lam: float = LOCAL_PRIOR_WEIGHT) -> torch.Tensor:
    """Gaussian-weighted mean of x over the pixels weighted by w, with a fallback where w is scarce.

    Computes (G_s * (w x) + lam prior) / (G_s * w + lam), where G_s has unit mass, so that G_s * w
    is the local share of usable pixels. Where that share is well above lam the result is the
    normalised convolution G_s * (w x) / G_s * w; where it drops towards zero it moves smoothly
    to `prior`.

    Args:
        x: (B, C, H, W) values.
        w: (B, 1, H, W) weights in [0, 1] (1 = usable pixel).
        sigma: Gaussian standard deviation in pixels.
        prior: fallback, broadcastable to x (e.g. a (B, C, 1, 1) mean or a (B, C, H, W) surface).
        lam: fallback weight, in units of kernel mass.

    Returns:
        (B, C, H, W) smooth estimate.
    """
    C = x.shape[1]
    smoothed = gaussian_smooth(torch.cat([w * x, w], dim=1), sigma)
    num, den = smoothed[:, :C], smoothed[:, C:]
    return (num + lam * prior) / (den + lam)


def background_stats(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-crop, per-channel background mean and standard deviation, weighted by w = 1 - mask.

    Args:
        x: (B, C, H, W) images.
        mask: (B, 1, H, W) float cell mask in [0, 1].

    Returns:
        mean (B, C, 1, 1), std (B, C, 1, 1) (population std, zero where undefined) and
        has_background (B, 1, 1, 1) bool: the crop has some background weight. Mean and std of
        crops without background are 0.
    """
    w = 1.0 - mask
    total = w.sum(dim=(2, 3), keepdim=True)
    has_bg = total > 0
    denom = torch.where(has_bg, total, torch.ones_like(total))
    mean = (w * x).sum(dim=(2, 3), keepdim=True) / denom
    var = (w * (x - mean) ** 2).sum(dim=(2, 3), keepdim=True) / denom
    return mean, var.clamp_min(0).sqrt(), has_bg


_EMPTY_MASK = "have an empty cell mask (no cell pixel), so the whole crop was replaced"


def _flag_empty_masks(t: Intervention, mask: torch.Tensor) -> None:
    """Set t.last_applicable (False: the crop's mask is empty) and warn with the count."""
    t.last_applicable = mask.flatten(1).amax(1) > 0 if mask.numel() else torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    warn_not_applicable(t.name, t.last_applicable, _EMPTY_MASK)


def _blend(x: torch.Tensor, mask: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    # m * x + (1 - m) * f is exact at both ends: m == 1 gives x, m == 0 gives f.
    return mask * x + (1.0 - mask) * fill


def _check_fill(fill: str, value: Any) -> tuple[str, tuple[float, float, float]]:
    if fill not in FILLS:
        raise InterventionError(f"background_removal fill must be one of {', '.join(map(repr, FILLS))}; got {fill!r}")
    if isinstance(value, bool):
        raise InterventionError(f"background_removal value must be a grey level in [0, 1] or an (R, G, B) triple; got {value!r}")
    if isinstance(value, (int, float)):
        rgb = (float(value),) * 3
    elif isinstance(value, Sequence) and len(value) == 3 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        rgb = tuple(float(v) for v in value)
    else:
        raise InterventionError(f"background_removal value must be a grey level in [0, 1] or an (R, G, B) triple; got {value!r}")
    if not all(0.0 <= v <= 1.0 for v in rgb):
        raise InterventionError(f"background_removal value must lie in [0, 1] per channel; got {value!r}")
    return fill, rgb  # type: ignore[return-value]


# -- background removal ----------------------------------------------------------------------------
def background_removal(
    x: torch.Tensor,
    mask: torch.Tensor,
    fill: Fill = "constant",
    value: float | tuple[float, float, float] = 0.5,
    *,
    generator: torch.Generator | None = None,
    return_applicable: bool = False,
):
    """Function twin of `BackgroundRemoval`: replace the background outside the cell mask.

    Args:
        x: (B, 3, H, W) float images in [0, 1].
        mask: (B, 1, H, W) cell mask (1 = cell), bool, 0/1 or soft floats in [0, 1].
        fill: "constant" (the grey or RGB `value`), "mean" (each crop's background mean colour)
            or "noise" (Gaussian noise with each crop's background mean and std, drawn from
            `generator`; the same as `background_noise`).
        value: the constant fill, a grey level or an (R, G, B) triple in [0, 1].
        generator: CPU generator for fill="noise".
        return_applicable: also return the (B,) bool flags (False: the crop's mask is empty,
            so all of it is fill; warned).

    Returns:
        (B, 3, H, W) tensor of x's dtype and device; with `return_applicable`, the tuple
        (output, applicable).
    """
    t = BackgroundNoise() if fill == "noise" else BackgroundRemoval(fill=fill, value=value)
    y = t(x, mask, generator=generator) if fill == "noise" else t(x, mask)
    return (y, t.last_applicable) if return_applicable else y


@register("background_removal")
class BackgroundRemoval(Intervention):
    """Fill the background outside the cell mask with a constant or the crop's own mean colour.

    See the module docstring for the formula. Crops without background pixels come back
    unchanged under fill="mean"; crops with an empty mask come back all fill, flagged False in
    `last_applicable` and warned about.

    Args:
        fill: "constant" or "mean". For Gaussian noise use the stochastic `BackgroundNoise`
            (registered as "background_noise").
        value: the constant fill, a grey level or an (R, G, B) triple in [0, 1] (fill="constant").
    """

    label = "background removal"
    requires_mask = True

    def __init__(self, fill: Literal["constant", "mean"] = "constant", value: float | tuple[float, float, float] = 0.5) -> None:
        super().__init__()
        if fill == "noise":
            raise InterventionError(
                "background_removal is deterministic, so it cannot take fill='noise': "
                "use the stochastic intervention 'background_noise' (BackgroundNoise) instead"
            )
        self.fill, self.value = _check_fill(fill, value)

    def apply(self, x, mask, params, **context):
        _flag_empty_masks(self, mask)
        if self.fill == "constant":
            f = torch.tensor(self.value, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
            return _blend(x, mask, f)
        mean, _, has_bg = background_stats(x, mask)
        return torch.where(has_bg, _blend(x, mask, mean), x)

    def extra_repr(self) -> str:
        return f"fill={self.fill!r}" + (f", value={self.value}" if self.fill == "constant" else "")


def background_noise(x: torch.Tensor, mask: torch.Tensor, *, generator: torch.Generator | None = None, return_applicable: bool = False):
    """Function twin of `BackgroundNoise`: background replaced by noise of its own mean and std.

    Args:
        x: (B, 3, H, W) float images in [0, 1].
        mask: (B, 1, H, W) cell mask (1 = cell).
        generator: CPU generator for the noise.
        return_applicable: also return the (B,) bool flags (False: empty mask, all noise).
    """
    t = BackgroundNoise()
    y = t(x, mask, generator=generator)
    return (y, t.last_applicable) if return_applicable else y


@register("background_noise")
class BackgroundNoise(Intervention):
    """Fill the background with Gaussian noise of the crop's own background mean and std.

    f = clamp(mu + sd * z, 0, 1) per channel, z ~ N(0, 1) i.i.d. per pixel; see the module
    docstring. Parameters: ``{"noise": z}``, a (B, 3, H, W) standard normal tensor. Crops
    without background pixels come back unchanged; crops with an empty mask come back all
    noise, flagged False in `last_applicable` and warned about.
    """

    label = "background noise"
    requires_mask = True
    stochastic = True

    def __init__(self, generator: torch.Generator | None = None) -> None:
        super().__init__(generator)

    def draw_params(self, x, generator):
        z = torch.randn(tuple(x.shape), generator=generator, dtype=torch.float64)
        return {"noise": z.to(device=x.device, dtype=x.dtype)}

    def apply(self, x, mask, params, **context):
        z = params.get("noise") if isinstance(params, dict) else None
        if not isinstance(z, torch.Tensor) or tuple(z.shape) != tuple(x.shape):
            got = tuple(z.shape) if isinstance(z, torch.Tensor) else repr(z)
            raise InterventionError(f"background_noise params must be {{'noise': tensor of shape {tuple(x.shape)}}}; got noise {got}")
        _flag_empty_masks(self, mask)
        mean, std, has_bg = background_stats(x, mask)
        f = (mean + std * z.to(device=x.device, dtype=x.dtype)).clamp(0.0, 1.0)
        return torch.where(has_bg, _blend(x, mask, f), x)


# -- background transplant ------------------------------------------------------------------------
def clean_background(x: torch.Tensor, mask: torch.Tensor, sigma: float | None = None) -> torch.Tensor:
    """Each crop with its own cell removed: cell pixels filled from the crop's background.

    The fill is the normalised convolution of the background (see the module docstring),
    falling back to the background mean far from any background; soft masks blend,
    m * fill + (1 - m) * x, so pixels with mask == 0 are returned bit-identical.

    Args:
        x: (B, 3, H, W) images in [0, 1].
        mask: (B, 1, H, W) float cell mask in [0, 1].
        sigma: Gaussian standard deviation in pixels (default: a quarter of the shorter side).

    Returns:
        (B, 3, H, W) background-only images.

    Raises:
        InterventionError: a crop has no background pixel to fill from.
    """
    mean, _, has_bg = background_stats(x, mask)
    if not bool(has_bg.all()):
        bad = torch.nonzero(~has_bg.view(-1)).view(-1).tolist()
        raise InterventionError(
            f"crop(s) {bad} have no background pixels (their mask is 1 everywhere), so they cannot lend a background; "
            "drop them from the batch or pass donors= and donor_masks= explicitly"
        )
    fill = normalised_convolution(x, 1.0 - mask, default_sigma(x, sigma), prior=mean)
    return _blend(fill.clamp(0.0, 1.0), mask, x)


def derangement(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A uniformly random permutation of range(n) without fixed points, drawn on the CPU.

    Rejection sampling of random permutations, each the argsort of n uniform float64 draws
    (about e tries on average).

    Raises:
        InterventionError: n == 1 (a single element cannot be deranged).
    """
    if n == 1:
        raise InterventionError("a derangement of one element does not exist")
    ar = torch.arange(n)
    while True:
        p = torch.rand(n, generator=generator, dtype=torch.float64).argsort()
        if not bool((p == ar).any()):
            return p


def background_transplant(
    x: torch.Tensor,
    mask: torch.Tensor,
    donors: torch.Tensor | None = None,
    donor_masks: torch.Tensor | None = None,
    *,
    sigma: float | None = None,
    params: dict[str, torch.Tensor] | None = None,
    generator: torch.Generator | None = None,
    return_applicable: bool = False,
):
    """Function twin of `BackgroundTransplant`: each cell on another crop's cleaned background.

    Args:
        x: (B, 3, H, W) float images in [0, 1].
        mask: (B, 1, H, W) cell mask (1 = cell).
        donors: optional (B, 3, H, W) images lending their backgrounds (donor i to crop i);
            default: a random derangement of the batch itself.
        donor_masks: (B, 1, H, W) cell masks of `donors` (zeros for pure background tiles);
            required with `donors`.
        sigma: Gaussian standard deviation in pixels for removing the donor's cell.
        params: a previous draw ``{"donor": LongTensor(B)}`` to replay.
        generator: CPU generator for the donor draw.
        return_applicable: also return the (B,) bool flags (False: the crop's own mask is
            empty, so it became the donor's background whole; warned).
    """
    t = BackgroundTransplant(sigma=sigma)
    y = t(x, mask, params=params, generator=generator, donors=donors, donor_masks=donor_masks)
    return (y, t.last_applicable) if return_applicable else y


@register("background_transplant")
class BackgroundTransplant(Intervention):
    """Put each cell on a background taken from another crop, the donor's own cell removed.

    y = m x + (1 - m) bg_donor, with bg_donor from `clean_background` (see the module
    docstring). By default the donors are a random derangement of the batch, drawn as
    ``{"donor": LongTensor(B)}`` (crop i gets the background of crop donor[i]); this needs
    B >= 2. Pass ``donors=`` and ``donor_masks=`` to `forward` to lend backgrounds from other
    images instead; nothing is drawn then and `last_params` is ``{}``. A crop whose own mask
    is empty has no cell to keep and becomes the donor's background whole: flagged False in
    `last_applicable` and warned about.

    Args:
        sigma: Gaussian standard deviation in pixels for filling the donor's cell from its
            background (default: a quarter of the crop's shorter side).
        generator: default CPU generator for the donor draw.

    Example:
        >>> import torch
        >>> x = torch.rand(3, 3, 16, 16)
        >>> m = torch.zeros(3, 1, 16, 16); m[..., 6:10, 6:10] = 1
        >>> t = BackgroundTransplant()
        >>> y = t(x, m, generator=torch.Generator().manual_seed(0))
        >>> d = t.last_params["donor"]
        >>> bool(torch.equal(y[:, :, 0, 0], x[d, :, 0, 0]))
        True
    """

    label = "background transplant"
    requires_mask = True
    stochastic = True

    def __init__(self, sigma: float | None = None, generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        self.sigma = check_sigma(sigma, "background_transplant")

    def forward(self, x, mask=None, *, params=None, generator=None, donors=None, donor_masks=None, **context):
        """As `Intervention.forward`, plus explicit ``donors=`` (B, 3, H, W) and ``donor_masks=`` (B, 1, H, W)."""
        if donors is None and donor_masks is not None:
            raise InterventionError("background_transplant got donor_masks= without donors=; pass both, or neither to draw donors from the batch")
        if donors is not None:
            if params:
                raise InterventionError("background_transplant takes either donors= or params={'donor': ...}, not both")
            if donor_masks is None:
                raise InterventionError(
                    "background_transplant needs donor_masks= with donors= to remove the donors' own cells; "
                    "pass torch.zeros(B, 1, H, W) if the donors are pure background"
                )
            params = {}  # explicit donors: nothing to draw
        return super().forward(x, mask, params=params, generator=generator, donors=donors, donor_masks=donor_masks, **context)

    def draw_params(self, x, generator):
        B = x.shape[0]
        if B == 1:
            raise InterventionError(
                "background_transplant draws donors from the other crops of the batch, but the batch has only one crop; "
                "use a batch of at least 2, or pass donors= and donor_masks= explicitly"
            )
        return {"donor": derangement(B, generator).to(x.device)}

    def apply(self, x, mask, params, donors=None, donor_masks=None, **context):
        B = x.shape[0]
        if donors is not None:
            check_image(donors, "donors")
            if tuple(donors.shape) != tuple(x.shape):
                raise InterventionError(f"donors must have the images' shape {tuple(x.shape)} (one donor per crop); got {tuple(donors.shape)}")
            if donors.device != x.device:
                raise InterventionError(f"donors are on {donors.device} but the images are on {x.device}; move both to one device")
            d_x = donors.to(x.dtype).clamp(0.0, 1.0)
            d_m = check_mask(donor_masks, d_x, "donor_masks")
        else:
            donor = params.get("donor") if isinstance(params, dict) else None
            if (
                not isinstance(donor, torch.Tensor)
                or donor.dtype not in (torch.int64, torch.int32)
                or tuple(donor.shape) != (B,)
                or (B and not (int(donor.min()) >= 0 and int(donor.max()) < B))
            ):
                got = f"{tuple(donor.shape)} {donor.dtype}" if isinstance(donor, torch.Tensor) else repr(donor)
                raise InterventionError(f"background_transplant params must be {{'donor': LongTensor of shape ({B},) with indices in [0, {B})}}; got {got}")
            donor = donor.to(device=x.device, dtype=torch.long)
            d_x, d_m = x[donor], mask[donor]
        bg = clean_background(d_x, d_m, default_sigma(x, self.sigma))
        _flag_empty_masks(self, mask)
        return _blend(x, mask, bg)

    def extra_repr(self) -> str:
        return ", ".join(filter(None, [super().extra_repr(), f"sigma={self.sigma}" if self.sigma is not None else ""]))
