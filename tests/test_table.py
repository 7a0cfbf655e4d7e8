import numpy as np
import pandas as pd
import pytest

from shortcutlab import CropTable, TableError
from conftest import shuffled


def test_columns_are_mapped_and_rows_sorted_by_id():
    df = pd.DataFrame({"cell": [3, 1, 2], "cls": ["b", "a", "a"], "img": [9, 7, 7], "pt": ["x", "y", "y"]})
    t = CropTable.from_frame(df, id="cell", label="cls", parent="img", group="pt")
    assert list(t.ids) == ["1", "2", "3"]
    assert list(t.frame["label"]) == ["a", "a", "b"]
    assert t.n_parents == 2 and t.n_groups == 2 and t.classes == ("a", "b")
    assert list(t.parent_sizes) == [2, 1]
    np.testing.assert_array_equal(t.class_counts_per_unit("parent"), [[2, 0], [0, 1]])


def test_center_and_crop_size_give_boxes():
    df = pd.DataFrame({"id": ["a", "b"], "label": [0, 1], "parent": [1, 1], "cx": [50, 80.5], "cy": [60, 10]})
    t = CropTable.from_frame(df, id="id", center="cx,cy", crop_size=100)
    np.testing.assert_allclose(t.boxes, [[0, 10, 100, 100], [30.5, -40, 100, 100]])


def test_multi_column_id_and_row_order_invariance(small_df):
    small_df = small_df.assign(a=small_df["parent"], b=np.arange(len(small_df)))
    t1 = CropTable.from_frame(small_df, id=["a", "b"], box="x,y,w,h")
    t2 = CropTable.from_frame(shuffled(small_df), id="a,b", box="x,y,w,h")
    assert t1.ids[0].count("/") == 1
    pd.testing.assert_frame_equal(t1.frame, t2.frame)


def test_csv_only_empty_cells_are_missing(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("id,label,parent\n1,NA,p1\n2,None,p1\n")
    t = CropTable.from_csv(p, id="id")
    assert sorted(t.classes) == ["NA", "None"]


def test_integer_ids_read_the_same_from_csv_and_frame(tmp_path):
    df = pd.DataFrame({"id": [10, 2, 33], "label": ["a", "b", "a"], "parent": [1.0, 1.0, np.nan]})
    with pytest.raises(TableError, match=r"column 'parent' is empty or NaN in row 2 \(id '33'\)"):
        CropTable.from_frame(df, id="id")
    df["parent"] = [1.0, 1.0, 2.0]
    t = CropTable.from_frame(df, id="id")
    df.to_csv(tmp_path / "t.csv", index=False)
    t2 = CropTable.from_csv(tmp_path / "t.csv", id="id")
    assert list(t.parents) == ["1", "2"]
    assert list(t2.ids) == list(t.ids)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(parent="slide"), r"parent column 'slide' is missing from DataFrame; columns are: id, label, parent"),
        (dict(label="cls"), r"label column 'cls' is missing"),
        (dict(box="x,y,w"), r"box \(x,y,w,h\) needs 4 column names"),
        (dict(center="x,y"), r"a center \(cx,cy\) needs a crop size"),
        (dict(center="x,y", crop_size=0), r"crop size must be a positive number"),
    ],
)
def test_bad_mappings_are_refused(kwargs, match):
    df = pd.DataFrame({"id": ["a", "b"], "label": ["x", "y"], "parent": ["p", "q"]})
    if "center" in kwargs:
        df["x"] = [1, 2]
        df["y"] = [1, 2]
    with pytest.raises(TableError, match=match):
        CropTable.from_frame(df, id="id", **kwargs)


def test_empty_and_nan_values_name_rows():
    df = pd.DataFrame({"id": ["a", "b", "c"], "label": ["x", None, "y"], "parent": ["p", "p", ""]})
    with pytest.raises(TableError, match=r"column 'label' is empty or NaN in row 1 \(id 'b'\)"):
        CropTable.from_frame(df, id="id")
    df["label"] = "x"
    with pytest.raises(TableError, match=r"column 'parent' is empty or NaN in row 2 \(id 'c'\)"):
        CropTable.from_frame(df, id="id")


def test_duplicate_ids_are_refused():
    df = pd.DataFrame({"id": ["a", "b", "a"], "label": "x", "parent": "p"})
    with pytest.raises(TableError, match=r"crop ids must be unique; id 'a' and others repeat in rows 0, 2"):
        CropTable.from_frame(df, id="id")


def test_non_positive_sizes_are_refused():
    df = pd.DataFrame({"id": ["a", "b"], "label": "x", "parent": "p", "x": 0, "y": 0, "w": [10, 0], "h": [5, 5]})
    with pytest.raises(TableError, match=r"crop sizes must be positive; 'w' is <= 0 in row 1 \(id 'b'\)"):
        CropTable.from_frame(df, id="id", box="x,y,w,h")
    df["w"] = 10
    df["h"] = [5, -1]
    with pytest.raises(TableError, match=r"'h' is <= 0"):
        CropTable.from_frame(df, id="id", box="x,y,w,h")
    df["h"] = ["5", "five"]
    with pytest.raises(TableError, match=r"box column 'h' must hold finite numbers; row 1 hold 'five'"):
        CropTable.from_frame(df, id="id", box="x,y,w,h")


def test_parent_with_two_patients_is_refused():
    df = pd.DataFrame({"id": list("abcd"), "label": "x", "parent": ["p", "p", "q", "q"], "pt": ["A", "B", "C", "C"]})
    with pytest.raises(TableError, match=r"parent 'p' has crops in 2 different groups \(patients\) \['A', 'B'\]"):
        CropTable.from_frame(df, id="id", group="pt")


def test_missing_file_and_empty_table(tmp_path):
    with pytest.raises(TableError, match="does not exist"):
        CropTable.from_csv(tmp_path / "nope.csv", id="id")
    (tmp_path / "e.csv").write_text("id,label,parent\n")
    with pytest.raises(TableError, match="has no rows"):
        CropTable.from_csv(tmp_path / "e.csv", id="id")


def test_cric_table(cric):
    assert cric.n_crops == 11534 and cric.n_parents == 400 and cric.n_classes == 6
    assert cric.parent_sizes.min() == 2


def test_surrounding_whitespace_does_not_make_new_classes_parents_or_ids(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(
        "id,label,parent,patient,img\n"
        "1,HSIL,f1,A,a.png\n"
        " 2,HSIL ,f1 ,A , b.png\n"
        "3 , HSIL,f2,B,c.png\n"
        "4,NILM,\tf2,B,d.png \n"
    )
    t = CropTable.from_csv(p, id="id", label="label", parent="parent", group="patient", image="img")
    assert t.classes == ("HSIL", "NILM")
    assert list(t.parents) == ["f1", "f2"] and t.n_groups == 2
    assert list(t.ids) == ["1", "2", "3", "4"]
    np.testing.assert_array_equal(t.class_counts_per_unit("parent"), [[2, 0], [1, 1]])
    # Paths are not names: they are kept as written.
    assert list(t.frame["image"]) == ["a.png", " b.png", "c.png", "d.png "]
    df = pd.DataFrame({"id": ["a", "b"], "label": ["x ", "x"], "parent": ["p", " p"]})
    t2 = CropTable.from_frame(df, id="id")
    assert t2.classes == ("x",) and t2.n_parents == 1


def test_whitespace_only_values_and_ids_that_collide_once_stripped_are_refused():
    df = pd.DataFrame({"id": ["a", "b"], "label": ["x", "  "], "parent": "p"})
    with pytest.raises(TableError, match=r"column 'label' is empty or NaN in row 1 \(id 'b'\)"):
        CropTable.from_frame(df, id="id")
    df = pd.DataFrame({"id": ["a", "a "], "label": "x", "parent": "p"})
    with pytest.raises(TableError, match=r"id 'a' and others repeat in rows 0, 1"):
        CropTable.from_frame(df, id="id")


def test_a_table_that_is_not_utf8_names_the_byte_offset_and_line(tmp_path):
    data = "id,label,parent\n1,a,p\n2,caf\u00e9,p\n".encode("latin-1")
    (tmp_path / "t.csv").write_bytes(data)
    offset = data.index(b"\xe9")
    with pytest.raises(TableError) as info:
        CropTable.from_csv(tmp_path / "t.csv", id="id")
    msg = str(info.value)
    assert "t.csv" in msg and "not UTF-8" in msg
    assert f"byte 0xe9 at offset {offset} (line 3)" in msg


def test_a_folder_or_a_malformed_csv_is_refused_with_the_file_named(tmp_path):
    with pytest.raises(TableError, match=r"is a folder"):
        CropTable.from_csv(tmp_path, id="id")
    (tmp_path / "t.csv").write_text("id,label,parent\n1,a,p\n2,b,p,extra\n")
    with pytest.raises(TableError, match=r"t\.csv' is not a readable CSV file: Expected 3 fields in line 3, saw 4"):
        CropTable.from_csv(tmp_path / "t.csv", id="id")


def test_parquet_and_csv_of_one_table_load_the_same(tmp_path):
    """The same table written as CSV and as Parquet (with a patient column, boxes, integer
    parents and whitespace around names) gives identical ids, labels, parents, groups and boxes;
    checked against the frame itself, sorted by Python's `sorted`."""
    from shortcutlab.data.random_tables import random_table

    df = random_table(60, 4.0, n_classes=3, mixed=True, parents_per_group=5, seed=3)
    df["parent"] = [int(p[1:]) for p in df["parent"]]  # integer parents, as in many releases
    df["label"] = [lab + " " if i % 7 == 0 else lab for i, lab in enumerate(df["label"])]
    df = df.sample(frac=1.0, random_state=1).reset_index(drop=True)
    group = next(c for c in df.columns if c not in ("id", "label", "parent", "x", "y", "w", "h"))
    df.to_csv(tmp_path / "t.csv", index=False)
    df.to_parquet(tmp_path / "t.parquet", index=False)
    kw = dict(id="id", label="label", parent="parent", group=group, box="x,y,w,h")
    a = CropTable.from_csv(tmp_path / "t.csv", **kw)
    b = CropTable.from_parquet(tmp_path / "t.parquet", **kw)
    order = sorted(range(len(df)), key=lambda i: df["id"][i])
    assert list(a.ids) == list(b.ids) == [df["id"][i] for i in order]
    assert list(b.frame["label"]) == [df["label"][i].strip() for i in order] == list(a.frame["label"])
    assert list(b.frame["parent"]) == [str(df["parent"][i]) for i in order] == list(a.frame["parent"])
    assert list(b.frame["group"]) == list(a.frame["group"]) == [str(df[group][i]) for i in order]
    np.testing.assert_array_equal(b.boxes, df[["x", "y", "w", "h"]].to_numpy(dtype=float)[order])
    np.testing.assert_array_equal(a.boxes, b.boxes)
    assert a.classes == b.classes and list(a.parents) == list(b.parents)


def test_ids_are_sorted_as_python_sorts_str():
    """Ids sort by code point, as `sorted` does (the Arrow sort must agree), non-ASCII included."""
    ids = ["b", "a", "\u00e9", "Z", "a/10", "a/9", "\u4e2d", "aa", "10", "9"]
    df = pd.DataFrame({"id": ids, "label": "x", "parent": "p"})
    assert list(CropTable.from_frame(df, id="id").ids) == sorted(ids)


def test_a_parquet_table_with_nulls_or_empty_text_names_the_rows(tmp_path):
    df = pd.DataFrame({"id": ["a", "b", "c"], "label": ["x", None, "y"], "parent": ["p", "p", ""]})
    df.to_parquet(tmp_path / "t.parquet")
    with pytest.raises(TableError, match=r"column 'label' is empty or NaN in row 1 \(id 'b'\)"):
        CropTable.from_parquet(tmp_path / "t.parquet", id="id")
    df.assign(label="x").to_parquet(tmp_path / "u.parquet")
    with pytest.raises(TableError, match=r"column 'parent' is empty or NaN in row 2 \(id 'c'\)"):
        CropTable.from_parquet(tmp_path / "u.parquet", id="id")


@pytest.mark.parametrize("text", [
    "\ufeffid,label,parent\n1,a,p\n2,NA,q\n",                   # byte-order mark; 'NA' is a label
    'id,label,parent\r\n"1","a, b",p\r\n2,"x""y",q\r\n',        # CRLF, quotes, escaped quote
    "id,label,parent\n1,a,p\n\n2,b,q\n",                        # blank line
    "id,label,parent,label\n1,a,p,z\n2,b,q,z\n",                # repeated column name (pandas' reader)
    "id,label,parent,x\n1,a,p\n2,b,q,3\n",                      # short row (pandas' reader)
    "id,label,parent\n007,a,1\n10,b,2.0\n1e3,c,3\n",            # numbers kept as written
    "id,label,parent\n1,NaN,p\n2,null,q\n",                     # only empty cells are missing
    'id,label,parent\n1,"a\nb",p\n2,c,q\n',                      # a line break inside quotes
], ids=["bom", "crlf-quoted", "blank-line", "repeated-column", "short-row", "numeric-text", "nan-words", "quoted-newline"])
def test_arrow_csv_reading_matches_pandas_reader(tmp_path, text):
    """`from_csv` (Arrow's reader, or pandas' where Arrow reads otherwise) gives the text pandas'
    reader gives with dtype=str and only empty cells missing, the documented reading."""
    path = tmp_path / "t.csv"
    path.write_bytes(text.encode("utf-8"))
    ref = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""]).sort_values("id")
    t = CropTable.from_csv(path, id="id")
    for col in ("id", "label", "parent"):
        assert list(t.frame[col]) == list(ref[col]), col


def _odd_table(n: int = 300, seed: int = 0) -> pd.DataFrame:
    """Crops whose names carry surrounding spaces, tabs, no-break spaces and non-ASCII text,
    with patients, paths (kept as written), hashes, centers, sizes and boxes."""
    rng = np.random.default_rng(seed)
    parent = rng.integers(0, 40, size=n)
    pad = np.array(["", " ", "\t", "\u00a0", "  "])
    name = lambda stem, v: [pad[i % 5] + f"{stem}{x}" + pad[(i * 3) % 5] for i, x in enumerate(v)]  # noqa: E731
    return pd.DataFrame({
        "slide": name("s\u00e9", parent), "cell": rng.permutation(n) - 5, "label": name("k", rng.integers(0, 3, n)),
        "parent": name("p", parent), "patient": name("pt", parent // 4),
        "image": [f" img/{i}.png" for i in range(n)], "mask": [f"m/{i}.png " for i in range(n)],
        "phash": [f"{x:016x} " for x in rng.integers(0, 2**62, size=n)],
        "x": rng.integers(0, 900, n), "y": rng.uniform(-5, 700, n), "w": 64, "h": rng.integers(1, 99, n) + 0.5,
        "cx": rng.uniform(0, 1000, n), "cy": rng.integers(0, 1000, n), "size": rng.integers(8, 90, n),
    }).sample(frac=1.0, random_state=seed).reset_index(drop=True)


FAST_PATH_KEYWORDS = {
    "box-group-paths": dict(id="slide,cell", group="patient", image="image", mask="mask", phash="phash", box="x,y,w,h"),
    "center-size-number": dict(id=["cell"], center="cx,cy", crop_size="48"),
    "center-size-column": dict(id="cell", center="cx,cy", crop_size="size"),
    "row-number-ids": dict(label="label", parent="parent", box="x,y,w,h"),
    "ids-in-order": dict(id="phash", group="patient", box="x,y,w,h"),  # the file sorted by it below
}


@pytest.mark.parametrize("kw", FAST_PATH_KEYWORDS.values(), ids=FAST_PATH_KEYWORDS.keys())
def test_batched_arrow_reading_gives_the_frame_path_table(tmp_path, kw, monkeypatch):
    """`from_csv` and `from_parquet` (Arrow batches, converted and checked one at a time, here
    of about 2 kB so the table spans many) build exactly the table that `from_frame` builds
    from pandas' own reading of the file: same columns, dtypes, order and values."""
    import shortcutlab.data.table as table

    monkeypatch.setattr(table, "_BLOCK_BYTES", 2048)
    df = _odd_table()
    if kw.get("id") == "phash":  # a file already in id order: nothing to reorder
        df = df.assign(phash=df["phash"].str.strip()).sort_values("phash")
    df.to_csv(tmp_path / "t.csv", index=False)
    df.to_parquet(tmp_path / "t.parquet", index=False)
    text = ["slide", "label", "parent", "patient", "image", "mask", "phash"]
    ref = CropTable.from_frame(pd.read_csv(tmp_path / "t.csv", dtype={c: str for c in text}, keep_default_na=False,
                                           na_values=[""]), **kw).frame
    roles = table._Roles.of(**kw)
    assert table._canonical_frame(table._csv_batches(str(tmp_path / "t.csv"), roles), roles) is not None
    pd.testing.assert_frame_equal(CropTable.from_csv(tmp_path / "t.csv", **kw).frame, ref, check_exact=True)
    # Parquet keeps 'cell' an integer column (and -1 a negative one): written as Python writes it.
    assert table._canonical_frame(table._parquet_batches(str(tmp_path / "t.parquet"), roles), roles) is not None
    pd.testing.assert_frame_equal(CropTable.from_parquet(tmp_path / "t.parquet", **kw).frame, ref, check_exact=True)
    assert ref["label"].str.len().max() == 2  # 'k0', 'k1', 'k2': spaces, tabs, no-break spaces gone
    if "image" in ref:
        assert ref["image"].str.startswith(" ").all()  # paths kept as written


def test_parquet_and_csv_with_text_names_load_the_same_table(tmp_path):
    """A table with stripped whitespace, patients and boxes (labels a pandas category in the
    Parquet file, so Arrow dictionary-encoded): the CSV and the Parquet file give identical
    frames."""
    import shortcutlab.data.table as table

    df = _odd_table(seed=2).drop(columns=["cell"])
    df["id"] = [f" c{i:04d}" for i in range(len(df))]
    df.to_csv(tmp_path / "t.csv", index=False)
    df.astype({"label": "category"}).to_parquet(tmp_path / "t.parquet", index=False)
    roles = table._Roles.of(id="id", group="patient", box="x,y,w,h")
    assert table._canonical_frame(table._parquet_batches(str(tmp_path / "t.parquet"), roles), roles) is not None
    kw = dict(id="id", group="patient", box="x,y,w,h")
    a = CropTable.from_csv(tmp_path / "t.csv", **kw)
    b = CropTable.from_parquet(tmp_path / "t.parquet", **kw)
    pd.testing.assert_frame_equal(a.frame, b.frame, check_exact=True)
    assert list(a.ids) == sorted(s.strip() for s in df["id"])
    assert set(a.frame["parent"]) == {s.strip() for s in df["parent"]} and a.n_groups == 10


BAD_LATE_ROWS = {
    "empty-label": ("label", "", r"column 'label' is empty or NaN in row 250 \(id '"),
    "blank-parent": ("parent", " \t", r"column 'parent' is empty or NaN in row 250 \(id '"),
    "repeated-id": ("id", "c0000", r"id 'c0000' and others repeat in rows 0, 250"),
    "nan-box": ("x", "nan", r"box column 'x' must hold finite numbers; row 250 hold '?nan"),
    "zero-width": ("w", "0", r"'w' is <= 0 in row 250 \(id 'c0250'\)"),
    "word-in-box": ("y", "ten", r"box column 'y' must hold finite numbers; row 250 hold 'ten'"),
    "second-patient": ("patient", "elsewhere", r"parent .* has crops in 2 different groups"),
}


@pytest.mark.parametrize("bad", BAD_LATE_ROWS.values(), ids=BAD_LATE_ROWS.keys())
def test_a_bad_value_in_a_late_batch_is_named_by_its_file_row(tmp_path, bad, monkeypatch):
    """A bad value in the 251st row (in a later Arrow batch of ~2 kB) is refused with the
    file's row number, as `from_frame` names it from pandas' reading."""
    import shortcutlab.data.table as table

    monkeypatch.setattr(table, "_BLOCK_BYTES", 2048)
    column, value, message = bad
    df = pd.DataFrame({"id": [f"c{i:04d}" for i in range(400)], "label": "a", "parent": [f"p{i // 10}" for i in range(400)],
                       "patient": [f"pt{i // 40}" for i in range(400)], "x": 1.0, "y": 2.0, "w": 3.0, "h": 4.0})
    df = df.astype({column: object})
    df.loc[250, column] = value
    df.to_csv(tmp_path / "t.csv", index=False)
    kw = dict(id="id", group="patient", box="x,y,w,h")
    with pytest.raises(TableError, match=message):
        CropTable.from_csv(tmp_path / "t.csv", **kw)
    with pytest.raises(TableError, match=message):
        CropTable.from_frame(pd.read_csv(tmp_path / "t.csv", dtype={"id": str, "label": str, "parent": str, "patient": str},
                                         keep_default_na=False, na_values=[""]), **kw)
