"""Issue 21's "done when": a toy plug-in of each kind (tests/toy_plugins/: an intervention, a
diagnostic, an estimand, an executor), each one short module plus registration, keeps its
contract and runs through a tiny sweep (`shortcutlab sweep --executor toy_serial`) into the
report (`shortcutlab report`). What each leaves in the sweep's tables and the report is
recomputed here from the sweep's files: the crops' PNGs, the split CSV, the crop manifest and
the runs' logits.csv."""

from __future__ import annotations

import collections
import contextlib
import json
import os

import numpy as np
import pandas as pd
import pytest

from toy_plugins import toy_diagnostic, toy_estimand, toy_executor, toy_intervention

TOYS = (toy_intervention, toy_diagnostic, toy_estimand, toy_executor)

# Two seeds x (leak, clean) on one planted mechanism: the smallest sweep whose leak, validity
# table and estimands all have a value; 2 epochs at lr 0.01 so the models' predictions depend
# on the colours (1 epoch at lr 0.001 predicts one class whatever the input).
CONFIG = """
data:
  synthetic: {mechanisms: [color], fields_per_class: 6, crop_size: 16, field_size: 64}
split: {protocol: factorial}
seeds: [0, 1]
models:
  - {arch: test_resnet, epochs: 2, lr: 0.01, batch_size: 32}
cells: [leak-high, clean-high]
interventions: {names: [toy_invert]}
diagnostics: {only: [toy_exposure]}
"""


@contextlib.contextmanager
def registered():
    """The four toys registered for the block, each unregistered after, also after an error."""
    done = []
    try:
        for toy in TOYS:
            toy.register()
            done.append(toy)
        yield
    finally:
        for toy in reversed(done):
            toy.unregister()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The tiny sweep run by the toy executor, and its report, read back; the toys are
    registered while they run and removed before any test (a test that needs them registers them)."""
    from shortcutlab.cli import main

    tmp = tmp_path_factory.mktemp("plugins")
    cfg, out = tmp / "sweep.yaml", str(tmp / "sweep")
    cfg.write_text(CONFIG)
    with registered():
        assert main(["sweep", str(cfg), "--out", out, "--executor", "toy_serial", "--quiet"]) == 0
        assert main(["report", out, "--n-boot", "200"]) == 0
        report = os.path.join(out, "report")
        with open(os.path.join(report, "report.html"), encoding="utf-8") as f:
            html = f.read()
        with open(os.path.join(report, "report.md"), encoding="utf-8") as f:
            md = f.read()
        ran = list(toy_executor.ToySerialExecutor.ran)
    return {"out": out, "ran": ran, "html": html, "md": md,
            "pred": pd.read_parquet(os.path.join(out, "predictions.parquet")),
            "res": pd.read_parquet(os.path.join(out, "results.parquet")),
            "est": pd.read_csv(os.path.join(report, "estimates.csv"), keep_default_na=False, na_values=[""]),
            "validity": pd.read_csv(os.path.join(report, "validity.csv"), keep_default_na=False, na_values=[""])}


def _section(html: str, key: str) -> str:
    start = html.index(f'<h2 id="{key}">')
    nxt = html.find("<h2 ", start + 1)
    return html[start: nxt if nxt > 0 else len(html)]


def _run_files(out: str, model: str) -> tuple[dict, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """A model's run record, its logits.csv, its crop manifest and its split CSV, read with pandas."""
    from shortcutlab.sweep.folder import task_dir

    run_dir = task_dir(out, "train", model)
    with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
        record = json.load(f)
    logits = pd.read_csv(os.path.join(run_dir, "logits.csv"), dtype={"id": str})
    manifest = pd.read_csv(record["data"]["manifest"], dtype={"id": str, "parent": str})
    split = pd.read_csv(record["data"]["split"], dtype=str)
    return record, logits, manifest, split


# --- each toy keeps its contract ------------------------------------------------------------

def test_each_toy_passes_its_contract_check():
    from shortcutlab.testing import check_diagnostic, check_executor, check_intervention

    with registered():
        check_intervention(toy_intervention.ToyInvert)
        check_diagnostic(toy_diagnostic.ToyExposure)
        check_executor(toy_executor.ToySerialExecutor)


def test_registering_is_undone_after_the_block():
    import interventions
    import probes
    from shortcutlab.stats import available_estimands
    from shortcutlab.sweep import executors

    def present():
        return ("toy_invert" in interventions.available(), "toy_exposure" in probes.available(),
                "toy_flip_rate" in available_estimands(), "toy_serial" in executors.available())

    with registered():
        assert present() == (True, True, True, True)
    assert present() == (False, False, False, False)
    with pytest.raises(RuntimeError, match="boom"), registered():
        raise RuntimeError("boom")
    assert present() == (False, False, False, False)


# --- the executor -----------------------------------------------------------------------------

def test_the_toy_executor_ran_exactly_the_planned_tasks(sweep):
    with open(os.path.join(sweep["out"], "sweep.json"), encoding="utf-8") as f:
        record = json.load(f)
    assert record["executor"] == "toy_serial"
    planned = [(t["kind"], t["id"]) for t in record["tasks"]]
    assert sweep["ran"] == planned           # every task once, in the plan's order, none skipped
    # by hand: 2 seeds -> 2 benchmarks and 2 splits; x 2 cells -> 4 models, each trained, scored, diagnosed
    assert collections.Counter(k for k, _ in sweep["ran"]) == {"synthesise": 2, "split": 2, "train": 4, "score": 4, "diagnose": 4}


# --- the intervention -------------------------------------------------------------------------

def test_the_toy_intervention_is_scored_as_the_inverted_crops(sweep):
    import torch
    from PIL import Image

    from shortcutlab.models.runs import load_run
    from shortcutlab.sweep.folder import task_dir

    pred, res = sweep["pred"], sweep["res"]
    assert set(pred["intervention"]) == {"none", "toy_invert"}
    n_changed = 0
    for model, g in pred.groupby("model"):
        record, logits, manifest, _ = _run_files(sweep["out"], model)
        inv = g[g["intervention"] == "toy_invert"].set_index("id")
        none = g[g["intervention"] == "none"].set_index("id")
        assert sorted(inv.index) == sorted(none.index) == sorted(logits.loc[logits["split"] == "test", "id"])
        # by hand: the PNGs read with PIL, inverted, through the reloaded model
        rows = manifest.set_index("id").loc[inv.index]
        root = os.path.dirname(record["data"]["manifest"])
        x = np.stack([np.asarray(Image.open(os.path.join(root, p)).convert("RGB")) for p in rows["path"]])
        x = 1.0 - torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255.0
        adapter = load_run(task_dir(sweep["out"], "train", model)).adapter.eval()
        with torch.no_grad():
            z = adapter.logits(x).double().numpy()
        hand = z.argmax(1)
        top2 = np.sort(z, axis=1)[:, -2:]
        differ = hand != inv["pred"].to_numpy()
        assert (top2[differ, 1] - top2[differ, 0] < 1e-4).all()  # only a near tie may go either way
        n_changed += int((inv["pred"] != none.loc[inv.index, "pred"]).sum())
        # its accuracy rows in results: the share of its predictions that are right
        acc = res[(res["model"] == model) & (res["setting"] == "intervention=toy_invert") & (res["metric"] == "accuracy")]
        assert acc["value"].tolist() == pytest.approx([(inv["pred"] == inv["label"]).mean()], abs=1e-12)
        change = res[(res["model"] == model) & (res["setting"] == "intervention=toy_invert") & (res["metric"] == "accuracy_change")]
        assert change["value"].tolist() == pytest.approx([(inv["pred"] == inv["label"]).mean() - (none["pred"] == none["label"]).mean()])
    assert n_changed > 0  # the models read colour: inverting it changes predictions


def test_the_report_names_the_toy_intervention_by_its_label(sweep):
    v = sweep["validity"]
    assert v.loc[v["kind"] == "intervention", "item"].tolist() == ["toy_invert"]
    label = "toy colour inversion"
    assert f"<td>{label}</td>" in _section(sweep["html"], "validity")
    assert label in _section(sweep["html"], "leak_effect")
    # the warnings list quotes the statistics' warnings as raised (with 2 seeds every row has one,
    # naming the intervention as the predictions do); the tables and readings use the label
    body = sweep["md"].split("Warnings raised")[0]
    assert f"| {label} |" in body and "toy\\_invert" not in body


# --- the diagnostic ---------------------------------------------------------------------------

def test_the_toy_diagnostic_rows_hold_the_hand_computed_values(sweep):
    res, pred = sweep["res"], sweep["pred"]
    toy = res[res["diagnostic"] == "toy_exposure"]
    assert set(toy["model"]) == set(pred["model"]) and len(toy) == 2 * pred["model"].nunique()
    shares = {}
    for model, g in toy.groupby("model"):
        record, logits, manifest, split = _run_files(sweep["out"], model)
        parent = manifest.set_index("id")["parent"]
        cell = split[split["cell"] == record["cell"]]
        test = parent.loc[cell.loc[cell["split"] == "test", "id"]]
        train = set(parent.loc[cell.loc[cell["split"] == "train", "id"]])
        share = float(np.mean([p in train for p in test]))
        value = g.set_index("metric")["value"]
        assert value["sibling_share"] == pytest.approx(share, abs=1e-12)
        t = logits[logits["split"] == "test"]
        true_logit = t.apply(lambda r: r[f"logit_{r['label']}"], axis=1).mean()
        assert value["mean_true_logit"] == pytest.approx(true_logit, rel=1e-4, abs=1e-5)
        assert (g["n"] == len(t)).all()
        key = g.iloc[0]
        shares[(int(key["seed"]), key["exposure"])] = share
    # the factorial's promise, read off the split: every leak test crop has a training sibling, no clean one does
    assert shares == {(s, e): 1.0 if e == "leak" else 0.0 for s in (0, 1) for e in ("leak", "clean")}


def test_the_report_reads_the_toy_leak_metric_under_its_label(sweep):
    v = sweep["validity"]
    row = v[v["kind"] == "toy_exposure"]
    assert row["item"].tolist() == ["toy exposure sibling share"]
    # leak minus clean sibling share per seed: 1 - 0 in both seeds; with 2 seeds no interval
    # (fewer than 3; and the values do not vary): the value is shown with the reason, never [1, 1]
    assert row["estimate"].iloc[0] == pytest.approx(1.0)
    assert row[["ci_low", "ci_high"]].isna().all(axis=None)
    assert row["verdict"].tolist() == ["n/a"]
    section = _section(sweep["html"], "validity")
    assert "<td>toy exposure sibling share</td>" in section
    assert "the toy exposure sibling share: color (high) has no interval (2 seeds; an interval needs 3)" in section
    assert "| toy exposure sibling share | +100.0 (no interval) |" in sweep["md"]


# --- the estimand ----------------------------------------------------------------------------

def test_the_toy_estimand_is_recomputed_from_the_predictions(sweep):
    from shortcutlab.stats import estimand_units

    pred = sweep["pred"]
    none = pred[pred["intervention"] == "none"].set_index(["model", "id"])["correct"]
    inv = pred[pred["intervention"] == "toy_invert"].set_index(["model", "id"])["correct"]
    flipped = (none.loc[inv.index].to_numpy() != inv.to_numpy())
    est = sweep["est"]
    rows = est[est["estimand"] == "toy_flip_rate"]
    assert rows[["condition", "intervention", "n_crops"]].values.tolist() == [["color", "toy_invert", len(inv)]]
    assert rows["estimate"].iloc[0] == pytest.approx(flipped.mean(), abs=1e-12)
    assert flipped.any()
    with registered():
        assert estimand_units(est)["toy_flip_rate"] == "share"
    # the report reads it in its own words and unit, under 'Further estimates'
    share = f"{100 * flipped.mean():.0f}%"
    further = _section(sweep["html"], "further_estimates")
    assert f"color: the toy colour inversion turns {share} of the test predictions from right to wrong or back" in further
    assert "<td>share</td>" in further and f"<td>{share}</td>" in further
    assert f"| toy\\_flip\\_rate | color |  | share | {share} | no interval |" in sweep["md"]  # no architecture: a blank cell


def test_results_prints_each_estimand_in_its_registered_unit(sweep, capsys):
    """`shortcutlab results`: the toy estimand (a share) in %, and a count, registered here
    with unit 'crops', as the number itself (not x 100 as a fraction would be)."""
    from shortcutlab.cli import main
    from shortcutlab.stats import register_estimand, unregister_estimand

    pred = sweep["pred"]
    none = pred[pred["intervention"] == "none"].set_index(["model", "id"])["correct"]
    inv = pred[pred["intervention"] == "toy_invert"].set_index(["model", "id"])["correct"]
    n_flipped = int((none.loc[inv.index].to_numpy() != inv.to_numpy()).sum())

    @register_estimand("toy_flip_count", unit="crops", reading="{estimate} flipped")
    def flip_count(ctx):
        rows = toy_estimand.flip_rate(ctx)
        return rows.assign(estimate=rows["estimate"] * rows["n_crops"])

    try:
        with registered():
            assert main(["results", sweep["out"], "--n-boot", "20"]) == 0
    finally:
        unregister_estimand("toy_flip_count")
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("toy_")}
    assert f"{100 * n_flipped / len(inv):+.1f}" in lines["toy_flip_rate"]
    assert f"{n_flipped:+.1f}" in lines["toy_flip_count"]
