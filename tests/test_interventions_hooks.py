"""What an intervention declares it needs: its display `label`, its per-crop targets
(`targets_for`) and the splits it can serve (`check_split`); the sweep, diagnose and the report
ask these, never a name. `RowTag` is a toy plug-in the other test files register too."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pandas as pd
import pytest
import torch

import interventions
from interventions import Intervention, SplitRequirementError


class RowTag(Intervention):
    """Toy label-conditioned plug-in: its per-crop target is the crop's table row, and every call
    records the rows it was given (and returns the crops unaltered, so its accuracy is the
    unaltered crops')."""

    label = "row tags of the crop table"
    label_conditioned = True
    asked: list = []     # (table ids, split, seed) of every targets_for call
    received: list = []  # the `row` targets of every call

    @classmethod
    def targets_for(cls, crops, split, seed=0):
        cls.asked.append((np.asarray(crops.table.ids).astype(str), split, seed))
        return {"row": torch.arange(crops.table.n_crops, dtype=torch.float64)}

    def apply(self, x, mask, params, row=None):
        if row is None:
            raise interventions.InterventionError("toy_row_tag needs row=")
        type(self).received.append(row.detach().cpu().numpy().astype(np.int64))
        return x


@contextlib.contextmanager
def registered(name: str, cls: type):
    """`cls` registered under `name` for the block (and its records cleared), unregistered after."""
    cls.asked, cls.received = [], []
    interventions.register(name)(cls)
    try:
        yield cls
    finally:
        interventions.unregister(name)


def test_every_registered_intervention_has_a_label():
    labels = {n: interventions.get_class(n).label for n in interventions.available()}
    assert all(isinstance(v, str) and v.strip() for v in labels.values()), labels
    assert len(set(labels.values())) == len(labels)  # reports can tell them apart
    # a plug-in without a label is shown by its name, underscores as spaces
    with registered("toy_no_label", type("NoLabel", (Intervention,), {"apply": lambda self, x, m, p, **c: x})):
        assert interventions.display_label(interventions.get_class("toy_no_label")) == "toy no label"


def test_only_the_f2_transfer_declares_targets_and_split_needs():
    declaring = [n for n in interventions.available() if interventions.declares_targets(interventions.get_class(n))]
    assert declaring == ["reinhard_unseen_field"]
    for n in interventions.available():
        cls = interventions.get_class(n)
        if n != "reinhard_unseen_field":
            assert cls.targets_for(None, None, 0) is None
            cls.check_split("parent", {})  # needs nothing of the split
    f2 = interventions.get_class("reinhard_unseen_field")
    with pytest.raises(SplitRequirementError, match="'parent' split leaves none") as e:
        f2.check_split("parent", {"test_fraction": 0.2})
    assert e.value.param is None
    for share in (0, None, 0.0):
        with pytest.raises(SplitRequirementError, match=f"got reserve_parent_share {share or 0!r}") as e:
            f2.check_split("factorial", {"reserve_parent_share": share})
        assert e.value.param == "reserve_parent_share"
    f2.check_split("factorial", {"reserve_parent_share": 0.2})


def test_the_f2_hook_gives_each_test_crop_its_chosen_fields_pooled_statistics():
    """Second route: the policy's chosen field per test crop (own field for the others), looked
    up in the LAB statistics of every field pooled over all its crops."""
    from shortcutlab.data.audit import side_codes
    from shortcutlab.data.splits import factorial_split
    from shortcutlab.studies.demo import _crops_from_synth as crops_from_synth
    from shortcutlab.synth import SynthConfig, synthesize

    crops = crops_from_synth(synthesize(SynthConfig(fields_per_class=8, crop_size=16, field_size=64, seed=2)))
    split = factorial_split(crops.table, seed=0, reserve_parent_share=0.25)
    got = interventions.get_class("reinhard_unseen_field").targets_for(crops, split, seed=4)
    table = crops.table
    assert set(got) == {"target_mean", "target_std"} and got["target_mean"].shape == (table.n_crops, 3)
    chosen = interventions.unseen_field_targets(table, split, seed=4).set_index("id")["target_parent"]
    field = pd.Series(np.asarray(table.parents, dtype=object)[table.parent_codes], index=table.ids.astype(str))
    field.loc[chosen.index.astype(str)] = chosen.to_numpy()
    stats = interventions.field_lab_statistics(crops)
    np.testing.assert_allclose(got["target_mean"].numpy(), stats.loc[field.to_numpy(), ["L_mean", "a_mean", "b_mean"]].to_numpy(), rtol=1e-5)
    np.testing.assert_allclose(got["target_std"].numpy(), stats.loc[field.to_numpy(), ["L_std", "a_std", "b_std"]].to_numpy(), rtol=1e-5)
    # every test crop's target field is of its class, not its own, and trained on by no cell
    trained = set()
    test = np.zeros(table.n_crops, dtype=bool)
    for cell in split.cells:
        side = side_codes(table, split.cell(cell))
        trained |= set(np.asarray(table.parents)[table.parent_codes[side == 0]])
        test |= side == 2
    own = pd.Series(np.asarray(table.parents, dtype=object)[table.parent_codes], index=table.ids.astype(str))
    assert test.sum() == len(chosen) and not set(chosen) & trained
    assert (chosen.to_numpy() != own.loc[chosen.index.astype(str)].to_numpy()).all()


def test_target_rows_selects_rows_of_arrays_and_tensors():
    got = interventions.target_rows({"a": np.arange(10.0).reshape(5, 2), "b": torch.tensor([5, 6, 7, 8, 9])}, torch.tensor([3, 0]))
    assert torch.equal(got["a"], torch.tensor([[6.0, 7.0], [0.0, 1.0]], dtype=torch.float64))
    assert torch.equal(got["b"], torch.tensor([8, 5]))


def test_a_sweep_scores_a_plug_in_with_its_declared_targets(tmp_path):
    """The sweep's scoring task asks the plug-in for its targets: each call gets exactly the rows
    of the test crops the predictions table lists, and (the crops unaltered) the plug-in's
    predictions are the unaltered crops'."""
    from shortcutlab.sweep.config import validate
    from shortcutlab.sweep.runner import run_sweep

    cfg = {
        "data": {"synthetic": {"mechanisms": ["color"], "fields_per_class": 6, "crop_size": 16, "field_size": 64}},
        "split": {"protocol": "factorial"}, "seeds": [3], "cells": ["leak-high"],
        "models": [{"arch": "test_resnet", "epochs": 1, "lr": 0.001, "batch_size": 64}],
        "interventions": {"names": ["toy_row_tag"]}, "diagnostics": "none",
    }
    with registered("toy_row_tag", RowTag):
        run_sweep(validate(cfg), str(tmp_path / "s"), progress=False)
        pred = pd.read_parquet(os.path.join(tmp_path / "s", "predictions.parquet"))
        assert len(RowTag.asked) == 1 and RowTag.asked[0][2] == 3  # once per scored model, with the sweep's seed
        ids = RowTag.asked[0][0]
        rows = np.concatenate(RowTag.received)
        tagged = pred[pred["intervention"] == "toy_row_tag"].set_index("id")
        assert sorted(ids[rows]) == sorted(tagged.index.astype(str)) and len(rows) == len(tagged)
        none = pred[pred["intervention"] == "none"].set_index("id")
        assert (tagged.loc[none.index, "pred"].to_numpy() == none["pred"].to_numpy()).all()
