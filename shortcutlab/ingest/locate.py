"""Find each crop in the released field images: its parent field and its box.

A crop table released without coordinates (SIPaKMeD's cropped cells, for instance) names its
field, if at all, only through a file name. `locate` finds every crop in the field images by
normalised cross-correlation (NCC) and adds the field it came from (`parent`, the field's file
stem) and its box (`x, y, w, h`, top-left corner and size in field pixels).

Matching every crop against every field position is crops x fields x pixels (about 10^16
multiply-adds for 4,000 crops in 1,000 fields of 1024 x 768), so candidates are found first:

1. **Index.** Each field is turned grey (JPEG's luma weights, so re-encoded colour matters
   little), averaged over blocks of s x s pixels (s = 4 or 8 from the smallest crop), and each
   3 x 3 window of block means is quantised (bins of 8 grey levels) into one integer key.
   Windows without texture (range under two bins) and keys shared by more than 64 windows
   (flat or repeated background) are left out.
2. **Vote.** A crop is averaged over blocks at every one of the s x s phases; at the phase that
   lines its blocks up with the field's grid its keys equal the field's (exactly for a pixel
   copy, nearly always for a JPEG re-encoding, whose block means move by well under a bin),
   and each key found votes for one (field, offset).
3. **Verify.** The best-voted offsets of the best-voted fields (at least a quarter of the
   top votes, at most four fields) are checked by NCC at full resolution within +-2 pixels;
   the highest score is the match. NCC is `skimage.feature.match_template`'s (the Pearson
   correlation of crop and window), computed directly on that small window.
4. **Fall back.** A crop whose votes give no match at `min_score`, and most of whose windows
   are too flat to be indexed, is matched coarse-to-fine:
   NCC of its block means against every field's block means
   (`skimage.feature.match_template`), then full resolution within +-s pixels of the three
   best fields' peaks.

A crop is matched when its best NCC reaches `min_score` (default 0.9); it is flagged
`ambiguous` when a second field also reaches it within 0.01 of the best score (the same
pixels released in two fields); a look-alike elsewhere (cells on a plain background can reach
NCC 0.9 in another field) scores clearly lower and is only recorded in `second_score`.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from shortcutlab.errors import ShortcutlabError

#: NCC a crop must reach in a field to be matched there
DEFAULT_MIN_SCORE = 0.9
#: a second field within this NCC of the best (and above the threshold) makes a match ambiguous
AMBIGUOUS_MARGIN = 0.01
#: output columns added (or replaced) by `locate`, in order
LOCATED_COLUMNS = ("parent", "x", "y", "w", "h", "match_score", "second_parent", "second_score", "ambiguous", "method")

_BIN = 8            # grey levels per quantisation bin of a block mean
_KEY = 3            # keys are KEY x KEY windows of block means
_MIN_RANGE = 2 * _BIN
_MAX_BUCKET = 64    # a key in more field windows than this says nothing
_MAX_FIELDS = 4     # fields verified per crop (by votes)
_RADIUS = 2         # refinement window around a voted offset, pixels
_LOW_TEXTURE = 0.25  # under this share of indexable windows a crop falls back to coarse NCC
FALLBACKS = ("auto", "always", "never")
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


class LocateError(ShortcutlabError):
    """A table, crop or field folder that `locate` cannot use, or a crop found in no field."""


class LocateWarning(UserWarning):
    """A degenerate but valid outcome: a crop found in two fields, or a flat crop."""


@dataclass(frozen=True)
class Field:
    """One field image: `name` (its parent: the file stem, or the relative path without
    extension when stems repeat), `stem` and `path`."""

    name: str
    stem: str
    path: str


def list_fields(fields_dir: str, exclude=()) -> list[Field]:
    """Every image file under `fields_dir` (recursively), sorted by relative path, but the
    files in `exclude` (the crops themselves: a release such as SIPaKMeD keeps its crops in a
    subfolder of the fields' folder, and a crop is not its own field).

    Raises:
        LocateError: the folder is missing or holds no image file.
    """
    from shortcutlab.data.siblings import IMAGE_EXTENSIONS
    from shortcutlab.paths import need_folder

    need_folder(fields_dir, "--fields folder", LocateError)
    skip = {os.path.realpath(p) for p in exclude}
    rel = []
    for folder, dirs, files in os.walk(fields_dir):
        dirs.sort()
        for f in sorted(files):
            if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith(".") \
                    and os.path.realpath(os.path.join(folder, f)) not in skip:
                rel.append(os.path.relpath(os.path.join(folder, f), fields_dir))
    if not rel:
        raise LocateError(f"--fields folder {fields_dir!r} holds no image files ({', '.join(IMAGE_EXTENSIONS)}, searched recursively)"
                          + (" besides the crops themselves" if skip else ""))
    stems = [os.path.splitext(os.path.basename(r))[0] for r in rel]
    unique = len(set(stems)) == len(stems)
    return [Field(s if unique else os.path.splitext(r)[0].replace(os.sep, "/"), s, os.path.join(fields_dir, r))
            for s, r in zip(stems, rel)]


def grey(path: str, what: str, name: str) -> np.ndarray:
    """(H, W) float32 luma (0.299 R + 0.587 G + 0.114 B, rounded to 0..255) of an image file;
    `what` and `name` (an id) name it in errors. Rounded so that fields can be held as uint8."""
    from shortcutlab.data.images import read_crop
    from shortcutlab.paths import need_file

    need_file(path, what, LocateError, f" (id {name!r})")
    return np.rint(read_crop(path, name).astype(np.float32) @ _LUMA)


def block_means(g: np.ndarray, s: int, py: int = 0, px: int = 0) -> np.ndarray:
    """Means of the s x s blocks of `g` whose grid starts at (py, px); partial blocks dropped."""
    nby, nbx = (g.shape[0] - py) // s, (g.shape[1] - px) // s
    v = g[py:py + nby * s, px:px + nbx * s]
    return v.reshape(nby, s, nbx, s).mean(axis=(1, 3))


def window_keys(means: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keys of the textured KEY x KEY windows of a grid of block means.

    Returns:
        (keys, rows, cols): int64 keys and the top-left block of each window.
    """
    if means.shape[0] < _KEY or means.shape[1] < _KEY:
        e = np.empty(0, dtype=np.int64)
        return e, e, e
    w = np.lib.stride_tricks.sliding_window_view(means, (_KEY, _KEY))
    q = np.clip(w // _BIN, 0, 255 // _BIN).astype(np.int64)
    keys = np.zeros(q.shape[:2], dtype=np.int64)
    for a in range(_KEY):
        for b in range(_KEY):
            keys = keys * 32 + q[:, :, a, b]
    textured = (w.max(axis=(2, 3)) - w.min(axis=(2, 3))) >= _MIN_RANGE
    rows, cols = np.nonzero(textured)
    return keys[rows, cols], rows, cols


def crop_keys(g: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The keys of a crop at every block phase at once: for each start pixel (y, x), the key of
    the KEY x KEY blocks of side s whose grid starts there (what `window_keys` gives for the
    grid at phase (y mod s, x mod s), block (y // s, x // s)).

    Returns:
        (keys, ys, xs) of the textured windows; ys, xs are crop pixels.
    """
    span = _KEY * s
    if g.shape[0] < span or g.shape[1] < span:
        e = np.empty(0, dtype=np.int64)
        return e, e, e
    c = np.zeros((g.shape[0] + 1, g.shape[1] + 1))
    c[1:, 1:] = g.astype(np.float64).cumsum(0).cumsum(1)
    box = (c[s:, s:] - c[:-s, s:] - c[s:, :-s] + c[:-s, :-s]) / (s * s)   # mean of the s x s block at each (y, x)
    ny, nx = g.shape[0] - span + 1, g.shape[1] - span + 1
    keys = np.zeros((ny, nx), dtype=np.int64)
    hi = np.full((ny, nx), -np.inf)
    lo = np.full((ny, nx), np.inf)
    for a in range(_KEY):
        for b in range(_KEY):
            v = box[a * s:a * s + ny, b * s:b * s + nx]
            keys = keys * 32 + np.clip(v // _BIN, 0, 255 // _BIN).astype(np.int64)
            np.maximum(hi, v, out=hi)
            np.minimum(lo, v, out=lo)
    ys, xs = np.nonzero(hi - lo >= _MIN_RANGE)
    return keys[ys, xs], ys, xs


class FieldIndex:
    """Keys of every field's block-mean windows, sorted, with where each came from.

    Attributes:
        fields: the fields, in index order.
        scale: the block side s.
        shapes: (H, W) of each field.
        small: each field's block means at phase 0 (for the coarse fallback).
        kept: the fields held in memory as uint8 luma (up to `keep_bytes`; others are read
            again to be verified).
    """

    def __init__(self, fields: list[Field], scale: int, keep_bytes: int = 2**31) -> None:
        self.fields, self.scale = fields, scale
        self.shapes, self.small = [], []
        self.kept: dict[int, np.ndarray] = {}   # fields held as uint8 luma, up to keep_bytes
        keys, where = [], []
        held = 0
        for f_i, f in enumerate(fields):
            g = grey(f.path, "field image", f.name)
            self.shapes.append(g.shape)
            if held + g.size <= keep_bytes:
                self.kept[f_i] = g.astype(np.uint8)
                held += g.size
            m = block_means(g, scale)
            self.small.append(m)
            k, r, c = window_keys(m)
            keys.append(k)
            where.append(np.stack([np.full(len(k), f_i), r, c], axis=1).astype(np.int32))
        keys = np.concatenate(keys) if keys else np.empty(0, dtype=np.int64)
        where = np.concatenate(where) if where else np.empty((0, 3), dtype=np.int32)
        order = np.argsort(keys, kind="stable")
        keys, where = keys[order], where[order]
        _, count = np.unique(keys, return_counts=True)
        keep = np.repeat(count <= _MAX_BUCKET, count)
        self.keys, self.where = keys[keep], where[keep]

    def grey(self, f_i: int) -> np.ndarray:
        """Field `f_i`'s luma, (H, W) float32: from memory, or read again."""
        if f_i in self.kept:
            return self.kept[f_i].astype(np.float32)
        return grey(self.fields[f_i].path, "field image", self.fields[f_i].name)

    def votes(self, g: np.ndarray) -> list[tuple[int, int, int, int]]:
        """Candidate (votes, field, y, x) for a crop's grey pixels `g`, best first; at most
        one offset (the best voted) per field, at most `_MAX_FIELDS` fields."""
        s = self.scale
        k, oy, ox = crop_keys(g, s)
        if not len(k) or not len(self.keys):
            return []
        lo, hi = np.searchsorted(self.keys, k, "left"), np.searchsorted(self.keys, k, "right")
        n = hi - lo
        if not n.sum():
            return []
        rep = np.repeat(np.arange(len(k)), n)
        pos = np.repeat(lo, n) + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        w = self.where[pos]
        y0, x0 = w[:, 1] * s - oy[rep], w[:, 2] * s - ox[rep]
        code = (w[:, 0].astype(np.int64) << 40) + ((y0.astype(np.int64) + 2**19) << 20) + (x0 + 2**19)
        uniq, count = np.unique(code, return_counts=True)
        order = np.argsort(-count, kind="stable")
        out, seen = [], set()
        floor = max(1, int(count[order[0]]) // 4)   # a stray key or two is not a candidate
        for u, c in zip(uniq[order], count[order]):
            f_i = int(u >> 40)
            if c < floor:
                break
            if f_i in seen:
                continue
            seen.add(f_i)
            out.append((int(c), f_i, int(((u >> 20) & (2**20 - 1)) - 2**19), int((u & (2**20 - 1)) - 2**19)))
            if len(out) == _MAX_FIELDS:
                break
        return out


def choose_scale(min_side: int) -> int:
    """Block side s for crops whose smaller side is `min_side`: the largest of 1, 2, 4, 8 that
    leaves at least 8 blocks across (so at least 7 at any phase, 25 keys)."""
    s = 8
    while s > 1 and min_side // s < 8:
        s //= 2
    return s


def ncc_window(field: np.ndarray, crop: np.ndarray, y: int, x: int, radius: int) -> tuple[float, int, int]:
    """Best NCC of `crop` placed within +-`radius` of (y, x) in `field`: (score, y, x).

    NCC as `skimage.feature.match_template` defines it (the Pearson correlation of the crop and
    the field window), computed directly: the window is small, so this is faster than an FFT.
    Score -1 when the crop does not fit there.
    """
    h, w = crop.shape
    y_lo, x_lo = max(0, y - radius), max(0, x - radius)
    y_hi, x_hi = min(field.shape[0], y + h + radius), min(field.shape[1], x + w + radius)
    if y_hi - y_lo < h or x_hi - x_lo < w:
        return -1.0, y, x
    win = np.lib.stride_tricks.sliding_window_view(field[y_lo:y_hi, x_lo:x_hi].astype(np.float64), (h, w))
    t = crop.astype(np.float64) - crop.mean(dtype=np.float64)
    num = np.tensordot(win, t, axes=([2, 3], [0, 1]))
    var = (win ** 2).sum(axis=(2, 3)) - win.sum(axis=(2, 3)) ** 2 / (h * w)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(var > 1e-9, num / np.sqrt(np.maximum(var, 1e-9) * (t ** 2).sum()), 0.0)
    i, j = np.unravel_index(int(np.argmax(r)), r.shape)
    return float(r[i, j]), y_lo + int(i), x_lo + int(j)


def coarse_candidates(index: FieldIndex, g: np.ndarray, top: int = 3) -> list[tuple[float, int, int, int]]:
    """Coarse step of the fallback: NCC of the crop's block means against each field's,
    (score, field, y, x) of the `top` best fields' peaks in field pixels."""
    from skimage.feature import match_template

    s = index.scale
    m = block_means(g, s)
    if m.shape[0] < 2 or m.shape[1] < 2 or m.std() == 0:
        return []
    out = []
    for f_i, small in enumerate(index.small):
        if small.shape[0] < m.shape[0] or small.shape[1] < m.shape[1]:
            continue
        r = match_template(small, m)
        i, j = np.unravel_index(int(np.argmax(r)), r.shape)
        out.append((float(r[i, j]), f_i, int(i) * s, int(j) * s))
    out.sort(key=lambda t: -t[0])
    return out[:top]


def _verify(index: FieldIndex, crops: list[np.ndarray], cands: dict[int, list[tuple]], radius: int) -> dict[int, list[tuple]]:
    """Score every (crop, field, y, x) candidate at full resolution, reading each field once.

    Args:
        cands: crop position -> [(field, y, x), ...].
    Returns:
        crop position -> [(score, field, y, x), ...].
    """
    by_field: dict[int, list[tuple[int, int, int]]] = {}
    for c_i, lst in cands.items():
        for f_i, y, x in lst:
            by_field.setdefault(f_i, []).append((c_i, y, x))
    scored: dict[int, list[tuple]] = {c_i: [] for c_i in cands}
    for f_i in sorted(by_field):
        field = index.grey(f_i)
        for c_i, y, x in by_field[f_i]:
            score, yy, xx = ncc_window(field, crops[c_i], y, x, radius)
            scored[c_i].append((score, f_i, yy, xx))
    return scored


@dataclass(frozen=True)
class CropSource:
    """The crops to locate: their ids, paths (as given and resolved), table and column."""

    frame: pd.DataFrame
    ids: list[str]
    given: list[str]
    paths: list[str]
    column: str
    source: str


def read_crops_table(table_or_paths, image: str = "path", id: str | None = None, root: str | None = None) -> CropSource:
    """The crops to locate from a CSV path, a DataFrame or a list of image paths.

    Relative paths are relative to `root` (default: the CSV's folder, else the working folder).
    """
    if isinstance(table_or_paths, (list, tuple)):
        frame, source = pd.DataFrame({image: [os.fspath(p) for p in table_or_paths]}), "the crop list"
    elif isinstance(table_or_paths, pd.DataFrame):
        frame, source = table_or_paths.reset_index(drop=True), "the crop table"
    else:
        from shortcutlab.paths import need_file

        source = need_file(table_or_paths, "crop table", LocateError)
        try:
            frame = pd.read_csv(source, dtype=str, keep_default_na=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise LocateError(f"crop table {source!r} cannot be read as CSV: {' '.join(str(e).split())}") from None
        root = root if root is not None else os.path.dirname(os.path.abspath(source))
    root = root if root is not None else os.getcwd()
    if image not in frame.columns:
        raise LocateError(f"{source} {'' if source.startswith('the ') else 'table '}has no image column {image!r} (--image); "
                          f"columns are: {', '.join(map(str, frame.columns))}")
    if id is not None and id not in frame.columns:
        raise LocateError(f"{source} has no id column {id!r}; columns are: {', '.join(map(str, frame.columns))}")
    given = [str(v) for v in frame[image]]
    for r, v in enumerate(given):
        if not v.strip():
            raise LocateError(f"{source} row {r}, column {image!r}: empty value, expected a crop image path")
    ids = [str(v) for v in frame[id]] if id is not None else (
        [str(v) for v in frame["id"]] if "id" in frame.columns else [str(r) for r in range(len(frame))])
    paths = [v if os.path.isabs(v) else os.path.join(root, v) for v in given]
    return CropSource(frame, ids, given, paths, image, source)


def _load_crop(src: CropSource, r: int) -> np.ndarray:
    from shortcutlab.paths import wrong_kind

    why = wrong_kind(src.paths[r], "file")
    if why:
        raise LocateError(f"{src.source} row {r} (id {src.ids[r]!r}), column {src.column!r}: crop image "
                          f"{src.given[r]!r} {why}")
    return grey(src.paths[r], "crop image", src.ids[r])


def _best_per_field(scored: list[tuple]) -> list[tuple[float, int, int, int]]:
    """(score, field, y, x) with one entry per field (its best), best first."""
    best: dict[int, tuple] = {}
    for t in scored:
        if t[1] not in best or t[0] > best[t[1]][0]:
            best[t[1]] = t
    return sorted(best.values(), key=lambda t: -t[0])


def textured_share(g: np.ndarray, s: int) -> float:
    """Share of a crop's key windows with texture enough to be indexed (0 when none fit)."""
    span = _KEY * s
    n = max(0, g.shape[0] - span + 1) * max(0, g.shape[1] - span + 1)
    return len(crop_keys(g, s)[0]) / n if n else 0.0


def _search(index: FieldIndex, crops: list[np.ndarray], min_score: float,
            fallback: str = "auto") -> tuple[dict[int, list], dict[int, str]]:
    """Vote, verify, and fall back to coarse-to-fine NCC for the crops votes leave unmatched:
    with `fallback` "auto" only those whose windows are mostly too flat to be indexed (a
    textured crop the votes miss is in no field, and the fallback costs one NCC per field),
    with "always" all of them, with "never" none.

    Returns:
        (scored, method): crop position -> [(score, field, y, x)] best first, one per field;
        crop position -> "vote" or "coarse" (where its best score came from).
    """
    live = [r for r, c in enumerate(crops) if c.std() > 0]
    cands = {r: [(f, y, x) for _, f, y, x in index.votes(crops[r])] for r in live}
    scored = {r: _best_per_field(v) for r, v in _verify(index, crops, cands, _RADIUS).items()}
    method = {r: "vote" for r in live}
    weak = [r for r in live if not scored[r] or scored[r][0][0] < min_score]
    if fallback != "always":
        weak = [r for r in weak if fallback == "auto" and textured_share(crops[r], index.scale) < _LOW_TEXTURE]
    coarse = {r: [(f, y, x) for _, f, y, x in coarse_candidates(index, crops[r])] for r in weak}
    for r, v in _verify(index, crops, coarse, index.scale).items():
        merged = _best_per_field(scored[r] + v)
        if merged and (not scored[r] or merged[0][0] > scored[r][0][0]):
            method[r] = "coarse"
        scored[r] = merged
    return scored, method


def _rows(index: FieldIndex, crops: list[np.ndarray], scored: dict, method: dict, min_score: float) -> pd.DataFrame:
    """The located columns, one row per crop."""
    out = []
    for r, c in enumerate(crops):
        found = scored.get(r, [])
        best = found[0] if found else None
        ok = best is not None and best[0] >= min_score
        second = found[1] if len(found) > 1 else None
        out.append({
            "parent": index.fields[best[1]].name if ok else "",
            "x": best[3] if ok else pd.NA,
            "y": best[2] if ok else pd.NA,
            "w": c.shape[1],
            "h": c.shape[0],
            "match_score": round(best[0], 6) if best is not None else np.nan,
            "second_parent": index.fields[second[1]].name if second is not None else "",
            "second_score": round(second[0], 6) if second is not None else np.nan,
            "ambiguous": bool(ok and second is not None and second[0] >= max(min_score, best[0] - AMBIGUOUS_MARGIN)),
            "method": method.get(r, "flat") if ok else ("none" if c.std() > 0 else "flat"),
        })
    frame = pd.DataFrame(out, columns=list(LOCATED_COLUMNS))
    for col in ("x", "y"):
        frame[col] = frame[col].astype("Int64")
    return frame


def agreement(given: list[str], located: pd.DataFrame, fields: list[Field], ids: list[str], column: str) -> dict:
    """How often the table's own parent (from file names) names the field the crop was found
    in: it agrees when it equals the field's name or its file stem. Unmatched crops and empty
    table parents are not compared."""
    stem = {f.name: f.stem for f in fields}
    compared = agree = 0
    disagreements = []
    for r, (g, p) in enumerate(zip(given, located["parent"])):
        if not p or not str(g).strip():
            continue
        compared += 1
        if str(g) in (p, stem[p]):
            agree += 1
        elif len(disagreements) < 5:
            disagreements.append({"row": r, "id": ids[r], "table": str(g), "located": p})
    return {"column": column, "n_compared": compared, "n_agree": agree, "n_disagree": compared - agree,
            "share": agree / compared if compared else None, "first_disagreements": disagreements}


def _unmatched_error(src: CropSource, index: FieldIndex, scored: dict, crops, bad: list[int], min_score: float) -> LocateError:
    r = bad[0]
    found = scored.get(r, [])
    if crops[r].std() == 0:
        why = "is flat (one grey level), so NCC is undefined"
    elif found:
        why = f"matched no field at NCC >= {min_score} (best {found[0][0]:.3f}, in field {index.fields[found[0][1]].name!r})"
    else:
        why = f"matched no field at NCC >= {min_score} (it fits in no field, or no candidate was found)"
    return LocateError(f"{src.source} row {r} (id {src.ids[r]!r}), column {src.column!r}: crop {src.given[r]!r} {why}; "
                       f"{len(bad)} of {len(crops)} crops unmatched; pass --allow-unmatched to keep them with an empty parent")


def locate(table_or_paths, fields_dir: str, *, image: str = "path", id: str | None = None, parent: str | None = None,
           min_score: float = DEFAULT_MIN_SCORE, allow_unmatched: bool = False,
           fallback: str = "auto", root: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Find each crop in the field images under `fields_dir`.

    Args:
        table_or_paths: a crop table (CSV path or DataFrame) with an image column, or a list
            of crop image paths.
        fields_dir: folder of field images (searched recursively); a field's parent is its
            file stem (its relative path without extension when stems repeat).
        image: the image column (default ``path``, as `shortcutlab table` writes it).
        id: the id column (default ``id`` when there is one, else the row number).
        parent: the table's own parent column to compare with (default ``parent`` when there
            is one); in the output it is renamed ``table_parent`` if it is called ``parent``.
        min_score: NCC a crop must reach to be matched, in (0, 1].
        allow_unmatched: keep crops found in no field (empty parent) instead of failing.
        fallback: which crops the votes leave unmatched go through coarse-to-fine NCC over
            every field: "auto" (those with under a quarter of their windows textured enough
            to index), "always" or "never".
        root: folder relative image paths start from (default: the CSV's folder).

    Returns:
        (table, summary): the input columns (those named as a located column are replaced)
        plus `LOCATED_COLUMNS` (x, y: top-left corner,
        w, h: crop size, all in field pixels; match_score: best NCC; second_parent,
        second_score: best other field; ambiguous: the second also reaches `min_score`,
        within `AMBIGUOUS_MARGIN` of the best;
        method: vote, coarse, none or flat), and a JSON-ready summary with the agreement.

    Raises:
        LocateError: a bad table, crop or field folder; a crop unmatched without
            `allow_unmatched`.

    Example:
        >>> table, summary = locate("crops.csv", "fields/")      # doctest: +SKIP
        >>> summary["n_matched"], summary["agreement"]["share"]  # doctest: +SKIP
    """
    t0 = time.perf_counter()
    if not isinstance(min_score, (int, float)) or not 0 < min_score <= 1:
        raise LocateError(f"--min-score must be an NCC in (0, 1]; got {min_score!r}")
    if fallback not in FALLBACKS:
        raise LocateError(f"--fallback must be one of {', '.join(FALLBACKS)}; got {fallback!r}")
    src = read_crops_table(table_or_paths, image=image, id=id, root=root)
    if parent is not None and parent not in src.frame.columns:
        raise LocateError(f"{src.source} has no parent column {parent!r} (--parent); columns are: {', '.join(map(str, src.frame.columns))}")
    given_col = parent if parent is not None else ("parent" if "parent" in src.frame.columns else None)
    fields = list_fields(fields_dir, exclude=src.paths)
    crops = [_load_crop(src, r) for r in range(len(src.paths))]
    index = FieldIndex(fields, choose_scale(min((min(c.shape) for c in crops), default=8)))
    scored, method = _search(index, crops, min_score, fallback)
    located = _rows(index, crops, scored, method, min_score)
    bad = [r for r in range(len(crops)) if not located.at[r, "parent"]]
    if bad and not allow_unmatched:
        raise _unmatched_error(src, index, scored, crops, bad, min_score)
    frame = src.frame.copy()
    given = ["" if pd.isna(v) else str(v) for v in frame[given_col]] if given_col else None
    if given_col == "parent":
        frame = frame.rename(columns={"parent": "table_parent"})
    frame = pd.concat([frame.drop(columns=[c for c in LOCATED_COLUMNS if c in frame.columns]), located], axis=1)
    summary = _summary(src, index, located, bad, min_score)
    summary["method"]["fallback"] = fallback
    summary["agreement"] = agreement(given, located, fields, src.ids, given_col) if given else None
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    _warn(summary)
    return frame, summary


def _summary(src: CropSource, index: FieldIndex, located: pd.DataFrame, bad: list[int], min_score: float) -> dict:
    amb = np.flatnonzero(located["ambiguous"].to_numpy())
    flat = [r for r in bad if located.at[r, "method"] == "flat"]
    return {
        "n_crops": len(located), "n_fields": len(index.fields), "n_matched": len(located) - len(bad),
        "n_unmatched": len(bad), "n_ambiguous": len(amb), "n_flat": len(flat),
        "n_by_method": {str(k): int(v) for k, v in located["method"].value_counts().items()},
        "unmatched": [{"row": r, "id": src.ids[r], "path": src.given[r],
                       "best_score": None if pd.isna(located.at[r, "match_score"]) else float(located.at[r, "match_score"])}
                      for r in bad[:10]],
        "ambiguous": [{"row": int(r), "id": src.ids[r], "parent": located.at[r, "parent"],
                       "second_parent": located.at[r, "second_parent"], "second_score": float(located.at[r, "second_score"])}
                      for r in amb[:10]],
        "method": {"match": "normalised cross-correlation (as skimage.feature.match_template defines it) on luma, rounded to 0-255",
                   "candidates": f"votes of quantised {_KEY}x{_KEY} block-mean keys (blocks of {index.scale} px, bins of {_BIN} levels), "
                                 f"verified within +-{_RADIUS} px; coarse-to-fine NCC on {index.scale}x block means "
                                 f"for crops the votes miss (see fallback)",
                   "min_score": min_score, "ambiguous_margin": AMBIGUOUS_MARGIN, "scale": index.scale},
    }


def _warn(summary: dict) -> None:
    if summary["n_ambiguous"]:
        a = summary["ambiguous"][0]
        warnings.warn(f"crops matching two fields at NCC >= {summary['method']['min_score']} (within {AMBIGUOUS_MARGIN}): {summary['n_ambiguous']} "
                      f"(first: id {a['id']!r} in {a['parent']!r} and {a['second_parent']!r}); flagged in column 'ambiguous'",
                      LocateWarning, stacklevel=3)
    if summary["n_flat"]:
        warnings.warn(f"flat crops (one grey level, which NCC cannot locate): {summary['n_flat']}; left unmatched",
                      LocateWarning, stacklevel=3)


def write_located(frame: pd.DataFrame, summary: dict, out: str) -> str:
    """Write the located table to `out` and its summary to the JSON sidecar beside it (same
    name, ``.json``), both or neither. Returns the sidecar's path."""
    from shortcutlab.data.manifest import sidecar_path
    from shortcutlab.io import atomic_files, write_json

    side = sidecar_path(out)
    with atomic_files() as stage:
        frame.to_csv(stage.path(out), index=False)
        write_json(stage.path(side), summary)
    return side
