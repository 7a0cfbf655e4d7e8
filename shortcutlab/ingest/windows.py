"""Windows cut from parent images around given coordinates: `shortcutlab crops`.

Released cytology datasets often ship whole field images and a table of cell coordinates, not
crops. CRIC (Rezende et al. 2021) gives each nucleus's centre in its field image; the paper's
crops are the 100 x 100 windows around them. `cut_crops` cuts those windows, writes one PNG per
crop and a crop table whose boxes (``x, y, w, h`` in parent pixels) let `shortcutlab audit
--box x,y,w,h` count the crops that share pixels with a sibling.

Geometry, in whole parent pixels (x to the right, y down, pixel (0, 0) the top-left one):

- a centre ``(cx, cy)`` and a size ``N`` give the window whose top-left corner is
  ``floor(cx - N/2 + 0.5), floor(cy - N/2 + 0.5)``: for whole-pixel centres the centre pixel
  sits at index ``N // 2`` of the window;
- a box ``(x, y, w, h)`` gives the window with its top-left corner at ``x, y`` and size
  ``w x h`` (each rounded to the nearest pixel, halves up).

A window that reaches past the image border is refused (``border="refuse"``, the default) or
padded with a `numpy.pad` mode (``"constant"`` with `fill`, ``"edge"``, ``"reflect"``): the
padded window equals the same window of ``numpy.pad(image, ..., mode)``. Padded crops are
marked in the table (``padded``) and listed in the sidecar (``crops.json``), and a warning
says how many there are. A window wholly outside its image is an error in every mode.

Example:
    >>> from shortcutlab.ingest.windows import cut_crops                    # doctest: +SKIP
    >>> result = cut_crops("cric/classifications.csv", "image_filename", "cric_crops",
    ...                    center=("nucleus_x", "nucleus_y"), size=100, id="cell_id",
    ...                    label="bethesda_system", parent="image_id", border="reflect")
    >>> result.table                                   # crops.csv, read as a CropTable
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np
import pandas as pd

from shortcutlab.data.table import CropTable
from shortcutlab.errors import ShortcutlabError, TableError
from shortcutlab.io import atomic_dir, write_csv, write_json
from shortcutlab.paths import file_names, need_file

Border = Literal["refuse", "constant", "edge", "reflect"]
#: how a window past the image border is handled: refused, or padded with this numpy.pad mode
BORDERS: tuple[str, ...] = ("refuse", "constant", "edge", "reflect")
#: what `cut_crops` writes in its folder (``name/``: a folder it owns whole)
CROPS_FILES = ("crops.csv", "crops.json", "crops/")
FORMAT = "shortcutlab.crops/1"


class WindowError(ShortcutlabError):
    """A window cannot be cut: its image is missing or unreadable, or the window reaches past
    the image border and padding was not asked for."""


class WindowWarning(UserWarning):
    """Crops were cut, but some of them are padded past the border of their image."""


@dataclass(frozen=True)
class CropsResult:
    """What `cut_crops` wrote.

    Attributes:
        out_dir: the output folder.
        table_path: ``OUT/crops.csv`` (id, path, label, parent, [group,] x, y, w, h, padded,
            parent_image; paths relative to OUT).
        sidecar_path: ``OUT/crops.json``.
        n_crops, n_images: crops written and parent images read.
        padded: ids of the crops padded past their image's border.
    """

    out_dir: str
    table_path: str
    sidecar_path: str
    n_crops: int
    n_images: int
    padded: tuple[str, ...] = field(default=())

    @property
    def table(self) -> CropTable:
        """The written table, read back with its boxes and image paths."""
        return CropTable.from_csv(self.table_path, id="id", label="label", parent="parent", image="path", box="x,y,w,h")


def _columns(spec, n: int, what: str) -> list[str]:
    cols = [c.strip() for c in spec.split(",")] if isinstance(spec, str) else [str(c) for c in spec]
    if len(cols) != n or not all(cols):
        raise ShortcutlabError(f"{what} takes {n} column names; got {spec!r}")
    return cols


def _read_frame(table: str | os.PathLike | pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The rows of `table` (a CSV path or a DataFrame) and a description for messages."""
    if isinstance(table, pd.DataFrame):
        return table, "DataFrame"
    path = os.fspath(table)
    need_file(path, "table file", TableError)
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""]), path
    except pd.errors.EmptyDataError:
        raise TableError(f"table file {path!r} is empty") from None
    except UnicodeDecodeError:
        raise TableError(f"table file {path!r} is not UTF-8 text; save it as UTF-8") from None
    except pd.errors.ParserError as e:
        raise TableError(f"table file {path!r} is not a readable CSV file: {' '.join(str(e).split())}") from None


def _windows(frame: pd.DataFrame) -> np.ndarray:
    """(N, 4) int64 windows x0, y0, w, h from a crop table's float boxes (nearest pixel, halves
    up)."""
    boxes = frame[["x", "y", "w", "h"]].to_numpy(dtype=np.float64)
    return np.floor(boxes + 0.5).astype(np.int64)


def _read_windows(df: pd.DataFrame, source: str, parent_image: str, center_cols: list[str] | None, size,
                  box_cols: list[str] | None, roles: dict) -> tuple[pd.DataFrame, np.ndarray]:
    """The rows as a validated crop table (sorted by id; `CropTable` names a missing column or
    a coordinate that is not a number, with its row) and their (N, 4) windows x0, y0, w, h."""
    if parent_image not in df.columns:
        raise TableError(f"parent image column {parent_image!r} is missing from {source}; "
                         f"columns are: {', '.join(map(str, df.columns))}")
    try:
        crops = CropTable.from_frame(df, **roles, image=parent_image, box=box_cols, center=center_cols,
                                     crop_size=float(size) if size is not None else None, source=source)
    except TableError as e:
        if source in str(e):
            raise
        raise TableError(f"{source}: {e}") from None  # a value error names its column and row, here also the file
    frame = crops.frame
    win = _windows(frame)
    if center_cols:
        win[:, 2:] = int(size)
    _check_sizes(frame, win, source, box_cols)
    return frame, win


def _check_sizes(frame: pd.DataFrame, win: np.ndarray, source: str, box_cols: list[str] | None) -> None:
    small = (win[:, 2] < 1) | (win[:, 3] < 1)
    if small.any():
        k = int(np.flatnonzero(small)[0])
        raise TableError(f"{source}: crop {frame['id'].iat[k]!r} has a box of {frame['w'].iat[k]:g} x {frame['h'].iat[k]:g} px "
                         f"(box columns {', '.join(box_cols or [])}); expected a width and height of at least 1 pixel")


def _image_paths(frame: pd.DataFrame, root: str, column: str) -> list[str]:
    """The resolved path of each row's parent image, after checking each one is a file."""
    paths = [p if os.path.isabs(p) else os.path.join(root, p) for p in frame["image"].tolist()]
    seen: set[str] = set()
    for k, p in enumerate(paths):
        if p not in seen:
            seen.add(p)
            need_file(p, "parent image", WindowError, f" (column {column!r}, crop {frame['id'].iat[k]!r}; "
                      f"relative paths start from {root!r})")
    return paths


def read_parent(path: str) -> np.ndarray:
    """Pixels of one parent image: (H, W) for 8-bit and 16-bit grey, (H, W, 3) or (H, W, 4)
    for RGB(A); other 8-bit modes are converted to RGB.

    Raises:
        WindowError: the file cannot be decoded, or holds 32-bit or float pixels.
    """
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
            if im.mode in ("I", "F"):
                raise WindowError(f"parent image {path!r} has Pillow mode {im.mode!r} (32-bit or float pixels); "
                                  "expected an 8-bit or 16-bit image")
            if im.mode in ("L", "RGB", "RGBA", "I;16"):
                return np.asarray(im)
            return np.asarray(im.convert("RGB"))
    except WindowError:
        raise
    except Exception as e:  # Pillow raises many kinds for a file it cannot decode
        raise WindowError(f"parent image {path!r} cannot be read as an image: {' '.join(str(e).split()) or type(e).__name__}") from None


def _image_size(path: str) -> tuple[int, int]:
    """(width, height) of an image from its header, without decoding its pixels."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return im.size
    except Exception as e:  # Pillow raises many kinds for a file it cannot decode
        raise WindowError(f"parent image {path!r} cannot be read as an image: {' '.join(str(e).split()) or type(e).__name__}") from None


def _check_borders(frame: pd.DataFrame, paths: list[str], win: np.ndarray, border: str) -> None:
    """Refuse, before any crop is cut, a window wholly outside its image (in every mode) and,
    with ``border="refuse"``, a window that reaches past the border; each message names the
    first such crop, its window and image, and how many windows share the problem."""
    sizes = {p: _image_size(p) for p in dict.fromkeys(paths)}
    wh = np.array([sizes[p] for p in paths], dtype=np.int64).reshape(-1, 2)
    x0, y0, x1, y1 = win[:, 0], win[:, 1], win[:, 0] + win[:, 2], win[:, 1] + win[:, 3]
    outside = (x0 >= wh[:, 0]) | (y0 >= wh[:, 1]) | (x1 <= 0) | (y1 <= 0)
    past = (x0 < 0) | (y0 < 0) | (x1 > wh[:, 0]) | (y1 > wh[:, 1])
    for bad, what, how in ((outside, "lies wholly outside", "; check the coordinate columns"),
                           (past if border == "refuse" else np.zeros_like(past), "reaches past",
                            "; give --border constant, edge or reflect to pad it, or drop the crop")):
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            n = int(bad.sum()) - 1
            more = f" ({n} more window{'s do' if n > 1 else ' does'})" if n else ""
            raise WindowError(f"crop {frame['id'].iat[k]!r}: window x {x0[k]}..{x1[k] - 1}, y {y0[k]}..{y1[k] - 1} {what} "
                              f"the {wh[k, 0]} x {wh[k, 1]} px image {paths[k]!r}{more}{how}")


def cut_window(image: np.ndarray, x0: int, y0: int, w: int, h: int, border: str = "refuse", fill=0) -> np.ndarray:
    """The ``h x w`` window of `image` whose top-left pixel is ``(x0, y0)``.

    Equals ``numpy.pad(image, P, mode=border)[y0 + P : y0 + P + h, x0 + P : x0 + P + w]`` for
    any pad P large enough, without padding the whole image: only the rows and columns the
    window and its reflection need are padded.

    Args:
        image: (H, W) or (H, W, C) array.
        x0, y0: top-left corner of the window in image pixels (may be negative).
        w, h: window size in pixels (>= 1).
        border: "refuse" (a window past the border raises `ValueError`), or a `numpy.pad` mode:
            "constant" (with `fill`), "edge", "reflect".
        fill: the value of "constant" padding.

    Returns:
        (h, w) or (h, w, C) array of `image`'s dtype.
    """
    H, W = image.shape[:2]
    lo = [max(0, -y0), max(0, -x0)]
    hi = [max(0, y0 + h - H), max(0, x0 + w - W)]
    if any(lo) or any(hi):
        if border == "refuse":
            raise ValueError(f"window x {x0}..{x0 + w - 1}, y {y0}..{y0 + h - 1} reaches past the {W} x {H} px image")
        if x0 >= W or y0 >= H or x0 + w <= 0 or y0 + h <= 0:
            raise ValueError(f"window x {x0}..{x0 + w - 1}, y {y0}..{y0 + h - 1} lies wholly outside the {W} x {H} px image")
    # The source rows/columns: the window's part inside the image, extended on the side away
    # from a padded border far enough that reflection finds the same pixels as in the whole image.
    src = []
    for start, size, full, a, b in ((y0, h, H, lo[0], hi[0]), (x0, w, W, lo[1], hi[1])):
        s0 = 0 if a else max(0, min(start, full - b - 1) if b else start)
        s1 = min(full, max(start + size, a + 1)) if a else min(full, start + size)
        src.append((s0, s1))
    part = image[src[0][0]:src[0][1], src[1][0]:src[1][1]]
    if any(lo) or any(hi):
        pads = [(lo[0], hi[0]), (lo[1], hi[1])] + [(0, 0)] * (image.ndim - 2)
        kw = {"constant_values": fill} if border == "constant" else {}
        part = np.pad(part, pads, mode=border, **kw)
    oy, ox = y0 - (src[0][0] - lo[0]), x0 - (src[1][0] - lo[1])
    return part[oy:oy + h, ox:ox + w]


def _cut_all(frame: pd.DataFrame, paths: list[str], win: np.ndarray, border: str, fill, crops_dir: str,
             names: list[str], compress_level: int) -> np.ndarray:
    """Cut and write every window, reading each parent image once; (N,) bool: padded."""
    from PIL import Image

    padded = np.zeros(len(frame), dtype=bool)
    order = pd.Series(paths).groupby(pd.Series(paths), sort=False).indices
    for path, rows in order.items():
        image = read_parent(path)
        H, W = image.shape[:2]
        for k in rows:
            x0, y0, w, h = (int(v) for v in win[k])
            try:
                crop = cut_window(image, x0, y0, w, h, border, fill)
            except ValueError as e:
                how = "" if "wholly" in str(e) else "; give --border constant, edge or reflect to pad it, or drop the crop"
                raise WindowError(f"crop {frame['id'].iat[k]!r}: {e} {path!r}{how}") from None
            padded[k] = x0 < 0 or y0 < 0 or x0 + w > W or y0 + h > H
            Image.fromarray(np.ascontiguousarray(crop)).save(os.path.join(crops_dir, names[k]), compress_level=compress_level)
    return padded


def _check_args(size, border: str, fill, compress_level: int, center, box) -> None:
    if (center is None) == (box is None):
        raise ShortcutlabError("give the windows either as a centre and a size (center=, size=) or as a box (box=), one of them")
    if center is not None:
        if size is None:
            raise ShortcutlabError("a centre (--center X,Y) needs a window size (--size N)")
        if isinstance(size, bool) or not isinstance(size, (int, np.integer, float)) or not math.isfinite(size) \
                or size != int(size) or size <= 0:
            raise ShortcutlabError(f"window size must be a whole number of pixels > 0; got {size!r}")
    elif size is not None:
        raise ShortcutlabError("a window size (--size N) goes with a centre (--center X,Y), not with a box")
    if border not in BORDERS:
        raise ShortcutlabError(f"border must be one of {', '.join(BORDERS)}; got {border!r}")
    if not isinstance(fill, (int, float, np.number)) or isinstance(fill, bool) or not math.isfinite(fill):
        raise ShortcutlabError(f"fill must be a number (the value of constant padding); got {fill!r}")
    if not 0 <= int(compress_level) <= 9:
        raise ShortcutlabError(f"compress_level must be 0 .. 9; got {compress_level!r}")


def _refuse_working_directory(out: str) -> None:
    """The output folder is replaced whole (`io.atomic_dir`): it must not hold the working directory."""
    target, here = os.path.realpath(out), os.path.realpath(os.getcwd())
    if here == target or here.startswith(target.rstrip(os.sep) + os.sep):
        raise WindowError(f"output folder {out!r} holds the working directory, and the crops folder is replaced whole; "
                          "give another folder")


def _out_frame(frame: pd.DataFrame, win: np.ndarray, names: list[str], padded: np.ndarray) -> pd.DataFrame:
    out = pd.DataFrame({"id": frame["id"], "path": ["crops/" + n for n in names], "label": frame["label"],
                        "parent": frame["parent"]})
    if "group" in frame.columns:
        out["group"] = frame["group"]
    for j, c in enumerate(("x", "y", "w", "h")):
        out[c] = win[:, j]
    out["padded"] = padded
    out["parent_image"] = frame["image"]
    return out


def cut_crops(
    table: str | os.PathLike | pd.DataFrame,
    parent_image: str,
    out_dir: str | os.PathLike,
    *,
    center: str | Sequence[str] | None = None,
    size: int | None = None,
    box: str | Sequence[str] | None = None,
    border: Border = "refuse",
    fill: float = 0,
    id: str | Sequence[str] | None = "id",
    label: str = "label",
    parent: str = "parent",
    group: str | None = None,
    root: str | os.PathLike | None = None,
    compress_level: int = 1,
) -> CropsResult:
    """Cut one window per row of `table` from its parent image and write the crops and their table.

    Writes ``OUT/crops/<id>.png``, ``OUT/crops.csv`` (id, path relative to OUT, label, parent,
    [group,] x, y, w, h, padded, parent_image; sorted by id) and ``OUT/crops.json`` (the
    geometry, the border mode, the padded crops). The folder is built beside `out_dir` and
    swapped in whole; a folder holding files shortcutlab did not write there is refused, and
    a failure leaves the earlier output, or none.

    Args:
        table: a CSV file (or DataFrame), one row per crop.
        parent_image: the column of parent image paths (relative ones start from `root`).
        out_dir: the output folder.
        center: two columns ``cx, cy`` (a "cx,cy" string or a pair); with `size`.
        size: window side N in pixels (whole, > 0).
        box: four columns ``x, y, w, h`` instead of a centre and size.
        border: "refuse" a window past the image border, or pad it: "constant" (`fill`),
            "edge", "reflect" (`numpy.pad` modes).
        fill: value of constant padding.
        id, label, parent, group: the crop table's columns (as `CropTable.from_frame`).
        root: folder relative image paths start from (default: the table's folder; the working
            directory for a DataFrame).
        compress_level: zlib level of the PNGs, 0 .. 9.

    Returns:
        A `CropsResult`.

    Raises:
        TableError: a missing column, a coordinate that is not a finite number (naming the
            row), a box under one pixel, duplicate or empty ids (as `CropTable`).
        WindowError: a missing or unreadable parent image; a window past the border with
            ``border="refuse"``; a window wholly outside its image.
        ShortcutlabError: bad arguments (size <= 0, an unknown border mode).
        OutputError: `out_dir` cannot be written or holds files shortcutlab did not write.

    Warns:
        WindowWarning: some windows were padded (their ids are in the sidecar).
    """
    _check_args(size, border, fill, compress_level, center, box)
    df, source = _read_frame(table)
    center_cols = _columns(center, 2, "center (cx,cy)") if center is not None else None
    box_cols = _columns(box, 4, "box (x,y,w,h)") if box is not None else None
    frame, win = _read_windows(df, source, parent_image, center_cols, size, box_cols,
                               dict(id=id, label=label, parent=parent, group=group))
    if root is None:
        root = os.path.dirname(os.path.abspath(source)) if source != "DataFrame" else os.getcwd()
    paths = _image_paths(frame, os.fspath(root), parent_image)
    _check_borders(frame, paths, win, border)
    names = file_names(list(frame["id"]))
    out = os.fspath(out_dir)
    _refuse_working_directory(out)
    with atomic_dir(out, "crops", CROPS_FILES) as tmp:
        os.makedirs(os.path.join(tmp, "crops"))
        padded = _cut_all(frame, paths, win, border, fill, os.path.join(tmp, "crops"), names, int(compress_level))
        padded_ids = tuple(str(i) for i in frame["id"][padded])
        write_csv(os.path.join(tmp, "crops.csv"), _out_frame(frame, win, names, padded))
        write_json(os.path.join(tmp, "crops.json"), _sidecar(source, parent_image, center_cols, size, box_cols, border,
                                                             fill, frame, paths, padded_ids))
    if padded_ids:
        warnings.warn(f"{len(padded_ids)} of {len(frame)} windows reach past their image's border and were padded "
                      f"({border}), e.g. {list(padded_ids[:3])}; they are marked in crops.csv (padded) and listed in crops.json",
                      WindowWarning, stacklevel=2)
    return CropsResult(out, os.path.join(out, "crops.csv"), os.path.join(out, "crops.json"), len(frame),
                       len(set(paths)), padded_ids)


def _sidecar(source, parent_image, center_cols, size, box_cols, border, fill, frame, paths, padded_ids) -> dict:
    geometry = ({"center": center_cols, "size": int(size)} if center_cols else {"box": box_cols})
    return {
        "format": FORMAT,
        "table": source,
        "parent_image_column": parent_image,
        "geometry": geometry,
        "window_rule": "top-left = floor(cx - N/2 + 0.5), floor(cy - N/2 + 0.5)" if center_cols
        else "top-left = floor(x + 0.5), floor(y + 0.5); size = floor(w + 0.5) x floor(h + 0.5)",
        "border": border,
        "fill": fill if border == "constant" else None,
        "n_crops": int(len(frame)),
        "n_images": len(set(paths)),
        "n_padded": len(padded_ids),
        "padded": list(padded_ids),
    }
