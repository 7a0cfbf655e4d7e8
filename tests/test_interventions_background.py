"""Background removal, background noise and background transplant, against numpy/scipy references."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter

import interventions
from interventions import (
    BackgroundNoise,
    BackgroundRemoval,
    BackgroundTransplant,
    InterventionError,
    InterventionWarning,
    background_noise,
    background_removal,
    background_transplant,
)
from interventions.background import LOCAL_PRIOR_WEIGHT

H, W = 32, 32


def _crops(dtype=torch.float64, seed=0):
    """Three crops: distinct textured backgrounds, a dark cell each at a different place."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    centres = [(16, 16, 7), (10, 20, 6), (20, 11, 8)]
    mask = torch.stack([(((yy - cy) ** 2 + (xx - cx) ** 2) < r**2) for cy, cx, r in centres]).unsqueeze(1).to(torch.float64)
    bg = torch.tensor([[0.85, 0.80, 0.90], [0.70, 0.75, 0.65], [0.95, 0.90, 0.80]], dtype=torch.float64).view(3, 3, 1, 1)
    texture = 0.04 * torch.rand(3, 3, H, W, generator=g, dtype=torch.float64)
    cell = 0.15 + 0.1 * torch.rand(3, 3, H, W, generator=g, dtype=torch.float64)
    x = mask * cell + (1 - mask) * (bg - 0.02 + texture)
    return x.to(dtype), mask.to(dtype)


# -- removal ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_constant_fill_keeps_cell_bit_identical(dtype):
    x, mask = _crops(dtype)
    y = BackgroundRemoval(fill="constant", value=(0.2, 0.5, 0.9))(x, mask)
    cell = mask.bool().expand_as(x)
    assert torch.equal(y[cell], x[cell])
    fill = torch.tensor([0.2, 0.5, 0.9], dtype=dtype).view(1, 3, 1, 1).expand_as(x)
    assert torch.equal(y[~cell], fill[~cell])
    # a grey value fills all channels alike, and the function twin agrees
    grey = background_removal(x, mask, fill="constant", value=0.5)
    assert torch.equal(grey[~cell], torch.full_like(grey[~cell], 0.5))


def test_mean_fill_is_each_crops_own_background_mean():
    x, mask = _crops()
    y = background_removal(x, mask, fill="mean")
    xn, mn = x.numpy(), mask.numpy()[:, 0] == 0
    for i in range(3):
        ref = np.array([xn[i, c][mn[i]].mean() for c in range(3)])
        for c in range(3):
            np.testing.assert_allclose(y[i, c].numpy()[mn[i]], ref[c], rtol=1e-12, atol=0)
            np.testing.assert_array_equal(y[i, c].numpy()[~mn[i]], xn[i, c][~mn[i]])
    # three different crops, three different fills
    assert len({round(float(y[i, 0, 0, 0]), 6) for i in range(3)}) == 3


def test_mean_fill_leaves_a_crop_without_background_unchanged():
    x, mask = _crops()
    mask[1] = 1.0
    y = BackgroundRemoval(fill="mean")(x, mask)
    assert torch.equal(y[1], x[1])
    assert not torch.equal(y[0], x[0])


def test_soft_mask_blends():
    x, _ = _crops()
    mask = torch.full((3, 1, H, W), 0.25, dtype=torch.float64)
    mask[..., :4, :] = 1.0
    y = background_removal(x, mask, fill="constant", value=0.1)
    torch.testing.assert_close(y[..., 4:, :], 0.25 * x[..., 4:, :] + 0.75 * 0.1)
    assert torch.equal(y[..., :4, :], x[..., :4, :])


def test_removal_settings_are_checked():
    with pytest.raises(InterventionError, match="background_noise"):
        BackgroundRemoval(fill="noise")
    with pytest.raises(InterventionError, match="fill must be one of"):
        BackgroundRemoval(fill="median")
    with pytest.raises(InterventionError, match=r"in \[0, 1\]"):
        BackgroundRemoval(value=1.5)
    with pytest.raises(InterventionError, match="triple"):
        BackgroundRemoval(value=(0.1, 0.2))
    with pytest.raises(InterventionError, match="needs a cell mask"):
        background_removal(torch.rand(1, 3, 8, 8), None)


# -- noise -----------------------------------------------------------------------------------------
def test_noise_fill_has_the_backgrounds_mean_and_std():
    g = torch.Generator().manual_seed(3)
    n = 96
    mean = torch.tensor([0.6, 0.5, 0.7], dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor([0.05, 0.02, 0.08], dtype=torch.float64).view(1, 3, 1, 1)
    x = (mean + std * torch.randn(2, 3, n, n, generator=g, dtype=torch.float64)).clamp(0, 1)
    mask = torch.zeros(2, 1, n, n, dtype=torch.float64)
    mask[..., 40:56, 40:56] = 1
    x = torch.where(mask.bool(), torch.full_like(x, 0.2), x)
    t = BackgroundNoise()
    y = t(x, mask, generator=torch.Generator().manual_seed(5))
    bg = ~mask.bool()[:, 0]
    for i in range(2):
        for c in range(3):
            src, out = x[i, c][bg[i]], y[i, c][bg[i]]
            assert abs(float(out.mean() - src.mean())) < 0.003
            assert abs(float(out.std() / src.std()) - 1) < 0.03
            assert not torch.equal(out, src)
    assert torch.equal(y[mask.bool().expand_as(y)], x[mask.bool().expand_as(x)])
    # replay, and the removal function's fill="noise" is the same draw
    torch.testing.assert_close(t(x, mask, params=t.last_params), y, rtol=0, atol=0)
    torch.testing.assert_close(background_removal(x, mask, fill="noise", generator=torch.Generator().manual_seed(5)), y, rtol=0, atol=0)
    torch.testing.assert_close(background_noise(x, mask, generator=torch.Generator().manual_seed(5)), y, rtol=0, atol=0)
    with pytest.raises(InterventionError, match="'noise'"):
        t(x, mask, params={"noise": torch.zeros(1, 3, n, n)})


# -- transplant ------------------------------------------------------------------------------------
def _clean_reference(x: np.ndarray, m: np.ndarray, sigma: float) -> np.ndarray:
    """Donor with its cell removed, by scipy normalised convolution (zero padding, +-3 sigma)."""
    w = 1.0 - m
    mu = (w * x).sum(axis=(1, 2)) / w.sum()
    den = gaussian_filter(w, sigma, mode="constant", cval=0.0, truncate=3.0)
    out = np.empty_like(x)
    for c in range(3):
        num = gaussian_filter(w * x[c], sigma, mode="constant", cval=0.0, truncate=3.0)
        fill = np.clip((num + LOCAL_PRIOR_WEIGHT * mu[c]) / (den + LOCAL_PRIOR_WEIGHT), 0, 1)
        out[c] = m * fill + (1 - m) * x[c]
    return out


def test_transplant_puts_the_cell_on_the_donors_clean_background():
    x, mask = _crops()
    sigma = 3.0  # +-3 sigma = 9 px: scipy's and kornia's kernels have the same support
    t = BackgroundTransplant(sigma=sigma)
    y = t(x, mask, generator=torch.Generator().manual_seed(0))
    donor = t.last_params["donor"]
    assert donor.dtype == torch.long and sorted(donor.tolist()) == [0, 1, 2]
    assert all(int(donor[i]) != i for i in range(3)), "no crop keeps its own background"
    for i in range(3):
        d = int(donor[i])
        cell = mask[i, 0].bool()
        # the cell is untouched
        assert torch.equal(y[i][:, cell], x[i][:, cell])
        # outside both cells: the donor's pixels, exactly
        both_bg = ~cell & ~mask[d, 0].bool()
        assert torch.equal(y[i][:, both_bg], x[d][:, both_bg])
        # where the donor's cell was: filled from the donor's background (scipy reference) ...
        hole = ~cell & mask[d, 0].bool()
        assert int(hole.sum()) > 0
        ref = _clean_reference(x[d].numpy(), mask[d, 0].numpy(), sigma)
        np.testing.assert_allclose(y[i][:, hole].numpy(), ref[:, hole.numpy()], atol=1e-10, rtol=0)
        # ... so no trace of the dark donor cell remains: values stay in the donor's background range
        bg_d = x[d][:, ~mask[d, 0].bool()]
        assert (y[i][:, hole] >= bg_d.min(dim=1, keepdim=True).values - 1e-12).all()
        assert (y[i][:, hole] <= bg_d.max(dim=1, keepdim=True).values + 1e-12).all()
    # replaying the draw gives the same images, and the function twin agrees
    torch.testing.assert_close(t(x, mask, params={"donor": donor}), y, rtol=0, atol=0)
    torch.testing.assert_close(background_transplant(x, mask, sigma=sigma, generator=torch.Generator().manual_seed(0)), y, rtol=0, atol=0)


def test_transplant_replays_a_given_donor_assignment():
    x, mask = _crops()
    t = BackgroundTransplant(sigma=3.0)
    y = t(x, mask, params={"donor": torch.tensor([2, 0, 1])})
    corner = (slice(None), 0, 0)  # background in every crop
    assert torch.equal(y[0][corner], x[2][corner]) and torch.equal(y[1][corner], x[0][corner])
    with pytest.raises(InterventionError, match=r"'donor': LongTensor of shape \(3,\)"):
        t(x, mask, params={"donor": torch.tensor([1, 0])})
    with pytest.raises(InterventionError, match=r"indices in \[0, 3\)"):
        t(x, mask, params={"donor": torch.tensor([1, 2, 3])})


def test_transplant_rejects_a_single_crop_without_donors():
    x, mask = _crops()
    with pytest.raises(InterventionError, match="only one crop.*donors="):
        BackgroundTransplant()(x[:1], mask[:1], generator=torch.Generator().manual_seed(0))


def test_transplant_with_explicit_donors():
    x, mask = _crops()
    t = BackgroundTransplant(sigma=3.0)
    # a single crop on a pure background tile: no cell to remove, so the tile is used as is
    tile = torch.full((1, 3, H, W), 0.33, dtype=torch.float64)
    y = t(x[:1], mask[:1], donors=tile, donor_masks=torch.zeros(1, 1, H, W))
    cell = mask[0, 0].bool()
    assert torch.equal(y[0][:, cell], x[0][:, cell])
    assert torch.equal(y[0][:, ~cell], torch.full_like(y[0][:, ~cell], 0.33))
    assert t.last_params == {}
    # explicit donors match the same assignment drawn from the batch
    drawn = t(x, mask, params={"donor": torch.tensor([1, 2, 0])})
    given = t(x, mask, donors=x[[1, 2, 0]], donor_masks=mask[[1, 2, 0]])
    torch.testing.assert_close(given, drawn, rtol=0, atol=0)


def test_transplant_errors_are_for_people():
    x, mask = _crops()
    t = BackgroundTransplant()
    with pytest.raises(InterventionError, match="needs donor_masks="):
        t(x, mask, donors=x)
    with pytest.raises(InterventionError, match="without donors="):
        t(x, mask, donor_masks=mask)
    with pytest.raises(InterventionError, match="donors must have the images' shape"):
        t(x, mask, donors=x[:2], donor_masks=mask[:2])
    with pytest.raises(InterventionError, match="either donors= or params"):
        t(x, mask, donors=x, donor_masks=mask, params={"donor": torch.tensor([1, 2, 0])})
    with pytest.raises(InterventionError, match=r"crop\(s\) \[0\] have no background"):
        full = mask.clone()
        full[0] = 1
        t(x, mask, donors=x, donor_masks=full)
    with pytest.raises(InterventionError, match="sigma must be a positive number"):
        BackgroundTransplant(sigma=0)
    with pytest.raises(InterventionError, match="needs a cell mask"):
        t(x, None)


# -- empty masks ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["background_removal", "background_noise", "background_transplant"])
def test_an_empty_mask_replaces_the_whole_crop_flagged_and_warned(name):
    """A crop whose mask is empty has no cell to keep: all of it is replaced (no trace of its own
    background may survive a background intervention), and it is flagged and warned about."""
    x, mask = _crops()
    mask[1] = 0.0
    t = interventions.get(name)
    g = torch.Generator().manual_seed(0)
    with pytest.warns(InterventionWarning, match=rf"{name}: 1 of 3 crop\(s\) have an empty cell mask"):
        y = t(x, mask, generator=g) if t.stochastic else t(x, mask)
    assert t.last_applicable.tolist() == [True, False, True]
    if name == "background_removal":
        assert torch.equal(y[1], torch.full_like(y[1], 0.5))
    elif name == "background_noise":
        # noise of the whole crop's own mean and std, per channel
        z = t.last_params["noise"][1]
        xn = x[1].flatten(1)
        ref = (xn.mean(1)[:, None, None] + xn.std(1, unbiased=False)[:, None, None] * z).clamp(0, 1)
        torch.testing.assert_close(y[1], ref, rtol=0, atol=1e-12)
    else:
        donor = int(t.last_params["donor"][1])
        assert not torch.isclose(y[1], x[1]).all(0).any(), "a pixel of the crop itself survived"
        bg = mask[donor, 0] == 0  # where the donor shows background, crop 1 now shows it as is
        torch.testing.assert_close(y[1][:, bg], x[donor][:, bg], rtol=0, atol=0)
    # the function twins return the flags too
    twin = getattr(interventions, name)
    with pytest.warns(InterventionWarning, match="1 of 3"):
        _, ok = twin(x, mask, generator=torch.Generator().manual_seed(0), return_applicable=True) if t.stochastic else twin(x, mask, return_applicable=True)
    assert ok.tolist() == [True, False, True]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # masks with a cell: no warning, every crop applicable
        _, mask_ok = _crops()
        t(x, mask_ok, generator=torch.Generator().manual_seed(0)) if t.stochastic else t(x, mask_ok)
        assert t.last_applicable.all()


def test_registered_names():
    assert {"background_removal", "background_noise", "background_transplant"} <= set(interventions.available(requires_mask=True))
    assert interventions.get_class("background_transplant").stochastic
    assert not interventions.get_class("background_removal").stochastic
