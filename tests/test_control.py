"""The deleted-signal control: the cell deletion and the within-parent relabelling against hand
computations, and the issue's pattern on the synthetic benchmark."""

import numpy as np
import pandas as pd
import pytest
import torch

from shortcutlab.studies.control import (
    ControlWarning,
    centred_single_cell_share,
    crop_noise,
    delete_cell,
    deleted_signal_control,
    permute_labels_within_parent,
    reference_split,
    relabelled_crops,
)
from shortcutlab.studies.litmus import LitmusError


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


def test_centred_single_cell_share_of_hand_made_masks():
    m = torch.zeros(5, 1, 8, 8, dtype=torch.bool)
    m[0, 0, 3:5, 3:5] = True  # one region on the centre (rows/cols 3-4 of 8)
    m[1, 0, 3:5, 3:5] = True
    m[1, 0, 0:2, 6:8] = True  # plus a neighbour in a corner: two regions
    m[2, 0, 0:2, 0:2] = True  # one region, off the centre
    m[3, 0, 4:6, 4:6] = True
    m[3, 0, 6, 6] = True  # touches diagonally: one 8-connected region on the centre
    # crop 4: empty
    assert centred_single_cell_share(m) == pytest.approx(2 / 5)
    # Odd side: the one central pixel.
    odd = torch.zeros(2, 1, 7, 7)
    odd[0, 0, 3, 3] = 1
    odd[1, 0, 2, 2] = 1
    assert centred_single_cell_share(odd) == pytest.approx(1 / 2)


def test_control_warns_on_centred_single_cell_masks_and_not_on_all_cells_masks():
    import warnings

    from shortcutlab.studies.demo import _crops_from_synth
    from shortcutlab.models.recipe import TrainConfig
    from shortcutlab.data.splits import make_split
    from shortcutlab.synth import SynthConfig, synthesize

    d = synthesize(SynthConfig(seed=0, fields_per_class=3, crop_size=16, field_size=48, mean_cells_per_field=5), workers=1)
    crops = _crops_from_synth(d)
    split = make_split(crops.table, "crop", test_fraction=0.3, seed=0)
    tiny = TrainConfig(arch="test_resnet", epochs=1, batch_size=32)
    with pytest.warns(ControlWarning, match="one centred cell per crop in 100.0% of crops"):
        res = deleted_signal_control(crops, split, config=tiny, mask_name="mask")
    assert res.settings["mask"] == "mask" and res.settings["mask_single_centred_share"] == 1.0 and "all_cells_mask" in res.notes[0]
    allc = _crops_from_synth(d, all_cells=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ControlWarning)
        res = deleted_signal_control(crops, split, config=tiny, masks=allc.masks, mask_name="all_cells_mask")
    # The share is that of the crops whose all-cells mask is one region: no neighbour, or one
    # merged with the centred cell; at most the share without any other cell pixel plus the rest.
    alone = float((allc.masks == crops.masks).flatten(1).all(1).float().mean())
    assert alone <= res.settings["mask_single_centred_share"] < 0.95 and res.notes == []


def test_cli_control_deletes_every_cell_by_default_on_a_synthetic_benchmark(tmp_path, capsys):
    import json

    from shortcutlab.cli import main
    from shortcutlab.synth import SynthConfig, synthesize, write_synth

    paths = write_synth(synthesize(SynthConfig(seed=0, fields_per_class=3, crop_size=16, field_size=48, mean_cells_per_field=5), workers=1), tmp_path / "b")
    man = pd.read_csv(paths["manifest"])
    pd.DataFrame({"id": man["id"], "split": ["test" if k % 3 == 0 else "train" for k in range(len(man))]}).to_csv(tmp_path / "s.csv", index=False)
    argv = ["control", paths["manifest"], str(tmp_path / "s.csv"), "--delete", "cell", "--epochs", "1", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "masks: column 'all_cells_mask'" in out and "warning" not in out
    doc = json.loads((tmp_path / "a" / "control.json").read_text())
    assert doc["settings"]["mask"] == "all_cells_mask"
    # the verdict compares the two splits with each other, printed and recorded
    assert doc["comparison"]["verdict"] in ("split leaks", "parent higher", "no difference")
    assert f"verdict ({doc['comparison']['verdict']}): {doc['comparison']['reading']}" in out
    csv = pd.read_csv(tmp_path / "a" / "control.csv")
    assert csv["verdict"].tolist() == [doc["comparison"]["verdict"]] * 2
    assert csv["difference"].iloc[0] == pytest.approx(csv["accuracy"].iloc[0] - csv["accuracy"].iloc[1])
    # The centred cell's mask, asked for by name: it runs, with the warning, recorded.
    assert main([*argv, "--out", str(tmp_path / "c"), "--mask", "mask"]) == 0
    out = capsys.readouterr().out
    assert "warning: the masks (mask) look like one centred cell per crop in 100.0% of crops" in out
    doc = json.loads((tmp_path / "c" / "control.json").read_text())
    assert doc["settings"]["mask"] == "mask" and doc["settings"]["mask_single_centred_share"] == 1.0 and len(doc["notes"]) == 1


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
    from shortcutlab.data.images import CropImages
    from shortcutlab.data.table import CropTable

    t = CropTable.from_frame(pd.DataFrame({"id": list("abcdef"), "label": list("xyxyzz"), "parent": list("ppqqrr")}), id="id")
    crops = CropImages(torch.zeros(6, 3, 4, 4, dtype=torch.uint8), None, t)
    r = relabelled_crops(crops, seed=0)
    assert list(r.table.ids) == list(t.ids) and r.images is crops.images
    perms = permute_labels_within_parent(t.label_codes, t.parent_codes, 3, seed=0)
    assert list(r.table.frame["label"]) == [t.classes[k] for k in perms]


def test_reference_split_is_parent_disjoint_with_the_given_test_fraction():
    from shortcutlab.data.audit import measure_split
    from shortcutlab.data.random_tables import random_table
    from shortcutlab.data.splits import crop_split
    from conftest import table_from

    table = table_from(random_table(n_parents=200, seed=1))
    given = crop_split(table, test_fraction=0.25, seed=4)
    ref = reference_split(table, given)
    assert ref.protocol == "parent" and ref.params["seed"] == 4 and ref.params["test_fraction"] == 0.25
    m = measure_split(table, ref.cell())
    assert m["parents_crossing"] == 0 and m["test"]["with_train_sibling"] == 0.0


def test_control_refuses_cell_deletion_without_masks_and_unknown_deletions():
    from shortcutlab.data.images import CropImages
    from shortcutlab.data.manifest import SplitManifest
    from shortcutlab.models.recipe import TrainConfig
    from shortcutlab.data.table import CropTable

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


def _not_above_chance(r) -> bool:
    """One-sided, as in test_litmus: a parent split may score below chance (siblings answered
    together by a model that maps unseen fields to look-alike training fields), which is no
    leak; the old two-sided "near chance" band failed on such draws."""
    return not r["above_chance"] and r["cluster_ci_low"] <= r["chance"]


def _control(mechanism, delete):
    """The control on test_litmus's benchmark; `cell` deletes every cell in the crop (the
    all-cells masks), as `shortcutlab control` does by default on a synthetic benchmark."""
    from shortcutlab.studies.demo import _crops_from_synth
    from shortcutlab.models.recipe import TrainConfig
    from shortcutlab.data.splits import make_split
    from shortcutlab.synth import SynthConfig, synthesize

    data = synthesize(SynthConfig(seed=0, fields_per_class=40, crop_size=32, field_size=128, mean_cells_per_field=4, mechanisms=(mechanism,)))
    crops = _crops_from_synth(data, all_cells=delete == "cell")
    split = make_split(crops.table, "crop", test_fraction=0.3, seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two small trainings; more threads only fight over shared cores
    try:
        res = deleted_signal_control(crops, split, delete=delete, config=TrainConfig(**CONFIG))
    finally:
        torch.set_num_threads(threads)
    return {r["split"]: dict(r, verdict=res.verdict) for r in res.rows}


@pytest.mark.slow
@pytest.mark.parametrize("delete", ["labels", "cell"])
def test_deleted_signal_stays_above_chance_only_under_the_crop_split(delete):
    rows = _control("background", delete)
    given, parent = rows["given"], rows["parent"]
    assert given["protocol"] == "crop" and parent["protocol"] == "parent"
    assert given["above_chance"] and given["accuracy"] - given["chance"] > 0.15, given
    assert _not_above_chance(parent), parent
    assert given["verdict"] == "split leaks", given     # the two splits compared with each other


@pytest.mark.slow
@pytest.mark.parametrize("delete", ["labels", "cell"])
def test_control_without_a_planted_signature_is_near_chance_under_both_splits(delete):
    # With the centred cell's mask alone, `cell` stayed above chance here under both splits
    # (neighbouring cells of single-class fields carry the class; docs/no-parent-labels.md).
    rows = _control("none", delete)
    for name in ("given", "parent"):
        r = rows[name]
        assert _not_above_chance(r), (name, r)
        assert r["ci_low"] <= r["chance"], (name, r)  # not above chance even on the (narrower) Wilson interval
        assert r["verdict"] != "split leaks", (name, r)


# ------------------------------------------------------------------------------ comparing the splits
from shortcutlab.stats import cluster_bootstrap_difference, newcombe_interval, wilson_interval  # noqa: E402
from shortcutlab.studies.control import compare_splits, control_verdict  # noqa: E402


def _hand_wilson(k, n, z=1.959963984540054):
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def test_newcombe_interval_by_hand_and_against_statsmodels():
    """0.80 - 0.45 on 300 crops each, Newcombe's method 10 written out from two hand-made
    Wilson intervals (z = 1.96), and statsmodels' 'newcomb'."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    (l1, u1), (l2, u2) = _hand_wilson(240, 300), _hand_wilson(135, 300)
    hand = (0.35 - np.hypot(0.80 - l1, u2 - 0.45), 0.35 + np.hypot(u1 - 0.80, 0.45 - l2))
    assert hand == pytest.approx((0.2752, 0.4191), abs=1e-4)  # worked on paper: 0.35 -/+ 0.0748, 0.0691
    assert newcombe_interval(240, 300, 135, 300) == pytest.approx(hand, abs=1e-12)
    for k1, n1, k2, n2 in ((240, 300, 135, 300), (81, 150, 82, 150), (0, 20, 3, 40), (50, 50, 1, 7)):
        ref = confint_proportions_2indep(k1, n1, k2, n2, method="newcomb", compare="diff")
        assert newcombe_interval(k1, n1, k2, n2) == pytest.approx(tuple(map(float, ref)), abs=1e-10)
    assert wilson_interval(240, 300) == pytest.approx(_hand_wilson(240, 300), abs=1e-12)
    assert all(np.isnan(newcombe_interval(0, 0, 3, 10)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cluster_bootstrap_difference_against_the_normal_approximation(seed):
    """Singleton clusters: the percentile interval of 0.80 - 0.45 (n = 300 each) is close to
    d -/+ 1.96 sqrt(p1 q1 / n1 + p2 q2 / n2) = 0.35 -/+ 0.0722; siblings answered together
    in parents of 10 widen it to the parents' own (30 per side): 0.35 -/+ 0.2283 (a binomial
    over 30 parents). Margins 0.012 / 0.035 hold for seeds 0-2 and several more tried (0-9)."""
    rng = np.random.default_rng(seed)
    g, p = rng.permutation(np.r_[np.ones(240), np.zeros(60)]), rng.permutation(np.r_[np.ones(135), np.zeros(165)])
    lo, hi = cluster_bootstrap_difference(g, np.arange(300), p, np.arange(300), seed=seed)
    half = 1.959964 * np.sqrt(0.8 * 0.2 / 300 + 0.45 * 0.55 / 300)
    assert (lo, hi) == pytest.approx((0.35 - half, 0.35 + half), abs=0.012)
    # 24 of 30 parents all right (given), 13.5 -> 135 crops = 13 all right and one half right (parent)
    gp = np.repeat(np.r_[np.ones(24), np.zeros(6)], 10)
    pp_ = np.repeat(np.r_[np.ones(13), np.zeros(17)], 10)
    pp_[130:135] = 1
    parents = np.repeat(np.arange(30), 10)
    lo, hi = cluster_bootstrap_difference(gp, parents, pp_, parents, seed=seed)
    half = 1.959964 * np.sqrt(0.8 * 0.2 / 30 + 0.45 * 0.55 / 30)
    assert (lo, hi) == pytest.approx((0.35 - half, 0.35 + half), abs=0.035)
    assert all(np.isnan(cluster_bootstrap_difference([], [], p, np.arange(300))))


def _sides(k1, n1, k2, n2, per_parent=4, seed=0):
    """Correctness of two test sides with k1 of n1 and k2 of n2 right, in parents of
    `per_parent` crops, shuffled."""
    rng = np.random.default_rng(seed)
    g = rng.permutation(np.r_[np.ones(k1, bool), np.zeros(n1 - k1, bool)])
    p = rng.permutation(np.r_[np.ones(k2, bool), np.zeros(n2 - k2, bool)])
    return g, np.arange(n1) // per_parent, p, np.arange(n2) // per_parent


def _row(acc, above, chance=1 / 3):
    return dict(accuracy=acc, chance=chance, above_chance=above)


def test_control_verdict_equal_scores_are_no_leak_whatever_each_says_against_chance():
    """The issue's case: 0.540 (81/150, 'above chance') under the user's split and 0.547
    (82/150, 'not above chance' on its wider parent-cluster interval) under a parent split
    score the same: not 'the split leaks'; a split above chance means the deletion left the
    class signal."""
    c = compare_splits(*_sides(81, 150, 82, 150))
    assert c["difference"] == pytest.approx(81 / 150 - 82 / 150)
    assert (c["newcombe_low"], c["newcombe_high"]) == pytest.approx((-0.11788, 0.10479), abs=1e-4)  # statsmodels' newcomb
    assert c["cluster_low"] < 0 < c["cluster_high"]
    v = control_verdict(c, _row(0.540, True), _row(0.547, False))
    assert v["verdict"] == "no difference" and v["signal_left"]
    assert not v["reading"].startswith("the split leaks") and "the two splits score alike" in v["reading"]
    assert "the given split is above chance, so the deleted region did not remove the class signal" in v["reading"]
    both = control_verdict(c, _row(0.540, True), _row(0.547, True))
    assert both["verdict"] == "no difference" and "both splits are above chance" in both["reading"]
    none = control_verdict(c, _row(0.340, False), _row(0.347, False))
    assert none["verdict"] == "no difference" and not none["signal_left"] and "both are at chance" in none["reading"]


def test_control_verdict_clear_leak_and_the_reverse():
    """0.80 vs 0.45 on 300 crops each (parents of 3): both intervals lie above 0 (Newcombe's
    by hand: 0.2752 to 0.4191), so the split leaks; swapped, the parent split scores higher."""
    c = compare_splits(*_sides(240, 300, 135, 300, per_parent=3))
    assert (c["newcombe_low"], c["newcombe_high"]) == pytest.approx((0.2752, 0.4191), abs=1e-4)
    assert 0.15 < c["cluster_low"] < 0.35 < c["cluster_high"] < 0.55
    v = control_verdict(c, _row(0.80, True), _row(0.45, False))
    assert v["verdict"] == "split leaks" and not v["signal_left"]
    assert v["reading"].startswith("the split leaks: ") and "difference +35.0 pp" in v["reading"]
    v = control_verdict(c, _row(0.80, True), _row(0.45, True))
    assert v["verdict"] == "split leaks" and v["signal_left"] and "the deletion also left some class signal" in v["reading"]
    r = compare_splits(*_sides(135, 300, 240, 300, per_parent=3))
    assert control_verdict(r, _row(0.45, False), _row(0.80, True))["verdict"] == "parent higher"


def test_control_verdict_is_decided_on_the_printed_interval():
    """A lower end of +0.04 pp prints '+0.0': the interval as printed includes 0, so the words
    are 'no difference', as for a lower end of -0.04 pp (also printed '+0.0' / '-0.0')."""
    words = set()
    for low in (0.0004, -0.0004, 0.0):
        c = dict(difference=0.05, newcombe_low=low, newcombe_high=0.1, cluster_low=low + 0.01, cluster_high=0.09, level=0.95)
        words.add(control_verdict(c, _row(0.55, True), _row(0.50, True))["verdict"])
    assert words == {"no difference"}
    c = dict(difference=0.05, newcombe_low=0.0006, newcombe_high=0.1, cluster_low=0.01, cluster_high=0.09, level=0.95)
    assert control_verdict(c, _row(0.55, True), _row(0.50, True))["verdict"] == "split leaks"  # prints +0.1
    nan = dict(difference=np.nan, newcombe_low=np.nan, newcombe_high=np.nan, cluster_low=np.nan, cluster_high=np.nan)
    assert control_verdict(nan, _row(np.nan, False), _row(0.5, False))["verdict"] == "undetermined"
