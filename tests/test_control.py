"""The deleted-signal control: the cell deletion and the within-parent relabelling against hand
computations, and the issue's pattern on the synthetic benchmark."""

import numpy as np
import pandas as pd
import pytest
import torch

from shortcutlab.control import (
    crop_noise,
    delete_cell,
    deleted_signal_control,
    permute_labels_within_parent,
    reference_split,
    relabelled_crops,
)
from shortcutlab.litmus import LitmusError


# ------------------------------------------------------------------------------ deleting the cell
def _hand_crop():
    """One 6 x 6 crop with random pixels and a hand-made 2 x 2 cell at rows 2-3, cols 1-2."""
    x = torch.rand(1, 3, 6, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    m = torch.zeros(1, 1, 6, 6, dtype=torch.float64)
    m[0, 0, 2:4, 1:3] = 1
    return x, m


def test_constant_fill_paints_the_cell_grey_and_keeps_the_background_bit_identical():
    x, m = _hand_crop()
    y = delete_cell(x, m, fill="constant", value=0.25)
    assert torch.all(y[0, :, 2:4, 1:3] == 0.25)
    bg = m[0, 0] == 0
    assert torch.equal(y[0][:, bg], x[0][:, bg])


def test_mean_fill_is_the_crops_own_background_mean():
    x, m = _hand_crop()
    y = delete_cell(x, m, fill="mean")
    bg = (m[0, 0] == 0).numpy()
    mean = x[0].numpy()[:, bg].mean(axis=1)  # 32 background pixels, by hand
    assert np.allclose(y[0, :, 2, 1].numpy(), mean, atol=1e-12) and np.allclose(y[0, :, 3, 2].numpy(), mean, atol=1e-12)


def test_dilation_grows_the_deleted_region_by_a_square_of_the_given_radius():
    x, m = _hand_crop()
    y = delete_cell(x, m, fill="constant", value=0.0, dilate=1)
    deleted = (y[0] == 0).all(0).numpy()
    expected = np.zeros((6, 6), bool)
    expected[1:5, 0:4] = True  # rows 2-3 +- 1, cols 1-2 +- 1 (clipped at the border)
    assert np.array_equal(deleted, expected)


def test_noise_fill_has_the_background_mean_and_sd_and_is_fixed_per_crop():
    x, m = _hand_crop()
    zero = delete_cell(x, m, fill="noise", noise=torch.zeros_like(x))
    assert torch.allclose(zero, delete_cell(x, m, fill="mean"))
    bg = (m[0, 0] == 0).numpy()
    sd = x[0].numpy()[:, bg].std(axis=1)
    one = delete_cell(x, m, fill="noise", noise=torch.ones_like(x))
    mean = x[0].numpy()[:, bg].mean(axis=1)
    assert np.allclose(one[0, :, 2, 1].numpy(), np.clip(mean + sd, 0, 1), atol=1e-12)
    # A crop's draw depends on its row and the seed only, not on the batch it comes in.
    a = crop_noise(torch.tensor([5, 9, 2]), (3, 4, 4), seed=1)
    b = crop_noise(torch.tensor([2, 5]), (3, 4, 4), seed=1)
    assert torch.equal(a[0], b[1]) and torch.equal(a[2], b[0])
    assert not torch.equal(a[0], crop_noise(torch.tensor([5]), (3, 4, 4), seed=2)[0])


# ------------------------------------------------------------------------------ relabelling
def test_relabelling_keeps_each_parents_partition_and_is_a_bijection_per_parent():
    rng = np.random.default_rng(0)
    parents = rng.integers(0, 50, 2000)
    labels = rng.integers(0, 4, 2000)
    new = permute_labels_within_parent(labels, parents, 4, seed=3)
    for p in range(50):
        sel = parents == p
        pairs = set(zip(labels[sel].tolist(), new[sel].tolist()))
        # old -> new is a function and one-to-one inside the parent
        assert len({a for a, _ in pairs}) == len(pairs) == len({b for _, b in pairs})
    single = permute_labels_within_parent(np.zeros(12, int), np.repeat(np.arange(4), 3), 3, seed=0)
    assert all(len(set(single[k * 3 : k * 3 + 3])) == 1 for k in range(4))  # single-class parents stay single-class


def test_relabelling_breaks_the_association_between_old_and_new_labels():
    # Across many parents a crop keeps its label with probability 1/K, whatever the label.
    K, P = 3, 6000
    parents = np.arange(P)
    labels = np.arange(P) % K
    new = permute_labels_within_parent(labels, parents, K, seed=7)
    table = pd.crosstab(labels, new).to_numpy() / (P / K)
    assert np.allclose(table, 1 / K, atol=0.03)


def test_relabelled_crops_keep_images_ids_and_order():
    from shortcutlab.data import CropImages
    from shortcutlab.table import CropTable

    t = CropTable.from_frame(pd.DataFrame({"id": list("abcdef"), "label": list("xyxyzz"), "parent": list("ppqqrr")}), id="id")
    crops = CropImages(torch.zeros(6, 3, 4, 4, dtype=torch.uint8), None, t)
    r = relabelled_crops(crops, seed=0)
    assert list(r.table.ids) == list(t.ids) and r.images is crops.images
    perms = permute_labels_within_parent(t.label_codes, t.parent_codes, 3, seed=0)
    assert list(r.table.frame["label"]) == [t.classes[k] for k in perms]


def test_reference_split_is_parent_disjoint_with_the_given_test_fraction():
    from shortcutlab.audit import measure_split
    from shortcutlab.random_tables import random_table
    from shortcutlab.splits import crop_split
    from conftest import table_from

    table = table_from(random_table(n_parents=200, seed=1))
    given = crop_split(table, test_fraction=0.25, seed=4)
    ref = reference_split(table, given)
    assert ref.protocol == "parent" and ref.params["seed"] == 4 and ref.params["test_fraction"] == 0.25
    m = measure_split(table, ref.cell())
    assert m["parents_crossing"] == 0 and m["test"]["with_train_sibling"] == 0.0


def test_control_refuses_cell_deletion_without_masks_and_unknown_deletions():
    from shortcutlab.data import CropImages
    from shortcutlab.manifest import SplitManifest
    from shortcutlab.recipe import TrainConfig
    from shortcutlab.table import CropTable

    t = CropTable.from_frame(pd.DataFrame({"id": list("abcd"), "label": list("xyxy"), "parent": list("pqrs")}), id="id")
    crops = CropImages(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), None, t)
    split = SplitManifest(pd.DataFrame({"id": list("abcd"), "split": ["train", "train", "test", "test"]}))
    with pytest.raises(LitmusError, match="needs cell masks"):
        deleted_signal_control(crops, split, delete="cell")
    with pytest.raises(LitmusError, match="--delete must be one of cell, labels; got 'pixels'"):
        deleted_signal_control(crops, split, delete="pixels")
    masked = CropImages(crops.images, torch.ones(4, 1, 8, 8, dtype=torch.bool), t)
    with pytest.raises(LitmusError, match="--mask-background"):
        deleted_signal_control(masked, split, delete="cell", config=TrainConfig(mask_background=True))


# ------------------------------------------------------------------------------ the pattern
CONFIG = dict(arch="test_resnet", epochs=20, lr=1e-3, batch_size=32, precise_bn=True)


def _near_chance(r) -> bool:
    return (not r["above_chance"]) and (r["cluster_ci_low"] <= r["chance"] <= r["cluster_ci_high"] or abs(r["accuracy"] - r["chance"]) <= 0.05)


def _control(mechanism, delete):
    from shortcutlab.recipe import TrainConfig
    from shortcutlab.splits import make_split
    from test_litmus import _bench

    crops = _bench(mechanism)
    split = make_split(crops.table, "crop", test_fraction=0.3, seed=0)
    res = deleted_signal_control(crops, split, delete=delete, config=TrainConfig(**CONFIG))
    return {r["split"]: r for r in res.rows}


@pytest.mark.slow
@pytest.mark.parametrize("delete", ["labels", "cell"])
def test_deleted_signal_stays_above_chance_only_under_the_crop_split(delete):
    rows = _control("background", delete)
    given, parent = rows["given"], rows["parent"]
    assert given["protocol"] == "crop" and parent["protocol"] == "parent"
    assert given["above_chance"] and given["accuracy"] - given["chance"] > 0.15, given
    assert _near_chance(parent), parent


@pytest.mark.slow
def test_relabelled_control_without_a_planted_signature_is_near_chance_under_both_splits():
    rows = _control("none", "labels")
    for name in ("given", "parent"):
        assert _near_chance(rows[name]), (name, rows[name])
