"""Benchmark the synthetic benchmark: rendering, and rendering plus writing the files.

Goal (synth issue): at least 2,000 crops of 64 x 64 per second on 2 cores for `synthesize` +
`write_synth` together. Times (best of --repeats):

- render only: `synthesize` (all five mechanisms at strength 1, the default);
- render + write: `synthesize` + `write_synth` into a fresh folder each time, on tmpfs
  (/dev/shm) when present, so that the figure measures this code and not the disk; `--out DIR`
  times a folder of your choice as well (on the 2-core development VM, creating a small file
  on its ext4 disk costs about 1 ms, which alone caps a disk at ~500 crops/s);
- the reference: the same files written with Pillow's PNG encoder (`Image.save`, the default
  compression) instead of the minimal encoder in `shortcutlab.synth`.

It also prints the time of a fixed numpy workload, since the shared VMs vary in speed by up to
2x from minute to minute; compare runs through it.

    python benchmarks/bench_synth.py                    # ~2,000 crops of 64 x 64
    python benchmarks/bench_synth.py --fields-per-class 200 --crop-size 32 --out /tmp/synth_bench
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from _machine import numpy_reference_ms  # benchmarks/ is on sys.path when a script runs

try:
    from shortcutlab.synth import SynthConfig, synthesize, write_synth
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from shortcutlab.synth import SynthConfig, synthesize, write_synth


def pillow_write(data, out: str) -> None:
    """Reference writer: Pillow's PNG encoder, one file per crop and per mask."""
    from PIL import Image

    os.makedirs(os.path.join(out, "crops"))
    os.makedirs(os.path.join(out, "masks"))
    images = data.images.numpy().transpose(0, 2, 3, 1)
    masks = data.masks.numpy()[:, 0]
    for i, name in enumerate(data.table["id"]):
        Image.fromarray(images[i]).save(os.path.join(out, "crops", name + ".png"))
        Image.fromarray(masks[i].astype(np.uint8) * 255).save(os.path.join(out, "masks", name + ".png"))


def best_of(repeats: int, fn) -> tuple[float, object]:
    """Best wall time of `repeats` calls of `fn`, and its last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def render_and_write(config: SynthConfig, parent: str, workers, level: int) -> float:
    """Seconds for synthesize + write_synth into a new folder under `parent` (removed after)."""
    folder = tempfile.mkdtemp(dir=parent)
    try:
        t = time.perf_counter()
        data = synthesize(config, workers=workers)
        write_synth(data, os.path.join(folder, "bench"), compress_level=level, workers=workers)
        return time.perf_counter() - t
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fields-per-class", type=int, default=108, help="108 x 3 fields give ~2,000 crops")
    ap.add_argument("--crop-size", type=int, default=64)
    ap.add_argument("--mechanism", default="color,illumination,background,focus,noise")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None, help="threads (default: up to 4, one per CPU)")
    ap.add_argument("--compress-level", type=int, default=0)
    ap.add_argument("--out", help="also time writing into a new folder under this one (removed afterwards)")
    args = ap.parse_args()

    config = SynthConfig(fields_per_class=args.fields_per_class, crop_size=args.crop_size, mechanisms=args.mechanism)
    print(f"{os.cpu_count()} CPUs; numpy reference workload {numpy_reference_ms():.1f} ms (lower = faster machine)")
    synthesize(SynthConfig(fields_per_class=1, crop_size=args.crop_size))  # warm-up

    t_render, data = best_of(args.repeats, lambda: synthesize(config, workers=args.workers))
    n = len(data)
    print(f"{n} crops of {args.crop_size}x{args.crop_size} from {config.n_fields} fields, mechanisms {args.mechanism}")
    print(f"  render only (synthesize)        {t_render:6.3f} s  {n / t_render:7.0f} crops/s")

    tmpfs = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    targets = [("tmpfs" if tmpfs else "temp dir", tmpfs)] + ([(args.out, args.out)] if args.out else [])
    for label, parent in targets:
        if parent:
            os.makedirs(parent, exist_ok=True)
        t_total = min(render_and_write(config, parent, args.workers, args.compress_level) for _ in range(args.repeats))
        print(f"  render + write ({label})  {t_total:6.3f} s  {n / t_total:7.0f} crops/s   (goal >= 2,000)")

    folder = tempfile.mkdtemp(dir=tmpfs)
    try:
        def ours():
            shutil.rmtree(os.path.join(folder, "a"), ignore_errors=True)
            write_synth(data, os.path.join(folder, "a"), compress_level=args.compress_level, workers=args.workers)

        t_ours, _ = best_of(args.repeats, ours)
        t_pil, _ = best_of(1, lambda: pillow_write(data, os.path.join(folder, "b")))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"  write only: write_synth         {t_ours:6.3f} s  {n / t_ours:7.0f} crops/s")
    print(f"  write only: Pillow Image.save   {t_pil:6.3f} s  {n / t_pil:7.0f} crops/s   ({t_pil / t_ours:.1f}x slower)")


if __name__ == "__main__":
    main()
