"""Registration (issue 23, item 5): `shortcutlab register` hashes what a sweep fixes before any
model is trained; `sweep --registration` refuses any difference, naming it; `results` and the
report state whether every result matched its registered split hash.

The hashes are checked against hashlib on the files the sweep itself wrote, not against the
code that computed them; the refusals change one thing at a time in the config (a split
parameter, the seed list, the analysis' n_boot), in a split manifest already on disk (one
byte) or in the registered code version.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
import yaml

from shortcutlab.cli import main

TINY = {
    "data": {"synthetic": {"mechanisms": ["color"], "fields_per_class": 8, "crop_size": 16, "field_size": 64,
                           "class_signal": 0.6}},
    "split": {"protocol": "factorial", "params": {"test_parent_share": 0.3}},
    "seeds": [0, 1],
    "models": [{"arch": "test_resnet", "epochs": 1, "lr": 0.001, "batch_size": 32}],
    "cells": ["leak-high", "clean-high"],
    "interventions": {"names": ["greyscale"]},
    "diagnostics": "none",
    "analysis": {"n_boot": 200, "seed": 3},
}


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _write(folder, cfg: dict, name: str = "sweep.yaml") -> str:
    path = os.path.join(str(folder), name)
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return path


def _error(argv: list[str], capsys) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, (rc, err)
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A tiny config (examples/sweep_minimal.yaml shrunk), registered, then swept with the
    registration: (folder, config path, registration path, sweep folder)."""
    root = tmp_path_factory.mktemp("registered")
    config = _write(root, TINY)
    reg = str(root / "registration.json")
    assert main(["register", config, "--out", reg]) == 0
    out = str(root / "sweep")
    assert main(["sweep", config, "--out", out, "--registration", reg, "--quiet"]) == 0
    return root, config, reg, out


def test_register_then_sweep_passes_and_the_folder_keeps_the_registration(registered):
    root, config, reg, out = registered
    assert open(os.path.join(out, "registration.json"), "rb").read() == open(reg, "rb").read()
    meta = json.load(open(os.path.join(out, "sweep.json")))
    assert meta["registration"]["sha256"] == _sha(reg)
    rec = json.load(open(reg))
    assert rec["config"]["file_sha256"] == _sha(config)
    assert rec["analysis"]["settings"]["n_boot"] == 200 and rec["analysis"]["settings"]["seed"] == 3
    # the design: one synthesise and one split per seed, a train, a score per seed and cell
    assert rec["design"]["counts"] == {"synthesise": 2, "split": 2, "train": 4, "score": 4}
    tasks = {t["id"] for t in meta["tasks"]}
    assert {i for ids in rec["design"]["ids"].values() for i in ids} == tasks


def test_registered_manifest_hashes_are_the_sha256_of_the_files_the_sweep_wrote(registered):
    root, config, reg, out = registered
    rec = json.load(open(reg))
    splits = json.load(open(os.path.join(out, "splits.json")))
    assert len(rec["splits"]) == len(splits) == 2
    by_id = {s["split"]: s for s in rec["splits"]}
    for s in splits:
        path = os.path.join(out, "tasks", "split", s["split"], "split.csv")
        assert by_id[s["split"]]["sha256"] == hashlib.sha256(open(path, "rb").read()).hexdigest()
        assert by_id[s["split"]]["content_sha256"] == s["sha256"]  # the sweep's own record of the split
        assert (by_id[s["split"]]["seed"], by_id[s["split"]]["protocol"]) == (s["seed"], "factorial")
    # the two seeds' manifests differ: each is hashed, not one twice
    assert len({s["sha256"] for s in rec["splits"]}) == 2


def test_a_changed_split_parameter_is_refused_before_anything_is_written(registered, tmp_path, capsys):
    root, config, reg, out = registered
    cfg = json.loads(json.dumps(TINY))
    cfg["split"]["params"]["test_parent_share"] = 0.4
    new = tmp_path / "new"
    line = _error(["sweep", _write(tmp_path, cfg), "--out", str(new), "--registration", reg, "--quiet"], capsys)
    assert "split manifest condition=color seed=0 protocol=factorial differs from the registration" in line
    assert "split.params[0].test_parent_share: 0.3 registered, 0.4 now" in line
    assert not new.exists()


def test_a_changed_seed_list_is_refused_naming_the_new_split(registered, tmp_path, capsys):
    root, config, reg, out = registered
    line = _error(["sweep", _write(tmp_path, dict(TINY, seeds=[0, 1, 2])), "--out", str(tmp_path / "new"),
                   "--registration", reg, "--quiet"], capsys)
    assert "split manifest condition=color seed=2 protocol=factorial is not in the registration" in line
    assert "seeds" in line and "the design table differs (6 planned task(s) not registered" in line
    assert not (tmp_path / "new").exists()


def test_a_changed_analysis_n_boot_is_refused(registered, tmp_path, capsys):
    root, config, reg, out = registered
    cfg = dict(TINY, analysis={"n_boot": 300, "seed": 3})
    line = _error(["sweep", _write(tmp_path, cfg), "--out", str(tmp_path / "new"), "--registration", reg, "--quiet"], capsys)
    assert "analysis.n_boot differs: 200 registered, 300 now" in line
    assert "split manifest" not in line  # the splits are the same
    assert not (tmp_path / "new").exists()


def test_a_changed_byte_of_a_manifest_on_disk_is_refused(registered, tmp_path, capsys):
    root, config, reg, out = registered
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    split = json.load(open(os.path.join(copy, "splits.json")))[1]
    path = os.path.join(copy, "tasks", "split", split["split"], "split.csv")
    data = bytearray(open(path, "rb").read())
    before = hashlib.sha256(data).hexdigest()
    i = data.index(b",train") + 1
    data[i] = ord("T")  # one byte: 'train' -> 'Train' on one row
    open(path, "wb").write(bytes(data))
    after = hashlib.sha256(bytes(data)).hexdigest()
    listing = sorted(os.listdir(copy))
    config_bytes = open(os.path.join(copy, "sweep.json"), "rb").read()
    line = _error(["sweep", config, "--out", copy, "--registration", reg, "--quiet"], capsys)
    assert (f"split manifest condition=color seed={split['seed']} protocol=factorial differs from the registration: "
            f"sha256 {before[:12]}... registered, {after[:12]}... now") in line
    assert "seed=0" not in line  # the other manifest is untouched
    assert sorted(os.listdir(copy)) == listing and open(os.path.join(copy, "sweep.json"), "rb").read() == config_bytes


def test_a_changed_code_version_is_refused(registered, tmp_path, capsys):
    root, config, reg, out = registered
    rec = json.load(open(reg))
    rec["code"]["source"]["sha256"] = "0" * 64
    other = tmp_path / "reg.json"
    other.write_text(json.dumps(rec))
    line = _error(["sweep", config, "--out", str(tmp_path / "new"), "--registration", str(other), "--quiet"], capsys)
    assert "code version differs" in line and "000000000000... registered" in line
    assert "split manifest" not in line and "analysis" not in line


def test_a_comment_in_the_config_is_a_difference_of_its_bytes_only(registered, tmp_path, capsys):
    root, config, reg, out = registered
    edited = tmp_path / "sweep.yaml"
    edited.write_text(open(config).read() + "# a comment\n")
    line = _error(["sweep", str(edited), "--out", str(tmp_path / "new"), "--registration", reg, "--quiet"], capsys)
    assert "the config file's bytes differ" in line and "the resolved config is the same" in line
    assert "1 point(s)" in line


def test_results_state_that_every_result_matched_and_use_the_configs_analysis(registered, capsys):
    root, config, reg, out = registered
    assert main(["results", out]) == 0
    text = capsys.readouterr().out
    assert f"Registration {_sha(reg)[:12]}...: every result matched its registered split hash (2 split(s), 4 model(s))." in text
    assert "200 resamples, seed 3, settings from the config's analysis section" in text
    assert main(["results", out, "--n-boot", "50"]) == 0  # a flag overrides the config
    assert "50 resamples, seed 3" in capsys.readouterr().out


def test_results_list_a_split_whose_hash_differs_and_say_not_registered_without_one(registered, tmp_path, capsys):
    root, config, reg, out = registered
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    splits = json.load(open(os.path.join(copy, "splits.json")))
    registered_sha = splits[0]["sha256"]
    splits[0]["sha256"] = "f" * 64
    with open(os.path.join(copy, "splits.json"), "w") as f:
        json.dump(splits, f)
    assert main(["results", copy]) == 0
    text = capsys.readouterr().out
    assert (f"not every result matched its registered split hash (2 split(s), 4 model(s)); 1 differ: split condition=color "
            f"seed={splits[0]['seed']} protocol=factorial (sha256 {registered_sha[:12]}... registered, ffffffffffff... now)") in text
    os.remove(os.path.join(copy, "registration.json"))
    assert main(["results", copy]) == 0
    assert "Registration: not registered" in capsys.readouterr().out


def test_results_list_a_model_whose_rows_carry_another_split_hash(registered, tmp_path, capsys):
    import pandas as pd

    root, config, reg, out = registered
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    path = os.path.join(copy, "predictions.parquet")
    pred = pd.read_parquet(path)
    model = sorted(pred["model"].unique())[0]
    seed = int(pred.loc[pred["model"] == model, "seed"].iloc[0])
    registered_sha = pred.loc[pred["model"] == model, "split_sha256"].iloc[0]
    pred.loc[pred["model"] == model, "split_sha256"] = "e" * 64
    pred.to_parquet(path, index=False)
    assert main(["results", copy]) == 0
    text = capsys.readouterr().out
    assert (f"not every result matched its registered split hash (2 split(s), 4 model(s)); 1 differ: model {model} (seed {seed}: sha256 "
            f"{registered_sha[:12]}... registered, eeeeeeeeeeee... in its rows)") in text


def test_the_report_states_the_registration_and_uses_the_configs_analysis(registered, tmp_path, capsys):
    import pandas as pd

    root, config, reg, out = registered
    report = tmp_path / "report"
    assert main(["report", out, "--no-examples", "--out", str(report)]) == 0
    md = (report / "report.md").read_text(encoding="utf-8")
    assert "every result matched its registered split hash (2 split(s), 4 model(s))" in md
    assert "(200 resamples, seed 3)" in md and "The estimates use the config's analysis section" in md
    assert "every result matched its registered split hash" in (report / "report.html").read_text(encoding="utf-8")
    est = pd.read_csv(report / "estimates.csv")
    # two seeds: no interval, so no resample is counted (issue 23); the intro names the config's 200
    assert (est["n_boot"] == 0).all() and est["reason"].str.contains("fewer than 3").any()


def test_a_dry_run_checks_the_registration_and_writes_nothing(registered, tmp_path, capsys):
    root, config, reg, out = registered
    new = tmp_path / "new"
    assert main(["sweep", config, "--out", str(new), "--registration", reg, "--dry-run"]) == 0
    assert "the sweep matches its registration" in capsys.readouterr().out and not new.exists()
    line = _error(["sweep", _write(tmp_path, dict(TINY, seeds=[0])), "--out", str(new), "--registration", reg, "--dry-run"], capsys)
    assert "1 registered split manifest(s) are no longer planned (first: condition=color seed=1 protocol=factorial)" in line
    assert not new.exists()


def test_a_sweep_resumed_without_its_registration_is_no_longer_registered(registered, tmp_path, capsys):
    root, config, reg, out = registered
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    assert main(["sweep", config, "--out", copy, "--quiet"]) == 0
    assert not os.path.exists(os.path.join(copy, "registration.json"))
    assert "registration" not in json.load(open(os.path.join(copy, "sweep.json")))
    capsys.readouterr()
    assert main(["results", copy]) == 0
    assert "not registered" in capsys.readouterr().out


# --- the analysis: mapping and the code hash, without a sweep -------------------------------
def test_the_analysis_mapping_changes_no_task_id():
    from shortcutlab.sweep.config import validate
    from shortcutlab.sweep.plan import build_plan

    bare = {k: v for k, v in TINY.items() if k != "analysis"}
    full = dict(bare, analysis={"n_boot": 5, "seed": 9, "level": 0.9, "interval": "cgm", "alpha": 0.01,
                                "families": {"primary": ["H1"], "secondary": ["H2", "H3"]}, "estimands": ["leak"]})
    ids = [[t.id for t in build_plan(validate(c)).graph.ordered()] for c in (bare, full)]
    assert ids[0] == ids[1] and len(ids[0]) == 12
    cfg = validate(full)
    assert cfg.analysis["families"] == {"primary": ["H1"], "secondary": ["H2", "H3"]}
    assert "analysis" not in validate(bare).to_dict() and cfg.to_dict()["analysis"]["interval"] == "cgm"


def test_source_tree_hash_is_the_documented_hash_of_the_py_files(tmp_path):
    from shortcutlab.sweep.registration import source_tree_hash

    pkg = tmp_path / "pkg"
    (pkg / "sub" / "__pycache__").mkdir(parents=True)
    (pkg / "a.py").write_bytes(b"x = 1\n")
    (pkg / "sub" / "b.py").write_bytes(b"y = 2\n")
    (pkg / "sub" / "__pycache__" / "b.cpython.py").write_bytes(b"ignored")
    (pkg / "notes.txt").write_bytes(b"ignored")
    lines = sorted(f"pkg/{rel}\t{hashlib.sha256(data).hexdigest()}\n" for rel, data in (("a.py", b"x = 1\n"), ("sub/b.py", b"y = 2\n")))
    expected = hashlib.sha256("".join(lines).encode()).hexdigest()
    assert source_tree_hash({"pkg": str(pkg)}) == {"sha256": expected, "n_files": 2}
    (pkg / "sub" / "b.py").write_bytes(b"y = 3\n")
    assert source_tree_hash({"pkg": str(pkg)})["sha256"] != expected


def test_the_config_interval_method_and_estimands_reach_the_estimates():
    """analysis.interval picks the method of every row (its `interval_method`), and only the
    registered estimands' rows are kept."""
    from shortcutlab.stats import simulate_factorial
    from shortcutlab.stats.estimands import estimates
    from shortcutlab.sweep.registration import estimates_options, keep_estimands

    pred = simulate_factorial(n_seeds=4, n_parents=20, effect=0.1, seed=3)
    for method in ("pigeonhole", "cgm"):
        settings = {"n_boot": 100, "seed": 1, "level": 0.9, "alpha": 0.1, "interval": method, "estimands": ["leak"]}
        table = keep_estimands(estimates(pred, **estimates_options(settings)), settings)
        assert set(table["estimand"]) == {"leak"} and set(table["interval_method"]) == {method}
        assert set(table["n_boot"]) == {100}


def test_family_labels_are_checked_by_the_statistics_and_their_families_are_the_default():
    """A family label the statistics do not know is a config error at its key path; the
    registered default families are the paper's (reference 000: H1 alone, H2-H5, F1-F8); a
    label the config's `hypotheses` names may stand in a family."""
    from shortcutlab.sweep.config import SweepConfigError, validate
    from shortcutlab.sweep.registration import analysis_settings

    bare = {k: v for k, v in TINY.items() if k != "analysis"}
    with pytest.raises(SweepConfigError, match=r"analysis\.families: unknown hypothesis label\(s\) 'H9'"):
        validate(dict(bare, analysis={"families": {"primary": ["H1"], "other": ["H9"]}}))
    assert analysis_settings(validate(bare))["families"] == {
        "primary": ["H1"], "study": ["H2", "H3", "H4", "H5"], "follow_up": [f"F{i}" for i in range(1, 9)]}
    given = {"a": ["H1", "H2"], "b": ["H3"]}
    assert analysis_settings(validate(dict(bare, analysis={"families": given})))["families"] == given
    own = {"hypotheses": {"G1": {"estimand": "leak_pooled"}}, "families": {"mine": ["G1"]}}
    assert validate(dict(bare, analysis=own)).analysis["hypotheses"] == {"G1": {"estimand": "leak_pooled"}}
    with pytest.raises(SweepConfigError, match=r"analysis\.hypotheses\.G1: unknown column\(s\) 'estimator'"):
        validate(dict(bare, analysis={"hypotheses": {"G1": {"estimator": "leak"}}}))


def test_the_config_hypotheses_name_the_rows_of_the_estimates(tmp_path):
    """`analysis.hypotheses` reaches `estimates`: the row it selects carries the label and is
    Holm-adjusted in the family the config gives it (here alone: p_holm equals p)."""
    from shortcutlab.stats import simulate_factorial
    from shortcutlab.stats.estimands import estimates
    from shortcutlab.sweep.registration import estimates_options

    pred = simulate_factorial(n_seeds=4, n_parents=20, effect=0.1, seed=3)
    settings = {"n_boot": 200, "seed": 0, "level": 0.95, "alpha": 0.05, "families": {"mine": ["G1"]},
                "hypotheses": {"G1": {"estimand": "leak", "intervention": "none"}}}
    table = estimates(pred, **estimates_options(settings))
    g1 = table[table["hypothesis"] == "G1"]
    leak = table[(table["estimand"] == "leak") & (table["intervention"] == "none")]
    assert len(g1) == len(leak) == 1 and set(g1["family"]) == {"mine"}
    assert g1["p_holm"].iloc[0] == pytest.approx(g1["p_value"].iloc[0])  # alone in its family
    assert set(table["hypothesis"].dropna()) - {""} == {"G1"}
