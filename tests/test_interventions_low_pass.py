"""Gaussian low-pass: against scipy.ndimage (mirror mode) at every crop size, and its closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter

from interventions import LowPass, low_pass


def _scipy_blur(x: torch.Tensor, sigma: float) -> np.ndarray:
    """scipy's Gaussian over H and W with mirror padding and the kernel radius ceil(3 sigma)."""
    return gaussian_filter(x.double().numpy(), sigma=(0, 0, sigma, sigma), mode="mirror", radius=(0, 0, math.ceil(3 * sigma), math.ceil(3 * sigma)))


@pytest.mark.parametrize("shape", [(1, 1), (1, 6), (2, 3), (3, 3), (5, 4), (6, 6), (7, 7), (9, 13), (24, 24)])
@pytest.mark.parametrize("sigma", [1.0, 2.0, 2.7])
def test_equals_scipy_mirror_at_every_size(shape, sigma):
    """Crops smaller than the kernel radius (ceil(3 sigma) px) were returned unchanged or
    blurred with a shortened kernel; now the mirror padding repeats as scipy's does."""
    x = torch.rand(2, 3, *shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    np.testing.assert_allclose(low_pass(x, sigma).numpy(), _scipy_blur(x, sigma), rtol=0, atol=1e-12)
    np.testing.assert_allclose(LowPass(sigma)(x.float()).double().numpy(), _scipy_blur(x, sigma), rtol=0, atol=2e-6)


def test_impulse_response_is_the_full_sampled_gaussian():
    """Closed form: away from the border the response to a unit impulse is k k^T with
    k_t = exp(-t^2 / (2 sigma^2)) / sum, t = -ceil(3 sigma) .. ceil(3 sigma)."""
    sigma = 1.7
    r = math.ceil(3 * sigma)
    x = torch.zeros(1, 3, 31, 31, dtype=torch.float64)
    x[..., 15, 15] = 1.0
    t = np.arange(-r, r + 1)
    k = np.exp(-(t**2) / (2 * sigma**2))
    k /= k.sum()
    expected = np.zeros((31, 31))
    expected[15 - r : 16 + r, 15 - r : 16 + r] = np.outer(k, k)
    y = low_pass(x, sigma)
    for c in range(3):
        np.testing.assert_allclose(y[0, c].numpy(), expected, rtol=0, atol=1e-15)


def test_a_constant_crop_stays_constant_and_half_precision_works():
    x = torch.full((2, 3, 4, 4), 0.3, dtype=torch.float16)
    y = low_pass(x, 3.0)
    assert y.dtype == torch.float16 and torch.equal(y, x)
