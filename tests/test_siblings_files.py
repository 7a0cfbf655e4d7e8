"""Tests for the streamed sibling search over image files (issue 25): hashes of files against
imagehash itself, confirmation with threads and a bounded cache against the plain result,
siblings.csv against the planted answer, and the imports the path avoids (torch, pandas)."""

from __future__ import annotations

import os
import subprocess
import sys

import imagehash
import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy.ndimage import gaussian_filter

from shortcutlab.data import siblings
from shortcutlab.data.siblings import TRANSFORMS, ImageSet, hash_image_set, images_in_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Pillow's own transposes, named as `TRANSFORMS` (numpy semantics: rot90 is counter-clockwise,
# as Pillow's ROTATE_90), so the reference below uses no code of the module under test.
PIL_TRANSPOSE = {"identity": None, "rot90": Image.Transpose.ROTATE_90, "rot180": Image.Transpose.ROTATE_180,
                 "rot270": Image.Transpose.ROTATE_270, "flip_lr": Image.Transpose.FLIP_LEFT_RIGHT,
                 "flip_ud": Image.Transpose.FLIP_TOP_BOTTOM, "transpose": Image.Transpose.TRANSPOSE,
                 "antitranspose": Image.Transpose.TRANSVERSE}


def smooth(shape, seed, channels=3):
    x = gaussian_filter(np.random.default_rng(seed).random((*shape, channels)), (3, 3, 0))
    return ((x - x.min()) / (x.max() - x.min()) * 255).astype(np.uint8)


def write_kinds(folder) -> list[tuple[str, Image.Image]]:
    """Image files of every kind the search reads, each with the 8-bit RGB image imagehash
    should see (16-bit grey scaled by 255 / 65535, rounded, as `load_crops` documents)."""
    os.makedirs(folder, exist_ok=True)
    files = []

    def save(name, im, want=None, **kw):
        path = os.path.join(folder, name)
        im.save(path, **kw)
        files.append((path, want if want is not None else Image.open(path).convert("RGB")))

    for k, shape in enumerate([(64, 64), (37, 53), (31, 200), (200, 31), (100, 40), (32, 32), (20, 20), (71, 64)]):
        save(f"rgb{k}.png", Image.fromarray(smooth(shape, k)))
    save("grey.png", Image.fromarray(smooth((48, 40), 10)[..., 0]))
    rgba = np.concatenate([smooth((50, 50), 11), np.full((50, 50, 1), 128, np.uint8)], axis=2)
    save("rgba.png", Image.fromarray(rgba))
    save("palette.png", Image.fromarray(smooth((45, 45), 12)).convert("P"))
    save("photo.jpg", Image.fromarray(smooth((60, 44), 13)), quality=85)
    save("mono.bmp", Image.fromarray(smooth((30, 33), 14)))
    v16 = (smooth((40, 36), 15)[..., 0].astype(np.uint16) * 257 + np.arange(36, dtype=np.uint16)).astype(np.uint16)
    scaled = ((v16.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)
    save("grey16.png", Image.fromarray(v16), want=Image.fromarray(scaled).convert("RGB"))
    assert Image.open(os.path.join(folder, "grey16.png")).mode.startswith("I")
    return files


def imagehash_int(im) -> int:
    return int(str(imagehash.phash(im)), 16)


@pytest.mark.parametrize("workers, task, pixels", [(1, 64, 1 << 18), (3, 2, 1), (2, 5, 3000)],
                         ids=["one-worker", "three-workers-tasks-of-2-flush-each", "two-workers-mixed-flushes"])
def test_streamed_hashes_of_files_equal_imagehash_of_each_transform(tmp_path, monkeypatch, workers, task, pixels):
    files = write_kinds(tmp_path / "imgs")
    monkeypatch.setattr(siblings, "_FILE_TASK", task)
    monkeypatch.setattr(siblings, "_TASK_PIXELS", pixels)
    images = ImageSet([os.path.basename(p) for p, _ in files], [p for p, _ in files], str(tmp_path))
    want = np.array([[imagehash_int(im if PIL_TRANSPOSE[g] is None else im.transpose(PIL_TRANSPOSE[g])) for g in TRANSFORMS]
                     for _, im in files], dtype=np.uint64)
    got = hash_image_set(images, variants=True, workers=workers)
    assert got.shape == (len(files), 8) and got.dtype == np.uint64
    bad = [(files[i][0], TRANSFORMS[g]) for i, g in zip(*np.nonzero(got != want))]
    assert not bad, bad
    np.testing.assert_array_equal(hash_image_set(images, variants=False, workers=workers), want[:, 0])


def test_streamed_hashes_of_no_files_and_of_one():
    assert hash_image_set(ImageSet([], [], "none"), True).shape == (0, 8)
    assert hash_image_set(ImageSet([], [], "none"), False).shape == (0,)


def _copies(n_train=40, n_test=12, n_copy=6, seed=0):
    """Training images, test images whose first `n_copy` are dihedral copies (with a gain) of
    known training images, and those sources and transforms."""
    rng = np.random.default_rng(seed)
    train = np.stack([smooth((48, 48), 100 + k) for k in range(n_train)])
    test = np.stack([smooth((48, 48), 500 + k) for k in range(n_test)])
    src = rng.choice(n_train, n_copy, replace=False)
    g = rng.integers(0, 8, n_copy)
    for k in range(n_copy):
        test[k] = np.clip(np.round(siblings.apply_transform(train[src[k]], int(g[k])) * 0.9), 0, 255)
    return train, test, src, g


def test_confirmation_with_threads_and_no_cache_equals_one_thread(monkeypatch):
    train, test, src, _ = _copies()
    h, v = siblings.phash_images(train), siblings.dihedral_hashes(test)
    res, cand = siblings.search_hashes(h, v, 8), siblings.candidate_pairs(h, v, 8)
    calls = []

    def train_image(j):
        calls.append(j)
        return train[j]

    one = siblings.confirm_candidates(res, cand, lambda i: test[i], train_image, 0.97, workers=1)
    assert len(calls) == len(set(cand[1].tolist()))  # each training image read once with the default cache
    monkeypatch.setattr(siblings, "_DETAIL_CACHE_BYTES", 1)
    calls.clear()
    many = siblings.confirm_candidates(res, cand, lambda i: test[i], train_image, 0.97, workers=3)
    assert len(calls) >= len(set(cand[1].tolist()))
    for name in ("nearest", "distance", "transform", "detail"):
        np.testing.assert_array_equal(getattr(one, name), getattr(many, name), err_msg=name)
    np.testing.assert_array_equal(one.nearest[: len(src)], src)  # the planted sources, found
    assert one.is_sibling[: len(src)].all()


def _write_folder(folder, images):
    os.makedirs(folder, exist_ok=True)
    for k, a in enumerate(images):
        Image.fromarray(a).save(os.path.join(folder, f"{k:03d}.png"))


def test_siblings_csv_holds_the_planted_pairs(tmp_path):
    train, test, src, g = _copies()
    _write_folder(tmp_path / "train", train)
    _write_folder(tmp_path / "test", test)
    summary = siblings.run(str(tmp_path / "train"), str(tmp_path / "test"), str(tmp_path / "out"), ssim_min=0.5)
    rows = pd.read_csv(tmp_path / "out" / "siblings.csv", keep_default_na=False, dtype=str)
    assert list(rows.columns) == ["test_id", "test_path", "train_id", "train_path", "distance", "transform",
                                  "n_train_siblings", "ssim", "detail_correlation", "is_sibling"]
    assert rows["test_id"].tolist() == [f"{k:03d}.png" for k in range(len(test))]
    assert rows["test_path"].tolist() == [str(tmp_path / "test" / f"{k:03d}.png") for k in range(len(test))]
    copies = rows.iloc[: len(src)]
    assert copies["train_id"].tolist() == [f"{s:03d}.png" for s in src]
    assert copies["train_path"].tolist() == [str(tmp_path / "train" / f"{s:03d}.png") for s in src]
    assert copies["is_sibling"].tolist() == ["True"] * len(src)
    # the transform maps the test image onto its source: the inverse of the planted one
    inverse = [TRANSFORMS[siblings.inverse_transform(int(k))] for k in g]
    assert copies["transform"].tolist() == inverse
    for _, row in copies.iterrows():
        moved = siblings.apply_transform(test[int(row["test_id"][:3])], TRANSFORMS.index(row["transform"]))
        assert np.abs(moved.astype(int) - train[int(row["train_id"][:3])] * 0.9).max() <= 1
        assert 0.95 <= float(row["detail_correlation"]) <= 1 and 0.5 <= float(row["ssim"]) <= 1
        assert row["distance"].isdigit() and int(row["distance"]) <= 6
    others = rows.iloc[len(src):]
    assert others["is_sibling"].eq("False").all()
    unlinked = others[others["train_id"] == ""]
    assert (unlinked[["train_path", "distance", "transform", "ssim", "detail_correlation"]] == "").all().all()
    assert summary["n_with_sibling"] == len(src) and summary["n_test"] == len(test)


def _run_python(code: str, tmp_path) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_sibling_search_on_files_imports_neither_torch_nor_pandas(tmp_path):
    train, test, _, _ = _copies(n_train=6, n_test=3, n_copy=2)
    _write_folder(tmp_path / "train", train)
    _write_folder(tmp_path / "test", test)
    code = ("import sys\n"
            "import shortcutlab.data.siblings as s\n"
            "tr, te = s.images_in_folder('train'), s.images_in_folder('test')\n"
            "r = s.search_confirmed(s.hash_image_set(tr, False), s.hash_image_set(te, True), 6, te.read, tr.read)\n"
            "assert r.is_sibling[:2].all(), r\n"
            "print(sorted(m for m in ('torch', 'pandas', 'pyarrow') if m in sys.modules))")
    assert _run_python(code, tmp_path) == "[]"


def test_siblings_command_imports_neither_torch_nor_pandas(tmp_path):
    train, test, _, _ = _copies(n_train=6, n_test=3, n_copy=2)
    _write_folder(tmp_path / "train", train)
    _write_folder(tmp_path / "test", test)
    code = ("import runpy, sys\n"
            "sys.argv = ['shortcutlab', 'siblings', 'train', 'test', '--out', 'out']\n"
            "try:\n"
            "    runpy.run_module('shortcutlab', run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "print(sorted(m for m in ('torch', 'pandas', 'pyarrow') if m in sys.modules))")
    assert _run_python(code, tmp_path) == "[]"
    assert {"contact_sheet.png", "siblings.csv", "siblings.json"} <= set(os.listdir(tmp_path / "out"))


def test_package_facade_loads_names_on_first_use(tmp_path):
    code = ("import sys, shortcutlab\n"
            "light = sorted(m for m in ('torch', 'pandas', 'scipy') if m in sys.modules)\n"
            "from shortcutlab import CropTable, make_split, ShortcutlabError\n"
            "assert CropTable.__module__ == 'shortcutlab.data.table' and make_split.__module__ == 'shortcutlab.data.splits'\n"
            "assert 'CropTable' in dir(shortcutlab) and 'pandas' in sys.modules and 'torch' not in sys.modules\n"
            "print(light)")
    assert _run_python(code, tmp_path) == "[]"
    import shortcutlab

    for name in shortcutlab.__all__:  # every advertised name resolves
        assert getattr(shortcutlab, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        shortcutlab.nope  # noqa: B018


def test_folder_ids_are_paths_relative_to_the_folder(tmp_path):
    for rel in ("a.png", os.path.join("sub", "b.png"), os.path.join("sub", "deeper", "c.PNG"), ".hidden.png"):
        os.makedirs(os.path.dirname(tmp_path / "f" / rel), exist_ok=True)
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "f" / rel, format="PNG")
    got = images_in_folder(str(tmp_path / "f"))
    assert got.ids == ["a.png", os.path.join("sub", "b.png"), os.path.join("sub", "deeper", "c.PNG")]
    assert got.paths == [os.path.join(str(tmp_path / "f"), i) for i in got.ids]


def test_threads_give_results_in_order_and_stop_at_the_first_error():
    import threading
    import time

    assert siblings.map_in_threads(lambda x: x * x, range(50), workers=3) == [x * x for x in range(50)]
    done, lock = [], threading.Lock()

    def work(x):
        if x == 2:
            raise siblings.SiblingError("file 2 is broken")
        time.sleep(0.002)
        with lock:
            done.append(x)

    with pytest.raises(siblings.SiblingError, match="file 2 is broken"):
        siblings.map_in_threads(work, range(2000), workers=2)
    assert len(done) < 1000  # the tasks after the error were cancelled, not run


def test_an_unreadable_file_among_many_names_itself(tmp_path, monkeypatch):
    from shortcutlab.errors import ShortcutlabError

    train, _, _, _ = _copies(n_train=30, n_test=1, n_copy=0)
    _write_folder(tmp_path / "f", train)
    (tmp_path / "f" / "017.png").write_bytes(b"\x89PNG\r\n\x1a\nnot a png")
    monkeypatch.setattr(siblings, "_FILE_TASK", 4)
    with pytest.raises(ShortcutlabError, match=r"017\.png.*cannot be read as an image"):
        hash_image_set(images_in_folder(str(tmp_path / "f")), True, workers=2)


@pytest.mark.parametrize("confirm", [0.97, None], ids=["confirmed", "unconfirmed"])
def test_search_in_blocks_of_test_images_equals_one_block(monkeypatch, confirm):
    train, test, src, _ = _copies(n_train=30, n_test=11, n_copy=5)
    h, v = siblings.phash_images(train), siblings.dihedral_hashes(test)
    whole = siblings.search_confirmed(h, v, 20, lambda i: test[i], lambda j: train[j], confirm)
    monkeypatch.setattr(siblings, "_TEST_BLOCK", 3)
    blocks = siblings.search_confirmed(h, v, 20, lambda i: test[i], lambda j: train[j], confirm)
    for name in ("nearest", "distance", "transform", "n_siblings") + (("detail",) if confirm else ()):
        np.testing.assert_array_equal(getattr(whole, name), getattr(blocks, name), err_msg=name)
    assert blocks.confirm == confirm and blocks.n_train == len(train) and blocks.threshold == 20
    np.testing.assert_array_equal(blocks.nearest[: len(src)], src)
    assert (blocks.n_siblings[len(src):] > 0).any()  # distinct images within 20 bits: candidates the blocks must agree on
