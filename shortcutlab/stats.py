"""Statistics on tidy results: pure functions of numbers and frames, no file or model access.

This release holds the binomial interval every accuracy row carries; the cluster bootstrap,
Holm corrections and slopes of the sweeps join it.
"""

from __future__ import annotations

import math


def wilson_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k / n.

    Args:
        k: successes (0 <= k <= n).
        n: trials; n == 0 gives (nan, nan).
        level: two-sided coverage.

    Returns:
        (low, high) in [0, 1].
    """
    from scipy.stats import norm

    if n <= 0:
        return (math.nan, math.nan)
    if not 0 <= k <= n:
        raise ValueError(f"successes k must lie in [0, n={n}]; got {k}")
    z = float(norm.ppf(0.5 + level / 2))
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))
