"""`shortcutlab.ingest.locate`: crops found in field images, against the boxes they were cut from.

The data are generated here with known truth: 20 smooth random RGB fields of 256 x 192, 100
crops of 32-48 px cut from them (even ones saved as PNG, exact copies; odd ones re-encoded as
JPEG at quality 90), a crop cut from an image that is not among the fields, a crop whose pixels
were pasted into a second field, and a crop of a low-contrast field (no texture to index, so
only the coarse-to-fine fallback can find it).
"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from shortcutlab.ingest.locate import LocateError, LocateWarning, choose_scale, list_fields, locate

H, W, N_FIELDS, N_CROPS = 192, 256, 20, 100


def smooth_field(rng: np.random.Generator, h: int = H, w: int = W, contrast: float = 1.0) -> np.ndarray:
    """(h, w, 3) uint8: smooth noise at three scales around grey 128."""
    from scipy import ndimage

    x = np.zeros((h, w, 3))
    for sigma, amp in ((6, 60), (2, 30), (0.8, 12)):
        n = ndimage.gaussian_filter(rng.normal(size=(h, w, 3)), (sigma, sigma, 0))
        x += contrast * amp * n / n.std()
    return np.clip(x + 128, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A released folder: fields/, crops/, and table.csv with the truth beside the table."""
    root = tmp_path_factory.mktemp("released")
    rng = np.random.default_rng(22)
    fields = [smooth_field(rng) for _ in range(N_FIELDS)]
    fields[2] = smooth_field(rng, contrast=0.06)   # under two quantisation bins: nothing to index
    dup = fields[0][40:88, 50:98].copy()
    fields[1][100:148, 150:198] = dup              # field 1 holds a copy of a piece of field 0
    os.makedirs(root / "fields")
    os.makedirs(root / "crops")
    for i, f in enumerate(fields):
        Image.fromarray(f).save(root / "fields" / f"f{i:02d}.png")
    rows = []
    for k in range(N_CROPS):
        f_i = int(rng.integers(3, N_FIELDS))       # fields 0-2 hold the special cases
        h, w = (int(v) for v in rng.integers(32, 49, size=2))
        y, x = int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1))
        jpeg = k % 2 == 1
        path = f"crops/c{k:03d}." + ("jpg" if jpeg else "png")
        Image.fromarray(fields[f_i][y:y + h, x:x + w]).save(root / path, **({"quality": 90} if jpeg else {}))
        rows.append({"id": f"c{k:03d}", "path": path, "parent": f"f{f_i:02d}", "true_parent": f"f{f_i:02d}",
                     "true_x": x, "true_y": y, "jpeg": jpeg})
    Image.fromarray(dup).save(root / "crops" / "dup.png")
    rows.append({"id": "dup", "path": "crops/dup.png", "parent": "", "true_parent": "f00", "true_x": 50, "true_y": 40, "jpeg": False})
    Image.fromarray(fields[2][60:100, 80:124]).save(root / "crops" / "low.png")
    rows.append({"id": "low", "path": "crops/low.png", "parent": "f02", "true_parent": "f02", "true_x": 80, "true_y": 60, "jpeg": False})
    Image.fromarray(smooth_field(np.random.default_rng(999), 40, 40)).save(root / "crops" / "stray.png")
    rows.append({"id": "stray", "path": "crops/stray.png", "parent": "f05", "true_parent": "", "true_x": -1, "true_y": -1, "jpeg": False})
    truth = pd.DataFrame(rows)
    # three filename parents that are wrong, to be counted as disagreements
    truth.loc[[4, 9, 30], "parent"] = "elsewhere", "f99", "nowhere"
    truth[["id", "path", "parent"]].to_csv(root / "table.csv", index=False)
    return root, truth


@pytest.fixture(scope="module")
def located(released):
    root, _ = released
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table, summary = locate(str(root / "table.csv"), str(root / "fields"), allow_unmatched=True)
    return table, summary, caught


def _rows(truth, table, mask):
    return truth[mask.to_numpy()], table[mask.to_numpy()]


def test_exact_copies_are_found_exactly(released, located):
    _, truth = released
    table, _, _ = located
    t, got = _rows(truth, table, ~truth.jpeg & truth.id.str.startswith("c"))
    assert len(t) == 50
    assert (got.parent.to_numpy() == t.true_parent.to_numpy()).all()
    assert (got.x.astype(int).to_numpy() == t.true_x.to_numpy()).all()
    assert (got.y.astype(int).to_numpy() == t.true_y.to_numpy()).all()
    assert (got.match_score > 0.9999).all()


def test_jpeg_q90_copies_are_found_within_2_px(released, located):
    _, truth = released
    table, _, _ = located
    t, got = _rows(truth, table, truth.jpeg)
    assert len(t) == 50
    assert (got.parent.to_numpy() == t.true_parent.to_numpy()).all()
    assert (np.abs(got.x.astype(int).to_numpy() - t.true_x.to_numpy()) <= 2).all()
    assert (np.abs(got.y.astype(int).to_numpy() - t.true_y.to_numpy()) <= 2).all()
    assert (got.w.to_numpy() == [Image.open(released[0] / p).size[0] for p in t.path]).all()


def test_match_score_is_the_pearson_correlation_of_the_grey_pixels(released, located):
    """The score, recomputed by hand: correlation of the crop's and the field window's luma."""
    root, truth = released
    table, _, _ = located
    luma = np.array([0.299, 0.587, 0.114])
    for r in (1, 2, 7):
        row = table.iloc[r]
        crop = np.asarray(Image.open(root / row.path).convert("RGB"), dtype=float) @ luma
        field = np.asarray(Image.open(root / "fields" / f"{row.parent}.png").convert("RGB"), dtype=float) @ luma
        win = field[int(row.y):int(row.y) + int(row.h), int(row.x):int(row.x) + int(row.w)]
        assert row.match_score == pytest.approx(np.corrcoef(crop.ravel(), win.ravel())[0, 1], abs=1e-4)


def test_a_crop_of_no_field_is_listed_unmatched_when_allowed(located):
    table, summary, _ = located
    row = table[table.id == "stray"].iloc[0]
    assert row.parent == "" and pd.isna(row.x) and row.method == "none"
    assert pd.isna(row.match_score)   # textured, and no key of it in any field: nothing to verify
    assert summary["n_unmatched"] == 1 and summary["unmatched"][0]["id"] == "stray"


def test_a_crop_of_no_field_is_an_error_naming_it(released):
    root, truth = released
    small = truth[truth.id.isin(["c000", "stray"])][["id", "path"]]
    small.to_csv(root / "two.csv", index=False)
    with pytest.raises(LocateError, match=r"row 1 \(id 'stray'\), column 'path': crop 'crops/stray.png' matched no field at NCC >= 0.9.*--allow-unmatched"):
        locate(str(root / "two.csv"), str(root / "fields"))


def test_a_crop_in_two_fields_is_flagged(located):
    table, summary, caught = located
    row = table[table.id == "dup"].iloc[0]
    assert bool(row.ambiguous)
    assert {row.parent, row.second_parent} == {"f00", "f01"}
    assert row.second_score > 0.9999
    assert summary["n_ambiguous"] == 1
    assert table.ambiguous.sum() == 1
    assert any(issubclass(w.category, LocateWarning) and "'dup'" in str(w.message) for w in caught)


def test_low_contrast_crop_is_found_by_the_coarse_to_fine_fallback(located):
    table, summary, _ = located
    row = table[table.id == "low"].iloc[0]
    assert (row.parent, int(row.x), int(row.y), row.method) == ("f02", 80, 60, "coarse")
    assert summary["n_by_method"]["coarse"] >= 1


def test_agreement_with_the_filename_parent_is_counted(released, located):
    _, truth = released
    _, summary, _ = located
    a = summary["agreement"]
    # by hand: 100 random crops and 'low' carry a parent; 'dup' has none; 'stray' is unmatched;
    # rows 4, 9 and 30 name a wrong field
    assert (a["column"], a["n_compared"], a["n_agree"], a["n_disagree"]) == ("parent", 101, 98, 3)
    assert a["share"] == pytest.approx(98 / 101)
    assert [d["row"] for d in a["first_disagreements"]] == [4, 9, 30]
    assert a["first_disagreements"][2] == {"row": 30, "id": "c030", "table": "nowhere", "located": truth.true_parent[30]}


def test_table_parent_is_kept_beside_the_located_one(located):
    table, _, _ = located
    assert list(table.columns[:3]) == ["id", "path", "table_parent"]
    assert table.table_parent[30] == "nowhere"


def test_repeated_stems_name_fields_by_relative_path(tmp_path):
    rng = np.random.default_rng(1)
    for cls in ("a", "b"):
        os.makedirs(tmp_path / cls)
        Image.fromarray(smooth_field(rng, 64, 64)).save(tmp_path / cls / "001.png")
    assert [f.name for f in list_fields(str(tmp_path))] == ["a/001", "b/001"]
    assert [f.stem for f in list_fields(str(tmp_path))] == ["001", "001"]


def test_scale_leaves_eight_blocks_across():
    assert [choose_scale(s) for s in (8, 16, 32, 47, 64, 128, 1000)] == [1, 2, 4, 4, 8, 8, 8]


def test_cli_writes_the_table_and_sidecar(released, tmp_path, capsys):
    from shortcutlab.cli import main

    root, truth = released
    sub = truth[truth.id.isin(["c000", "c001", "c002", "stray"])][["id", "path", "parent"]]
    sub.to_csv(root / "four.csv", index=False)
    out = tmp_path / "located.csv"
    argv = ["locate", str(root / "four.csv"), "--fields", str(root / "fields"), "--out", str(out)]
    assert main(argv) == 2
    assert "stray" in capsys.readouterr().err and not out.exists()
    assert main(argv + ["--allow-unmatched"]) == 0
    printed = capsys.readouterr().out
    got = pd.read_csv(out, keep_default_na=False)
    assert got.parent.tolist() == truth.true_parent[[0, 1, 2]].tolist() + [""]
    side = json.loads((tmp_path / "located.json").read_text())
    assert side["n_matched"] == 3 and side["agreement"]["n_agree"] == 3
    assert "3 of 3" in printed and "unmatched" in printed


def test_without_the_fallback_the_low_contrast_crop_is_not_found(released):
    root, truth = released
    truth[truth.id.isin(["c000", "low"])][["id", "path"]].to_csv(root / "low.csv", index=False)
    table, summary = locate(str(root / "low.csv"), str(root / "fields"), allow_unmatched=True, fallback="never")
    assert table.parent.tolist() == [truth.true_parent[0], ""]
    assert summary["method"]["fallback"] == "never"
    with pytest.raises(LocateError, match="--fallback must be one of auto, always, never; got 'sometimes'"):
        locate(str(root / "low.csv"), str(root / "fields"), fallback="sometimes")


def test_a_dataframe_or_a_list_of_paths_can_be_located(released):
    root, truth = released
    frame = truth[truth.id.isin(["c000", "c001", "dup"])][["id", "path", "parent"]].copy()
    frame.loc[frame.id == "dup", "parent"] = np.nan   # a missing parent is not compared
    with pytest.warns(LocateWarning, match=r"crops matching two fields at NCC >= 0.9 \(within 0.01\): 1 \(first: id 'dup'"):
        table, summary = locate(frame, str(root / "fields"), root=str(root))
    assert table.parent.tolist()[:2] == truth.true_parent[[0, 1]].tolist()
    assert summary["agreement"]["n_compared"] == 2
    listed, _ = locate([str(root / "crops" / "c000.png")], str(root / "fields"))
    assert (listed.parent[0], int(listed.x[0]), int(listed.y[0])) == (truth.true_parent[0], truth.true_x[0], truth.true_y[0])


def test_a_flat_crop_is_unmatched_with_a_warning(released, tmp_path):
    root, _ = released
    Image.fromarray(np.full((40, 40, 3), 128, dtype=np.uint8)).save(tmp_path / "flat.png")
    with pytest.warns(LocateWarning, match="flat crops"):
        table, summary = locate([str(tmp_path / "flat.png")], str(root / "fields"), allow_unmatched=True)
    assert (table.parent[0], table.method[0], summary["n_flat"]) == ("", "flat", 1)
    with pytest.raises(LocateError, match="is flat"):
        locate([str(tmp_path / "flat.png")], str(root / "fields"))


def test_crops_of_the_synthetic_benchmark_are_found_at_their_manifest_box(tmp_path):
    """Cells on signature-free fields look alike across fields; each crop is still found at the
    box `shortcutlab.synth` cut it from, and no look-alike is flagged as a second source."""
    from shortcutlab.synth import SynthConfig, render_field, synthesize

    cfg = SynthConfig(fields_per_class=3, crop_size=48, seed=3, mechanisms="none")
    data = synthesize(cfg)
    os.makedirs(tmp_path / "fields")
    for i in range(cfg.n_classes * cfg.fields_per_class):
        fr = render_field(cfg, i)
        Image.fromarray(fr.image.permute(1, 2, 0).numpy()).save(tmp_path / "fields" / f"{fr.field['id']}.png")
    truth = data.table.reset_index(drop=True)
    paths = []
    for k in range(len(truth)):
        paths.append(str(tmp_path / f"c{k}.png"))
        Image.fromarray(data.images[k].permute(1, 2, 0).numpy()).save(paths[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", LocateWarning)
        table, summary = locate(paths, str(tmp_path / "fields"))
    assert table.parent.tolist() == truth.parent.tolist()
    assert table.x.astype(int).tolist() == truth.x.tolist() and table.y.astype(int).tolist() == truth.y.tolist()
    assert summary["n_ambiguous"] == 0


def test_crops_kept_inside_the_fields_folder_are_not_their_own_fields(tmp_path):
    # SIPaKMeD keeps im_<Class>/CROPPED/ inside the folder of its field images: with --fields
    # pointing at the release, every crop file is under it too. A crop must be found in its
    # field, not in its own file (which matches it perfectly).
    rng = np.random.default_rng(5)
    fields = [smooth_field(rng, 96, 128) for _ in range(3)]
    os.makedirs(tmp_path / "rel" / "CROPPED")
    rows = []
    for i, f in enumerate(fields):
        Image.fromarray(f).save(tmp_path / "rel" / f"field{i}.png")
        y, x = 10 + 7 * i, 20 + 5 * i
        path = f"rel/CROPPED/field{i}_1.png"
        Image.fromarray(f[y:y + 40, x:x + 40]).save(tmp_path / path)
        rows.append({"id": f"c{i}", "path": path, "truth": f"field{i}", "x0": x, "y0": y})
    pd.DataFrame(rows).to_csv(tmp_path / "t.csv", index=False)
    assert "field0_1" in [f.name for f in list_fields(str(tmp_path / "rel"))]  # without the exclusion they are fields
    table, summary = locate(str(tmp_path / "t.csv"), str(tmp_path / "rel"))
    truth = pd.DataFrame(rows)
    assert list(table.parent) == list(truth.truth) and not table.ambiguous.astype(bool).any()
    assert list(table.x.astype(int)) == list(truth.x0) and list(table.y.astype(int)) == list(truth.y0)
