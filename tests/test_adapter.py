"""The model contract of `shortcutlab.models.adapter`, run over timm, torchvision and hand-written nets."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

from shortcutlab.errors import ShortcutlabError
from shortcutlab.models.adapter import InputError, ModelAdapter, ModelError, TokenLayout, create_model, wrap

IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
SIZE = 64  # smallest input whose final CNN map (reduction 32) is still 2 x 2


class TinyNet(nn.Module):
    """A hand-written classifier: conv -> relu -> conv -> relu -> pool -> flatten -> fc."""

    def __init__(self, k: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.act2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, k)

    def forward(self, x):
        x = self.act2(self.conv2(self.act1(self.conv1(x))))
        return self.fc(self.pool(x).flatten(1))


def _timm(name, **kw):
    def build():
        model = create_model(name, num_classes=5, **kw).eval()
        return model, wrap(model)

    return build


@functools.lru_cache(maxsize=1)
def _resnet18() -> nn.Module:
    from torchvision.models import resnet18

    return resnet18(weights=None, num_classes=5).eval()


def _torchvision():
    model = copy.deepcopy(_resnet18())  # building resnet18 costs more than copying it
    return model, wrap(model, feature_layer="avgpool", head="fc", cam_layer="layer4", **IMAGENET)


def _tiny():
    model = TinyNet().eval()
    return model, wrap(model, feature_layer=model.pool, head=model.fc, cam_layer=model.act2, mean=0.5, std=0.25)


CASES = {
    "timm-resnet": _timm("test_resnet"),
    "timm-efficientnet": _timm("test_efficientnet"),
    "timm-convnext": _timm("test_convnext"),
    "timm-vit": _timm("test_vit"),
    "torchvision-resnet18": _torchvision,
    "tiny": _tiny,
}
TIMM = [c for c in CASES if c.startswith("timm")]


@pytest.fixture(params=list(CASES), ids=list(CASES))
def case(request):
    torch.manual_seed(0)
    model, adapter = CASES[request.param]()
    return request.param, model, adapter


def _x(b: int = 2, dtype=torch.float32, seed: int = 1) -> torch.Tensor:
    return torch.rand(b, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _reference_stats(name: str, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """mean / std as each case was trained with, taken independently of the adapter."""
    if name.startswith("timm"):
        mean, std = model.pretrained_cfg["mean"], model.pretrained_cfg["std"]
    elif name == "tiny":
        mean, std = (0.5,) * 3, (0.25,) * 3
    else:
        mean, std = IMAGENET["mean"], IMAGENET["std"]
    return torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)


# ---------------------------------------------------------------------------- contract
def test_shapes_and_sizes(case):
    _, _, adapter = case
    x = _x(3)
    logits, feats = adapter.logits(x), adapter.features(x)
    assert logits.shape == (3, adapter.num_classes)
    assert feats.shape == (3, adapter.num_features)
    assert adapter(x).shape == logits.shape  # forward is logits


def test_head_of_features_reproduces_logits(case):
    _, _, adapter = case
    x = _x()
    torch.testing.assert_close(adapter.head(adapter.features(x)), adapter.logits(x), rtol=1e-5, atol=1e-5)
    feats, logits = adapter.features_and_logits(x)
    torch.testing.assert_close(adapter.head(feats), logits, rtol=1e-5, atol=1e-5)


def test_normalisation_is_applied(case):
    name, model, adapter = case
    mean, std = _reference_stats(name, model)
    x = _x()
    torch.testing.assert_close(adapter.logits(x), model((x - mean) / std))
    torch.testing.assert_close(adapter.mean, mean)
    torch.testing.assert_close(adapter.std, std)


@pytest.mark.parametrize("name", TIMM)
def test_timm_features_are_pre_logits(name):
    model, adapter = CASES[name]()
    mean, std = _reference_stats(name, model)
    x = _x()
    xn = (x - mean) / std
    expected = model.forward_head(model.forward_features(xn), pre_logits=True)
    torch.testing.assert_close(adapter.features(x), expected)
    assert adapter.head is model.get_classifier()
    assert adapter.num_features == expected.shape[1]


def test_cam_layer_gives_a_spatial_map(case):
    name, model, adapter = case
    seen = []
    handle = adapter.cam_layer.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        adapter.logits(_x())
    finally:
        handle.remove()
    acts = seen[-1]
    cam = adapter.cam_reshape(acts, input_size=(SIZE, SIZE))
    assert cam.dim() == 4 and cam.shape[0] == 2 and cam.shape[2] > 1 and cam.shape[3] > 1
    if name == "timm-vit":
        n_patches = (SIZE // 16) ** 2
        assert acts.shape[1] == n_patches + model.num_prefix_tokens
        assert cam.shape[2] * cam.shape[3] == n_patches and cam.shape[1] == acts.shape[2]
        # without input_size the grid is inferred (square) and agrees
        torch.testing.assert_close(adapter.cam_reshape(acts), cam)
    else:
        assert cam is acts  # CNN maps pass through unchanged


def test_vit_cam_layer_receives_patch_gradients():
    # Grad-CAM on a class-token ViT is blank if its layer's patch tokens get no gradient.
    model, adapter = _timm("test_vit")()
    seen = []

    def keep(module, inputs, output):
        output.retain_grad()
        seen.append(output)

    handle = adapter.cam_layer.register_forward_hook(keep)
    adapter.logits(_x())[:, 0].sum().backward()
    handle.remove()
    grad = adapter.cam_reshape(seen[-1].grad)
    assert grad.shape[2:] == (SIZE // 16, SIZE // 16)
    assert (grad.abs().sum(dim=1) > 0).all()


def test_vit_cam_reshape_drops_prefix_tokens():
    _, adapter = _timm("test_vit")()
    lay = adapter.token_layout
    assert lay.fmt == "NLC" and lay.num_prefix_tokens == 1
    tokens = torch.arange(2 * 17 * 3, dtype=torch.float32).view(2, 17, 3)
    cam = adapter.cam_reshape(tokens)
    assert cam.shape == (2, 3, 4, 4)
    # patch token p (after the class token) lands at row p // 4, column p % 4
    assert torch.equal(cam[1, 2, 1, 3], tokens[1, 1 + 1 * 4 + 3, 2])
    # a non-square grid is laid out from the input size
    wide = tokens[:, :9]  # 1 + 8 patches: a 32 x 64 input
    assert adapter.cam_reshape(wide, input_size=(32, 64)).shape == (2, 3, 2, 4)
    with pytest.raises(ModelError, match="input_size"):
        adapter.cam_reshape(wide)


def test_static_vit_grid_and_nhwc_layout():
    model = create_model("vit_tiny_patch16_224", num_classes=3, img_size=SIZE, depth=2).eval()
    adapter = wrap(model)
    assert adapter.token_layout.grid_size == (4, 4)
    assert adapter.cam_reshape(torch.zeros(1, 17, 192)).shape == (1, 192, 4, 4)
    tiny = TinyNet()
    nhwc = wrap(tiny, head="fc", cam_layer="conv2", mean=0, std=1, token_layout="NHWC")
    assert nhwc.cam_reshape(torch.zeros(2, 5, 6, 7)).shape == (2, 7, 5, 6)
    assert wrap(tiny, head="fc", mean=0, std=1, token_layout={"fmt": "NLC", "num_prefix_tokens": 2}).token_layout == TokenLayout(
        "NLC", 2
    )


def test_head_replacement_and_reset(case):
    name, model, adapter = case
    x = _x()
    before = adapter.logits(x).detach()
    feats = adapter.features(x).detach()
    new = nn.Linear(adapter.num_features, adapter.num_classes)
    adapter.head = new
    assert adapter.head is new
    if name.startswith("timm"):
        assert model.get_classifier() is new
    after = adapter.logits(x).detach()
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, new(feats))

    adapter.reset_head(7)
    w7 = [p.detach().clone() for p in adapter.head.parameters()]
    reset = adapter.logits(x).detach()
    assert not torch.allclose(reset, after)
    adapter.reset_head(8)
    assert not torch.equal(adapter.head.weight, w7[0])
    adapter.reset_head(torch.Generator().manual_seed(7))
    for p, q in zip(adapter.head.parameters(), w7):
        assert torch.equal(p, q)
    torch.testing.assert_close(adapter.logits(x), reset)


def test_reset_head_bounds_follow_fan_in():
    model, adapter = _timm("test_resnet")()
    adapter.reset_head(0)
    bound = 1 / adapter.num_features**0.5
    assert adapter.head.weight.abs().max() <= bound and adapter.head.bias.abs().max() <= bound
    assert adapter.head.weight.std() > bound / 3  # not a degenerate (e.g. zero) init


def test_head_setter_rejects_what_does_not_fit():
    _, adapter = _timm("test_resnet")()
    with pytest.raises(ModelError, match="takes 7 features but .* have 96"):
        adapter.head = nn.Linear(7, 5)
    with pytest.raises(ModelError, match="nn.Module"):
        adapter.head = "fc"
    with pytest.raises(ModelError, match="torch.float64 on cpu but the model's are torch.float32"):
        adapter.head = nn.Linear(96, 5).double()
    adapter.head = nn.Linear(96, 2)
    assert adapter.num_classes == 2 and adapter.logits(_x()).shape == (2, 2)


def test_to_moves_buffers_and_dtype():
    _, adapter = _timm("test_resnet")()
    adapter.to(torch.float64)
    assert adapter.mean.dtype == adapter.std.dtype == torch.float64 == adapter.dtype
    x = _x(dtype=torch.float64)
    torch.testing.assert_close(adapter.head(adapter.features(x)), adapter.logits(x))
    adapter.to("meta")
    assert adapter.mean.device.type == adapter.std.device.type == "meta" == adapter.device.type


def test_float64_model_works(case):
    name, model, adapter = case
    model.double()
    again = wrap(model, **adapter_kwargs(name, model)) if not name.startswith("timm") else wrap(model)
    assert again.mean.dtype == torch.float64
    x = _x(dtype=torch.float64)
    feats, logits = again.features_and_logits(x)
    assert feats.dtype == logits.dtype == torch.float64
    torch.testing.assert_close(again.head(feats), logits)


def adapter_kwargs(name, model):
    if name == "tiny":
        return dict(feature_layer=model.pool, head=model.fc, mean=0.5, std=0.25)
    return dict(IMAGENET, feature_layer="avgpool", head="fc", cam_layer="layer4")


def test_device_argument_and_mismatch():
    model = TinyNet()
    adapter = wrap(model, head="fc", mean=0.5, std=0.25, device="cpu")
    assert adapter.device.type == "cpu"
    adapter.to("meta")  # a device other than the input's, without a GPU
    with pytest.raises(InputError, match="x is on cpu but the model is on meta"):
        adapter.logits(_x())
    assert wrap(adapter) is adapter


# -------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda: (_x() * 255).to(torch.uint8), r"dtype torch.uint8 .*x.float\(\) / 255"),
        (lambda: _x()[0], r"shape \(3, 64, 64\).*unsqueeze"),
        (lambda: _x()[:, :1], r"shape \(2, 1, 64, 64\) \(1 channels\).*expand"),
        (lambda: _x() * 255, r"values in \[.*, 25\d.*\].*/ 255"),
        (lambda: _x() - 0.5, r"values in \[-0.*do not normalise"),
        (lambda: _x(dtype=torch.float64), "dtype torch.float64 but the model's parameters are torch.float32"),
        (lambda: _x().permute(0, 2, 3, 1), "permute"),
        (lambda: _x().numpy(), "got ndarray"),
    ],
    ids=["uint8", "rank3", "one-channel", "0-255", "normalised", "float64", "channels-last", "numpy"],
)
def test_bad_input_is_rejected(bad, match):
    _, adapter = _timm("test_resnet")()
    with pytest.raises(InputError, match=match) as info:
        adapter.logits(bad())
    assert isinstance(info.value, ShortcutlabError)
    with pytest.raises(InputError):
        adapter.features(bad())


def test_small_overshoot_is_accepted():
    _, adapter = _timm("test_resnet")()
    adapter.logits(_x().mul(1.0005).sub(0.0002))


def test_plain_module_without_arguments_names_them():
    with pytest.raises(ModelError, match=r"cannot adapt ResNet.*head= .*head='fc'.*mean= and std=.*cam_layer='layer4'"):
        wrap(copy.deepcopy(_resnet18()))
    with pytest.raises(ModelError, match="pass both mean= and std="):
        wrap(TinyNet(), head="fc", mean=0.5)
    with pytest.raises(ModelError, match="std must be > 0"):
        wrap(TinyNet(), head="fc", mean=0.5, std=(1, 0, 1))
    with pytest.raises(ModelError, match="one per channel"):
        wrap(TinyNet(), head="fc", mean=(0.5, 0.5), std=1)
    with pytest.raises(ModelError, match="wrap it with cam_layer="):
        wrap(TinyNet(), head="fc", mean=0, std=1).cam_layer


def test_unknown_layer_name_lists_close_matches():
    model = copy.deepcopy(_resnet18())
    with pytest.raises(ModelError, match=r"cam_layer='layer5' is not a module of ResNet; close matches: layer4"):
        wrap(model, head="fc", cam_layer="layer5", **IMAGENET)
    with pytest.raises(ModelError, match="close matches: .*fc"):
        wrap(model, head="fcc", **IMAGENET)
    with pytest.raises(ModelError, match="not a submodule of ResNet"):
        wrap(model, head=nn.Linear(512, 5), **IMAGENET)
    with pytest.raises(ModelError, match="has no parameters"):
        wrap(model, head="avgpool", **IMAGENET)


def test_wrong_feature_layer_is_caught():
    model = copy.deepcopy(_resnet18())
    shape_wrong = wrap(model, feature_layer="layer3", head="fc", **IMAGENET)
    with pytest.raises(ModelError, match=r"cannot take the features of feature_layer='layer3' \(shape \(2, 256\)\).*feature_layer="):
        shape_wrong.features(_x())
    tiny = TinyNet().eval()  # conv2's pooled output has the right width but skips act2
    value_wrong = wrap(tiny, feature_layer="conv2", head="fc", mean=0.5, std=0.25)
    with pytest.raises(ModelError, match=r"head\(feature_layer='conv2'\) does not reproduce the logits"):
        value_wrong.features(_x())
    with pytest.raises(ModelError, match="does not reproduce"):
        value_wrong.verify(_x())


def test_feature_layer_defaults_to_head_input():
    model = copy.deepcopy(_resnet18())
    adapter = wrap(model, head="fc", **IMAGENET)
    x = _x()
    feats = adapter.features(x)
    assert feats.shape == (2, 512) and adapter.num_features == 512
    mean, std = _reference_stats("torchvision", model)
    xn = (x - mean) / std
    torch.testing.assert_close(feats, model.avgpool(model.layer4(model.layer3(model.layer2(model.layer1(
        model.maxpool(model.relu(model.bn1(model.conv1(xn))))))))).flatten(1))


def test_mode_is_left_alone_and_verify_restores_it():
    model, adapter = _timm("test_efficientnet")()
    model.train()
    model.bn1.eval()
    adapter.features(_x())
    assert model.training and not model.bn1.training
    adapter.verify(_x())
    assert model.training and not model.bn1.training and adapter._verified


def test_timm_model_without_classifier_or_with_two_heads():
    with pytest.raises(ModelError, match="has no classifier .*num_classes=0"):
        wrap(create_model("test_resnet", num_classes=0))
    distilled = create_model("deit_tiny_distilled_patch16_224", num_classes=3, img_size=32, depth=1)
    with pytest.raises(ModelError, match="returns 2 modules .*pass head= and feature_layer="):
        wrap(distilled)


# ------------------------------------------------------------------------- create_model
@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_create_model_loads_local_weights(tmp_path, suffix):
    torch.manual_seed(0)
    trained = create_model("test_resnet", num_classes=3).eval()
    path = tmp_path / f"model{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(trained.state_dict(), str(path))
    else:
        torch.save({"state_dict": trained.state_dict(), "epoch": 3}, path)
    torch.manual_seed(1)
    loaded = create_model("test_resnet", num_classes=3, pretrained=str(path)).eval()
    fresh = create_model("test_resnet", num_classes=3).eval()
    x = _x()
    torch.testing.assert_close(wrap(loaded).logits(x), wrap(trained).logits(x), rtol=0, atol=0)
    assert not torch.allclose(wrap(fresh).logits(x), wrap(trained).logits(x))


def test_create_model_errors(tmp_path):
    with pytest.raises(ModelError, match="does not exist.*never downloads"):
        create_model("test_resnet", num_classes=3, pretrained=str(tmp_path / "missing.safetensors"))
    with pytest.raises(ModelError, match="local weights file path"):
        create_model("test_resnet", num_classes=3, pretrained=True)
    with pytest.raises(ModelError, match="close matches: .*test_resnet"):
        create_model("test_resnett", num_classes=3)
    path = tmp_path / "three.pt"
    torch.save(create_model("test_resnet", num_classes=3).state_dict(), path)
    with pytest.raises(ModelError, match=r"fc.weight has shape \(3, 96\) in the file but \(4, 96\) in the model"):
        create_model("test_resnet", num_classes=4, pretrained=path, new_head=False)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ModelError, match="cannot read weights file"):
        create_model("test_resnet", num_classes=3, pretrained=junk)


def test_adapter_is_a_module_and_exports():
    _, adapter = _timm("test_resnet")()
    assert isinstance(adapter, ModelAdapter) and isinstance(adapter, nn.Module)
    assert "head='fc'" in repr(adapter) and adapter.cam_layer_name == "layer4"
    assert set(adapter.state_dict()) == {"model." + k for k in adapter.model.state_dict()}
