"""Benchmark the sibling search: 100,000 training and 20,000 test images of 64 x 64.

Images are smooth random RGB fields (a 16 x 16 grid upsampled bilinearly, plus pixel noise);
a share of the test images are augmented copies of training images (a random dihedral
transform and brightness x0.8-1.2). Timed: hashing (training pHash, test dihedral hashes) and
the multi-index search (`search_hashes`). The anchor is an all-pairs comparison of the same
hashes (every test transform against every training hash), timed on a subset of the test
images and scaled, which the script says; it checks that both find the same nearest images on
that subset.

Usage:
    python benchmarks/bench_siblings.py [--train 100000] [--test 20000] [--threshold 6]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

try:
    from shortcutlab.data import siblings
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from shortcutlab.data import siblings

from shortcutlab.data.dedup import _popcount  # noqa: E402


def smooth_images(n: int, rng: np.random.Generator, size: int = 64, grid: int = 16) -> np.ndarray:
    pos = (np.arange(size) + 0.5) * grid / size - 0.5
    lo = np.clip(np.floor(pos).astype(int), 0, grid - 1)
    hi = np.clip(lo + 1, 0, grid - 1)
    w = np.clip(pos - lo, 0, 1)
    up = np.zeros((size, grid))
    up[np.arange(size), lo] += 1 - w
    up[np.arange(size), hi] += w
    out = np.empty((n, size, size, 3), dtype=np.uint8)
    for s in range(0, n, 5000):
        g = rng.random((min(5000, n - s), 3, grid, grid)) * 200 + 20
        x = np.einsum("ai,ncij,bj->nabc", up, g, up, optimize=True) + rng.normal(0, 4, (len(g), size, size, 3))
        out[s : s + len(g)] = np.clip(x, 0, 255)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=int, default=100_000)
    parser.add_argument("--test", type=int, default=20_000)
    parser.add_argument("--copies", type=float, default=0.2, help="share of test images that are augmented copies (default 0.2)")
    parser.add_argument("--threshold", type=int, default=siblings.DEFAULT_THRESHOLD)
    parser.add_argument("--anchor-test", type=int, default=500, help="test images in the all-pairs subset (default 500)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    train = smooth_images(args.train, rng)
    test = smooth_images(args.test, rng)
    n_copy = int(args.copies * args.test)
    src = rng.integers(0, args.train, n_copy)
    for k, s in enumerate(src):
        a = siblings.apply_transform(train[s], int(rng.integers(8))).astype(np.float32) * rng.uniform(0.8, 1.2)
        test[k] = np.clip(np.round(a), 0, 255)
    print(f"generated {args.train:,} training and {args.test:,} test images of 64 x 64 ({n_copy:,} copies) in {time.perf_counter() - t0:.1f} s (not timed)")

    t0 = time.perf_counter()
    train_h = siblings.phash_images(train)
    t_hash_train = time.perf_counter() - t0
    t0 = time.perf_counter()
    test_v = siblings.dihedral_hashes(test)
    t_hash_test = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = siblings.search_hashes(train_h, test_v, args.threshold)
    t_search = time.perf_counter() - t0
    ours = t_hash_train + t_hash_test + t_search
    found_copies = float((res.nearest[:n_copy] == src).mean()) if n_copy else float("nan")
    print(f"hash training {t_hash_train:.2f} s, hash test x8 {t_hash_test:.2f} s, search {t_search:.2f} s: total {ours:.2f} s")
    print(f"share with a sibling {res.share:.4f}; copies linked to their source {found_copies:.4f}")

    m = min(args.anchor_test, args.test)
    t0 = time.perf_counter()
    best = np.full(m, 65, dtype=np.int64)
    for i in range(m):
        best[i] = _popcount(test_v[i][:, None] ^ train_h[None, :]).min()
    t_anchor_subset = time.perf_counter() - t0
    t_anchor = t_anchor_subset * args.test / m
    sub = siblings.search_hashes(train_h, test_v[:m], args.threshold)
    want = np.where(best <= args.threshold, best, -1)
    assert np.array_equal(sub.distance, want), "all-pairs and multi-index disagree"
    print(f"all pairs on {m} test images: {t_anchor_subset:.2f} s, scaled to {args.test:,}: {t_anchor:.1f} s (extrapolated)")
    print(f"search: multi-index {t_search:.2f} s vs all pairs {t_anchor:.1f} s: {t_anchor / t_search:.0f}x; "
          f"with hashing: {(t_anchor + t_hash_train + t_hash_test) / ours:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
