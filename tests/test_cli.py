"""The command line as a user runs it: audit, split, verify on CRIC and on generated tables."""

import json

import pytest

from shortcutlab.cli import main
from shortcutlab.data.random_tables import random_table
from conftest import CRIC

CRIC_ARGS = [CRIC, "--parent", "image_id", "--label", "bethesda_system", "--id", "cell_id"]
GEOMETRY = ["--center", "nucleus_x,nucleus_y", "--crop-size", "100"]


def test_audit_prints_and_writes_json_and_card(tmp_path, capsys):
    out = tmp_path / "a.json"
    assert main(["audit", *CRIC_ARGS, *GEOMETRY, "--json", str(out), "--card", str(tmp_path / "c.md")]) == 0
    printed = capsys.readouterr().out
    assert "sibling share" in printed and "pixel overlap" in printed
    r = json.loads(out.read_text())
    for key in ("n_crops", "n_parents", "n_classes", "sibling_share", "exposure", "diversity_ratio", "pixel_overlap"):
        assert key in r
    assert (r["n_crops"], r["n_parents"], r["n_classes"]) == (11534, 400, 6)
    assert "measured" not in r
    assert "Evaluation reporting card" in (tmp_path / "c.md").read_text()


def test_audit_without_geometry_reports_null_pixel_overlap(tmp_path):
    out = tmp_path / "a.json"
    assert main(["audit", *CRIC_ARGS, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["pixel_overlap"] is None


@pytest.mark.parametrize("protocol", ["crop", "parent", "factorial", "ladder"])
def test_split_verify_and_audit_on_cric(tmp_path, capsys, protocol):
    man = tmp_path / f"{protocol}.csv"
    extra = ["--allocation", "proportional"] if protocol == "factorial" else []
    assert main(["split", *CRIC_ARGS, *GEOMETRY, "--protocol", protocol, "--seed", "3", "--out", str(man), *extra]) == 0
    digest = capsys.readouterr().out.strip().splitlines()[-1].split()[-1]
    assert len(digest) == 64
    assert main(["verify", str(man), "--hash", digest]) == 0
    assert main(["verify", str(man), "--hash", "f" * 64]) == 1
    assert main(["verify", str(man)]) == 0  # against the sidecar
    out = tmp_path / "a.json"
    assert main(["audit", *CRIC_ARGS, *GEOMETRY, "--split", str(man), "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["split"]["sha256"] == digest and r["split"]["protocol"] == protocol
    measured = r["measured"]
    if protocol == "parent":
        assert measured["test"]["with_train_sibling"] == 0.0 and measured["parents_crossing"] == 0
    if protocol == "crop":
        assert measured["test"]["with_train_sibling"] > 0.99
    if protocol in ("factorial", "ladder"):
        assert len(measured) in (4, 5)


def test_split_with_group_and_dedup_on_generated_table(tmp_path, capsys):
    df = random_table(80, 4, 3, parents_per_group=4, geometry=True, seed=0)
    df["phash"] = [f"{(i // 2) * 0x9E3779B97F4A7C15 % 2**64:016x}" for i in range(len(df))]  # crop pairs share a hash
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    args = [str(path), "--parent", "parent", "--label", "label", "--id", "id", "--group", "patient", "--box", "x,y,w,h"]
    man = tmp_path / "m.csv"
    assert main(["split", *args, "--protocol", "parent-dedup", "--hash-column", "phash", "--max-distance", "0", "--out", str(man)]) == 0
    printed = capsys.readouterr().out
    assert "parents_after_merge" in printed
    meta = json.loads((tmp_path / "m.json").read_text())["report"]
    # Crops 2i and 2i+1 share a hash: parents linked across patients merge those patients too.
    assert meta["parents_after_merge"] < 80 and meta["groups_after_merge"] < meta["groups_before_merge"] == 20
    out = tmp_path / "a.json"
    assert main(["audit", *args, "--split", str(man), "--json", str(out), "--card", str(tmp_path / "c.md")]) == 0
    r = json.loads(out.read_text())
    assert r["measured"]["groups_crossing"] == 0 and r["measured"]["parents_crossing"] == 0
    assert r["split"]["params"]["unit"] == "group"
    card = (tmp_path / "c.md").read_text()
    assert "Near-duplicate merging before the split: yes" in card and "Split unit: group" in card


def test_errors_are_reported_not_raised(tmp_path, capsys):
    assert main(["audit", CRIC, "--parent", "slide", "--label", "bethesda_system"]) == 2
    err = capsys.readouterr().err
    assert "parent column 'slide' is missing" in err and "image_id" in err
    assert main(["split", *CRIC_ARGS, "--protocol", "parent", "--test-fraction", "1.5", "--out", str(tmp_path / "m.csv")]) == 2
    assert "strictly between 0 and 1" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "none.csv"), "--hash", "ab"]) == 2
    with pytest.raises(SystemExit):
        main(["split", *CRIC_ARGS, "--protocol", "nope", "--out", "x.csv"])


def test_python_m_runs_the_command_line_of_this_checkout(tmp_path):
    """Through a real process, independent of PATH and of which copy pip installed."""
    import os
    import subprocess
    import sys
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    for module in ("shortcutlab", "shortcutlab.cli"):
        out = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, cwd=tmp_path, env=env)
        assert out.returncode == 0 and out.stdout == f"shortcutlab {project['version']}\n", out
    # A bad option value: exit 2, one line, no traceback, from the process itself.
    df = random_table(6, 3, 2, geometry=False, seed=0)
    df.to_csv(tmp_path / "t.csv", index=False)
    argv = ["t.csv", "--parent", "parent", "--label", "label", "--protocol", "ladder", "--levels", "0,abc", "--out", "m.csv"]
    out = subprocess.run([sys.executable, "-m", "shortcutlab", "split", *argv], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("shortcutlab split: error: ") and "'abc'" in out.stderr and out.stderr.count("\n") == 1
    assert not (tmp_path / "m.csv").exists()
    # The console script that pip installs calls this same function.
    module, _, func = project["scripts"]["shortcutlab"].partition(":")
    assert (module, func) == ("shortcutlab.cli", "main") and callable(main)


def test_audit_writes_json_and_card_together_or_neither(tmp_path, monkeypatch):
    import shortcutlab.data.card

    df = random_table(30, 3, 2, geometry=False, seed=1)
    df.to_csv(tmp_path / "t.csv", index=False)
    args = ["audit", str(tmp_path / "t.csv"), "--parent", "parent", "--label", "label", "--id", "id"]
    js, card = tmp_path / "a.json", tmp_path / "c.md"
    js.write_text("earlier figures")
    # The card fails while it is written (a character UTF-8 cannot hold stands in for a full disk).
    monkeypatch.setattr(shortcutlab.data.card, "reporting_card", lambda result: "# card\n" + "\ud800")
    with pytest.raises(UnicodeEncodeError):
        main([*args, "--json", str(js), "--card", str(card)])
    assert js.read_text() == "earlier figures" and not card.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "t.csv"]  # no temporary file left
    monkeypatch.undo()
    assert main([*args, "--json", str(js), "--card", str(card)]) == 0
    assert json.loads(js.read_text())["n_crops"] == len(df) and card.read_text().startswith("#")


def test_audit_reports_table_crops_missing_from_the_split(tmp_path, capsys):
    from shortcutlab.cli import _print_audit

    df = random_table(30, 3, 2, geometry=False, seed=2)
    df.to_csv(tmp_path / "t.csv", index=False)
    args = [str(tmp_path / "t.csv"), "--parent", "parent", "--label", "label", "--id", "id"]
    man = tmp_path / "m.csv"
    assert main(["split", *args, "--protocol", "parent", "--out", str(man)]) == 0
    rows = man.read_text().splitlines()
    man.write_text("\n".join(rows[:-7]) + "\n")  # the manifest loses 7 crops of the table
    capsys.readouterr()
    assert main(["audit", *args, "--split", str(man)]) == 0
    assert "table crops not in this split: 7" in capsys.readouterr().out
    # A count about the whole manifest, at the top or beside the cells, is printed too.
    result = {
        "source": "t", "n_crops": 3, "n_parents": 2, "n_groups": None, "n_classes": 1, "test_fraction": 0.2,
        "sibling_share": 0.5, "exposure": 0.5, "diversity_ratio": 1.0, "pixel_overlap": None, "overlap_share": None,
        "n_unassigned": 4, "split": {"protocol": "factorial", "sha256": "ab" * 32},
        "measured": {"n_unassigned": 4, "leak": {"n_unassigned": 1, "parents_crossing": 0, "groups_crossing": None}},
    }
    _print_audit(result)
    out = capsys.readouterr().out
    assert "table crops missing from the manifest: 4" in out and "cell leak" in out and "not in this cell: 1" in out


def test_a_file_system_failure_after_the_checks_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    import errno

    from shortcutlab.data.manifest import SplitManifest

    def disk_full(self, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(SplitManifest, "to_csv", disk_full)
    df = random_table(10, 3, 2, geometry=False, seed=3)
    df.to_csv(tmp_path / "t.csv", index=False)
    out = tmp_path / "m.csv"
    assert main(["split", str(tmp_path / "t.csv"), "--parent", "parent", "--label", "label", "--protocol", "crop", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"shortcutlab split: error: No space left on device: {str(out)!r}\n"


def test_a_closed_output_pipe_is_not_reported_as_an_error(tmp_path, capsys, monkeypatch):
    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    df = random_table(10, 3, 2, geometry=False, seed=4)
    df.to_csv(tmp_path / "t.csv", index=False)
    monkeypatch.setattr("sys.stdout", ClosedPipe())  # `shortcutlab audit ... | head -0`
    assert main(["audit", str(tmp_path / "t.csv"), "--parent", "parent", "--label", "label"]) == 1
    assert capsys.readouterr().err == ""


def test_a_parquet_table_splits_and_audits_as_its_csv(tmp_path, capsys):
    """CRIC written as Parquet: `split` gives the manifest hash of the CSV table, and `audit`
    the same figures."""
    import pandas as pd

    pq = tmp_path / "cric.parquet"
    pd.read_csv(CRIC).to_parquet(pq)
    args = {"csv": CRIC_ARGS, "parquet": [str(pq), *CRIC_ARGS[1:]]}
    digests, audits = {}, {}
    for kind, table_args in args.items():
        assert main(["split", *table_args, *GEOMETRY, "--protocol", "parent", "--seed", "1", "--out", str(tmp_path / f"{kind}.csv")]) == 0
        digests[kind] = capsys.readouterr().out.strip().splitlines()[-1].split()[-1]
        assert main(["audit", *table_args, *GEOMETRY, "--json", str(tmp_path / f"{kind}.json")]) == 0
        audits[kind] = json.loads((tmp_path / f"{kind}.json").read_text())
    assert digests["csv"] == digests["parquet"] and len(digests["csv"]) == 64
    assert audits["csv"]["n_crops"] == audits["parquet"]["n_crops"] == 11534
    for key in ("sibling_share", "exposure", "diversity_ratio", "pixel_overlap"):
        assert audits["csv"][key] == audits["parquet"][key], key
