"""Benchmark the sweep executors: in process, a 2-process pool and a local 2-CPU Ray.

Runs the same 16 short tasks (each a deterministic numpy computation, about 0.2 s on one
quiet core of the 2-core VM, writing one small file) with `LocalExecutor(workers=1)`, `LocalExecutor(workers=2)`
and `RayExecutor(num_cpus=2)`, checks that the three leave identical files, and prints the
wall times: Ray's start-up (``ray.init``) apart from its run, its run with cold workers (the
first, which starts and imports the worker processes) and with warm ones, and the ratios
Ray/local. BLAS runs on one thread per task so that two tasks fill two cores.

Usage:
    python benchmarks/bench_executors.py [--tasks 16] [--rounds 128] [--repeats 2]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # before numpy
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import hashlib  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

# The checkout this script sits in comes first (not another installed copy).
sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir), os.path.dirname(os.path.abspath(__file__))]
from shortcutlab.io import write_text  # noqa: E402
from shortcutlab.sweep import LocalExecutor, TaskGraph  # noqa: E402
from _machine import numpy_reference_ms  # noqa: E402


def work(out_dir: str, task) -> dict:
    """`rounds` damped matrix iterations from a seeded start; the digest goes to <id>.txt."""
    p = task.params
    rng = np.random.default_rng(p["seed"])
    a = rng.standard_normal((p["n"], p["n"])) / np.sqrt(p["n"])
    x = rng.standard_normal((p["n"], p["n"]))
    for _ in range(p["rounds"]):
        x = np.tanh(a @ x)
    digest = hashlib.sha256(x.tobytes()).hexdigest()
    write_text(os.path.join(out_dir, f"{task.id}.txt"), digest)
    return {"digest": digest[:16]}


def timed_run(executor, tasks, out_dir: str) -> tuple[float, dict]:
    os.makedirs(out_dir, exist_ok=True)
    results: dict = {}
    t = time.perf_counter()
    executor.run(tasks, functools.partial(work, out_dir), lambda task, r: results.__setitem__(task.id, r))
    return time.perf_counter() - t, results


def files(folder: str) -> dict[str, str]:
    return {name: open(os.path.join(folder, name)).read() for name in sorted(os.listdir(folder)) if name.endswith(".txt")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=128, help="matrix iterations per task (128: ~0.2 s on one quiet core here)")
    ap.add_argument("--n", type=int, default=256, help="matrix size")
    ap.add_argument("--repeats", type=int, default=2, help="best of this many runs (Ray: warm runs)")
    args = ap.parse_args()

    from shortcutlab.sweep.executors.ray import RayExecutor

    print(f"machine: numpy reference {numpy_reference_ms():.0f} ms; {os.cpu_count()} CPUs")
    rounds = args.rounds
    g = TaskGraph()
    for i in range(args.tasks):
        g.add("work", {"seed": i, "n": args.n, "rounds": rounds})
    tasks = g.ordered()
    print(f"{len(tasks)} tasks of {rounds} rounds of a {args.n} x {args.n} product; best of {args.repeats} runs")

    def best(executor, name):
        runs = [timed_run(executor, tasks, os.path.join(tmp, f"{name}{i}")) for i in range(args.repeats)]
        return min(r[0] for r in runs), runs[0][1]

    with tempfile.TemporaryDirectory() as tmp:
        t1, r1 = best(LocalExecutor(workers=1), "local1_")
        print(f"  one task in process: {t1 / len(tasks):.2f} s")
        t2, r2 = best(LocalExecutor(workers=2), "local2_")
        t = time.perf_counter()
        with RayExecutor(num_cpus=2) as ray_ex:
            t_start = time.perf_counter() - t
            t_cold, r3 = timed_run(ray_ex, tasks, os.path.join(tmp, "ray"))
            t_warm, r4 = best(ray_ex, "ray_warm")
            t_down = time.perf_counter()
        t_down = time.perf_counter() - t_down
        folders = [os.path.join(tmp, name) for name in sorted(os.listdir(tmp))]
        same = all(files(f) == files(folders[0]) for f in folders) and r1 == r2 == r3 == r4

    print(f"local, in process (workers=1): {t1:6.2f} s")
    print(f"local, pool (workers=2):       {t2:6.2f} s  (includes spawning the 2 processes and their imports)")
    print(f"ray start-up (ray.init):       {t_start:6.2f} s  (shutdown {t_down:.2f} s)")
    print(f"ray run, cold workers:         {t_cold:6.2f} s")
    print(f"ray run, warm workers:         {t_warm:6.2f} s")
    print(f"ratio ray/local(workers=2): {t_cold / t2:.2f} cold, {t_warm / t2:.2f} warm, {(t_start + t_cold) / t2:.2f} with start-up")
    print(f"ratio ray/local(workers=1): {t_cold / t1:.2f} cold, {t_warm / t1:.2f} warm, {(t_start + t_cold) / t1:.2f} with start-up")
    print(f"identical outputs and results: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
