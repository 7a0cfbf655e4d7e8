"""`shortcutlab masks`: estimated cell masks, checked against the synthetic benchmark's true
masks and against shapes drawn here, whose truth is known by construction."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from scipy import ndimage
from skimage.draw import disk as draw_disk
from skimage.morphology import disk

from shortcutlab.ingest.masks import FULL_SHARE, QUALITY_COLUMNS, estimate_mask, estimate_masks, mask_quality

LIGHT, DARK = (225, 222, 228), (95, 80, 150)  # a light background; a stained (purple) cell


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def canvas(size: int = 64, color=LIGHT, noise: float = 3.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = np.empty((size, size, 3), np.float64)
    img[:] = color
    return img + rng.normal(0, noise, img.shape)


def disc(size: int, cy: float, cx: float, r: float) -> np.ndarray:
    m = np.zeros((size, size), bool)
    m[draw_disk((cy, cx), r, shape=(size, size))] = True
    return m


def paint(img: np.ndarray, mask: np.ndarray, color=DARK) -> np.ndarray:
    img = img.copy()
    img[mask] = np.asarray(color, np.float64) + (img[mask] - img[mask].mean(axis=0))
    return img


def u8(img: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def close_to(est: np.ndarray, truth: np.ndarray, px: int = 2) -> None:
    """`est` holds `truth` shrunk by one pixel and lies inside `truth` grown by `px` pixels:
    the outline is found within the smoothing's reach."""
    assert np.all(est[ndimage.binary_erosion(truth, disk(1))]), "the estimated mask misses the inside of the shape"
    assert not np.any(est & ~ndimage.binary_dilation(truth, disk(px))), "the estimated mask reaches beyond the shape"


# ---------------------------------------------------------------------- the synthetic benchmark
def _benchmark_ious(mechanisms: tuple[str, ...], seed: int, n: int = 200) -> np.ndarray:
    from shortcutlab.synth import SynthConfig, synthesize

    data = synthesize(SynthConfig(seed=seed, fields_per_class=12, crop_size=64, mechanisms=mechanisms))
    images = data.images.numpy().transpose(0, 2, 3, 1)[:n]
    truth = data.masks.numpy()[:n, 0]
    assert len(images) == n
    return np.array([iou(estimate_mask(images[i])[0], truth[i]) for i in range(n)])


@pytest.mark.parametrize("mechanisms", [("none",), ("background",)], ids=["no-background", "background"])
def test_median_iou_on_the_benchmark(mechanisms) -> None:
    # Over seeds 0 .. 5 the medians were 0.967 .. 0.974 without and 0.919 .. 0.932 with the
    # background mechanism (lower quartiles >= 0.938 and >= 0.813): the bound of 0.85
    # holds with a margin of 0.07.
    ious = _benchmark_ious(mechanisms, seed=0)
    assert np.median(ious) >= 0.85, np.median(ious)
    assert np.quantile(ious, 0.25) >= 0.7  # most masks are the cell, not the nucleus or the cell with a neighbour


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("mechanisms", [("none",), ("background",)], ids=["no-background", "background"])
def test_median_iou_on_the_benchmark_over_seeds(mechanisms, seed) -> None:
    assert np.median(_benchmark_ious(mechanisms, seed)) >= 0.85


def test_two_class_otsu_returns_the_nucleus_on_cytology_crops() -> None:
    """Why the default is the three-class threshold: a two-class Otsu threshold falls between
    cytoplasm and nucleus, so its mask is far smaller than the cell."""
    from shortcutlab.synth import SynthConfig, synthesize

    data = synthesize(SynthConfig(seed=0, fields_per_class=2, crop_size=64, mechanisms=("none",)))
    images, truth = data.images.numpy().transpose(0, 2, 3, 1), data.masks.numpy()[:, 0]
    share = [estimate_mask(img, "otsu")[0].sum() / t.sum() for img, t in zip(images, truth)]
    assert np.median(share) < 0.5


# ---------------------------------------------------------------------- shapes drawn by hand
@pytest.mark.parametrize("size", [32, 64, 128])
def test_dark_disc_on_light_background(size) -> None:
    truth = disc(size, size / 2 - 0.5, size / 2 - 0.5, size * 0.22)
    mask, q = estimate_mask(u8(paint(canvas(size), truth)))
    close_to(mask, truth)
    assert iou(mask, truth) > 0.8
    assert q["foreground_share"] == pytest.approx(mask.mean())
    assert (q["touches_border"], q["n_components"], q["degenerate"]) == (False, 1, "")


@pytest.mark.parametrize("method", ["multiotsu", "otsu", "li"])
@pytest.mark.parametrize("channel", ["od", "hematoxylin", "gray"])
def test_every_method_and_channel_finds_a_clear_disc(method, channel) -> None:
    truth = disc(64, 31.5, 31.5, 14)
    mask, q = estimate_mask(u8(paint(canvas(), truth, color=(60, 50, 140))), method, channel)
    close_to(mask, truth, px=3)
    assert q["threshold"] == q["threshold"]  # recorded, not NaN


@pytest.mark.parametrize("color", [(230, 120, 170), (90, 160, 120), (70, 70, 70)], ids=["pink", "green", "grey"])
def test_the_cell_is_the_stained_side_whatever_its_colour(color) -> None:
    truth = disc(64, 31.5, 31.5, 13)
    mask, _ = estimate_mask(u8(paint(canvas(), truth, color=color)))
    close_to(mask, truth)


def test_a_ring_is_filled() -> None:
    ring = disc(64, 31.5, 31.5, 16) & ~disc(64, 31.5, 31.5, 9)
    mask, q = estimate_mask(u8(paint(canvas(), ring)))
    filled = disc(64, 31.5, 31.5, 16)
    close_to(mask, filled)
    assert mask[31, 31] and mask[disc(64, 31.5, 31.5, 8)].all()
    assert q["n_components"] == 1


def test_of_two_blobs_the_one_at_the_centre() -> None:
    centre, other = disc(64, 31.5, 31.5, 10), disc(64, 10, 52, 7)
    mask, q = estimate_mask(u8(paint(paint(canvas(), centre), other)))
    close_to(mask, centre)
    assert not (mask & other).any()
    assert q["n_components"] == 2


def test_a_touching_neighbour_is_cut_off() -> None:
    centre, other = disc(64, 31.5, 31.5, 12), disc(64, 31.5, 51.5, 10)  # 20 px apart: they overlap by 2 px
    assert (centre & other).any()
    mask, q = estimate_mask(u8(paint(canvas(), centre | other)))
    assert q["n_components"] == 1  # one blob to the threshold ...
    assert iou(mask, centre) > 0.85  # ... cut at its neck
    assert not (mask & ndimage.binary_erosion(other, disk(3))).any()


def test_an_elongated_cell_is_kept_whole() -> None:
    from skimage.draw import ellipse

    truth = np.zeros((64, 64), bool)
    truth[ellipse(31.5, 31.5, 10, 20, shape=(64, 64), rotation=0.5)] = True
    mask, _ = estimate_mask(u8(paint(canvas(), truth)))
    close_to(mask, truth)


def test_no_blob_at_the_centre_gives_the_nearest() -> None:
    near, far = disc(64, 31.5, 44, 8), disc(64, 6, 6, 5)  # centre distances 12.5 and 36
    mask, q = estimate_mask(u8(paint(paint(canvas(), near), far)))
    close_to(mask, near)
    assert not (mask & far).any() and not mask[31, 31]
    assert q["n_components"] == 2 and q["touches_border"] is False


def test_a_cell_cut_by_the_border_touches_it() -> None:
    truth = disc(64, 31.5, 55, 16)
    mask, q = estimate_mask(u8(paint(canvas(), truth)))
    close_to(mask, truth)
    assert q["touches_border"] is True


@pytest.mark.parametrize("value", [0, 128, 255])
def test_a_blank_image_gives_an_empty_mask(value) -> None:
    mask, q = estimate_mask(u8(canvas(color=(value,) * 3, noise=1.0)))
    assert not mask.any()
    assert q["degenerate"] == "empty" and q["n_components"] == 0 and q["foreground_share"] == 0.0
    assert q["threshold"] != q["threshold"]  # NaN: no threshold on a blank crop


def test_quality_of_a_full_mask() -> None:
    m = np.ones((20, 20), bool)
    assert mask_quality(m, 1) == {"foreground_share": 1.0, "touches_border": True, "n_components": 1, "degenerate": "full"}
    m[:, :2] = False  # 90% < FULL_SHARE
    assert FULL_SHARE > 0.9 and mask_quality(m, 1)["degenerate"] == ""


def test_estimate_masks_is_estimate_mask_per_crop() -> None:
    images = [u8(paint(canvas(48, seed=s), disc(48, 23.5, 23.5, 6 + 2 * s))) for s in range(3)] + [u8(canvas(48))]
    masks, quality = estimate_masks(images)
    assert list(quality.columns) == [*QUALITY_COLUMNS, "threshold"] and len(quality) == 4
    for img, m, (_, row) in zip(images, masks, quality.iterrows()):
        m1, q1 = estimate_mask(img)
        assert np.array_equal(m, m1) and row["foreground_share"] == q1["foreground_share"]
    assert quality["degenerate"].tolist() == ["", "", "", "empty"]
    batch, _ = estimate_masks(torch.from_numpy(np.stack(images).transpose(0, 3, 1, 2)))  # as load_crops holds them
    assert all(np.array_equal(a, b) for a, b in zip(batch, masks))


# ---------------------------------------------------------------------- the command
def _drawn_table(folder, n: int = 5, size: int = 40) -> tuple[str, dict]:
    """A table of `n` crops with drawn discs (radii known) and one blank crop; crops in a
    sub-folder, paths relative to the table."""
    os.makedirs(folder / "crops")
    truth, rows = {}, []
    for k in range(n):
        cid = f"c{k}"
        m = disc(size, size / 2 - 0.5, size / 2 - 0.5, 7 + k)
        img = canvas(size, seed=k) if k == n - 1 else paint(canvas(size, seed=k), m)
        truth[cid] = m if k < n - 1 else np.zeros_like(m)
        Image.fromarray(u8(img)).save(folder / "crops" / f"{cid}.png")
        rows.append({"id": cid, "file": f"crops/{cid}.png", "label": "ab"[k % 2], "parent": f"f{k // 2}"})
    path = folder / "table.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path), truth


def test_cli_writes_masks_table_summary_and_sheet(tmp_path, capsys) -> None:
    from shortcutlab.cli import main
    from shortcutlab.data.images import load_crops
    from shortcutlab.data.table import CropTable

    table, truth = _drawn_table(tmp_path / "in")
    out = tmp_path / "out"
    assert main(["masks", table, "--image", "file", "--out", str(out), "--sheet", "3"]) == 0
    printed = capsys.readouterr().out
    assert "warning: 1 of 5 masks are degenerate (1 empty, 0 full; ids 'c4')" in printed

    written = pd.read_csv(out / "masks.csv", dtype=str, keep_default_na=False)
    assert list(written.columns) == ["id", "file", "label", "parent", "mask", *QUALITY_COLUMNS]
    assert written["mask"].tolist() == [f"masks/c{k}.png" for k in range(5)]
    assert written["file"].tolist() == [f"../in/crops/c{k}.png" for k in range(5)]
    assert written["degenerate"].tolist() == ["", "", "", "", "empty"]
    for cid in truth:
        png = np.asarray(Image.open(out / "masks" / f"{cid}.png"))
        assert png.dtype == np.uint8 and set(np.unique(png)) <= {0, 255}
        if truth[cid].any():
            close_to(png == 255, truth[cid])

    crops = load_crops(CropTable.from_csv(str(out / "masks.csv"), id="id", label="label", parent="parent", image="file", mask="mask"))
    assert crops.masks.shape == (5, 1, 40, 40)
    for k, cid in enumerate(crops.table.ids):
        assert np.array_equal(crops.masks[k, 0].numpy(), np.asarray(Image.open(out / "masks" / f"{cid}.png")) == 255)
        assert float(written.set_index("id").loc[cid, "foreground_share"]) == pytest.approx(crops.masks[k].float().mean().item(), abs=1e-6)

    summary = json.loads((out / "masks.json").read_text())
    assert (summary["method"], summary["channel"]) == ("multiotsu", "od")
    assert summary["counts"] == {"crops": 5, "empty": 1, "full": 0, "touches_border": 0, "several_components": 0}
    assert summary["degenerate_ids"] == ["c4"]
    sheet = np.asarray(Image.open(out / "contact_sheet.png"))
    assert sheet.ndim == 3 and (sheet == (255, 0, 0)).all(axis=2).any()  # red outlines drawn


def test_cli_replaces_its_own_folder_and_refuses_a_foreign_one(tmp_path, capsys) -> None:
    from shortcutlab.cli import main

    table, _ = _drawn_table(tmp_path / "in", n=3)
    out = tmp_path / "out"
    assert main(["masks", table, "--image", "file", "--out", str(out), "--method", "li"]) == 0
    assert main(["masks", table, "--image", "file", "--out", str(out), "--method", "otsu"]) == 0
    assert json.loads((out / "masks.json").read_text())["method"] == "otsu"
    capsys.readouterr()

    other = tmp_path / "other"
    other.mkdir()
    (other / "masks.csv").write_text("mine\n")
    assert main(["masks", table, "--image", "file", "--out", str(other)]) == 2
    assert "masks.csv" in capsys.readouterr().err
    assert sorted(os.listdir(other)) == ["masks.csv"] and (other / "masks.csv").read_text() == "mine\n"


def test_cli_on_a_benchmark_manifest_keeps_the_true_masks_apart(tmp_path, capsys) -> None:
    """A benchmark's manifest already has a mask column: the estimate goes to --column, and
    the true masks' paths are rebased so that both load from masks.csv and can be compared."""
    from shortcutlab.cli import main
    from shortcutlab.data.images import load_crops
    from shortcutlab.data.table import CropTable
    from shortcutlab.synth import SynthConfig, synthesize, write_synth

    write_synth(synthesize(SynthConfig(seed=3, fields_per_class=2, crop_size=64, mechanisms=("background",))), tmp_path / "bench")
    out = tmp_path / "est"
    assert main(["masks", str(tmp_path / "bench" / "manifest.csv"), "--out", str(out), "--column", "estimated"]) == 0
    capsys.readouterr()
    load = lambda col: load_crops(CropTable.from_csv(str(out / "masks.csv"), id="id", label="label", parent="parent",  # noqa: E731
                                                     image="path", mask=col)).masks.numpy()[:, 0]
    est, true = load("estimated"), load("mask")
    assert np.median([iou(e, t) for e, t in zip(est, true)]) >= 0.8  # few crops: a looser bound than the 200-crop test


def test_ids_that_are_paths_or_differ_in_case_get_distinct_mask_files(tmp_path) -> None:
    # `shortcutlab table` makes ids from relative paths ("im_A/CROPPED/f1_01"); two ids may
    # differ only in case. Each crop gets its own mask file, and masks.csv points at it.
    from PIL import Image

    from shortcutlab.data.images import load_crops
    from shortcutlab.data.table import CropTable
    from shortcutlab.ingest.masks import write_masks

    ids = ["im_A/CROPPED/f1_01", "cell", "CELL"]
    radii = [10, 14, 18]
    rows = []
    for k, (i, r) in enumerate(zip(ids, radii)):
        Image.fromarray(u8(paint(canvas(seed=k), disc(64, 32, 32, r)))).save(tmp_path / f"c{k}.png")
        rows.append({"id": i, "path": f"c{k}.png", "label": "a", "parent": "p"})
    pd.DataFrame(rows).to_csv(tmp_path / "t.csv", index=False)
    write_masks(str(tmp_path / "t.csv"), str(tmp_path / "out"))
    table = pd.read_csv(tmp_path / "out" / "masks.csv", dtype=str)
    files = list(table["mask"])
    assert len({f.lower() for f in files}) == 3 and all("/" not in f[len("masks/"):] for f in files)
    crops = load_crops(CropTable.from_csv(str(tmp_path / "out" / "masks.csv"), image="path", mask="mask"))
    for k, r in enumerate(radii):  # each crop's own disc came back, by its area (pi r^2, within 15%)
        area = float(crops.masks[k].float().sum())
        assert abs(area - np.pi * r * r) < 0.15 * np.pi * r * r, (ids[k], area)
