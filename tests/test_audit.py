import numpy as np
import pandas as pd
import pytest

from shortcutlab import SplitError, SplitManifest, audit, crop_split, measure_split, parent_split, reporting_card
from shortcutlab.data.random_tables import random_table
from conftest import table_from


def test_parent_split_measures_no_exposure(cric):
    r = audit(cric, 0.2, split=parent_split(cric, 0.2, seed=0))
    m = r["measured"]
    assert m["test"]["with_train_sibling"] == 0.0
    assert m["test"]["with_overlapping_train_sibling"] == 0.0
    assert m["parents_crossing"] == 0
    assert m["train"]["n_parents"] + m["test"]["n_parents"] == 400
    assert sum(m["test"]["class_share"].values()) == pytest.approx(1.0)


def test_crop_split_measured_matches_closed_form(cric):
    shares, pix = [], []
    for seed in range(10):
        m = audit(cric, 0.2, split=crop_split(cric, 0.2, seed=seed))["measured"]
        shares.append(m["test"]["with_train_sibling"])
        pix.append(m["test"]["with_overlapping_train_sibling"])
    r = audit(cric, 0.2)
    assert np.mean(shares) == pytest.approx(r["exposure"], abs=0.002)
    assert np.mean(pix) == pytest.approx(r["pixel_overlap"], abs=0.02)


def test_measured_figures_by_hand():
    df = pd.DataFrame(
        {
            "id": list("abcdef"),
            "label": list("xxyyxy"),
            "parent": ["p", "p", "q", "q", "r", "s"],
            "pt": ["A", "A", "A", "A", "B", "B"],
            "x": [0, 50, 0, 500, 0, 0],
            "y": 0,
            "w": 100,
            "h": 100,
        }
    )
    t = table_from(df, group="pt")
    split = SplitManifest(pd.DataFrame({"id": list("abcde"), "split": ["train", "test", "train", "test", "val"]}))
    m = measure_split(t, split.cell())
    # b overlaps training sibling a; d has training sibling c but no shared pixel.
    assert m["test"]["with_train_sibling"] == 1.0
    assert m["test"]["with_overlapping_train_sibling"] == 0.5
    assert m["val"]["with_train_sibling"] == 0.0
    assert m["n_unassigned"] == 1
    assert m["parents_crossing"] == 2 and m["groups_crossing"] == 1
    assert m["test"]["n_groups"] == 1 and m["test"]["class_share"] == {"x": 0.5, "y": 0.5}


def test_unknown_ids_are_refused(cric):
    bad = SplitManifest(pd.DataFrame({"id": ["no-such-crop"], "split": ["test"]}))
    with pytest.raises(SplitError, match=r"1 crop id\(s\) that are not in the table, e.g. \['no-such-crop'\]"):
        audit(cric, split=bad)


def test_reporting_card_states_the_standard_items(cric):
    from shortcutlab import dedup_split  # noqa: F401  (card for P2 here; P3 in the CLI test)

    m = parent_split(cric, 0.2, seed=0)
    card = reporting_card(audit(cric, 0.2, split=m))
    assert "Split unit: parent" in card
    assert "shortcutlab `parent`" in card and '"seed": 0' in card
    assert "parents (acquisitions): 400" in card
    assert "| test | 2," in card and "| 0.00% |" in card
    assert "Near-duplicate merging before the split: no" in card
    assert m.hash in card
    plain = reporting_card(audit(cric, 0.2))
    assert "No split given" in plain and "would expose 99.99% of test crops" in plain


def test_multi_cell_audit_measures_every_cell():
    t = table_from(random_table(150, 6, 2, geometry=False, seed=0))
    from shortcutlab import factorial_split

    r = audit(t, split=factorial_split(t, seed=0))
    assert set(r["measured"]) == {"leak-high", "clean-high", "leak-low", "clean-low"}
    assert r["measured"]["leak-low"]["test"]["with_train_sibling"] == 1.0
    assert r["measured"]["clean-low"]["test"]["with_train_sibling"] == 0.0
    assert "### Cell `leak-high`" in reporting_card(r)


def test_audit_counts_and_warns_about_crops_missing_from_the_manifest():
    t = table_from(random_table(30, 4, 2, geometry=False, seed=0))
    full = parent_split(t, 0.2, seed=0)
    keep = full.assignments.iloc[7:]  # drop the first seven rows (ids sorted) from the manifest
    part = SplitManifest(keep, protocol="parent", params=full.params)
    with pytest.warns(UserWarning, match=f"leaves 7 of the table's {t.n_crops} crops unassigned"):
        r = audit(t, split=part)
    assert r["split"]["n_unassigned"] == 7 and r["measured"]["n_unassigned"] == 7
    assert sum(r["measured"][s]["n_crops"] for s in ("train", "test")) == t.n_crops - 7
    card = reporting_card(r)
    assert "Crops of the table in no row of the manifest: 7 (state why they were left out)" in card
    # A complete manifest says nothing and counts 0.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert audit(t, split=full)["split"]["n_unassigned"] == 0
        # A factorial's cells train on a subset by design: counted, not warned about.
        from shortcutlab import factorial_split

        fac = factorial_split(t, seed=0)
        used = set(fac.assignments["id"])
        assert audit(t, split=fac)["split"]["n_unassigned"] == t.n_crops - len(used)


# --- reference 002's reporting items ------------------------------------------------------------
def _image_table(tmp_path, n=12):
    """n distinct 16 x 16 crops (smooth random fields) in n parents; crop t{k} is crop r{k}
    rotated by 90 degrees, so each rotated copy is a pixel sibling of its source."""
    from PIL import Image
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(0)
    rows = []
    for k in range(n):
        g = (gaussian_filter(rng.random((32, 32)), 3) * 255 / 0.6).clip(0, 255).astype(np.uint8)
        rgb = np.stack([g, g, g], axis=2)
        Image.fromarray(rgb).save(tmp_path / f"r{k}.png")
        Image.fromarray(np.ascontiguousarray(np.rot90(rgb))).save(tmp_path / f"t{k}.png")
        rows += [{"id": f"r{k}", "label": "ab"[k % 2], "parent": f"p{k}", "image": f"r{k}.png"},
                 {"id": f"t{k}", "label": "ab"[k % 2], "parent": f"q{k}", "image": f"t{k}.png"}]
    pd.DataFrame(rows).to_csv(tmp_path / "crops.csv", index=False)
    from shortcutlab import CropTable

    return CropTable.from_csv(str(tmp_path / "crops.csv"), id="id", image="image")


def test_card_states_reference_002_items_with_the_measured_pixel_sibling_share(tmp_path):
    from shortcutlab.data.siblings import find_siblings

    table = _image_table(tmp_path)
    # Rotated copies t0..t5 on the test side with their sources on the training side, t6..t11
    # on the test side whose sources are also tested: 6 of 12 test crops have a training sibling.
    test_ids = [f"t{k}" for k in range(12)] + [f"r{k}" for k in range(6, 12)]
    sides = ["test" if i in test_ids else "train" for i in table.ids]
    split = SplitManifest(pd.DataFrame({"id": table.ids, "split": sides}), protocol="external")
    r = audit(table, 0.2, split=split, augmentation="augment-then-split")
    sib = r["pixel_siblings"][""]
    # The same share straight from the sibling search on the arrays.
    from PIL import Image

    load = lambda ids: np.stack([np.asarray(Image.open(tmp_path / f"{i}.png").convert("RGB")) for i in ids])
    direct = find_siblings(load([i for i, s in zip(table.ids, sides) if s == "train"]), load([i for i, s in zip(table.ids, sides) if s == "test"]))
    assert sib["n_test"] == 18 and sib["share"] == pytest.approx(direct.share)
    assert sib["n_with_sibling"] >= 6  # the six rotated copies at least (distinct smooth fields rarely collide)
    card = reporting_card(r)
    assert "## Reporting items (reference 002)" in card
    assert "Acquisitions counted: 24 independent acquisitions (parents) behind 24 crops" in card
    assert "Split before or after augmentation: split after augmentation (declared)" in card
    assert "Split unit: unknown (manifest without metadata)" in card
    assert f"Pixel-sibling share: {100 * direct.share:.2f}% of test crops ({sib['n_with_sibling']} of 18)" in card


def test_card_items_without_images_declaration_or_split(cric):
    card = reporting_card(audit(cric, 0.2, split=crop_split(cric, 0.2, seed=0)))
    assert "Split unit: crop" in card
    assert "Split before or after augmentation: not declared" in card
    assert "Pixel-sibling share: not measured (the table has no image column" in card
    plain = reporting_card(audit(cric, 0.2))
    assert "Split unit: no split given" in plain and "Pixel-sibling share: not measured (no split given)" in plain
    assert "Acquisitions counted: 400 independent acquisitions (parents) behind 11,534 crops" in plain
    with pytest.raises(Exception, match="augmentation order must be one of split-then-augment"):
        audit(cric, 0.2, augmentation="sometimes")


def test_card_quotes_cell_names_and_warnings_as_typed():
    """A cell name holding a backtick and a tag stays inside its code span; warnings quoting a
    label are escaped (issue 20)."""
    import warnings

    from shortcutlab import CropTable

    t = CropTable.from_frame(pd.DataFrame({"id": list("abcd"), "label": ["<b>x</b>"] * 4, "parent": list("pqrs")}), id="id")
    name = "a`b <script>"
    split = SplitManifest(pd.DataFrame({"id": list("abcd") * 2, "split": ["train", "train", "test", "test"] * 2,
                                        "cell": [name] * 4 + ["plain"] * 4}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        card = reporting_card(audit(t, split=split))
    assert "### Cell ``a`b <script>``" in card and "### Cell `plain`" in card
    warning = [line for line in card.splitlines() if "one class" in line]
    assert warning == ["- the table holds one class ('&lt;b&gt;x&lt;/b&gt;'): there is nothing for a classifier to tell apart, "
                       "so class shares and any accuracy on this table are degenerate"]


def test_assigned_mask_is_set_membership_on_a_table_with_unassigned_crops():
    """`assigned_mask` (Arrow is_in) against a Python set, and the audit's count of unassigned
    crops against the hand count, on a split that drops every third crop of the manifest."""
    import warnings

    from shortcutlab.data.audit import assigned_mask

    t = table_from(random_table(40, 4.0, n_classes=2, seed=5))
    m = parent_split(t, 0.3, seed=0)
    kept = m.assignments.iloc[[i for i in range(len(m.assignments)) if i % 3]].reset_index(drop=True)
    assigned = set(kept["id"])
    expected = np.array([i in assigned for i in t.ids])
    np.testing.assert_array_equal(assigned_mask(t.frame["id"], kept["id"]), expected)
    assert 0 < (~expected).sum() < len(expected)
    dropped = SplitManifest(kept, m.protocol, m.params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = audit(t, 0.3, split=dropped)
    assert result["split"]["n_unassigned"] == int((~expected).sum())
