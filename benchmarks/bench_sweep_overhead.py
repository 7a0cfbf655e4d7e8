"""Sweep overhead per task: `run_sweep` against a plain Python loop over the same tasks.

Both run the same task functions on the same small sweep (tiny benchmark, one-epoch models,
one intervention, no diagnostics), in this process. The plain loop calls each task function
straight into its folder and writes the result.json the next task reads; `run_sweep` adds
planning, the done checks, the lock, sweep.json, building each folder under a temporary name,
the progress bar and gathering the tidy tables. Repeated `--repeats` times, alternating, and
the fastest of each is kept (the cores are shared).

    python benchmarks/bench_sweep_overhead.py [--seeds 3] [--repeats 2]

Goal (issue 10): under 5% overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shortcutlab.sweep.config import validate  # noqa: E402
from shortcutlab.sweep.runner import run_sweep  # noqa: E402
from shortcutlab.sweep.folder import TaskFolder, task_dir  # noqa: E402
from shortcutlab.sweep.plan import build_plan  # noqa: E402
from shortcutlab.sweep.tasks import RUNNERS  # noqa: E402


def config(n_seeds: int) -> dict:
    return {
        "data": {"synthetic": {"mechanisms": ["color", "none"], "fields_per_class": 10, "crop_size": 16, "field_size": 64}},
        "split": {"protocol": "factorial"},
        "seeds": list(range(n_seeds)),
        "models": [{"arch": "test_resnet", "epochs": 1, "lr": 0.001, "batch_size": 32}],
        "cells": ["leak-high", "clean-high"],
        "interventions": {"names": ["greyscale"]},
        "diagnostics": "none",
    }


def plain_loop(cfg, root: str) -> None:
    import torch

    torch.set_num_threads(cfg.threads)
    for task in build_plan(cfg).graph.ordered():
        folder = task_dir(root, task.kind, task.id)
        os.makedirs(folder)
        result = RUNNERS[task.kind](task, root, folder, folder)
        with open(TaskFolder(folder).result, "w") as f:
            json.dump({"result": result}, f)


def timed_sweep(cfg, root: str) -> tuple[float, float]:
    """run_sweep's wall time, and the part of it spent inside the task functions."""
    from shortcutlab.sweep import tasks

    inside = [0.0]
    real = dict(tasks.RUNNERS)

    def timed(fn):
        def run(*a):
            t = time.perf_counter()
            try:
                return fn(*a)
            finally:
                inside[0] += time.perf_counter() - t

        return run

    tasks.RUNNERS.update({k: timed(f) for k, f in real.items()})
    try:
        t0 = time.perf_counter()
        run_sweep(cfg, root, progress=True)
        return time.perf_counter() - t0, inside[0]
    finally:
        tasks.RUNNERS.update(real)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    cfg = validate(config(args.seeds))
    n = len(build_plan(cfg).graph)
    plain_loop(cfg, tempfile.mkdtemp())  # warm-up: imports, first-call costs
    import scipy.stats  # noqa: F401  (a one-time import of the Wilson interval in gathering, not a per-task cost)
    loop_s, sweep_s, own_s = [], [], []
    for _ in range(args.repeats):
        for which, times in (("loop", loop_s), ("sweep", sweep_s)):
            root = tempfile.mkdtemp()
            t0 = time.perf_counter()
            if which == "loop":
                plain_loop(cfg, root)
                times.append(time.perf_counter() - t0)
            else:
                total, inside = timed_sweep(cfg, root)
                times.append(total)
                own_s.append((total - inside, inside))
            shutil.rmtree(root, ignore_errors=True)
    a, b = min(loop_s), min(sweep_s)
    print(f"{n} tasks; plain loop {a:.2f} s ({1000 * a / n:.0f} ms/task), run_sweep {b:.2f} s ({1000 * b / n:.0f} ms/task)")
    print(f"overhead {1000 * (b - a) / n:+.1f} ms per task, {100 * (b - a) / a:+.1f}% (goal < 5%); "
          f"all runs: loop {[round(t, 2) for t in loop_s]}, sweep {[round(t, 2) for t in sweep_s]}")
    own, inside = min(own_s)
    print(f"within run_sweep (immune to the load changing between runs): {own:.3f} s outside the task functions, "
          f"{1000 * own / n:.1f} ms per task, {100 * own / inside:.1f}% of the {inside:.2f} s inside them")


if __name__ == "__main__":
    main()
