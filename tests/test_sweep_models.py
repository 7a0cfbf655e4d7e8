"""Sweep model entries beyond training recipes: a model trained elsewhere (weights + arch +
classes) scored on the sweep's own data, and a sweep on a crop manifest written to disk."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch

from shortcutlab.models.adapter import create_model
from shortcutlab.sweep.config import SweepConfigError, validate
from shortcutlab.sweep.runner import run_sweep

SYNTH = {"synthetic": {"mechanisms": ["color"], "fields_per_class": 8, "crop_size": 16, "field_size": 64}}
MODEL_ORDER = ["class2", "class0", "class1"]  # the model's logit order, not the data's (by name)


def _wrapped_config(weights: str, **extra) -> dict:
    return {"data": SYNTH, "split": {"protocol": "factorial"}, "seeds": [0], "cells": ["leak-high", "clean-low"],
            "models": [{"weights": weights, "arch": "test_resnet", "classes": MODEL_ORDER, "name": "ext", **extra}],
            "interventions": {"names": ["greyscale"]}, "diagnostics": {"only": ["parent_probe"], "params": {"parent_probe": {"Cs": 1.0}}}}


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    """A randomly initialised test_resnet saved as a plain torch state dict (.pt), as a model
    trained elsewhere would be, and the sweep scoring it."""
    d = tmp_path_factory.mktemp("wrapped")
    torch.manual_seed(3)
    model = create_model("test_resnet", num_classes=3)
    torch.save(model.state_dict(), d / "ext.pt")
    out = str(d / "out")
    summary = run_sweep(validate(_wrapped_config("ext.pt"), source="sweep.yaml", base_dir=str(d)), out, progress=False)
    return d, model.eval(), out, summary


def test_a_wrapped_model_is_scored_not_trained_on_the_common_test_set(external):
    from shortcutlab.data.images import load_crops, load_manifest_table
    from shortcutlab.sweep.folder import read_result, task_dir

    d, model, out, summary = external
    assert summary["counts"] == {"synthesise": 1, "split": 1, "score": 1, "diagnose": 1}  # no train task
    pred = pd.read_parquet(os.path.join(out, "predictions.parquet"))
    none = pred[pred["intervention"] == "none"].set_index("id")
    assert set(none[["cell", "exposure", "diversity", "recipe", "arch"]].itertuples(index=False, name=None)) == {("", "", "", "weights=ext", "test_resnet")}
    # the crops scored are the factorial's common test set: the test side of every cell
    split_id = none["split_id"].iat[0]
    split = pd.read_csv(os.path.join(task_dir(out, "split", split_id), "split.csv"), dtype={"id": str})
    per_cell = {c: set(g.loc[g["split"] == "test", "id"]) for c, g in split.groupby("cell")}
    assert len(per_cell) == 4 and all(s == per_cell["leak-high"] for s in per_cell.values())
    assert set(none.index) == per_cell["leak-high"]
    # predictions: a direct forward pass of the saved weights, argmax in the model's own logit
    # order, mapped to class names, equals the table's prediction (codes: classes by name)
    res = read_result(out, "split", split_id)
    table = load_manifest_table(os.path.join(out, res["manifest"]))
    crops = load_crops(table)
    rows = pd.Index(crops.table.ids.astype(str)).get_indexer(none.index)
    x = crops.images[torch.as_tensor(rows)].float() / 255.0
    mean = torch.tensor(model.pretrained_cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(model.pretrained_cfg["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        hand = model((x - mean) / std).argmax(1).numpy()
    names = sorted(MODEL_ORDER)
    assert [names[k] for k in none["pred"]] == [MODEL_ORDER[k] for k in hand]
    manifest = pd.read_csv(os.path.join(out, res["manifest"]), dtype=str).set_index("id")
    assert [names[k] for k in none["label"]] == list(manifest.loc[none.index, "label"])
    assert none["correct"].mean() == pytest.approx(np.mean(none["label"].to_numpy() == none["pred"].to_numpy()))
    # diagnosed as well: parent_probe rows for the wrapped model
    results = pd.read_parquet(os.path.join(out, "results.parquet"))
    assert {"parent_probe", "interventions"} <= set(results["diagnostic"]) and set(results["model"]) == set(none["model"])


def test_wrap_spec_errors_are_named_at_load_time(external, tmp_path):
    d = external[0]
    torch.save(create_model("test_resnet", num_classes=4).state_dict(), tmp_path / "four.pt")
    cases = [
        (_wrapped_config("nope.pt"), ("models[0].weights:", "'nope.pt'", "does not exist")),
        (dict(_wrapped_config("ext.pt"), models=[{"weights": "ext.pt", "arch": "test_resnt", "classes": MODEL_ORDER}]),
         ("models[0].arch:", "'test_resnt'", "test_resnet")),
        (dict(_wrapped_config("ext.pt"), models=[{"weights": "ext.pt", "arch": "test_resnet", "classes": ["class0", "class1", "klass2"]}]),
         ("models[0].classes:", "missing 'class2'", "not in the data 'klass2'")),
        (dict(_wrapped_config("ext.pt"), models=[{"weights": "ext.pt", "arch": "test_resnet", "classes": MODEL_ORDER, "epochs": 3}]),
         ("models[0].epochs:", "scored, not trained")),
        (dict(_wrapped_config("ext.pt"), models=[{"weights": str(tmp_path / "four.pt"), "arch": "test_resnet", "classes": MODEL_ORDER}]),
         ("models[0].weights:", "four.pt", "shape (4,", "(3,")),
        (dict(_wrapped_config("ext.pt"), models=[{"weights": "ext.pt", "arch": "test_vit", "classes": MODEL_ORDER}]),
         ("models[0].weights:", "does not fit", "'test_vit'")),
    ]
    for cfg, names in cases:
        with pytest.raises(SweepConfigError) as info:
            validate(cfg, source="sweep.yaml", base_dir=str(d))
        message = str(info.value)
        assert "\n" not in message and message.startswith("sweep.yaml: "), message
        for n in names:
            assert n in message, f"{message!r} does not name {n!r}"


def test_a_sweep_on_a_manifest_written_to_disk_gives_the_runs_predictions_and_the_protocol_effect(tmp_path, capsys):
    # a benchmark written to disk as crop files + manifest.csv, swept as any user's data would be
    # under two protocols (one list), then checked against the run folders' own logits.csv
    from shortcutlab.cli import main
    from shortcutlab.stats import protocol_effect
    from shortcutlab.synth import SynthConfig, synthesize, write_synth
    from shortcutlab.sweep.folder import task_dir

    data = synthesize(SynthConfig(mechanisms=("color",), fields_per_class=8, crop_size=16, field_size=64, seed=5))
    manifest = write_synth(data, tmp_path / "bench")["manifest"]
    cfg = {"data": {"manifest": {"path": os.path.relpath(manifest, tmp_path), "name": "bench"}},
           "split": {"protocol": ["crop", "parent"], "params": {"test_fraction": 0.25}}, "seeds": [0, 1],
           "models": [{"arch": "test_resnet", "epochs": 1, "batch_size": 32}], "interventions": "none", "diagnostics": "none"}
    out = str(tmp_path / "out")
    summary = run_sweep(validate(cfg, source="sweep.yaml", base_dir=str(tmp_path)), out, progress=False)
    assert summary["counts"] == {"split": 4, "train": 4, "score": 4}  # 2 protocols x 2 seeds; no synthesise task
    pred = pd.read_parquet(os.path.join(out, "predictions.parquet"))
    assert set(pred["condition"]) == {"bench"} and sorted(pred.groupby("protocol")["model"].nunique().items()) == [("crop", 2), ("parent", 2)]
    acc = {"crop": [], "parent": []}
    for model, g in pred.groupby("model"):
        logits = pd.read_csv(os.path.join(task_dir(out, "train", model), "logits.csv"), dtype={"id": str})
        test = logits[logits["split"] == "test"].set_index("id").sort_index()
        g = g.set_index("id").sort_index()
        classes = sorted(logits["label"].unique())
        assert list(g.index) == list(test.index)
        assert [classes[k] for k in g["label"]] == list(test["label"])
        assert [classes[k] for k in g["pred"]] == list(test["pred"])
        acc[g["protocol"].iat[0]].append((test["label"] == test["pred"]).to_numpy())
    # the protocol effect: mean correct over every (seed, crop) of P1 minus that of P2, by hand
    hand = np.concatenate(acc["crop"]).mean() - np.concatenate(acc["parent"]).mean()
    est = protocol_effect(pred, n_boot=200)
    assert len(est) == 1 and est["estimate"].iat[0] == pytest.approx(hand, abs=1e-12)
    assert main(["results", out, "--n-boot", "200"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.split()[:1] == ["protocol"])
    assert abs(hand) > 0.001 and f"{100 * hand:+.1f}" in line, line
