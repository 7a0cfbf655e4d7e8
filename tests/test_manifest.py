import json

import pandas as pd
import pytest

from shortcutlab import ManifestHashError, SplitError, SplitManifest, content_hash, crop_split, ladder_split, verify
from shortcutlab.data.random_tables import random_table
from conftest import shuffled, table_from


@pytest.fixture
def manifest():
    return crop_split(table_from(random_table(50, 4, 2, geometry=False, seed=0)), 0.2, seed=0)


def test_hash_ignores_row_order_but_not_content(manifest):
    a = manifest.assignments
    assert content_hash(shuffled(a)) == manifest.hash
    flipped = a.copy()
    flipped.loc[0, "split"] = "test" if a.loc[0, "split"] == "train" else "train"
    assert content_hash(flipped) != manifest.hash
    assert len(manifest.hash) == 64


def test_roundtrip_and_verify(tmp_path, manifest):
    path = tmp_path / "m.csv"
    digest = manifest.to_csv(path)
    meta = json.loads((tmp_path / "m.json").read_text())
    assert meta["sha256"] == digest and meta["protocol"] == "crop" and meta["params"]["seed"] == 0
    back = SplitManifest.read(path)
    assert back.hash == digest and back.protocol == "crop"
    assert verify(path, digest) == digest
    assert verify(path) == digest  # against the sidecar
    with pytest.raises(ManifestHashError, match="expected 0000"):
        verify(path, "0" * 64)
    # Editing the CSV breaks verification against the registered hash.
    df = pd.read_csv(path, dtype=str)
    df.loc[0, "split"] = "val"
    df.to_csv(path, index=False)
    with pytest.raises(ManifestHashError):
        verify(path, digest)


def test_multi_cell_manifest_roundtrip(tmp_path):
    t = table_from(random_table(40, 4, 2, geometry=False, seed=0))
    lad = ladder_split(t, 0.2, seed=0, levels=[0, 0.5, 1])
    digest = lad.to_csv(tmp_path / "l.csv")
    back = SplitManifest.read(tmp_path / "l.csv")
    assert back.hash == digest
    assert back.cells == ("level_0.00", "level_0.50", "level_1.00")
    assert len(back.cell("level_0.50")) == t.n_crops
    with pytest.raises(SplitError, match="choose one with --cell"):
        back.cell()
    with pytest.raises(SplitError, match="unknown cell 'x'"):
        back.cell("x")


@pytest.mark.parametrize(
    "rows, match",
    [
        ({"id": ["a"], "side": ["train"]}, "manifest column 'split' is missing"),
        ({"id": ["a", "b"], "split": ["train", "holdout"]}, r"must be one of .*\['holdout'\] in row 1"),
        ({"id": ["a", "a"], "split": ["train", "test"]}, "assigns a crop twice"),
        ({"id": ["a", None], "split": ["train", "test"]}, "column 'id' is empty"),
    ],
)
def test_bad_manifests_are_refused(rows, match):
    with pytest.raises(SplitError, match=match):
        SplitManifest(pd.DataFrame(rows))


def test_missing_manifest_file(tmp_path):
    with pytest.raises(SplitError, match="does not exist"):
        SplitManifest.read(tmp_path / "none.csv")


@pytest.mark.parametrize(
    "text, match",
    [
        ('{"protocol": "crop", "sha256": ', "is not valid JSON: Expecting value at line 1 column 32"),
        ("[1, 2]", "must hold a JSON object; got a list"),
        ('{"params": [0.2]}', "'params' must be a JSON object; got \\[0.2\\]"),
        (b'{"protocol": "\xff"}', "is not UTF-8 text"),
    ],
)
def test_corrupt_sidecar_is_named_with_what_is_wrong(tmp_path, manifest, text, match):
    path = tmp_path / "m.csv"
    digest = manifest.to_csv(path)
    side = tmp_path / "m.json"
    side.write_bytes(text if isinstance(text, bytes) else text.encode())
    for call in (lambda: SplitManifest.read(path), lambda: verify(path), lambda: verify(path, digest)):
        with pytest.raises(SplitError, match=match) as info:
            call()
        assert str(side) in str(info.value) and "\n" not in str(info.value)


def test_sidecar_hash_that_is_not_a_string_is_named(tmp_path, manifest):
    path = tmp_path / "m.csv"
    manifest.to_csv(path)
    meta = json.loads((tmp_path / "m.json").read_text())
    meta["sha256"] = 12
    (tmp_path / "m.json").write_text(json.dumps(meta))
    with pytest.raises(SplitError, match="'sha256' must be a JSON string; got 12"):
        verify(path)


def test_to_csv_writes_both_files_or_neither(tmp_path, monkeypatch, manifest):
    path = tmp_path / "m.csv"
    old = crop_split(table_from(random_table(50, 4, 2, geometry=False, seed=0)), 0.2, seed=1)
    assert old.hash != manifest.hash
    old_digest = old.to_csv(path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def fail(self):
        raise OSError("disk full while writing the sidecar")

    # A failure after the CSV rows are written (building or writing the sidecar) ...
    monkeypatch.setattr(SplitManifest, "metadata", fail)
    with pytest.raises(OSError, match="disk full"):
        manifest.to_csv(path)
    # ... leaves the old pair, complete and consistent, and no temporary file behind.
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    monkeypatch.undo()
    assert verify(path) == old_digest
    # A fresh target gets neither file.
    monkeypatch.setattr(SplitManifest, "metadata", fail)
    with pytest.raises(OSError):
        manifest.to_csv(tmp_path / "new" / "n.csv")
    assert list((tmp_path / "new").iterdir()) == []


def test_to_csv_into_a_file_as_folder_is_refused(tmp_path, manifest):
    from shortcutlab.io import OutputError

    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="is a file, not a folder"):
        manifest.to_csv(tmp_path / "f" / "m.csv")
