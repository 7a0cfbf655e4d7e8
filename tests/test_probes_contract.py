"""One contract over every registered diagnostic (`shortcutlab.testing.check_diagnostic`), plus
the registry's plug-in rules.

Each diagnostic runs on a tiny context (a small CNN, synthetic crops with masks, a parent
split) and must return rows of the shared schema, leave the model bit-identical and in the
mode it found it, and give the same rows when run twice with the same seed.
"""

from __future__ import annotations

import math

import pytest
import torch

import probes
from probes import ROW_COLUMNS, Diagnostic, DiagnosticError
from shortcutlab.testing import check_diagnostic, synthetic_context


@pytest.fixture(scope="module")
def context():
    return synthetic_context(run_id="tiny")


NAMES = probes.available()
#: lighter settings where the defaults only add time: the contract is about rows and the model
LIGHT = {"linear_adversary": dict(steps=60)}


@pytest.mark.parametrize("name", NAMES)
def test_every_diagnostic_keeps_the_contract(name, context):
    """`shortcutlab.testing.check_diagnostic`: the row schema, the model left bit-identical and
    in its mode (also a model left in train mode, measured in eval mode), the same rows twice,
    needs checked before running."""
    d = probes.get(name, **LIGHT.get(name, {}))
    assert isinstance(d, Diagnostic) and d.name == name
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in context.adapter.modules())
    check_diagnostic(d, context=context)


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
