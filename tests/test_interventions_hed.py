"""HED colour deconvolution and HED jitter (F4) against scikit-image and their own definitions.

scikit-image (the dev extra) is the reference and the source of the test tiles; without it the
tests that need it skip one by one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from interventions import HEDJitter, InterventionError, hed_jitter, hed_to_rgb, rgb_to_hed
from interventions.hed import OD_EPS, RGB_FROM_HED, SKIMAGE_HED_SCALE



def _skcolor():
    return pytest.importorskip("skimage.color")


@pytest.fixture(scope="module")
def tiles() -> torch.Tensor:
    """Eight 32 x 32 tiles of scikit-image's IHC image (haematoxylin + DAB), float64 in [0, 1]."""
    skdata = pytest.importorskip("skimage.data")
    ihc = skdata.immunohistochemistry()[::4, ::4]
    t = np.stack([ihc[i : i + 32, j : j + 32] for i in range(0, 128, 64) for j in range(0, 128, 32)])
    return torch.from_numpy(t).permute(0, 3, 1, 2).double().div(255.0).contiguous()


def _nhwc(t: torch.Tensor) -> np.ndarray:
    return t.permute(0, 2, 3, 1).numpy()


def test_scale_constant_is_skimages_log_adjust():
    assert SKIMAGE_HED_SCALE == pytest.approx(-math.log(1e-6))
    np.testing.assert_allclose(RGB_FROM_HED, _skcolor().rgb_from_hed)


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 2e-6)], ids=["f64", "f32"])
def test_rgb_to_hed_equals_skimage_up_to_the_unit_factor(tiles, dtype, atol):
    c = rgb_to_hed(tiles.to(dtype))
    ref = np.stack([_skcolor().rgb2hed(im) for im in _nhwc(tiles)])
    # skimage >= 0.19: rgb2hed = max(c / ln(1e6), 0)
    np.testing.assert_allclose(_nhwc(c.clamp(min=0).double() / SKIMAGE_HED_SCALE), ref, rtol=0, atol=atol)
    assert (c < 0).any(), "our concentrations are not clipped at 0"


def test_hed_to_rgb_inverts_and_equals_skimage(tiles):
    c = rgb_to_hed(tiles)
    torch.testing.assert_close(hed_to_rgb(c), tiles.clamp(min=OD_EPS), rtol=0, atol=1e-12)
    ref = np.stack([_skcolor().hed2rgb(im) for im in _nhwc(c / SKIMAGE_HED_SCALE)])
    np.testing.assert_allclose(_nhwc(hed_to_rgb(c)), ref, rtol=0, atol=1e-12)
    x32 = tiles.float()
    torch.testing.assert_close(hed_to_rgb(rgb_to_hed(x32)), x32, rtol=1e-5, atol=2e-6)


def test_zero_sigma_is_the_identity(tiles):
    y = hed_jitter(tiles, sigma_alpha=0.0, sigma_beta=0.0, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(y, tiles.clamp(min=OD_EPS), rtol=0, atol=1e-12)
    t = HEDJitter(0.0, 0.0)
    torch.testing.assert_close(t(tiles.float()), tiles.float(), rtol=1e-5, atol=2e-6)
    assert torch.equal(t.last_params["alpha"], torch.ones(len(tiles), 3))


def test_alpha_and_beta_act_on_concentrations_as_documented(tiles):
    g = torch.Generator().manual_seed(3)
    alpha = 1 + 0.3 * (torch.rand(len(tiles), 3, generator=g, dtype=torch.float64) - 0.5)
    beta = 0.2 * (torch.rand(len(tiles), 3, generator=g, dtype=torch.float64) - 0.5)
    y = hed_jitter(tiles, alpha=alpha, beta=beta)
    c, cy = rgb_to_hed(tiles), rgb_to_hed(y)
    expected = alpha[:, :, None, None] * c + beta[:, :, None, None]
    inside = ((y > OD_EPS) & (y < 1)).all(1, keepdim=True).expand_as(c)  # not clipped
    assert inside.float().mean() > 0.5
    torch.testing.assert_close(cy[inside], expected[inside], rtol=0, atol=1e-10)


def test_draws_are_uniform_in_the_documented_ranges():
    x = torch.rand(512, 3, 4, 4)
    t = HEDJitter(sigma_alpha=0.2, sigma_beta=0.1)
    t(x, generator=torch.Generator().manual_seed(0))
    a, b = t.last_params["alpha"], t.last_params["beta"]
    assert a.shape == b.shape == (512, 3)
    assert 0.8 <= float(a.min()) and float(a.max()) <= 1.2 and abs(float(a.mean()) - 1) < 0.02
    assert -0.1 <= float(b.min()) and float(b.max()) <= 0.1 and abs(float(b.mean())) < 0.01
    assert float(a.std()) == pytest.approx(0.4 / math.sqrt(12), rel=0.1)
    d = HEDJitter()
    assert (d.sigma_alpha, d.sigma_beta) == (0.05, 0.05)


def test_jitter_errors():
    x = torch.rand(2, 3, 4, 4)
    with pytest.raises(InterventionError, match="sigma_alpha"):
        HEDJitter(sigma_alpha=1.0)
    with pytest.raises(InterventionError, match="sigma_beta"):
        hed_jitter(x, sigma_beta=-0.1)
    with pytest.raises(InterventionError, match=r"\(B, 3\)"):
        HEDJitter()(x, params={"alpha": torch.ones(3), "beta": torch.zeros(3)})
    with pytest.raises(InterventionError, match="together"):
        hed_jitter(x, alpha=torch.ones(2, 3))
    with pytest.raises(InterventionError, match=r"\(\*, 3, H, W\)"):
        rgb_to_hed(x[:, :2])
