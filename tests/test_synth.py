"""The synthetic benchmark: determinism, masks, planted signatures (and their absence under
'none'), class morphology, files, the command line, and parameter checks."""

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import ndimage, stats

from shortcutlab import CropTable, ShortcutlabError, summarize
from shortcutlab.cli import main
from shortcutlab.synth import (
    MECHANISMS,
    SynthConfig,
    SynthData,
    SynthError,
    class_means,
    load_synth,
    parse_mechanisms,
    render_field,
    synthesize,
    write_synth,
)

SMALL = dict(fields_per_class=4, crop_size=32, seed=1)
MANIFEST_COLUMNS = dict(id="id", label="label", parent="parent", image="path", mask="mask", box="x,y,w,h")


@pytest.fixture(scope="module")
def small() -> SynthData:
    return synthesize(SynthConfig(**SMALL))


@pytest.fixture(scope="module")
def written(small, tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "bench"
    return small, write_synth(small, out)


def _files(folder) -> dict:
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, folder)] = fh.read()
    return out


def _field_index(data: SynthData) -> np.ndarray:
    return pd.factorize(data.table["parent"], sort=True)[0]


def _background_medians(data: SynthData) -> np.ndarray:
    """(fields, 3) median colour of the crop pixels outside the crop's own cell."""
    img = data.images.numpy().astype(np.float64)
    outside = ~data.masks.numpy()[:, 0]
    f = _field_index(data)
    out = np.zeros((f.max() + 1, 3))
    for i in range(f.max() + 1):
        sel = f == i
        for ch in range(3):
            out[i, ch] = np.median(img[sel, ch][outside[sel]])
    return out


# ---------------------------------------------------------------------- structure
def test_shapes_types_and_table(small):
    cfg = small.config
    n = len(small)
    assert small.images.shape == (n, 3, 32, 32) and small.images.dtype == torch.uint8
    assert small.masks.shape == (n, 1, 32, 32) and small.masks.dtype == torch.bool
    assert list(small.table.columns) == ["id", "label", "parent", "x", "y", "w", "h"]
    assert n == sum(f["n_cells"] for f in small.fields) and len(small.fields) == cfg.n_fields == 12
    assert small.table["id"].is_unique and small.table["id"].is_monotonic_increasing
    assert set(small.table["label"]) == {"class0", "class1", "class2"}
    assert (small.table.groupby("parent").size() >= 2).all()  # every crop has a sibling
    t = small.table
    assert (t[["x", "y"]].to_numpy() >= 0).all() and ((t[["x", "y"]] + 32).to_numpy() <= cfg.field_size).all()
    table = CropTable.from_frame(t, id="id", label="label", parent="parent", box="x,y,w,h")
    assert table.n_crops == n and table.n_parents == 12 and table.has_geometry
    assert small.crop_table().n_crops == n
    assert list(small.cells["id"]) == list(t["id"])
    for f in small.fields:
        assert set(f["signature"]) == set(MECHANISMS)
        assert f["class_mix"][f["dominant"]] == 1.0


def test_defaults_are_a_useful_benchmark():
    cfg = SynthConfig()
    assert cfg.mechanisms == MECHANISMS and cfg.strength == 1.0 and cfg.n_classes == 3
    assert cfg.crop_size == 64 and cfg.field_size == 192 and cfg.fields_per_class == 50
    assert not cfg.mixed_fields and 0 < cfg.class_signal < 1


@pytest.mark.parametrize("crop", [8, 32, 48])
def test_other_crop_sizes_render_whole_cells(crop):
    d = synthesize(SynthConfig(fields_per_class=2, crop_size=crop, seed=4))
    m = d.masks.numpy()[:, 0]
    assert d.images.shape[2:] == (crop, crop)
    assert m[:, crop // 2, crop // 2].all()
    assert not m[:, 0, :].any() and not m[:, -1, :].any() and not m[:, :, 0].any() and not m[:, :, -1].any()


# ---------------------------------------------------------------------- determinism
def test_same_seed_same_tensors_other_seed_differs(small):
    again = synthesize(SynthConfig(**SMALL), workers=1)
    assert torch.equal(again.images, small.images) and torch.equal(again.masks, small.masks) and torch.equal(again.all_cells, small.all_cells)
    pd.testing.assert_frame_equal(again.table, small.table)
    assert again.fields == small.fields
    other = synthesize(SynthConfig(**{**SMALL, "seed": 2}))
    assert other.images.shape != small.images.shape or not torch.equal(other.images, small.images)


def test_same_seed_gives_byte_identical_files(written, tmp_path):
    data, paths = written
    again = write_synth(synthesize(SynthConfig(**SMALL)), tmp_path / "again")
    a, b = _files(paths["out_dir"]), _files(again["out_dir"])
    assert set(a) == set(b) and len(a) == 3 * len(data) + 4  # crop, mask, all-cells mask per crop; 3 files and the output marker
    assert all(a[k] == b[k] for k in a)
    doc = json.loads(a["synth.json"])
    assert not {"time", "date", "created", "timestamp"} & set(doc)


def test_toggling_a_mechanism_keeps_the_cells():
    base = dict(fields_per_class=3, crop_size=32, seed=5)
    none, full, color = (synthesize(SynthConfig(**base, mechanisms=m)) for m in ("none", MECHANISMS, "color"))
    for d in (full, color):
        assert torch.equal(d.masks, none.masks)
        pd.testing.assert_frame_equal(d.table, none.table)
        pd.testing.assert_frame_equal(d.cells, none.cells)
    # The colour draws do not depend on which other mechanisms are planted.
    assert [f["signature"]["color"] for f in full.fields] == [f["signature"]["color"] for f in color.fields]


# ---------------------------------------------------------------------- masks and morphology
def _inside_minus_border(data: SynthData) -> np.ndarray:
    """Per crop: mean brightness (R+G+B) inside the own-cell mask minus the median of the crop's
    border ring outside the mask (mostly background)."""
    img = data.images.numpy().astype(np.float64).sum(axis=1)
    out = []
    for m, x in zip(data.masks.numpy()[:, 0], img):
        ring = np.zeros_like(m)
        ring[[0, -1], :] = ring[:, [0, -1]] = True
        out.append(x[m].mean() - np.median(x[ring & ~m]))
    return np.array(out)


def test_masks_are_one_blob_on_the_centre_and_differ_from_background(small):
    for m in small.masks.numpy()[:, 0]:
        _, n = ndimage.label(m)
        assert n == 1 and m[16, 16]
    # The cell absorbs light: darker inside its mask than around it, in every crop of
    # signature-free fields, and in nearly all with every signature planted.
    none = synthesize(SynthConfig(**{**SMALL, "mechanisms": "none"}))
    assert (_inside_minus_border(none) < -20).all()
    diff = _inside_minus_border(small)
    assert np.median(diff) < -20 and (diff < 0).mean() > 0.95


def test_mask_area_follows_the_planted_cell_size():
    d = synthesize(SynthConfig(fields_per_class=5, crop_size=64, seed=2, mechanisms="none"))
    area = d.masks.numpy().sum(axis=(1, 2, 3))
    planted = np.pi * np.exp(2 * d.cells["log_cell_radius"].to_numpy())  # px, at 64 px crops
    assert stats.spearmanr(area, planted)[0] > 0.97
    assert 0.85 < np.median(area / planted) < 1.15


def test_class_morphology_is_ordered_as_planted():
    cfg = SynthConfig(fields_per_class=8, crop_size=64, seed=3, class_signal=1.0, mechanisms="none")
    d = synthesize(cfg)
    means = class_means(cfg)
    lum = d.images.numpy().astype(np.float64).mean(axis=1)
    m = d.masks.numpy()[:, 0]
    area = m.sum(axis=(1, 2))
    dark = np.array([np.percentile(x[k], 3) for x, k in zip(lum, m)])  # chromatin
    nucleus = np.array([(x[k] < 0.5 * (np.median(x[k]) + d_)).sum() for x, k, d_ in zip(lum, m, dark)])
    label = d.table["label"].str[5:].astype(int).to_numpy()
    per = lambda v: np.array([v[label == k].mean() for k in range(3)])  # noqa: E731
    # Planted: cells shrink, nucleus-to-cell ratio and chromatin darkness grow with the class.
    assert np.all(np.diff(means[:, 0]) < 0) and np.all(np.diff(means[:, 3]) > 0) and np.all(np.diff(means[:, 5]) > 0)
    assert np.all(np.diff(per(area)) < 0)
    assert np.all(np.diff(per(nucleus / area)) > 0)
    assert np.all(np.diff(per(dark)) < 0)


def test_class_signal_zero_makes_classes_identical():
    means = class_means(SynthConfig(class_signal=0.0))
    assert np.allclose(means, means[0])


# ---------------------------------------------------------------------- planted signatures
def test_none_plants_no_signature():
    d = synthesize(SynthConfig(fields_per_class=4, crop_size=32, seed=6, mechanisms="none"))
    for f in d.fields:
        s = f["signature"]
        assert s["color"] == {"rgb_gain": [1.0, 1.0, 1.0], "stain_rotation_deg": 0.0}
        assert all(v == 0.0 for v in s["illumination"].values())
        assert s["background"]["tint_od"] == [0.0, 0.0, 0.0] and s["background"]["texture_od"] == 0.0
        assert s["background"]["debris_rate"] == 0.0
        assert s["focus"]["sigma_px"] == 0.0
        assert s["noise"]["amplitude_levels"] == 0.0 and s["noise"]["banding_levels"] == 0.0
    # Fields are indistinguishable apart from their cells: background colour and noise agree.
    med = _background_medians(d)
    assert med.std(axis=0).max() < 0.8
    full = synthesize(SynthConfig(fields_per_class=4, crop_size=32, seed=6))
    assert _background_medians(full).std(axis=0).min() > 5 * med.std(axis=0).max()


def test_color_spread_across_fields_grows_with_strength():
    spread = {}
    for s in (0.0, 0.5, 1.0, 2.0):
        cfg = SynthConfig(fields_per_class=5, crop_size=32, seed=7, mechanisms="color" if s else "none", strength=s or 1.0)
        d = synthesize(cfg)
        med = _background_medians(d)
        spread[s] = np.log(med).std(axis=0).mean()
        if s:
            gain = np.log([f["signature"]["color"]["rgb_gain"] for f in d.fields])
            for ch in range(3):  # the measured background colour follows the planted gain
                assert np.corrcoef(np.log(med[:, ch]), gain[:, ch])[0, 1] > 0.97
    assert spread[0.0] < 0.004 < 0.02 < spread[1.0]  # several percent at strength 1
    assert spread[0.0] < spread[0.5] < spread[1.0] < spread[2.0]
    ratio = spread[2.0] / spread[1.0]
    assert ratio > 1.6 and ratio < 2.4


def test_illumination_gradient_is_recovered_from_the_field():
    cfg = SynthConfig(fields_per_class=2, crop_size=32, seed=8, mechanisms="illumination")
    for i in range(cfg.n_fields):
        r = render_field(cfg, i)
        img = r.image.numpy().astype(np.float64)
        bg = (r.cells.numpy() == 0) & (img.max(axis=0) < 250)  # saturated pixels say nothing
        H, W = bg.shape
        yy, xx = np.mgrid[0:H, 0:W]
        x1, y1 = (xx + 0.5) / W - 0.5, (yy + 0.5) / H - 0.5
        A = np.stack([np.ones(bg.sum()), x1[bg], y1[bg], -(4 * x1[bg] ** 2 + 4 * y1[bg] ** 2)], axis=1)
        planted = r.field["signature"]["illumination"]
        for ch in range(3):
            coef = np.linalg.lstsq(A, np.log(img[ch][bg]), rcond=None)[0]
            assert abs(coef[1] - planted["gradient_x"]) < 0.03
            assert abs(coef[2] - planted["gradient_y"]) < 0.03
            assert abs(coef[3] - planted["vignetting"]) < 0.03


def test_illumination_shading_zero_is_one_gain_per_field():
    """Shading 0: the field is the signature-free field times exp(log_gain) everywhere (no
    gradient, no vignette), with the same gain as the default draw; shading 2 doubles the shape."""
    base = dict(fields_per_class=1, crop_size=32, field_size=128, seed=4, baseline_noise=0.0)
    flat = SynthConfig(**base, mechanisms="illumination", strength=3.0, illumination_shading=0.0)
    plain = SynthConfig(**base, mechanisms="none")
    for i in range(flat.n_fields):
        lit, dark = render_field(flat, i), render_field(plain, i)
        a, b = lit.image.numpy().astype(np.float64), dark.image.numpy().astype(np.float64)
        ok = (a > 40) & (a < 250) & (b > 40) & (b < 250)
        log_ratio = np.log(a[ok] / b[ok])
        planted = lit.field["signature"]["illumination"]
        assert planted["gradient_x"] == planted["gradient_y"] == planted["vignetting"] == 0.0
        assert abs(float(np.median(log_ratio)) - planted["log_gain"]) < 0.01
        assert float(np.percentile(np.abs(log_ratio - planted["log_gain"]), 95)) < 0.02  # 8-bit rounding only
        shaded = [render_field(SynthConfig(**base, mechanisms="illumination", strength=3.0, illumination_shading=h), i)
                  .field["signature"]["illumination"] for h in (1.0, 2.0)]
        assert shaded[0]["log_gain"] == shaded[1]["log_gain"] == planted["log_gain"]
        assert shaded[1]["gradient_x"] == pytest.approx(2 * shaded[0]["gradient_x"], abs=2e-6)
        assert shaded[1]["vignetting"] == pytest.approx(2 * shaded[0]["vignetting"], abs=2e-6)


def test_default_illumination_shading_leaves_the_config_dict_unchanged():
    assert "illumination_shading" not in SynthConfig().to_dict()  # configs and task ids from before the option
    d = SynthConfig(illumination_shading=0.5).to_dict()
    assert d["illumination_shading"] == 0.5 and SynthConfig.from_dict(d).illumination_shading == 0.5


def test_noise_pattern_is_fixed_in_field_coordinates():
    base = dict(fields_per_class=3, crop_size=32, seed=9)
    clean = synthesize(SynthConfig(**base, mechanisms="none"))
    noisy = synthesize(SynthConfig(**base, mechanisms="noise"))
    diff = noisy.images.numpy().astype(np.int16) - clean.images.numpy().astype(np.int16)
    t, f = noisy.table, _field_index(noisy)
    # The same pattern sits at the same field position in every sibling crop.
    found = 0
    for i in range(len(t)):
        for j in range(i + 1, len(t)):
            if f[i] != f[j]:
                continue
            dx, dy = int(t.x[j] - t.x[i]), int(t.y[j] - t.y[i])
            if abs(dx) >= 24 or abs(dy) >= 24:
                continue
            a = diff[i][:, max(dy, 0) : 32 + min(dy, 0), max(dx, 0) : 32 + min(dx, 0)]
            b = diff[j][:, max(-dy, 0) : 32 + min(-dy, 0), max(-dx, 0) : 32 + min(-dx, 0)]
            assert np.array_equal(a, b) and a.std() > 0.5
            found += 1
    assert found > 0
    # Its strength per field follows the planted amplitude; the pattern has no mean.
    sd = np.array([diff[f == k].std() for k in range(f.max() + 1)])
    planted = [s["signature"]["noise"] for s in noisy.fields]
    amp = [np.hypot(p["amplitude_levels"], p["banding_levels"] / np.sqrt(2)) for p in planted]  # SD of the pattern
    assert stats.spearmanr(sd, amp)[0] > 0.9
    assert abs(diff.mean()) < 0.2


def test_focus_removes_high_frequencies_as_planted():
    cfg = SynthConfig(fields_per_class=4, crop_size=64, seed=10, mechanisms="focus", baseline_noise=0.0)
    d = synthesize(cfg)
    lum = d.images.numpy().astype(np.float64).mean(axis=1)
    lap = np.array([np.mean(ndimage.laplace(x) ** 2) for x in lum])
    f = _field_index(d)
    energy = np.array([lap[f == k].mean() for k in range(f.max() + 1)])
    sigma = [s["signature"]["focus"]["sigma_px"] for s in d.fields]
    assert stats.spearmanr(energy, sigma)[0] < -0.85


def test_background_texture_and_debris_follow_the_plant():
    cfg = SynthConfig(fields_per_class=4, crop_size=32, seed=11, mechanisms="background")
    mad, dark, planted_tex, planted_debris = [], [], [], []
    for i in range(cfg.n_fields):
        r = render_field(cfg, i)
        lum = r.image.numpy().astype(np.float64).mean(axis=0)
        bg = ndimage.binary_erosion(r.cells.numpy() == 0, iterations=2)
        v = lum[bg]
        mad.append(np.median(np.abs(v - np.median(v))))
        dark.append(np.mean(v < np.median(v) - 25))
        planted_tex.append(r.field["signature"]["background"]["texture_od"])
        planted_debris.append(r.field["signature"]["background"]["debris_rate"])
    assert stats.spearmanr(mad, planted_tex)[0] > 0.8
    assert stats.spearmanr(dark, planted_debris)[0] > 0.7


# ---------------------------------------------------------------------- field structure
def test_mixed_fields_mix_classes():
    cfg = SynthConfig(fields_per_class=6, crop_size=32, seed=12, mixed_fields=True, mean_cells_per_field=10)
    d = synthesize(cfg)
    per_field = d.table.groupby("parent")["label"].nunique()
    assert (per_field > 1).mean() > 0.5
    for f in d.fields:
        assert abs(sum(f["class_mix"].values()) - 1) < 1e-5
        assert f["class_mix"][f["dominant"]] >= cfg.mix_dominance - 1e-6
    dominant = d.table["parent"].map({f["id"]: f["dominant"] for f in d.fields})
    assert (d.table["label"] == dominant).mean() > 0.55


def test_cells_per_field_follow_two_plus_poisson():
    d = synthesize(SynthConfig(fields_per_class=40, crop_size=16, seed=13, mechanisms="none", mean_cells_per_field=5))
    k = d.table.groupby("parent").size().to_numpy()
    assert k.min() >= 2 and abs(k.mean() - 5) < 0.5


def test_siblings_overlap_and_render_field_is_the_same_pixels(small):
    s = summarize(small.crop_table())
    assert s.pixel_overlap > 0 and s.sibling_share == 1.0
    r = render_field(small.config, 5)
    t = small.table[small.table["parent"] == r.field["id"]]
    assert len(t) == r.field["n_cells"] and r.field == small.fields[5]
    for j, (k, row) in enumerate(t.iterrows()):
        x, y = int(row.x), int(row.y)
        assert torch.equal(small.images[k], r.image[:, y : y + 32, x : x + 32])
        assert r.cells[y + 16, x + 16] >= 1


def test_all_cells_mask_is_the_union_of_the_fields_cells_cut_at_the_crop_box():
    # Mixed fields, 6 cells per field on a tight 96 px field: many crops hold parts of neighbours.
    cfg = SynthConfig(fields_per_class=3, crop_size=32, field_size=96, mean_cells_per_field=6, seed=4, mixed_fields=True, mechanisms="none")
    d = synthesize(cfg, workers=1)
    c, with_neighbours = cfg.crop_size, 0
    for i in range(cfg.n_fields):
        r = render_field(cfg, i)
        t = d.table[d.table["parent"] == r.field["id"]]
        # Second route, not through the label map: every sibling's own (centred) mask pasted
        # into field coordinates at its box.
        union = np.zeros(r.cells.shape, dtype=bool)
        for k, row in t.iterrows():
            union[row.y : row.y + c, row.x : row.x + c] |= d.masks[k, 0].numpy()
        for k, row in t.iterrows():
            got = d.all_cells[k, 0].numpy()
            assert np.array_equal(got, (r.cells[row.y : row.y + c, row.x : row.x + c] > 0).numpy()), row.id
            assert np.array_equal(got, union[row.y : row.y + c, row.x : row.x + c]), row.id
            assert not (d.masks[k, 0].numpy() & ~got).any()  # it holds the crop's own cell
            with_neighbours += int((got & ~d.masks[k, 0].numpy()).any())
    assert with_neighbours > len(d) // 4  # the case is not vacuous


def test_all_cells_masks_are_written_as_an_added_manifest_column_and_read_back(written):
    data, paths = written
    man = pd.read_csv(paths["manifest"])
    # The earlier columns come first and unchanged; the new one is added last.
    assert list(man.columns) == ["id", "path", "mask", "label", "parent", "x", "y", "w", "h", "all_cells_mask"]
    assert (man["all_cells_mask"] == "all_cells_masks/" + man["id"] + ".png").all()
    back = load_synth(paths["out_dir"])
    assert torch.equal(back.all_cells, data.all_cells)
    assert back.all_cells.sum() > back.masks.sum()  # neighbours are in it
    from shortcutlab.data.images import load_manifest_table
    from shortcutlab.data.images import load_crops

    crops = load_crops(load_manifest_table(paths["manifest"], mask="all_cells_mask"))
    order = pd.Index(data.table["id"]).get_indexer(crops.table.ids)
    assert torch.equal(crops.masks, data.all_cells[order])


# ---------------------------------------------------------------------- files and command line
def test_manifest_loads_and_audit_runs(written, tmp_path, capsys):
    data, paths = written
    table = CropTable.from_csv(paths["manifest"], **MANIFEST_COLUMNS)
    assert table.n_crops == len(data) and table.n_parents == data.config.n_fields
    root = os.path.dirname(paths["manifest"])  # paths are relative to the manifest's folder
    for p in list(table.frame["image"][:5]) + list(table.frame["mask"][:5]):
        assert not os.path.isabs(p) and os.path.exists(os.path.join(root, p))
    out = tmp_path / "audit.json"
    argv = ["audit", paths["manifest"], "--id", "id", "--label", "label", "--parent", "parent", "--box", "x,y,w,h"]
    assert main([*argv, "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["n_crops"] == len(data) and r["sibling_share"] == 1.0 and r["pixel_overlap"] > 0
    assert "pixel overlap" in capsys.readouterr().out


def test_load_synth_round_trips(written):
    data, paths = written
    back = load_synth(paths["out_dir"])
    assert torch.equal(back.images, data.images) and torch.equal(back.masks, data.masks)
    pd.testing.assert_frame_equal(back.table, data.table, check_dtype=False)
    assert back.config == data.config and back.fields == data.fields
    pd.testing.assert_frame_equal(back.cells, data.cells, check_dtype=False)


@pytest.mark.parametrize("level", [1, 6])
def test_compressed_pngs_read_back(tmp_path, level):
    from PIL import Image

    d = synthesize(SynthConfig(fields_per_class=1, crop_size=24, seed=2))
    paths = write_synth(d, tmp_path / "c", compress_level=level)
    back = load_synth(paths["out_dir"])
    assert torch.equal(back.images, d.images) and torch.equal(back.masks, d.masks)
    with Image.open(os.path.join(paths["crops"], d.table.id[0] + ".png")) as im:
        assert im.mode == "RGB" and np.array_equal(np.asarray(im), d.images[0].permute(1, 2, 0).numpy())
    with pytest.raises(SynthError, match="compress_level"):
        write_synth(d, tmp_path / "c", compress_level=10)


def test_json_records_every_generating_parameter(written):
    data, paths = written
    doc = json.loads(open(paths["json"]).read())
    assert SynthConfig.from_dict(doc["config"]) == data.config
    assert doc["fields"] == data.fields
    assert set(doc["morphology"]["class_means"]) == {"class0", "class1", "class2"}
    from PIL import Image

    with Image.open(os.path.join(paths["masks"], data.table.id[0] + ".png")) as im:
        mask = np.asarray(im)
    assert mask.dtype == np.uint8 and set(np.unique(mask)) == {0, 255}


def test_write_replaces_an_earlier_benchmark_and_refuses_other_folders(tmp_path):
    out = tmp_path / "b"
    write_synth(synthesize(SynthConfig(fields_per_class=3, crop_size=16, seed=1)), out)
    d = synthesize(SynthConfig(fields_per_class=1, crop_size=16, seed=1))
    write_synth(d, out)
    assert len(os.listdir(out / "crops")) == len(d) == len(pd.read_csv(out / "manifest.csv"))
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    from shortcutlab.io import OutputError

    with pytest.raises(OutputError, match="holds 'notes.txt', which shortcutlab did not write"):
        write_synth(d, other)
    assert os.listdir(other) == ["notes.txt"] and (other / "notes.txt").read_text() == "mine"
    with pytest.raises(SynthError, match="is a file"):
        write_synth(d, other / "notes.txt")
    with pytest.raises(SynthError, match="does not exist"):
        load_synth(tmp_path / "missing")


@pytest.mark.parametrize("fail_in, error", [("_png", OSError), ("_json_document", KeyboardInterrupt)])
def test_a_failed_rewrite_leaves_the_earlier_benchmark_intact(tmp_path, monkeypatch, fail_in, error):
    import shortcutlab.synth as synth_module

    out = tmp_path / "b"
    write_synth(synthesize(SynthConfig(fields_per_class=2, crop_size=16, seed=1)), out)
    before = _files(out)
    real, calls = getattr(synth_module, fail_in), []

    def failing(*args, **kw):
        calls.append(1)
        if len(calls) > 5 or fail_in == "_json_document":  # a few crops in, or at the last file
            raise error("disk full")
        return real(*args, **kw)

    d = synthesize(SynthConfig(fields_per_class=1, crop_size=16, seed=7))
    monkeypatch.setattr(synth_module, fail_in, failing)
    with pytest.raises(error):
        write_synth(d, out, workers=1)
    assert _files(out) == before
    assert os.listdir(tmp_path) == ["b"]  # no temporary folder left beside it
    calls.clear()
    with pytest.raises(error):
        write_synth(d, tmp_path / "new", workers=1)
    assert os.listdir(tmp_path) == ["b"]  # a failed first write leaves no folder at all


def test_a_rewrite_leaves_no_file_of_the_earlier_benchmark(tmp_path):
    import dataclasses
    import stat

    out = tmp_path / "b"
    write_synth(synthesize(SynthConfig(fields_per_class=2, crop_size=16, seed=1)), out)
    assert (out / "cells.csv").exists()
    d = dataclasses.replace(synthesize(SynthConfig(fields_per_class=1, crop_size=16, seed=2)), cells=None, all_cells=None)
    write_synth(d, out)
    # A cells.csv (or all-cells masks) of the earlier benchmark would describe crops the new
    # manifest does not have.
    assert sorted(os.listdir(out)) == [".shortcutlab-output.json", "crops", "manifest.csv", "masks", "synth.json"]
    assert list(pd.read_csv(out / "manifest.csv").columns) == ["id", "path", "mask", "label", "parent", "x", "y", "w", "h"]
    assert load_synth(out).all_cells is None
    assert sorted(os.listdir(out / "crops")) == sorted(i + ".png" for i in d.table["id"])
    # The folder is as readable as one made with mkdir, not private like a temporary folder.
    (tmp_path / "plain").mkdir()
    assert stat.S_IMODE(os.stat(out).st_mode) == stat.S_IMODE(os.stat(tmp_path / "plain").st_mode)


def test_the_working_directory_is_not_replaced(tmp_path, monkeypatch):
    d = synthesize(SynthConfig(fields_per_class=1, crop_size=16, seed=2))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SynthError, match="holds the working directory"):
        write_synth(d, ".")
    assert os.listdir(tmp_path) == []


def test_cli_writes_the_benchmark(tmp_path, capsys):
    out = tmp_path / "cli"
    argv = ["synth", "--out", str(out), "--seed", "3", "--fields-per-class", "2", "--crop-size", "32"]
    argv += ["--mechanism", "color=2,noise", "--n-classes", "4", "--class-signal", "0.7", "--cells-per-field", "4"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "crops/s" in printed and "manifest.csv" in printed
    assert {"manifest.csv", "synth.json", "cells.csv", "crops", "masks"} <= set(os.listdir(out))
    cfg = json.loads((out / "synth.json").read_text())["config"]
    assert cfg["mechanisms"] == ["color", "noise"] and cfg["strengths"] == {"color": 2.0}
    assert (cfg["seed"], cfg["n_classes"], cfg["crop_size"], cfg["class_signal"], cfg["mean_cells_per_field"]) == (3, 4, 32, 0.7, 4.0)
    assert len(os.listdir(out / "crops")) == len(pd.read_csv(out / "manifest.csv"))
    # Options left out keep SynthConfig's defaults.
    assert main(["synth", "--out", str(tmp_path / "d"), "--fields-per-class", "1", "--crop-size", "16", "--mixed-fields"]) == 0
    cfg = json.loads((tmp_path / "d" / "synth.json").read_text())["config"]
    assert SynthConfig.from_dict(cfg) == SynthConfig(fields_per_class=1, crop_size=16, mixed_fields=True)
    assert main(["synth", "--out", str(tmp_path / "none"), "--mechanism", "none", "--fields-per-class", "1", "--crop-size", "16"]) == 0


def test_cli_rejects_bad_mechanisms(tmp_path, capsys):
    assert main(["synth", "--out", str(tmp_path / "x"), "--mechanism", "colour"]) == 2
    err = capsys.readouterr().err
    assert "unknown mechanism 'colour'" in err and "'color'" in err and "illumination" in err
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------- parameter checks
@pytest.mark.parametrize(
    "params, message",
    [
        (dict(crop_size=4), "'crop_size' parameter of SynthConfig must be an integer >= 8"),
        (dict(crop_size=32.5), "'crop_size'"),
        (dict(mechanisms="colour"), "unknown mechanism 'colour'; did you mean 'color'"),
        (dict(mechanisms=("none", "color")), "'none' (signature-free fields) cannot be combined"),
        (dict(mechanisms=()), "at least one mechanism"),
        (dict(class_signal=1.5), "'class_signal' parameter of SynthConfig must be a finite number >= 0 and <= 1"),
        (dict(n_classes=1), "'n_classes'"),
        (dict(mean_cells_per_field=1), "'mean_cells_per_field'"),
        (dict(strength=-1), "'strength'"),
        (dict(strength=float("nan")), "'strength'"),
        (dict(crop_size=32, field_size=40), "'field_size' parameter of SynthConfig must be an integer >= 2 * crop_size = 64"),
        (dict(mechanisms="color", strengths={"noise": 2}), "not among the mechanisms (color)"),
        (dict(strengths={"colr": 2}), "unknown mechanism 'colr'"),
        (dict(mixed_fields="yes"), "'mixed_fields'"),
        (dict(seed=-1), "'seed'"),
        (dict(fields_per_class=0), "'fields_per_class'"),
    ],
)
def test_bad_parameters_are_rejected_clearly(params, message):
    with pytest.raises(SynthError) as e:
        SynthConfig(**params)
    assert message in str(e.value)
    assert isinstance(e.value, ShortcutlabError)


def test_unknown_mechanism_lists_the_valid_names():
    with pytest.raises(SynthError) as e:
        SynthConfig(mechanisms="blur")
    assert all(m in str(e.value) for m in (*MECHANISMS, "none"))


def test_parse_mechanisms_and_config_normalisation():
    assert parse_mechanisms("noise, color=1.5") == (("color", "noise"), {"color": 1.5})
    assert parse_mechanisms("none") == (("none",), {})
    with pytest.raises(SynthError, match="NAME=STRENGTH"):
        parse_mechanisms("color=strong")
    cfg = SynthConfig(mechanisms="noise,color,noise", strengths={"noise": 2})
    assert cfg.mechanisms == ("color", "noise") and cfg.strengths == (("noise", 2.0),)
    assert cfg.effective_strengths == {"color": 1.0, "illumination": 0.0, "background": 0.0, "focus": 0.0, "noise": 2.0}
    assert SynthConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(SynthError, match="unknown SynthConfig parameters"):
        SynthConfig.from_dict({"seeds": 1})
    with pytest.raises(SynthError, match="field index"):
        render_field(SynthConfig(fields_per_class=1), 3)
