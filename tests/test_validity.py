"""The diagnostic-validity pattern on the planted benchmark (examples/validity.yaml, reduced):
colour transfer to an unseen field removes a planted `color` leak, background removal a
planted `background` leak, and under `none` there is no leak to remove."""

import os

import pandas as pd
import pytest
import yaml

from shortcutlab.stats import intervention_effect, leak_effect
from shortcutlab.sweep import LocalExecutor
from shortcutlab.sweep.config import validate
from shortcutlab.sweep.runner import run_sweep

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "validity.yaml")


@pytest.mark.slow
def test_each_planted_mechanism_is_removed_by_its_own_intervention(tmp_path):
    with open(EXAMPLE, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    # The example's settings on three of its conditions, 4 seeds and two interventions
    # (24 models; the full study: docs/validity.md).
    raw["data"]["synthetic"]["mechanisms"] = ["color", "background", "none"]
    raw["data"]["synthetic"]["strengths"] = {k: v for k, v in raw["data"]["synthetic"]["strengths"].items() if k in ("color", "background")}
    raw["seeds"] = [0, 1, 2, 3]
    raw["interventions"] = ["reinhard_unseen_field", "background_removal"]
    raw["diagnostics"] = "none"
    # two workers: the tables are those of one (test_sweep_run), in half the time on 2 cores
    run_sweep(validate(raw, source="validity.yaml"), str(tmp_path), LocalExecutor(workers=2), progress=False)
    pred = pd.read_parquet(tmp_path / "predictions.parquet")
    leak = leak_effect(pred, n_boot=1000).query("intervention == 'none'").set_index("condition")
    cut = intervention_effect(pred, n_boot=1000).query("estimand == 'leak_cut'").set_index(["condition", "intervention"])
    for planted, remover in (("color", "reinhard_unseen_field"), ("background", "background_removal")):
        assert leak.loc[planted, "ci_low"] > 0, leak.loc[planted]
        assert cut.loc[(planted, remover), "ci_low"] > 0, cut.loc[(planted, remover)]
    assert leak.loc["none", "ci_low"] < 0 < leak.loc["none", "ci_high"], leak.loc["none"]


@pytest.mark.slow
def test_an_illumination_gain_leak_goes_only_when_flattening_sets_the_level(tmp_path, seeds=range(16)):
    """A per-field gain (illumination_shading 0) leaks on its own. Flattening as in the paper
    keeps each crop's background brightness, so the gain and its leak survive; flattening to
    one background level removes the leak. 16 seeds, 32 models.

    The leak varies much from seed to seed (seeds 0-31: per-seed leak SD 0.12, per-seed cut by
    flattening to one level mean 0.23, SD 0.11), so the seed count sets the margin. With 8
    seeds (before) the cut's interval cleared 0 by 0.013 here (seeds 0-7) and missed it (-0.012)
    on another machine. With 16 its half-width is about 0.11, below the mean cut by about 4
    SDs of a 16-seed mean (0.029).

    Passes for 7 of 7 sets of 16 seeds tried (0-15, 4-19, 8-23, 12-27, 16-31, the even and the
    odd seeds of 0-31): leak interval lower end 0.102-0.182; the level-0.75 cut's lower end
    0.102-0.152 (0-15: 0.102); the paper's flattening's cut upper end 0.028-0.034 against half
    the leak 0.094-0.128."""
    with open(EXAMPLE, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    assert raw["data"]["synthetic"]["illumination_shading"] == 0.0
    raw["data"]["synthetic"]["mechanisms"] = ["illumination"]
    raw["data"]["synthetic"]["strengths"] = {"illumination": raw["data"]["synthetic"]["strengths"]["illumination"]}
    raw["seeds"] = list(seeds)
    raw["interventions"] = {"names": ["illumination_flattening"], "params": {"illumination_flattening": [{}, {"level": 0.75}]}}
    raw["diagnostics"] = "none"
    # two workers: the tables are those of one (test_sweep_run), in half the time on 2 cores
    run_sweep(validate(raw, source="validity.yaml"), str(tmp_path), LocalExecutor(workers=2), progress=False)
    pred = pd.read_parquet(tmp_path / "predictions.parquet")
    leak = leak_effect(pred, n_boot=1000).query("intervention == 'none'").set_index("condition").loc["illumination"]
    cut = intervention_effect(pred, n_boot=1000).query("estimand == 'leak_cut'").set_index("intervention")
    assert leak["ci_low"] > 0, leak
    assert cut.loc["illumination_flattening:level=0.75", "ci_low"] > 0, cut
    assert cut.loc["illumination_flattening", "ci_high"] < leak["estimate"] / 2, cut  # keeps most of the leak
