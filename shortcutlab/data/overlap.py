"""Pixel overlap of crop boxes within a parent, by sort-and-sweep.

Two crops overlap when they share a parent and their boxes intersect with positive area
(boxes that only touch along an edge share no pixel). Crops are sorted by (parent, left edge);
for crop i only the crops that start before i's right edge in the same parent can intersect
it, and `numpy.searchsorted` finds that run for every crop at once. The cost is the number of
x-overlapping candidate pairs, never k^2 per parent unless boxes really pile up.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from shortcutlab.errors import TableError

_MAX_PAIRS_PER_CHUNK = 4_000_000


def overlapping_pairs(
    parent_codes: np.ndarray, boxes: np.ndarray, chunk_pairs: int = _MAX_PAIRS_PER_CHUNK
) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j), i != j, of same-parent crops whose boxes intersect.

    Each unordered pair appears once, in no particular orientation. Candidates are
    materialised in chunks of at most `chunk_pairs`, so memory follows the number of real
    overlaps.

    Args:
        parent_codes: (N,) integer parent of every crop.
        boxes: (N, 4) float boxes x, y, w, h (top-left corner and size, parent pixels), w, h > 0.
        chunk_pairs: bound on the candidate pairs materialised at once (memory).

    Returns:
        (i, j): two int64 arrays of equal length.
    """
    parts = list(_pair_chunks(parent_codes, boxes, chunk_pairs))
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _pair_chunks(parent_codes, boxes, chunk_pairs) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    parent_codes = np.asarray(parent_codes)
    boxes = np.asarray(boxes, dtype=np.float64)
    n = len(parent_codes)
    if boxes.shape != (n, 4):
        raise TableError(f"boxes must have shape (N, 4) = ({n}, 4), got {boxes.shape}")
    if n == 0:
        return
    x0, y0 = boxes[:, 0], boxes[:, 1]
    x1, y1 = x0 + boxes[:, 2], y0 + boxes[:, 3]

    order = np.lexsort((x0, parent_codes))
    p_s = parent_codes[order].astype(np.float64)
    # Offsetting every parent by more than the widest x range turns (parent, x) into one
    # sortable key, so one searchsorted finds, for each crop, the end of its candidate run.
    xmin = float(x0.min())
    span = float(x1.max() - xmin) + 1.0
    start_key = (x0[order] - xmin) + p_s * span
    end_key = (x1[order] - xmin) + p_s * span
    end = np.searchsorted(start_key, end_key, side="left")
    counts = end - np.arange(n) - 1
    counts = np.maximum(counts, 0)

    y0_s, y1_s = y0[order], y1[order]
    cum = np.cumsum(counts)
    lo = 0
    while lo < n:
        # Take crops lo..hi-1 so that their candidate pairs fit in one chunk.
        base = cum[lo - 1] if lo > 0 else 0
        hi = int(np.searchsorted(cum, base + chunk_pairs, side="right"))
        hi = max(hi, lo + 1)
        hi = min(hi, n)
        c = counts[lo:hi]
        total = int(c.sum())
        if total:
            ii = np.repeat(np.arange(lo, hi), c)
            first = np.repeat(np.cumsum(c) - c, c)
            jj = ii + 1 + (np.arange(total) - first)
            hit = np.maximum(y0_s[ii], y0_s[jj]) < np.minimum(y1_s[ii], y1_s[jj])
            if hit.any():
                yield order[ii[hit]], order[jj[hit]]
        lo = hi


def overlap_counts(n: int, pairs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """m_i: number of same-parent crops whose box intersects crop i's box.

    Args:
        n: number of crops N.
        pairs: (i, j) from `overlapping_pairs`.

    Returns:
        (N,) int64 counts.
    """
    i, j = pairs
    return np.bincount(i, minlength=n) + np.bincount(j, minlength=n)


def overlap_counts_by_parent(parent_codes: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """m_i for a batch of whole parents (one partition of a table too large to hold): the
    number of same-parent crops whose box intersects crop i's box.

    A parent must lie wholly in the batch, since m_i counts only the siblings present.

    Args:
        parent_codes: (n,) integer parent of each crop in the batch (any labels, any order).
        boxes: (n, 4) float boxes x, y, w, h.

    Returns:
        (n,) int64 counts, in the batch's row order.

    Example:
        >>> overlap_counts_by_parent(np.array([0, 0, 1]), np.array([[0, 0, 2, 2], [1, 1, 2, 2], [1, 1, 2, 2]])).tolist()
        [1, 1, 0]
    """
    return overlap_counts(len(parent_codes), overlapping_pairs(parent_codes, boxes))


def has_overlapping_partner(
    pairs: tuple[np.ndarray, np.ndarray], query: np.ndarray, partner: np.ndarray
) -> np.ndarray:
    """For crops flagged by `query`, whether some crop flagged by `partner` overlaps them.

    Args:
        pairs: (i, j) from `overlapping_pairs`.
        query: (N,) bool, the crops asked about (for example the test side).
        partner: (N,) bool, the crops that count as partners (for example the training side).

    Returns:
        (N,) bool, True where a query crop overlaps at least one partner crop.
    """
    query = np.asarray(query, dtype=bool)
    partner = np.asarray(partner, dtype=bool)
    i, j = pairs
    out = np.zeros(len(query), dtype=bool)
    a = query[i] & partner[j]
    out[i[a]] = True
    b = query[j] & partner[i]
    out[j[b]] = True
    return out
