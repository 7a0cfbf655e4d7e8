"""Benchmark near-duplicate linking: multi-index hashing against the all-pairs reference.

Generates N random 64-bit hashes, plants near-duplicates (copies of other hashes with
0..distance+1 bits flipped, so some fall just outside the threshold), times
`near_duplicate_pairs` (best of --repeats) and `all_pairs_near_duplicates` (once, it is slow),
checks that both return the same pairs, and times `link_parents` end to end.

Usage:
    python benchmarks/bench_dedup.py --n 50000 --distance 4
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

try:
    from shortcutlab.data import dedup
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from shortcutlab.data import dedup


def planted_hashes(n: int, distance: int, fraction: float, seed: int) -> np.ndarray:
    """(n,) uint64 random hashes; a `fraction` of them replaced by near copies of others."""
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    m = int(round(fraction * n))
    src = rng.integers(0, n, size=m)
    dst = rng.choice(n, size=m, replace=False)
    # Flip k distinct random bits per copy, k uniform in 0..distance+1, all copies at once:
    # rank random keys per row and flip the bits whose rank is below k.
    k = rng.integers(0, distance + 2, size=m)
    ranks = np.argsort(np.argsort(rng.random((m, 64)), axis=1), axis=1)
    flips = ranks < k[:, None]
    masks = (flips.astype(np.uint64) << np.arange(64, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)
    h[dst] = h[src] ^ masks
    return h


def best_time(func, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = func()
        best = min(best, time.perf_counter() - start)
    return best, out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50_000, help="number of hashes (default 50000)")
    parser.add_argument("--distance", type=int, default=4, help="Hamming threshold in bits (default 4)")
    parser.add_argument("--planted", type=float, default=0.05, help="fraction of planted near-duplicates (default 0.05)")
    parser.add_argument("--crops-per-parent", type=int, default=20, help="mean crops per parent for link_parents (default 20)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats for the fast paths; best is reported (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-all-pairs", action="store_true", help="do not run the quadratic reference")
    args = parser.parse_args(argv)

    h = planted_hashes(args.n, args.distance, args.planted, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    parents = rng.integers(0, max(1, args.n // args.crops_per_parent), size=args.n)
    print(f"N = {args.n} hashes, {args.planted:.0%} planted near-duplicates, max_distance = {args.distance}")
    print(f"numpy {np.__version__}, {os.cpu_count()} CPUs")

    t_mih, pairs = best_time(lambda: dedup.near_duplicate_pairs(h, args.distance), args.repeats)
    print(f"near_duplicate_pairs (multi-index) : {t_mih:8.3f} s  (best of {args.repeats}), {len(pairs[0])} pairs")

    if not args.skip_all_pairs:
        t_all, ref = best_time(lambda: dedup.all_pairs_near_duplicates(h, args.distance), 1)
        same = np.array_equal(pairs[0], ref[0]) and np.array_equal(pairs[1], ref[1])
        print(f"all_pairs_near_duplicates (reference): {t_all:8.3f} s  (1 run), {len(ref[0])} pairs")
        print(f"identical pairs: {same}; speed-up: {t_all / t_mih:.0f}x")
        if not same:
            print("ERROR: multi-index result differs from the all-pairs reference", file=sys.stderr)
            return 1

    t_link, res = best_time(lambda: dedup.link_parents(parents, h, args.distance), args.repeats)
    print(
        f"link_parents (end to end)            : {t_link:8.3f} s  (best of {args.repeats}), "
        f"{res.n_pairs} pairs, parents {res.n_parents_before} -> {res.n_parents_after}"
    )
    if res.n_pairs != len(pairs[0]):
        print("ERROR: link_parents counted a different number of pairs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
