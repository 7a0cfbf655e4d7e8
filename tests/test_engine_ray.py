"""The Ray engine (`shortcutlab.data.engines.ray_engine`) against the in-memory code.

Its worker steps are plain functions of Arrow tables, so the default suite runs them here
without Ray: a table cut into partitions of whole parents and reduced partition by partition
must give `exposure.summarize`'s figures, `class_counts_per_unit`'s V and `make_split`'s
manifest hash. The tests marked slow start a local 2-CPU Ray (about 10 s, and each Ray Data
pass several seconds more on 2 shared cores) and run the engine end to end against the
``memory`` engine on the same Parquet files.
"""

import os
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shortcutlab.errors import TableError
from shortcutlab.data.engines import TableSource, available, get_engine
from shortcutlab.data.engines.ray_engine import RayEngine, RayEngineError, assign_block, canonical_block, check_source, \
    class_counts, closed_forms, collect_parent_rows, per_parent_rows, worker_error
from shortcutlab.data.exposure import summarize
from shortcutlab.data.manifest import ContentHasher, SplitManifest, read_sidecar, verify
from shortcutlab.data.random_tables import random_table
from shortcutlab.data.splits import make_split, unit_sides_from_counts
from shortcutlab.data.table import CropTable

COLUMNS = {"id": "id", "label": "label", "parent": "parent", "group": "patient", "box": "x,y,w,h"}


def _frame(seed: int, n_parents: int = 300, mean: float = 6.0) -> pd.DataFrame:
    df = random_table(n_parents, mean, 4, mixed=seed % 2 == 0, parents_per_group=4, crop_size=300, seed=seed)
    df["parent"] = " " + df["parent"]  # stripped by the table, so by the engine too
    return df.sample(frac=1, random_state=seed).reset_index(drop=True)


def _partitions(df: pd.DataFrame, k: int, seed: int) -> list[pd.DataFrame]:
    """`df` cut into k partitions of whole parents (by a random parent -> partition draw),
    each sorted by parent as Ray's repartition(keys, sort=True) leaves it."""
    parents = df["parent"].str.strip().unique()
    where = dict(zip(parents, np.random.default_rng(seed).integers(0, k, len(parents))))
    part = df["parent"].str.strip().map(where)
    return [df[part == i] for i in range(k) if (part == i).any()]


def _reduce(df: pd.DataFrame, k: int, seed: int, q: float | None):
    """Steps 1 and 2 of the engine without Ray: canonical blocks, then one reduction per partition."""
    keep = ("id", "parent", "label", "group", "x", "y", "w", "h")
    rows = []
    for part in _partitions(df, k, seed):
        canon = canonical_block(pa.Table.from_pandas(part, preserve_index=False), COLUMNS, "t.parquet", keep)
        canon = canon.sort_by("parent")
        rows.append(per_parent_rows(canon, q, True, True))
    return collect_parent_rows(rows)


@pytest.mark.parametrize("seed", range(3))
def test_partition_by_partition_reduction_gives_the_in_memory_figures(seed):
    df = _frame(seed)
    table = CropTable.from_frame(df, **COLUMNS)
    want = summarize(table, 0.3).to_dict()
    got = closed_forms(_reduce(df, 5, seed, 0.3), 0.3, geometry=True)
    for k in ("n_crops", "n_parents", "n_classes", "n_groups", "test_fraction"):
        assert got[k] == want[k], k
    for k in ("sibling_share", "exposure", "diversity_ratio", "pixel_overlap", "overlap_share"):
        assert got[k] == pytest.approx(want[k], abs=1e-12), k
    assert 0 < want["overlap_share"] < 1  # boxes of 300 px in 1376 x 1020: some siblings overlap, not all


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("unit", ["parent", "group"])
def test_assignment_from_partition_counts_hashes_to_make_split(seed, unit):
    df = _frame(seed)
    table = CropTable.from_frame(df, **COLUMNS)
    units, classes, V = class_counts(_reduce(df, 4, seed, None), unit)
    assert classes == table.classes
    np.testing.assert_array_equal(V, table.class_counts_per_unit(unit))
    side_u = unit_sides_from_counts(V, 0.25, 0.1, seed)
    sides = pa.table({"unit": units, "side": pa.array(side_u, pa.int8())})
    col = "parent" if unit == "parent" else "group"
    blocks = [canonical_block(pa.Table.from_pandas(b, preserve_index=False), COLUMNS, "t.parquet", ("id", col))
              for b in np.array_split(np.arange(len(df)), 3) for b in [df.iloc[b]]]
    rows = pa.concat_tables([assign_block(b, sides, col) for b in blocks]).sort_by("id")
    h = ContentHasher(["id", "split"])
    h.update(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert h.hexdigest() == make_split(table, "parent", test_fraction=0.25, val_fraction=0.1, seed=seed, unit=unit).hash


def test_per_parent_rows_by_hand():
    # Parent p: boxes A and B overlap (m = 1 each), C stands apart (m = 0); parent r: one crop
    # whose box lies on A's but in another parent (m = 0). q = 0.5: terms 0.5, 0.5, 0, 0.
    block = pa.table({"parent": ["p", "p", "p", "r"], "label": ["a", "b", "a", "a"], "group": ["g", "g", "g", "h"],
                      "x": [0.0, 5.0, 50.0, 0.0], "y": [0.0, 5.0, 50.0, 0.0], "w": [10.0] * 4, "h": [10.0] * 4})
    out = per_parent_rows(block, 0.5, True, True).to_pandas().sort_values(["parent", "label"])
    assert out[["parent", "label", "n", "group", "n_overlap"]].values.tolist() == [
        ["p", "a", 2, "g", 1], ["p", "b", 1, "g", 1], ["r", "a", 1, "h", 0]]
    assert out["overlap_term"].tolist() == [0.5, 0.5, 0.0]
    assert out["piece"].nunique() == 1


def test_a_parent_cut_between_partitions_is_refused():
    """Ray's repartition by key keeps a parent in one partition; were it ever cut, its overlap
    counts would miss the pairs across the cut, so the driver refuses rather than report them."""
    a = pa.table({"parent": ["p", "q"], "label": ["a", "a"], "x": [0.0, 0.0], "y": [0.0, 0.0], "w": [10.0] * 2, "h": [10.0] * 2})
    b = pa.table({"parent": ["p"], "label": ["b"], "x": [5.0], "y": [5.0], "w": [10.0], "h": [10.0]})
    whole = collect_parent_rows([per_parent_rows(pa.concat_tables([a, b]).sort_by("parent"), 0.5, True, False)])
    assert whole.n_overlap == 2 and whole.classes == ("a", "b")
    with pytest.raises(RayEngineError, match="a parent was cut between partitions"):
        collect_parent_rows([per_parent_rows(a, 0.5, True, False), per_parent_rows(b, 0.5, True, False)])


def test_per_parent_rows_refuses_an_id_repeated_in_its_partition():
    block = pa.table({"parent": ["p", "p", "q"], "label": ["a", "a", "a"], "id": ["c1", "c2", "c1"]})
    with pytest.raises(TableError, match=r"crop ids must be unique; id 'c1' repeats \(parent\(s\) 'p', 'q'\)"):
        per_parent_rows(block, None, False, False)
    assert per_parent_rows(block.slice(0, 2), None, False, False).column("n").to_pylist() == [2]


def test_per_parent_rows_refuses_a_parent_in_two_groups():
    block = pa.table({"parent": ["p", "p", "r"], "label": ["a", "a", "a"], "group": ["g1", "g2", "g1"]})
    with pytest.raises(TableError, match=r"parent 'p' has crops in 2 different groups \(patients\) \['g1', 'g2'\]"):
        per_parent_rows(block, None, False, True)


def test_worker_error_reads_the_last_shortcutlab_error_of_a_traceback():
    text = ("ray::Map()\n  File \"x.py\", line 1\nshortcutlab.errors.SplitError: first\n\nThe above exception ...\n"
            "shortcutlab.errors.TableError: column 'label' is empty or NaN in row 3 (id 'd')\n"
            "ray.exceptions.UserCodeException: UDF failed")
    err = worker_error(text)
    assert type(err) is TableError and str(err) == "column 'label' is empty or NaN in row 3 (id 'd')"
    assert worker_error("ValueError: not ours\nos.errors.TableError: no") is None


def test_source_checks_run_before_any_cluster(tmp_path):
    df = random_table(5, seed=1)
    df.to_parquet(tmp_path / "a.parquet", index=False)
    (tmp_path / "t.csv").write_text("id,label,parent\n")
    assert check_source(TableSource(str(tmp_path / "*.parquet"), id="id")) == [str(tmp_path / "a.parquet")]
    with pytest.raises(TableError, match=r"group column 'pt' is missing from .*a.parquet; columns are: id, label, parent, x, y, w, h"):
        check_source(TableSource(str(tmp_path / "a.parquet"), id="id", group="pt"))
    with pytest.raises(TableError, match=r"table pattern '.*\*.pq' matches no file"):
        check_source(TableSource(str(tmp_path / "*.pq")))
    with pytest.raises(TableError, match=r"reads Parquet .*t\.csv' is not a \.parquet file"):
        check_source(TableSource(str(tmp_path / "t.csv")))
    eng = RayEngine(threads=1)
    with pytest.raises(TableError, match=r"split needs an id column \(--id COL\)"):
        eng.split(TableSource(str(tmp_path / "a.parquet")), str(tmp_path / "m"))
    assert not os.path.exists(tmp_path / "m")


def test_options_are_checked():
    assert "ray" in available()
    with pytest.raises(RayEngineError, match="threads must be a positive integer; got 0"):
        RayEngine(threads=0)
    with pytest.raises(RayEngineError, match="threads applies to a local Ray only"):
        RayEngine(address="auto", threads=2)
    with pytest.raises(RayEngineError, match="partitions must be a positive integer; got 1.5"):
        get_engine("ray", partitions=1.5)


def test_registering_the_ray_engine_imports_no_ray():
    code = "import sys, shortcutlab.data.engines as e; assert 'ray' in e.available(); print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------- on a local Ray
@pytest.fixture(scope="module")
def ray_session():
    pytest.importorskip("ray.data", reason="the ray engine needs Ray Data (pip install 'shortcutlab[ray]')")
    with RayEngine(threads=2).connected() as ray:  # the engine uses this connection, then leaves it open
        yield ray
    assert not ray.is_initialized()


def _write_dataset(df: pd.DataFrame, folder, n_files: int) -> str:
    os.makedirs(folder, exist_ok=True)
    for i, rows in enumerate(np.array_split(np.arange(len(df)), n_files)):
        pq.write_table(pa.Table.from_pandas(df.iloc[rows], preserve_index=False), os.path.join(folder, f"part-{i}.parquet"))
    return str(folder)


def _same_as_memory(tmp_path, df, n_files, seeds, val=0.1, unit="parent"):
    src = TableSource(_write_dataset(df, tmp_path / "crops", n_files), id="id", group="patient", box="x,y,w,h")
    ray_engine, memory = get_engine("ray"), get_engine("memory")
    got, want = ray_engine.audit(src, 0.2), memory.audit(src, 0.2)
    for k in ("n_crops", "n_parents", "n_classes", "n_groups"):
        assert got[k] == want[k], k
    for k in ("sibling_share", "exposure", "diversity_ratio", "pixel_overlap", "overlap_share"):
        assert got[k] == pytest.approx(want[k], abs=1e-12), k
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in seeds:
            rec = ray_engine.split(src, str(tmp_path / f"ray-{seed}"), test_fraction=0.2, val_fraction=val, seed=seed, unit=unit)
            ref = memory.split(src, str(tmp_path / f"mem-{seed}"), test_fraction=0.2, val_fraction=val, seed=seed, unit=unit)
            assert rec["sha256"] == ref["sha256"] == verify(str(tmp_path / f"ray-{seed}"))
            assert rec["report"] == ref["report"] and rec["params"] == ref["params"] and rec["n_rows"] == len(df)
            assert SplitManifest.read(str(tmp_path / f"ray-{seed}")).hash == rec["sha256"]
            assert read_sidecar(str(tmp_path / f"ray-{seed}"))["engine"] == "ray"


@pytest.mark.slow
def test_ray_audit_and_split_equal_the_memory_engine_on_100k_crops(ray_session, tmp_path):
    """100k crops in 2,000 parents over 4 files, two seeds (one with a validation side)."""
    df = random_table(2000, 50.0, 4, mixed=True, parents_per_group=5, seed=3).sample(frac=1, random_state=1)
    _same_as_memory(tmp_path, df, 4, seeds=[0, 7])


@pytest.mark.slow
def test_ray_split_by_patient_equals_the_memory_engine(ray_session, tmp_path):
    _same_as_memory(tmp_path, _frame(4, 400), 3, seeds=[2], val=0.0, unit="patient")


@pytest.mark.slow
def test_ray_audit_and_split_equal_the_memory_engine_on_1m_crops(ray_session, tmp_path):
    """Issue 25's check at 1M crops (20,000 parents, 8 files): 39 s on 2 shared cores at load about 5."""
    df = random_table(20000, 50.0, 5, mixed=True, parents_per_group=10, seed=11).sample(frac=1, random_state=2)
    _same_as_memory(tmp_path, df, 8, seeds=[1])


@pytest.mark.slow
def test_ray_refuses_an_id_repeated_across_files_and_a_bad_value_in_one_line(ray_session, tmp_path):
    a = pd.DataFrame({"id": ["a", "b"], "label": "x", "parent": ["p", "q"]})
    b = pd.DataFrame({"id": ["c", " a"], "label": "x", "parent": ["r", "p"]})  # crop a read twice
    folder = tmp_path / "dup"
    folder.mkdir()
    a.to_parquet(folder / "1.parquet", index=False)
    b.to_parquet(folder / "2.parquet", index=False)
    src = TableSource(str(folder), id="id")
    # Ray may read both small files as one block (refused there, naming the rows) or as two
    # (refused within the parent's partition, or by the split's id order): one line naming 'a'.
    for run in (lambda: get_engine("ray").audit(src), lambda: get_engine("ray").split(src, str(tmp_path / "m"))):
        with pytest.raises(TableError, match=r"crop ids must be unique.*'a'") as e:
            run()
        assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "m")
    b.loc[1, "parent"] = "s"  # the id shared by two parents: the audit's check_ids pass finds it
    b.to_parquet(folder / "2.parquet", index=False)
    with pytest.raises(TableError, match=r"crop ids must be unique.*'a'"):
        get_engine("ray", check_ids=True).audit(src)
    b.loc[0, "label"] = " "
    b.to_parquet(folder / "2.parquet", index=False)
    with pytest.raises(TableError) as e:
        get_engine("ray", check_ids=False).audit(src)
    text = str(e.value)
    assert "\n" not in text and "column 'label' is empty or NaN in row" in text and "(id 'c')" in text and "dup" in text


@pytest.mark.slow
def test_cli_split_and_audit_with_engine_ray(tmp_path, capsys):
    """The command line end to end: `split --engine ray` writes a folder `verify` accepts, with
    make_split's hash; `audit --engine ray --json` writes the in-memory closed forms."""
    import json

    from shortcutlab.cli import main

    df = random_table(60, 5.0, 3, mixed=True, seed=8)
    folder = _write_dataset(df, tmp_path / "crops", 2)
    table = [folder, "--id", "id", "--label", "label", "--parent", "parent", "--engine", "ray", "--threads", "2"]
    assert main(["split", *table, "--protocol", "parent", "--test-fraction", "0.25", "--seed", "3", "--out", str(tmp_path / "m")]) == 0
    assert main(["verify", str(tmp_path / "m")]) == 0
    t = CropTable.from_frame(df, id="id")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert read_sidecar(str(tmp_path / "m"))["sha256"] == make_split(t, "parent", test_fraction=0.25, seed=3).hash
    assert main(["audit", *table, "--box", "x,y,w,h", "--json", str(tmp_path / "a.json")]) == 0
    got = json.loads((tmp_path / "a.json").read_text())
    want = summarize(CropTable.from_frame(df, id="id", box="x,y,w,h"), 0.2).to_dict()
    for k in ("n_crops", "n_parents", "exposure", "diversity_ratio", "pixel_overlap", "overlap_share"):
        assert got[k] == pytest.approx(want[k], abs=1e-12), k
    capsys.readouterr()
