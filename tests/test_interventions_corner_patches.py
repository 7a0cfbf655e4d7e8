"""Corner patches (reference 004's litmus test): boxes, mask coverage, resizing, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import interventions
from interventions import POSITIONS, CornerPatches, InterventionError, InterventionWarning, corner_patches, patch_boxes, patch_mask_coverage


def test_positions_order():
    assert POSITIONS == ("top_left", "top_right", "bottom_left", "bottom_right", "centre")


def test_patch_boxes_hand_computed():
    # 50 x 40 crop, 20 px patches: centre starts at ((50 - 20) // 2, (40 - 20) // 2) = (15, 10)
    assert patch_boxes(50, 40, 20) == {
        "top_left": (0, 0, 20, 20),
        "top_right": (0, 20, 20, 40),
        "bottom_left": (30, 0, 50, 20),
        "bottom_right": (30, 20, 50, 40),
        "centre": (15, 10, 35, 30),
    }
    assert list(patch_boxes(50, 40, 20)) == list(POSITIONS)
    # odd slack rounds the centre box towards the top left
    assert patch_boxes(41, 41, 20)["centre"] == (10, 10, 30, 30)
    # a patch as large as the crop is the crop
    assert set(patch_boxes(20, 20, 20).values()) == {(0, 0, 20, 20)}


def test_patch_mask_coverage_hand_computed():
    mask = torch.zeros(2, 1, 50, 40)
    mask[0, 0, 10:30, 5:25] = 1  # a 20 x 20 cell; item 1 is pure background
    # an empty mask: coverage 0 everywhere, and a warning that it may be a failed segmentation
    with pytest.warns(InterventionWarning, match="1 of 2 crop.*empty cell mask"):
        cov = patch_mask_coverage(mask, size=20)
    # top_left: rows 10:20 x cols 5:20 = 150 px; top_right: rows 10:20 x cols 20:25 = 50 px;
    # bottom row patches: 0; centre (rows 15:35, cols 10:30): rows 15:30 x cols 10:25 = 225 px
    expected = torch.tensor([[150 / 400, 50 / 400, 0.0, 0.0, 225 / 400], [0.0] * 5])
    assert cov.shape == (2, 5)
    torch.testing.assert_close(cov, expected)
    # bool and (B, H, W) masks mean the same
    torch.testing.assert_close(patch_mask_coverage(mask[:1, 0].bool(), size=20), expected[:1])
    soft = patch_mask_coverage(mask[:1].double() * 0.5, size=20)
    assert soft.dtype == torch.float64
    torch.testing.assert_close(soft, expected[:1].double() * 0.5)


def test_patch_mask_coverage_rejects_bad_masks():
    with pytest.raises(InterventionError, match="does not fit"):
        patch_mask_coverage(torch.zeros(1, 1, 16, 16), size=20)
    with pytest.raises(InterventionError, match=r"\[0, 1\]"):
        patch_mask_coverage(torch.full((1, 1, 32, 32), 2.0))
    with pytest.raises(InterventionError, match=r"\(B, 1, H, W\)"):
        patch_mask_coverage(torch.zeros(1, 3, 32, 32))


@pytest.mark.parametrize("position", POSITIONS)
def test_patch_is_cut_at_the_box_and_resized_like_skimage(position):
    resize = pytest.importorskip("skimage.transform").resize  # scikit-image: the dev extra
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 50, 40, generator=g, dtype=torch.float64)
    y = corner_patches(x, position, size=20)
    t, l, b, r = patch_boxes(50, 40, 20)[position]
    for i in range(2):
        patch = x[i, :, t:b, l:r].permute(1, 2, 0).numpy()
        ref = resize(patch, (50, 40), order=1, mode="edge", anti_aliasing=False, preserve_range=True)
        np.testing.assert_allclose(y[i].permute(1, 2, 0).numpy(), ref, atol=1e-12, rtol=0)
    # the module gives the same, ignoring any mask, in float32 too
    mod = CornerPatches(position, size=20)
    torch.testing.assert_close(mod(x, torch.ones(2, 1, 50, 40, dtype=torch.float64)), y, rtol=0, atol=0)
    y32 = mod(x.float())
    assert y32.dtype == torch.float32
    torch.testing.assert_close(y32, y.float(), rtol=0, atol=1e-5)


def test_patch_is_what_is_left():
    # only the kept patch matters: changing the rest of the crop changes nothing
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1, 3, 32, 32, generator=g)
    x2 = x.clone()
    x2[..., 10:, :] = torch.rand(1, 3, 22, 32, generator=g)
    torch.testing.assert_close(corner_patches(x, "top_left", 10), corner_patches(x2, "top_left", 10), rtol=0, atol=0)
    assert not torch.equal(corner_patches(x, "bottom_left", 10), corner_patches(x2, "bottom_left", 10))


def test_full_size_patch_is_identity():
    x = torch.rand(2, 3, 20, 20)
    for position in POSITIONS:
        torch.testing.assert_close(corner_patches(x, position, size=20), x, rtol=0, atol=0)


def test_errors_are_for_people():
    x = torch.rand(1, 3, 24, 24)
    with pytest.raises(InterventionError, match="'centre'"):
        CornerPatches(position="center")
    with pytest.raises(InterventionError, match="does not fit inside a 24 x 24 crop; use size <= 24"):
        corner_patches(x, "top_left", size=30)
    with pytest.raises(InterventionError, match="does not fit"):
        CornerPatches(size=30)(x)  # the size is checked against the crop at call time
    for bad in (0, -3, 2.5, True):
        with pytest.raises(InterventionError, match="positive whole number"):
            CornerPatches(size=bad)
    assert interventions.get("corner_patches", position="centre", size=8)(x).shape == x.shape
