"""Benchmark `shortcutlab siblings` on image files against a plain imagehash loop, same run.

Issue 25's comparison: N PNG files of 64 x 64 (default 20,000: 16,000 training and 4,000 test
images, 800 of the test images augmented copies of training images: a random dihedral
transform and brightness x0.8-1.2), written once with Pillow's default PNG settings into
DATA/train and DATA/test (kept between runs; `--data`).

Each contender runs in its own child process, timed from its start to its exit, with its peak
resident memory (``ru_maxrss`` of that child, imports included):

- **ours**: ``python -m shortcutlab siblings DATA/train DATA/test --out OUT``, the whole command
  (hashing, search, confirmation, siblings.csv / .json / contact sheet);
- **imagehash loop** (the anchor): open each PNG, ``imagehash.phash`` of each of its eight
  flips and rotations, as issue 25 measured it; hashes only, no search.

They alternate, best of `--repeat` each, and the load average is printed beside every run.
The script then checks that our output linked every planted copy to its source.

`--scale 20000,100000,200000` instead measures our command's time and peak memory at those
sizes (training sides of that many images, test sides a fifth of it; generated on first use,
reusing files) and the memory added per added image: the file list, the hashes and the search's
index grow with the images, the pixels held do not.

Usage:
    python benchmarks/bench_siblings_files.py [--data /work/bench-data/siblings] [--n 20000] [--repeat 3]
    python benchmarks/bench_siblings_files.py --scale 20000,100000,200000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRANSPOSE = (None, "ROTATE_90", "ROTATE_180", "ROTATE_270", "FLIP_LEFT_RIGHT", "FLIP_TOP_BOTTOM", "TRANSPOSE", "TRANSVERSE")


def _smooth_images(n: int, rng: np.random.Generator, size: int = 64, grid: int = 16) -> np.ndarray:
    """Smooth random RGB fields (bench_siblings.smooth_images): a 16 x 16 grid upsampled
    bilinearly plus pixel noise."""
    sys.path.insert(0, HERE)
    from bench_siblings import smooth_images

    return smooth_images(n, rng, size, grid)


def _name(k: int) -> str:
    return os.path.join(f"{k // 1000:04d}", f"{k:07d}.png")  # 1,000 files per folder


def _write(folder: str, start: int, images: np.ndarray) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    def one(k):
        path = os.path.join(folder, _name(start + k))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Image.fromarray(images[k]).save(path)  # Pillow's defaults: zlib level 6, adaptive filters

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, range(len(images))))


def planted(copies: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each planted copy's source index, dihedral transform and brightness gain.

    Copies are test images 0 .. copies-1; their sources are drawn from the first 16,000
    training images, so every size shares the same planted pairs.
    """
    rng = np.random.default_rng(seed)
    return rng.integers(0, 16_000, copies), rng.integers(0, 8, copies), rng.uniform(0.8, 1.2, copies)


def generate(data: str, n_train: int, n_test: int, copies: int, seed: int = 0) -> np.ndarray:
    """Write the PNGs (unless a previous run finished them) in a child process and return each
    copy's source index.

    The writing runs in its own process: Linux carries a process's peak resident memory across
    fork and exec into its children's ``ru_maxrss``, so a parent that had grown while writing
    would lift every contender's measured peak to its own.
    """
    if n_train < 16_000 or n_test < copies:
        raise SystemExit(f"need >= 16,000 training images and >= {copies} test images (the planted pairs); got {n_train:,} and {n_test:,}")
    marks = [os.path.join(data, side, f".done-{n}") for side, n in (("train", n_train), ("test", n_test))]
    if not all(os.path.exists(m) for m in marks):
        cmd = [sys.executable, __file__, "--data", data, "--copies", str(copies),
               "--write", str(n_train), str(n_test), str(seed)]
        if subprocess.run(cmd).returncode:
            raise SystemExit("writing the PNGs failed (above)")
    return planted(copies, seed)[0]


def write(data: str, n_train: int, n_test: int, copies: int, seed: int = 0) -> None:
    """The PNGs of `generate`, written in this process."""
    from shortcutlab.data.siblings import apply_transform

    src, g, gain = planted(copies, seed)
    for side, n in (("train", n_train), ("test", n_test)):
        folder = os.path.join(data, side)
        done_mark = os.path.join(folder, f".done-{n}")
        if os.path.exists(done_mark):
            continue
        t0 = time.perf_counter()
        for lo in range(0, n, 1000):  # one folder at a time, each drawn from its own seed
            count = min(1000, n - lo)
            if os.path.exists(os.path.join(folder, _name(lo + count - 1))):
                continue  # an interrupted or smaller run wrote this folder already
            block = _smooth_images(count, np.random.default_rng([seed, lo, side == "test"]))
            if side == "test":
                for k in range(lo, min(lo + count, copies)):
                    a = apply_transform(_train_image(data, int(src[k])), int(g[k])).astype(np.float32) * gain[k]
                    block[k - lo] = np.clip(np.round(a), 0, 255)
            _write(folder, lo, block)
        open(done_mark, "w").close()
        print(f"wrote {n:,} {side} PNGs in {time.perf_counter() - t0:.0f} s (not timed)", flush=True)


def _train_image(data: str, k: int) -> np.ndarray:
    from PIL import Image

    with Image.open(os.path.join(data, "train", _name(k))) as im:
        return np.asarray(im.convert("RGB"))


def subset(data: str, side: str, n: int) -> str:
    """A folder of symbolic links to the first `n` images of a side (what a size measures)."""
    folder = os.path.join(data, f"{side}-{n}")
    mark = os.path.join(folder, ".done")
    if not os.path.exists(mark):
        for k in range(n):
            link = os.path.join(folder, _name(k))
            os.makedirs(os.path.dirname(link), exist_ok=True)
            if not os.path.lexists(link):
                os.symlink(os.path.join(data, side, _name(k)), link)
        open(mark, "w").close()
    return folder


def anchor(train: str, test: str) -> None:
    """The plain imagehash loop: every PNG opened, its eight transforms hashed (kept as packed
    64-bit integers, the least memory a loop can keep them in)."""
    import imagehash
    from PIL import Image

    paths = []
    for folder in (train, test):
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            paths += [os.path.join(root, f) for f in sorted(files) if f.endswith(".png")]
    out = np.zeros((len(paths), 8), dtype=np.uint64)
    for k, path in enumerate(paths):
        with Image.open(path) as im:
            im = im.convert("RGB")
            out[k] = [int(str(imagehash.phash(im if t is None else im.transpose(getattr(Image.Transpose, t)))), 16)
                      for t in TRANSPOSE]
    print(f"hashed {len(out)} images x 8")


def child(cmd: list[str]) -> tuple[float, float, str]:
    """(seconds, peak RSS in MB, output) of one child process."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out}")
    return seconds, usage.ru_maxrss / 1024, out


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def ours_cmd(train: str, test: str, out: str) -> list[str]:
    return [sys.executable, "-m", "shortcutlab", "siblings", train, test, "--out", out]


def compare(data: str, n: int, repeat: int, src: np.ndarray) -> None:
    n_test = n // 5
    train, test = subset(data, "train", n - n_test), subset(data, "test", n_test)
    runs = {"ours": [], "imagehash loop": []}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sib")
        for r in range(repeat):
            for name in runs:
                cmd = ours_cmd(train, test, out) if name == "ours" else [sys.executable, __file__, "--anchor", train, test]
                before = load()
                s, mb, text = child(cmd)
                runs[name].append((s, mb))
                print(f"  run {r + 1} {name:15s} {s:6.2f} s  peak {mb:6.0f} MB  (load before {before})", flush=True)
        import pandas as pd

        frame = pd.read_csv(os.path.join(out, "siblings.csv"), keep_default_na=False)
    copies = len(src)
    got = frame["train_id"].iloc[:copies].tolist()
    want = [_name(int(s)) for s in src]
    linked = sum(a == b for a, b in zip(got, want))
    share = frame["is_sibling"].astype(str).eq("True").mean()
    best = {k: (min(s for s, _ in v), min(m for _, m in v)) for k, v in runs.items()}
    (ts, tm), (as_, am) = best["ours"], best["imagehash loop"]
    print(f"{n - n_test:,} training + {n_test:,} test PNGs of 64 x 64, best of {repeat}:")
    print(f"  ours           {ts:6.2f} s  peak {tm:6.0f} MB")
    print(f"  imagehash loop {as_:6.2f} s  peak {am:6.0f} MB")
    print(f"  speed {as_ / ts:.2f}x the loop (goal >= 3x); memory {tm / am:.2f}x the loop's (goal <= 2x); load now {load()}")
    print(f"  share {share:.4f}; planted copies linked to their source: {linked} of {copies}")
    print("  (ours: the whole command, hashing, search, confirmation and outputs; the loop: hashes only)")


def scale(data: str, sizes: list[int], src_copies: int) -> None:
    previous = None
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            n_test = n // 5
            train, test = subset(data, "train", n), subset(data, "test", n_test)
            before = load()
            s, mb, _ = child(ours_cmd(train, test, os.path.join(tmp, f"sib-{n}")))
            growth = "" if previous is None else \
                f", {(mb - previous[1]) * 2**20 / (n + n_test - previous[0]):,.0f} bytes per added image"
            print(f"  {n:,} training + {n_test:,} test PNGs: {s:7.1f} s ({(n + n_test) / s:,.0f} images/s), peak {mb:6.0f} MB"
                  f"{growth} (load before {before})", flush=True)
            previous = (n + n_test, mb)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="/work/bench-data/siblings", help="folder of the generated PNGs (kept)")
    parser.add_argument("--n", type=int, default=20_000, help="images in all, a fifth of them test images (default 20000)")
    parser.add_argument("--copies", type=int, default=800, help="planted copies among the test images (default 800)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scale", help="comma-separated training-side sizes: our peak memory at each")
    parser.add_argument("--anchor", nargs=2, metavar=("TRAIN", "TEST"), help=argparse.SUPPRESS)
    parser.add_argument("--write", nargs=3, type=int, metavar=("N_TRAIN", "N_TEST", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write:
        sys.path.insert(0, ROOT)
        write(args.data, *args.write[:2], args.copies, args.write[2])
        return 0
    if args.anchor:
        anchor(*args.anchor)
        return 0
    sys.path.insert(0, ROOT)
    if args.scale:
        sizes = [int(s) for s in args.scale.split(",")]
        generate(args.data, max(sizes), max(sizes) // 5, args.copies)
        scale(args.data, sizes, args.copies)
        return 0
    n_test = args.n // 5
    src = generate(args.data, args.n - n_test, n_test, args.copies)
    compare(args.data, args.n, args.repeat, src)
    return 0


if __name__ == "__main__":
    sys.exit(main())
