"""`probes.extract_features`: the same features as the adapter, computed once, cached on disk by
everything that changes them, with the model's modes left as they were."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from probes import extract_features
from probes.errors import DiagnosticError
from probes.features import cache_key
from shortcutlab import CropTable
from shortcutlab.models.adapter import create_model, wrap
from shortcutlab.data.images import CropImages

N, SIZE = 10, 32


class TinyNet(nn.Module):
    """Hand-written net with batch norm and dropout, so modes change its features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.5)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.drop(self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1)))


def tiny_adapter(seed: int = 0, **kw):
    torch.manual_seed(seed)
    model = TinyNet().eval()
    with torch.no_grad():  # non-trivial running statistics: eval and train mode differ
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return wrap(model, feature_layer="pool", head="fc", **{"mean": 0.5, "std": 0.25, **kw})


def images(seed: int = 0, n: int = N) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, SIZE, SIZE), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def crop_images(x: torch.Tensor) -> CropImages:
    n = x.shape[0]
    df = pd.DataFrame({"id": [f"c{i:02d}" for i in range(n)], "label": ["a", "b"] * (n // 2), "parent": [f"p{i // 2}" for i in range(n)]})
    table = CropTable.from_frame(df, id="id", label="label", parent="parent")
    masks = torch.zeros(n, 1, SIZE, SIZE, dtype=torch.bool)
    masks[..., 8:24, 8:24] = True
    return CropImages(x, masks, table)


class ForwardCounter:
    """Counts forward passes of one module (the first layer: every batch goes through it)."""

    def __init__(self, module: nn.Module) -> None:
        self.calls = 0
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, *args) -> None:
        self.calls += 1

    def close(self) -> None:
        self.handle.remove()


@pytest.fixture(scope="module")
def timm_adapter():
    return wrap(create_model("test_resnet", num_classes=3).eval())


# -- correctness ---------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["timm", "hand-written"])
def test_equals_adapter_features_one_crop_at_a_time(which, timm_adapter) -> None:
    adapter = timm_adapter if which == "timm" else tiny_adapter()
    x = images()
    feats = extract_features(adapter, x, batch_size=4)
    with torch.no_grad():
        ref = torch.cat([adapter.features(x[i : i + 1].float() / 255.0) for i in range(N)]).numpy()
    assert feats.dtype == np.float32 and feats.shape == (N, adapter.num_features)
    np.testing.assert_allclose(feats, ref, rtol=1e-5, atol=1e-5)


def test_float_and_uint8_inputs_agree() -> None:
    adapter = tiny_adapter()
    x = images()
    a = extract_features(adapter, x, batch_size=3)
    b = extract_features(adapter, x.float() / 255.0, batch_size=7)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_crop_images_and_index() -> None:
    adapter = tiny_adapter()
    crops = crop_images(images())
    full = extract_features(adapter, crops)
    np.testing.assert_array_equal(full, extract_features(adapter, crops.images))
    idx = np.array([7, 2, 2, 0])
    np.testing.assert_array_equal(extract_features(adapter, crops, index=idx), full[idx])
    mask = np.zeros(N, dtype=bool)
    mask[[1, 5]] = True
    np.testing.assert_array_equal(extract_features(adapter, crops, index=mask), full[[1, 5]])


def test_transform_is_applied_with_masks() -> None:
    adapter = tiny_adapter()
    crops = crop_images(images())
    seen = []

    def blank_cell(x, m):
        seen.append(m)
        return x * (1 - m)

    got = extract_features(adapter, crops, transform=blank_cell, transform_key="blank_cell", batch_size=4)
    x = crops.images.float() / 255.0
    with torch.no_grad():
        ref = adapter.features(x * (1 - crops.masks.float())).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert all(m is not None and m.dtype == torch.float32 for m in seen)


# -- modes ---------------------------------------------------------------------------------
def test_modes_of_every_submodule_restored_and_features_in_eval_mode() -> None:
    adapter = tiny_adapter()
    x = images()
    with torch.no_grad():
        ref = adapter.features(x.float() / 255.0).numpy()  # eval mode
    adapter.train()
    adapter.model.bn.eval()  # a mixed state: must come back exactly
    before = {name: m.training for name, m in adapter.named_modules()}
    feats = extract_features(adapter, x)
    after = {name: m.training for name, m in adapter.named_modules()}
    assert after == before
    np.testing.assert_allclose(feats, ref, rtol=1e-5, atol=1e-6)


def test_modes_restored_when_the_forward_fails() -> None:
    adapter = tiny_adapter()
    adapter.train()

    def broken(x, m):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        extract_features(adapter, images(), transform=broken)
    assert all(m.training for m in adapter.modules())


# -- the disk cache ------------------------------------------------------------------------
def _extract_counting(adapter, crops, tmp_path, **kw):
    counter = ForwardCounter(adapter.model.conv)
    try:
        feats = extract_features(adapter, crops, cache_dir=tmp_path, batch_size=4, **kw)
    finally:
        counter.close()
    return feats, counter.calls


def test_cache_hit_returns_identical_features_without_forward(tmp_path) -> None:
    adapter = tiny_adapter()
    crops = crop_images(images())
    first, calls = _extract_counting(adapter, crops, tmp_path)
    assert calls == 3  # ceil(10 / 4) batches
    assert len(os.listdir(tmp_path)) == 1
    second, calls = _extract_counting(adapter, crops, tmp_path)
    assert calls == 0
    np.testing.assert_array_equal(first, second)
    assert second.dtype == np.float32
    third, calls = _extract_counting(adapter, crops, tmp_path, index=[3, 1])
    assert calls == 0
    np.testing.assert_array_equal(third, first[[3, 1]])


def test_cache_miss_after_one_weight_changes(tmp_path) -> None:
    adapter = tiny_adapter()
    crops = crop_images(images())
    first, _ = _extract_counting(adapter, crops, tmp_path)
    with torch.no_grad():
        adapter.model.fc.weight[0, 0] += 1e-3  # the head: features unchanged, the checkpoint is not
    _, calls = _extract_counting(adapter, crops, tmp_path)
    assert calls > 0 and len(os.listdir(tmp_path)) == 2
    with torch.no_grad():
        adapter.model.conv.weight[0, 0, 0, 0] += 1e-3
    again, calls = _extract_counting(adapter, crops, tmp_path)
    assert calls > 0 and len(os.listdir(tmp_path)) == 3
    assert not np.array_equal(again, first)


def test_cache_miss_after_one_buffer_changes(tmp_path) -> None:
    adapter = tiny_adapter()
    crops = crop_images(images())
    _extract_counting(adapter, crops, tmp_path)
    with torch.no_grad():
        adapter.model.bn.running_mean[0] += 1e-3
    _, calls = _extract_counting(adapter, crops, tmp_path)
    assert calls > 0


def test_cache_miss_after_one_pixel_changes(tmp_path) -> None:
    adapter = tiny_adapter()
    x = images()
    first, _ = _extract_counting(adapter, crop_images(x), tmp_path)
    y = x.clone()
    y[4, 1, 7, 9] ^= 1
    second, calls = _extract_counting(adapter, crop_images(y), tmp_path)
    assert calls > 0 and len(os.listdir(tmp_path)) == 2
    np.testing.assert_array_equal(np.delete(first, 4, 0), np.delete(second, 4, 0))


def test_cache_miss_after_the_transform_key_changes(tmp_path) -> None:
    adapter = tiny_adapter()
    crops = crop_images(images())
    identity = lambda x, m: x  # noqa: E731
    _extract_counting(adapter, crops, tmp_path)
    _, calls = _extract_counting(adapter, crops, tmp_path, transform=identity, transform_key="a")
    assert calls > 0
    _, calls = _extract_counting(adapter, crops, tmp_path, transform=identity, transform_key="a")
    assert calls == 0
    _, calls = _extract_counting(adapter, crops, tmp_path, transform=identity, transform_key="b")
    assert calls > 0
    assert len(os.listdir(tmp_path)) == 3


def test_cache_miss_after_a_mask_changes_under_a_transform(tmp_path) -> None:
    adapter = tiny_adapter()
    crops = crop_images(images())
    blank = lambda x, m: x * (1 - m)  # noqa: E731
    _extract_counting(adapter, crops, tmp_path, transform=blank, transform_key="blank")
    masks = crops.masks.clone()
    masks[0, 0, 0, 0] = True
    other = CropImages(crops.images, masks, crops.table)
    _, calls = _extract_counting(adapter, other, tmp_path, transform=blank, transform_key="blank")
    assert calls > 0


def test_cache_miss_for_another_wrapping_of_the_same_model(tmp_path) -> None:
    """mean / std live on the adapter, outside the model's state dict; so does feature_layer."""
    adapter = tiny_adapter()
    crops = crop_images(images())
    a, _ = _extract_counting(adapter, crops, tmp_path)
    renormed = wrap(adapter.model, feature_layer="pool", head="fc", mean=0.4, std=0.25)
    b, calls = _extract_counting(renormed, crops, tmp_path)
    assert calls > 0 and not np.array_equal(a, b)
    relayered = wrap(adapter.model, head="fc", mean=0.5, std=0.25)  # features: the input of fc (after dropout)
    assert cache_key(relayered, crops.images, None) != cache_key(adapter, crops.images, None)


def test_cache_key_names_ids() -> None:
    adapter = tiny_adapter()
    x = images()
    ids = [f"c{i}" for i in range(N)]
    assert cache_key(adapter, x, ids) != cache_key(adapter, x, ids[::-1])
    assert cache_key(adapter, x, ids) == cache_key(adapter, x.clone(), list(ids))


# -- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad, words",
    [
        (torch.zeros(2, 1, SIZE, SIZE, dtype=torch.uint8), ["(N, 3, H, W)", "(2, 1, 32, 32)"]),
        (torch.zeros(3, SIZE, SIZE, dtype=torch.uint8), ["(N, 3, H, W)", "(3, 32, 32)"]),
        (torch.zeros(2, 3, SIZE, SIZE, dtype=torch.int64), ["uint8", "torch.int64"]),
        (np.zeros((2, 3, SIZE, SIZE), dtype=np.uint8), ["CropImages", "ndarray"]),
    ],
    ids=["one-channel", "no-batch", "int64", "numpy"],
)
def test_bad_crops(bad, words) -> None:
    with pytest.raises(DiagnosticError) as info:
        extract_features(tiny_adapter(), bad)
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize("index", [[0, N], [-1], np.ones(N + 1, dtype=bool), [[0, 1]]], ids=["past-end", "negative", "mask-length", "2-d"])
def test_bad_index(index) -> None:
    with pytest.raises(DiagnosticError, match="index"):
        extract_features(tiny_adapter(), images(), index=index)
