"""Loading and validating a crop table, against a plain `pd.read_csv` of the same file.

Goal (issue 25): 5,000,000 crops (CSV with id, label, parent and a box) loaded and validated by
`CropTable.from_csv` in < 3 s, at a peak memory <= 1.5x that of `pd.read_csv` of the same file.
Each reader runs in its own child process, so that one run's memory does not count in
another's; the peak is the child's maximum resident set (`ru_maxrss`, imports included: the
anchor imports pandas alone, ours the package too), and the time (wall, and CPU of all the
child's threads, which says more when the cores are shared) is taken inside the child, after
its imports. `CropTable.from_parquet` on the same table is timed too. The readers run
in turn, `--repeat` rounds (default 3): the best time of each and the largest peak are printed,
with the load average before and after (the machine is shared).

    python benchmarks/bench_table_load.py                 # 5,000,000 crops
    python benchmarks/bench_table_load.py --parents 10000 # ~100,000 crops, a few seconds
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from _machine import numpy_reference_ms

_CHILD = r"""
import resource, sys, time
import pandas as pd
which, path = sys.argv[1], sys.argv[2]
if which != "pd.read_csv":  # the anchor imports pandas alone
    from shortcutlab.data.table import CropTable
t, c = time.perf_counter(), time.process_time()
if which == "pd.read_csv":
    n = len(pd.read_csv(path))
elif which == "from_csv":
    n = len(CropTable.from_csv(path, id="id", label="label", parent="parent", box="x,y,w,h"))
else:
    n = len(CropTable.from_parquet(path, id="id", label="label", parent="parent", box="x,y,w,h"))
dt, cpu = time.perf_counter() - t, time.process_time() - c
print(n, dt, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def run_child(which: str, path: str) -> tuple[int, float, float, float]:
    """(rows, seconds, CPU seconds of all its threads, peak resident GB) of one reader in a
    fresh process."""
    out = subprocess.run([sys.executable, "-c", _CHILD, which, path], check=True, capture_output=True, text=True)
    n, dt, cpu, kb = out.stdout.split()
    return int(n), float(dt), float(cpu), int(kb) * 1024 / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parents", type=int, default=500_000, help="parents (10 crops each on average)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of the three readers, in turn")
    args = ap.parse_args()

    from shortcutlab.data.random_tables import random_table

    print(f"machine reference: {numpy_reference_ms():.1f} ms (numpy exp over 10 M float32)")
    with tempfile.TemporaryDirectory() as tmp:
        df = random_table(args.parents, 10.0, n_classes=5, mixed=True, seed=args.seed)
        csv, parquet = os.path.join(tmp, "table.csv"), os.path.join(tmp, "table.parquet")
        df.to_csv(csv, index=False)
        df.to_parquet(parquet, index=False)
        n_rows = len(df)
        del df
        print(f"table: {n_rows:,} crops in {args.parents:,} parents; CSV {os.path.getsize(csv) / 1e6:.0f} MB")
        print(f"load average before: {_load()}")
        runs: dict[str, list[tuple[int, float, float, float]]] = {"pd.read_csv": [], "from_csv": [], "from_parquet": []}
        for _ in range(args.repeat):
            for which in runs:
                runs[which].append(run_child(which, parquet if which == "from_parquet" else csv))
        print(f"load average after:  {_load()}")
    assert all(x[0] == n_rows for r in runs.values() for x in r)
    (t_a, c_a, m_a), (t_c, c_c, m_c), (t_p, c_p, m_p) = (
        (min(x[1] for x in r), min(x[2] for x in r), max(x[3] for x in r)) for r in runs.values())
    # CPU seconds say what a reader costs when the cores are shared; wall seconds what it takes.
    print(f"best of {args.repeat} (wall, CPU of all threads), largest peak:")
    print(f"pd.read_csv (anchor):      {t_a:6.2f} s, cpu {c_a:5.2f} s, peak {m_a:.2f} GB")
    print(f"CropTable.from_csv:        {t_c:6.2f} s, cpu {c_c:5.2f} s, peak {m_c:.2f} GB  "
          f"(time x{t_c / t_a:.1f}, cpu x{c_c / c_a:.1f}, memory x{m_c / m_a:.2f} the anchor; goal < 3 s, <= 1.5x)")
    print(f"CropTable.from_parquet:    {t_p:6.2f} s, cpu {c_p:5.2f} s, peak {m_p:.2f} GB  (memory x{m_p / m_a:.2f} the CSV anchor)")


def _load() -> str:
    """The 1, 5 and 15 minute load averages (runnable processes on this machine)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
