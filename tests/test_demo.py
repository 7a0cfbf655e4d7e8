"""The demo pipeline on a tiny benchmark: it runs end to end and its tables are consistent."""

import json

import pandas as pd

from shortcutlab.demo import DemoConfig, leak_effects, run_demo


def test_tiny_demo_writes_consistent_tables(tmp_path):
    cfg = DemoConfig(fields_per_class=12, epochs=1, crop_size=16, seeds=(0,), progress=False)
    summary = run_demo(str(tmp_path), cfg)
    results = pd.read_csv(tmp_path / "results.csv")
    assert len(results) == 8  # 4 cells x (planted, none)
    assert set(results["cell"]) == {"leak-high", "clean-high", "leak-low", "clean-low"}
    # Within a condition and level, leak and clean train on the same number of crops and fields.
    for _, g in results.groupby(["condition", "diversity"]):
        assert g["n_train"].nunique() == 1 and g["n_train_parents"].nunique() == 1 and g["n_test"].nunique() == 1
    effects = pd.read_csv(tmp_path / "effects.csv")
    recomputed = leak_effects(results)
    assert (effects["leak_effect"] - recomputed["leak_effect"]).abs().max() < 1e-12
    assert (effects["leak_effect_no_shared_pixels"] - recomputed["leak_effect_no_shared_pixels"]).abs().max() < 1e-12
    assert (results["n_test_no_shared_pixels"] <= results["n_test"]).all()
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["mean_leak_effect_pp"] == summary["mean_leak_effect_pp"]
    assert set(saved["mean_leak_effect_pp"]) == {"color+illumination+background+focus+noise", "none"}
    assert (tmp_path / "none_seed0" / "clean-low" / "run.json").exists()


def test_no_shared_pixel_subset_matches_brute_force_box_intersection():
    import numpy as np

    from shortcutlab.audit import side_codes
    from shortcutlab.demo import _crops_from_synth, _no_shared_pixels
    from shortcutlab.splits import factorial_split
    from shortcutlab.synth import SynthConfig, synthesize

    crops = _crops_from_synth(synthesize(SynthConfig(seed=2, fields_per_class=15, crop_size=16, mechanisms="none")))
    table = crops.table
    split = factorial_split(table, seed=2, test_parent_share=0.3, diversity_contrast=1.43)
    subsets = _no_shared_pixels(table, split)
    boxes, parents, ids = table.boxes, table.parent_codes, table.ids.astype(str)
    for level in ("high", "low"):
        side = side_codes(table, split.cell(f"leak-{level}"))
        expected = set()
        for i in np.flatnonzero(side == 2):
            j = np.flatnonzero((side == 0) & (parents == parents[i]))
            x, y, w, h = boxes[i]
            hit = (boxes[j, 0] < x + w) & (x < boxes[j, 0] + boxes[j, 2]) & (boxes[j, 1] < y + h) & (y < boxes[j, 1] + boxes[j, 3])
            if not hit.any():
                expected.add(ids[i])
        assert subsets[level] == expected
        assert 0 < len(expected) < int((side == 2).sum())  # both kinds of test crop occur
