"""One contract over every registered diagnostic, plus the registry's plug-in rules.

Each diagnostic runs on a tiny context (a small CNN, synthetic crops with masks, a parent
split) and must return rows of the shared schema, leave the model bit-identical and in the
mode it found it, and give the same rows when run twice with the same seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import probes
from probes import ROW_COLUMNS, Diagnostic, DiagnosticContext, DiagnosticError
from shortcutlab.models.adapter import create_model, wrap
from shortcutlab.data.images import CropImages
from shortcutlab.data.splits import parent_split
from shortcutlab.data.table import CropTable


def _crops(n_parents=12, per_parent=6, size=32, seed=0) -> CropImages:
    import pandas as pd

    g = torch.Generator().manual_seed(seed)
    n = n_parents * per_parent
    ids = [f"c{i:03d}" for i in range(n)]
    parents = [f"p{i // per_parent:02d}" for i in range(n)]
    labels = [f"k{(i // per_parent) % 3}" for i in range(n)]
    table = CropTable.from_frame(pd.DataFrame({"id": ids, "label": labels, "parent": parents}), id="id", label="label", parent="parent")
    tint = torch.rand(n_parents, 3, 1, 1, generator=g)
    images = (0.5 * torch.rand(n, 3, size, size, generator=g) + 0.5 * tint.repeat_interleave(per_parent, 0)) * 255
    masks = torch.zeros(n, 1, size, size, dtype=torch.bool)
    masks[:, :, size // 4 : 3 * size // 4, size // 4 : 3 * size // 4] = True
    order = torch.from_numpy(pd.Index(ids).get_indexer(table.ids))
    return CropImages(images.to(torch.uint8)[order], masks[order], table)


@pytest.fixture(scope="module")
def context():
    torch.manual_seed(0)
    crops = _crops()
    split = parent_split(crops.table, test_fraction=0.34, seed=0)
    from shortcutlab.data.audit import side_codes

    side = side_codes(crops.table, split.cell())
    adapter = wrap(create_model("test_resnet", num_classes=3)).eval()
    return DiagnosticContext(adapter, crops, side, run_id="tiny", batch_size=32)


def _state(adapter):
    return {k: v.detach().clone() for k, v in adapter.model.state_dict().items()}


NAMES = probes.available()


@pytest.mark.parametrize("name", NAMES)
def test_every_diagnostic_keeps_the_contract(name, context):
    d = probes.get(name)
    assert isinstance(d, Diagnostic) and d.name == name
    assert d.missing(context) is None
    before = _state(context.adapter)
    modes = [m.training for m in context.adapter.modules()]
    rows = d.run(context)
    assert rows, f"{name} returned no rows"
    for r in rows:
        assert tuple(r)[: len(ROW_COLUMNS)] == ROW_COLUMNS
        assert r["diagnostic"] == name and r["run_id"] == "tiny"
        assert isinstance(r["value"], float) and isinstance(r["n"], int)
        if not math.isnan(r["ci_low"]):
            assert r["ci_low"] <= r["value"] + 1e-12 <= r["ci_high"] + 2e-12
    after = _state(context.adapter)
    assert all(torch.equal(before[k], after[k]) for k in before), f"{name} changed the model's weights"
    assert [m.training for m in context.adapter.modules()] == modes, f"{name} changed train/eval modes"
    again = probes.get(name).run(context)
    a = [(r["setting"], r["metric"], r["value"]) for r in rows]
    b = [(r["setting"], r["metric"], r["value"]) for r in again]
    assert len(a) == len(b) and all(x[:2] == y[:2] and (x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2]))) for x, y in zip(a, b))


@pytest.mark.parametrize("name", NAMES)
def test_a_model_in_train_mode_is_measured_in_eval_mode_and_left_untouched(name, context):
    """A model left in train mode: every forward pass runs in eval mode (`probes.base.eval_mode`),
    so the BatchNorm statistics stay bit-identical, each module's flag comes back, and the rows
    equal those of the same model in eval mode."""
    import copy

    adapter = copy.deepcopy(context.adapter).train()
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in adapter.modules())
    ctx = DiagnosticContext(adapter, context.crops, context.side, run_id="tiny", batch_size=32)
    before = _state(adapter)
    rows = probes.get(name).run(ctx)
    after = _state(adapter)
    assert all(torch.equal(before[k], after[k]) for k in before), f"{name} changed the model's state (BatchNorm statistics?)"
    assert all(m.training for m in adapter.modules()), f"{name} left the model in eval mode"
    want = probes.get(name).run(DiagnosticContext(copy.deepcopy(context.adapter).eval(), context.crops, context.side, run_id="tiny", batch_size=32))
    a = [(r["setting"], r["metric"], r["value"]) for r in rows]
    b = [(r["setting"], r["metric"], r["value"]) for r in want]
    assert len(a) == len(b) and all(x[:2] == y[:2] and (x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2]))) for x, y in zip(a, b))


def test_needs_are_checked_before_running(context):
    no_masks = DiagnosticContext(context.adapter, CropImages(context.crops.images, None, context.table), context.side)
    for name in probes.available(needs="masks"):
        assert "masks" in probes.get(name).missing(no_masks)
    no_test = DiagnosticContext(context.adapter, context.crops, np.where(context.side == 2, -1, context.side))
    for name in probes.available(needs="split"):
        assert "test" in probes.get(name).missing(no_test)


def test_registry_rules(tmp_path, monkeypatch):
    with pytest.raises(DiagnosticError, match="did you mean 'interventions'"):
        probes.get("intervention")
    with pytest.raises(DiagnosticError, match="takes no parameter 'nmes'"):
        probes.get("interventions", nmes=["greyscale"])
    with pytest.raises(DiagnosticError, match="already registered by probes.interventions_accuracy.InterventionAccuracy"):

        @probes.register("interventions")
        class Other(Diagnostic):
            def run(self, ctx):
                return []

    with pytest.raises(TypeError, match="unknown entries"):

        class Bad(Diagnostic):
            needs = frozenset({"gpu"})

            def run(self, ctx):
                return []

    # a third-party diagnostic joins through the entry-point group, and a broken one warns
    dist = tmp_path / "fake_diag-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-diag\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{probes.ENTRY_POINT_GROUP}]\nmean_feature = fake_diag_mod:MeanFeature\nbroken = fake_diag_mod:Missing\n")
    (tmp_path / "fake_diag_mod.py").write_text(
        "from probes import Diagnostic, row\n"
        "class MeanFeature(Diagnostic):\n"
        "    needs = frozenset({'features'})\n"
        "    def run(self, ctx):\n"
        "        f = ctx.features()[ctx.test_idx]\n"
        "        return [row(ctx, self.name, 'mean_feature', float(f.mean()), n=len(f))]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.warns(UserWarning, match="'broken'"):
            loaded = probes.load_entry_points(force=True)
        assert loaded == ["mean_feature"] and "mean_feature" in probes.available(needs="features")
    finally:
        probes.unregister("mean_feature")


def test_row_has_the_schema_and_nan_not_zero():
    r = probes.row(None, "d", "m", float("nan"), n=3, extra=1)
    assert tuple(r) == ROW_COLUMNS + ("extra",)
    assert math.isnan(r["value"]) and math.isnan(r["ci_low"]) and r["n"] == 3
