"""Loading and validating a crop table, against a plain `pd.read_csv` of the same file.

Goal (issue 25): 5,000,000 crops (CSV with id, label, parent and a box) loaded and validated by
`CropTable.from_csv` in < 3 s, at a peak memory <= 1.5x that of `pd.read_csv` of the same file.
Each reader runs in its own child process, so that one run's memory does not count in
another's; the peak is the child's maximum resident set (`ru_maxrss`, imports included: the
anchor imports pandas alone, ours the package too), and the time is taken inside the child,
after its imports. `CropTable.from_parquet` on the same table is timed too.

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
t = time.perf_counter()
if which == "pd.read_csv":
    n = len(pd.read_csv(path))
elif which == "from_csv":
    n = len(CropTable.from_csv(path, id="id", label="label", parent="parent", box="x,y,w,h"))
else:
    n = len(CropTable.from_parquet(path, id="id", label="label", parent="parent", box="x,y,w,h"))
dt = time.perf_counter() - t
print(n, dt, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def run_child(which: str, path: str) -> tuple[int, float, float]:
    """(rows, seconds, peak resident GB) of one reader in a fresh process."""
    out = subprocess.run([sys.executable, "-c", _CHILD, which, path], check=True, capture_output=True, text=True)
    n, dt, kb = out.stdout.split()
    return int(n), float(dt), int(kb) * 1024 / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parents", type=int, default=500_000, help="parents (10 crops each on average)")
    ap.add_argument("--seed", type=int, default=0)
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
        anchor = run_child("pd.read_csv", csv)
        ours = run_child("from_csv", csv)
        pq = run_child("from_parquet", parquet)
    print(f"pd.read_csv (anchor):      {anchor[1]:6.2f} s, peak {anchor[2]:.2f} GB")
    print(f"CropTable.from_csv:        {ours[1]:6.2f} s, peak {ours[2]:.2f} GB  "
          f"(time x{ours[1] / anchor[1]:.1f}, memory x{ours[2] / anchor[2]:.2f} the anchor; goal < 3 s, <= 1.5x)")
    print(f"CropTable.from_parquet:    {pq[1]:6.2f} s, peak {pq[2]:.2f} GB  (memory x{pq[2] / anchor[2]:.2f} the CSV anchor)")


if __name__ == "__main__":
    main()
