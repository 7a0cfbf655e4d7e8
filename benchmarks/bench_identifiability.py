"""Benchmark `probes.GroupIdentifiability` against a scikit-learn fold loop on the same folds.

The paper's scale (SIPaKMeD: 424 fields): --crops crops of --dim features in --parents parents
(sizes 2 + Poisson), parent means N(0, --separation^2) per feature, unit noise. Ours: the whole
held-out-sibling evaluation (5 folds drawn inside parents, standardising, L-BFGS fit, scoring,
interval). The anchor: for the same folds, scikit-learn's StandardScaler + LogisticRegression
(C=1, default lbfgs, tol 1e-4, max_iter 100), the objective and stopping rule ours reproduces.
Both accuracies are printed; timings are reported, never asserted.

    python benchmarks/bench_identifiability.py                 # 4,000 x 512, 424 parents
    python benchmarks/bench_identifiability.py --threads 1     # one BLAS thread for both
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

from _machine import numpy_reference_ms  # benchmarks/ is on sys.path when a script runs

try:
    import probes
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    import probes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crops", type=int, default=4000)
    ap.add_argument("--parents", type=int, default=424)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--separation", type=float, default=0.2)
    ap.add_argument("--threads", type=int, default=None, help="BLAS threads for both (default: the library's)")
    args = ap.parse_args()
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{os.cpu_count()} CPUs (load average {load:.1f}); numpy reference workload {numpy_reference_ms():.1f} ms (lower = faster machine)")
    rng = np.random.default_rng(0)
    sizes = 2 + rng.poisson(max(args.crops / args.parents - 2, 0), size=args.parents)
    parents = np.repeat(np.arange(args.parents), sizes)
    X = (rng.normal(size=(args.parents, args.dim))[parents] * args.separation + rng.normal(size=(len(parents), args.dim))).astype(np.float32)
    print(f"{len(parents)} crops x {args.dim} features, {args.parents} parents, 5 folds")
    probes.GroupIdentifiability(folds=2).fit_score(X[:60], np.arange(60) // 6)  # imports, first calls

    limit = threadpool_limits(limits=args.threads, user_api="blas") if args.threads else None
    t = time.perf_counter()
    gi = probes.GroupIdentifiability(seed=0).fit_score(X, parents)
    t_ours = time.perf_counter() - t

    t = time.perf_counter()
    correct = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lbfgs convergence warnings
        for f in range(5):
            tr, te = gi.fold_ != f, gi.fold_ == f
            scaler = StandardScaler().fit(X[tr])
            clf = LogisticRegression().fit(scaler.transform(X[tr]), parents[tr])
            correct += int((clf.predict(scaler.transform(X[te])) == parents[te]).sum())
    t_sk = time.perf_counter() - t
    if limit is not None:
        limit.unregister()

    print(f"  {'':34s} {'s':>7s} {'accuracy':>9s}")
    print(f"  {'GroupIdentifiability (5 folds)':34s} {t_ours:7.2f} {gi.accuracy_:9.4f}   chance {gi.chance_:.4f}, "
          f"95% CI {gi.ci_[0]:.4f}-{gi.ci_[1]:.4f}, L-BFGS iterations {gi.n_iter_.tolist()}")
    print(f"  {'scikit-learn fold loop':34s} {t_sk:7.2f} {correct / gi.n_:9.4f}")
    print(f"  ratio {t_sk / t_ours:.1f}x")


if __name__ == "__main__":
    main()
