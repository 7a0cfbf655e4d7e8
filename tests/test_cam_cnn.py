"""``cam_cnn`` (`shortcutlab.models.cam_cnn`), the demo's model: a timm-style CNN whose
Grad-CAM layer keeps crop / 4 cells a side.

References: the shape of the actual layer output (a forward hook), captum's `LayerGradCam`,
the adapter's own contract (head(features) == logits), and a weights file round trip.
"""

from __future__ import annotations

import pytest
import torch

from shortcutlab.models.adapter import create_model, wrap


def _cam_output_shape(adapter, size: int) -> tuple[int, ...]:
    seen = {}
    h = adapter.cam_layer.register_forward_hook(lambda m, i, o: seen.__setitem__("o", o))
    try:
        with torch.no_grad():
            adapter.logits(torch.rand(1, 3, size, size))
    finally:
        h.remove()
    return tuple(seen["o"].shape)


def test_the_demo_models_cam_layer_has_at_least_8_x_8_cells():
    """From the demo's own settings: the arch it trains, at its crop size, as a run wraps it."""
    from shortcutlab.studies.demo import DemoConfig

    for cfg in (DemoConfig(), DemoConfig.quick()):
        adapter = wrap(create_model(cfg.arch, num_classes=cfg.n_classes)).eval()
        shape = _cam_output_shape(adapter, cfg.crop_size)
        assert shape[-2] >= 8 and shape[-1] >= 8, (cfg.arch, adapter.cam_layer_name, shape)


def test_test_resnet_was_one_cell_at_32_px():
    """Why the demo changed model: test_resnet's default cam layer is 1 x 1 on a 32 px crop."""
    adapter = wrap(create_model("test_resnet", num_classes=3)).eval()
    assert _cam_output_shape(adapter, 32)[-2:] == (1, 1)


@pytest.mark.parametrize("size,cells", [(32, 8), (64, 16), (36, 9)])
def test_cam_cnn_layer_is_a_quarter_of_the_crop(size, cells):
    adapter = wrap(create_model("cam_cnn", num_classes=3)).eval()
    assert adapter.cam_layer_name == "stages.3"
    assert _cam_output_shape(adapter, size) == (1, 96, cells, cells)


def test_cam_cnn_keeps_the_adapter_contract_and_matches_captum():
    from captum.attr import LayerAttribution, LayerGradCam

    from probes.saliency import fast_path_reason, gradcam

    torch.manual_seed(0)
    model = create_model("cam_cnn", num_classes=3)
    model.train()
    with torch.no_grad():  # non-trivial BatchNorm statistics
        for _ in range(3):
            model(torch.rand(16, 3, 32, 32))
    adapter = wrap(model).eval()
    x = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    assert adapter.features(x).shape == (6, 96)
    torch.testing.assert_close(adapter.head(adapter.features(x)), adapter.logits(x), rtol=1e-5, atol=1e-5)
    assert fast_path_reason(adapter, x) is None  # GAP then one linear head
    t = adapter.logits(x).argmax(1)
    ref = LayerGradCam(adapter, adapter.cam_layer).attribute(x, target=t, relu_attributions=True)
    ref = LayerAttribution.interpolate(ref, (32, 32), interpolate_mode="bilinear")[:, 0].detach()
    got = gradcam(adapter, x)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))


def test_cam_cnn_weights_round_trip_and_timm_name(tmp_path):
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    a = create_model("cam_cnn", num_classes=4).eval()
    assert "cam_cnn" in timm.list_models()
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in a.state_dict().items()}, str(path))
    b = create_model("cam_cnn", num_classes=4, pretrained=path, new_head=False).eval()
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(a(x), b(x))
    with pytest.raises(TypeError, match="cam_cnn takes num_classes and in_chans"):
        create_model("cam_cnn", num_classes=4, img_size=32)


def test_cam_cnn_fine_tunes_from_a_file_with_other_classes(tmp_path):
    """A 3-class file into a 4-class model: the backbone is the file's, the classifier is new."""
    from safetensors.torch import save_file

    from shortcutlab.models.adapter import create_model_fit

    torch.manual_seed(0)
    a = create_model("cam_cnn", num_classes=3)
    path = tmp_path / "w3.safetensors"
    save_file({k: v.contiguous() for k, v in a.state_dict().items()}, str(path))
    b, fit = create_model_fit("cam_cnn", 4, path)
    assert fit.route == "new_head" and set(fit.dropped) == {"fc.weight", "fc.bias"}
    assert b.fc.out_features == 4
    for k, v in a.state_dict().items():
        if not k.startswith("fc."):
            assert torch.equal(b.state_dict()[k], v), k
