"""The demo pipeline on a tiny benchmark: it runs end to end and its tables are consistent."""

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch

from shortcutlab.studies.demo import DemoConfig, leak_effects, run_demo


def test_tiny_demo_writes_consistent_tables(tmp_path):
    cfg = DemoConfig(fields_per_class=12, epochs=1, crop_size=16, seeds=(0,), progress=False, interventions=(), diagnostics=(), report=False)
    summary = run_demo(str(tmp_path), cfg)
    results = pd.read_csv(tmp_path / "results.csv")
    assert len(results) == 8  # 4 cells x (planted, none)
    assert set(results["cell"]) == {"leak-high", "clean-high", "leak-low", "clean-low"}
    # Within a condition and level, leak and clean train on the same number of crops and fields.
    for _, g in results.groupby(["condition", "diversity"]):
        assert g["n_train"].nunique() == 1 and g["n_train_parents"].nunique() == 1 and g["n_test"].nunique() == 1
    # Leak minus clean recomputed by hand from results.csv (one row per cell), matched by key.
    effects = pd.read_csv(tmp_path / "effects.csv")
    assert len(effects) == 4  # (planted, none) x (high, low), one seed
    keys = ["condition", "seed", "diversity"]
    for column, effect in (("test_accuracy", "leak_effect"), ("test_accuracy_no_shared_pixels", "leak_effect_no_shared_pixels")):
        by_cell = results.set_index(keys + ["exposure"])[column].unstack("exposure")
        hand = (by_cell["leak"] - by_cell["clean"]).rename("hand").reset_index()
        merged = effects.merge(hand, on=keys, how="outer", validate="one_to_one")
        assert len(merged) == 4
        assert (merged[effect] - merged["hand"]).abs().max() < 1e-12
    # Accuracies are fractions of the common test crops: n_test * accuracy is a whole number.
    counts = results["test_accuracy"] * results["n_test"]
    assert ((counts - counts.round()).abs() < 1e-6).all()
    assert (results["n_test_no_shared_pixels"] <= results["n_test"]).all()
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["mean_leak_effect_pp"] == summary["mean_leak_effect_pp"]
    for condition, g in results.groupby("condition"):
        leak = g[g["exposure"] == "leak"].sort_values("diversity")["test_accuracy"].to_numpy()
        clean = g[g["exposure"] == "clean"].sort_values("diversity")["test_accuracy"].to_numpy()
        assert saved["mean_leak_effect_pp"][condition] == round(100 * float(np.mean(leak - clean)), 2)
    assert set(saved["mean_leak_effect_pp"]) == {"color+illumination+background+focus+noise", "none"}
    assert (tmp_path / "none_seed0" / "clean-low" / "run.json").exists()


def test_no_shared_pixel_subset_matches_brute_force_box_intersection():
    from shortcutlab.data.audit import side_codes
    from shortcutlab.studies.demo import _crops_from_synth, _no_shared_pixels
    from shortcutlab.data.splits import factorial_split
    from shortcutlab.synth import SynthConfig, synthesize

    crops = _crops_from_synth(synthesize(SynthConfig(seed=2, fields_per_class=15, crop_size=16, mechanisms="none")))
    table = crops.table
    split = factorial_split(table, seed=2, test_parent_share=0.3, diversity_contrast=1.43)
    subsets = _no_shared_pixels(table, split)
    boxes, parents, ids = table.boxes, table.parent_codes, table.ids.astype(str)
    for level in ("high", "low"):
        side = side_codes(table, split.cell(f"leak-{level}"))
        expected = set()
        for i in np.flatnonzero(side == 2):
            j = np.flatnonzero((side == 0) & (parents == parents[i]))
            x, y, w, h = boxes[i]
            hit = (boxes[j, 0] < x + w) & (x < boxes[j, 0] + boxes[j, 2]) & (boxes[j, 1] < y + h) & (y < boxes[j, 1] + boxes[j, 3])
            if not hit.any():
                expected.add(ids[i])
        assert subsets[level] == expected
        assert 0 < len(expected) < int((side == 2).sum())  # both kinds of test crop occur


def _fake_rows(mechanisms, seed, cfg, out_dir):
    """Rows of run_condition with hand-set accuracies (no training)."""
    name = "+".join(mechanisms)
    acc = {"color": {"leak-high": 0.75, "clean-high": 0.60, "leak-low": 0.70, "clean-low": 0.65},
           "none": {"leak-high": 0.50, "clean-high": 0.55, "leak-low": 0.62, "clean-low": 0.60}}[name]
    nsp = {"color": 0.05, "none": -0.01}[name]
    return [
        {"condition": name, "seed": seed, "cell": cell, "exposure": cell.split("-")[0], "diversity": cell.split("-")[1],
         "test_accuracy": a, "test_accuracy_no_shared_pixels": a + (nsp if cell.startswith("leak") else 0.0)}
        for cell, a in acc.items()
    ]


def test_effects_and_summary_match_hand_computed_values(tmp_path, monkeypatch):
    import shortcutlab.studies.demo as demo

    monkeypatch.setattr(demo, "run_condition", _fake_rows)
    summary = run_demo(str(tmp_path), DemoConfig(mechanisms=("color",), progress=False, report=False))
    effects = pd.read_csv(tmp_path / "effects.csv").set_index(["condition", "diversity"])
    # color: high 0.75 - 0.60, low 0.70 - 0.65; none: high 0.50 - 0.55, low 0.62 - 0.60
    assert effects.loc[("color", "high"), "leak_effect"] == pytest.approx(0.15)
    assert effects.loc[("color", "low"), "leak_effect"] == pytest.approx(0.05)
    assert effects.loc[("none", "high"), "leak_effect"] == pytest.approx(-0.05)
    assert effects.loc[("none", "low"), "leak_effect"] == pytest.approx(0.02)
    assert effects.loc[("color", "low"), "leak_effect_no_shared_pixels"] == pytest.approx(0.10)
    assert effects.loc[("none", "high"), "leak_effect_no_shared_pixels"] == pytest.approx(-0.06)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["mean_leak_effect_pp"] == {"color": 10.0, "none": -1.5}
    assert saved["mean_leak_effect_no_shared_pixels_pp"] == {"color": 15.0, "none": -2.5}
    assert saved["mean_test_accuracy"] == {"color": 0.675, "none": 0.5675}
    assert summary["mean_leak_effect_pp"] == saved["mean_leak_effect_pp"]


def test_a_failed_write_leaves_complete_tables_or_none(tmp_path, monkeypatch):
    import shortcutlab.studies.demo as demo

    monkeypatch.setattr(demo, "run_condition", _fake_rows)
    real = pd.DataFrame.to_csv
    calls = []

    def failing_to_csv(self, path, *args, **kw):
        calls.append(path)
        if len(calls) == fail_at:
            with open(path, "w") as f:
                f.write("condition,se")  # half a table, then the disk is full
            raise OSError(28, "No space left on device")
        return real(self, path, *args, **kw)

    monkeypatch.setattr(pd.DataFrame, "to_csv", failing_to_csv)
    # Writing results.csv after the second condition fails: the first condition's table stays.
    fail_at = 2
    with pytest.raises(OSError, match="No space left"):
        run_demo(str(tmp_path / "a"), DemoConfig(mechanisms=("color",), progress=False, report=False))
    kept = pd.read_csv(tmp_path / "a" / "results.csv")
    assert set(kept["condition"]) == {"color"} and len(kept) == 4
    assert sorted(os.listdir(tmp_path / "a")) == [".shortcutlab-output.json", "results.csv"]
    # Writing effects.csv fails: neither effects.csv nor summary.json appears.
    calls.clear()
    fail_at = 3
    with pytest.raises(OSError, match="No space left"):
        run_demo(str(tmp_path / "b"), DemoConfig(mechanisms=("color",), progress=False, report=False))
    assert sorted(os.listdir(tmp_path / "b")) == [".shortcutlab-output.json", "results.csv"]
    assert len(pd.read_csv(tmp_path / "b" / "results.csv")) == 8


def test_a_failed_summary_leaves_no_effects_table(tmp_path, monkeypatch):
    import shortcutlab.studies.demo as demo

    monkeypatch.setattr(demo, "run_condition", _fake_rows)

    def failing_write_json(path, obj, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(demo, "write_json", failing_write_json)
    with pytest.raises(OSError):
        run_demo(str(tmp_path), DemoConfig(mechanisms=("color",), progress=False, report=False))
    assert sorted(os.listdir(tmp_path)) == [".shortcutlab-output.json", "results.csv"]


def test_the_demo_sweep_trains_exactly_what_a_direct_train_call_trains(tmp_path):
    """The demo runs as a sweep (benchmark written to PNG and read back, split and training
    as tasks); one cell trained directly from the in-memory benchmark, as the demo used to,
    gives the same test accuracy and logits."""
    from shortcutlab.studies.demo import _crops_from_synth, run_condition
    from shortcutlab.models.recipe import TrainConfig, train
    from shortcutlab.data.splits import factorial_split
    from shortcutlab.synth import SynthConfig, synthesize

    # the same thread count as the direct call below: the logits' last digits depend on it
    cfg = DemoConfig(fields_per_class=8, epochs=1, crop_size=16, seeds=(3,), progress=False, interventions=(), diagnostics=(), report=False,
                     threads=torch.get_num_threads())
    rows = run_condition(("color",), 3, cfg, str(tmp_path / "demo"))
    bench = synthesize(SynthConfig(seed=3, n_classes=3, fields_per_class=8, mean_cells_per_field=6.0, crop_size=16, field_size=64,
                                   mechanisms=("color",), strength=1.0, class_signal=0.6))
    crops = _crops_from_synth(bench)
    split = factorial_split(crops.table, seed=3, test_parent_share=0.3, diversity_contrast=1.43)
    split.to_csv(str(tmp_path / "split.csv"))
    tcfg = TrainConfig(arch=cfg.arch, epochs=1, batch_size=64, lr=1e-3, precise_bn=True, seed=3)
    rec = train(crops, str(tmp_path / "split.csv"), str(tmp_path / "direct"), tcfg, cell="clean-low", progress=False)
    row = next(r for r in rows if r["cell"] == "clean-low")
    assert row["split_sha256"] == split.hash
    assert row["test_accuracy"] == rec.accuracy["test"] and row["n_test"] == rec.n_crops["test"]
    direct = pd.read_csv(tmp_path / "direct" / "logits.csv")
    swept = pd.read_csv(tmp_path / "demo" / "color_seed3" / "clean-low" / "logits.csv")
    pd.testing.assert_frame_equal(swept, direct)


@pytest.mark.slow
def test_the_quick_demo_path_ends_in_a_report_whose_numbers_match_the_predictions(tmp_path):
    """`demo --quick`'s code path on a smaller benchmark: per-factorial sweeps, the gathering
    sweep, the report. The report's leak and the demo's accuracies are recomputed by hand from
    the gathered predictions."""
    import html.parser

    cfg = DemoConfig.quick(fields_per_class=10, crop_size=16, epochs=1, seeds=(0, 1), progress=False, n_boot=200)
    summary = run_demo(str(tmp_path), cfg)
    html_path = tmp_path / "report" / "report.html"
    assert summary["report"] == str(html_path) and html_path.exists()
    html.parser.HTMLParser().feed(html_path.read_text())  # parses
    text = html_path.read_text()
    assert "Reinhard transfer to an unseen field" in text and text.count("data:image/png;base64,") >= 4
    pred = pd.read_parquet(tmp_path / "sweep" / "predictions.parquet")
    assert set(pred["condition"]) == {"color", "none"} and set(pred["seed"]) == {0, 1}
    assert set(pred["cell"]) == {"leak-high", "clean-high"}
    # every test crop of every model is scored under the unseen-field transfer
    per = pred.groupby(["model", "intervention"]).size().unstack()
    assert (per["reinhard_unseen_field"] == per["none"]).all()
    # results.csv (from the train tasks' logits) agrees with the score tasks' predictions
    results = pd.read_csv(tmp_path / "results.csv")
    plain = pred[pred["intervention"] == "none"]
    acc = plain.groupby(["condition", "seed", "cell"])["correct"].mean()
    for r in results.itertuples():
        assert r.test_accuracy == pytest.approx(acc[(r.condition, r.seed, r.cell)], abs=1e-12)
    # the report's leak estimate = mean correct of leak minus clean over all (seed, crop)
    est = pd.read_csv(tmp_path / "report" / "estimates.csv")
    for cond, g in plain.groupby("condition"):
        hand = g[g["exposure"] == "leak"]["correct"].mean() - g[g["exposure"] == "clean"]["correct"].mean()
        row = est[(est["estimand"] == "leak") & (est["condition"] == cond) & (est["arch"] == cfg.arch)
                  & (est["intervention"] == "none")]
        assert len(row) == 1 and row["estimate"].iloc[0] == pytest.approx(hand, abs=1e-12)


@pytest.mark.slow
def test_demo_quick_itself_shows_the_planted_leak_and_its_remover(tmp_path, capsys):
    """The README's first command, `shortcutlab demo --quick` (16 models; 1 min 24 s on 2
    shared cores, docs/demo.md):
    the colour leak's interval excludes zero, the unseen-field Reinhard transfer's cut of it
    is above zero, and under `none` the interval holds zero."""
    from shortcutlab.cli import main

    assert main(["demo", "--quick", "--out", str(tmp_path), "--quiet"]) == 0
    html_path = tmp_path / "report" / "report.html"
    assert f"report: {html_path}" in capsys.readouterr().out
    est = pd.read_csv(tmp_path / "report" / "estimates.csv")
    rows = est[(est["arch"] == DemoConfig.quick().arch) & (est["diversity"] == "high")].set_index(["estimand", "condition", "intervention"])
    assert rows.loc[("leak", "color", "none"), "ci_low"] > 0
    assert rows.loc[("leak_cut", "color", "reinhard_unseen_field"), "ci_low"] > 0
    assert rows.loc[("leak", "none", "none"), "ci_low"] < 0 < rows.loc[("leak", "none", "none"), "ci_high"]


def test_the_terminal_prints_the_reports_pooled_leak_and_interval(tmp_path):
    """A tiny demo with its report (3 seeds, the two high-diversity cells, 1 epoch): the lines
    `shortcutlab demo` prints (`summary_lines`) carry each condition's leak and interval as the
    report's estimates.csv holds them, with the same verdict; the pixel-free leak equals the one
    pooled by hand from results.csv (the train tasks' own logits); the audit card lists the two
    trained cells only."""
    import re

    from shortcutlab.studies.demo import summary_lines

    cfg = DemoConfig(mechanisms=("color",), fields_per_class=12, epochs=1, crop_size=16, seeds=(0, 1, 2),
                     cells=("leak-high", "clean-high"), interventions=(), diagnostics=(), progress=False, n_boot=200, threads=1)
    summary = run_demo(str(tmp_path), cfg)
    lines = summary_lines(summary)
    est = pd.read_csv(tmp_path / "report" / "estimates.csv")
    est = est[(est["estimand"] == "leak") & (est["intervention"] == "none") & (est["arch"] == cfg.arch)]
    pattern = re.compile(r"^  (\S+)\s+leak ([+-]\d+\.\d) pp \((?:95% CI ([+-]\d+\.\d) to ([+-]\d+\.\d) pp|no interval: [^)]*)\): "
                         r"(leak|no leak|negative leak|neither called a leak nor ruled out)$")
    printed = {m.group(1): m.groups()[1:] for m in map(pattern.match, lines) if m}
    assert set(printed) == {"color", "none"} == set(est["condition"])
    for r in est.itertuples():
        value, low, high, verdict = printed[r.condition]
        assert float(value) == pytest.approx(100 * r.estimate, abs=0.05 + 1e-9)
        if np.isnan(r.ci_low):      # 3 seeds give an interval unless the resamples do not vary (a degenerate 1-epoch model)
            assert low is None and verdict == "neither called a leak nor ruled out"
            continue
        assert [float(low), float(high)] == pytest.approx([100 * r.ci_low, 100 * r.ci_high], abs=0.05 + 1e-9)
        assert verdict == ("leak" if r.ci_low > 0 else "negative leak" if r.ci_high < 0 else "no leak")
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["estimates"] == summary["estimates"]
    # the pixel-free leak: leak minus clean accuracy over every (seed, pixel-free crop), from results.csv
    results = pd.read_csv(tmp_path / "results.csv")
    for row in saved["estimates"]:
        g = results[results["condition"] == row["condition"]]
        wide = g.pivot_table(index="seed", columns="exposure", values=["test_accuracy_no_shared_pixels", "n_test_no_shared_pixels"])
        n = wide[("n_test_no_shared_pixels", "leak")]
        diff = wide[("test_accuracy_no_shared_pixels", "leak")] - wide[("test_accuracy_no_shared_pixels", "clean")]
        assert row["pixel_free_leak_pp"] == pytest.approx(100 * (n * diff).sum() / n.sum(), abs=1e-9)
        assert row["pixel_free_n_crops"] == n.sum()
        assert any(line.strip().startswith("on the test crops sharing no pixel with a leak training crop: ") for line in lines)
    html = (tmp_path / "report" / "report.html").read_text()
    audit = html[html.index('<h2 id="audit">'):html.index("<h2 ", html.index('<h2 id="audit">') + 1)]
    assert audit.count("<td>leak-high</td>") == 2 and audit.count("<td>clean-high</td>") == 2
    assert "leak-low" not in audit and "clean-low" not in audit and "crop (factorial)" not in audit


def test_without_the_report_the_terminal_says_its_means_have_no_interval(tmp_path, monkeypatch):
    import shortcutlab.studies.demo as demo

    monkeypatch.setattr(demo, "run_condition", _fake_rows)
    summary = run_demo(str(tmp_path), DemoConfig(mechanisms=("color",), progress=False, report=False))
    lines = demo.summary_lines(summary)
    assert "estimates" not in summary and "no interval" in lines[0]
    # color: ((0.75 - 0.60) + (0.70 - 0.65)) / 2 = +10.0 pp, pixel-free +15.0; none: -1.5, -2.5 (hand, as above)
    assert lines[1].split() == ["color", "+10.0", "pp;", "on", "test", "crops", "sharing", "no", "pixel", "with", "a", "leak",
                                "training", "crop", "+15.0", "pp"]
    assert lines[2].split()[:2] == ["none", "-1.5"] and lines[2].split()[-2:] == ["-2.5", "pp"]
