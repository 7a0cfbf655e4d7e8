"""One contract test over every registered intervention (kornia's tester, sklearn's check_estimator).

Every name in `interventions.available()` must appear in `PARAMS` (constructor arguments for
the test) and, when label-conditioned, in `CONTEXT` (per-batch keyword arguments): a new
intervention that is not added here fails `test_every_intervention_is_covered`.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import interventions
from interventions import InterventionError

B, H, W = 4, 24, 24

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


def _batch(dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(B, 3, H, W, generator=g, dtype=torch.float64)
    yy, xx = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    r2 = (yy - H / 2 + 0.5) ** 2 + (xx - W / 2 + 0.5) ** 2
    mask = (r2 < (H / 3) ** 2).to(torch.float64).expand(B, 1, H, W).clone()
    # a darker, purplish cell on a bright background, so stain methods find tissue
    x = mask * (0.35 + 0.3 * x * torch.tensor([1.0, 0.6, 1.0]).view(1, 3, 1, 1)) + (1 - mask) * (0.8 + 0.15 * x)
    return x.to(device=device, dtype=dtype), mask.to(device=device, dtype=dtype)


def _make(name):
    return interventions.get(name, **PARAMS.get(name, {}))


def _call(t, x, mask, **kw):
    ctx = CONTEXT[t.name](x) if t.label_conditioned else {}
    return t(x, mask, **ctx, **kw)


def test_every_intervention_is_covered():
    missing = [n for n in NAMES if n not in PARAMS]
    missing += [n for n in NAMES if interventions.get_class(n).label_conditioned and n not in CONTEXT]
    assert not missing, f"add these interventions to the contract test's PARAMS/CONTEXT: {missing}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", NAMES)
def test_shape_dtype_device_range(name, dtype, device):
    x, mask = _batch(dtype, device)
    t = _make(name).to(device)
    g = torch.Generator().manual_seed(1) if t.stochastic else None
    before, mask_before = x.clone(), mask.clone()
    y = _call(t, x, mask, generator=g)
    assert torch.equal(x, before) and torch.equal(mask, mask_before), "the input batch or mask was modified in place"
    assert y.shape == x.shape and y.dtype == dtype and y.device == x.device
    assert torch.isfinite(y).all()
    assert float(y.min()) >= 0.0 and float(y.max()) <= 1.0
    assert not y.requires_grad or x.requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize(
    "name, with_mask",
    [(n, m) for n in NAMES for m in (True, False) if m or not interventions.get_class(n).requires_mask],
    ids=lambda v: {True: "mask", False: "no_mask"}.get(v, v) if isinstance(v, bool) else v,
)
def test_an_empty_batch_gives_an_empty_batch(name, with_mask, dtype):
    """B = 0 (the last, empty chunk of a batched pipeline) is valid input: every intervention
    returns an empty (0, 3, H, W) batch of the same dtype, silently, with empty draws and flags."""
    x, mask = _batch(dtype)
    x, mask = x[:0], mask[:0]
    t = _make(name)
    g = torch.Generator().manual_seed(0) if t.stochastic else None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = _call(t, x, mask if with_mask else None, generator=g)
    assert y.shape == (0, 3, H, W) and y.dtype == dtype and y.device == x.device
    if t.stochastic:
        assert all(v.shape[0] == 0 for v in t.last_params.values() if isinstance(v, torch.Tensor))
        torch.testing.assert_close(_call(t, x, mask if with_mask else None, params=t.last_params), y)
    if t.last_applicable is not None:
        assert t.last_applicable.shape == (0,) and t.last_applicable.dtype == torch.bool


@pytest.mark.parametrize("name", NAMES)
def test_function_twin_is_exported(name):
    cls = interventions.get_class(name)
    twin = getattr(interventions, name, None)
    assert callable(twin) and not isinstance(twin, type), f"interventions.{name} (the function twin of {cls.__name__}) is missing"


@pytest.mark.parametrize("name", NAMES)
def test_determinism_and_replay(name):
    x, mask = _batch()
    t = _make(name)
    if not t.stochastic:
        torch.testing.assert_close(_call(t, x, mask), _call(t, x, mask), rtol=0, atol=0)
        with pytest.raises(InterventionError, match="deterministic"):
            _call(t, x, mask, params={})
        return
    a = _call(t, x, mask, generator=torch.Generator().manual_seed(7))
    params = t.last_params
    b = _call(t, x, mask, generator=torch.Generator().manual_seed(7))
    c = _call(t, x, mask, generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c), "a different seed should give a different draw"
    torch.testing.assert_close(_call(t, x, mask, params=params), a, rtol=0, atol=0)
    # the constructor's generator is used when the call gives none
    t2 = interventions.get(name, **PARAMS.get(name, {}), generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(_call(t2, x, mask), a, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_mask_handling(name):
    x, mask = _batch()
    t = _make(name)
    g = torch.Generator().manual_seed(0) if t.stochastic else None
    if t.requires_mask:
        with pytest.raises(InterventionError, match="mask"):
            _call(t, x, None)
    else:
        _call(t, x, None, generator=g)
    with pytest.raises(InterventionError, match=r"\(B, 1, H, W\)"):
        _call(t, x, mask[..., :-1], generator=g)
    with pytest.raises(InterventionError, match="mask"):
        _call(t, x, mask * 2.0, generator=g)
    # bool masks are accepted and mean the same as 0/1 floats
    torch.testing.assert_close(
        _call(t, x, mask.bool(), generator=torch.Generator().manual_seed(0) if t.stochastic else None),
        _call(t, x, mask, generator=torch.Generator().manual_seed(0) if t.stochastic else None),
    )


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda x: (x * 255).to(torch.uint8), "float"),
        (lambda x: x[0], r"\(B, 3, H, W\)"),
        (lambda x: x[:, :2], r"\(B, 3, H, W\)"),
        (lambda x: x * 2.0, r"\[0, 1\]"),
        (lambda x: x.clone().fill_(float("nan")), r"\[0, 1\]"),
        (lambda x: x[:, :, :0], r"at least 1 x 1 pixel"),
    ],
    ids=["uint8", "rank3", "two_channels", "above_one", "nan", "zero_height"],
)
def test_bad_input_is_rejected(name, bad, message):
    x, mask = _batch()
    t = _make(name)
    with pytest.raises(InterventionError, match=message):
        _call(t, bad(x), mask)


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
        x, _ = _batch()
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
