"""One estimated cell mask per crop, with scikit-image: `shortcutlab masks`.

A released dataset often has crops but no cell masks, and the background interventions and
diagnostics need one per crop. `estimate_mask` makes one from the pixels of a single crop:

1. a stain channel: by default the optical density's distance from the background's
   (Beer-Lambert: OD = -log(I / I0), with I0 the crop's brightest light and the background OD
   the median over its lightest 30% of pixels; its colour counts more than its greyness,
   `COLOUR_WEIGHT`), after a Gaussian smoothing of `smooth` px;
2. a threshold (`METHODS`; the method is recorded): by default the lower of the two
   three-class Otsu thresholds, which separates background | cytoplasm | nucleus (a two-class
   Otsu threshold on a cytology crop falls between cytoplasm and nucleus and returns the
   nucleus);
3. the side of the threshold with more stain is the cell (cells absorb light, so their OD is
   higher than the background's, whatever their colour);
4. morphological clean-up: an opening with a disc of ``crop side / 64`` px (at least 1) and
   small objects removed (under 0.2% of the crop);
5. the connected component at the centre of the crop, or the one nearest to it, its holes
   filled;
6. cells touching it cut off: a watershed of the distance to the background, from maxima at
   least `SPLIT_DEPTH` px deep, keeps the region at or nearest the centre.

Each mask comes with quality fields (`QUALITY_COLUMNS`): the foreground share, whether it
touches the crop's border, how many components the clean-up left, and a degenerate flag
("empty": no foreground; "full": at least `FULL_SHARE` of the crop). A degenerate mask is a
`MaskWarning` and a record, not an error.

Example:
    >>> import numpy as np
    >>> from shortcutlab.ingest.masks import estimate_mask
    >>> yy, xx = np.mgrid[:32, :32]
    >>> img = np.full((32, 32, 3), 220, np.uint8)
    >>> img[(yy - 16) ** 2 + (xx - 16) ** 2 < 64] = 90      # a dark disc of radius 8
    >>> mask, q = estimate_mask(img)
    >>> bool(mask[16, 16]), bool(mask[0, 0]), q["n_components"], q["degenerate"]
    (True, False, 1, '')
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Sequence

import numpy as np
import pandas as pd

from shortcutlab.errors import ShortcutlabError, first_rows
from shortcutlab.paths import file_names, need_file

METHODS: tuple[str, ...] = ("multiotsu", "otsu", "li")
"""Threshold methods: ``multiotsu`` (lower of the three-class Otsu thresholds: background |
cytoplasm | nucleus; the default), ``otsu`` (two classes), ``li`` (minimum cross-entropy)."""
CHANNELS: tuple[str, ...] = ("od", "hematoxylin", "gray")
"""Channels: ``od`` (optical density's distance from the background's; the default),
``hematoxylin`` (the H channel of `skimage.color.rgb2hed`), ``gray`` (darkness, 1 - luminance)."""
QUALITY_COLUMNS: tuple[str, ...] = ("foreground_share", "touches_border", "n_components", "degenerate")
"""Per-crop quality columns of masks.csv."""
FULL_SHARE = 0.95
"""A mask covering at least this share of its crop is flagged "full" (no background found)."""
COLOUR_WEIGHT = 2.0
"""In the ``od`` channel the colour of the OD (its part off the grey axis) counts 1 + this
much: stains are coloured, while an uneven background (glass, mounting medium, lamp) changes
the OD of every channel nearly alike. On the synthetic benchmark with the ``background``
mechanism this raised the median IoU from about 0.88 to 0.91 (0.97 without it either way),
before `SPLIT_DEPTH` was added."""
SPLIT_DEPTH = 2.0
"""Touching cells are cut apart where the distance to the background has maxima at least this
many pixels (at 64 px crops) deep: on the benchmark this lifts the lower quartile of the IoU
with the background mechanism from about 0.66 to 0.81."""
BLANK_LEVELS = 8.0
"""A crop whose smoothed pixels span fewer 8-bit levels than this in every channel (from the
0.5th to the 99.5th percentile, so that a few noisy pixels do not count) is blank:
its mask is empty (a threshold would cut noise). Faint cytoplasm differs from the background
by 15 levels or more."""
#: what `write_masks` writes in its output folder (``name/``: a folder it owns whole)
MASKS_FILES = ("masks/", "masks.csv", "masks.json", "contact_sheet.png")
#: crop ids become file names: letters, digits, ``.``, ``_``, ``-``; not starting with ``.``


class MaskError(ShortcutlabError):
    """Bad input for mask estimation: an unknown method or channel, an image of the wrong
    shape, a table without its columns, an id that cannot be a file name."""


class MaskWarning(UserWarning):
    """Some estimated masks are degenerate (empty or full); they are flagged in masks.csv."""


# ---------------------------------------------------------------------- one crop
def _check_image(image) -> np.ndarray:
    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.shape[0] < 3 or arr.shape[1] < 3:
        raise MaskError(f"estimate_mask takes one (H, W, 3) RGB image with H, W >= 3; got shape {arr.shape}")
    if arr.dtype != np.uint8:
        raise MaskError(f"estimate_mask takes uint8 pixels (0 .. 255); got dtype {arr.dtype}")
    return arr


def _check_choice(value: str, valid: Sequence[str], what: str) -> str:
    if value not in valid:
        raise MaskError(f"unknown {what} {value!r}; expected one of: {', '.join(valid)}")
    return value


def stain_channel(image: np.ndarray, channel: str = "od", smooth: float = 1.0) -> np.ndarray:
    """(H, W) float64 map of how much stain each pixel holds (higher = more stain).

    Args:
        image: (H, W, 3) uint8 RGB crop.
        channel: one of `CHANNELS`.
        smooth: SD in pixels of the Gaussian applied first (0: none).
    """
    from skimage import color, filters

    image = _check_image(image)
    _check_choice(channel, CHANNELS, "channel")
    x = image.astype(np.float64)
    if channel == "od":
        i0 = np.maximum(np.percentile(x.reshape(-1, 3), 99, axis=0), 1.0)
        od = -np.log((x + 1.0) / (i0 + 1.0))
        if smooth > 0:
            od = filters.gaussian(od, sigma=smooth, channel_axis=2)
        total = od.sum(axis=2)
        d = od - np.median(od[total <= np.quantile(total, 0.3)], axis=0)  # OD above the background's
        grey = d.mean(axis=2, keepdims=True)  # the part every channel shares (a darker or lighter background)
        return np.linalg.norm(d + COLOUR_WEIGHT * (d - grey), axis=2)
    out = color.rgb2hed(image)[..., 0] if channel == "hematoxylin" else 1.0 - color.rgb2gray(image)
    return filters.gaussian(out, sigma=smooth) if smooth > 0 else out


def _threshold(values: np.ndarray, method: str) -> float:
    from skimage import filters

    if method == "multiotsu":
        return float(filters.threshold_multiotsu(values, classes=3)[0])
    return float(filters.threshold_otsu(values) if method == "otsu" else filters.threshold_li(values))


def _clean(fg: np.ndarray) -> np.ndarray:
    """Opening with a disc of crop side / 64 px (>= 1), then small objects (< 0.2% of the
    crop, at least 2 px) removed."""
    from scipy import ndimage
    from skimage import morphology

    radius = max(1, round(min(fg.shape) / 64))
    fg = ndimage.binary_opening(fg, structure=morphology.disk(radius))
    labels, n = ndimage.label(fg)
    if n:
        sizes = np.bincount(labels.ravel())
        small = sizes < max(2, math.ceil(0.002 * fg.size))
        small[0] = False
        fg[small[labels]] = False
    return fg


def _central_component(fg: np.ndarray) -> tuple[np.ndarray, int]:
    """The component of `fg` at the crop's centre, or nearest to it, holes filled; and the
    number of components."""
    from scipy import ndimage
    from skimage import measure

    labels, n = measure.label(fg, connectivity=2, return_num=True)
    if n == 0:
        return np.zeros(fg.shape, dtype=bool), 0
    return ndimage.binary_fill_holes(labels == _central_label(labels)), n


def _central_label(labels: np.ndarray) -> int:
    """The label (> 0) at the centre of `labels`, or of its labelled pixel nearest the centre."""
    h, w = labels.shape
    ys, xs = np.nonzero(labels)
    nearest = np.argmin((ys - (h - 1) / 2.0) ** 2 + (xs - (w - 1) / 2.0) ** 2)
    return int(labels[ys[nearest], xs[nearest]])


def _split_touching(mask: np.ndarray) -> np.ndarray:
    """The cell at the centre of `mask` cut from cells touching it: a watershed of the distance
    to the background from its maxima at least `SPLIT_DEPTH` (times side / 64) px deep; a
    single convex cell has one such maximum and is kept whole."""
    from scipy import ndimage
    from skimage import measure, morphology, segmentation

    if not mask.any():
        return mask
    dist = ndimage.distance_transform_edt(mask)
    markers = measure.label(morphology.h_maxima(dist, SPLIT_DEPTH * max(1.0, min(mask.shape) / 64)))
    if markers.max() < 2:
        return mask
    regions = segmentation.watershed(-dist, markers, mask=mask)
    return ndimage.binary_fill_holes(regions == _central_label(regions))


def mask_quality(mask: np.ndarray, n_components: int) -> dict:
    """The quality fields (`QUALITY_COLUMNS`) of a (H, W) bool mask."""
    share = float(mask.mean())
    border = bool(mask[0].any() or mask[-1].any() or mask[:, 0].any() or mask[:, -1].any())
    degenerate = "empty" if not mask.any() else "full" if share >= FULL_SHARE else ""
    return {"foreground_share": share, "touches_border": border, "n_components": int(n_components), "degenerate": degenerate}


def estimate_mask(image: np.ndarray, method: str = "multiotsu", channel: str = "od", *, smooth: float = 1.0) -> tuple[np.ndarray, dict]:
    """Estimate the mask of the cell at the centre of one crop.

    Args:
        image: (H, W, 3) uint8 RGB crop, the cell at its centre.
        method: threshold method, one of `METHODS`.
        channel: stain channel, one of `CHANNELS` (see `stain_channel`).
        smooth: SD in pixels of the Gaussian smoothing of the channel.

    Returns:
        (mask, quality): an (H, W) bool mask, and a dict with `QUALITY_COLUMNS` and the
        ``threshold`` used (NaN for a blank crop, whose mask is empty).

    Raises:
        MaskError: an image that is not (H, W, 3) uint8, an unknown method or channel.
    """
    from skimage import filters

    _check_choice(method, METHODS, "threshold method")
    values = stain_channel(image, channel, smooth)
    rgb = filters.gaussian(image.astype(np.float64), sigma=smooth, channel_axis=2) if smooth > 0 else image.astype(np.float64)
    lo, hi = np.percentile(rgb.reshape(-1, 3), [0.5, 99.5], axis=0)
    if float((hi - lo).max()) < BLANK_LEVELS:
        mask, n, t = np.zeros(values.shape, dtype=bool), 0, float("nan")
    else:
        t = _threshold(values, method)
        mask, n = _central_component(_clean(values > t))
        mask = _split_touching(mask)
    return mask, {**mask_quality(mask, n), "threshold": t}


# ---------------------------------------------------------------------- a table of crops
def read_mask_table(path: str, image: str = "path", id: str = "id", column: str = "mask") -> pd.DataFrame:
    """The crop table at `path` (all columns as text), checked for `write_masks`.

    Raises:
        MaskError: a missing or unreadable file; a missing image or id column; an empty,
            duplicate id; a column the output would add
            (`column`, `QUALITY_COLUMNS`) already there.
    """
    need_file(path, "crop table", MaskError)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise MaskError(f"crop table {path!r} is empty; expected a CSV file with a header row and one row per crop") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise MaskError(f"crop table {path!r} is not a readable UTF-8 CSV ({' '.join(str(e).split())})") from None
    cols = ", ".join(map(str, frame.columns))
    if frame.empty:
        raise MaskError(f"crop table {path!r} has a header ({cols}) but no rows; expected one row per crop")
    for flag, col in (("--image", image), ("--id", id)):
        if col not in frame.columns:
            raise MaskError(f"crop table {path!r} has no column {col!r} ({flag}); columns are: {cols}")
    for col in (column, *QUALITY_COLUMNS):
        if col in frame.columns:
            hint = " (--column NAME names the mask column)" if col == column else ""
            raise MaskError(f"crop table {path!r} already has a column {col!r}, which masks.csv adds{hint}; rename it")
    ids = frame[id]
    dup = ids.duplicated(keep=False).to_numpy()
    if dup.any():
        raise MaskError(f"crop table {path!r}, column {id!r}: ids must be unique; {first_rows(dup, ids.tolist())} repeat")
    empty = (frame[image].str.strip() == "").to_numpy()
    if empty.any():
        raise MaskError(f"crop table {path!r}, column {image!r}: no image path in {first_rows(empty, ids.tolist())}")
    return frame


def estimate_masks(images, method: str = "multiotsu", channel: str = "od",
                   smooth: float = 1.0) -> tuple[list[np.ndarray], pd.DataFrame]:
    """`estimate_mask` over several crops.

    Args:
        images: (H, W, 3) uint8 crops of any sizes, or one (N, 3, H, W) uint8 array or tensor
            (`load_crops(table).images`).
        method, channel, smooth: as `estimate_mask`.

    Returns:
        The (H, W) bool masks and a DataFrame of their quality fields (`QUALITY_COLUMNS` and
        ``threshold``), one row per crop.
    """
    _check_choice(method, METHODS, "threshold method")
    _check_choice(channel, CHANNELS, "channel")
    if hasattr(images, "ndim") and images.ndim == 4:
        images = np.asarray(images).transpose(0, 2, 3, 1)
    masks, rows = [], []
    for img in images:
        m, q = estimate_mask(img, method, channel, smooth=smooth)
        masks.append(m)
        rows.append(q)
    return masks, pd.DataFrame(rows, columns=[*QUALITY_COLUMNS, "threshold"])


def _image_paths(frame: pd.DataFrame, image: str, id: str, table: str) -> list[str]:
    """Absolute image paths of the rows (relative ones are relative to the table's folder)."""
    from shortcutlab.paths import wrong_kind

    root = os.path.dirname(os.path.abspath(table))
    out = []
    for r, (p, i) in enumerate(zip(frame[image], frame[id])):
        full = p if os.path.isabs(p) else os.path.join(root, p)
        why = wrong_kind(full, "file")
        if why:
            raise MaskError(f"crop table {table!r}: row {r}, column {image!r} (id {i!r}): crop image {full!r} {why}")
        out.append(os.path.abspath(full))
    return out


def _relative(path: str, folder: str) -> str:
    try:
        return os.path.relpath(path, os.path.abspath(folder)).replace(os.sep, "/")
    except ValueError:  # another drive (Windows)
        return path


def rebase_paths(frame: pd.DataFrame, table: str, out: str, image: str) -> pd.DataFrame:
    """A copy of `frame` whose relative file paths, relative to the folder of `table`, are
    made relative to the folder `out` instead: those of the `image` column, and of every other
    column whose every value names an existing file there (a mask or all-cells-mask column of
    a benchmark's manifest). Absolute paths are kept."""
    root = os.path.dirname(os.path.abspath(table))
    new = frame.copy()
    for col in frame.columns:
        values = frame[col].tolist()
        if col != image and not (values and all(v and os.path.isfile(os.path.join(root, v)) for v in values)):
            continue
        new[col] = [v if os.path.isabs(v) else _relative(os.path.join(root, v), out) for v in values]
    return new


def contact_sheet(images: Sequence[np.ndarray], masks: Sequence[np.ndarray], labels: Sequence[str], *,
                  tile: int = 96, columns: int = 6) -> np.ndarray:
    """(H, W, 3) uint8 sheet of crops with their mask outlines in red, for a person to check.

    Each crop is scaled to `tile` px (nearest neighbour) with its label under it; a crop whose
    mask is empty gets a yellow frame instead.
    """
    from PIL import Image, ImageDraw
    from skimage.segmentation import find_boundaries

    n = max(len(images), 1)
    rows = math.ceil(n / columns)
    cols = min(columns, n)
    sheet = Image.new("RGB", (cols * (tile + 4) + 4, rows * (tile + 18) + 4), "white")
    draw = ImageDraw.Draw(sheet)
    for k, (img, m, lab) in enumerate(zip(images, masks, labels)):
        big = np.asarray(Image.fromarray(img).resize((tile, tile), Image.NEAREST)).copy()
        mb = np.asarray(Image.fromarray(m.astype(np.uint8) * 255).resize((tile, tile), Image.NEAREST)) > 127
        if mb.any():
            big[find_boundaries(mb, mode="inner")] = (255, 0, 0)
        else:
            big[[0, 1, -2, -1], :] = (255, 220, 0)
            big[:, [0, 1, -2, -1]] = (255, 220, 0)
        x, y = 4 + (k % columns) * (tile + 4), 4 + (k // columns) * (tile + 18)
        sheet.paste(Image.fromarray(big), (x, y))
        draw.text((x, y + tile + 2), str(lab)[: tile // 6], fill="black")
    return np.asarray(sheet)


def _save_png(path: str, array: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(array).save(path, format="PNG", compress_level=6)


def _estimate_rows(frame: pd.DataFrame, paths: list[str], image: str, id: str, folder: str, method: str, channel: str,
                   smooth: float, n_sheet: int) -> tuple[pd.DataFrame, list[tuple]]:
    """Estimate and write (into `folder`/masks) the mask of every row; return the quality
    table and the first `n_sheet` (image, mask, id) for the contact sheet."""
    from shortcutlab.data.images import read_crop
    from shortcutlab.errors import TableError

    os.makedirs(os.path.join(folder, "masks"))
    rows, shown = [], []
    for r, (path, crop_id, name) in enumerate(zip(paths, frame[id], file_names(frame[id]))):
        try:
            img = read_crop(path, crop_id)
        except TableError as e:
            raise MaskError(f"row {r}, column {image!r}: {e}") from None
        mask, q = estimate_mask(img, method, channel, smooth=smooth)
        _save_png(os.path.join(folder, "masks", name), mask.astype(np.uint8) * np.uint8(255))
        rows.append(q)
        if len(shown) < n_sheet:
            shown.append((img, mask, crop_id))
    return pd.DataFrame(rows, columns=[*QUALITY_COLUMNS, "threshold"]), shown


def _summary(quality: pd.DataFrame, ids: pd.Series, *, table: str, image: str, id: str, column: str,
             method: str, channel: str, smooth: float, n_sheet: int) -> dict:
    from shortcutlab.version import __version__

    flag = quality["degenerate"]
    return {
        "generator": f"shortcutlab {__version__}",
        "table": os.path.abspath(table),
        "columns": {"id": id, "image": image, "mask": column},
        "method": method,
        "channel": channel,
        "smooth_px": smooth,
        "full_share": FULL_SHARE,
        "steps": "stain channel, Gaussian smoothing, threshold (cell: the side with more stain), opening with a disc of "
                 "side/64 px, objects under 0.2% of the crop removed, component at or nearest the centre, holes filled, "
                 "touching cells cut off by a distance watershed",
        "counts": {
            "crops": int(len(quality)),
            "empty": int((flag == "empty").sum()),
            "full": int((flag == "full").sum()),
            "touches_border": int(quality["touches_border"].sum()),
            "several_components": int((quality["n_components"] > 1).sum()),
        },
        "degenerate_ids": ids[(flag != "").to_numpy()].tolist(),
        "median_foreground_share": float(quality["foreground_share"].median()) if len(quality) else None,
        "contact_sheet": f"the first {n_sheet} crops with their mask outlines (red; a yellow frame: empty mask)",
        "paths": "image and mask paths in masks.csv are relative to the folder holding masks.csv",
    }


def write_masks(table: str, out: str, *, image: str = "path", id: str = "id", column: str = "mask",
                method: str = "multiotsu", channel: str = "od", smooth: float = 1.0, n_sheet: int = 24) -> dict:
    """Estimate one mask per crop of a table and write them with the table, a summary and a
    contact sheet.

    Layout of `out`: ``masks/<name>.png`` (8-bit, 0 or 255; the name is `shortcutlab.paths.file_names` of the id), ``masks.csv`` (the input table with
    its file paths made relative to `out` (`rebase_paths`), plus `column` = ``masks/<name>.png`` and
    `QUALITY_COLUMNS`), ``masks.json`` (the method, channel and counts) and
    ``contact_sheet.png``. The folder is built beside `out` and swapped in when complete
    (`io.atomic_dir`); a folder holding files shortcutlab did not write there is refused.
    masks.csv loads with ``CropTable.from_csv(..., image=IMAGE, mask=COLUMN)`` and `load_crops`.

    Degenerate masks (empty, full) are a `MaskWarning` naming how many and the first ids, and
    the ``degenerate`` column.

    Returns:
        The summary written to masks.json.

    Raises:
        MaskError: see `read_mask_table`; an unknown method or channel; a crop image that is
            missing or cannot be decoded (naming the row, column, file and id).
        OutputError: `out` cannot be written or holds files shortcutlab did not write.

    Example:
        >>> write_masks("crops.csv", "masks_out", image="path")    # doctest: +SKIP
    """
    from shortcutlab.io import atomic_dir, to_json

    _check_choice(method, METHODS, "threshold method")
    _check_choice(channel, CHANNELS, "channel")
    if not (isinstance(smooth, (int, float)) and math.isfinite(smooth) and smooth >= 0):
        raise MaskError(f"smooth (--smooth) must be a finite number of pixels >= 0; got {smooth!r}")
    if n_sheet < 0:
        raise MaskError(f"the contact sheet (--sheet) takes a number of crops >= 0; got {n_sheet}")
    target, here = os.path.realpath(out), os.path.realpath(os.getcwd())
    if here == target or here.startswith(target.rstrip(os.sep) + os.sep):
        raise MaskError(f"output folder {out!r} holds the working directory, and the folder is replaced whole; choose a subfolder")
    frame = read_mask_table(table, image, id, column)
    paths = _image_paths(frame, image, id, table)
    with atomic_dir(out, "masks", MASKS_FILES) as tmp:
        quality, shown = _estimate_rows(frame, paths, image, id, tmp, method, channel, smooth, n_sheet)
        written = rebase_paths(frame, table, out, image)
        written[column] = [f"masks/{name}" for name in file_names(frame[id])]
        for col in QUALITY_COLUMNS:
            written[col] = quality[col].to_numpy()
        written["foreground_share"] = written["foreground_share"].round(6)
        written.to_csv(os.path.join(tmp, "masks.csv"), index=False, lineterminator="\n")
        summary = _summary(quality, frame[id], table=table, image=image, id=id, column=column, method=method,
                           channel=channel, smooth=smooth, n_sheet=len(shown))
        with open(os.path.join(tmp, "masks.json"), "w", encoding="utf-8") as f:
            f.write(to_json(summary))
        _save_png(os.path.join(tmp, "contact_sheet.png"), contact_sheet(*zip(*shown)) if shown else np.full((8, 8, 3), 255, np.uint8))
    _warn_degenerate(summary)
    return summary


def _warn_degenerate(summary: dict) -> None:
    c, ids = summary["counts"], summary["degenerate_ids"]
    if ids:
        warnings.warn(MaskWarning(
            f"{len(ids)} of {c['crops']} masks are degenerate ({c['empty']} empty, {c['full']} full; ids "
            f"{', '.join(map(repr, ids[:5]))}{' ...' if len(ids) > 5 else ''}); they are flagged in masks.csv, "
            "column degenerate: check them on the contact sheet"), stacklevel=3)
