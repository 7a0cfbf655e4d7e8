"""Parent deduplication (protocol P3): merge acquisition parents linked by near-duplicate crops.

A crop saved twice, or cut twice from overlapping fields, ties its two parents together: a
parent-disjoint split that puts them on opposite sides leaks the crop. This module links crops
whose 64-bit perceptual hashes lie within a Hamming distance ``t`` and merges their parents
transitively, so that a later split can treat each merged parent as one unit.

Linking never compares all pairs. `near_duplicate_pairs` uses multi-index hashing: the 64 bits
are cut into ``t + 1`` disjoint chunks, and by the pigeonhole principle two hashes within
distance ``t`` agree exactly on at least one chunk. Bucketing the hashes by each chunk value
(one numpy sort per chunk) yields a small candidate set that is then verified. 50,000 hashes
link in well under a second at ``t = 4``; `all_pairs_near_duplicates` is the quadratic
reference it is tested against.

Example:
    >>> import numpy as np
    >>> hashes = np.array([0b1011, 0b1010, 0xFFFF_0000, 0b1000], dtype=np.uint64)
    >>> near_duplicate_pairs(hashes, max_distance=1)
    (array([0, 1]), array([1, 3]))
    >>> link_parents(np.array([7, 8, 9, 5]), hashes, max_distance=1).merged_codes
    array([0, 0, 1, 0])
"""

from __future__ import annotations

import operator
import os
import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from shortcutlab.errors import ShortcutlabError, TableError

__all__ = [
    "DedupResult",
    "all_pairs_between",
    "all_pairs_near_duplicates",
    "hamming_distance",
    "hashes_for_ids",
    "hashes_from_hex",
    "link_parents",
    "link_parents_dihedral",
    "merge_linked_parents",
    "near_duplicate_pairs",
    "near_duplicates_between",
    "perceptual_hashes",
]

_BITS = 64
_MAX_DISTANCE = 32
# Candidate pairs handled at once. A batch costs about 100 bytes per pair of temporaries, so
# 2**20 pairs keep the working set near 100 MB however large a bucket grows.
_BATCH_PAIRS = 1 << 20
# Checking one multi-index candidate (gathers, popcount, filters) costs about this many direct
# all-pairs comparisons (blocked broadcasting): 4-6 measured with numpy 2.4 on x86-64.
_CANDIDATE_COST = 4
_HEX = re.compile(r"[0-9a-fA-F]{16}")


# ---------------------------------------------------------------------------- hashing images
def perceptual_hashes(paths: Sequence[str | os.PathLike], hash_size: int = 8) -> np.ndarray:
    """DCT perceptual hash (``imagehash.phash``) of each image file, packed into 64 bits.

    Bit ``k`` of the flattened ``hash_size x hash_size`` boolean hash becomes bit ``63 - k`` of
    the integer, so ``int(str(imagehash.phash(img)), 16)`` equals the packed value and
    `hashes_from_hex` reads hashes written by imagehash back to the same numbers.

    Args:
        paths: N image file paths; any format PIL opens.
        hash_size: side of the hash grid. Only 8 (64 bits) is supported.

    Returns:
        (N,) uint64 hashes.

    Raises:
        ShortcutlabError: `hash_size` is not 8.
        TableError: a file is missing or is not an image PIL can read, naming the path.
    """
    import imagehash
    from PIL import Image, UnidentifiedImageError

    if isinstance(hash_size, bool) or hash_size != 8:
        raise ShortcutlabError(
            f"hash_size must be 8 (an 8x8 DCT hash packs into 64 bits); got {hash_size!r} instead"
        )
    bits = np.zeros((len(paths), _BITS), dtype=bool)
    for row, path in enumerate(paths):
        path = os.fspath(path)
        try:
            with Image.open(path) as img:
                bits[row] = imagehash.phash(img, hash_size=hash_size).hash.ravel()
        except FileNotFoundError:
            raise TableError(f"image file {path!r} (row {row}) does not exist") from None
        except IsADirectoryError:
            raise TableError(f"image file {path!r} (row {row}) is a folder, expected a file") from None
        except (UnidentifiedImageError, OSError) as err:
            raise TableError(f"image file {path!r} (row {row}) cannot be read as an image: {err}") from None
    # packbits is big-endian within each byte and '>u8' reads the 8 bytes big-endian, which is
    # exactly imagehash's hex order (first grid cell = most significant bit).
    return np.packbits(bits, axis=1).view(">u8").ravel().astype(np.uint64)


def hashes_from_hex(values: Sequence[str], ids: Sequence[str] | None = None) -> np.ndarray:
    """Parse 16-hex-digit strings, as written by ``str(imagehash.ImageHash)``, into uint64.

    Args:
        values: N strings of exactly 16 hexadecimal digits (either case; surrounding
            whitespace is ignored).
        ids: optional N crop ids aligned with `values`, so that an error names the crop
            rather than a position.

    Returns:
        (N,) uint64 hashes.

    Raises:
        TableError: naming the first crop id (or position) whose value is not 16 hex digits.

    Example:
        >>> hashes_from_hex(["ffffffffffffffff", "00000000000000a1"])
        array([18446744073709551615,                  161], dtype=uint64)
    """
    if isinstance(values, (str, bytes)):
        raise TableError(f"expected a sequence of hex strings, got a single string {values!r}")
    values = list(values)
    if ids is not None and len(ids) != len(values):
        raise TableError(f"ids must have one entry per hash: expected {len(values)}, got {len(ids)}")
    parsed = []
    for pos, value in enumerate(values):
        text = value.strip() if isinstance(value, str) else None
        if text is None or not _HEX.fullmatch(text):
            where = f"of crop id {str(ids[pos])!r}" if ids is not None else f"at position {pos}"
            raise TableError(
                f"hash {where} must be 16 hexadecimal digits (a 64-bit imagehash); got {value!r}"
            )
        parsed.append(int(text, 16))
    return np.array(parsed, dtype=np.uint64)


def hashes_for_ids(values, ids: Sequence[str], what: str = "hashes") -> np.ndarray:
    """Hashes given one per crop (hex strings or integers, mixed allowed) as uint64.

    Integers must lie in [0, 2**64); int64 values are read bit for bit (as `_as_uint64`).

    Args:
        values: N hashes aligned with `ids`: 16-hex-digit strings, non-negative integers
            below 2**64, or an int64/uint64 array.
        ids: N crop ids, named in errors.
        what: what the values are, for messages.

    Returns:
        (N,) uint64.

    Raises:
        TableError: naming the crop id and the bad value.
    """
    arr = np.asarray(values) if not isinstance(values, list) else np.array(values, dtype=object)
    if arr.dtype.kind in "iu":
        return _as_uint64(arr, what)
    out = np.empty(len(arr), dtype=np.uint64)
    for pos, value in enumerate(arr.tolist()):
        if isinstance(value, str):
            out[pos] = hashes_from_hex([value], ids=[ids[pos]])[0]
            continue
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        if ok and -(2**63) <= int(value) < 0:
            out[pos] = np.array([int(value)], dtype=np.int64).view(np.uint64)[0]
        elif ok and 0 <= int(value) < 2**64:
            out[pos] = np.uint64(int(value))
        else:
            raise TableError(
                f"{what}: the hash of crop id {str(ids[pos])!r} must be 16 hexadecimal digits or an "
                f"integer in [0, 2**64); got {value!r}"
            )
    return out


# ---------------------------------------------------------------------------- distances
def _popcount_lut(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64 via a 256-entry byte table (numpy < 2.0 has no bitwise_count)."""
    x = np.asarray(x, dtype=np.uint64)
    flat = np.ascontiguousarray(x).reshape(-1)
    counts = _BYTE_POPCOUNT[flat.view(np.uint8).reshape(-1, 8)].sum(axis=1, dtype=np.uint8)
    return counts.reshape(x.shape)


_BYTE_POPCOUNT = np.array([bin(v).count("1") for v in range(256)], dtype=np.uint8)
_popcount = np.bitwise_count if hasattr(np, "bitwise_count") else _popcount_lut


def _as_uint64(values, what: str) -> np.ndarray:
    """Hashes as a uint64 array of any shape; int64 input is reinterpreted bit for bit."""
    arr = np.asarray(values)
    if arr.dtype == object:
        try:
            arr = np.array(arr.tolist(), dtype=np.uint64)
        except (OverflowError, TypeError, ValueError):
            raise TableError(
                f"{what} must be integers in [0, 2**64); got values such as {arr.ravel()[:3].tolist()!r}"
            ) from None
    if arr.dtype.kind == "u":
        return arr.astype(np.uint64, copy=False)
    if arr.dtype.kind == "i":
        # Columns that cannot hold uint64 (pandas, parquet, SQL) store hashes as int64 with the
        # same bits; reading them back must give the same hash, not an error.
        return arr.astype(np.int64, copy=False).view(np.uint64)
    if arr.size == 0:
        return arr.astype(np.uint64)
    hint = "; parse hex strings with hashes_from_hex" if arr.dtype.kind in "SUO" else ""
    raise TableError(f"{what} must be unsigned 64-bit integers; got dtype {arr.dtype}{hint}")


def _as_hashes(hashes) -> np.ndarray:
    arr = _as_uint64(hashes, "hashes")
    if arr.ndim != 1:
        raise TableError(f"hashes must be a 1-D array of shape (N,); got shape {arr.shape}")
    return arr


def hamming_distance(a, b) -> np.ndarray:
    """Number of differing bits between 64-bit hashes, elementwise with broadcasting.

    Args:
        a, b: uint64 arrays (or int64 holding the same bits) of broadcastable shapes.

    Returns:
        int64 array of the broadcast shape, values in 0..64.

    Example:
        >>> hamming_distance(np.uint64(0b1011), np.array([0, 0b1010], dtype=np.uint64))
        array([3, 1])
    """
    x = np.bitwise_xor(_as_uint64(a, "a"), _as_uint64(b, "b"))
    return _popcount(x).astype(np.int64)


def check_distance(max_distance) -> int:
    try:
        if isinstance(max_distance, bool):
            raise TypeError
        t = operator.index(max_distance)
    except TypeError:
        raise ShortcutlabError(
            f"max_distance must be an integer number of bits; got {max_distance!r} instead"
        ) from None
    if not 0 <= t <= _MAX_DISTANCE:
        raise ShortcutlabError(
            f"max_distance must be between 0 and {_MAX_DISTANCE} bits (at 32 half of a 64-bit hash "
            f"differs, which is no longer a near duplicate); got {t} instead"
        )
    return t


# ---------------------------------------------------------------------------- pair search
def _chunks(max_distance: int) -> list[tuple[int, np.uint64]]:
    """(shift, mask) of the ``max_distance + 1`` disjoint bit chunks, sizes differing by <= 1."""
    m = max_distance + 1
    sizes = [_BITS // m + (1 if c < _BITS % m else 0) for c in range(m)]
    out, top = [], _BITS
    for size in sizes:
        # Chunk 0 is the most significant bits: sorted unique hashes are then already sorted by
        # their first key, which makes the first argsort nearly free.
        top -= size
        out.append((top, np.uint64((1 << size) - 1)))
    return out


def _pairs_in_runs(sorted_keys: np.ndarray, batch_pairs: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """All position pairs (p, q), p < q, with equal keys, in batches of at most `batch_pairs`.

    Position p pairs with every later position of its run, so it contributes ``end - 1 - p``
    pairs; the pairs are numbered consecutively and each batch decodes one range of numbers.
    Beyond O(len(sorted_keys)) bookkeeping, memory is O(batch_pairs) whatever the run lengths.
    """
    n = len(sorted_keys)
    if n < 2:
        return
    is_start = np.empty(n, dtype=bool)
    is_start[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=is_start[1:])
    starts = np.flatnonzero(is_start)
    ends = np.append(starts[1:], n)
    run_end = np.repeat(ends, ends - starts)
    counts = run_end - 1 - np.arange(n)
    # position p pairs with the counts[p] positions after it in its run: p + 1, p + 2, ...
    yield from _ranges(np.arange(1, n + 1), counts, batch_pairs)


def _run_lengths(sorted_keys: np.ndarray) -> np.ndarray:
    if len(sorted_keys) == 0:
        return np.empty(0, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    return np.diff(np.append(starts, len(sorted_keys)))


def _all_pair_batches(
    h: np.ndarray, max_distance: int, block_elements: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Index pairs (i < j) within `max_distance` by comparing every pair, one row block at a time."""
    n = len(h)
    rows = max(1, int(block_elements) // max(n, 1))
    for lo in range(0, n - 1, rows):
        hi = min(lo + rows, n - 1)
        # Columns from lo + 1 on cover every j > i for these rows; j <= i is masked below.
        d = _popcount(h[lo:hi, None] ^ h[None, lo + 1 :])
        i, j = np.nonzero(d <= max_distance)
        i += lo
        j += lo + 1
        keep = j > i
        if keep.any():
            yield i[keep], j[keep]


def _unique_pair_batches(
    unique: np.ndarray, max_distance: int, batch_pairs: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Index pairs (a < b) of distinct hashes within `max_distance`, each emitted exactly once."""
    chunks = _chunks(max_distance)
    keys = [(unique >> np.uint64(shift)) & mask for shift, mask in chunks]
    # Short chunks (large max_distance) make buckets so full that checking the candidates costs
    # more than checking every pair; count the candidates first and compare the two costs.
    n_candidates = sum(int(np.sum(r * (r - 1) // 2)) for r in map(_run_lengths, map(np.sort, keys)))
    n_all = len(unique) * (len(unique) - 1) // 2
    if n_candidates * _CANDIDATE_COST > n_all:
        yield from _all_pair_batches(unique, max_distance, batch_pairs)
        return
    for c, (shift, mask) in enumerate(chunks):
        # Stable sort keeps indices ascending inside a bucket, so p < q gives order[p] < order[q].
        order = np.argsort(keys[c], kind="stable")
        by_key = unique[order]
        for p, q in _pairs_in_runs(keys[c][order], batch_pairs):
            x = by_key[p] ^ by_key[q]
            keep = _popcount(x) <= max_distance
            p, q, x = p[keep], q[keep], x[keep]
            # A pair that agrees on several chunks is found once per chunk; keep it only at the
            # first, so no global unique over all candidates is needed.
            if c and len(x):
                first = np.ones(len(x), dtype=bool)
                for prev_shift, prev_mask in chunks[:c]:
                    first &= ((x >> np.uint64(prev_shift)) & prev_mask) != 0
                p, q = p[first], q[first]
            if len(p):
                yield order[p], order[q]


def _group_members(inverse: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Members of each group ascending: (members, start, size) with members[start[g]:...]."""
    members = np.argsort(inverse, kind="stable")
    size = np.bincount(inverse, minlength=n_groups)
    start = np.cumsum(size) - size
    return members, start, size


def _sorted_pairs(i: np.ndarray, j: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Orient pairs as (min, max) and sort them lexicographically."""
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    # n**2 < 2**63 for any array that fits in memory, so one int64 key sorts both columns.
    key = np.sort(lo.astype(np.int64) * n + hi)
    return key // n, key % n


def near_duplicate_pairs(
    hashes: np.ndarray, max_distance: int, *, batch_pairs: int = _BATCH_PAIRS
) -> tuple[np.ndarray, np.ndarray]:
    """All index pairs (i < j) whose hashes differ in at most `max_distance` bits.

    Multi-index hashing: identical hashes are collapsed first (a block of k copies would
    otherwise give k**2 / 2 candidates in every chunk), the distinct hashes are bucketed by each
    of ``max_distance + 1`` disjoint bit chunks, candidates inside a bucket are verified, and the
    surviving pairs are expanded back to every copy. Candidates are processed `batch_pairs` at a
    time, so the memory beyond the output stays bounded even for giant buckets.

    The cost grows with `max_distance` (shorter chunks, fuller buckets): on 50,000 random
    hashes about 0.1 s at 4 bits, 0.6 s at 6, 2 s at 8. When the bucket sizes show that the
    candidates would cost more than comparing every distinct pair (around 12 bits and above on
    random hashes), the distinct hashes are compared block by block instead; the result is the
    same either way.

    Args:
        hashes: (N,) uint64 hashes (int64 holding the same bits is accepted).
        max_distance: largest Hamming distance counted as a near duplicate, 0..32 bits;
            0 finds exact duplicates.
        batch_pairs: candidate pairs verified at once (memory knob; the result does not depend
            on it).

    Returns:
        (i, j): two (P,) int64 arrays, ``i < j``, sorted by i then j.

    Raises:
        ShortcutlabError: `max_distance` is not an integer in 0..32.
        TableError: `hashes` is not a 1-D integer array.

    Example:
        >>> near_duplicate_pairs(np.array([5, 4, 5], dtype=np.uint64), 0)
        (array([0]), array([2]))
    """
    t = check_distance(max_distance)
    h = _as_hashes(hashes)
    n = len(h)
    batch_pairs = max(1, int(batch_pairs))
    unique, inverse, _ = np.unique(h, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    members, start, size = _group_members(inverse, len(unique))

    parts_i, parts_j = [], []
    # Copies of one hash: every pair among them (distance 0).
    for p, q in _pairs_in_runs(inverse[members], batch_pairs):
        parts_i.append(members[p])
        parts_j.append(members[q])
    # Distinct hashes within t: every copy of one with every copy of the other.
    for a, b in _unique_pair_batches(unique, t, batch_pairs):
        na, nb = size[a], size[b]
        if np.all((na == 1) & (nb == 1)):
            parts_i.append(members[start[a]])
            parts_j.append(members[start[b]])
            continue
        per = na * nb
        owner = np.repeat(np.arange(len(a)), per)
        r = np.arange(len(owner)) - np.repeat(np.cumsum(per) - per, per)
        parts_i.append(members[start[a][owner] + r // nb[owner]])
        parts_j.append(members[start[b][owner] + r % nb[owner]])
    if not parts_i:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return _sorted_pairs(np.concatenate(parts_i), np.concatenate(parts_j), n)


def all_pairs_near_duplicates(
    hashes: np.ndarray, max_distance: int, *, block_elements: int = 1 << 22
) -> tuple[np.ndarray, np.ndarray]:
    """Quadratic reference for `near_duplicate_pairs`: compare every pair, block by block.

    Args:
        hashes: (N,) uint64 hashes.
        max_distance: largest Hamming distance counted, 0..32 bits.
        block_elements: distances computed at once (rows x columns of one block).

    Returns:
        (i, j): two (P,) int64 arrays, ``i < j``, sorted by i then j.
    """
    t = check_distance(max_distance)
    h = _as_hashes(hashes)
    parts = list(_all_pair_batches(h, t, block_elements))
    if not parts:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    # Blocks come in row order and nonzero is row-major, so the pairs are already sorted.
    i, j = (np.concatenate(col).astype(np.int64) for col in zip(*parts))
    return i, j


# ---------------------------------------------------------------------------- query vs reference
def _ranges(starts: np.ndarray, counts: np.ndarray, batch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(owner, position) pairs: owner k covers positions starts[k] .. starts[k] + counts[k] - 1,
    enumerated in batches of at most `batch` (memory O(batch) whatever the counts)."""
    pos = np.flatnonzero(counts)
    if len(pos) == 0:
        return
    cnt = counts[pos]
    cum = np.cumsum(cnt)
    first = cum - cnt
    total = int(cum[-1])
    for lo in range(0, total, batch):
        hi = min(lo + batch, total)
        k0 = int(np.searchsorted(cum, lo, side="right"))
        k1 = int(np.searchsorted(cum, hi - 1, side="right")) + 1
        take = np.minimum(cum[k0:k1], hi) - np.maximum(first[k0:k1], lo)
        owner = np.repeat(np.arange(k0, k1), take)
        offset = np.arange(lo, hi) - first[owner]
        yield pos[owner], starts[pos[owner]] + offset


def _all_cross_batches(q: np.ndarray, r: np.ndarray, t: int, block_elements: int):
    rows = max(1, int(block_elements) // max(len(r), 1))
    for lo in range(0, len(q), rows):
        d = _popcount(q[lo : lo + rows, None] ^ r[None, :])
        a, b = np.nonzero(d <= t)
        if len(a):
            yield a + lo, b, d[a, b].astype(np.int64)


def _cross_unique_batches(uq: np.ndarray, ur: np.ndarray, t: int, batch_pairs: int):
    """(a, b, d) for distinct query values uq[a] and reference values ur[b] within `t` bits,
    each pair once: candidates share one of the ``t + 1`` chunks exactly (pigeonhole), and a
    pair agreeing on several chunks is kept at its first."""
    chunks = _chunks(t)
    plans = []
    n_candidates = 0
    for shift, mask in chunks:
        kr = (ur >> np.uint64(shift)) & mask
        order = np.argsort(kr, kind="stable")
        sorted_kr = kr[order]
        kq = (uq >> np.uint64(shift)) & mask
        lo = np.searchsorted(sorted_kr, kq, side="left")
        cnt = np.searchsorted(sorted_kr, kq, side="right") - lo
        n_candidates += int(cnt.sum())
        plans.append((order, lo, cnt))
    if n_candidates * _CANDIDATE_COST > len(uq) * len(ur):
        yield from _all_cross_batches(uq, ur, t, batch_pairs)
        return
    for c, (order, lo, cnt) in enumerate(plans):
        for a, p in _ranges(lo, cnt, batch_pairs):
            b = order[p]
            x = uq[a] ^ ur[b]
            d = _popcount(x)
            keep = d <= t
            if c:
                for prev_shift, prev_mask in chunks[:c]:
                    keep &= ((x >> np.uint64(prev_shift)) & prev_mask) != 0
            if keep.any():
                yield a[keep], b[keep], d[keep].astype(np.int64)


def _expand(a, b, d, q_members, q_start, q_size, r_members, r_start, r_size):
    """Every copy of query value a with every copy of reference value b."""
    na, nb = q_size[a], r_size[b]
    if np.all((na == 1) & (nb == 1)):
        return q_members[q_start[a]], r_members[r_start[b]], d
    per = na * nb
    owner = np.repeat(np.arange(len(a)), per)
    k = np.arange(len(owner)) - np.repeat(np.cumsum(per) - per, per)
    return (
        q_members[q_start[a][owner] + k // nb[owner]],
        r_members[r_start[b][owner] + k % nb[owner]],
        d[owner],
    )


def near_duplicate_batches_between(query, reference, max_distance: int, *, batch_pairs: int = _BATCH_PAIRS):
    """Batches of (i, j, d): query i and reference j within `max_distance` bits, d the distance.

    The generator behind `near_duplicates_between`, for callers that reduce each batch (per
    query nearest, distinct parent pairs) instead of listing every pair. Identical hashes on
    either side are collapsed before searching and expanded per batch. Pairs come in no
    particular order; each appears exactly once.
    """
    t = check_distance(max_distance)
    q = _as_uint64(query, "query hashes").reshape(-1)
    r = _as_uint64(reference, "reference hashes").reshape(-1)
    if len(q) == 0 or len(r) == 0:
        return
    batch_pairs = max(1, int(batch_pairs))
    uq, iq = np.unique(q, return_inverse=True)
    ur, ir = np.unique(r, return_inverse=True)
    qm = _group_members(iq.reshape(-1), len(uq))
    rm = _group_members(ir.reshape(-1), len(ur))
    for a, b, d in _cross_unique_batches(uq, ur, t, batch_pairs):
        yield _expand(a, b, d, *qm, *rm)


def near_duplicates_between(
    query, reference, max_distance: int, *, batch_pairs: int = _BATCH_PAIRS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All (query i, reference j) pairs whose hashes differ in at most `max_distance` bits.

    The two-set form of `near_duplicate_pairs`: the reference hashes are bucketed by each of
    ``max_distance + 1`` disjoint bit chunks (one sort per chunk), each query looks its chunks
    up by binary search, and the candidates are verified; pairs inside one set are never
    formed. When the bucket sizes show that the candidates would cost more than comparing
    every pair, every pair is compared instead; the result is the same.

    Args:
        query: (Q,) uint64 hashes (int64 with the same bits accepted).
        reference: (R,) uint64 hashes.
        max_distance: largest Hamming distance counted, 0..32 bits.
        batch_pairs: candidates verified at once (memory knob only).

    Returns:
        (i, j, d): three (P,) int64 arrays sorted by i then j; d the Hamming distance.

    Example:
        >>> q = np.array([0b1011, 0xFF00], dtype=np.uint64)
        >>> near_duplicates_between(q, np.array([0b1010, 0b0011, 0], dtype=np.uint64), 1)
        (array([0, 0]), array([0, 1]), array([1, 1]))
    """
    parts = list(near_duplicate_batches_between(query, reference, max_distance, batch_pairs=batch_pairs))
    return _sort_triples(parts, len(np.asarray(reference).reshape(-1)))


def _sort_triples(parts, n_ref: int):
    if not parts:
        e = np.empty(0, dtype=np.int64)
        return e, e.copy(), e.copy()
    i, j, d = (np.concatenate(col).astype(np.int64) for col in zip(*parts))
    order = np.lexsort((j, i))
    return i[order], j[order], d[order]


def all_pairs_between(query, reference, max_distance: int, *, block_elements: int = 1 << 22):
    """Quadratic reference for `near_duplicates_between`: every query against every reference."""
    t = check_distance(max_distance)
    q = _as_uint64(query, "query hashes").reshape(-1)
    r = _as_uint64(reference, "reference hashes").reshape(-1)
    parts = list(_all_cross_batches(q, r, t, block_elements))
    return _sort_triples(parts, len(r))


# ---------------------------------------------------------------------------- merging parents
def _dense_parents(parent_codes) -> tuple[np.ndarray, np.ndarray]:
    """(dense, values): each crop's parent as 0..P-1 in sorted order, and the P sorted parents."""
    codes = np.asarray(parent_codes)
    if codes.ndim != 1:
        raise TableError(f"parent_codes must be a 1-D array of shape (N,); got shape {codes.shape}")
    try:
        values, dense = np.unique(codes, return_inverse=True)
    except TypeError:
        raise TableError("parent_codes mix types that cannot be ordered (e.g. numbers and strings)") from None
    return dense.reshape(-1).astype(np.int64), values


def _merge_dense(
    n_parents: int, pu: np.ndarray, pv: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(component, smallest): rank of each dense parent's component, ordered by the component's
    smallest parent, and that smallest dense parent of each component."""
    if n_parents == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    import scipy.sparse  # here, not at the top: the sibling search uses this module's search only
    from scipy.sparse.csgraph import connected_components

    graph = scipy.sparse.coo_matrix(
        (np.ones(len(pu), dtype=np.int8), (pu, pv)), shape=(n_parents, n_parents)
    ).tocsr()
    _, labels = connected_components(graph, directed=False)
    # scipy does not document the order of its labels; rank components by their smallest
    # (dense, hence original-order) parent so the numbering is reproducible across versions.
    _, first_node = np.unique(labels, return_index=True)
    rank = np.empty(len(first_node), dtype=np.int64)
    rank[np.argsort(first_node, kind="stable")] = np.arange(len(first_node))
    return rank[labels], np.sort(first_node)


def merge_linked_parents(parent_codes: np.ndarray, pairs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Merge the parents of linked crops, transitively (union-find semantics).

    Crops i and j linked means parent(i) and parent(j) become one merged parent; links chain,
    so a-b and b-c put a, b and c together. The components are found with
    ``scipy.sparse.csgraph.connected_components`` on the parent graph.

    Args:
        parent_codes: (N,) parent of each crop: integers or strings, any values (only their
            sort order matters for the numbering).
        pairs: (i, j) two (P,) integer arrays of linked crop indices in 0..N-1.

    Returns:
        (N,) int64 merged-parent code of each crop, numbered 0..M-1 in the order of the
        smallest original parent code in each merged parent.

    Raises:
        TableError: shapes do not match or a crop index is out of range.

    Example:
        >>> merge_linked_parents(np.array([30, 10, 20, 40]), (np.array([0]), np.array([2])))
        array([1, 0, 1, 2])
    """
    dense, values = _dense_parents(parent_codes)
    n = len(dense)
    try:
        i, j = (np.asarray(p) for p in pairs)
    except (TypeError, ValueError):
        raise TableError("pairs must be a tuple (i, j) of two index arrays") from None
    if i.shape != j.shape or i.ndim != 1:
        raise TableError(f"pairs must be two 1-D arrays of equal length; got shapes {i.shape} and {j.shape}")
    if len(i) and (i.dtype.kind not in "iu" or j.dtype.kind not in "iu"):
        raise TableError(f"pair indices must be integers; got dtypes {i.dtype} and {j.dtype}")
    bad = (i < 0) | (i >= n) | (j < 0) | (j >= n)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise TableError(
            f"pair indices must lie in 0..{n - 1} (one per crop); pair {k} is ({int(i[k])}, {int(j[k])})"
        )
    return _merge_dense(len(values), dense[i], dense[j])[0][dense]


@dataclass(frozen=True, eq=False)
class DedupResult:
    """Outcome of `link_parents`.

    Attributes:
        merged_codes: (N,) int64 merged-parent code of each crop, 0..n_parents_after-1.
        n_pairs: crop pairs within `max_distance` (the length of `near_duplicate_pairs`).
        n_parents_before: distinct parents in the input.
        n_parents_after: merged parents.
        max_distance: the Hamming threshold used, in bits.
        first_parents: (n_parents_after,) smallest original parent code of each merged parent,
            same dtype as the input codes; ``first_parents[merged_codes]`` names every crop's
            merged parent after its first member.
    """

    merged_codes: np.ndarray
    n_pairs: int
    n_parents_before: int
    n_parents_after: int
    max_distance: int
    first_parents: np.ndarray

    @property
    def n_merged(self) -> int:
        """How many parents disappeared into others."""
        return self.n_parents_before - self.n_parents_after


def link_parents(parent_codes: np.ndarray, hashes: np.ndarray, max_distance: int = 4) -> DedupResult:
    """Link near-duplicate crops and merge their parents (protocol P3).

    Gives the same merged codes as
    ``merge_linked_parents(parent_codes, near_duplicate_pairs(hashes, max_distance))`` but
    never lists the crop pairs: copies of one hash are tied to their first copy (linear) and
    only distinct hashes are paired, each batch reduced to distinct parent pairs at once. A
    table where thousands of crops share a hash (blank crops) therefore costs linear memory.

    Args:
        parent_codes: (N,) parent of each crop (integers or strings).
        hashes: (N,) uint64 perceptual hashes aligned with `parent_codes`.
        max_distance: largest Hamming distance counted as a near duplicate, 0..32 bits.

    Returns:
        A `DedupResult`.

    Raises:
        TableError: lengths differ or inputs are not 1-D.
        ShortcutlabError: `max_distance` is not an integer in 0..32.
    """
    t = check_distance(max_distance)
    h = _as_hashes(hashes)
    dense, values = _dense_parents(parent_codes)
    n_parents = len(values)
    if len(h) != len(dense):
        raise TableError(
            f"hashes must have one entry per crop: expected {len(dense)} (len of parent_codes), got {len(h)}"
        )
    unique, inverse = np.unique(h, return_inverse=True)
    inverse = inverse.reshape(-1)
    members, start, size = _group_members(inverse, len(unique))
    rep_parent = dense[members[start]] if len(unique) else np.empty(0, dtype=np.int64)

    n_pairs = int(np.sum(size * (size - 1) // 2))
    keys: list[np.ndarray] = []
    n_keys = 0
    for a, b in _unique_pair_batches(unique, t, _BATCH_PAIRS):
        n_pairs += int(np.sum(size[a] * size[b]))
        pu, pv = rep_parent[a], rep_parent[b]
        cross = pu != pv
        # Keep distinct parent pairs only: their number is bounded by the parents, not the crops.
        keys.append(np.unique(np.minimum(pu[cross], pv[cross]) * n_parents + np.maximum(pu[cross], pv[cross])))
        n_keys += len(keys[-1])
        if n_keys > _BATCH_PAIRS:
            keys = [np.unique(np.concatenate(keys))]
            n_keys = len(keys[0])
    key = np.concatenate(keys) if keys else np.empty(0, dtype=np.int64)
    # Every copy of a hash is tied to the parent of its first copy, then parents pairwise.
    edges_u = np.concatenate([dense, key // max(n_parents, 1)])
    edges_v = np.concatenate([rep_parent[inverse], key % max(n_parents, 1)])
    comp, smallest = _merge_dense(n_parents, edges_u, edges_v)
    return DedupResult(
        merged_codes=comp[dense],
        n_pairs=n_pairs,
        n_parents_before=n_parents,
        n_parents_after=len(smallest),
        max_distance=t,
        first_parents=values[smallest],
    )


def link_parents_dihedral(parent_codes: np.ndarray, variant_hashes: np.ndarray, max_distance: int = 4) -> DedupResult:
    """`link_parents` under flips and right-angle rotations (protocol P3 with ``invariant``).

    Crops i and j are linked when some transform of i is within `max_distance` bits of j,
    ``min_g d(h(g x_i), h(x_j)) <= t``: every transformed hash of every crop is searched
    against the untransformed hashes (`near_duplicate_batches_between`), and each batch is
    reduced to distinct parent pairs at once, so memory stays bounded by the parents.

    Args:
        parent_codes: (N,) parent of each crop.
        variant_hashes: (N, K) uint64: column 0 the crop's own hash, columns 1.. its transforms
            (`shortcutlab.data.siblings.dihedral_hashes` gives K = 8).
        max_distance: Hamming threshold in bits, 0..32.

    Returns:
        A `DedupResult`; `n_pairs` counts linked (crop, crop) pairs i != j over all transforms
        of i (a pair linked by two transforms counts once per transform).

    Raises:
        TableError: shapes do not match.
    """
    t = check_distance(max_distance)
    v = _as_uint64(variant_hashes, "variant hashes")
    dense, values = _dense_parents(parent_codes)
    if v.ndim != 2 or len(v) != len(dense) or v.shape[1] < 1:
        raise TableError(
            f"variant hashes must be (N, K) with one row per crop: expected ({len(dense)}, K), got shape {v.shape}"
        )
    n_parents, k = len(values), v.shape[1]
    keys, n_pairs = [], 0
    for i, j, _ in near_duplicate_batches_between(v.ravel(), v[:, 0], t):
        i = i // k
        other = i != j
        n_pairs += int(other.sum())
        pu, pv = dense[i[other]], dense[j[other]]
        cross = pu != pv
        if cross.any():
            keys.append(np.unique(np.minimum(pu[cross], pv[cross]) * n_parents + np.maximum(pu[cross], pv[cross])))
    key = np.unique(np.concatenate(keys)) if keys else np.empty(0, dtype=np.int64)
    comp, smallest = _merge_dense(n_parents, key // max(n_parents, 1), key % max(n_parents, 1))
    return DedupResult(
        merged_codes=comp[dense] if len(dense) else np.empty(0, dtype=np.int64),
        n_pairs=n_pairs,
        n_parents_before=n_parents,
        n_parents_after=len(smallest),
        max_distance=t,
        first_parents=values[smallest],
    )
