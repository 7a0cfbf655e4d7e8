"""Grad-CAM, the outside-the-cell mass and the randomised-head check (`probes.saliency`).

References: captum's `LayerGradCam` (CNNs, and a ViT through an identity module on the patch
grid), a per-crop hand computation with plain autograd, scipy's `spearmanr`, nets with
hand-set weights whose maps are known exactly, and numpy formulas.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import probes
from probes import saliency
from probes.base import ROW_COLUMNS, DiagnosticContext
from probes.errors import DiagnosticError
from probes.saliency import (
    cascade_blocks,
    constant_maps,
    fast_path_reason,
    gradcam,
    outside_mass,
    preserved_state,
    randomized_head_check,
    spearman,
)
from shortcutlab.models.adapter import create_model, wrap


# ------------------------------------------------------------------------------ models
class TinyNet(nn.Module):
    """conv -> relu -> conv(stride 2) -> relu (cam layer, 16 x 16 at 32 px) -> GAP -> linear."""

    def __init__(self, k: int = 3, head: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.act2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = head if head is not None else nn.Linear(16, k)

    def forward(self, x):
        return self.fc(self.pool(self.act2(self.conv2(self.act1(self.conv1(x))))).flatten(1))


def tiny(seed: int = 0, head: nn.Module | None = None):
    torch.manual_seed(seed)
    model = TinyNet(head=head).eval()
    return wrap(model, head="fc", cam_layer="act2", mean=0.5, std=0.25)


@functools.lru_cache(maxsize=None)
def _timm_state(name: str, seed: int, kw: tuple):
    torch.manual_seed(seed)
    return create_model(name, num_classes=5, **dict(kw)).eval()


def timm_adapter(name: str, seed: int = 0, **kw):
    """A fresh adapter over a cached random-init timm model (building resnet18 costs more than copying)."""
    import copy

    return wrap(copy.deepcopy(_timm_state(name, seed, tuple(sorted(kw.items())))))


VIT = dict(img_size=32, patch_size=8)  # a 4 x 4 patch grid
MODELS = {
    "resnet18": (lambda: timm_adapter("resnet18"), 64),
    "efficientnet_b0": (lambda: timm_adapter("efficientnet_b0"), 64),
    "test_vit": (lambda: timm_adapter("test_vit", **VIT), 32),
}


def batch(n: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def state_copy(adapter) -> dict:
    return {k: v.detach().clone() for k, v in adapter.model.state_dict().items()}


def assert_same_state(adapter, before: dict) -> None:
    after = adapter.model.state_dict()
    assert list(after) == list(before)
    for k, v in before.items():
        assert after[k].dtype == v.dtype and torch.equal(after[k], v), k


def close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-4) -> None:
    scale = float(b.abs().max()) or 1.0
    torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * scale)


# -------------------------------------------------------------------- references
def hand_gradcam(adapter, x: torch.Tensor, targets: torch.Tensor, prefix: int = 0, grid=None) -> torch.Tensor:
    """Grad-CAM one crop at a time with plain autograd on the cam_layer's real output."""
    out = []
    for i in range(x.shape[0]):
        store = {}

        def hook(m, inp, o):
            o.retain_grad()
            store["a"] = o

        h = adapter.cam_layer.register_forward_hook(hook)
        try:
            logits = adapter.logits(x[i : i + 1])
            logits[0, int(targets[i])].backward()
        finally:
            h.remove()
        a, g = store["a"].detach(), store["a"].grad
        if a.dim() == 3:  # ViT tokens (1, N, C): drop the class token, lay patches row-major on the grid
            c = a.shape[-1]
            a = a[:, prefix:, :].reshape(1, grid[0], grid[1], c).permute(0, 3, 1, 2)
            g = g[:, prefix:, :].reshape(1, grid[0], grid[1], c).permute(0, 3, 1, 2)
        w = g.mean(dim=(2, 3), keepdim=True)
        cam = F.relu((w * a).sum(dim=1, keepdim=True))
        out.append(F.interpolate(cam, size=x.shape[-2:], mode="bilinear", align_corners=False)[:, 0])
        adapter.model.zero_grad(set_to_none=True)
    return torch.cat(out)


def captum_gradcam(adapter, layer, x, targets) -> torch.Tensor:
    from captum.attr import LayerAttribution, LayerGradCam

    attr = LayerGradCam(adapter, layer).attribute(x, target=targets, relu_attributions=True)
    up = LayerAttribution.interpolate(attr, tuple(x.shape[-2:]), interpolate_mode="bilinear")
    adapter.model.zero_grad(set_to_none=True)
    return up[:, 0].detach()


# --------------------------------------------------------------------- Grad-CAM maps
SLOW_EFFNET = pytest.param("efficientnet_b0", marks=pytest.mark.slow)


@pytest.mark.parametrize("name", ["resnet18", SLOW_EFFNET])
def test_gradcam_equals_captum_on_cnns(name):
    build, size = MODELS[name]
    adapter = build()
    x = batch(3, size, seed=1)
    t = torch.tensor([0, 3, 4])
    ref = captum_gradcam(adapter, adapter.cam_layer, x, t)
    assert float(ref.abs().max()) > 0
    for path in ("auto", "autograd"):  # auto takes the fast path on these
        ours = gradcam(adapter, x, t, path=path)
        assert ours.shape == (3, size, size) and bool((ours >= 0).all())
        close(ours, ref)


@pytest.mark.parametrize("name", ["resnet18", SLOW_EFFNET, "test_vit"])
def test_gradcam_equals_hand_autograd(name):
    build, size = MODELS[name]
    adapter = build()
    x = batch(3, size, seed=2)
    t = torch.tensor([1, 2, 0])
    lay = adapter.token_layout
    ref = hand_gradcam(adapter, x, t, prefix=lay.num_prefix_tokens, grid=(size // 8, size // 8))
    assert float(ref.abs().max()) > 0
    close(gradcam(adapter, x, t), ref)


class _Grid(nn.Module):
    """Identity on a (B, C, h, w) map: the layer captum attributes to, for a token model."""

    def forward(self, a):
        return a


def test_gradcam_vit_equals_captum_through_a_grid_module():
    adapter = timm_adapter("test_vit", **VIT)
    x = batch(3, 32, seed=3)
    t = torch.tensor([4, 0, 2])
    grid = _Grid()
    prefix = adapter.token_layout.num_prefix_tokens

    def regrid(module, inp, out):  # tokens -> grid -> identity -> tokens: captum sees the grid
        b, n, c = out.shape
        patches = grid(out[:, prefix:, :].transpose(1, 2).reshape(b, c, 4, 4))
        return torch.cat([out[:, :prefix, :], patches.reshape(b, c, n - prefix).transpose(1, 2)], dim=1)

    h = adapter.cam_layer.register_forward_hook(regrid)
    try:
        ref = captum_gradcam(adapter, grid, x, t)
    finally:
        h.remove()
    assert float(ref.abs().max()) > 0
    close(gradcam(adapter, x, t), ref)


def test_upsample_options_and_predicted_targets():
    adapter = tiny()
    x = batch(4, 32)
    low = gradcam(adapter, x, None, upsample=None)
    assert low.shape == (4, 16, 16)
    torch.testing.assert_close(gradcam(adapter, x, None), F.interpolate(low[:, None], size=(32, 32), mode="bilinear", align_corners=False)[:, 0])
    torch.testing.assert_close(gradcam(adapter, x, None, upsample="nearest"), F.interpolate(low[:, None], size=(32, 32), mode="nearest")[:, 0])
    pred = adapter.logits(x).argmax(1)
    torch.testing.assert_close(gradcam(adapter, x, None), gradcam(adapter, x, pred))
    torch.testing.assert_close(gradcam(adapter, x, 2), gradcam(adapter, x, [2, 2, 2, 2]))
    signed = gradcam(adapter, x, 0, relu=False, upsample=None)
    assert bool((signed < 0).any())
    torch.testing.assert_close(gradcam(adapter, x, 0, upsample=None), signed.clamp_min(0))
    assert all(p.grad is None for p in adapter.parameters())


# -------------------------------------------------------------------------- fast path
@pytest.mark.parametrize("build,size", [(lambda: timm_adapter("resnet18"), 64), (tiny, 32)], ids=["resnet18", "hand_cnn"])
def test_fast_path_equals_autograd(build, size):
    adapter = build()
    x = batch(4, size, seed=5)
    assert fast_path_reason(adapter, x) is None
    t = torch.tensor([0, 1, 2, 2])
    for relu in (True, False):
        fast = gradcam(adapter, x, t, path="fast", relu=relu)
        slow = gradcam(adapter, x, t, path="autograd", relu=relu)
        torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5 * float(slow.abs().max()))
    for k in (0, 1):
        f = randomized_head_check(adapter, x, None, seed=3, cascade=k, path="fast")
        s = randomized_head_check(adapter, x, None, seed=3, cascade=k, path="autograd")
        assert f.path == "fast" and s.path == "autograd"
        scale = float(s.randomized_maps.abs().max())
        torch.testing.assert_close(f.randomized_maps, s.randomized_maps, rtol=1e-5, atol=1e-5 * scale)
        # rho ranks near-equal pixels of bilinear maps, whose order float rounding may swap
        np.testing.assert_allclose(f.spearman.numpy(), s.spearman.numpy(), atol=1e-4)


def random_bn(adapter, seed: int = 0) -> None:
    """Non-trivial BatchNorm statistics and affines (random init leaves them near identity)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in adapter.model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(0.3 * torch.randn(n, generator=g))
                m.running_var.copy_(0.5 + torch.rand(n, generator=g))
                m.weight.copy_(1 + 0.3 * torch.randn(n, generator=g))
                m.bias.copy_(0.2 * torch.randn(n, generator=g))


def fake_timer(plain: float, twin: float, calls: list | None = None):
    """A `forward_choice` timer that runs nothing and reports fixed seconds per label."""
    def timer(label, run):
        if calls is not None:
            calls.append(label)
        return {"plain": plain, "twin": twin}[label]
    return timer


def test_folded_twin_gives_the_maps_of_the_users_model(monkeypatch):
    # The fast path runs on a copy with BatchNorm folded into the convs (channels-last) where
    # it times faster (forced here by a fake timer); captum on the user's own model is the
    # reference, before and after the statistics change.
    monkeypatch.setattr(saliency, "_FORWARD_CHOICE", {})
    adapter = timm_adapter("resnet18")
    random_bn(adapter, seed=1)
    before = state_copy(adapter)
    formats = {k: v.is_contiguous() for k, v in adapter.model.state_dict().items()}
    x = batch(5, 64, seed=8)
    t = torch.tensor([0, 1, 2, 3, 4])
    assert saliency.forward_choice(adapter, x, timer=fake_timer(1.0, 0.5)) == "twin"
    close(gradcam(adapter, x, t), captum_gradcam(adapter, adapter.cam_layer, x, t), rtol=1e-4)
    assert randomized_head_check(adapter, x, t).forward == "twin"
    twin = saliency._TWINS[adapter][1]
    assert twin is not None and not any(isinstance(m, nn.BatchNorm2d) for m in twin.model.modules())
    assert_same_state(adapter, before)
    assert {k: v.is_contiguous() for k, v in adapter.model.state_dict().items()} == formats
    assert any(isinstance(m, nn.BatchNorm2d) for m in adapter.model.modules())
    random_bn(adapter, seed=2)  # in place: the twin must be rebuilt, not reused
    close(gradcam(adapter, x, t), captum_gradcam(adapter, adapter.cam_layer, x, t), rtol=1e-4)
    assert saliency._TWINS[adapter][1] is not twin



def test_pick_forward_takes_the_twin_only_past_the_margin():
    # best of each list against TWIN_MARGIN = 0.95, by hand
    assert saliency.TWIN_MARGIN == 0.95
    assert saliency.pick_forward([1.0, 1.2], [0.95, 2.0]) == "twin"  # 0.95 <= 0.95 * 1.0
    assert saliency.pick_forward([1.0, 1.2], [0.96, 0.99]) == "plain"  # faster, but within the margin
    assert saliency.pick_forward([1.0], [1.17]) == "plain"  # slower (torch 2.14 on 2 cores)
    assert saliency.pick_forward([2.0, 1.0], [0.8], margin=0.7) == "plain"  # 0.8 > 0.7 * 1.0


def test_forward_choice_times_once_per_model_and_shape_and_the_plain_path_gives_captums_maps(monkeypatch):
    monkeypatch.setattr(saliency, "_FORWARD_CHOICE", {})
    adapter = timm_adapter("resnet18")
    random_bn(adapter, seed=3)
    x = batch(4, 64, seed=9)
    t = torch.tensor([0, 1, 2, 3])
    calls: list[str] = []
    assert saliency.forward_choice(adapter, x, timer=fake_timer(1.0, 1.15, calls)) == "plain"
    assert calls == ["plain", "twin"] * 3  # alternating, three timed repeats each
    # cached per (model class, device, dtype, crop shape): another batch size is not re-timed
    assert saliency.forward_choice(adapter, x[:2], timer=fake_timer(1.0, 0.1, calls)) == "plain"
    assert len(calls) == 6
    # the check records the plain forward and its maps are still captum's
    check = randomized_head_check(adapter, x, t)
    assert check.forward == "plain" and check.path == "fast"
    close(check.maps, captum_gradcam(adapter, adapter.cam_layer, x, t), rtol=1e-4)
    # another crop size is timed afresh; refresh=True times again
    assert saliency.forward_choice(adapter, batch(2, 32), timer=fake_timer(1.0, 0.5)) == "twin"
    assert saliency.forward_choice(adapter, x, timer=fake_timer(1.0, 0.5), refresh=True) == "twin"
    assert randomized_head_check(adapter, x, t).forward == "twin"


def test_forward_choice_is_plain_without_a_twin():
    # TinyNet has no BatchNorm: nothing to fold, nothing is timed
    calls: list[str] = []
    adapter = tiny()
    x = batch(3, 32)
    assert saliency.forward_choice(adapter, x, timer=fake_timer(1.0, 0.1, calls)) == "plain" and calls == []
    assert randomized_head_check(adapter, x).forward == "plain"


class ConvBnReuse(nn.Module):
    """conv then bn in registration order, but the conv's output also feeds a residual
    (``reuse``), or the activation runs between them (``between``): folding would be wrong."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        y = self.conv(x)
        z = self.act(self.bn(y) + y) if self.how == "reuse" else self.bn(self.act(y))
        return self.fc(self.pool(z).flatten(1))


@pytest.mark.parametrize("how", ["reuse", "between"])
def test_a_wrong_fold_is_caught_and_the_users_model_runs(how):
    torch.manual_seed(0)
    adapter = wrap(ConvBnReuse(how).eval(), head="fc", cam_layer="bn" if how == "between" else "act", mean=0.5, std=0.25)
    random_bn(adapter, seed=3)
    x = batch(4, 16, seed=9)
    t = torch.tensor([0, 1, 2, 0])
    ours = gradcam(adapter, x, t)
    assert saliency._TWINS[adapter][1] is None
    close(ours, captum_gradcam(adapter, adapter.cam_layer, x, t), rtol=1e-4)


def test_fast_path_is_detected_not_assumed():
    x32 = batch(2, 32)
    assert "nn.Linear" in fast_path_reason(tiny(head=nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))), x32)
    vit = timm_adapter("test_vit", **VIT)  # class-token pooling: features are not a mean of the map
    assert "spatial mean" in fast_path_reason(vit, x32)
    with pytest.raises(DiagnosticError, match="fast path does not apply"):
        gradcam(vit, x32, None, path="fast")
    adapter = tiny()
    adapter.train()  # checked as gradcam runs it, in eval mode; the mode is put back
    assert fast_path_reason(adapter, x32) is None and adapter.model.training
    adapter.eval()
    # a map that is not what the head pools: features from conv2 pooled (before the ReLU)
    torch.manual_seed(0)
    model = TinyNet().eval()
    odd = wrap(model, head="fc", feature_layer="pool", cam_layer="conv2", mean=0.5, std=0.25)
    assert "spatial mean" in fast_path_reason(odd, x32)
    x = batch(3, 32)
    torch.testing.assert_close(gradcam(odd, x, 1), hand_gradcam(odd, x, torch.tensor([1, 1, 1])), rtol=1e-4, atol=1e-6)


class _SteepPool(nn.Module):
    """The spatial mean in value, twice its derivative: values alone cannot tell it from a mean."""

    def forward(self, a):
        m = a.mean(dim=(2, 3), keepdim=True)
        return 2 * m - m.detach()


def test_fast_path_checks_the_derivative_not_only_values():
    adapter = tiny()
    adapter.model.pool = _SteepPool()
    x = batch(3, 32, seed=6)
    assert "gradient" in fast_path_reason(adapter, x)
    t = torch.tensor([0, 1, 2])
    auto = gradcam(adapter, x, t)  # auto falls back to autograd: the true Grad-CAM
    torch.testing.assert_close(auto, hand_gradcam(adapter, x, t), rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(gradcam(adapter, x, t, path="fast") * 2, auto, rtol=1e-4, atol=1e-7)  # values-only check is fooled
    assert randomized_head_check(adapter, x, t, seed=1).path == "autograd"


# ---------------------------------------------------------------------- outside mass
class Evidence(nn.Module):
    """Evidence = brightness: a (3 -> 1) averaging conv (stride `s`), ReLU, GAP, then a linear
    head whose class 0 weighs brightness +1 and class 1 weighs it -1."""

    def __init__(self, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 1, s, stride=s, bias=False)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(1, 2)
        with torch.no_grad():
            self.conv.weight.fill_(1.0 / (3 * s * s))
            self.fc.weight.copy_(torch.tensor([[1.0], [-1.0]]))
            self.fc.bias.zero_()

    def forward(self, x):
        return self.fc(self.pool(self.act(self.conv(x))).flatten(1))


def squares(size: int = 32, lo: int = 8, hi: int = 24):
    inside = torch.zeros(1, 1, size, size)
    inside[..., lo:hi, lo:hi] = 1
    bright_out = (1 - inside).expand(1, 3, size, size).clone()  # evidence wholly outside the square
    bright_in = inside.expand(1, 3, size, size).clone()
    return bright_out, bright_in, inside


@pytest.mark.parametrize(
    "stride,upsample,tol",
    [(1, "bilinear", 1e-6), (4, "nearest", 1e-6), (4, "bilinear", 0.15)],
    ids=["full_res", "stride4_nearest", "stride4_bilinear"],
)
def test_outside_mass_of_hand_set_evidence(stride, upsample, tol):
    adapter = wrap(Evidence(stride).eval(), head="fc", cam_layer="act", mean=0, std=1)
    out_x, in_x, mask = squares()  # the square's edges fall on the stride-4 grid
    x = torch.cat([out_x, in_x])
    m = mask.expand(2, 1, 32, 32)
    for path in ("fast", "autograd"):
        maps = gradcam(adapter, x, 0, path=path, upsample=upsample)
        om = outside_mass(maps, m)
        # bilinear upsampling spreads a 4-px cell's evidence about 2 px across the edge
        assert om[0] == pytest.approx(1.0, abs=tol) and om[1] == pytest.approx(0.0, abs=tol)
        # class 1 counts brightness against itself: no positive attribution, NaN, not 0
        assert torch.isnan(outside_mass(gradcam(adapter, x, 1, path=path, upsample=upsample), m)).all()


def test_outside_mass_formula_soft_masks_and_edge_cases():
    g = torch.Generator().manual_seed(0)
    maps = torch.randn(5, 6, 7, generator=g)
    masks = torch.rand(5, 1, 6, 7, generator=g)
    p, w = maps.clamp_min(0).double().numpy(), 1 - masks[:, 0].double().numpy()
    ref = (p * w).sum((1, 2)) / p.sum((1, 2))
    np.testing.assert_allclose(outside_mass(maps, masks).numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(outside_mass(maps, masks[:, 0] > 0.5).numpy(), (p * (masks[:, 0] <= 0.5).numpy()).sum((1, 2)) / p.sum((1, 2)))
    full = torch.ones(5, 1, 6, 7)
    assert torch.equal(outside_mass(maps.abs() + 0.1, full), torch.zeros(5, dtype=torch.float64))
    zero = maps.clone()
    zero[1] = -zero[1].abs()  # nothing positive
    with pytest.warns(RuntimeWarning, match="1 of 5 masks have no cell pixel"):
        empty = masks.clone()
        empty[3] = 0
        om = outside_mass(zero, empty)
    assert math.isnan(om[1]) and math.isnan(om[3]) and np.isfinite(om[[0, 2, 4]].numpy()).all()


# --------------------------------------------------------------------------- Spearman
def test_spearman_equals_scipy_with_ties_and_nan_for_constant_maps():
    from scipy.stats import spearmanr

    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 4, (6, 5, 5), generator=g).float()  # heavy ties, as after a ReLU
    b = torch.randint(0, 6, (6, 5, 5), generator=g).float()
    b[2] = a[2] * 2 + 1
    a[5] = 0.0
    rho = spearman(a, b)
    for i in range(5):
        ref = spearmanr(a[i].flatten().numpy(), b[i].flatten().numpy()).statistic
        assert rho[i] == pytest.approx(ref, abs=1e-12)
    assert rho[2] == pytest.approx(1.0) and math.isnan(rho[5])


# -------------------------------------------------------------- randomised-head check
@pytest.mark.parametrize("build,size", [(lambda: timm_adapter("resnet18"), 64), (tiny, 32)], ids=["resnet18", "hand_cnn"])
def test_unchanged_head_gives_one_and_a_new_head_less(build, size):
    adapter = build()
    x = batch(6, size, seed=7)
    with preserved_state(adapter):
        adapter.reset_head(11)  # the "trained" head is what reset_head(11) draws: re-drawing it changes nothing
        same = randomized_head_check(adapter, x, None, seed=11)
        assert torch.equal(same.maps, same.randomized_maps)
        finite = same.spearman[torch.isfinite(same.spearman)]
        assert finite.numel() >= 4 and torch.allclose(finite, torch.ones_like(finite))
    other = randomized_head_check(adapter, x, None, seed=12)
    assert other.median_spearman < 0.99
    assert other.random_pair_spearman.shape == (6,)
    torch.testing.assert_close(other.random_pair_spearman, spearman(other.maps, other.maps.roll(-1, 0)))


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("cascade", [0, 2])
def test_weights_identical_after_check(mode, cascade):
    adapter = timm_adapter("resnet18")
    getattr(adapter, mode)()
    x = batch(4, 64, seed=8)
    m = squares(64, 16, 48)[2].expand(4, 1, 64, 64)
    before = state_copy(adapter)
    modes = [mod.training for mod in adapter.modules()]
    check = randomized_head_check(adapter, x, None, m, seed=5, cascade=cascade)
    assert check.path == "fast"  # in eval mode whatever the model's mode
    assert check.cascade_blocks == ("layer4.1", "layer4.0")[:cascade]
    assert not torch.equal(check.maps, check.randomized_maps)
    assert check.outside_mass.shape == (4,) and check.randomized_outside_mass.shape == (4,)
    assert_same_state(adapter, before)
    assert [mod.training for mod in adapter.modules()] == modes
    assert all(p.grad is None for p in adapter.parameters())


def test_weights_identical_after_an_error_midway(monkeypatch):
    adapter = timm_adapter("resnet18")
    x = batch(3, 64)
    before = state_copy(adapter)
    seen = []
    real = saliency._cams

    def second_pass_fails(adapter_, *a, **k):  # the pass after the head and a block were re-initialised
        if seen:
            seen.append(adapter_.head.weight.detach().clone())
            raise RuntimeError("boom")
        seen.append(None)
        return real(adapter_, *a, **k)

    monkeypatch.setattr(saliency, "_cams", second_pass_fails)
    with pytest.raises(RuntimeError, match="boom"):
        randomized_head_check(adapter, x, None, seed=1, cascade=1)
    assert len(seen) == 2 and not torch.equal(seen[1], before["fc.weight"])  # it did fail mid-way
    assert_same_state(adapter, before)


def test_cascade_blocks_from_the_top():
    assert cascade_blocks(timm_adapter("resnet18"), batch(1, 64))[:3] == ["layer4.1", "layer4.0", "layer3.1"]
    assert cascade_blocks(timm_adapter("test_vit", **VIT), batch(1, 32))[:3] == ["blocks.5", "blocks.4", "blocks.3"]
    blocks = cascade_blocks(tiny(), batch(1, 32))
    assert blocks == ["conv2", "conv1"]
    adapter = tiny()
    x = batch(4, 32, seed=9)
    c0, c1 = (randomized_head_check(adapter, x, None, seed=2, cascade=k) for k in (0, 1))
    assert torch.equal(c0.maps, c1.maps) and not torch.equal(c0.randomized_maps, c1.randomized_maps)
    with pytest.raises(DiagnosticError, match="cascade=3 asks for more blocks"):
        randomized_head_check(adapter, x, None, seed=2, cascade=3)


TINY_VIT = dict(img_size=32, patch_size=8, depth=3, num_classes=5)  # vit_tiny_patch16_224's widths, 3 blocks, 4 x 4 patches


def test_cascade_depth_counts_blocks_in_each_family():
    """Depth counts transformer, residual and ConvNeXt blocks as timm's models hold them, never a
    LayerNorm or a stem layer; the lists come from the models' own containers."""
    import timm

    torch.manual_seed(0)
    for name, kw in [("vit_tiny_patch16_224", TINY_VIT), ("vit_tiny_patch16_224", {**TINY_VIT, "global_pool": "avg", "fc_norm": True}),
                     ("deit_tiny_patch16_224", TINY_VIT)]:
        model = timm.create_model(name, pretrained=False, **kw).eval()
        want = [f"blocks.{i}" for i in reversed(range(len(model.blocks)))]
        assert cascade_blocks(wrap(model), batch(1, 32)) == want, (name, kw)
    resnet = timm_adapter("resnet18")
    layers = [f"layer{s}.{i}" for s in (4, 3, 2, 1) for i in reversed(range(len(getattr(resnet.model, f"layer{s}"))))]
    assert cascade_blocks(resnet, batch(1, 64)) == layers  # no 'bn1', 'conv1' (the stem)
    effnet = timm_adapter("efficientnet_b0")
    stages = effnet.model.blocks
    want = [f"blocks.{s}.{i}" for s in reversed(range(len(stages))) for i in reversed(range(len(stages[s])))]
    assert cascade_blocks(effnet, batch(1, 64)) == want  # no 'conv_head', 'bn2' (above the top block) or 'conv_stem'
    convnext = wrap(timm.create_model("convnext_atto", pretrained=False, num_classes=5).eval())
    stages = convnext.model.stages
    want = [f"stages.{s}.blocks.{i}" for s in reversed(range(len(stages))) for i in reversed(range(len(stages[s].blocks)))]
    assert cascade_blocks(convnext, batch(1, 32)) == want  # no 'head.norm', 'stages.3' (its downsampling) or 'stem.0'


def reinitialised(adapter, x, cascade, monkeypatch):
    """Names of the parameters a randomised-head check changed for its randomised maps: read
    from the model during the last Grad-CAM pass. Every parameter is nudged first, so none sits
    at the value re-initialisation gives (a LayerNorm's 1 and 0). Returns (names, the check)."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in adapter.model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    before = {n: p.detach().clone() for n, p in adapter.model.named_parameters()}
    seen = []
    real = saliency._cams

    def spy(adapter_, *a, **k):
        seen.append({n: p.detach().clone() for n, p in adapter_.model.named_parameters()})
        return real(adapter_, *a, **k)

    monkeypatch.setattr(saliency, "_cams", spy)
    check = randomized_head_check(adapter, x, None, seed=0, cascade=cascade)
    assert len(seen) == 2  # the trained maps, then the randomised ones
    changed = {n for n in before if not torch.equal(before[n], seen[-1][n])}
    assert all(torch.equal(before[n], p) for n, p in adapter.model.named_parameters())  # restored
    return changed, check


def test_cascade_1_on_a_vit_reinitialises_exactly_the_last_transformer_block(monkeypatch):
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **TINY_VIT).eval()
    last = {f"blocks.{len(model.blocks) - 1}.{n}" for n, _ in model.blocks[-1].named_parameters()}
    head = {f"head.{n}" for n, _ in model.head.named_parameters()}
    changed, check = reinitialised(wrap(model), batch(2, 32), 1, monkeypatch)
    assert changed == last | head  # not 'norm.weight' (the final LayerNorm), not blocks.1
    assert check.cascade_blocks == ("blocks.2",) and check.cascade_modules == ("blocks.2",)
    assert any(n.startswith("blocks.2.norm1") for n in changed)  # LayerNorms inside the block are in


def test_a_convnext_cascade_takes_a_stage_downsampling_between_its_blocks(monkeypatch):
    import timm

    torch.manual_seed(0)
    model = timm.create_model("convnext_atto", pretrained=False, num_classes=5).eval()

    def params(path):
        return {f"{path}.{n}" for n, _ in model.get_submodule(path).named_parameters()}

    head = params("head.fc")
    two, _ = reinitialised(wrap(model), batch(2, 32), 2, monkeypatch)
    assert two == head | params("stages.3.blocks.1") | params("stages.3.blocks.0")
    model2 = timm.create_model("convnext_atto", pretrained=False, num_classes=5).eval()
    three, check = reinitialised(wrap(model2), batch(2, 32), 3, monkeypatch)
    assert three == two | params("stages.3.downsample") | params("stages.2.blocks.5")  # the layer between two blocks
    assert check.cascade_blocks == ("stages.3.blocks.1", "stages.3.blocks.0", "stages.2.blocks.5")
    assert not three & (params("head.norm") | params("stem"))


def test_vit_randomized_head_check_uses_autograd_and_restores():
    adapter = timm_adapter("test_vit", **VIT)
    x = batch(4, 32, seed=4)
    before = state_copy(adapter)
    check = randomized_head_check(adapter, x, None, seed=0, cascade=1)
    assert check.path == "autograd" and check.cascade_blocks == ("blocks.5",) == check.cascade_modules
    assert check.maps.shape == (4, 32, 32)
    assert_same_state(adapter, before)


# ------------------------------------------------------------------------ diagnostic
def _context(n_parents: int = 6, per: int = 4, size: int = 32):
    from shortcutlab import CropTable
    from shortcutlab.data.images import CropImages

    n = n_parents * per
    df = pd.DataFrame({
        "id": [f"c{i:03d}" for i in range(n)],
        "label": [f"k{(i // per) % 3}" for i in range(n)],
        "parent": [f"p{i // per}" for i in range(n)],
    })
    table = CropTable.from_frame(df, id="id", label="label", parent="parent")
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
    masks = torch.zeros(n, 1, size, size, dtype=torch.bool)
    masks[..., 8:24, 8:24] = True
    masks[0] = False  # one failed segmentation
    side = np.where(np.arange(n) % 2 == 0, 2, 0)
    side[0] = 2
    return DiagnosticContext(tiny(), CropImages(images, masks, table), side, run_id="r1", batch_size=5, seed=3)


def test_gradcam_diagnostic_rows():
    assert "gradcam" in probes.available("masks")
    ctx = _context()
    before = state_copy(ctx.adapter)
    diag = probes.get("gradcam", cascade=(0, 1), n_boot=200)
    assert diag.missing(ctx) is None
    with pytest.warns(RuntimeWarning, match="1 of 12 test masks"):
        rows = diag.run(ctx)
    assert_same_state(ctx.adapter, before)
    frame = pd.DataFrame(rows)
    assert set(ROW_COLUMNS) <= set(frame.columns) and (frame["diagnostic"] == "gradcam").all()
    got = {(r["metric"], r["setting"]): r for r in rows}
    om = got[("outside_mass", "target=predicted")]
    test = ctx.test_idx
    x, m = ctx.crops.float_batch(torch.from_numpy(test))
    ref = outside_mass(gradcam(ctx.adapter, x, None), m, warn=False).numpy()
    assert om["n"] == np.isfinite(ref).sum() == 11
    assert om["value"] == pytest.approx(np.nanmean(ref), rel=1e-6)
    assert om["ci_low"] <= om["value"] <= om["ci_high"]
    assert got[("outside_mass_median", "target=predicted")]["value"] == pytest.approx(np.nanmedian(ref), rel=1e-6)
    assert got[("empty_masks", "target=predicted")]["value"] == 1
    assert got[("nan_maps", "target=predicted")]["n"] == 12
    for k in (0, 1):
        r = got[("randomized_head_spearman", f"target=predicted,cascade={k}")]
        assert -1 <= r["value"] <= 1 and r["n"] + got[("randomized_nan", f"target=predicted,cascade={k}")]["value"] == 12
        assert ("randomized_outside_mass", f"target=predicted,cascade={k}") in got
    pair = got[("random_pair_spearman", "target=predicted")]
    assert pair["n"] > 0 and -1 <= pair["value"] <= 1
    # per-crop rho does not depend on the batching: one unbatched check gives the same median
    assert got[("randomized_head_spearman", "target=predicted,cascade=0")]["value"] == pytest.approx(
        float(np.nanmedian(randomized_head_check(ctx.adapter, x, None, seed=3).spearman.numpy())), abs=1e-9
    )
    with pytest.warns(RuntimeWarning, match="no cell pixel"):
        labelled = probes.get("gradcam", target="label", cascade=0, n_boot=0).run(ctx)
    assert {r["setting"] for r in labelled} >= {"target=label", "target=label,cascade=0"}
    # the note says which path and which forward pass ran (no BatchNorm here: no twin, 'plain')
    assert all(r["note"].endswith("; forward=plain") for r in labelled if r["metric"] == "outside_mass")
    assert om["note"].startswith("path=") and om["note"].endswith("; forward=plain")
    assert all(math.isnan(r["ci_low"]) for r in labelled)


def test_gradcam_diagnostic_bad_settings():
    with pytest.raises(DiagnosticError, match="target"):
        probes.get("gradcam", target="truth")
    with pytest.raises(DiagnosticError, match="cascade"):
        probes.get("gradcam", cascade=(-1,))
    with pytest.raises(DiagnosticError, match="upsample"):
        probes.get("gradcam", upsample=None)


def test_parent_bootstrap_intervals_match_closed_forms():
    from probes.saliency import _cluster_bootstrap

    rng = np.random.default_rng(0)
    v = rng.normal(size=400)
    half = 1.96 * v.std(ddof=1) / math.sqrt(len(v))
    for stat, width in (("mean", 2 * half), ("median", 2 * half * math.sqrt(math.pi / 2))):  # iid: one crop per parent
        lo, hi = _cluster_bootstrap(v, np.arange(400), stat, n_boot=2000, seed=1)
        assert lo < np.mean(v) < hi and (hi - lo) == pytest.approx(width, rel=0.2)
    # 40 parents of 10 identical siblings: as wide as 40 independent crops, not 400
    c = np.repeat(np.arange(40), 10)
    w = np.repeat(rng.normal(size=40), 10)
    lo, hi = _cluster_bootstrap(w, c, "mean", n_boot=2000, seed=1)
    assert (hi - lo) == pytest.approx(2 * 1.96 * w[::10].std(ddof=1) / math.sqrt(40), rel=0.2)
    nan = np.where(np.arange(400) % 7 == 0, np.nan, v)
    assert np.isfinite(_cluster_bootstrap(nan, np.arange(400), "median", n_boot=200, seed=1)).all()
    assert all(math.isnan(b) for b in _cluster_bootstrap(np.full(5, np.nan), np.arange(5), "mean", n_boot=200, seed=1))


# ------------------------------------------------------- train mode: run in eval, put back
class _BnNet(nn.Module):
    """conv -> BN -> dropout -> relu (cam layer) -> GAP -> linear: train mode would update the
    BN statistics and draw dropout masks."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.drop = nn.Dropout(0.5)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(self.pool(self.act(self.drop(self.bn(self.conv(x))))).flatten(1))


def _bn_adapter():
    torch.manual_seed(0)
    adapter = wrap(_BnNet(), head="fc", cam_layer="act", mean=0.5, std=0.25)
    random_bn(adapter, seed=1)
    return adapter


def _modes(adapter) -> list[bool]:
    return [m.training for m in adapter.modules()]


@pytest.mark.parametrize("call", ["gradcam", "randomized_head_check", "fast_path_reason", "cascade_blocks"])
def test_train_mode_leaves_batchnorm_statistics_and_modes_untouched(call):
    """In train mode a forward pass would update running_mean / running_var /
    num_batches_tracked: every saliency entry point runs in eval mode and puts back each
    module's own flag (here a mix: the model training, its dropout in eval)."""
    adapter = _bn_adapter()
    adapter.train()
    adapter.model.drop.eval()
    modes = _modes(adapter)
    before = state_copy(adapter)
    assert "bn.num_batches_tracked" in before
    x = batch(4, 16, seed=2)
    fn = {"gradcam": lambda: gradcam(adapter, x, None), "randomized_head_check": lambda: randomized_head_check(adapter, x, None, seed=3),
          "fast_path_reason": lambda: fast_path_reason(adapter, x), "cascade_blocks": lambda: saliency.cascade_blocks(adapter, x)}[call]
    fn()
    assert_same_state(adapter, before)
    assert _modes(adapter) == modes


def test_train_mode_maps_are_the_eval_mode_maps():
    adapter = _bn_adapter()
    x = batch(4, 16, seed=2)
    t = torch.tensor([0, 1, 2, 1])
    adapter.eval()
    want = hand_gradcam(adapter, x, t)  # plain autograd on the model in eval mode
    want_check = randomized_head_check(adapter, x, t, seed=4)
    adapter.train()
    torch.testing.assert_close(gradcam(adapter, x, t), want, rtol=1e-4, atol=1e-6)
    got = randomized_head_check(adapter, x, t, seed=4)
    torch.testing.assert_close(got.maps, want_check.maps, rtol=0, atol=0)
    torch.testing.assert_close(got.randomized_maps, want_check.randomized_maps, rtol=0, atol=0)
    assert adapter.training and adapter.model.bn.training


def test_train_mode_is_put_back_after_an_error(monkeypatch):
    adapter = _bn_adapter()
    adapter.train()
    before = state_copy(adapter)
    real = saliency._cams

    def boom(*a, **k):  # fails after a forward pass, inside eval mode
        real(*a, **k)
        raise RuntimeError("midway")

    monkeypatch.setattr(saliency, "_cams", boom)
    with pytest.raises(RuntimeError, match="midway"):
        gradcam(adapter, batch(2, 16), None)
    assert all(m.training for m in adapter.modules())
    assert_same_state(adapter, before)


# ------------------------------------------------------------------------ constant maps
def test_constant_maps_counted_by_hand():
    """Six maps built so that exactly two are constant: all zero, and all 3.0."""
    maps = torch.zeros(6, 4, 4)
    maps[1] = 3.0                                   # constant, not zero
    maps[2, 0, 0] = 1.0                             # one pixel differs
    maps[3] = torch.arange(16.0).view(4, 4)
    maps[4] = float("nan")                          # not finite: undefined for another reason
    maps[5, 3, 3] = -1e-7                           # a tiny difference still ranks
    assert constant_maps(maps).tolist() == [True, True, False, False, False, False]
    assert constant_maps(maps[:, None]).tolist() == [True, True, False, False, False, False]  # (B, 1, H, W)
    # a constant map is exactly where scipy's Spearman rho is undefined (the finite ones)
    from scipy.stats import spearmanr

    ref = torch.arange(16.0)
    with np.errstate(invalid="ignore"), pytest.warns(Warning):
        undefined = [bool(np.isnan(spearmanr(m.flatten().numpy(), ref.numpy())[0])) for m in maps]
    assert undefined == [True, True, False, False, True, False]
    with pytest.raises(DiagnosticError, match=r"\(B, H, W\)"):
        constant_maps(torch.zeros(4))
    # within roundings of a constant: one cell upsampled bilinearly (float32 sums of weights
    # differ from 1 by a rounding), and 1.0 with one pixel 1 + 1e-6 (8 roundings of float32)
    near = torch.ones(3, 32, 32)
    near[0] = F.interpolate(torch.full((1, 1, 1, 1), 0.3), size=(32, 32), mode="bilinear", align_corners=False)[0, 0]
    near[1, 5, 5] = 1 + 1e-6
    near[2, 5, 5] = 1 + 1e-3                        # a real (if small) difference
    assert constant_maps(near).tolist() == [True, True, False]
    rho = spearman(near, torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(0)))
    assert math.isnan(rho[0]) and math.isnan(rho[1]) and not math.isnan(rho[2])


class OneCell(nn.Module):
    """A conv whose kernel covers the whole 32 px crop: a 1 x 1 cam layer, as test_resnet's last
    stage on a 32 px crop. Every bilinear upsampled map is then constant."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 32)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.pool(self.act(self.conv(x))).flatten(1))


def test_gradcam_diagnostic_counts_constant_maps_and_cam_cells():
    """On a 1 x 1 cam layer all 12 test maps (trained and randomised) are constant, rho is
    undefined for all 12, and the rows say the layer is 1 x 1; on TinyNet's 16 x 16 layer (32 px,
    one stride-2 conv) the rows say 16 x 16."""
    ctx = _context()
    torch.manual_seed(0)
    one = wrap(OneCell().eval(), head="fc", cam_layer="act", mean=0.5, std=0.25)
    ctx1 = DiagnosticContext(one, ctx.crops, ctx.side, run_id="r1", batch_size=5, seed=3)
    with pytest.warns(RuntimeWarning, match="no cell pixel"):
        rows = probes.get("gradcam", cascade=(0, 1), n_boot=0).run(ctx1)
    got = {(r["metric"], r["setting"]): r for r in rows}
    base = "target=predicted"
    assert got[("cam_height", base)]["value"] == 1 and got[("cam_width", base)]["value"] == 1
    assert "'act': 1 x 1 cells" in got[("cam_height", base)]["note"]
    assert got[("constant_maps", base)]["value"] == 12 and got[("constant_maps", base)]["n"] == 12
    assert got[("constant_share", base)]["value"] == 1.0
    for k in (0, 1):
        setting = f"{base},cascade={k}"
        assert got[("randomized_constant_maps", setting)]["value"] == 12
        assert got[("randomized_constant_share", setting)]["value"] == 1.0
        assert got[("randomized_nan", setting)]["value"] == 12
    with pytest.warns(RuntimeWarning, match="no cell pixel"):
        rows = probes.get("gradcam", cascade=0, n_boot=0).run(ctx)
    got = {(r["metric"], r["setting"]): r for r in rows}
    assert got[("cam_height", base)]["value"] == 16 and got[("cam_width", base)]["value"] == 16
    # on a 16 x 16 layer the only constant maps are the all-zero ones (no positive attribution)
    assert got[("constant_maps", base)]["value"] == got[("nan_maps", base)]["value"]
