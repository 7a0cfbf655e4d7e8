"""The report's Grad-CAM table, summary and reading (`report.tables.gradcam_rows`,
`gradcam_summary`, `readings.gradcam_reading`): constant maps counted over models, the
randomised-head check "undefined" when most maps are constant, and coarse maps named.

References: constructed diagnostic rows whose sums and shares are counted by hand.
"""

from __future__ import annotations

import pandas as pd
import pytest

from shortcutlab.report.readings import gradcam_reading, head_check_verdict
from shortcutlab.report.tables import gradcam_rows, gradcam_summary

BASE = "target=predicted"


def _model_rows(model: str, exposure: str, seed: int, *, constant: int, undefined: int, n: int = 20, cells=(8, 8),
                rho: float = 0.1, condition: str = "background", om: float | None = None) -> list[dict]:
    keys = dict(model=model, condition=condition, arch="cam_cnn", diversity="high", seed=seed, exposure=exposure,
                diagnostic="gradcam")
    c0 = f"{BASE},cascade=0"
    om = (0.9 if exposure == "leak" else 0.7) if om is None else om
    rows = [("outside_mass", BASE, om, n), ("random_pair_spearman", BASE, 0.3, n),
            ("cam_height", BASE, cells[0], None), ("cam_width", BASE, cells[1], None),
            ("randomized_outside_mass", c0, 0.8, n), ("randomized_head_spearman", c0, rho, n - undefined),
            ("randomized_constant_maps", c0, constant, n), ("randomized_constant_share", c0, constant / n, n),
            ("randomized_nan", c0, undefined, n),
            # a deeper cascade's counts must not be added in
            ("randomized_constant_maps", f"{BASE},cascade=1", n, n), ("randomized_nan", f"{BASE},cascade=1", n, n)]
    return [dict(keys, metric=m, setting=s, value=v, n=k) for m, s, v, k in rows]


def _results(constants, undefined, cells=((8, 8),) * 4) -> pd.DataFrame:
    rows = []
    for i, (c, u, hw) in enumerate(zip(constants, undefined, cells)):
        rows += _model_rows(f"m{i}", "leak" if i % 2 == 0 else "clean", i // 2, constant=c, undefined=u, cells=hw)
    return pd.DataFrame(rows)


def test_counts_are_summed_over_models_at_cascade_0():
    rows = gradcam_rows(_results([20, 11, 5, 15], [20, 12, 5, 15]))
    assert list(rows["randomized_constant_maps"]) == [11, 15, 20, 5]  # sorted: clean before leak, then seed
    assert list(rows["n_maps"]) == [20] * 4
    s = gradcam_summary(rows)
    assert (s["randomized_constant_maps"], s["randomized_undefined"], s["maps"]) == (51, 52, 80)
    assert s["cam_cells"] == (8, 8)
    assert s["outside_mass"] == {"leak": 0.9, "clean": 0.7}


def test_most_maps_constant_makes_the_check_undefined_not_passed():
    s = gradcam_summary(gradcam_rows(_results([20, 11, 5, 15], [20, 11, 5, 15])))
    assert head_check_verdict(s) == "undefined: 51 of 80 randomised-head maps are constant"
    text = gradcam_reading(s)
    assert "the randomised-head check is undefined: 51 of 80 randomised-head maps are constant" in text
    assert "passes" not in text and "fails" not in text and "rho 0.10" not in text


def test_half_the_maps_constant_is_not_most():
    s = gradcam_summary(gradcam_rows(_results([10, 10, 10, 10], [10, 10, 10, 10])))
    assert (s["randomized_constant_maps"], s["maps"]) == (40, 80)
    assert head_check_verdict(s) == "passes"
    assert "median rho 0.10 against 0.30 between random pairs of crops: the maps change when the head is randomised " \
           "(the check passes)" in gradcam_reading(s)


def test_undefined_rho_for_most_crops_is_undefined_too():
    """Trained maps constant, randomised ones not: 41 of 80 crops have no rho."""
    s = gradcam_summary(gradcam_rows(_results([0, 0, 0, 0], [11, 10, 10, 10])))
    assert head_check_verdict(s) == "undefined: rho is undefined for 41 of 80 crops (a constant map)"


def test_a_high_rho_fails_and_summaries_without_counts_read_as_before():
    assert head_check_verdict({"randomized_head_spearman": 0.72}) == "fails"
    assert head_check_verdict({"randomized_head_spearman": 0.49}) == "passes"
    assert head_check_verdict({}) == "n/a"
    # a summary without counts (an older sweep) reads as it did
    assert "the check fails" in gradcam_reading({"outside_mass": {"leak": 0.84}, "randomized_head_spearman": 0.72})


def test_coarse_maps_are_named_with_their_cells():
    s = gradcam_summary(gradcam_rows(_results([0] * 4, [0] * 4, cells=[(8, 8), (2, 2), (8, 8), (8, 8)])))
    assert s["cam_cells"] == (2, 2)  # the coarsest model's
    assert gradcam_reading(s).startswith("The maps are at 2 x 2 cells of the saliency layer")
    fine = gradcam_summary(gradcam_rows(_results([0] * 4, [0] * 4)))
    assert "cells" not in gradcam_reading(fine)
    assert gradcam_reading(fine).startswith("Grad-CAM puts 90% of the attribution outside the cell in leak models")


def test_with_a_control_condition_the_reading_compares_each_condition_with_none():
    """Outside mass per condition: background 0.80 / 0.82 (two seeds each: 0.78 and 0.82, 0.80
    and 0.84) against none 0.64 / 0.66; by hand +16.0 pp and +16.0 pp."""
    rows = []
    for cond, values in (("none", {"leak": (0.62, 0.66), "clean": (0.64, 0.68)}),
                         ("background", {"leak": (0.78, 0.82), "clean": (0.80, 0.84)})):
        for exposure, oms in values.items():
            for seed, om in enumerate(oms):
                rows += _model_rows(f"{cond}-{exposure}-{seed}", exposure, seed, constant=0, undefined=0, condition=cond, om=om)
    s = gradcam_summary(gradcam_rows(pd.DataFrame(rows)))
    assert list(s["outside_mass_by_condition"]) == ["background", "none"]
    assert s["outside_mass_by_condition"]["background"] == pytest.approx({"leak": 0.80, "clean": 0.82})
    text = gradcam_reading(s)
    assert text.startswith("Grad-CAM puts 80% (leak models) and 82% (clean models) of the attribution outside the cell under "
                           "background, 64% and 66% under none; against none: +16.0 pp and +16.0 pp under background")


def test_rows_of_an_older_sweep_without_counts_or_cells_leave_those_columns_empty():
    old = _results([0] * 4, [0] * 4)
    old = old[~old["metric"].isin(["cam_height", "cam_width", "randomized_constant_maps", "randomized_constant_share",
                                   "randomized_nan"])]
    rows = gradcam_rows(old)
    assert len(rows) == 4 and rows[["cam_height", "randomized_constant_maps", "n_maps"]].isna().all().all()
    s = gradcam_summary(rows)
    assert "maps" not in s and "cam_cells" not in s
    assert head_check_verdict(s) == "passes"
