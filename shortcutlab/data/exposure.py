"""Closed forms for how much a crop-level split exposes test crops to their siblings.

Main paper, section "Data and acquisition hierarchy". A parent p holds k_p crops; N = sum k_p
crops in P parents. Under a crop-level split every crop goes to test independently with
probability q (the test fraction), so

- a test crop has a training sibling with probability 1 - q^(k_p - 1); averaged over crops,
  ``exposure = sum_p k_p (1 - q^(k_p - 1)) / N``;
- the training set holds parent p with probability 1 - q^(k_p); a parent-level split of equal
  size holds (1 - q) P parents, so ``diversity_ratio = sum_p (1 - q^(k_p)) / ((1 - q) P)``;
- a crop whose box intersects m_i same-parent boxes has a pixel-overlapping training sibling
  with probability 1 - q^(m_i): ``pixel_overlap = (1/N) sum_i (1 - q^(m_i))``;
- ``sibling_share`` is the share of crops whose parent holds at least one other crop (the
  limit of exposure as q -> 0).

All figures are shares in [0, 1] except `diversity_ratio` (>= 1 up to sampling).

Example:
    >>> import numpy as np
    >>> round(exposure(np.array([2, 2]), 0.5), 3)   # each crop's one sibling is in training w.p. 1/2
    0.5
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from shortcutlab.errors import ShortcutlabError, TableError
from shortcutlab.data.overlap import overlap_counts
from shortcutlab.data.table import CropTable


def check_q(q: float) -> float:
    try:
        q = float(q)
    except (TypeError, ValueError):
        raise ShortcutlabError(f"the test fraction must be a number in (0, 1), got {q!r}") from None
    if not 0.0 < q < 1.0:
        raise ShortcutlabError(f"the test fraction must lie strictly between 0 and 1, got {q}")
    return q


def _sizes(table_or_sizes) -> np.ndarray:
    if isinstance(table_or_sizes, CropTable):
        return table_or_sizes.parent_sizes
    k = np.asarray(table_or_sizes)
    if k.ndim != 1 or len(k) == 0:
        raise ShortcutlabError(f"parent sizes must be a non-empty 1-D array, got shape {k.shape}")
    if (k < 1).any() or not np.issubdtype(k.dtype, np.integer):
        raise ShortcutlabError("parent sizes must be positive integers (crops per parent)")
    return k.astype(np.int64)


def sibling_share(table_or_sizes) -> float:
    """Share of crops whose parent holds at least one other crop.

    Args:
        table_or_sizes: a `CropTable` or a (P,) array of crops per parent k_p.
    """
    k = _sizes(table_or_sizes)
    return float(k[k > 1].sum() / k.sum())


def exposure(table_or_sizes, test_fraction: float) -> float:
    """Expected share of test crops with at least one training sibling under a crop-level split.

    ``sum_p k_p (1 - q^(k_p - 1)) / N`` with q the test fraction.
    """
    q = check_q(test_fraction)
    k = _sizes(table_or_sizes).astype(np.float64)
    return float(np.sum(k * (1.0 - q ** (k - 1.0))) / k.sum())


def diversity_ratio(table_or_sizes, test_fraction: float) -> float:
    """Expected distinct training parents of a crop-level split over those of an equal-size
    parent-level split: ``sum_p (1 - q^(k_p)) / ((1 - q) P)``."""
    q = check_q(test_fraction)
    k = _sizes(table_or_sizes).astype(np.float64)
    return float(np.sum(1.0 - q**k) / ((1.0 - q) * len(k)))


def pixel_overlap(table: CropTable, test_fraction: float, counts: np.ndarray | None = None) -> float:
    """Expected share of test crops whose box intersects the box of a training sibling.

    ``(1/N) sum_i (1 - q^(m_i))``, m_i = same-parent crops whose box intersects crop i's.

    Args:
        table: a `CropTable` with geometry.
        test_fraction: q.
        counts: precomputed m_i (from `overlap.overlap_counts`), to avoid recomputing them.

    Raises:
        TableError: the table has no geometry.
    """
    q = check_q(test_fraction)
    if counts is None:
        if not table.has_geometry:
            raise TableError("pixel overlap needs crop geometry: pass --box X,Y,W,H or --center CX,CY --crop-size S")
        counts = overlap_counts(table.n_crops, table.overlap_pairs)
    return pixel_overlap_from_counts(counts, q)


def pixel_overlap_from_counts(counts: np.ndarray, test_fraction: float, n_crops: np.ndarray | None = None) -> float:
    """``(1/N) sum_i (1 - q^(m_i))`` from the overlap counts m_i of all N crops (see
    `overlap.overlap_counts_by_parent` to compute them one partition of parents at a time).

    Args:
        counts: (N,) m_i of every crop; or, with `n_crops`, distinct values of m.
        test_fraction: q.
        n_crops: optional crops holding each value of `counts` (a histogram of m, so an
            out-of-core engine keeps one number per value of m, not one per crop).

    Example:
        >>> pixel_overlap_from_counts(np.array([1, 1, 0, 0]), 0.5)
        0.25
        >>> pixel_overlap_from_counts(np.array([0, 1]), 0.5, n_crops=np.array([2, 2]))
        0.25
    """
    q = check_q(test_fraction)
    terms = 1.0 - q ** np.asarray(counts, dtype=np.float64)
    if n_crops is None:
        return float(np.mean(terms))
    w = np.asarray(n_crops, dtype=np.float64)
    return float(np.sum(terms * w) / np.sum(w))


@dataclass(frozen=True)
class ExposureSummary:
    """Closed-form exposure of a table at one test fraction (shares in [0, 1])."""

    n_crops: int
    n_parents: int
    n_classes: int
    n_groups: int | None
    test_fraction: float
    sibling_share: float
    exposure: float
    diversity_ratio: float
    pixel_overlap: float | None
    overlap_share: float | None
    """Share of crops whose box intersects at least one sibling's (q-independent)."""

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(table: CropTable, test_fraction: float = 0.2) -> ExposureSummary:
    """All closed forms for `table` at test fraction q."""
    q = check_q(test_fraction)
    pix = share = None
    if table.has_geometry:
        m = overlap_counts(table.n_crops, table.overlap_pairs)
        pix = pixel_overlap(table, q, counts=m)
        share = float(np.mean(m > 0))
    return ExposureSummary(
        n_crops=table.n_crops,
        n_parents=table.n_parents,
        n_classes=table.n_classes,
        n_groups=table.n_groups,
        test_fraction=q,
        sibling_share=sibling_share(table),
        exposure=exposure(table, q),
        diversity_ratio=diversity_ratio(table, q),
        pixel_overlap=pix,
        overlap_share=share,
    )


def sibling_exposure(parent_codes: np.ndarray, query: np.ndarray, train: np.ndarray) -> float:
    """Share of `query` crops whose parent has at least one `train` crop.

    Args:
        parent_codes: (N,) integer parent of every crop.
        query: (N,) bool, the evaluation side.
        train: (N,) bool, the training side (disjoint from `query`).
    """
    query = np.asarray(query, dtype=bool)
    if not query.any():
        return float("nan")
    has_train = np.zeros(int(parent_codes.max()) + 1, dtype=bool)
    has_train[parent_codes[np.asarray(train, dtype=bool)]] = True
    return float(has_train[parent_codes[query]].mean())
