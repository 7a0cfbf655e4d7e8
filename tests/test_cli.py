"""The command line as a user runs it: audit, split, verify on CRIC and on generated tables."""

import json

import pytest

from shortcutlab.cli import main
from shortcutlab.random_tables import random_table
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


def test_console_script_is_installed():
    import shutil
    import subprocess

    exe = shutil.which("shortcutlab")
    assert exe, "the shortcutlab console script is not on PATH; install the package with pip install -e ."
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("shortcutlab ")
