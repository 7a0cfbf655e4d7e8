"""Fine-tuning from a pretrained file whose classifier differs (`create_model_fit`), and
``--input-size`` (`TrainConfig.input_size`, `runs.Resize`).

References: the 1000-class files are saved here from random-init timm models, so the expected
backbone tensors are the file's own; the dropped keys are found from the file's shapes (the
tensors with 1000 rows); the resize is checked against PIL's antialiased bilinear resize and a
forward hook that sees the model's input.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import timm
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file, save_file

from shortcutlab.models.adapter import ModelError, create_model, create_model_fit, input_size_kw, wrap

# one small variant per family of the paper's twelve backbones: (timm name, input side, kwargs)
LIGHT = [
    ("resnet10t", 32, {}),
    ("convnext_atto", 32, {}),
    ("vit_small_patch14_dinov2", 28, {"img_size": 28}),
]
HEAVY = [
    ("densenet121", 32, {}),
    ("mobilenetv2_035", 32, {}),
    ("efficientnet_b0", 32, {}),
    ("regnety_002", 32, {}),
    ("swin_tiny_patch4_window7_224", 224, {}),
    ("maxvit_nano_rw_256", 256, {}),
    ("vit_tiny_patch16_224", 224, {}),
]


def _imagenet_file(tmp_path, name: str, kw: dict, suffix: str = ".safetensors") -> tuple[str, dict]:
    """A 1000-class random-init model's state dict saved as a file, and the dict."""
    torch.manual_seed(1)
    state = {k: v.detach().clone().contiguous() for k, v in timm.create_model(name, num_classes=1000, **kw).state_dict().items()}
    path = str(tmp_path / f"{name}_in1k{suffix}")
    if suffix == ".safetensors":
        save_file(state, path)
    else:
        torch.save(state, path)
    return path, state


def _fine_tune_and_explain(tmp_path, name: str, size: int, kw: dict) -> None:
    path, state = _imagenet_file(tmp_path, name, kw)
    file = load_file(path)
    torch.manual_seed(2)
    model, fit = create_model_fit(name, num_classes=4, pretrained=path, **kw)
    # dropped: exactly the file's tensors with 1000 rows (its classifier)
    assert set(fit.dropped) == {k for k, v in file.items() if v.shape[:1] == (1000,)} != set()
    assert fit.route == "new_head" and set(fit.reinitialised) == set(fit.dropped)
    own = model.state_dict()
    for k, v in own.items():
        if k in fit.reinitialised:
            assert v.shape[0] == 4, k
        else:
            assert torch.equal(v, file[k]), k  # the backbone is the file's
    head = model.get_classifier()
    assert head.out_features == 4
    assert not torch.equal(head.weight, file[fit.dropped[0] if fit.dropped[0].endswith("weight") else fit.dropped[1]][:4])
    # one optimiser step on random 4-class data moves the backbone
    adapter = wrap(model)
    x = torch.rand(4, 3, size, size, generator=torch.Generator().manual_seed(3))
    y = torch.arange(4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    loss = F.cross_entropy(adapter.logits(x), y)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    moved = [k for k, p in model.named_parameters() if k not in fit.reinitialised and not torch.equal(p.detach(), file[k])]
    assert moved
    # wrap and Grad-CAM on the fine-tuned model
    from probes.saliency import gradcam

    adapter.eval()
    maps = gradcam(adapter, x)
    assert maps.shape == (4, size, size) and torch.isfinite(maps).all()


@pytest.mark.parametrize("name,size,kw", LIGHT, ids=[n for n, _, _ in LIGHT])
def test_a_1000_class_file_fine_tunes_into_4_classes(tmp_path, name, size, kw):
    _fine_tune_and_explain(tmp_path, name, size, kw)


@pytest.mark.slow
@pytest.mark.parametrize("name,size,kw", HEAVY, ids=[n for n, _, _ in HEAVY])
def test_a_1000_class_file_fine_tunes_into_4_classes_heavy(tmp_path, name, size, kw):
    _fine_tune_and_explain(tmp_path, name, size, kw)


def test_torch_weights_only_files_fine_tune_too_and_position_embeddings_are_resampled(tmp_path):
    # a DINOv2 file at its native grid (4 x 4 patches) loaded into a model of another grid (2 x 2)
    path, state = _imagenet_file(tmp_path, "vit_small_patch14_dinov2", {"img_size": 56}, suffix=".pt")
    model, fit = create_model_fit("vit_small_patch14_dinov2", 4, path, img_size=28)
    assert fit.adapted == ("pos_embed",)
    assert state["pos_embed"].shape == (1, 1 + 16, 384) and model.pos_embed.shape == (1, 1 + 4, 384)
    # the class token's embedding is carried over, the patch grid is resampled
    assert torch.equal(model.pos_embed[0, 0], state["pos_embed"][0, 0])
    grid = state["pos_embed"][0, 1:].reshape(1, 4, 4, 384).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=(2, 2), mode="bicubic", antialias=True, align_corners=False)
    np.testing.assert_allclose(model.pos_embed[0, 1:].detach().numpy(), expected.permute(0, 2, 3, 1).reshape(4, 384).numpy(), atol=1e-5)


def test_a_file_whose_classifier_fits_loads_strictly(tmp_path):
    torch.manual_seed(0)
    own = create_model("test_resnet", num_classes=4)
    path = str(tmp_path / "four.safetensors")
    save_file(own.state_dict(), path)
    model, fit = create_model_fit("test_resnet", 4, path)
    assert fit.route == "strict" and fit.dropped == fit.reinitialised == ()
    assert all(torch.equal(v, own.state_dict()[k]) for k, v in model.state_dict().items())
    # a trained model's weights must fit as they are: no new head there
    with pytest.raises(ModelError, match=r"fc.weight has shape \(4, 96\) in the file but \(3, 96\) in the model"):
        create_model("test_resnet", num_classes=3, pretrained=path, new_head=False)


def test_what_does_not_fit_beside_the_classifier_is_one_line_naming_the_key(tmp_path):
    path, state = _imagenet_file(tmp_path, "resnet10t", {})
    out_c, in_c = state["layer1.0.conv1.weight"].shape[:2]
    bad = dict(state, **{"layer1.0.conv1.weight": torch.zeros(out_c, in_c, 1, 1)})
    save_file(bad, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ModelError) as info:
        create_model("resnet10t", num_classes=4, pretrained=str(tmp_path / "bad.safetensors"))
    message = str(info.value)
    assert "\n" not in message and "layer1.0.conv1.weight" in message
    assert f"({out_c}, {in_c}, 1, 1) in the file but ({out_c}, {in_c}, 3, 3) in the model" in message
    # another architecture: keys missing either side are named
    other = [k for k in timm.create_model("resnet14t").state_dict() if k not in state]
    with pytest.raises(ModelError, match=rf"{len(other)} keys of the model are missing from the file, e\.g\. '{other[0]}'"):
        create_model("resnet14t", num_classes=4, pretrained=path)
    missing = {k: v for k, v in state.items() if k != "layer2.0.bn1.running_mean"}
    save_file(missing, str(tmp_path / "missing.safetensors"))
    with pytest.raises(ModelError, match=r"1 keys of the model are missing from the file, e\.g\. 'layer2\.0\.bn1\.running_mean'"):
        create_model("resnet10t", num_classes=4, pretrained=str(tmp_path / "missing.safetensors"))


def test_input_size_kw_builds_fixed_size_models_for_n():
    assert input_size_kw("resnet18", 64) == {} and input_size_kw("vit_tiny_patch16_224", None) == {}
    assert input_size_kw("vit_tiny_patch16_224", 224) == {} and input_size_kw("vit_tiny_patch16_224", 64) == {"img_size": 64}


# ------------------------------------------------------------------------ --input-size
def test_resize_is_pil_s_antialiased_bilinear():
    from shortcutlab.models.runs import Resize, preprocess_for

    rng = np.random.default_rng(0)
    img = rng.random((40, 40)).astype(np.float32)
    x = torch.from_numpy(img)[None, None].expand(1, 3, 40, 40)
    got = Resize(10)(x, None)
    ref = np.asarray(Image.fromarray(img, mode="F").resize((10, 10), Image.BILINEAR))
    assert got.shape == (1, 3, 10, 10)
    np.testing.assert_allclose(got[0, 0].numpy(), ref, atol=1e-5)
    assert Resize(40)(x, None) is x
    assert preprocess_for({"config": {"input_size": 10}}) == Resize(10)
    assert preprocess_for({"config": {"mask_background": True, "input_size": 10}}).key == "mask_background=0.5+input_size=10"


def _tiny_manifest(tmp_path, n_parents=8, per_parent=4, size=24):
    rng = np.random.default_rng(0)
    rows = []
    os.makedirs(tmp_path / "crops", exist_ok=True)
    for p in range(n_parents):
        label = p % 2
        for k in range(per_parent):
            i = len(rows)
            img = (rng.random((size, size, 3)) * 80 + (150 if label else 60)).astype(np.uint8)
            mask = np.zeros((size, size), np.uint8)
            mask[size // 4 : 3 * size // 4, size // 4 : 3 * size // 4] = 255
            Image.fromarray(img).save(tmp_path / "crops" / f"c{i}.png")
            Image.fromarray(mask).save(tmp_path / "crops" / f"m{i}.png")
            rows.append({"id": f"c{i}", "path": f"crops/c{i}.png", "mask": f"crops/m{i}.png", "label": f"class{label}",
                         "parent": f"f{p}"})
    pd.DataFrame(rows).to_csv(tmp_path / "manifest.csv", index=False)
    return str(tmp_path / "manifest.csv")


@pytest.fixture
def tiny(tmp_path):
    from shortcutlab import parent_split
    from shortcutlab.data.images import load_manifest_table

    man = _tiny_manifest(tmp_path)
    parent_split(load_manifest_table(man), 0.25, seed=0).to_csv(tmp_path / "split.csv")
    return man, str(tmp_path / "split.csv")


def test_train_with_a_1000_class_file_records_the_dropped_keys(tmp_path, tiny, capsys):
    from shortcutlab.cli import main

    man, split = tiny
    torch.manual_seed(0)
    path = str(tmp_path / "in1k.safetensors")
    file = create_model("test_resnet", num_classes=1000).state_dict()
    save_file(file, path)
    out = str(tmp_path / "run")
    code = main(["train", "--manifest", man, "--split", split, "--arch", "test_resnet", "--epochs", "1", "--batch-size", "16",
                 "--weights", path, "--out", out, "--quiet"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "dropped from the file: fc.weight, fc.bias" in printed and "re-initialised: fc.weight, fc.bias" in printed
    rec = json.loads(open(os.path.join(out, "run.json")).read())
    assert rec["weights_fit"] == {"file": path, "route": "new_head", "dropped": ["fc.weight", "fc.bias"],
                                  "reinitialised": ["fc.weight", "fc.bias"], "adapted": []}
    assert rec["config"]["weights"] == path
    # the run's own weights load back strictly into the 2-class model
    from shortcutlab.models.runs import load_run

    assert load_run(out).adapter.head.out_features == 2


def test_input_size_resizes_in_training_and_scoring_and_load_run_scores_with_it(tmp_path, tiny, monkeypatch):
    from shortcutlab.models.recipe import TrainConfig, train
    from shortcutlab.models.runs import Resize, load_run, load_run_data

    man, split = tiny
    seen: list[tuple[int, int]] = []
    real = create_model_fit

    def spying(*a, **kw):  # the model that trains: record the size of every input it sees
        model, fit = real(*a, **kw)
        model.register_forward_pre_hook(lambda m, inp: seen.append(tuple(inp[0].shape[-2:])))
        return model, fit

    import shortcutlab.models.adapter as adapter_module

    out = str(tmp_path / "run")
    monkeypatch.setattr(adapter_module, "create_model_fit", spying)
    rec = train(man, split, out, TrainConfig(arch="test_resnet", epochs=1, batch_size=16, input_size=40), progress=False)
    monkeypatch.undo()
    assert seen and set(seen) == {(40, 40)}  # training batches and scoring, never the crops' 24 x 24
    assert rec.config["input_size"] == 40
    assert json.loads(open(os.path.join(out, "run.json")).read())["config"]["input_size"] == 40
    run = load_run(out)
    assert run.preprocess == Resize(40)
    crops, _, side = load_run_data(run)
    logits = pd.read_csv(os.path.join(out, "logits.csv"))
    idx = torch.from_numpy(pd.Index(crops.table.ids).get_indexer(logits["id"]))
    x, m = crops.float_batch(idx)
    with torch.no_grad():
        again = run.adapter.logits(run.preprocess(x, m)).numpy()
        unresized = run.adapter.logits(x).numpy()
    np.testing.assert_allclose(again, logits[["logit_class0", "logit_class1"]].to_numpy(), atol=1e-4)
    assert not np.allclose(unresized, again, atol=1e-4)  # the resize matters: without it the logits differ
    # diagnostics see the resized crops, with the masks resized beside them (nearest: still 0 / 1)
    from probes.base import apply_preprocess

    xm, mm = apply_preprocess(run.preprocess, x[:2], m[:2])
    assert xm.shape[-2:] == mm.shape[-2:] == (40, 40) and set(mm.unique().tolist()) == {0.0, 1.0}
    assert float(mm.mean()) == pytest.approx(float(m[:2].mean()), abs=0.02)  # the centre square keeps its area share
    import probes

    seen.clear()
    run.adapter.model.register_forward_pre_hook(lambda mod, inp: seen.append(tuple(inp[0].shape[-2:])))
    rows = probes.diagnose(run.adapter, crops, side, only=["gradcam", "interventions"], preprocess=run.preprocess,
                           params={"gradcam": {"n_boot": 0, "cascade": [0]}, "interventions": {"names": ["background_removal"]}})
    assert set(seen) == {(40, 40)}
    # Grad-CAM's maps (40 x 40) met the resized masks: every test mask still has its cell
    empty = rows[(rows["diagnostic"] == "gradcam") & (rows["metric"] == "empty_masks")]
    assert empty[["value", "n"]].values.tolist() == [[0.0, float((side == 2).sum())]]
    assert (rows["diagnostic"] == "interventions").any()


def test_a_file_without_a_classifier_gets_a_new_one(tmp_path):
    # DINOv2's released files are backbones only (timm's num_classes=0)
    torch.manual_seed(0)
    state = timm.create_model("test_vit", num_classes=0).state_dict()
    path = str(tmp_path / "backbone.safetensors")
    save_file(state, path)
    model, fit = create_model_fit("test_vit", 4, path)
    head_keys = {k for k in model.state_dict() if k not in state}
    assert head_keys == {"head.weight", "head.bias"}
    assert fit.route == "new_head" and fit.dropped == () and set(fit.reinitialised) == head_keys
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
