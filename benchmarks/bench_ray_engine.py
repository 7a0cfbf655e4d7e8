"""The Ray engine (issue 25): audit and parent split of a generated Parquet dataset on a local
2-worker Ray, against the in-memory engine on a smaller size in the same run.

The datasets are `bench_outofcore`'s (generated once, in chunks, into --data, shared with the
DuckDB benchmark): parents of 50-200 crops with 100 px boxes in 1376 x 1020 fields, 4 classes
mixed within parents, files of about 2M crops. Each measured run (audit, then parent split
with a validation side) is a fresh child process; for Ray that child starts the local Ray
(``threads=2``: two worker CPUs) and shuts it down, so the wall time includes Ray's start.

Memory is sampled every 0.2 s over the child's whole process tree (the driver, Ray's GCS,
raylet and workers, all descendants of the child): the peak of the summed proportional set
size (PSS, from ``/proc/PID/smaps_rollup``: shared pages such as Ray's object store counted
once, split among the processes that map them) and, for comparison, of the summed RSS (which
counts a shared page in every process that maps it). The in-memory engine's peak is its one
process's.

At the reference size both engines run and their figures and manifest hashes are compared.

    python benchmarks/bench_ray_engine.py --n 10000000 --reference-n 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_outofcore import CHILD, generate  # noqa: E402  (the DuckDB benchmark's datasets and its child: one engine's audit + split)

FIGURES = ("sibling_share", "exposure", "diversity_ratio", "pixel_overlap", "overlap_share")


def tree(root: int) -> list[int]:
    """`root` and all its descendants (from /proc/PID/task/*/children)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def memory_of(pids: list[int]) -> tuple[int, int]:
    """Summed (PSS, RSS) of `pids` in bytes (processes that ended meanwhile count 0)."""
    pss = rss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                    elif line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return pss, rss


def run_child(engine: str, path: str, out: str, opts: dict) -> dict:
    """One audit + split in a fresh process: its figures, wall time and peak memory of its tree."""
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_USAGE_STATS_ENABLED="0")
    load0 = open("/proc/loadavg").read().split()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, engine, path, out, json.dumps(opts)], stdout=subprocess.PIPE, env=env)
    peak = {"pss": 0, "rss": 0, "n": 0}

    def sample() -> None:
        while proc.poll() is None:
            pids = tree(proc.pid)
            pss, rss = memory_of(pids)
            peak["pss"], peak["rss"], peak["n"] = max(peak["pss"], pss), max(peak["rss"], rss), max(peak["n"], len(pids))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    sampler.join()
    if status != 0:
        raise SystemExit(f"{engine} on {path} failed (status {status})")
    res = json.loads(stdout.decode().strip().splitlines()[-1])
    res.update({"wall_s": wall, "peak_pss_gb": peak["pss"] / 2**30, "peak_rss_sum_gb": peak["rss"] / 2**30, "processes": peak["n"],
                "driver_maxrss_gb": usage.ru_maxrss / 2**20, "load_before": load0, "load_after": open("/proc/loadavg").read().split()[0]})
    return res


def line(name: str, n: int, r: dict) -> str:
    return (f"{name:<7} {n:>12,} crops  audit {r['audit_s']:7.1f} s  split {r['split_s']:7.1f} s  process {r['wall_s']:7.1f} s  "
            f"peak PSS {r['peak_pss_gb']:5.2f} GB (RSS summed {r['peak_rss_sum_gb']:5.2f} GB, {r['processes']} processes; "
            f"largest single {r['driver_maxrss_gb']:4.2f} GB)  load {r['load_before']} -> {r['load_after']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000_000, help="crops in the large dataset (default 10M)")
    ap.add_argument("--reference-n", type=int, default=1_000_000, help="crops for the same-run comparison with memory (default 1M)")
    ap.add_argument("--data", default="/work/bench-data/outofcore", help="folder the datasets are cached in (bench_outofcore's)")
    ap.add_argument("--threads", type=int, default=2, help="CPUs of the local Ray (default 2)")
    ap.add_argument("--skip-large", action="store_true", help="only the reference size")
    ap.add_argument("--skip-reference", action="store_true", help="only the large size")
    ap.add_argument("--check-ids", action="store_true", help="the audit adds its pass over ids shared across parents (check_ids=True)")
    args = ap.parse_args()
    os.makedirs(args.data, exist_ok=True)
    opts = {"threads": args.threads}
    if args.check_ids:
        opts["check_ids"] = True
    print(f"cores {len(os.sched_getaffinity(0))}, load {open('/proc/loadavg').read().strip()}, ray options {opts}", flush=True)
    out = os.path.join(args.data, "out-ray")
    os.makedirs(out, exist_ok=True)
    if not args.skip_reference:
        ref = generate(args.data, args.reference_n, seed=1)
        mem = run_child("memory", ref, os.path.join(out, "ref-memory"), {})
        print(line("memory", args.reference_n, mem), flush=True)
        ray = run_child("ray", ref, os.path.join(out, "ref-ray"), opts)
        print(line("ray", args.reference_n, ray), flush=True)
        diff = max(abs(mem["audit"][k] - ray["audit"][k]) for k in FIGURES)
        print(f"same hash at {args.reference_n:,}: {mem['sha256'] == ray['sha256']}; largest figure difference {diff:.2e}", flush=True)
    if not args.skip_large:
        t0 = time.perf_counter()
        big = generate(args.data, args.n, seed=0)
        print(f"dataset {big} ready in {time.perf_counter() - t0:.1f} s", flush=True)
        r = run_child("ray", big, os.path.join(out, "big-ray"), opts)
        print(line("ray", args.n, r))
        a = r["audit"]
        print(f"  audit: {a['n_parents']:,} parents, exposure {a['exposure']:.4f}, pixel overlap {a['pixel_overlap']:.4f}; "
              f"manifest {r['n_rows']:,} rows, sha256 {r['sha256'][:16]}...")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
