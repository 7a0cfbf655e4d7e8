"""Multiple testing: Holm's step-down adjustment, on p-values and within the families of a table."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from .errors import StatsError
from .predictions import need_columns

__all__ = ["add_holm", "holm"]


def holm(pvalues, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down adjustment (Holm 1979), valid under any dependence between the tests.

    With the m finite p-values sorted p_(1) <= ... <= p_(m), the adjusted value of p_(i) is
    max_{j <= i} min(1, (m - j + 1) p_(j)); a hypothesis is rejected when its adjusted p is
    <= alpha. NaN p-values (no test) stay NaN, are never rejected and do not count in m.

    Args:
        pvalues: sequence of p-values in [0, 1] (NaN allowed).
        alpha: family-wise error rate.

    Returns:
        (adjusted, reject): float array and bool array, in the input order.

    Example:
        >>> adj, rej = holm([0.01, 0.04, 0.03, 0.005])
        >>> adj.round(3).tolist(), rej.tolist()
        ([0.03, 0.06, 0.06, 0.02], [True, False, False, True])
    """
    p = np.asarray(pvalues, dtype=np.float64).ravel()
    ok = np.isfinite(p)
    if ((p[ok] < 0) | (p[ok] > 1)).any():
        bad = p[ok][(p[ok] < 0) | (p[ok] > 1)][0]
        raise StatsError(f"holm: p-value {float(bad)!r} lies outside [0, 1]")
    adj = np.full_like(p, np.nan)
    q = p[ok]
    m = len(q)
    if m:
        order = np.argsort(q, kind="mergesort")
        stepped = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * q[order]))
        out = np.empty(m)
        out[order] = stepped
        adj[ok] = out
    reject = np.zeros(len(p), dtype=bool)
    reject[ok] = adj[ok] <= alpha
    return adj, reject


def add_holm(frame: pd.DataFrame, *, family: str | Sequence[str] = "family", p: str = "p_value",
             alpha: float = 0.05) -> pd.DataFrame:
    """Copy of `frame` with ``p_holm`` and ``reject`` (Holm within each family).

    Args:
        frame: tidy rows with a p-value column.
        family: column (or columns) naming the family; rows whose family is '' or NaN, or
            whose p-value is NaN, are in no family: p_holm NaN, reject False.
        p: the p-value column.
        alpha: family-wise error rate.
    """
    fams = [family] if isinstance(family, str) else list(family)
    need_columns(frame, fams + [p], "holm frame")
    out = frame.copy()
    out["p_holm"] = np.nan
    out["reject"] = False
    key = out[fams].astype(str).agg("\x1f".join, axis=1) if len(out) else pd.Series([], dtype=str)
    tested = ~out[fams].isna().any(axis=1) & (out[fams].astype(str) != "").all(axis=1)
    for _, idx in out[tested].groupby(key[tested]).groups.items():
        adj, rej = holm(out.loc[idx, p].to_numpy(dtype=float), alpha)
        out.loc[idx, "p_holm"] = adj
        out.loc[idx, "reject"] = rej
    out["reject"] = out["reject"].astype(bool)
    return out
