"""The engines' shared parent-level core and the engine contract.

The parent split needs only its units' class counts, the closed forms only parent sizes, pixel
overlap only one parent's boxes at a time and the manifest hash only rows in id order: each
piece is checked here against the in-memory code and against an independent reference (brute
force over box pairs, hashlib over hand-written text, hand-computed shares).
"""

import hashlib
import os
import warnings

import numpy as np
import pandas as pd
import pytest

from shortcutlab.data.audit import audit
from shortcutlab.data.engines import EngineError, TableSource, available, get_engine
from shortcutlab.data.exposure import pixel_overlap_from_counts
from shortcutlab.data.manifest import ContentHasher, SplitManifest, content_hash, folder_hash, read_sidecar, verify
from shortcutlab.data.overlap import overlap_counts_by_parent
from shortcutlab.data.random_tables import random_table
from shortcutlab.data.splits import make_split, parent_split, parent_split_report, unit_sides_from_counts
from shortcutlab.data.table import CropTable


def _table(seed, n=300, mixed=True, groups=None):
    df = random_table(n, 5.0, 4, mixed=mixed, parents_per_group=groups, seed=seed)
    return CropTable.from_frame(df, id="id", box="x,y,w,h", group="patient" if groups else None), df


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("v", [0.0, 0.15])
def test_unit_sides_from_counts_is_the_parent_split(seed, v):
    t, _ = _table(seed, mixed=seed % 2 == 0)
    V = t.class_counts_per_unit("parent")
    side_u = unit_sides_from_counts(V, 0.2, v, seed)
    m = parent_split(t, 0.2, v, seed=seed)
    names = np.array(["train", "val", "test"], dtype=object)
    expected = pd.DataFrame({"id": t.ids, "split": names[side_u[t.parent_codes]]})
    assert content_hash(expected) == m.hash
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = parent_split_report(V, side_u, t.classes, 0.2, v)
    assert rep == m.report


def test_parent_split_report_by_hand():
    # Two classes; units 0 and 2 on test: test holds 3 + 1 = 4 of 10 crops, class a 3/6, b 1/4.
    V = np.array([[3, 0], [2, 1], [0, 1], [1, 2]])
    side_u = np.array([2, 0, 2, 0])
    rep = parent_split_report(V, side_u, ("a", "b"), 0.4)
    assert rep["n_test"] == 4 and rep["n_train"] == 6 and rep["test_share"] == 0.4
    assert rep["test_share_per_class"] == {"a": 0.5, "b": 0.25}
    assert rep["max_class_deviation"] == 0.15
    assert rep["empty_class_sides"] == []


def _brute_force_m(parent, boxes):
    n = len(parent)
    m = np.zeros(n, dtype=np.int64)
    for i in range(n):
        for j in range(n):
            if i != j and parent[i] == parent[j]:
                xi, yi, wi, hi = boxes[i]
                xj, yj, wj, hj = boxes[j]
                if max(xi, xj) < min(xi + wi, xj + wj) and max(yi, yj) < min(yi + hi, yj + hj):
                    m[i] += 1
    return m


@pytest.mark.parametrize("seed", range(3))
def test_overlap_counts_by_parent_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    parent = rng.integers(0, 6, 120)
    boxes = np.c_[rng.integers(0, 60, (120, 2)), rng.integers(1, 20, (120, 2))].astype(float)
    assert overlap_counts_by_parent(parent, boxes).tolist() == _brute_force_m(parent, boxes).tolist()
    # Split into batches of whole parents, the counts are the same crop by crop.
    low = parent < 3
    m = np.empty(len(parent), dtype=np.int64)
    m[low] = overlap_counts_by_parent(parent[low], boxes[low])
    m[~low] = overlap_counts_by_parent(parent[~low], boxes[~low])
    assert m.tolist() == _brute_force_m(parent, boxes).tolist()


def test_pixel_overlap_from_a_histogram_of_m():
    m = np.array([0, 0, 1, 3, 3, 3])
    by_hand = (0 + 0 + 0.5 + 3 * (1 - 0.125)) / 6
    assert pixel_overlap_from_counts(m, 0.5) == pytest.approx(by_hand, abs=1e-15)
    values, n = np.unique(m, return_counts=True)
    assert pixel_overlap_from_counts(values, 0.5, n_crops=n) == pytest.approx(by_hand, abs=1e-15)


def test_content_hasher_in_batches_equals_content_hash():
    rng = np.random.default_rng(0)
    ids = sorted({f"c{rng.integers(0, 10**6)}é" for _ in range(500)})
    df = pd.DataFrame({"id": ids, "split": rng.choice(["train", "val", "test"], len(ids))})
    text = "id\tsplit\n" + "".join(f"{i}\t{s}\n" for i, s in zip(df["id"], df["split"]))
    assert content_hash(df.sample(frac=1, random_state=1)) == hashlib.sha256(text.encode()).hexdigest()
    import pyarrow as pa

    cuts = [0, 1, 7, 200, 200, len(df)]
    for kind in ("pandas", "arrow"):
        h = ContentHasher(["id", "split"])
        for a, b in zip(cuts[:-1], cuts[1:]):
            part = df.iloc[a:b]
            h.update(part if kind == "pandas" else pa.RecordBatch.from_pandas(part, preserve_index=False))
        assert h.hexdigest() == content_hash(df)


def _csv(tmp_path, df):
    path = tmp_path / "crops.csv"
    df.to_csv(path, index=False)
    return str(path)


def test_memory_engine_audit_and_split_match_the_in_memory_code(tmp_path):
    t, df = _table(5)
    src = TableSource(_csv(tmp_path, df), id="id", box="x,y,w,h")
    eng = get_engine("memory")
    got = eng.audit(src, 0.3)
    want = audit(t, 0.3)
    for k in ("n_crops", "n_parents", "n_classes", "n_groups", "sibling_share", "exposure", "diversity_ratio", "pixel_overlap",
              "overlap_share"):
        assert got[k] == want[k], k
    out = tmp_path / "m.parquet"
    rec = eng.split(src, str(out), test_fraction=0.25, val_fraction=0.1, seed=2)
    expected = make_split(t, "parent", test_fraction=0.25, val_fraction=0.1, seed=2)
    assert rec["sha256"] == expected.hash == SplitManifest.read(out).hash == verify(out) == folder_hash(out)
    assert read_sidecar(str(out))["report"] == expected.metadata()["report"]
    assert sorted(os.listdir(out)) == [".shortcutlab-output.json", "split=test", "split=train", "split=val"]


def test_engines_refuse_unknown_names_and_protocols(tmp_path):
    assert "memory" in available()
    with pytest.raises(EngineError, match="unknown engine 'memroy'; did you mean 'memory'"):
        get_engine("memroy")
    src = TableSource(_csv(tmp_path, random_table(10)), id="id")
    with pytest.raises(EngineError, match="runs the crop, parent split protocol"):
        get_engine("memory").split(src, str(tmp_path / "m"), protocol="ladder")


# --------------------------------------------------------------------------- the duckdb engine
FIGURES = ("sibling_share", "exposure", "diversity_ratio", "pixel_overlap", "overlap_share")


def _same_audit(got, want):
    for k in ("n_crops", "n_parents", "n_classes", "n_groups"):
        assert got[k] == want[k], k
    for k in FIGURES:
        assert got[k] == pytest.approx(want[k], abs=1e-12), k


def _check_against_memory(path, df, splits, q=0.2, group=None, **table_cols):
    """The duckdb engine's audit and splits of the file `path` against `data.audit.audit` and
    `make_split` on the same rows held as a `CropTable`."""
    t = CropTable.from_frame(df, group=group, **table_cols)
    src = TableSource(str(path), group=group, **table_cols)
    eng = get_engine("duckdb", memory_limit="500MB", threads=2, batch_rows=50_000)
    _same_audit(eng.audit(src, q), audit(t, q))
    out = os.path.join(os.path.dirname(path), "manifest.parquet")
    for seed, v, unit in splits:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rec = eng.split(src, out, test_fraction=q, val_fraction=v, seed=seed, unit=unit)
            want = make_split(t, "parent", test_fraction=q, val_fraction=v, seed=seed, unit=unit)
        assert rec["sha256"] == want.hash, (seed, v, unit)
        assert rec["report"] == want.metadata()["report"]
        assert SplitManifest.read(out).hash == want.hash


@pytest.fixture(scope="module")
def table_200k(tmp_path_factory):
    df = random_table(40_000, 5.0, 4, mixed=True, parents_per_group=5, seed=11)  # about 200k crops
    folder = tmp_path_factory.mktemp("t200k") / "crops"
    folder.mkdir()
    shuffled = df.sample(frac=1, random_state=0).reset_index(drop=True)
    for i, rows in enumerate(np.array_split(np.arange(len(df)), 3)):  # three files, rows shuffled
        shuffled.iloc[rows].to_parquet(folder / f"part-{i}.parquet", index=False)
    return folder, df


def test_duckdb_engine_equals_memory_on_200k_crops(table_200k):
    """Figures to 1e-12 and manifest hashes equal on a 3-file Parquet dataset of ~200k crops,
    boxes overlapping within parents: a parent split and a patient split with a validation side."""
    pytest.importorskip("duckdb")
    folder, df = table_200k
    assert len(df) > 190_000
    _check_against_memory(folder, df, [(0, 0.0, "parent"), (1, 0.1, "group")], group="patient", id="id", box="x,y,w,h")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_duckdb_engine_equals_memory_on_1m_crops(tmp_path, seed):
    pytest.importorskip("duckdb")
    df = random_table(200_000, 5.0, 5, mixed=seed != 1, seed=seed)  # about 1M crops
    path = tmp_path / "crops.parquet"
    df.to_parquet(path, index=False)
    assert len(df) > 950_000
    _check_against_memory(path, df, [(seed, 0.1, "parent")], q=0.25, id="id", box="x,y,w,h")


def _awkward_frame():
    """Names that sort differently by code point and by locale, padding to strip, integer
    floats, a two-column id and boxes given as centres."""
    parents = ["é", "Z", "a", " b", "b\u00a0", "ß", "10", "9", "Ωmega", "z"]
    rng = np.random.default_rng(4)
    rows = []
    for p_i, p in enumerate(parents):
        for j in range(int(rng.integers(2, 9))):
            rows.append({"slide": float(p_i), "cell": j, "cls": ["HSIL ", "lsil", "Ñ", "n"][int(rng.integers(0, 4))], "field": p,
                         "pt": f"pt{p_i // 3}", "cx": float(rng.integers(0, 60)), "cy": float(rng.integers(0, 40))})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_duckdb_engine_reads_names_as_the_crop_table_does(tmp_path, fmt):
    """Sorting (code point, not locale), stripping and number-to-text rules match `CropTable`:
    the parent split follows the unit order, so any difference changes the hash."""
    pytest.importorskip("duckdb")
    df = _awkward_frame()
    path = tmp_path / f"t.{fmt}"
    df.to_csv(path, index=False) if fmt == "csv" else df.to_parquet(path, index=False)
    read = CropTable.from_csv if fmt == "csv" else CropTable.from_parquet
    cols = dict(id="slide,cell", label="cls", parent="field", center="cx,cy", crop_size="20")
    t = read(path, group="pt", **cols)
    src = TableSource(str(path), group="pt", **cols)
    eng = get_engine("duckdb", threads=1)
    _same_audit(eng.audit(src, 0.3), audit(t, 0.3))
    for seed in range(4):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rec = eng.split(src, str(tmp_path / "m"), test_fraction=0.3, seed=seed)
            assert rec["sha256"] == make_split(t, "parent", test_fraction=0.3, seed=seed).hash


def test_duckdb_engine_split_leaves_only_the_manifest(tmp_path):
    """The manifest folder holds the sides' Parquet files (and the output marker), the spill
    folder is gone, and the sidecar records the engine."""
    pytest.importorskip("duckdb")
    df = random_table(200, 5.0, 3, seed=2)
    df.to_parquet(tmp_path / "t.parquet", index=False)
    src = TableSource(str(tmp_path / "t.parquet"), id="id")
    rec = get_engine("duckdb").split(src, str(tmp_path / "out" / "m.parquet"), val_fraction=0.1)
    assert sorted(os.listdir(tmp_path / "out")) == ["m.json", "m.parquet"]
    assert sorted(os.listdir(tmp_path / "out" / "m.parquet")) == [".shortcutlab-output.json", "split=test", "split=train", "split=val"]
    assert read_sidecar(str(tmp_path / "out" / "m.parquet"))["engine"] == "duckdb" == rec["engine"]
    n = sum(len(pd.read_parquet(tmp_path / "out" / "m.parquet" / f"split={s}")) for s in ("train", "val", "test"))
    assert n == len(df) == rec["n_rows"]


def test_cli_engine_duckdb_split_verify_and_audit(tmp_path, capsys):
    """`split --engine duckdb` writes a manifest folder whose hash `verify` recomputes and
    that `audit --split` reads; `audit --engine duckdb --json` gives the in-memory figures."""
    pytest.importorskip("duckdb")
    import json

    from shortcutlab.cli import main

    df = random_table(300, 4.0, 3, seed=9)
    path = tmp_path / "t.parquet"
    df.to_parquet(path, index=False)
    table = [str(path), "--id", "id", "--label", "label", "--parent", "parent", "--box", "x,y,w,h"]
    out = tmp_path / "m.parquet"
    assert main(["split", *table, "--protocol", "parent", "--val-fraction", "0.1", "--seed", "4", "--out", str(out),
                 "--engine", "duckdb", "--memory-limit", "300MB", "--threads", "1"]) == 0
    t = CropTable.from_frame(df, id="id", box="x,y,w,h")
    want = make_split(t, "parent", val_fraction=0.1, seed=4)
    assert f"sha256 {want.hash}" in capsys.readouterr().out
    assert main(["verify", str(out)]) == 0 and f"OK {want.hash}" in capsys.readouterr().out
    assert main(["audit", *table, "--split", str(out), "--json", str(tmp_path / "mem.json")]) == 0
    assert main(["audit", *table, "--engine", "duckdb", "--json", str(tmp_path / "duck.json")]) == 0
    mem, duck = (json.loads((tmp_path / f).read_text()) for f in ("mem.json", "duck.json"))
    assert mem["split"]["sha256"] == want.hash
    _same_audit(duck, mem)
