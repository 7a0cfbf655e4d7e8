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
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["mean_leak_effect_pp"] == summary["mean_leak_effect_pp"]
    assert set(saved["mean_leak_effect_pp"]) == {"color+illumination+background+focus+noise", "none"}
    assert (tmp_path / "none_seed0" / "clean-low" / "run.json").exists()
