"""Intervals of one accuracy: Wilson's score interval, the chance level and a one-sided test
against it, and a cluster (parent) bootstrap interval for crops that come in clusters; and of
the difference of two independent accuracies: Newcombe's hybrid score interval and its
parent-cluster bootstrap twin."""

from __future__ import annotations

import math

__all__ = ["against_chance", "chance_level", "cluster_bootstrap_difference", "cluster_bootstrap_interval", "newcombe_interval",
           "wilson_interval"]


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


def newcombe_interval(k1: int, n1: int, k2: int, n2: int, level: float = 0.95) -> tuple[float, float]:
    """Newcombe's hybrid score interval (his method 10) of the difference k1/n1 - k2/n2 of two
    independent binomial proportions, from the two Wilson intervals (l1, u1), (l2, u2):
    ``d - sqrt((p1 - l1)^2 + (u2 - p2)^2)`` to ``d + sqrt((u1 - p1)^2 + (p2 - l2)^2)``.

    It is statsmodels' ``confint_proportions_2indep(..., method="newcomb")``. It counts every
    trial as independent; for crops in parents see `cluster_bootstrap_difference`.

    Args:
        k1, n1: successes and trials of the first proportion.
        k2, n2: of the second.
        level: two-sided coverage.

    Returns:
        (low, high) in [-1, 1]; (nan, nan) when either n is 0.

    Example:
        >>> lo, hi = newcombe_interval(240, 300, 135, 300)   # 0.80 - 0.45
        >>> round(lo, 4), round(hi, 4)
        (0.2752, 0.4191)
    """
    if n1 <= 0 or n2 <= 0:
        return (math.nan, math.nan)
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1, level)
    l2, u2 = wilson_interval(k2, n2, level)
    d = p1 - p2
    return (d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2))


def chance_level(test_labels, n_classes: int) -> float:
    """The chance level a retrained diagnostic is compared with: the largest class share of
    the test labels (what always predicting one class scores).

    On a balanced test side this is 1 / K; it is never below 1 / K, so a model that learned
    nothing but the majority class is never called "above chance".

    Args:
        test_labels: (n,) integer class codes of the scored crops.
        n_classes: K, the number of classes the model predicts.

    Returns:
        The share in [1 / K, 1]; NaN without test labels.
    """
    import numpy as np

    y = np.asarray(test_labels, dtype=np.int64)
    if len(y) == 0:
        return math.nan
    return float(max(np.bincount(y, minlength=n_classes).max() / len(y), 1.0 / n_classes))


def against_chance(k: int, n: int, chance: float, level: float = 0.95) -> dict:
    """An accuracy k / n against a chance level: Wilson interval and a one-sided exact test.

    Returns:
        ``accuracy``, ``k``, ``n``, ``chance``, ``ci_low``, ``ci_high`` (Wilson, `level`),
        ``above_chance`` (the interval lies above chance), ``p_value`` (exact binomial test of
        accuracy > chance, scipy). Both treat crops as independent trials; siblings are not, so
        they are optimistic.
    """
    from scipy.stats import binomtest

    lo, hi = wilson_interval(k, n, level)
    p = float(binomtest(int(k), int(n), min(max(chance, 0.0), 1.0), alternative="greater").pvalue) if n > 0 else math.nan
    return {
        "accuracy": k / n if n else math.nan,
        "k": int(k),
        "n": int(n),
        "chance": chance,
        "ci_low": lo,
        "ci_high": hi,
        "above_chance": bool(n > 0 and lo > chance),
        "p_value": p,
    }


def _cluster_draws(correct, clusters, n_boot: int, rng):
    """(n_boot,) accuracies over clusters resampled with replacement; None without crops."""
    import numpy as np
    import pandas as pd

    c = np.asarray(correct, dtype=np.float64)
    if len(c) == 0:
        return None
    codes = pd.factorize(pd.Series(np.asarray(clusters, dtype=object)))[0]
    k = np.bincount(codes, weights=c)
    n = np.bincount(codes).astype(np.float64)
    m = len(n)
    w = rng.multinomial(m, np.full(m, 1.0 / m), size=n_boot).astype(np.float64)
    return (w @ k) / (w @ n)


def cluster_bootstrap_interval(correct, clusters, level: float = 0.95, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of an accuracy when trials come in clusters (crops in parents).

    Clusters are resampled with replacement (B = `n_boot` draws, seeded) and the accuracy
    recomputed as correct / crops over the drawn clusters. Siblings of one parent tend to be
    right or wrong together (a model that recognises the parent gives them one answer), so the
    effective sample size is nearer the number of parents than of crops; the Wilson interval,
    which counts crops, is then too narrow.

    Args:
        correct: (n,) bool or 0/1, one per scored crop.
        clusters: (n,) cluster (parent) labels of the crops.
        level: two-sided coverage.
        n_boot: bootstrap draws.
        seed: numpy seed of the draws.

    Returns:
        (low, high); (nan, nan) without crops; a single cluster gives its accuracy twice.
    """
    import numpy as np

    acc = _cluster_draws(correct, clusters, n_boot, np.random.default_rng(seed))
    if acc is None:
        return (math.nan, math.nan)
    a = (1 - level) / 2
    return (float(np.quantile(acc, a)), float(np.quantile(acc, 1 - a)))


def cluster_bootstrap_difference(correct1, clusters1, correct2, clusters2, level: float = 0.95, n_boot: int = 2000,
                                 seed: int = 0) -> tuple[float, float]:
    """Percentile interval of accuracy 1 minus accuracy 2 of two independent sets of crops in
    clusters (two test sides, each in its own parents): each side's clusters are resampled as
    in `cluster_bootstrap_interval`, independently, and the accuracies subtracted draw by draw.

    Args:
        correct1, clusters1: (n1,) correctness and cluster labels of the first side's crops.
        correct2, clusters2: (n2,) of the second side's.
        level, n_boot, seed: as in `cluster_bootstrap_interval` (one generator for both sides).

    Returns:
        (low, high); (nan, nan) when either side has no crops.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    a1 = _cluster_draws(correct1, clusters1, n_boot, rng)
    a2 = _cluster_draws(correct2, clusters2, n_boot, rng)
    if a1 is None or a2 is None:
        return (math.nan, math.nan)
    d = a1 - a2
    a = (1 - level) / 2
    return (float(np.quantile(d, a)), float(np.quantile(d, 1 - a)))
