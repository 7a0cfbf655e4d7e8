"""One contract test over every registered intervention (kornia's tester, sklearn's check_estimator):
`shortcutlab.testing.check_intervention`, which plug-in authors run in their own tests.

Every name in `interventions.available()` must appear in `PARAMS` (constructor arguments for
the test) and, when label-conditioned, in `CONTEXT` (per-batch keyword arguments): a new
intervention that is not added here fails `test_every_intervention_is_covered`.
"""

from __future__ import annotations

import pytest
import torch

import interventions
from interventions import InterventionError
from shortcutlab.testing import check_intervention, synthetic_batch

# Constructor arguments used by the contract test (defaults where None).
PARAMS: dict[str, dict] = {
    "greyscale": {},
    "low_pass": {"sigma": 1.5},
    "reinhard": {"target_mean": (62.0, 12.0, -8.0), "target_std": (14.0, 6.0, 5.0)},
    "reinhard_unseen_field": {},
    "hed_jitter": {"sigma_alpha": 0.05, "sigma_beta": 0.05},
    "stain_normalize": {},
    "background_removal": {"fill": "mean"},
    "background_noise": {},
    "background_transplant": {"sigma": 3.0},
    "illumination_flattening": {},
    "corner_patches": {"position": "top_right", "size": 12},
}

# Per-batch keyword arguments for label-conditioned interventions: name -> fn(x) -> dict.
CONTEXT: dict[str, callable] = {
    # per-crop LAB targets, as built from unseen_field_targets + field_lab_statistics
    "reinhard_unseen_field": lambda x: {
        "target_mean": torch.tensor([60.0, 10.0, -6.0], dtype=torch.float64).repeat(x.shape[0], 1) + torch.arange(x.shape[0])[:, None],
        "target_std": torch.tensor([12.0, 5.0, 4.0], dtype=torch.float64).repeat(x.shape[0], 1),
    },
}

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.device)] if torch.cuda.is_available() else [])
NAMES = interventions.available()


def _make(name):
    return interventions.get(name, **PARAMS.get(name, {}))


def test_every_intervention_is_covered():
    missing = [n for n in NAMES if n not in PARAMS]
    missing += [n for n in NAMES if interventions.get_class(n).label_conditioned and n not in CONTEXT]
    assert not missing, f"add these interventions to the contract test's PARAMS/CONTEXT: {missing}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_every_intervention_keeps_the_contract(name, device):
    """`shortcutlab.testing.check_intervention`: shape, dtype, device and range (float32 and
    float64, input untouched; also on the GPU where there is one), the empty batch,
    determinism and replay, masks, bad input."""
    check_intervention(_make(name), context=CONTEXT.get(name), device=device)


@pytest.mark.parametrize("name", NAMES)
def test_function_twin_is_exported(name):
    cls = interventions.get_class(name)
    twin = getattr(interventions, name, None)
    assert callable(twin) and not isinstance(twin, type), f"interventions.{name} (the function twin of {cls.__name__}) is missing"


def test_registry_errors_and_plugins(tmp_path, monkeypatch):
    with pytest.raises(InterventionError, match="did you mean 'greyscale'"):
        interventions.get("grayscale")
    with pytest.raises(InterventionError, match="takes no parameter 'sigmma'"):
        interventions.get("low_pass", sigmma=2)
    with pytest.raises(InterventionError, match="already registered by interventions.greyscale.Greyscale"):

        @interventions.register("greyscale")
        class Other(interventions.Intervention):
            def apply(self, x, mask, params, **context):
                return x

    # a third-party plug-in joins through the entry-point group
    dist = tmp_path / "fake_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{interventions.ENTRY_POINT_GROUP}]\ninvert = fake_plugin_mod:Invert\nbroken = fake_plugin_mod:Missing\n")
    (tmp_path / "fake_plugin_mod.py").write_text(
        "from interventions import Intervention\n"
        "class Invert(Intervention):\n"
        "    def apply(self, x, mask, params, **context):\n"
        "        return 1 - x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.warns(UserWarning, match="'broken'"):
            loaded = interventions.load_entry_points(force=True)
        assert loaded == ["invert"] and "invert" in interventions.available()
        x, _ = synthetic_batch()
        torch.testing.assert_close(interventions.get("invert")(x), 1 - x)
    finally:
        interventions.unregister("invert")


def test_incomplete_interventions_fail_early():
    class NoApply(interventions.Intervention):
        pass

    with pytest.raises(TypeError, match="apply"):
        NoApply()
    with pytest.raises(TypeError, match="does not define draw_params"):

        class RandomWithoutDraw(interventions.Intervention):
            stochastic = True

            def apply(self, x, mask, params, **context):
                return x
