"""Illumination flattening: removes an applied gradient or vignette, keeps contrast; both paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter

import interventions
from interventions import IlluminationFlattening, InterventionError, InterventionWarning, illumination_flattening
from interventions.background import LOCAL_PRIOR_WEIGHT, gaussian_smooth

N = 64
BG = torch.tensor([0.85, 0.80, 0.90], dtype=torch.float64).view(1, 3, 1, 1)
CELL = torch.tensor([0.45, 0.30, 0.50], dtype=torch.float64).view(1, 3, 1, 1)


def _grid(n=N):
    yy, xx = torch.meshgrid(torch.arange(n, dtype=torch.float64), torch.arange(n, dtype=torch.float64), indexing="ij")
    return yy, xx


def _scene(noise=0.005, seed=0):
    """A flat background and a flat cell (disc of radius N/4), with 0.5 % pixel noise."""
    yy, xx = _grid()
    mask = (((yy - N / 2 + 0.5) ** 2 + (xx - N / 2 + 0.5) ** 2) < (N / 4) ** 2).to(torch.float64).view(1, 1, N, N)
    g = torch.Generator().manual_seed(seed)
    flat = mask * CELL + (1 - mask) * BG + noise * torch.randn(1, 3, N, N, generator=g, dtype=torch.float64)
    return flat.clamp(0, 1), mask


def _shading(kind):
    yy, xx = _grid()
    if kind == "ramp":  # 40 % linear ramp left to right
        return 0.6 + 0.4 * xx / (N - 1)
    r2 = (yy - 20) ** 2 + (xx - 45) ** 2  # off-centre vignette, 40 % darker at the far corner
    return 1 - 0.4 * r2 / r2.max()


def _cv(x, region):
    """Largest per-channel coefficient of variation over the region's pixels."""
    return max(float(x[0, c][region].std() / x[0, c][region].mean()) for c in range(3))


def _contrast(x, mask):
    """Per-channel ratio of the mean cell level to the mean background level."""
    m = mask[0, 0].bool()
    return torch.stack([x[0, c][m].mean() / x[0, c][~m].mean() for c in range(3)])


@pytest.mark.parametrize("kind", ["ramp", "vignette"])
def test_flattening_removes_an_applied_gradient(kind):
    flat, mask = _scene()
    x = flat * _shading(kind)
    y = illumination_flattening(x, mask)
    bg = ~mask[0, 0].bool()
    before, after, floor = _cv(x, bg), _cv(y, bg), _cv(flat, bg)
    assert before > 0.09
    assert after < before / 10, f"background CV only fell from {before:.4f} to {after:.4f}"
    assert after < 1.2 * floor  # down to the noise the scene had before shading
    # cell/background contrast of the unshaded scene is kept (within 1 %)
    torch.testing.assert_close(_contrast(y, mask), _contrast(flat, mask), rtol=0.01, atol=0)
    # the background keeps its mean brightness exactly
    torch.testing.assert_close(y[0][:, bg].mean(dim=1), x[0][:, bg].mean(dim=1), rtol=1e-10, atol=0)
    # and the cell is flat again too
    assert _cv(y, ~bg) < 1.5 * _cv(flat, ~bg)


def test_degree_zero_is_plain_normalised_convolution():
    """degree=0 is I = G*(w x) / G*w (with the local fallback), checked against scipy."""
    flat, mask = _scene()
    x = flat * _shading("vignette")
    sigma = 4.0  # +-3 sigma = 12 px in both kornia and scipy
    y = illumination_flattening(x, mask, sigma=sigma, degree=0)
    xn, w = x[0].numpy(), 1 - mask[0, 0].numpy()
    den = gaussian_filter(w, sigma, mode="constant", cval=0.0, truncate=3.0)
    ref = np.empty_like(xn)
    for c in range(3):
        level = (w * xn[c]).sum() / w.sum()
        illum = (gaussian_filter(w * xn[c], sigma, mode="constant", cval=0.0, truncate=3.0) + LOCAL_PRIOR_WEIGHT * level) / (den + LOCAL_PRIOR_WEIGHT)
        ratio = xn[c] / illum
        ref[c] = np.clip(ratio * level / ((w * ratio).sum() / w.sum()), 0, 1)
    np.testing.assert_allclose(y[0].numpy(), ref, atol=1e-10, rtol=0)
    # and the plain version is clearly worse on a vignette at the default sigma than the default
    bg = ~mask[0, 0].bool()
    assert _cv(illumination_flattening(x, mask), bg) < _cv(illumination_flattening(x, mask, degree=0), bg) / 4


def _corner_mask(n=40, k=6):
    """All cell except four corner triangles of k(k+1)/2 px each: 84 / 1600 = 5.25 % background."""
    yy, xx = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    far = n - 1
    bg = (yy + xx < k) | (yy + far - xx < k) | (far - yy + xx < k) | (2 * far - yy - xx < k)
    return (~bg).to(torch.float64).view(1, 1, n, n)


def test_plane_fallback_with_five_percent_background():
    n = 40
    mask = _corner_mask(n)
    share = float(1 - mask.mean())
    assert 0.04 < share < 0.06
    g = torch.Generator().manual_seed(2)
    yy, xx = torch.meshgrid(torch.arange(n, dtype=torch.float64), torch.arange(n, dtype=torch.float64), indexing="ij")
    shade = 0.55 + 0.25 * xx / (n - 1) + 0.2 * yy / (n - 1)
    noise = 0.01 * torch.randn(1, 3, n, n, generator=g, dtype=torch.float64) * (1 - mask)
    flat = mask * CELL + (1 - mask) * (BG + noise)
    x = flat * shade
    y = illumination_flattening(x, mask)
    # independent reference: a least-squares plane per channel on the background (numpy lstsq)
    bgm = (mask[0, 0] == 0).numpy()
    u = np.linspace(-1, 1, n)[None, :].repeat(n, 0)
    v = np.linspace(-1, 1, n)[:, None].repeat(n, 1)
    A = np.stack([np.ones(bgm.sum()), u[bgm], v[bgm]], axis=1)
    ref = np.empty((3, n, n))
    for c in range(3):
        xc = x[0, c].numpy()
        coef, *_ = np.linalg.lstsq(A, xc[bgm], rcond=None)
        plane = coef[0] + coef[1] * u + coef[2] * v
        ratio = xc / plane
        ref[c] = np.clip(ratio * xc[bgm].mean() / ratio[bgm].mean(), 0, 1)
    np.testing.assert_allclose(y[0].numpy(), ref, atol=1e-5, rtol=0)
    # the ramp is gone from the (flat) cell
    cell = mask[0, 0].bool()
    assert _cv(x, cell) > 0.1 and _cv(y, cell) < 0.01
    # it really is the fallback: allowing the smooth path on so little background changes the result
    assert (illumination_flattening(x, mask, min_background=0.0) - y).abs().max() > 1e-3


def test_a_crop_without_background_comes_back_unchanged_flagged():
    flat, mask = _scene()
    x = torch.cat([flat, flat]) * _shading("ramp")
    masks = torch.cat([torch.ones_like(mask), mask])
    t = IlluminationFlattening()
    with pytest.warns(InterventionWarning, match="illumination_flattening: 1 of 2 crop.*no background pixel"):
        y = t(x, masks)
    assert torch.equal(y[0], x[0])
    assert not torch.allclose(y[1], x[1], atol=1e-3)
    assert t.last_applicable.tolist() == [False, True]
    with pytest.warns(InterventionWarning, match="1 of 2"):
        _, ok = illumination_flattening(x, masks, return_applicable=True)
    assert ok.tolist() == [False, True]


def test_without_a_mask_a_pure_gradient_is_flattened():
    x = (0.8 * _shading("ramp")).expand(2, 3, N, N).contiguous()
    y = illumination_flattening(x)
    assert float(y.std()) < 1e-6
    torch.testing.assert_close(y.mean(dim=(2, 3)), x.mean(dim=(2, 3)), rtol=1e-10, atol=0)


def test_float32_matches_float64():
    flat, mask = _scene()
    x = flat * _shading("vignette")
    y64 = illumination_flattening(x, mask)
    y32 = IlluminationFlattening()(x.float(), mask.float())
    assert y32.dtype == torch.float32
    torch.testing.assert_close(y32, y64.float(), rtol=0, atol=1e-4)


def test_settings_are_checked():
    with pytest.raises(InterventionError, match="sigma must be a positive number"):
        IlluminationFlattening(sigma=0)
    with pytest.raises(InterventionError, match="degree must be 0"):
        IlluminationFlattening(degree=3)
    with pytest.raises(InterventionError, match="min_background must be a share"):
        IlluminationFlattening(min_background=1.5)
    assert interventions.get("illumination_flattening", sigma=5.0).sigma == 5.0
    with pytest.raises(InterventionError, match="level must be None"):
        IlluminationFlattening(level=0)
    with pytest.raises(InterventionError, match="level must be None"):
        IlluminationFlattening(level=1.5)


def test_level_removes_a_shared_gain_and_keeps_the_background_colour():
    """Two fields differing only in gain (0.7 vs 1.0) under the same ramp: the default keeps each
    crop's background brightness, so the gain survives; level=t gives both the same output,
    whose background has mean brightness t over channels and the scene's background colour."""
    flat, mask = _scene(noise=0.0)
    ramp = _shading("ramp")
    dim, bright = flat * ramp * 0.7, flat * ramp
    bg = ~mask[0, 0].bool()
    kept = [illumination_flattening(x, mask) for x in (dim, bright)]
    ratio = float(kept[0][0, :, bg].mean() / kept[1][0, :, bg].mean())
    assert ratio == pytest.approx(0.7, abs=0.01)  # the default: the gain is still there
    t = 0.6
    a, b = (illumination_flattening(x, mask, level=t) for x in (dim, bright))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-3)  # the gain is gone
    means = a[0][:, bg].mean(dim=1)
    assert float(means.mean()) == pytest.approx(t, abs=2e-3)
    expected = BG.view(3) / BG.view(3).mean() * t  # the background's colour at brightness t
    torch.testing.assert_close(means, expected, rtol=0, atol=3e-3)
    contrast = _contrast(a, mask) / _contrast(flat, mask)
    torch.testing.assert_close(contrast, torch.ones(3, dtype=torch.float64), rtol=0, atol=0.03)


def _scipy_blur(a, s):
    return gaussian_filter(a, s, mode="constant", cval=0.0, truncate=3.0)


def _kornia_blur(a, s):
    return gaussian_smooth(torch.from_numpy(a)[None, None], s)[0, 0].numpy()


@pytest.mark.parametrize(
    "shape, sigma, blur",
    [((224, 224), None, _scipy_blur), ((96, 160), None, _scipy_blur), ((64, 64), 20.0, _scipy_blur), ((40, 40), 4.0, _scipy_blur), ((40, 40), 100.0, _kornia_blur)],
    ids=["224px-default-sigma56", "96x160-default-sigma24", "64px-sigma20", "40px-sigma4-dense", "40px-sigma100-uncut-kornia"],
)
def test_the_blur_equals_scipy_at_any_size(shape, sigma, blur):
    """The normalised convolution's Gaussian runs as matrix products (the uncut Gaussian's leading
    eigenvectors less the corners beyond the +-3 sigma cut, or the dense matrix): degree=0 on a
    random masked crop equals the same formula built on scipy's gaussian_filter (truncate 3,
    zero padding) to 1e-10, as the kornia convolution it replaces did. Sigmas are chosen so that
    scipy's radius int(3 sigma + 0.5) equals kornia's ceil(3 sigma); where the kernel is wider
    than the crop, kornia cuts it at 2 n - 1 taps (normalised over those, unlike scipy), and
    the reference is kornia's blur."""
    H, W = shape
    g = torch.Generator().manual_seed(3)
    x = 0.2 + 0.7 * torch.rand(2, 3, H, W, generator=g, dtype=torch.float64)
    mask = (torch.rand(2, 1, H, W, generator=g, dtype=torch.float64) < 0.3).to(torch.float64)
    s = sigma if sigma is not None else min(H, W) / 4.0
    y = illumination_flattening(x, mask, sigma=sigma, degree=0)
    for b in range(2):
        xn, w = x[b].numpy(), 1 - mask[b, 0].numpy()
        den = blur(w, s)
        for c in range(3):
            level = (w * xn[c]).sum() / w.sum()
            illum = (blur(w * xn[c], s) + LOCAL_PRIOR_WEIGHT * level) / (den + LOCAL_PRIOR_WEIGHT)
            ratio = xn[c] / illum
            ref = np.clip(ratio * level / ((w * ratio).sum() / w.sum()), 0, 1)
            np.testing.assert_allclose(y[b, c].numpy(), ref, atol=1e-10, rtol=0)


def test_a_batch_in_chunks_equals_crop_by_crop():
    """On CPU a large batch runs in chunks of crops written into one output: each crop's result
    is what it gets alone (float32, 12 crops of 224 px = two chunks)."""
    g = torch.Generator().manual_seed(4)
    x = 0.1 + 0.8 * torch.rand(12, 3, 224, 224, generator=g)
    mask = torch.zeros(12, 1, 224, 224)
    mask[:, :, 60:160, 70:150] = 1.0
    mask[5] = 0.0  # no cell: all background
    y = illumination_flattening(x, mask)
    for i in (0, 5, 9, 11):
        torch.testing.assert_close(y[i : i + 1], illumination_flattening(x[i : i + 1], mask[i : i + 1]), rtol=0, atol=1e-6)
