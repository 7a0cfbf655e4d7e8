"""Reinhard transfer (F2) against kornia and scikit-image, and the unseen-field target policy.

scikit-image (the dev extra) is the reference and the source of the test tiles; the tests that
need it skip one by one without it, the others (the policy, flat channels checked against
kornia) still run.
"""

from __future__ import annotations

import warnings

import kornia.color as kcolor
import numpy as np
import pandas as pd
import pytest
import torch

import interventions
from interventions import (
    InterventionError,
    InterventionWarning,
    Reinhard,
    ReinhardToField,
    field_lab_statistics,
    field_target_tensors,
    reinhard,
    reinhard_unseen_field,
    unseen_field_targets,
)
from interventions.reinhard import FLAT_STD, lab_to_rgb, rgb_to_lab
from shortcutlab.data.images import CropImages
from shortcutlab.data.manifest import SplitManifest
from shortcutlab.data.random_tables import random_table
from shortcutlab.data.splits import FACTORIAL_CELLS, factorial_split, parent_split
from shortcutlab.data.table import CropTable



@pytest.fixture(scope="module")
def tiles() -> torch.Tensor:
    """Eight 32 x 32 tiles of scikit-image's IHC image, float64 (B, 3, H, W) in [0, 1]."""
    skdata = pytest.importorskip("skimage.data")
    ihc = skdata.immunohistochemistry()[::4, ::4]  # 128 x 128
    t = np.stack([ihc[i : i + 32, j : j + 32] for i in range(0, 128, 64) for j in range(0, 128, 32)])
    return torch.from_numpy(t).permute(0, 3, 1, 2).double().div(255.0).contiguous()


def _disc_masks(B, H, W, seed=0) -> torch.Tensor:
    g = np.random.default_rng(seed)
    yy, xx = np.mgrid[:H, :W]
    out = np.zeros((B, 1, H, W), dtype=bool)
    for b in range(B):
        cy, cx, r = g.uniform(10, H - 10), g.uniform(10, W - 10), g.uniform(6, 11)
        out[b, 0] = (yy - cy) ** 2 + (xx - cx) ** 2 < r**2
    return torch.from_numpy(out)


def _sk_lab(x: torch.Tensor) -> np.ndarray:
    """(B, H, W, 3) LAB of a (B, 3, H, W) batch, with scikit-image (skips the test without it)."""
    skcolor = pytest.importorskip("skimage.color")
    return skcolor.rgb2lab(x.permute(0, 2, 3, 1).double().numpy())


# ---------------------------------------------------------------------- colour conversion
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 3e-4), (torch.float64, 1e-9)], ids=["f32", "f64"])
def test_lab_conversion_equals_kornia(dtype, atol):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 3, 20, 20, generator=g, dtype=torch.float64)
    x[0] = x[0] * 0.05  # dark pixels: below both knees
    x = x.to(dtype)
    torch.testing.assert_close(rgb_to_lab(x), kcolor.rgb_to_lab(x), rtol=0, atol=atol)
    lab = kcolor.rgb_to_lab(x) + 4 * torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype)
    torch.testing.assert_close(lab_to_rgb(lab), kcolor.lab_to_rgb(lab), rtol=0, atol=1e-5)


def test_float32_dark_pixels_near_exact_lab():
    """In float32 the knee gaps are not taken back (interventions/reinhard.py, _srgb_to_f): below
    and around both knees the LAB values still lie within 1e-4 of kornia's float64 ones, well
    inside float32's 3e-4 above (the gaps alone would move L* by 4e-5)."""
    g = torch.Generator().manual_seed(1)
    x = torch.rand(4, 3, 32, 32, generator=g, dtype=torch.float64) * 0.08  # sRGB knee 0.04045, LAB knee near 0.1
    got = rgb_to_lab(x.float()).double()
    torch.testing.assert_close(got, kcolor.rgb_to_lab(x), rtol=0, atol=1e-4)


def _kornia_reinhard(x, mask, tm, ts):
    """Reference: kornia LAB, masked population statistics, per-image affine map, back."""
    lab = kcolor.rgb_to_lab(x)
    w = mask.to(x.dtype)
    n = w.sum((2, 3), keepdim=True)
    mu = (lab * w).sum((2, 3), keepdim=True) / n
    sd = (((lab - mu) ** 2 * w).sum((2, 3), keepdim=True) / n).sqrt()
    y = (lab - mu) / sd * ts.view(-1, 3, 1, 1) + tm.view(-1, 3, 1, 1)
    return kcolor.lab_to_rgb(y)


def test_reinhard_equals_a_kornia_reference(tiles):
    mask = _disc_masks(len(tiles), 32, 32)
    tm = torch.tensor([[55.0, 20.0, -12.0]], dtype=torch.float64).repeat(len(tiles), 1) + torch.arange(len(tiles))[:, None]
    ts = torch.tensor([[15.0, 7.0, 6.0]], dtype=torch.float64).repeat(len(tiles), 1)
    got = reinhard_unseen_field(tiles, tm, ts, mask=mask)
    torch.testing.assert_close(got, _kornia_reinhard(tiles, mask, tm, ts), rtol=0, atol=1e-5)
    got32 = reinhard_unseen_field(tiles.float(), tm, ts, mask=mask)
    torch.testing.assert_close(got32.double(), got, rtol=0, atol=5e-4)


def test_masked_lab_statistics_hit_the_target(tiles):
    """After the transfer, scikit-image's LAB mean and std over the cell equal the target's."""
    mask = _disc_masks(len(tiles), 32, 32, seed=1)
    lab = _sk_lab(tiles)
    m = mask[:, 0].numpy()
    src_mu = np.stack([lab[b][m[b]].mean(0) for b in range(len(tiles))])
    src_sd = np.stack([lab[b][m[b]].std(0) for b in range(len(tiles))])
    # a moderate shift of every crop's statistics, so that no cell pixel leaves the gamut
    tm, ts = src_mu + np.array([3.0, -2.0, 1.5]), src_sd * np.array([1.1, 0.9, 1.05])
    y = reinhard_unseen_field(tiles, tm, ts, mask=mask)
    out = _sk_lab(y)
    yn = y.permute(0, 2, 3, 1).numpy()
    checked = 0
    for b in range(len(tiles)):
        cell = yn[b][m[b]]
        if (cell <= 0).any() or (cell >= 1).any():
            continue  # clipped: statistics legitimately differ
        checked += 1
        np.testing.assert_allclose(out[b][m[b]].mean(0), tm[b], atol=0.02)
        np.testing.assert_allclose(out[b][m[b]].std(0), ts[b], atol=0.02)
    assert checked >= len(tiles) // 2
    # the background is transformed too (the map applies to every pixel)
    assert not torch.allclose(y[~mask.expand_as(y)], tiles[~mask.expand_as(tiles)])


def test_no_mask_uses_all_pixels_and_an_empty_mask_falls_back_flagged(tiles):
    tm, ts = (60.0, 5.0, 0.0), (12.0, 6.0, 6.0)
    full = reinhard(tiles, tm, ts)
    torch.testing.assert_close(reinhard(tiles, tm, ts, mask=torch.ones(len(tiles), 1, 32, 32)), full)
    # an empty mask: that crop's statistics come from all its pixels, and it is flagged and warned
    mask = _disc_masks(len(tiles), 32, 32)
    mask[[1, 4]] = False
    t = Reinhard(tm, ts)
    with pytest.warns(InterventionWarning, match="reinhard: 2 of 8 crop"):
        y = t(tiles, mask)
    assert t.last_applicable.tolist() == [True, False, True, True, False, True, True, True]
    torch.testing.assert_close(y[[1, 4]], full[[1, 4]])
    with pytest.warns(InterventionWarning, match="2 of 8"):
        _, ok = reinhard(tiles, tm, ts, mask=mask, return_applicable=True)
    assert torch.equal(ok, t.last_applicable)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a full mask and no mask warn of nothing
        t(tiles, _disc_masks(len(tiles), 32, 32))
        assert t.last_applicable.all()
        t(tiles)
        assert t.last_applicable.all()


@pytest.mark.parametrize("masked", [False, True], ids=["all_pixels", "masked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_flat_channels_map_to_the_target_mean(dtype, masked):
    """A white crop, a constant colour and a neutral grey ramp (checked with kornia's LAB in
    float64): every channel without spread goes to the target mean. Before, float32 rounding
    gave a constant channel a spread of about 1e-5 LAB that was then scaled by 1e5 (white came
    out black), and the ramp's a*, b* (spread 1e-3 from the rounded sRGB constants) were
    stretched to the target's spread in float64 too: grey came out coloured."""
    H = W = 48
    ramp = torch.linspace(0.05, 0.95, W, dtype=torch.float64).view(1, 1, W).expand(3, H, W)
    colour = torch.tensor([0.8, 0.55, 0.7], dtype=torch.float64).view(3, 1, 1).expand(3, H, W)
    x = torch.stack([torch.ones(3, H, W, dtype=torch.float64), colour, ramp]).to(dtype)
    mask = None
    if masked:
        yy, xx = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
        mask = (((yy - 20) ** 2 + (xx - 26) ** 2) < 15**2).expand(3, 1, H, W)
    tm, ts = torch.tensor([60.0, 5.0, -3.0], dtype=torch.float64), torch.tensor([12.0, 6.0, 6.0], dtype=torch.float64)
    y = reinhard(x, tm, ts, mask=mask)
    lab = kcolor.rgb_to_lab(y.double())
    target = tm.view(3, 1, 1).expand(3, H, W)
    for b in (0, 1):  # constant crops: every pixel at the target mean
        torch.testing.assert_close(lab[b], target, rtol=0, atol=0.02)
    # the ramp: a* and b* flat at the target means, L* moved to the target's mean and spread
    torch.testing.assert_close(lab[2, 1:], target[1:], rtol=0, atol=0.02)
    L = lab[2, 0] if mask is None else lab[2, 0][mask[2, 0]]
    assert float(L.mean()) == pytest.approx(60.0, abs=0.02)
    assert float(L.std(unbiased=False)) == pytest.approx(12.0, abs=0.02)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_a_faint_real_spread_is_still_transferred(dtype):
    """The flat threshold swallows rounding, not colour: a grey crop with a faint red pattern
    (a* spread about 0.1 LAB, ten times FLAT_STD) gets the target's a* spread."""
    g = torch.Generator().manual_seed(0)
    x = torch.full((1, 3, 40, 40), 0.6, dtype=torch.float64)
    x[:, 0] += 0.0012 * torch.randn(1, 40, 40, generator=g, dtype=torch.float64)
    sd_a = float(kcolor.rgb_to_lab(x)[0, 1].std(unbiased=False))
    assert 5 * FLAT_STD < sd_a < 20 * FLAT_STD
    y = reinhard(x.to(dtype), (55.0, 4.0, 2.0), (10.0, 6.0, 5.0))
    a = kcolor.rgb_to_lab(y.double())[0, 1]
    assert float(a.mean()) == pytest.approx(4.0, abs=0.05)
    assert float(a.std(unbiased=False)) == pytest.approx(6.0, rel=0.02)


def test_module_twin_and_per_sample_targets_agree(tiles):
    mask = _disc_masks(len(tiles), 32, 32)
    tm, ts = (58.0, 14.0, -9.0), (13.0, 6.0, 5.0)
    torch.testing.assert_close(Reinhard(tm, ts)(tiles, mask), reinhard(tiles, tm, ts, mask=mask))
    # per-sample rows equal one call per crop
    tms = torch.tensor([[50.0, 10.0, -5.0], [65.0, 20.0, -15.0]], dtype=torch.float64)
    tss = torch.tensor([[10.0, 5.0, 4.0], [16.0, 8.0, 7.0]], dtype=torch.float64)
    both = ReinhardToField()(tiles[:2], mask[:2], target_mean=tms, target_std=tss)
    for i in range(2):
        torch.testing.assert_close(both[i : i + 1], reinhard(tiles[i : i + 1], tms[i], tss[i], mask=mask[i : i + 1]))
    assert ReinhardToField.label_conditioned and not Reinhard.label_conditioned


def test_fit_pools_every_cell_pixel(tiles):
    mask = _disc_masks(len(tiles), 32, 32, seed=2)
    t = Reinhard().fit((tiles * 255).round().to(torch.uint8), mask)  # uint8 crops, as CropImages holds
    q = (tiles * 255).round() / 255
    lab = _sk_lab(q)[mask[:, 0].numpy()]  # all cell pixels of all crops, pooled
    np.testing.assert_allclose(t.target_mean_, lab.mean(0), atol=1e-3)
    np.testing.assert_allclose(t.target_std_, lab.std(0), atol=1e-3)
    assert t.n_pixels_ == int(mask.sum())
    # pooling is not the mean of per-crop means (crops have cells of different sizes)
    per_crop = np.stack([_sk_lab(q[b : b + 1])[0][mask[b, 0].numpy()].mean(0) for b in range(len(tiles))])
    assert np.abs(per_crop.mean(0) - t.target_mean_).max() > 1e-3
    y = t(tiles.float())
    assert y.shape == tiles.shape and y.dtype == torch.float32


def test_fit_skips_and_counts_crops_with_an_empty_mask(tiles):
    """Crops whose mask is empty have no cell pixel: fit pools the others' cell pixels only
    (scikit-image's LAB of exactly those pixels), counts the skipped crops and warns."""
    mask = _disc_masks(len(tiles), 32, 32, seed=5)
    mask[[2, 5]] = False
    images = (tiles * 255).round().to(torch.uint8)
    with pytest.warns(InterventionWarning, match="2 of 8 crop"):
        t = Reinhard().fit(images, mask)
    lab = _sk_lab(images.double() / 255)[mask[:, 0].numpy()]
    np.testing.assert_allclose(t.target_mean_, lab.mean(0), atol=1e-3)
    np.testing.assert_allclose(t.target_std_, lab.std(0), atol=1e-3)
    assert t.n_empty_masks_ == 2 and t.n_pixels_ == int(mask.sum())
    with pytest.raises(InterventionError, match="all 2 crop"):
        Reinhard().fit(images[:2], torch.zeros(2, 1, 32, 32))


def test_reinhard_errors(tiles):
    with pytest.raises(InterventionError, match="no target"):
        Reinhard()(tiles)
    with pytest.raises(InterventionError, match="together"):
        Reinhard(target_mean=(50.0, 0.0, 0.0))
    with pytest.raises(InterventionError, match="positive"):
        Reinhard((50.0, 0.0, 0.0), (10.0, 0.0, 5.0))
    with pytest.raises(InterventionError, match=r"\(B, 3\)"):
        ReinhardToField()(tiles, target_mean=(50.0, 0.0, 0.0), target_std=(10.0, 5.0, 5.0))
    with pytest.raises(InterventionError, match="needs per-crop targets"):
        ReinhardToField()(tiles)
    with pytest.raises(InterventionError, match="no per-crop context"):
        Reinhard((50.0, 0.0, 0.0), (10.0, 5.0, 5.0))(tiles, target_mean=torch.zeros(len(tiles), 3))


# ---------------------------------------------------------------------- the F2 target policy
def _table(df: pd.DataFrame) -> CropTable:
    return CropTable.from_frame(df, id="id", label="label", parent="parent")


def _check_policy(table: CropTable, split: SplitManifest, targets: pd.DataFrame, cells) -> None:
    parent_of = dict(zip(table.ids, table.frame["parent"]))
    label_of = dict(zip(table.ids, table.frame["label"]))
    seen = set()
    test = set()
    for c in cells:
        rows = split.cell(c or None)
        seen |= {parent_of[i] for i in rows.loc[rows["split"] == "train", "id"]}
        test |= set(rows.loc[rows["split"] == "test", "id"])
    assert set(targets["id"]) == test
    labels_in = table.frame.groupby("parent")["label"].agg(set)
    for _, r in targets.iterrows():
        assert r.target_parent not in seen, "a training parent of a compared cell was chosen"
        assert r.target_parent != parent_of[r.id], "the crop's own parent was chosen"
        assert label_of[r.id] in labels_in[r.target_parent], "the field does not hold the crop's class"
        assert r.parent == parent_of[r.id] and r.label == label_of[r.id]


def test_unseen_field_policy_on_a_factorial():
    # mostly single-crop fields: the high cells cannot take every field, some stay unseen
    table = _table(random_table(n_parents=90, mean_crops=1.5, n_classes=3, geometry=False, seed=1))
    split = factorial_split(table, seed=0)
    targets = unseen_field_targets(table, split)
    _check_policy(table, split, targets, FACTORIAL_CELLS)
    pd.testing.assert_frame_equal(targets, unseen_field_targets(table, split))
    many = [unseen_field_targets(table, split, seed=s)["target_parent"].tolist() for s in range(5)]
    assert len({tuple(m) for m in many}) > 1, "the seed should change some choices"


def test_unseen_field_policy_on_a_parent_split_and_val():
    table = _table(random_table(n_parents=40, mean_crops=3, n_classes=3, geometry=False, seed=2))
    split = parent_split(table, test_fraction=0.3, val_fraction=0.2, seed=0)
    targets = unseen_field_targets(table, split, seed=3)
    _check_policy(table, split, targets, [""])
    strict = unseen_field_targets(table, split, seed=3, exclude_sides=("train", "val"))
    val_parents = set(table.frame.set_index("id").loc[split.cell().query("split == 'val'")["id"], "parent"])
    assert not set(strict["target_parent"]) & val_parents


def test_unseen_field_policy_names_a_class_without_unseen_field():
    df = pd.DataFrame(
        {
            "id": [f"c{i}" for i in range(8)],
            "label": ["a", "a", "a", "a", "b", "b", "b", "b"],
            "parent": ["p1", "p1", "p2", "p3", "q1", "q1", "q2", "q2"],
        }
    )
    table = _table(df)
    # class b: q1 gives a test crop, q2 trains; its only unseen field is the crop's own
    split = SplitManifest(pd.DataFrame({"id": ["c0", "c1", "c2", "c4", "c6"], "split": ["test", "train", "train", "test", "train"]}))
    with pytest.raises(InterventionError, match="class 'b' has no field unseen.*own parent 'q1'"):
        unseen_field_targets(table, split)
    # once q1 also trains, class b has no unseen field at all
    both = SplitManifest(pd.DataFrame({"id": ["c0", "c4", "c5", "c6"], "split": ["test", "test", "train", "train"]}))
    with pytest.raises(InterventionError, match="class 'b' has no field unseen by the train side of the split"):
        unseen_field_targets(table, both)
    # class a has p3 left out
    ok = unseen_field_targets(table, SplitManifest(split.assignments[split.assignments["id"] != "c4"]))
    assert ok["target_parent"].tolist() == ["p3"]
    with pytest.raises(InterventionError, match="exclude_sides"):
        unseen_field_targets(table, split, exclude_sides=("test",))


# ---------------------------------------------------------------------- field statistics
def test_field_statistics_and_target_tensors(tiles):
    df = pd.DataFrame({"id": [f"c{i}" for i in range(8)], "label": ["a"] * 4 + ["b"] * 4, "parent": ["p0", "p0", "p1", "p1", "p2", "p2", "p3", "p3"]})
    table = _table(df)
    images = (tiles * 255).round().to(torch.uint8)
    masks = _disc_masks(8, 32, 32, seed=4)
    crops = CropImages(images, masks, table)
    stats = field_lab_statistics(crops)
    assert list(stats.index) == ["p0", "p1", "p2", "p3"] and stats["n_crops"].tolist() == [2, 2, 2, 2]
    ref = Reinhard().fit(images[2:4], masks[2:4])
    np.testing.assert_allclose(stats.loc["p1", ["L_mean", "a_mean", "b_mean"]].to_numpy(float), ref.target_mean_, atol=1e-6)
    np.testing.assert_allclose(stats.loc["p1", ["L_std", "a_std", "b_std"]].to_numpy(float), ref.target_std_, atol=1e-6)
    only = field_lab_statistics(crops, parents=["p3"])
    assert list(only.index) == ["p3"]
    tm, ts = field_target_tensors(stats, ["p1", "p3", "p1"], dtype=torch.float64)
    assert tm.shape == (3, 3) and torch.equal(tm[0], tm[2])
    np.testing.assert_allclose(ts[1].numpy(), stats.loc["p3", ["L_std", "a_std", "b_std"]].to_numpy(float))
    with pytest.raises(InterventionError, match="'p9'"):
        field_target_tensors(stats, ["p9"])
    with pytest.raises(InterventionError, match="not in the table"):
        field_lab_statistics(crops, parents=["nope"])
    # the pieces fit together: transfer two crops to their targets
    y = interventions.get("reinhard_unseen_field")(tiles[:3].float(), masks[:3], target_mean=tm, target_std=ts)
    assert y.shape == (3, 3, 32, 32)


def test_field_statistics_pool_cell_pixels_only(tiles):
    """p0's second crop has an empty mask (skipped, counted); every mask of p2 is empty (no
    statistics, refused as a target). Checked against scikit-image's LAB of the cell pixels."""
    df = pd.DataFrame({"id": [f"c{i}" for i in range(6)], "label": ["a"] * 6, "parent": ["p0", "p0", "p1", "p1", "p2", "p2"]})
    images = (tiles[:6] * 255).round().to(torch.uint8)
    masks = _disc_masks(6, 32, 32, seed=6)
    masks[[1, 4, 5]] = False
    crops = CropImages(images, masks, _table(df))
    with pytest.warns(InterventionWarning, match=r"3 of 6 crop.*\['p2'\]"):
        stats = field_lab_statistics(crops)
    lab = _sk_lab(images.double() / 255)
    m = masks[:, 0].numpy()
    for parent, rows in (("p0", [0]), ("p1", [2, 3])):
        pix = np.concatenate([lab[r][m[r]] for r in rows])
        np.testing.assert_allclose(stats.loc[parent, ["L_mean", "a_mean", "b_mean"]].to_numpy(float), pix.mean(0), atol=1e-3)
        np.testing.assert_allclose(stats.loc[parent, ["L_std", "a_std", "b_std"]].to_numpy(float), pix.std(0), atol=1e-3)
        assert stats.loc[parent, "n_pixels"] == len(pix)
    assert stats["n_crops"].tolist() == [2, 2, 2] and stats["n_empty_masks"].tolist() == [1, 0, 2]
    assert stats.loc["p2", "n_pixels"] == 0 and stats.loc["p2", ["L_mean", "L_std"]].isna().all()
    with pytest.raises(InterventionError, match=r"\['p2'\].*empty"):
        field_target_tensors(stats, ["p1", "p2"])
