"""Loading crops and masks from files: bit depths, modes, and files that cannot be read."""

import struct
import zlib

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from shortcutlab import CropTable, TableError
from shortcutlab.data.images import load_crops


def png16(a: np.ndarray) -> bytes:
    """A 16-bit PNG (grey, grey+alpha, RGB or RGBA by the last axis), written by hand.

    Independent of Pillow's writer: IHDR with bit depth 16, big-endian samples, filter 0.
    """
    a = np.asarray(a, dtype=">u2")
    ch = 1 if a.ndim == 2 else a.shape[2]
    colour_type = {1: 0, 2: 4, 3: 2, 4: 6}[ch]
    h, w = a.shape[:2]
    raw = b"".join(b"\x00" + a[r].tobytes() for r in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))

    header = struct.pack(">IIBBBBB", w, h, 16, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def table_of(tmp_path, images, masks=None) -> CropTable:
    df = pd.DataFrame({"id": [f"c{i}" for i in range(len(images))], "label": "x", "parent": "p", "image": images})
    kw = {}
    if masks is not None:
        df["mask"] = masks
        kw["mask"] = "mask"
    return CropTable.from_frame(df, id="id", image="image", **kw)


def test_16bit_grey_crops_are_scaled_not_clipped_to_white(tmp_path):
    rng = np.random.default_rng(0)
    v = rng.integers(0, 65536, size=(6, 7), dtype=np.uint16)
    v[0, :3] = [0, 65535, 128 * 257]
    (tmp_path / "g.png").write_bytes(png16(v))
    crops = load_crops(table_of(tmp_path, ["g.png"]), root=str(tmp_path))
    expected = np.rint(v / 257.0).astype(np.uint8)  # v * 255 / 65535
    for c in range(3):
        np.testing.assert_array_equal(crops.images[0, c].numpy(), expected)
    x, _ = crops.float_batch(np.array([0]))
    np.testing.assert_allclose(x[0, 0].numpy(), v / 65535.0, atol=0.5 / 255 + 1e-6)


def test_16bit_rgb_crops_load_within_one_level_of_exact_scaling(tmp_path):
    rng = np.random.default_rng(1)
    v = rng.integers(0, 65536, size=(5, 4, 3), dtype=np.uint16)
    (tmp_path / "rgb.png").write_bytes(png16(v))
    (tmp_path / "rgba.png").write_bytes(png16(np.concatenate([v, np.full((5, 4, 1), 65535, np.uint16)], axis=2)))
    crops = load_crops(table_of(tmp_path, ["rgb.png", "rgba.png"]), root=str(tmp_path))
    exact = v.transpose(2, 0, 1) / 257.0
    for i in range(2):
        assert np.abs(crops.images[i].numpy() - exact).max() <= 1.0


def test_8bit_crops_and_masks_load_exactly(tmp_path):
    rng = np.random.default_rng(2)
    rgb = rng.integers(0, 256, size=(5, 6, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "c.png")
    m = np.zeros((5, 6), np.uint8)
    m[1:4, 2:5] = 255
    Image.fromarray(m).save(tmp_path / "m.png")
    crops = load_crops(table_of(tmp_path, ["c.png"], ["m.png"]), root=str(tmp_path))
    np.testing.assert_array_equal(crops.images[0].numpy(), rgb.transpose(2, 0, 1))
    np.testing.assert_array_equal(crops.masks[0, 0].numpy(), m == 255)


def test_16bit_masks_are_foreground_above_half_the_16bit_scale(tmp_path):
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "c.png")
    v = np.array([[0, 20000, 32767, 32768], [40000, 65535, 0, 300]] * 2, dtype=np.uint16)
    (tmp_path / "m.png").write_bytes(png16(v))
    crops = load_crops(table_of(tmp_path, ["c.png"], ["m.png"]), root=str(tmp_path))
    np.testing.assert_array_equal(crops.masks[0, 0].numpy(), v.astype(np.int64) * 2 > 65535)


def test_a_label_image_mask_with_no_value_above_half_is_refused(tmp_path):
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "c.png")
    m = np.zeros((4, 4), np.uint8)
    m[1:3, 1:3] = 1
    Image.fromarray(m).save(tmp_path / "m01.png")
    with pytest.raises(TableError, match=r"mask '.*m01\.png' \(id 'c0'\) holds values up to 1 of 255"):
        load_crops(table_of(tmp_path, ["c.png"], ["m01.png"]), root=str(tmp_path))
    # An empty mask stays an empty mask.
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "m0.png")
    crops = load_crops(table_of(tmp_path, ["c.png"], ["m0.png"]), root=str(tmp_path))
    assert not crops.masks.any()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "folder"])
def test_unreadable_crops_name_the_file_and_the_crop_id(tmp_path, damage):
    Image.fromarray(np.full((8, 8, 3), 9, np.uint8)).save(tmp_path / "ok.png")
    good = (tmp_path / "ok.png").read_bytes()
    if damage == "garbage":
        (tmp_path / "bad.png").write_bytes(b"not an image at all" * 4)
    elif damage == "truncated":
        (tmp_path / "bad.png").write_bytes(good[: len(good) // 2])
    else:
        (tmp_path / "bad.png").mkdir()
    with pytest.raises(TableError) as info:
        load_crops(table_of(tmp_path, ["ok.png", "bad.png"]), root=str(tmp_path))
    msg = str(info.value)
    why = "is a folder, expected a file" if damage == "folder" else "cannot be read"  # a folder is not called unreadable
    assert "bad.png" in msg and "id 'c1'" in msg and why in msg and "\n" not in msg


def test_a_truncated_mask_names_the_mask_and_the_crop_id(tmp_path):
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "c.png")
    Image.fromarray(np.full((8, 8), 255, np.uint8)).save(tmp_path / "m.png")
    data = (tmp_path / "m.png").read_bytes()
    (tmp_path / "m.png").write_bytes(data[: len(data) - 20])
    with pytest.raises(TableError, match=r"mask '.*m\.png' \(id 'c0'\) cannot be read"):
        load_crops(table_of(tmp_path, ["c.png"], ["m.png"]), root=str(tmp_path))


def test_float_images_are_refused_with_their_mode(tmp_path):
    Image.fromarray(np.zeros((4, 4), np.float32)).save(tmp_path / "f.tif")
    with pytest.raises(TableError, match=r"crop image '.*f\.tif' \(id 'c0'\) has Pillow mode 'F'"):
        load_crops(table_of(tmp_path, ["f.tif"]), root=str(tmp_path))
