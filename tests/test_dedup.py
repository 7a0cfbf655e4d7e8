"""Tests for shortcutlab.data.dedup: multi-index hashing against the all-pairs reference, parent
merging against a hand-written union-find, and perceptual hashes against imagehash itself."""

from __future__ import annotations

import imagehash
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from scipy.ndimage import gaussian_filter

from shortcutlab.data import dedup
from shortcutlab.data.dedup import (
    DedupResult,
    all_pairs_near_duplicates,
    hamming_distance,
    hashes_from_hex,
    link_parents,
    merge_linked_parents,
    near_duplicate_pairs,
    perceptual_hashes,
)
from shortcutlab.errors import ShortcutlabError, TableError

ONE = np.uint64(1)


# ---------------------------------------------------------------------------- helpers
@pytest.fixture
def mih_only(monkeypatch):
    """Never fall back to comparing all distinct pairs, so the multi-index path is what runs."""
    monkeypatch.setattr(dedup, "_CANDIDATE_COST", 0)


def flip(h: np.uint64, bits) -> np.uint64:
    for b in bits:
        h ^= ONE << np.uint64(b)
    return np.uint64(h)


def planted_hashes(rng: np.random.Generator, n: int, max_distance: int, n_planted: int) -> np.ndarray:
    """n random hashes, of which n_planted are copies of others with 0..max_distance+1 bits flipped."""
    h = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    src = rng.integers(0, n, size=n_planted)
    dst = rng.choice(n, size=n_planted, replace=False)
    for s, d in zip(src, dst):
        k = int(rng.integers(0, max_distance + 2))
        h[d] = flip(h[s], rng.choice(64, size=k, replace=False))
    return h


def assert_same_pairs(got, want):
    assert got[0].dtype == np.int64 and got[1].dtype == np.int64
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def union_find_codes(parents, pairs) -> np.ndarray:
    """Reference: merge parents with a plain union-find, number components by smallest parent."""
    root = {p: p for p in parents}

    def find(p):
        while root[p] != p:
            root[p] = root[root[p]]
            p = root[p]
        return p

    for i, j in zip(*pairs):
        a, b = find(parents[i]), find(parents[j])
        if a != b:
            root[max(a, b)] = min(a, b)
    smallest = sorted({find(p) for p in parents})  # the root is the component's smallest parent
    number = {r: k for k, r in enumerate(smallest)}
    return np.array([number[find(p)] for p in parents], dtype=np.int64)


def texture(seed: int, size: int = 96) -> np.ndarray:
    """A smooth random RGB texture (uint8, size x size x 3): blurred noise plus sinusoids."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    img = gaussian_filter(rng.normal(size=(size, size)), 4) * 8
    for _ in range(4):
        fx, fy, ph = rng.uniform(1, 6), rng.uniform(1, 6), rng.uniform(0, 2 * np.pi)
        img += np.sin(2 * np.pi * (fx * xx + fy * yy) + ph)
    img = (img - img.min()) / (img.max() - img.min()) * 200 + 20
    rgb = np.stack([img, img * 0.9 + 10, img * 0.8 + 20], axis=-1)
    return np.clip(rgb, 0, 255).astype(np.uint8)


# ---------------------------------------------------------------------------- distances
def test_hamming_distance_matches_python_popcount():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**64, size=200, dtype=np.uint64)
    b = rng.integers(0, 2**64, size=200, dtype=np.uint64)
    want = [bin(int(x) ^ int(y)).count("1") for x, y in zip(a, b)]
    np.testing.assert_array_equal(hamming_distance(a, b), want)
    np.testing.assert_array_equal(dedup._popcount_lut(a ^ b), want)
    assert hamming_distance(np.uint64(2**64 - 1), np.uint64(0)) == 64
    assert hamming_distance(a[:3, None], b[None, :4]).shape == (3, 4)


def test_int64_hashes_are_read_bit_for_bit():
    h = np.array([2**64 - 1, 3], dtype=np.uint64)
    assert hamming_distance(h.view(np.int64), h).tolist() == [0, 0]
    assert_same_pairs(near_duplicate_pairs(h.view(np.int64), 0), near_duplicate_pairs(h, 0))


# ---------------------------------------------------------------------------- pair search
@pytest.mark.parametrize("max_distance", [0, 1, 2, 4, 7, 10])
def test_multi_index_equals_all_pairs(mih_only, max_distance):
    rng = np.random.default_rng(100 + max_distance)
    h = planted_hashes(rng, 3000, max_distance, 300)
    got = near_duplicate_pairs(h, max_distance)
    assert_same_pairs(got, all_pairs_near_duplicates(h, max_distance))
    assert len(got[0]) > 100  # the planted near duplicates were found, not just noise
    assert np.all(got[0] < got[1])


def test_fallback_to_all_distinct_pairs_gives_same_result(monkeypatch):
    rng = np.random.default_rng(7)
    h = planted_hashes(rng, 1500, 5, 200)
    want = all_pairs_near_duplicates(h, 5)
    monkeypatch.setattr(dedup, "_CANDIDATE_COST", 10**9)  # always fall back
    assert_same_pairs(near_duplicate_pairs(h, 5, batch_pairs=5000), want)


@pytest.mark.parametrize("batch_pairs", [61, 4099, 1 << 20])
def test_giant_bucket_of_identical_hashes(mih_only, batch_pairs):
    rng = np.random.default_rng(3)
    noise = planted_hashes(rng, 1000, 3, 100)
    same = np.full(1000, noise[0])
    near = np.array([flip(noise[0], rng.choice(64, size=k, replace=False)) for k in (1, 2, 3, 4, 5)])
    h = rng.permutation(np.concatenate([noise, same, near]))
    got = near_duplicate_pairs(h, 3, batch_pairs=batch_pairs)
    assert_same_pairs(got, all_pairs_near_duplicates(h, 3))
    assert len(got[0]) >= 1001 * 1000 // 2


@pytest.mark.parametrize("batch_pairs", [61, 4099, 1 << 20])
def test_giant_bucket_of_distinct_hashes_sharing_a_chunk(mih_only, batch_pairs):
    # 600 hashes equal in their top 48 bits: with max_distance 3 (16-bit chunks) three chunks
    # are one giant bucket each, while the hashes themselves are all distinct.
    rng = np.random.default_rng(4)
    top = np.uint64(0xABCD_EF01_2345_0000)
    low = rng.choice(2**16, size=600, replace=False).astype(np.uint64)
    h = np.concatenate([top | low, rng.integers(0, 2**64, size=400, dtype=np.uint64)])
    got = near_duplicate_pairs(h, 3, batch_pairs=batch_pairs)
    assert_same_pairs(got, all_pairs_near_duplicates(h, 3))
    assert len(got[0]) > 1000


@pytest.mark.parametrize("max_distance", [0, 1, 5, 9, 32])
def test_distance_exactly_t_included_and_t_plus_1_excluded(mih_only, max_distance):
    base = np.uint64(0x0123_4567_89AB_CDEF)
    t = max_distance
    at_t = flip(base, range(t))  # t low bits
    beyond = flip(base, range(63, 63 - (t + 1), -1))  # t + 1 bits from the other end
    h = np.array([base, at_t, beyond], dtype=np.uint64)
    assert hamming_distance(h[0], h[1:]).tolist() == [t, t + 1]
    assert_same_pairs(near_duplicate_pairs(h, t), (np.array([0]), np.array([1])))
    assert_same_pairs(all_pairs_near_duplicates(h, t), (np.array([0]), np.array([1])))


def test_distance_zero_finds_exact_duplicates_only():
    h = np.array([5, 4, 5, 9, 4, 5], dtype=np.uint64)
    assert_same_pairs(near_duplicate_pairs(h, 0), (np.array([0, 0, 1, 2]), np.array([2, 5, 4, 5])))


@pytest.mark.parametrize("n", [0, 1])
def test_empty_and_single(n):
    h = np.zeros(n, dtype=np.uint64)
    for find in (near_duplicate_pairs, all_pairs_near_duplicates):
        i, j = find(h, 4)
        assert len(i) == len(j) == 0 and i.dtype == np.int64


@settings(max_examples=60, deadline=None)
@given(
    bases=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=6),
    copies=st.lists(
        st.tuples(st.integers(0, 5), st.lists(st.integers(0, 63), max_size=9)), max_size=25
    ),
    max_distance=st.integers(0, 8),
    batch_pairs=st.integers(1, 40),
    fallback=st.booleans(),
)
def test_property_multi_index_equals_all_pairs(bases, copies, max_distance, batch_pairs, fallback):
    h = [np.uint64(b) for b in bases]
    h += [flip(np.uint64(bases[k % len(bases)]), bits) for k, bits in copies]
    h = np.array(h, dtype=np.uint64)
    saved = dedup._CANDIDATE_COST
    dedup._CANDIDATE_COST = 10**9 if fallback else 0
    try:
        got = near_duplicate_pairs(h, max_distance, batch_pairs=batch_pairs)
    finally:
        dedup._CANDIDATE_COST = saved
    assert_same_pairs(got, all_pairs_near_duplicates(h, max_distance, block_elements=7))


# ---------------------------------------------------------------------------- merging parents
def test_merge_is_transitive():
    parents = np.array([10, 20, 30, 40, 20])
    # crop 0 (parent 10) ~ crop 1 (parent 20); crop 4 (parent 20) ~ crop 2 (parent 30)
    merged = merge_linked_parents(parents, (np.array([0, 2]), np.array([1, 4])))
    assert merged.tolist() == [0, 0, 0, 1, 0]
    assert merged.dtype == np.int64


def test_merge_numbering_follows_smallest_original_code():
    parents = np.array(["b", "z", "a", "m"])
    merged = merge_linked_parents(parents, (np.array([1]), np.array([2])))  # z ~ a
    assert merged.tolist() == [1, 0, 0, 2]  # {a, z} -> 0, b -> 1, m -> 2
    assert merge_linked_parents(parents, (np.array([], int), np.array([], int))).tolist() == [1, 3, 0, 2]


@pytest.mark.parametrize("seed", range(5))
def test_merge_matches_hand_union_find(seed):
    rng = np.random.default_rng(seed)
    parents = rng.integers(0, 60, size=300) * 7 + 3  # sparse, unordered codes
    pairs = (rng.integers(0, 300, size=40), rng.integers(0, 300, size=40))
    want = union_find_codes(parents.tolist(), pairs)
    np.testing.assert_array_equal(merge_linked_parents(parents, pairs), want)


@pytest.mark.parametrize("max_distance", [0, 3, 6])
def test_link_parents_equals_merge_of_pairs(max_distance):
    rng = np.random.default_rng(11)
    h = planted_hashes(rng, 2000, max_distance, 200)
    h[rng.choice(2000, size=300, replace=False)] = h[5]  # a block of copies across many parents
    parents = rng.integers(0, 400, size=2000).astype(str)
    pairs = near_duplicate_pairs(h, max_distance)
    res = link_parents(parents, h, max_distance)
    assert isinstance(res, DedupResult)
    np.testing.assert_array_equal(res.merged_codes, merge_linked_parents(parents, pairs))
    np.testing.assert_array_equal(res.merged_codes, union_find_codes(parents.tolist(), pairs))
    assert res.n_pairs == len(pairs[0])
    assert res.n_parents_before == len(np.unique(parents))
    assert res.n_parents_after == res.merged_codes.max() + 1 < res.n_parents_before
    assert res.max_distance == max_distance
    for k, name in enumerate(res.first_parents):
        assert name == min(parents[res.merged_codes == k])


def test_link_parents_without_duplicates_keeps_parents():
    h = np.array([0, 2**64 - 1, 0x00FF_00FF_00FF_00FF], dtype=np.uint64)
    res = link_parents(np.array([5, 2, 9]), h)
    assert res.merged_codes.tolist() == [1, 0, 2]
    assert (res.n_pairs, res.n_parents_before, res.n_parents_after, res.n_merged) == (0, 3, 3, 0)
    assert res.first_parents.tolist() == [2, 5, 9]


# ---------------------------------------------------------------------------- image hashes
def test_perceptual_hash_equals_imagehash_and_separates_images(tmp_path):
    rng = np.random.default_rng(0)
    original = texture(1)
    brighter = original.astype(float) * 1.08 + 6 + rng.normal(0, 3, original.shape)
    paths = {
        "original": tmp_path / "original.png",
        "copy": tmp_path / "copy.png",
        "unrelated": tmp_path / "unrelated.png",
    }
    Image.fromarray(original).save(paths["original"])
    Image.fromarray(np.clip(brighter, 0, 255).astype(np.uint8)).save(paths["copy"])
    Image.fromarray(texture(2)).save(paths["unrelated"])

    h = perceptual_hashes([str(p) for p in paths.values()])
    assert h.dtype == np.uint64 and h.shape == (3,)
    for value, path in zip(h, paths.values()):
        with Image.open(path) as img:
            ref = imagehash.phash(img)
        assert int(value) == int(str(ref), 16)
        assert hashes_from_hex([str(ref)])[0] == value
    d_copy, d_unrelated = hamming_distance(h[0], h[1:])
    assert d_copy <= 4
    assert d_unrelated >= 16


def test_hashes_from_hex_round_trip():
    values = ["ffffffffffffffff", "0000000000000000", "8000000000000001", " 0123456789ABCDEF "]
    h = hashes_from_hex(values)
    assert h.dtype == np.uint64
    assert [int(v) for v in h] == [2**64 - 1, 0, 2**63 + 1, 0x0123456789ABCDEF]
    assert hashes_from_hex([]).shape == (0,)


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", ["ffff", "fffffffffffffffff", "ggffffffffffffff", None, 12])
def test_bad_hex_names_position_and_value(bad):
    with pytest.raises(TableError, match=r"position 1 .*" + repr(bad).replace("(", r"\(")):
        hashes_from_hex(["0000000000000000", bad, "zz"])


@pytest.mark.parametrize("bad", [-1, 33, 2.0, True, "4"])
@pytest.mark.parametrize("func", [near_duplicate_pairs, all_pairs_near_duplicates])
def test_bad_max_distance(func, bad):
    with pytest.raises(ShortcutlabError, match="max_distance"):
        func(np.zeros(3, dtype=np.uint64), bad)
    with pytest.raises(ValueError):
        link_parents(np.zeros(3), np.zeros(3, dtype=np.uint64), bad)


def test_length_mismatch_says_expected_and_got():
    with pytest.raises(TableError, match="expected 3 .* got 2"):
        link_parents(np.array([1, 2, 3]), np.zeros(2, dtype=np.uint64))


@pytest.mark.parametrize("bad", [np.zeros((2, 2), np.uint64), np.array([0.5, 1.0]), np.array(["ab", "cd"])])
def test_bad_hash_arrays(bad):
    with pytest.raises(TableError, match="hashes"):
        near_duplicate_pairs(bad, 1)


def test_bad_pairs_rejected():
    with pytest.raises(TableError, match=r"0\.\.2 .* pair 1 is \(0, 3\)"):
        merge_linked_parents(np.array([1, 2, 3]), (np.array([0, 0]), np.array([1, 3])))
    with pytest.raises(TableError, match="equal length"):
        merge_linked_parents(np.array([1, 2, 3]), (np.array([0, 1]), np.array([1])))


def test_missing_file_names_path(tmp_path):
    Image.fromarray(texture(3)).save(tmp_path / "ok.png")
    missing = tmp_path / "nope.png"
    with pytest.raises(TableError, match="nope.png"):
        perceptual_hashes([str(tmp_path / "ok.png"), str(missing)])
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(TableError, match="text.png"):
        perceptual_hashes([tmp_path / "text.png"])


def test_hash_size_other_than_8_rejected(tmp_path):
    Image.fromarray(texture(3)).save(tmp_path / "ok.png")
    with pytest.raises(ShortcutlabError, match="hash_size must be 8"):
        perceptual_hashes([str(tmp_path / "ok.png")], hash_size=16)


def test_bad_hex_names_the_crop_id_when_given():
    with pytest.raises(TableError, match=r"hash of crop id 'cell-7' must be 16 hexadecimal digits.*'xyz'"):
        hashes_from_hex(["0000000000000000", "xyz"], ids=["cell-3", "cell-7"])


def test_hashes_for_ids_reads_hex_and_integers_bit_for_bit():
    from shortcutlab.data.dedup import hashes_for_ids

    ids = ["a", "b", "c", "d"]
    got = hashes_for_ids(["00000000000000ff", 2**64 - 1, -1, np.uint64(5)], ids)
    assert [int(v) for v in got] == [255, 2**64 - 1, 2**64 - 1, 5]  # -1 as int64 has all 64 bits set
    for bad, shown in ((2**64, "18446744073709551616"), (1.5, "1.5"), (None, "None"), (True, "True")):
        with pytest.raises(TableError, match=f"crop id 'c' .*got {shown}"):
            hashes_for_ids([1, 2, bad, 3], ids)
