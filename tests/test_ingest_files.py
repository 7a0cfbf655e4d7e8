"""`shortcutlab table` / `shortcutlab.ingest.files`: a crop table from a released folder.

Each test generates a folder whose truth it knows (labels, parents, sizes, pixels, the files
that must not match) and checks the table against that truth, not against the code.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from shortcutlab.cli import main
from shortcutlab.data.images import load_crops
from shortcutlab.data.table import CropTable
from shortcutlab.ingest.files import compile_pattern, summary_path, table_from_files, write_file_table

SIPAKMED = "im_{label}/CROPPED/{parent}_{*}.bmp"


def _save(path, w: int, h: int, seed: int) -> np.ndarray:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)
    return arr


def _sipakmed(root) -> tuple[dict, list[str]]:
    """SIPaKMeD's layout: im_<Class>/<field>.bmp full fields (not crops), im_<Class>/CROPPED/
    <field>_<n>.bmp crops and <field>_cyt<n>.dat outlines. Field numbers are unique across
    classes here except '009', shared by two classes. Returns the truth per crop id and the
    files that must not match."""
    truth, others, seed = {}, [], 0
    fields = {"Dyskeratotic": ["001", "002", "009"], "Parabasal": ["003", "009"], "Koilocytotic": ["004"]}
    for cls, names in fields.items():
        for field in names:
            seed += 1
            _save(os.path.join(root, f"im_{cls}", f"{field}.bmp"), 64, 48, seed)
            others.append(f"im_{cls}/{field}.bmp")
            for n in range(1, 2 + seed % 3):
                w, h = 10 + seed, 12 + n
                rel = f"im_{cls}/CROPPED/{field}_{n:02d}.bmp"
                _save(os.path.join(root, rel), w, h, 100 + seed * 10 + n)
                truth[rel[:-4]] = {"label": cls, "parent": field, "w": w, "h": h, "file": rel}
                dat = f"im_{cls}/CROPPED/{field}_cyt{n:02d}.dat"
                with open(os.path.join(root, dat), "w") as f:
                    f.write("1,2\n")
                others.append(dat)
    return truth, sorted(others)


def _patients(root) -> tuple[dict, dict]:
    """A '{patient}/{parent}/{id}.png' layout of equal-size crops; truth and pixels per id."""
    truth, pixels, seed = {}, {}, 0
    for patient, parents in {"P1": ["s1", "s2"], "P2": ["s3"]}.items():
        for parent in parents:
            for k in range(3):
                seed += 1
                cid = f"c{seed:03d}"
                pixels[cid] = _save(os.path.join(root, patient, parent, f"{cid}.png"), 16, 16, seed)
                truth[cid] = {"patient": patient, "parent": parent, "w": 16, "h": 16}
    return truth, pixels


def test_sipakmed_layout_against_the_generated_truth(tmp_path) -> None:
    truth, others = _sipakmed(tmp_path / "SIPaKMeD")
    frame, report = table_from_files(tmp_path / "SIPaKMeD", SIPAKMED)
    assert list(frame.columns) == ["id", "path", "label", "parent", "w", "h"]
    assert sorted(frame["id"]) == sorted(truth) and list(frame["id"]) == sorted(truth)
    for row in frame.itertuples():
        t = truth[row.id]
        assert (row.label, row.parent, row.w, row.h, row.path) == (t["label"], t["parent"], t["w"], t["h"], t["file"])
    assert report["n_files"] == len(truth) + len(others)
    assert report["n_matched"] == len(truth) and report["n_unmatched"] == len(others)
    assert report["unmatched_first"] == others[:5]
    assert report["n_parents"] == len({t["parent"] for t in truth.values()})
    assert report["parents_with_several_labels_first"] == ["009"]
    assert report["classes"] == {c: sum(t["label"] == c for t in truth.values()) for c in ("Dyskeratotic", "Koilocytotic", "Parabasal")}


def test_patient_layout_keeps_named_fields_and_ids(tmp_path) -> None:
    truth, _ = _patients(tmp_path / "rel")
    labels = tmp_path / "labels.csv"
    pd.DataFrame({"id": sorted(truth), "label": [f"k{i % 2}" for i in range(len(truth))]}).to_csv(labels, index=False)
    frame, report = table_from_files(tmp_path / "rel", "{patient}/{parent}/{id}.png", labels=labels)
    assert list(frame.columns) == ["id", "path", "label", "parent", "patient", "w", "h"]
    for i, row in enumerate(frame.itertuples()):
        t = truth[row.id]
        assert (row.patient, row.parent, row.w, row.h) == (t["patient"], t["parent"], 16, 16)
        assert row.path == f"{t['patient']}/{t['parent']}/{row.id}.png"
        assert row.label == f"k{sorted(truth).index(row.id) % 2}"
    assert report["n_unmatched"] == 0 and report["fields"] == ["patient", "parent", "id"]


def test_written_table_loads_with_its_images_and_audits(tmp_path, capsys) -> None:
    truth, pixels = _patients(tmp_path / "data" / "rel")
    labels = tmp_path / "labels.csv"
    pd.DataFrame({"file": [f"{t['patient']}/{t['parent']}/{c}.png" for c, t in truth.items()],
                  "label": ["ab"[i % 2] for i in range(len(truth))]}).to_csv(labels, index=False)
    out = tmp_path / "tables" / "t.csv"
    rc = main(["table", str(tmp_path / "data" / "rel"), "--pattern", "{patient}/{parent}/{id}.png",
               "--labels", str(labels), "--out", str(out)])
    assert rc == 0
    table = CropTable.from_csv(out, id="id", image="path", group="patient")
    assert table.n_crops == len(truth) and table.n_parents == 3 and table.n_groups == 2
    crops = load_crops(table)
    for i, cid in enumerate(table.ids):
        assert np.array_equal(crops.images[i].permute(1, 2, 0).numpy(), pixels[cid])
    side = json.loads(open(summary_path(out)).read())
    assert side["n_crops"] == len(truth) and side["n_unmatched"] == 0 and side["table"] == str(out)
    capsys.readouterr()
    js = tmp_path / "audit.json"
    assert main(["audit", str(out), "--id", "id", "--label", "label", "--parent", "parent", "--image", "path",
                 "--json", str(js)]) == 0
    audit = json.loads(js.read_text())
    assert audit["n_crops"] == len(truth) and audit["n_parents"] == 3


def test_cli_prints_the_summary_and_lists_unmatched_files(tmp_path, capsys) -> None:
    truth, others = _sipakmed(tmp_path / "S")
    out = tmp_path / "t.csv"
    assert main(["table", str(tmp_path / "S"), "--pattern", SIPAKMED, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"{len(truth)} crops" in text and f"{len(others)} do not" in text
    assert ", ".join(others[:5]) in text
    assert "1 parents hold crops of several labels (first: 009)" in text
    written = pd.read_csv(out, dtype=str)
    assert sorted(written["path"]) == sorted(f"S/{t['file']}" for t in truth.values())


def test_labels_join_by_file_adds_parent_and_lists_unused_rows(tmp_path) -> None:
    truth, _ = _patients(tmp_path / "rel")
    files = [f"{t['patient']}/{t['parent']}/{c}.png" for c, t in truth.items()]
    labels = tmp_path / "labels.csv"
    pd.DataFrame({"file": files + ["gone/x.png"], "label": ["z"] * (len(files) + 1),
                  "parent": [f"F{i // 2}" for i in range(len(files) + 1)]}).to_csv(labels, index=False)
    frame, report = table_from_files(tmp_path / "rel", "{*}/{*}/{*}.png", labels=labels)
    by_file = dict(zip(files, [f"F{i // 2}" for i in range(len(files))]))
    assert list(frame.columns) == ["id", "path", "label", "parent", "w", "h"]
    assert dict(zip(frame["path"], frame["parent"])) == by_file
    assert list(frame["id"]) == sorted(f[:-4] for f in files)
    assert report["n_labels_unused"] == 1 and report["labels_unused_first"] == ["gone/x.png"]


def test_pattern_semantics() -> None:
    assert compile_pattern("{parent}_{*}.bmp").match("001_02_03.bmp") == {"parent": "001"}
    assert compile_pattern("{parent}_{id}.bmp").match("001_02_03.bmp") == {"parent": "001", "id": "02_03"}
    assert compile_pattern("{a}/x.png").match("p/q/x.png") is None          # a field never crosses '/'
    rep = compile_pattern("{parent}/{parent}_{*}.png")
    assert rep.match("f1/f1_3.png") == {"parent": "f1"} and rep.match("f1/f2_3.png") is None
    assert compile_pattern("a+b(1)/{parent}.png").match("a+b(1)/p.png") == {"parent": "p"}  # literals are literal
    assert compile_pattern("a*/{parent}.png").match("ab/p.png") is None


def test_write_file_table_leaves_nothing_when_the_table_is_invalid(tmp_path) -> None:
    frame = pd.DataFrame({"id": ["a", "a"], "path": ["x.png", "y.png"], "label": ["l", "l"], "parent": ["p", "p"],
                          "w": [1, 1], "h": [1, 1]})
    with pytest.raises(Exception, match="unique"):
        write_file_table(frame, {}, tmp_path / "t.csv")
    assert os.listdir(tmp_path) == []


def test_parent_from_keeps_restarting_field_numbers_apart(tmp_path, capsys) -> None:
    truth, _ = _sipakmed(tmp_path / "S")
    out = tmp_path / "t.csv"
    assert main(["table", str(tmp_path / "S"), "--pattern", "im_{label}/CROPPED/{field}_{*}.bmp",
                 "--parent-from", "label,field", "--out", str(out)]) == 0
    assert "several labels" not in capsys.readouterr().out
    table = CropTable.from_csv(out, id="id", image="path")
    frame = table.frame.set_index("id")
    assert {cid: frame.loc[cid, "parent"] for cid in truth} == {cid: f"{t['label']}/{t['parent']}" for cid, t in truth.items()}
    assert table.n_parents == len({(t["label"], t["parent"]) for t in truth.values()})
    side = json.loads(open(summary_path(out)).read())
    assert side["parent_from"] == ["label", "field"] and side["n_parents_with_several_labels"] == 0
    assert list(pd.read_csv(out, dtype=str).columns) == ["id", "path", "label", "parent", "field", "w", "h"]
