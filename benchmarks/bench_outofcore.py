"""Out-of-core audit and parent split (issue 25): the DuckDB engine on a generated Parquet
dataset of N crops (default 100M), against the in-memory engine on a smaller table.

The dataset is written once, in chunks (never whole in memory), to --data: parents of 50-200
crops with 100 px boxes in 1376 x 1020 fields, 4 classes mixed within parents, one Parquet
file per chunk of about 2M crops. Each measured run (audit, then parent split with a
validation side) is a fresh child process; its wall time and peak resident memory
(``os.wait4``'s ru_maxrss) are printed with the load average beside them. At the reference
size both engines run in the same invocation and their figures and manifest hashes are
compared.

Target (issue 25): 100M crops audited and split within 10 minutes at < 4 GB peak memory.

    python benchmarks/bench_outofcore.py --n 10000000 --data /work/bench-data/outofcore
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

CHUNK = 2_000_000
CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
from shortcutlab.data.engines import TableSource, get_engine
engine, path, out, opts = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
eng = get_engine(engine, **opts)
src = TableSource(path, id="id", label="label", parent="parent", box="x,y,w,h")
t0 = time.perf_counter()
audit = eng.audit(src, 0.2)
t1 = time.perf_counter()
steps = {"audit " + k: v for k, v in getattr(eng, "timings_", {}).items()}
rec = eng.split(src, out, test_fraction=0.2, val_fraction=0.1, seed=0)
t2 = time.perf_counter()
steps.update({"split " + k: v for k, v in getattr(eng, "timings_", {}).items()})
print(json.dumps({"audit_s": t1 - t0, "split_s": t2 - t1, "audit": audit, "sha256": rec["sha256"], "n_rows": rec["n_rows"], "steps": steps}))
"""


def generate(folder: str, n: int, seed: int = 0) -> str:
    """A Parquet dataset of about `n` crops in `folder` (kept: generated once per size)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = os.path.join(folder, f"crops-{n}")
    if os.path.exists(os.path.join(path, "_done")):
        return path
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    rng = np.random.default_rng(seed)
    start, parent0, part = 0, 0, 0
    while start < n:
        sizes = rng.integers(50, 201, size=CHUNK // 100)
        sizes = sizes[np.cumsum(sizes) <= min(CHUNK, n - start)] if n - start > 200 else np.array([n - start])
        if len(sizes) == 0:
            sizes = np.array([n - start])
        k = int(sizes.sum())
        parent = np.repeat(np.arange(parent0, parent0 + len(sizes)), sizes)
        dom = rng.integers(0, 4, size=len(sizes))[parent - parent0]
        label = np.where(rng.random(k) < 0.7, dom, rng.integers(0, 4, size=k))
        ids = np.arange(start, start + k)

        def text(prefix: str, values: np.ndarray) -> pa.Array:
            return pc.binary_join_element_wise(prefix, pc.cast(pa.array(values), pa.string()), "")

        table = pa.table({
            "id": text("c", ids), "label": text("class", label), "parent": text("slide", parent),
            "x": rng.integers(0, 1276, size=k).astype(np.float64), "y": rng.integers(0, 920, size=k).astype(np.float64),
            "w": np.full(k, 100.0), "h": np.full(k, 100.0),
        })
        pq.write_table(table, os.path.join(path, f"part-{part:05d}.parquet"), row_group_size=500_000)
        start += k
        parent0 += len(sizes)
        part += 1
    open(os.path.join(path, "_done"), "w").close()
    return path


def run_child(engine: str, path: str, out: str, opts: dict) -> dict:
    """One audit + split in a fresh process: its figures, wall time and peak RSS."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    load0 = open("/proc/loadavg").read().split()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, engine, path, out, json.dumps(opts)], stdout=subprocess.PIPE, env=env)
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{engine} on {path} failed (status {status})")
    res = json.loads(stdout.decode().strip().splitlines()[-1])
    res.update({"wall_s": wall, "peak_rss_gb": usage.ru_maxrss / 2**20, "load_before": load0,
                "load_after": open("/proc/loadavg").read().split()[0]})
    return res


def line(name: str, n: int, r: dict) -> str:
    steps = ", ".join(f"{k} {v:.1f}" for k, v in r["steps"].items())
    return (f"{name:<8} {n:>12,} crops  audit {r['audit_s']:7.1f} s  split {r['split_s']:7.1f} s  "
            f"process {r['wall_s']:7.1f} s  peak RSS {r['peak_rss_gb']:5.2f} GB  (load {r['load_before']} -> {r['load_after']})"
            + (f"\n         steps (s): {steps}" if steps else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000_000, help="crops in the large dataset (default 100M)")
    ap.add_argument("--reference-n", type=int, default=1_000_000, help="crops for the in-memory comparison (default 1M)")
    ap.add_argument("--data", default="/work/bench-data/outofcore", help="folder the datasets are cached in")
    ap.add_argument("--memory-limit", default="2GB", help="DuckDB's memory limit (default 2GB)")
    ap.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: the cores available)")
    ap.add_argument("--skip-large", action="store_true", help="only the reference size")
    args = ap.parse_args()
    os.makedirs(args.data, exist_ok=True)
    opts = {"memory_limit": args.memory_limit}
    if args.threads:
        opts["threads"] = args.threads
    print(f"cores {len(os.sched_getaffinity(0))}, load {open('/proc/loadavg').read().strip()}")
    t0 = time.perf_counter()
    ref = generate(args.data, args.reference_n, seed=1)
    print(f"reference dataset {ref} ready in {time.perf_counter() - t0:.1f} s")
    out = os.path.join(args.data, "out")
    os.makedirs(out, exist_ok=True)
    mem = run_child("memory", ref, os.path.join(out, "ref-memory.parquet"), {})
    duck = run_child("duckdb", ref, os.path.join(out, "ref-duckdb.parquet"), opts)
    print(line("memory", args.reference_n, mem))
    print(line("duckdb", args.reference_n, duck))
    diff = max(abs(mem["audit"][k] - duck["audit"][k]) for k in ("sibling_share", "exposure", "diversity_ratio", "pixel_overlap", "overlap_share"))
    print(f"same hash at {args.reference_n:,}: {mem['sha256'] == duck['sha256']}; largest figure difference {diff:.2e}")
    if not args.skip_large:
        t0 = time.perf_counter()
        big = generate(args.data, args.n, seed=0)
        print(f"dataset {big} ready in {time.perf_counter() - t0:.1f} s")
        r = run_child("duckdb", big, os.path.join(out, "big-duckdb.parquet"), opts)
        print(line("duckdb", args.n, r))
        a = r["audit"]
        print(f"  audit: {a['n_parents']:,} parents, exposure {a['exposure']:.4f}, pixel overlap {a['pixel_overlap']:.4f}; "
              f"manifest {r['n_rows']:,} rows, sha256 {r['sha256'][:16]}...")
        goal = r["wall_s"] <= 600 and r["peak_rss_gb"] < 4
        print(f"goal (<= 600 s, < 4 GB): {'met' if goal else 'NOT met'}")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
