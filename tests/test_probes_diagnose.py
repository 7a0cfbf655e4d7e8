"""`diagnose` and run folders, checked against what the training recipe wrote independently."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import binomtest

import probes
from probes import DiagnosticError
from shortcutlab import parent_split
from shortcutlab.data.images import load_manifest_table
from shortcutlab.models.recipe import TrainConfig, train
from shortcutlab.models.runs import RunError, load_run, load_run_data, read_record

from test_recipe import _manifest


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("diag")
    man = _manifest(tmp, n_parents=9, per_parent=4)
    split = parent_split(load_manifest_table(man), 0.34, seed=0)
    split.to_csv(tmp / "split.csv")
    train(man, str(tmp / "split.csv"), str(tmp / "run"), TrainConfig(arch="test_resnet", epochs=1, batch_size=16), progress=False)
    return tmp, man, str(tmp / "split.csv")


def test_load_run_rebuilds_the_trained_model(run):
    tmp, man, split = run
    r = load_run(tmp / "run")
    crops, sm, side = load_run_data(r, man, split)
    logits = pd.read_csv(tmp / "run" / "logits.csv").set_index("id")
    idx = np.flatnonzero(side >= 0)
    x, _ = crops.float_batch(torch.from_numpy(idx))
    with torch.no_grad():
        ours = r.adapter.logits(x).numpy()
    theirs = logits.loc[crops.table.ids[idx], [f"logit_{c}" for c in r.record["classes"]]].to_numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_interventions_none_row_is_the_runs_own_test_accuracy(run):
    tmp, man, split = run
    r = load_run(tmp / "run")
    crops, sm, side = load_run_data(r, man, split)
    rows = probes.diagnose(r.adapter, crops, sm, only=["interventions"], params={"interventions": {"names": ["greyscale"]}}, run_id="r")
    none = rows[(rows.setting == "intervention=none") & (rows.metric == "accuracy")].iloc[0]
    logits = pd.read_csv(tmp / "run" / "logits.csv")
    test = logits[logits.split == "test"]
    k, n = int((test.label == test.pred).sum()), len(test)
    assert none.n == n and none.value == pytest.approx(k / n)
    ci = binomtest(k, n).proportion_ci(0.95, method="wilson")
    assert (none.ci_low, none.ci_high) == pytest.approx((ci.low, ci.high), abs=1e-9)
    grey = rows[(rows.setting == "intervention=greyscale") & (rows.metric == "accuracy_change")].iloc[0]
    grey_acc = rows[(rows.setting == "intervention=greyscale") & (rows.metric == "accuracy")].iloc[0].value
    assert grey.value == pytest.approx(grey_acc - k / n)
    assert set(rows.split_sha256) == {sm.hash} and set(rows.run_id) == {"r"}


def test_write_diagnostics_is_all_or_nothing(run, tmp_path, monkeypatch):
    frame = pd.DataFrame([probes.row(None, "d", "m", 0.5, n=2), probes.row(None, "d", "m2", float("nan"), n=0)])
    paths = probes.write_diagnostics(str(tmp_path), frame, {"run": "x"})
    back = json.loads(open(paths["json"]).read())
    assert back["run"] == "x" and back["rows"][1]["value"] is None and len(pd.read_csv(paths["csv"])) == 2
    before = open(paths["csv"]).read()
    real = pd.DataFrame.to_csv

    def broken(self, path, **kw):
        real(self, path, **kw)
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_csv", broken)
    with pytest.raises(OSError):
        probes.write_diagnostics(str(tmp_path), frame.iloc[:1], {"run": "y"})
    assert open(paths["csv"]).read() == before and json.loads(open(paths["json"]).read())["run"] == "x"
    assert sorted(os.listdir(tmp_path)) == ["diagnostics.csv", "diagnostics.json"]


def test_run_folder_errors_name_the_cause(run, tmp_path):
    tmp, man, split = run
    with pytest.raises(RunError, match="has no run.json"):
        read_record(tmp_path)
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(RunError, match="not valid JSON"):
        read_record(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"config": {"arch": "test_resnet"}, "classes": ["a", "b"]}))
    with pytest.raises(RunError, match="no model weights"):
        load_run(tmp_path)
    r = load_run(tmp / "run")
    crops, sm, side = load_run_data(r)  # the run records its data files
    assert sm.hash == r.record["split_sha256"] and len(side) == crops.table.n_crops
    import shutil

    shutil.copytree(tmp / "run", tmp_path / "older")
    rec = json.loads((tmp_path / "older" / "run.json").read_text())
    del rec["data"]  # a run written before run.json recorded its data
    (tmp_path / "older" / "run.json").write_text(json.dumps(rec))
    with pytest.raises(RunError, match="does not record its crop manifest"):
        load_run_data(load_run(tmp_path / "older"))
    other = parent_split(load_manifest_table(man), 0.5, seed=3)
    other.to_csv(tmp_path / "other.csv")
    with pytest.raises(RunError, match="was trained on"):
        load_run_data(r, man, str(tmp_path / "other.csv"))


def test_a_failing_diagnostic_is_named(run):
    tmp, man, split = run
    r = load_run(tmp / "run")
    crops, sm, side = load_run_data(r, man, split)

    class Boom(probes.Diagnostic):
        name = "boom"

        def run(self, ctx):
            raise ZeroDivisionError("planted")

    with pytest.raises(DiagnosticError, match="diagnostic 'boom' failed: ZeroDivisionError: planted"):
        probes.diagnose(r.adapter, crops, sm, only=[Boom()])
    with pytest.raises(DiagnosticError, match="unknown diagnostic 'parent_prob"):
        probes.diagnose(r.adapter, crops, sm, only=["parent_prob"])


def test_unseen_field_targets_drive_the_f2_transfer():
    """F2 targets: each test crop gets a field of its class that no cell trained on, and the
    transferred crops' cell pixels take that field's LAB statistics (checked with skimage)."""
    from skimage.color import rgb2lab

    from shortcutlab.data.splits import factorial_split
    from shortcutlab.synth import SynthConfig, synthesize
    from shortcutlab.studies.demo import _crops_from_synth
    from shortcutlab.data.audit import side_codes
    import interventions

    crops = _crops_from_synth(synthesize(SynthConfig(fields_per_class=10, crop_size=32, field_size=128, seed=1)))
    split = factorial_split(crops.table, seed=0, reserve_parent_share=0.2)
    targets = probes.unseen_field_targets_for(crops, split, seed=0)["reinhard_unseen_field"]
    table = crops.table
    test = np.flatnonzero(side_codes(table, split.cell("leak-low")) == 2)
    trained = set()
    for cell in split.cells:
        trained |= set(table.parent_codes[side_codes(table, split.cell(cell)) == 0])
    i = int(test[0])
    # the field whose statistics were given: match the target against every field's pooled stats
    stats = interventions.field_lab_statistics(crops)
    d = np.abs(stats[["L_mean", "a_mean", "b_mean"]].to_numpy() - targets["target_mean"][i].numpy()).sum(1)
    field = stats.index[int(np.argmin(d))]
    code = list(table.parents).index(field)
    assert d.min() < 1e-3 and code not in trained and code != table.parent_codes[i]
    assert table.label_codes[table.parent_codes == code][0] == table.label_codes[i]
    x, m = crops.float_batch(torch.tensor([i]))
    y = interventions.get("reinhard_unseen_field")(x.double(), m.double(), target_mean=targets["target_mean"][[i]].double(),
                                                   target_std=targets["target_std"][[i]].double())
    lab = rgb2lab(y[0].permute(1, 2, 0).numpy())[m[0, 0].numpy() > 0.5]
    np.testing.assert_allclose(lab.mean(0), targets["target_mean"][i].numpy(), atol=0.5)


def test_cli_diagnose_writes_every_row_it_prints(run, tmp_path, capsys):
    from shortcutlab.cli import main

    tmp, man, split = run
    out = tmp_path / "diag"
    rc = main(["diagnose", str(tmp / "run"), "--only", "interventions", "--param", "interventions.names=[\"greyscale\",\"low_pass\"]",
               "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    rows = pd.read_csv(out / "diagnostics.csv")
    meta = json.loads((out / "diagnostics.json").read_text())
    assert len(meta["rows"]) == len(rows) == 5  # none + 2 x (accuracy, change)
    assert set(rows.setting) == {"intervention=none", "intervention=greyscale", "intervention=low_pass"}
    assert meta["diagnostics"] == [{"diagnostic": "interventions", "status": "ok", "reason": "", "seconds": meta["diagnostics"][0]["seconds"]}]
    logits = pd.read_csv(tmp / "run" / "logits.csv")
    test = logits[logits.split == "test"]
    assert rows[rows.setting == "intervention=none"].value.iloc[0] == pytest.approx((test.label == test.pred).mean())
    assert set(rows.split_sha256) == {json.loads((tmp / "run" / "run.json").read_text())["split_sha256"]}


# -- one R-before probe per context ---------------------------------------------------------------
def _count_probe_fits(monkeypatch) -> list:
    """Patch ParentProbe.fit to record the fits on original features (R before: no cross_fit)."""
    from probes.parent_probe import ParentProbe

    fits = []
    real = ParentProbe.fit

    def counted(self, X, labels, parents, *, cross_fit=None):
        if cross_fit is None:
            fits.append((self.n_folds, self.Cs, self.random_state, len(X)))
        return real(self, X, labels, parents, cross_fit=cross_fit)

    monkeypatch.setattr(ParentProbe, "fit", counted)
    return fits


SHARING = {"leace": {"ranks": (2,), "max_cost": 0.5}, "linear_adversary": {"weights": (0.5, 1.0), "steps": 30}, "parent_probe": {}}


def _same_rows(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for c in x:
            assert x[c] == y[c] or (isinstance(x[c], float) and np.isnan(x[c]) and np.isnan(y[c])), (x, y)


def test_diagnostics_share_one_r_before_probe_per_context(monkeypatch):
    from test_probes_parent_probe import context_with_features, planted

    X, labels, parents, _ = planted(n_classes=3, parents_per_class=4, crops=10, dim=8, strength=1.5, seed=2)
    side = np.where(np.random.default_rng(2).random(len(labels)) < 0.3, 2, 0)
    fits = _count_probe_fits(monkeypatch)
    alone = []
    for name, params in SHARING.items():  # each on a context of its own: no sharing
        alone += probes.get(name, **params).run(context_with_features(X, labels, parents, side=side))
    assert len(fits) == 3
    fits.clear()
    ctx = context_with_features(X, labels, parents, side=side)
    shared = []
    for name, params in SHARING.items():
        shared += probes.get(name, **params).run(ctx)
    assert len(fits) == 1 and fits[0][3] == len(labels)
    _same_rows(alone, shared)
    chk_probe = next(iter(ctx.cache.values()))
    assert chk_probe.n_scored_ == next(r for r in shared if r["diagnostic"] == "parent_probe" and r["metric"] == "R")["n"]

    # other settings or other crops: a probe of their own; the same again: none
    fits.clear()
    probes.get("parent_probe", Cs=1.0).run(ctx)
    probes.get("parent_probe", on="test").run(ctx)
    probes.get("parent_probe").run(ctx)
    assert [(f[1], f[3]) for f in fits] == [(1.0, len(labels)), ((0.01, 0.1, 1.0), int((side == 2).sum()))]
    # without cross-fitting R before is measured outside the training rows, never the shared probe's
    nocf = {"weights": (1.0,), "steps": 30, "cross_fit": False}
    rows = probes.get("linear_adversary", **nocf).run(ctx)
    _same_rows(rows, probes.get("linear_adversary", **nocf).run(context_with_features(X, labels, parents, side=side)))
    assert next(r for r in rows if r["metric"] == "R")["n"] < chk_probe.n_scored_


def test_diagnose_fits_the_r_before_probe_once(run, monkeypatch):
    tmp, man, split = run
    r = load_run(tmp / "run")
    crops, sm, side = load_run_data(r, man, split)
    fits = _count_probe_fits(monkeypatch)
    alone = pd.concat([probes.diagnose(r.adapter, crops, sm, only=[name], params={name: SHARING[name]}, run_id="r") for name in SHARING],
                      ignore_index=True)
    assert len(fits) == 3
    fits.clear()
    shared = probes.diagnose(r.adapter, crops, sm, only=list(SHARING), params=SHARING, run_id="r")
    assert len(fits) == 1
    pd.testing.assert_frame_equal(alone, shared)


def test_cli_diagnose_list_names_every_diagnostic_and_settings_it_accepts(capsys):
    """`diagnose --list` (what `--only` and `--param` refer to): every registered diagnostic
    with its needs, and each setting's default written as --param takes it; each listed value,
    read back as JSON, builds the diagnostic."""
    import inspect

    from shortcutlab.cli import main

    assert main(["diagnose", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    heads = {line.split()[0]: line for line in out if line and not line.startswith(" ") and "(needs:" in line}
    assert sorted(heads) == probes.available()
    for name, line in heads.items():
        assert ", ".join(sorted(probes.get_class(name).needs)) in line
    listed: dict[str, dict] = {}
    for line in out:
        if line.startswith("    "):
            key, _, value = line.strip().partition("=")
            diag, _, setting = key.partition(".")
            listed.setdefault(diag, {})[setting] = json.loads(value)
    for name in probes.available():
        params = [p for p in inspect.signature(probes.get_class(name).__init__).parameters if p != "self"]
        assert list(listed[name]) == params
        for setting, value in listed[name].items():
            probes.get(name, **{setting: value})  # the listed default is a value --param accepts
    assert listed["leace"]["ranks"] == [256] and listed["parent_probe"]["n_folds"] == 4 and listed["gradcam"]["seed"] is None


# -- interventions that declare their per-crop targets (issue 21) -------------------------------
def test_a_plug_in_gets_its_declared_targets_through_diagnose(run):
    """A toy plug-in's `targets_for` rows reach it for exactly the test crops (the run's own
    logits.csv says which), in test order; without targets it is skipped, as label-conditioned."""
    from test_interventions_hooks import RowTag, registered

    tmp, man, split = run
    r = load_run(tmp / "run")
    crops, sm, side = load_run_data(r, man, split)
    logits = pd.read_csv(tmp / "run" / "logits.csv", dtype={"id": str})
    test_rows = np.sort(pd.Index(crops.table.ids.astype(str)).get_indexer(logits.loc[logits.split == "test", "id"]))
    with registered("toy_row_tag", RowTag):
        targets = probes.intervention_targets(crops, split, names=["toy_row_tag", "greyscale", "toy_row_tag"], seed=3)
        assert list(targets) == ["toy_row_tag"]  # greyscale declares none; a repeat is asked once
        (ids, asked_split, seed), = RowTag.asked
        assert seed == 3 and asked_split.hash == sm.hash and list(ids) == list(crops.table.ids.astype(str))
        params = {"interventions": {"names": ["toy_row_tag"]}}
        rows = probes.diagnose(r.adapter, crops, sm, only=["interventions"], params=params, targets=targets, batch_size=4)
        assert np.array_equal(np.concatenate(RowTag.received), test_rows)
        acc = rows[rows.metric == "accuracy"].set_index("setting")["value"]
        assert acc["intervention=toy_row_tag"] == acc["intervention=none"]  # the toy leaves the crops as they are
        skipped = probes.diagnose(r.adapter, crops, sm, only=["interventions"], params=params)
        note = skipped[skipped.setting == "intervention=toy_row_tag"]
        assert list(note.metric) == ["skipped"] and "give its per-crop targets" in note.note.iloc[0]


def test_cli_unseen_field_targets_gives_every_declaring_plug_in_its_targets(run, tmp_path, capsys, monkeypatch):
    from interventions import ReinhardToField
    from shortcutlab.cli import main
    from test_interventions_hooks import RowTag, registered

    tmp, man, split = run
    # the flag asks every registered intervention; this parent split leaves F2 no unseen field
    monkeypatch.setattr(ReinhardToField, "targets_for", classmethod(lambda cls, crops, split, seed=0: None))
    out = tmp_path / "diag"
    argv = ["diagnose", str(tmp / "run"), "--only", "interventions", "--param", "interventions.names=[\"toy_row_tag\"]", "--out", str(out), "--quiet"]
    with registered("toy_row_tag", RowTag):
        assert main(argv + ["--unseen-field-targets"]) == 0, capsys.readouterr().err
        rows = pd.read_csv(out / "diagnostics.csv")
        acc = rows[rows.metric == "accuracy"].set_index("setting")["value"]
        assert acc["intervention=toy_row_tag"] == acc["intervention=none"] and len(RowTag.asked) == 1
        logits = pd.read_csv(tmp / "run" / "logits.csv", dtype={"id": str})
        assert len(np.concatenate(RowTag.received)) == int((logits.split == "test").sum())
        assert main(argv) == 0  # without the flag the toy is skipped, as label-conditioned
        assert list(pd.read_csv(out / "diagnostics.csv").query("setting == 'intervention=toy_row_tag'").metric) == ["skipped"]


# --- issue 21: how a run is loaded and scored (its device, its preprocess, weights from elsewhere)
def test_cli_diagnose_loads_and_runs_the_model_on_its_device(run, tmp_path, monkeypatch):
    # --device reaches the model load (resolve_device sees it) and the model's parameters and
    # batches end up there: torch's "meta" device, which a CPU machine has (shapes without
    # data, so the command stops at the model's first forward pass), for a run folder and
    # for a model trained elsewhere (--arch --weights --classes)
    import shortcutlab.models.devices as devices
    from shortcutlab.cli import main

    from test_sweep_run import _Ran, _watch_models

    tmp, man, split = run
    asked: list = []
    monkeypatch.setattr(devices, "resolve_device", lambda name: asked.append(str(name)) or torch.device("meta"))
    seen = _watch_models(monkeypatch, stop=True)
    classes = ",".join(read_record(tmp / "run")["classes"])
    for extra in ([str(tmp / "run")], [str(tmp_path / "ext"), "--arch", "test_resnet", "--weights", str(tmp / "run" / "model.safetensors"),
                                       "--classes", classes, "--manifest", man, "--split", split]):
        asked.clear(), seen.clear()
        with pytest.raises(_Ran):
            main(["diagnose", *extra, "--only", "parent_probe", "--device", "cuda:1", "--out", str(tmp_path / "out"), "--quiet", "--no-cache"])
        assert asked and set(asked) == {"cuda:1"}
        assert seen == [(torch.device("meta"), torch.device("meta"))]


def test_a_run_trained_with_masked_backgrounds_scores_its_crops_masked(tmp_path):
    # the run's preprocess (read from run.json) gives back the logits training wrote, which it
    # computed on masked crops; the crops as they are give other logits
    from probes.base import DiagnosticContext

    man = _manifest(tmp_path)
    parent_split(load_manifest_table(man), 0.25, seed=0).to_csv(tmp_path / "split.csv")
    cfg = TrainConfig(arch="test_resnet", epochs=1, batch_size=16, mask_background=True, background_fill=0.3)
    train(man, str(tmp_path / "split.csv"), str(tmp_path / "run"), cfg, progress=False)
    r = load_run(tmp_path / "run")
    assert r.preprocess.key == "mask_background=0.3"
    crops, _, side = load_run_data(r)
    idx = np.flatnonzero(side >= 0)
    theirs = pd.read_csv(tmp_path / "run" / "logits.csv").set_index("id").loc[crops.table.ids[idx], ["logit_class0", "logit_class1"]].to_numpy()
    for pre, same in ((r.preprocess, True), (None, False)):
        x, _ = DiagnosticContext(r.adapter, crops, side, preprocess=pre).batch(idx)
        with torch.no_grad():
            ours = r.adapter.logits(x).numpy()
        assert np.allclose(ours, theirs, atol=1e-4) == same


def test_a_runs_preprocess_is_the_masked_background_of_its_record():
    from shortcutlab.models.runs import Run

    g = torch.Generator().manual_seed(1)
    x = torch.rand(2, 3, 8, 8, generator=g)
    m = (torch.rand(2, 1, 8, 8, generator=g) > 0.5).float()
    masked = {"arch": "test_resnet", "mask_background": True}
    for cfg, fill in ((masked, 0.5), ({**masked, "background_fill": 0.25}, 0.25)):
        pre = Run(path="", record={"config": cfg, "classes": ["a"]}, adapter=None, run_id="r").preprocess
        assert pre.key == f"mask_background={fill}"
        torch.testing.assert_close(pre(x, m), x * m + fill * (1 - m), rtol=0, atol=1e-7)
    for cfg in ({"arch": "test_resnet"}, {**masked, "mask_background": False}):
        assert Run(path="", record={"config": cfg, "classes": ["a"]}, adapter=None, run_id="r").preprocess is None


def test_from_weights_orders_the_logits_by_the_classes_asked_for(tmp_path):
    from shortcutlab.models.adapter import create_model
    from shortcutlab.models.runs import Run

    torch.manual_seed(5)
    model = create_model("test_resnet", num_classes=3).eval()
    torch.save(model.state_dict(), tmp_path / "ext.pt")
    x = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    mean = torch.tensor(model.pretrained_cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(model.pretrained_cfg["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        hand = model((x - mean) / std)  # columns: b, c, a (the model's logit order)
        as_saved = Run.from_weights("test_resnet", str(tmp_path / "ext.pt"), ["b", "c", "a"])
        by_name = Run.from_weights("test_resnet", str(tmp_path / "ext.pt"), ["b", "c", "a"], order=["a", "b", "c"], run_id="ext")
        torch.testing.assert_close(as_saved.adapter.logits(x), hand)
        torch.testing.assert_close(by_name.adapter.logits(x), hand[:, [2, 0, 1]])
    assert as_saved.record == {"config": {"arch": "test_resnet"}, "classes": ["b", "c", "a"], "files": {}}
    assert by_name.record["classes"] == ["a", "b", "c"] and (as_saved.run_id, by_name.run_id) == ("test_resnet", "ext")
    assert as_saved.path == str(tmp_path) and as_saved.preprocess is None and as_saved.device == torch.device("cpu")
