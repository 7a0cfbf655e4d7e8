"""Tests for shortcutlab.data.siblings: hashes against imagehash itself, the two-set linker against
brute force, precision/recall on held-out synthetic augmentations, P3 --invariant, the CLI."""

from __future__ import annotations

import functools
import json

import imagehash
import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy.ndimage import gaussian_filter

from shortcutlab.data import dedup
from shortcutlab.data.siblings import (
    TRANSFORMS,
    aligned_ssim,
    apply_transform,
    dihedral_hashes,
    find_siblings,
    phash_images,
    search_hashes,
    with_ssim,
)
from shortcutlab.studies.sibling_calibration import augment, calibration_set, precision_recall


def smooth_images(n, shape=(64, 64), seed=0):
    rng = np.random.default_rng(seed)
    x = gaussian_filter(rng.random((n, *shape, 3)), (0, 3, 3, 0))
    return ((x - x.min()) / (x.max() - x.min()) * 255).astype(np.uint8)


def imagehash_int(a) -> int:
    return int(str(imagehash.phash(Image.fromarray(np.ascontiguousarray(a)))), 16)


def test_dihedral_hashes_equal_imagehash_of_each_transformed_image():
    imgs = list(smooth_images(20)) + list(np.random.default_rng(1).integers(0, 256, (5, 64, 64, 3), dtype=np.uint8))
    h = dihedral_hashes(np.stack(imgs))
    want = np.array([[imagehash_int(apply_transform(a, g)) for g in range(8)] for a in imgs], dtype=np.uint64)
    np.testing.assert_array_equal(h, want)
    np.testing.assert_array_equal(phash_images(np.stack(imgs)), want[:, 0])


@pytest.mark.parametrize("shape", [(45, 70), (100, 37), (20, 20), (33, 31), (31, 200), (64, 65)])
def test_hashes_of_any_size_equal_imagehash(shape):
    # Pillow picks its pass order from the shape and rounds between passes; grey input too.
    rng = np.random.default_rng(sum(shape))
    imgs = [rng.integers(0, 256, (*shape, 3), dtype=np.uint8) for _ in range(3)] + [rng.integers(0, 256, shape, dtype=np.uint8)]
    h = dihedral_hashes(imgs)
    for a, row in zip(imgs, h):
        assert [int(v) for v in row] == [imagehash_int(apply_transform(a, g)) for g in range(8)]


def test_transform_names_follow_numpy():
    a = np.arange(12).reshape(3, 4)
    assert np.array_equal(apply_transform(a, "rot90"), np.rot90(a))
    assert np.array_equal(apply_transform(a, "flip_lr"), np.fliplr(a))
    assert np.array_equal(apply_transform(a, "antitranspose"), np.rot90(a, 2).T)
    assert len({apply_transform(np.arange(9).reshape(3, 3), g).tobytes() for g in range(8)}) == 8


@pytest.mark.parametrize("cost", [4, 0])
@pytest.mark.parametrize("t", [0, 2, 5, 9])
def test_two_set_linker_equals_brute_force(monkeypatch, cost, t):
    monkeypatch.setattr(dedup, "_CANDIDATE_COST", cost)  # 0: always the multi-index path
    rng = np.random.default_rng(t)
    q = rng.integers(0, 2**64, 600, dtype=np.uint64)
    r = rng.integers(0, 2**64, 900, dtype=np.uint64)
    flips = np.zeros(300, dtype=np.uint64)
    for k in range(300):
        for b in rng.choice(64, size=int(rng.integers(0, t + 3)), replace=False):
            flips[k] |= np.uint64(1) << np.uint64(b)
    r[:300] = q[:300] ^ flips
    r[300:310] = q[0]  # copies on both sides
    q[400:405] = q[1]
    i, j, d = dedup.near_duplicates_between(q, r, t, batch_pairs=97)
    want = [(a, b, bin(int(q[a]) ^ int(r[b])).count("1")) for a in range(len(q)) for b in range(len(r))
            if bin(int(q[a]) ^ int(r[b])).count("1") <= t]
    assert list(zip(i.tolist(), j.tolist(), d.tolist())) == want
    assert len(want) >= 10  # at least the planted copies of q[0]


def test_search_nearest_equals_brute_force_minimum():
    rng = np.random.default_rng(3)
    train = rng.integers(0, 2**64, 400, dtype=np.uint64)
    test = rng.integers(0, 2**64, (150, 8), dtype=np.uint64)
    test[:100, 3] = train[:100] ^ np.uint64(0b1011)  # 3 bits from train k under transform 3
    test[:50, 6] = train[200:250]  # and 0 bits from another under transform 6
    res = search_hashes(train, test, threshold=4)
    d = np.array([[[bin(int(a) ^ int(b)).count("1") for a in row] for b in train] for row in test])  # (T, R, 8)
    for i in range(len(test)):
        best = min((d[i, j, g], j, g) for j in range(len(train)) for g in range(8))
        if best[0] <= 4:
            assert (res.distance[i], res.nearest[i], res.transform[i]) == best
            assert res.n_siblings[i] == int((d[i].min(axis=1) <= 4).sum())
        else:
            assert res.nearest[i] == -1 and res.distance[i] == -1
    assert res.share == pytest.approx(100 / 150)


def test_find_siblings_on_images_with_ssim_of_aligned_copy():
    train = smooth_images(6, seed=5)
    test = np.stack([apply_transform(train[4], "rot90"), apply_transform(train[1], "flip_ud"), smooth_images(1, seed=9)[0]])
    res = find_siblings(train, test, ssim_min=0.9)
    assert res.nearest.tolist() == [4, 1, -1]
    # The transform maps the test image back onto the training image.
    assert [TRANSFORMS[g] for g in res.transform[:2]] == ["rot270", "flip_ud"]
    assert res.ssim[:2] == pytest.approx([1.0, 1.0]) and np.isnan(res.ssim[2])
    from skimage.metrics import structural_similarity

    grey = lambda a: a.astype(float) @ [0.299, 0.587, 0.114]  # noqa: E731
    other = structural_similarity(grey(test[2]), grey(train[0]), data_range=255.0)
    assert aligned_ssim(test[2], train[0], 0) == pytest.approx(other, abs=0.02)


def test_precision_and_recall_on_held_out_synthetic_augmentations():
    """Every dihedral transform, brightness +-20%, blur sigma 1, JPEG 75 (and all at once) of
    crops of one half of the fields, against crops of the other half (seed 2: not the seeds the
    default threshold was chosen on)."""
    cal = calibration_set(seed=2)
    res = search_hashes(phash_images(cal.train), dihedral_hashes(cal.test))
    pr = precision_recall(res, cal.source)
    per_aug = {n: float(((res.nearest == cal.source) & (cal.augmentation == n)).sum() / (cal.augmentation == n).sum())
               for n in np.unique(cal.augmentation[cal.source >= 0])}
    print(f"\nthreshold {res.threshold}: precision {pr['precision']:.4f}, recall {pr['recall']:.4f}, "
          f"{pr['n_copies']} copies, {pr['n_distinct']} distinct crops; recall per augmentation {per_aug}")
    assert pr["recall"] >= 0.99 and pr["precision"] >= 0.99
    assert all(per_aug[g] == 1.0 for g in TRANSFORMS[1:])  # flips and rotations are exact
    confirmed = precision_recall(with_ssim(res, lambda i: cal.test[i], lambda j: cal.train[j], 0.7), cal.source)
    print(f"with SSIM >= 0.7: precision {confirmed['precision']:.4f}, recall {confirmed['recall']:.4f}")
    assert confirmed["precision"] >= pr["precision"] and confirmed["recall"] >= 0.99


def _table_with_rotated_copy(tmp_path):
    from shortcutlab import CropTable

    imgs = smooth_images(8, seed=11)
    paths = []
    for k, a in enumerate(list(imgs) + [np.rot90(imgs[0])]):
        p = tmp_path / f"c{k}.png"
        Image.fromarray(np.ascontiguousarray(a)).save(p)
        paths.append(str(p))
    df = pd.DataFrame({"id": [f"c{k}" for k in range(9)], "label": ["a", "b"] * 4 + ["a"],
                       "parent": [f"p{k // 2}" for k in range(8)] + ["p9"], "image": paths})
    return CropTable.from_frame(df, id="id", image="image")


def test_parent_dedup_invariant_merges_a_rotated_copy(tmp_path):
    from shortcutlab import dedup_split

    table = _table_with_rotated_copy(tmp_path)
    plain = dedup_split(table, 0.4, max_distance=4)
    inv = dedup_split(table, 0.4, max_distance=4, invariant=True)
    assert plain.report["parents_after_merge"] == 5  # p0..p3, p9: the rotated copy is 'far'
    assert inv.report["parents_after_merge"] == 4  # p9 (rotated c0) joins p0
    a = inv.assignments.set_index("id")["split"]
    assert a["c8"] == a["c0"] == a["c1"]
    assert inv.params["dedup"]["invariant"] is True


def _write(folder, images, names=None):
    folder.mkdir(parents=True, exist_ok=True)
    for k, a in enumerate(images):
        Image.fromarray(np.ascontiguousarray(a)).save(folder / f"{(names or {}).get(k, f'img{k:02d}')}.png")


def test_cli_on_folders_and_on_a_split_manifest(tmp_path, capsys):
    from shortcutlab.cli import main

    train = smooth_images(10, seed=21)
    test = [apply_transform(train[k], g) for k, g in ((2, 1), (5, 4), (7, 6))] + list(smooth_images(5, seed=22))
    _write(tmp_path / "train" / "sub", train)
    _write(tmp_path / "test", test)
    assert main(["siblings", str(tmp_path / "train"), str(tmp_path / "test"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "3 of 8 test images (37.50%)" in out
    summary = json.loads((tmp_path / "out" / "siblings.json").read_text())
    assert summary["share"] == pytest.approx(3 / 8) and summary["threshold"] == 6
    assert summary["threshold_source"].startswith("default")
    rows = pd.read_csv(tmp_path / "out" / "siblings.csv", keep_default_na=False)
    got = rows[rows["is_sibling"]][["test_id", "train_id", "transform"]].values.tolist()
    assert got == [["img00.png", "sub/img02.png", "rot270"], ["img01.png", "sub/img05.png", "flip_lr"], ["img02.png", "sub/img07.png", "transpose"]]
    sheet = Image.open(tmp_path / "out" / "contact_sheet.png")
    assert sheet.size[0] > 0

    # The same crops as one crop manifest and a split manifest.
    crops = pd.DataFrame({"id": [f"tr{k}" for k in range(10)] + [f"te{k}" for k in range(8)],
                          "path": [f"train/sub/img{k:02d}.png" for k in range(10)] + [f"test/img{k:02d}.png" for k in range(8)]})
    crops.to_csv(tmp_path / "crops.csv", index=False)
    pd.DataFrame({"id": crops["id"], "split": ["train"] * 10 + ["test"] * 8}).to_csv(tmp_path / "split.csv", index=False)
    assert main(["siblings", str(tmp_path / "split.csv"), str(tmp_path / "crops.csv"), "--out", str(tmp_path / "o2"), "--threshold", "0", "--ssim", "0.9"]) == 0
    s2 = json.loads((tmp_path / "o2" / "siblings.json").read_text())
    assert s2["n_with_sibling"] == 3 and s2["threshold"] == 0 and s2["threshold_source"] == "--threshold"
    assert s2["inputs"]["given_as"] == "split manifest"


# --- confirmation of hash candidates (issue 20: no siblings where there are none) ---------------

def test_detail_correlation_against_numpy_and_scikit_image():
    from skimage.filters import gaussian

    from shortcutlab.data.siblings import detail_correlation

    a, b = smooth_images(2, shape=(40, 40), seed=31)
    grey = lambda x: np.asarray(Image.fromarray(np.ascontiguousarray(x)).convert("L"), dtype=float)  # noqa: E731

    def reference(x, y):
        """Correlation of Pillow's grey band-passed by a difference of scikit-image Gaussians
        (sigma 0.7 and 2.0 px per 32 px of side: 0.875 and 2.5 px at 40 px), over the pixels
        with no channel at 0 or 255 in either image."""
        band = lambda g: (gaussian(g, sigma=0.875, mode="reflect", preserve_range=True)  # noqa: E731
                          - gaussian(g, sigma=2.5, mode="reflect", preserve_range=True))
        dx, dy = band(grey(x)), band(grey(y))
        keep = ((x > 0) & (x < 255) & (y > 0) & (y < 255)).all(axis=2)
        return np.corrcoef(dx[keep], dy[keep])[0, 1]

    assert detail_correlation(a, b, 0) == pytest.approx(reference(a, b), abs=1e-9)
    # aligned by the transform: a rotated copy correlates 1; a re-exposed one nearly so
    assert detail_correlation(np.rot90(a), a, TRANSFORMS.index("rot270")) == pytest.approx(1.0)
    darker = np.round(a * 0.8).astype(np.uint8)
    assert detail_correlation(darker, a, 0) == pytest.approx(reference(darker, a), abs=1e-9) and reference(darker, a) > 0.98
    # brighter, a tenth to a half of the pixels clipped at 255: the clipped ones are left out
    brighter = np.clip(np.round(a * 1.5), 0, 255).astype(np.uint8)
    assert 0.1 < ((brighter == 255).any(axis=2)).mean() < 0.5
    assert detail_correlation(brighter, a, 0) == pytest.approx(reference(brighter, a), abs=1e-9) and reference(brighter, a) > 0.98
    assert np.isnan(detail_correlation(np.full((40, 40, 3), 7, np.uint8), a, 0))  # a flat image has no detail


def _jpeg(image, quality):
    """The image saved as a JPEG by Pillow and read back (a re-encoded copy)."""
    import io

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buf, format="JPEG", quality=quality)
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))


@functools.lru_cache(maxsize=1)
def _planted(seed=0):
    """A 32 px synthetic benchmark (the demo's crop size, colour mechanism) split by field:
    the test side holds every crop of 30% of the fields (none of which is trained on, as in
    the demo's clean-high cell), then flipped, rotated, re-exposed and JPEG-90 copies of training crops."""
    from shortcutlab.synth import SynthConfig, synthesize

    data = synthesize(SynthConfig(seed=seed, fields_per_class=12, crop_size=32, field_size=128, mechanisms=("color",)))
    images = data.images.permute(0, 2, 3, 1).numpy()
    parents = data.table["parent"].to_numpy()
    fields = np.unique(parents)
    rng = np.random.default_rng(seed)
    held_out = np.isin(parents, rng.permutation(fields)[: len(fields) * 3 // 10])
    train, distinct = images[~held_out], images[held_out]
    plants = ["rot90", "rot180", "flip_lr", "flip_ud", "transpose", "antitranspose", "brightness+20", "brightness-20", "jpeg90"]
    sources = rng.choice(len(train), size=3 * len(plants), replace=False)
    copies = [_jpeg(train[s], 90) if plants[k % len(plants)] == "jpeg90" else augment(train[s], plants[k % len(plants)])
              for k, s in enumerate(sources)]
    test = np.concatenate([distinct, np.stack(copies)])
    source = np.concatenate([np.full(len(distinct), -1), sources])
    return train, test, source


def test_default_confirms_planted_copies_and_no_look_alike_of_unseen_fields():
    train, test, source = _planted()
    hash_only = find_siblings(train, test, confirm=None)
    res = find_siblings(train, test)
    distinct, copy = source < 0, source >= 0
    # The hash alone links look-alike crops of fields never trained on (the demo's clean-high
    # cell read "5 of 119 test crops have a training sibling"); confirmed, none is left.
    # Seeds 0-6 tried: 34-47 hash-only links of distinct crops, 0 confirmed (1 at seed 1).
    n_hash, n_confirmed = (hash_only.is_sibling & distinct).sum(), (res.is_sibling & distinct).sum()
    assert n_hash >= 20 and n_confirmed <= 2
    # recall: every planted flip, rotation, re-exposure and JPEG re-encoding is found, linked to its own source
    assert res.is_sibling[copy].all() and (res.nearest[copy] == source[copy]).all()
    assert res.share == pytest.approx((copy.sum() + n_confirmed) / len(test))
    pr = precision_recall(res, source)
    assert pr["precision"] >= copy.sum() / (copy.sum() + 2) and pr["recall"] == 1.0


def test_cli_confirms_by_default_and_no_confirm_counts_every_candidate(tmp_path, capsys):
    from shortcutlab.cli import main

    train, test, source = _planted()
    _write(tmp_path / "train", train)
    _write(tmp_path / "test", test)
    assert main(["siblings", str(tmp_path / "train"), str(tmp_path / "test"), "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    s = json.loads((tmp_path / "a" / "siblings.json").read_text())
    assert (source >= 0).sum() <= s["n_with_sibling"] <= (source >= 0).sum() + 2  # every copy; look-alikes: see above
    assert s["confirm"] == 0.97 and s["same_images"] is False
    assert f"{s['n_with_sibling']} of {len(test)} test images" in out and "confirmed by detail correlation >= 0.97" in out
    rows = pd.read_csv(tmp_path / "a" / "siblings.csv")
    assert (rows["is_sibling"] == (rows["detail_correlation"] >= 0.97)).all()
    assert main(["siblings", str(tmp_path / "train"), str(tmp_path / "test"), "--out", str(tmp_path / "b"), "--no-confirm"]) == 0
    u = json.loads((tmp_path / "b" / "siblings.json").read_text())
    assert u["confirm"] is None and u["n_with_sibling"] == u["n_hash_siblings"] == s["n_hash_siblings"] > s["n_with_sibling"]
