"""Benchmark `shortcutlab locate`: crops found in field images, against per-pair NCC.

Fields are smooth random RGB images (noise at three scales, upsampled bilinearly, plus pixel
noise), written as PNG; crops of 64-128 px are cut from random fields at random places, half
saved as PNG (exact copies) and half re-encoded as JPEG at quality 90. Timed: `locate` on the
whole set, from the files (reading, indexing, voting, verifying). The anchor is the naive
route, scikit-image's `match_template` of each crop over each whole field, timed in the same
run on a sub-sample of crop-field pairs and scaled to all pairs (the script says so). It
also checks that the anchor finds the same box as `locate` for the sub-sample's true pairs.

The issue's target: 4,000 crops into 1,000 fields of 1024 x 768 within 5 minutes on 2 cores
(``--crops 4000 --fields 1000``); the default is a tenth of that.

Usage:
    python benchmarks/bench_locate.py [--crops 400] [--fields 100] [--width 1024] [--height 768]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

try:
    from shortcutlab.ingest import locate as loc
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from shortcutlab.ingest import locate as loc

from _machine import numpy_reference_ms  # noqa: E402


def smooth_field(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """(h, w, 3) uint8: noise at 1/32, 1/8 and full scale, upsampled bilinearly."""
    from scipy import ndimage

    x = np.full((h, w, 3), 128.0)
    for step, amp in ((32, 50), (8, 25), (1, 4)):
        g = rng.normal(size=(-(-h // step) + 1, -(-w // step) + 1, 3))
        x += amp * ndimage.zoom(g, (step, step, 1), order=1)[:h, :w] if step > 1 else amp * g[:h, :w]
    return np.clip(x, 0, 255).astype(np.uint8)


def make_release(root: str, n_fields: int, n_crops: int, h: int, w: int, seed: int) -> tuple[list, np.ndarray]:
    """Write fields/ and crops/ under `root` and table.csv; return the fields and the truth
    (field, y, x, jpeg) of every crop."""
    import pandas as pd
    from PIL import Image

    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "fields"))
    os.makedirs(os.path.join(root, "crops"))
    fields = []
    for i in range(n_fields):
        f = smooth_field(rng, h, w)
        Image.fromarray(f).save(os.path.join(root, "fields", f"field{i:04d}.png"), compress_level=1)
        fields.append(f)
    truth, rows = np.zeros((n_crops, 4), dtype=int), []
    for k in range(n_crops):
        f_i = int(rng.integers(n_fields))
        ch, cw = (int(v) for v in rng.integers(64, 129, size=2))
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        jpeg = k % 2
        path = f"crops/crop{k:05d}." + ("jpg" if jpeg else "png")
        Image.fromarray(fields[f_i][y:y + ch, x:x + cw]).save(os.path.join(root, path), **({"quality": 90} if jpeg else {}))
        truth[k] = f_i, y, x, jpeg
        rows.append({"id": f"crop{k:05d}", "path": path, "parent": f"field{f_i:04d}"})
    pd.DataFrame(rows).to_csv(os.path.join(root, "table.csv"), index=False)
    return fields, truth


def anchor(root: str, fields: list, truth: np.ndarray, pairs: int, seed: int) -> tuple[float, int, int]:
    """Seconds per crop-field pair of `match_template` over the whole field, and how many of
    `pairs` true pairs it places at the true box."""
    from skimage.feature import match_template

    rng = np.random.default_rng(seed + 1)
    luma = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    ks = rng.choice(len(truth), size=min(pairs, len(truth)), replace=False)
    from PIL import Image

    crops = [np.asarray(Image.open(os.path.join(root, "crops", f"crop{k:05d}." + ("jpg" if truth[k, 3] else "png"))).convert("RGB"),
                        dtype=np.float32) @ luma for k in ks]
    greys = {int(truth[k, 0]): fields[int(truth[k, 0])].astype(np.float32) @ luma for k in ks}
    t = time.perf_counter()
    right = 0
    for c, k in zip(crops, ks):
        r = match_template(greys[int(truth[k, 0])], c)
        i, j = np.unravel_index(int(np.argmax(r)), r.shape)
        right += (abs(i - truth[k, 1]) <= 2) and (abs(j - truth[k, 2]) <= 2)
    return (time.perf_counter() - t) / len(ks), right, len(ks)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crops", type=int, default=400)
    parser.add_argument("--fields", type=int, default=100)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--anchor-pairs", type=int, default=10, help="crop-field pairs timed for the per-pair anchor (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    print(f"numpy reference workload: {numpy_reference_ms():.1f} ms")
    with tempfile.TemporaryDirectory() as root:
        t = time.perf_counter()
        fields, truth = make_release(root, args.fields, args.crops, args.height, args.width, args.seed)
        print(f"wrote {args.fields} fields of {args.width} x {args.height} and {args.crops} crops of 64-128 px "
              f"(half JPEG q90) in {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        table, summary = loc.locate(os.path.join(root, "table.csv"), os.path.join(root, "fields"), allow_unmatched=True)
        t_locate = time.perf_counter() - t
        per_pair, right, n = anchor(root, fields, truth, args.anchor_pairs, args.seed)

    got_field = np.array([int(p[5:]) if p else -1 for p in table["parent"]])
    ys = table["y"].fillna(-99).astype(int).to_numpy()
    xs = table["x"].fillna(-99).astype(int).to_numpy()
    png, jpg = truth[:, 3] == 0, truth[:, 3] == 1
    exact = (got_field == truth[:, 0]) & (ys == truth[:, 1]) & (xs == truth[:, 2])
    near = (got_field == truth[:, 0]) & (np.abs(ys - truth[:, 1]) <= 2) & (np.abs(xs - truth[:, 2]) <= 2)
    print(f"locate: {t_locate:.1f} s for {args.crops} crops x {args.fields} fields "
          f"(methods {summary['n_by_method']}, scale {summary['method']['scale']})")
    print(f"  PNG copies found exactly: {exact[png].sum()} of {png.sum()}; JPEG q90 copies within 2 px: {near[jpg].sum()} of {jpg.sum()}")
    print(f"  agreement with the filename parent: {summary['agreement']['n_agree']} of {summary['agreement']['n_compared']}")
    naive = per_pair * args.crops * args.fields
    print(f"anchor: skimage match_template per crop-field pair, {1e3 * per_pair:.1f} ms a pair (mean of {n} pairs timed, "
          f"{right} of {n} at the true box); scaled to all {args.crops * args.fields} pairs: {naive:.0f} s")
    print(f"speed-up over the per-pair anchor: {naive / t_locate:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
