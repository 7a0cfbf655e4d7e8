"""Benchmark `probes.extract_features`: crops/s for resnet18 at 64 x 64, and the cached second call.

Issue 9 item 1 asks for the figures (no goal). A random-init timm resnet18 (eval mode) runs on
--crops random uint8 crops of --size px in batches of --batch, three ways in one run:

- the bare forward (``forward_features`` + ``forward_head(pre_logits=True)`` under no_grad on
  pre-made float batches): the anchor, what the model alone costs;
- `extract_features` with a disk cache in a fresh temporary folder (a miss: uint8 -> float
  batches, the adapter's input checks and normalisation, the forward, and the cache key: the
  SHA-256 of the weights and of the crops, then the .npy write);
- the same call again (a hit: the cache key and one .npy read, no forward pass).

Each is the best of --repeats, interleaved (a fresh cache folder for every miss), so that a
change in a shared machine's load hits all three alike. The hashing shares are printed too.
Timings are reported, never asserted.

    python benchmarks/bench_features.py                  # 2,000 crops of 64 x 64
    python benchmarks/bench_features.py --threads 1      # steadier on a shared machine
    python benchmarks/bench_features.py --quick          # 500 crops, 1 repeat
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch

from _machine import numpy_reference_ms  # benchmarks/ is on sys.path when a script runs

try:
    import probes
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    import probes

from probes.features import cache_key, weights_hash
from shortcutlab.models.adapter import create_model, wrap


def best(repeats: int, fn) -> tuple[float, object]:
    t_best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        t_best = min(t_best, time.perf_counter() - t)
    return t_best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--crops", type=int, default=2000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--quick", action="store_true", help="500 crops, 1 repeat")
    args = ap.parse_args()
    if args.quick:
        args.crops, args.repeats = 500, 1
    if args.threads:
        torch.set_num_threads(args.threads)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{os.cpu_count()} CPUs (load average {load:.1f}), torch {torch.__version__} with {torch.get_num_threads()} threads; "
        f"numpy reference workload {numpy_reference_ms():.1f} ms (lower = faster machine)"
    )
    torch.manual_seed(0)
    model = create_model(args.arch, num_classes=5).eval()
    adapter = wrap(model)
    n, s = args.crops, args.size
    crops = torch.randint(0, 256, (n, 3, s, s), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    print(f"{args.arch} (random init, {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters), "
          f"{n} crops of {s} x {s} (uint8), batch {args.batch}")

    def bare():
        out = []
        with torch.no_grad():
            for b in range(0, n, args.batch):
                x = (crops[b : b + args.batch].float() / 255.0 - adapter.mean) / adapter.std
                out.append(model.forward_head(model.forward_features(x), pre_logits=True))
        return torch.cat(out).numpy()

    def miss():
        with tempfile.TemporaryDirectory() as d:
            return probes.extract_features(adapter, crops, batch_size=args.batch, cache_dir=d)

    # Interleaved repeats: a change in the machine's load hits every path alike.
    t_bare = t_miss = t_nocache = float("inf")
    for _ in range(args.repeats):
        t, ref = best(1, bare)
        t_bare = min(t_bare, t)
        t, _ = best(1, lambda: probes.extract_features(adapter, crops, batch_size=args.batch))
        t_nocache = min(t_nocache, t)
        t, feats = best(1, miss)
        t_miss = min(t_miss, t)
    with tempfile.TemporaryDirectory() as d:
        probes.extract_features(adapter, crops, batch_size=args.batch, cache_dir=d)
        t_hit, cached = best(max(args.repeats, 3), lambda: probes.extract_features(adapter, crops, batch_size=args.batch, cache_dir=d))
        size_mb = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)) / 1e6
    t_wh, _ = best(3, lambda: weights_hash(model))
    t_key, _ = best(3, lambda: cache_key(adapter, crops, None))

    assert np.array_equal(feats, cached)
    print(f"  max |extract - bare forward| = {np.abs(feats - ref).max():.2e} (features {feats.shape[1]}-d)")
    print(f"  {'path':44s} {'s':>7s} {'crops/s':>9s}")
    rows = [
        ("bare forward (anchor)", t_bare),
        ("extract_features, no cache", t_nocache),
        ("extract_features, cache miss (key + write)", t_miss),
        ("extract_features, cache hit (second call)", t_hit),
    ]
    for name, t in rows:
        print(f"  {name:44s} {t:7.3f} {n / t:9.0f}")
    print(f"  overhead of extract_features over the bare forward: {100 * (t_nocache / t_bare - 1):+.0f}% (no cache), "
          f"{100 * (t_miss / t_bare - 1):+.0f}% (cache miss)")
    print(f"  cache hit is {t_miss / t_hit:.0f}x faster than the miss; of it, weights hash {t_wh:.3f} s, "
          f"cache key (weights + crops) {t_key:.3f} s; cache file {size_mb:.1f} MB")


if __name__ == "__main__":
    main()
