"""`shortcutlab crops` (shortcutlab.ingest.windows): windows cut from parent images.

The parent images are gradients whose pixels encode their own coordinates (red = x, green = y),
so every window is checked against numpy slicing and `numpy.pad` written out by hand here, and
the written table against the pixel overlap that `CropTable` and `shortcutlab audit` compute.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from shortcutlab.data.table import CropTable
from shortcutlab.ingest.windows import WindowError, WindowWarning, cut_crops, cut_window


def gradient(h: int = 120, w: int = 160) -> np.ndarray:
    """(h, w, 3) uint8: red = x, green = y, blue = (x + 2y) mod 256; every pixel is unique."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x, y, (x + 2 * y) % 256], axis=-1).astype(np.uint8)


def write_study(tmp_path, rows: list[tuple], images: dict[str, np.ndarray]) -> str:
    """Parent images under tmp/fields/ and a table t.csv with id, label, parent, image, cx, cy."""
    for name, pixels in images.items():
        os.makedirs(tmp_path / "fields", exist_ok=True)
        Image.fromarray(pixels).save(tmp_path / "fields" / name)
    frame = pd.DataFrame(rows, columns=["id", "label", "parent", "image", "cx", "cy"])
    frame["image"] = "fields/" + frame["image"]
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    return str(path)


def crop_pixels(out: str, crop_id: str) -> np.ndarray:
    table = pd.read_csv(os.path.join(out, "crops.csv"), dtype={"id": str})
    rel = table.loc[table["id"] == crop_id, "path"].item()
    with Image.open(os.path.join(out, rel)) as im:
        return np.asarray(im)


def test_centre_windows_are_the_numpy_slices(tmp_path) -> None:
    img = gradient()
    rows = [("c1", "a", "A", "a.png", 60, 60), ("c2", "b", "A", "a.png", 80, 55), ("c3", "a", "B", "b.png", 30, 40)]
    table = write_study(tmp_path, rows, {"a.png": img, "b.png": img[::-1].copy()})
    out = str(tmp_path / "out")
    result = cut_crops(table, "image", out, center="cx,cy", size=40)
    assert result.n_crops == 3 and result.n_images == 2 and result.padded == ()
    # top-left = centre - N/2 for whole-pixel centres and even N
    np.testing.assert_array_equal(crop_pixels(out, "c1"), img[40:80, 40:80])
    np.testing.assert_array_equal(crop_pixels(out, "c2"), img[35:75, 60:100])
    np.testing.assert_array_equal(crop_pixels(out, "c3"), img[::-1][20:60, 10:50])
    written = pd.read_csv(os.path.join(out, "crops.csv"))
    assert written[["x", "y", "w", "h"]].values.tolist() == [[40, 40, 40, 40], [60, 35, 40, 40], [10, 20, 40, 40]]
    assert written["path"].tolist() == ["crops/c1.png", "crops/c2.png", "crops/c3.png"]
    assert written["parent"].tolist() == ["A", "A", "B"] and written["label"].tolist() == ["a", "b", "a"]


def test_odd_window_holds_its_centre_pixel_in_the_middle(tmp_path) -> None:
    table = write_study(tmp_path, [("c", "a", "A", "a.png", 33, 21)], {"a.png": gradient()})
    cut_crops(table, "image", str(tmp_path / "out"), center=("cx", "cy"), size=5)
    crop = crop_pixels(str(tmp_path / "out"), "c")
    assert crop.shape == (5, 5, 3)
    assert tuple(crop[2, 2, :2]) == (33, 21)  # red = x, green = y of the centre pixel
    assert tuple(crop[0, 0, :2]) == (31, 19)


def test_box_windows_are_the_numpy_slices(tmp_path) -> None:
    img = gradient()
    Image.fromarray(img).save(tmp_path / "f.png")
    pd.DataFrame({"id": ["p", "q"], "label": ["a", "b"], "parent": ["F", "F"], "im": ["f.png", "f.png"],
                  "bx": [5, 100], "by": [7, 0], "bw": [30, 60], "bh": [11, 120]}).to_csv(tmp_path / "t.csv", index=False)
    out = str(tmp_path / "out")
    cut_crops(str(tmp_path / "t.csv"), "im", out, box="bx,by,bw,bh")
    np.testing.assert_array_equal(crop_pixels(out, "p"), img[7:18, 5:35])
    np.testing.assert_array_equal(crop_pixels(out, "q"), img[0:120, 100:160])


def test_each_parent_image_is_read_once(tmp_path, monkeypatch) -> None:
    import shortcutlab.ingest.windows as windows

    rows = [(f"c{k}", "a", "A" if k % 2 else "B", "a.png" if k % 2 else "b.png", 50 + k, 50) for k in range(6)]
    table = write_study(tmp_path, rows, {"a.png": gradient(), "b.png": gradient()})
    reads = []
    real = windows.read_parent
    monkeypatch.setattr(windows, "read_parent", lambda p: reads.append(p) or real(p))
    cut_crops(table, "image", str(tmp_path / "out"), center="cx,cy", size=20)
    assert sorted(os.path.basename(p) for p in reads) == ["a.png", "b.png"]


def test_a_window_past_the_border_is_refused_naming_crop_and_image(tmp_path) -> None:
    rows = [("inside", "a", "A", "a.png", 60, 60), ("edge-cell", "a", "A", "a.png", 150, 10)]
    table = write_study(tmp_path, rows, {"a.png": gradient()})
    out = tmp_path / "out"
    with pytest.raises(WindowError) as info:
        cut_crops(table, "image", str(out), center="cx,cy", size=100)
    message = str(info.value)
    assert "'edge-cell'" in message and "a.png" in message and "x 100..199, y -40..59" in message
    assert "160 x 120" in message and "--border" in message
    assert not out.exists()  # nothing half-written
    assert [e for e in os.listdir(tmp_path) if e.startswith(".out")] == []


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_padding_equals_numpy_pad(mode) -> None:
    rng = np.random.default_rng(3)
    img = rng.integers(0, 256, (23, 31, 3), dtype=np.uint8)
    P = 80  # np.pad's own iteration when a pad exceeds the image is part of what is checked
    kw = {"constant_values": 7} if mode == "constant" else {}
    full = np.pad(img, ((P, P), (P, P), (0, 0)), mode=mode, **kw)
    windows = [(-5, -9, 12, 12), (25, 20, 10, 10), (-40, 3, 60, 5), (-10, -10, 51, 43), (30, 22, 40, 40), (3, 4, 5, 6)]
    windows += [tuple(int(v) for v in rng.integers(-30, 30, 2)) + tuple(int(v) for v in rng.integers(1, 50, 2)) for _ in range(40)]
    for x0, y0, w, h in windows:
        if x0 >= 31 or y0 >= 23 or x0 + w <= 0 or y0 + h <= 0:
            continue
        got = cut_window(img, x0, y0, w, h, mode, fill=7)
        np.testing.assert_array_equal(got, full[y0 + P:y0 + P + h, x0 + P:x0 + P + w], err_msg=f"{mode} {x0, y0, w, h}")


def test_padded_crops_are_written_marked_and_warned(tmp_path) -> None:
    img = gradient()
    rows = [("corner", "a", "A", "a.png", 5, 5), ("inside", "b", "A", "a.png", 80, 60)]
    table = write_study(tmp_path, rows, {"a.png": img})
    out = str(tmp_path / "out")
    with pytest.warns(WindowWarning, match=r"1 of 2 windows .* padded \(reflect\)"):
        result = cut_crops(table, "image", out, center="cx,cy", size=30, border="reflect")
    assert result.padded == ("corner",)
    expected = np.pad(img, ((10, 0), (10, 0), (0, 0)), mode="reflect")[0:30, 0:30]
    np.testing.assert_array_equal(crop_pixels(out, "corner"), expected)
    written = pd.read_csv(os.path.join(out, "crops.csv"))
    assert written.set_index("id")["padded"].to_dict() == {"corner": True, "inside": False}
    assert written.set_index("id").loc["corner", ["x", "y"]].tolist() == [-10, -10]
    with open(os.path.join(out, "crops.json")) as f:
        side = json.load(f)
    assert side["border"] == "reflect" and side["padded"] == ["corner"] and side["geometry"] == {"center": ["cx", "cy"], "size": 30}


def test_a_window_wholly_outside_is_an_error_in_every_mode(tmp_path) -> None:
    table = write_study(tmp_path, [("far", "a", "A", "a.png", 400, 60)], {"a.png": gradient()})
    with pytest.raises(WindowError, match="'far'.*wholly outside"):
        cut_crops(table, "image", str(tmp_path / "out"), center="cx,cy", size=20, border="constant")


def test_written_table_gives_audit_its_pixel_overlap(tmp_path, capsys) -> None:
    """Two centres 10 px apart with size 100 share pixels; a crop 200 px away and one in
    another image do not: m = (1, 1, 0, 0), so pixel overlap = (2 (1 - q)) / 4 at q = 0.2."""
    big = gradient(300, 400)
    rows = [("a1", "x", "A", "a.png", 100, 100), ("a2", "y", "A", "a.png", 110, 100),
            ("a3", "x", "A", "a.png", 300, 200), ("b1", "y", "B", "b.png", 100, 100)]
    table = write_study(tmp_path, rows, {"a.png": big, "b.png": big})
    out = str(tmp_path / "out")
    result = cut_crops(table, "image", out, center="cx,cy", size=100)
    crops = CropTable.from_csv(result.table_path, id="id", label="label", parent="parent", image="path", box="x,y,w,h")
    i, j = crops.overlap_pairs
    pairs = {tuple(sorted((crops.ids[a], crops.ids[b]))) for a, b in zip(i, j)}
    assert pairs == {("a1", "a2")}
    from shortcutlab.cli import main

    report = str(tmp_path / "audit.json")
    assert main(["audit", result.table_path, "--id", "id", "--label", "label", "--parent", "parent",
                 "--box", "x,y,w,h", "--json", report]) == 0
    with open(report) as f:
        figures = json.load(f)
    assert figures["overlap_share"] == pytest.approx(0.5)
    assert figures["pixel_overlap"] == pytest.approx(2 * (1 - 0.2) / 4)


def test_cli_writes_the_folder_and_replaces_its_own_output(tmp_path, capsys) -> None:
    from shortcutlab.cli import main

    table = write_study(tmp_path, [("c1", "a", "A", "a.png", 60, 60), ("c2", "b", "A", "a.png", 8, 60)], {"a.png": gradient()})
    out = str(tmp_path / "out")
    argv = ["crops", table, "--parent-image", "image", "--center", "cx,cy", "--size", "20", "--out", out, "--border", "edge"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "cut 2 crops from 1 parent images (1 padded, border edge)" in text and "warning: 1 of 2 windows" in text
    assert sorted(os.listdir(os.path.join(out, "crops"))) == ["c1.png", "c2.png"]
    assert main(argv[:-2] + ["--border", "reflect"]) == 0  # its own earlier output is replaced
    with open(os.path.join(out, "crops.json")) as f:
        assert json.load(f)["border"] == "reflect"


def test_a_folder_of_other_files_is_refused_before_any_crop_is_written(tmp_path, capsys) -> None:
    from shortcutlab.cli import main

    table = write_study(tmp_path, [("c1", "a", "A", "a.png", 60, 60)], {"a.png": gradient()})
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rc = main(["crops", table, "--parent-image", "image", "--center", "cx,cy", "--size", "20", "--out", str(out)])
    assert rc == 2 and "notes.txt" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["notes.txt"]


def test_ids_that_are_not_file_names_get_safe_unique_names(tmp_path) -> None:
    rows = [("img1/3", "a", "A", "a.png", 60, 60), ("img1_3", "a", "A", "a.png", 70, 60), ("..", "a", "A", "a.png", 80, 60)]
    table = write_study(tmp_path, rows, {"a.png": gradient()})
    out = str(tmp_path / "out")
    cut_crops(table, "image", out, center="cx,cy", size=10)
    paths = pd.read_csv(os.path.join(out, "crops.csv")).set_index("id")["path"].to_dict()
    assert len(set(paths.values())) == 3 and all(p.startswith("crops/") and "/" not in p[6:] for p in paths.values())
    np.testing.assert_array_equal(crop_pixels(out, "img1/3"), gradient()[55:65, 55:65])


def test_sixteen_bit_grey_parents_keep_their_values(tmp_path) -> None:
    y, x = np.mgrid[0:50, 0:60]
    img = (x * 1000 + y).astype(np.uint16)
    Image.fromarray(img).save(tmp_path / "g.png")
    pd.DataFrame({"id": ["g"], "label": ["a"], "parent": ["G"], "im": ["g.png"], "cx": [30], "cy": [20]}).to_csv(
        tmp_path / "t.csv", index=False)
    out = str(tmp_path / "out")
    cut_crops(str(tmp_path / "t.csv"), "im", out, center="cx,cy", size=8)
    np.testing.assert_array_equal(crop_pixels(out, "g"), img[16:24, 26:34])


def test_a_failed_run_leaves_the_earlier_output(tmp_path) -> None:
    table = write_study(tmp_path, [("c1", "a", "A", "a.png", 60, 60)], {"a.png": gradient()})
    out = str(tmp_path / "out")
    cut_crops(table, "image", out, center="cx,cy", size=20)
    before = crop_pixels(out, "c1")
    with pytest.raises(WindowError, match="'c1'.*reaches past"):
        cut_crops(table, "image", out, center="cx,cy", size=150)
    np.testing.assert_array_equal(crop_pixels(out, "c1"), before)
    assert pd.read_csv(os.path.join(out, "crops.csv"))["w"].tolist() == [20]


def test_a_frame_with_a_root_and_a_group_column(tmp_path) -> None:
    img = gradient()
    (tmp_path / "imgs").mkdir()
    Image.fromarray(img).save(tmp_path / "imgs" / "f.png")
    frame = pd.DataFrame({"cell": [7, 8], "cls": ["a", "b"], "field": [1, 1], "patient": ["P1", "P1"], "file": ["f.png"] * 2,
                          "x": [10.0, 20.4], "y": [30.0, 29.6]})
    out = str(tmp_path / "out")
    result = cut_crops(frame, "file", out, center=["x", "y"], size=10, id="cell", label="cls", parent="field",
                       group="patient", root=str(tmp_path / "imgs"))
    written = pd.read_csv(result.table_path)
    assert written["group"].tolist() == ["P1", "P1"] and written["parent"].tolist() == [1, 1]
    # centre (20.4, 29.6): top-left floor(20.4 - 5 + 0.5), floor(29.6 - 5 + 0.5) = (15, 25)
    assert written[["x", "y"]].values.tolist() == [[5, 25], [15, 25]]
    np.testing.assert_array_equal(crop_pixels(out, "8"), img[25:35, 15:25])


def test_the_working_directory_is_not_replaced(tmp_path, monkeypatch) -> None:
    table = write_study(tmp_path, [("c1", "a", "A", "a.png", 60, 60)], {"a.png": gradient()})
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path / "out")
    with pytest.raises(WindowError, match="holds the working directory"):
        cut_crops(table, "image", ".", center="cx,cy", size=20)


def test_refused_windows_are_found_before_any_image_is_decoded(tmp_path, monkeypatch) -> None:
    import shortcutlab.ingest.windows as windows

    rows = [("a", "a", "A", "a.png", 60, 60), ("b", "a", "A", "a.png", 2, 60), ("c", "a", "B", "b.png", 60, 118),
            ("d", "a", "B", "b.png", 60, 119)]
    table = write_study(tmp_path, rows, {"a.png": gradient(), "b.png": gradient()})
    monkeypatch.setattr(windows, "read_parent", lambda p: pytest.fail("an image was decoded before the border check"))
    with pytest.raises(WindowError, match=r"crop 'b': window x -3\.\.6, y 55\.\.64 reaches past .*a\.png' \(2 more windows do\)"):
        cut_crops(table, "image", str(tmp_path / "out"), center="cx,cy", size=10)
    assert not (tmp_path / "out").exists()
