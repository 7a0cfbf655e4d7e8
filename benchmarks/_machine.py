"""Machine-speed reference shared by the benchmark scripts.

The shared VMs vary in speed by up to 2x from minute to minute; every script prints the time
of this fixed workload so that runs on different machines or minutes can be compared.
"""

from __future__ import annotations

import time

import numpy as np


def numpy_reference_ms() -> float:
    """Best time of a fixed float32 workload (exp and multiply over 10 M values), ms."""
    x = np.linspace(0.0, 1.0, 10_000_000, dtype=np.float32)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        y = np.exp(x)
        y *= x
        best = min(best, time.perf_counter() - t)
    return 1e3 * best
