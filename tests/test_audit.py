import numpy as np
import pandas as pd
import pytest

from shortcutlab import SplitError, SplitManifest, audit, crop_split, measure_split, parent_split, reporting_card
from shortcutlab.random_tables import random_table
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
