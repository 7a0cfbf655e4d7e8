"""Load the crops of a crop table into memory as tensors (and read a crop manifest's table).

Crops are small (tens of pixels) and datasets in this field hold thousands to tens of
thousands of them, so the whole set is held as one uint8 tensor: training then draws batches
with tensor indexing instead of per-item file reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from shortcutlab.errors import ShortcutlabError, TableError
from shortcutlab.paths import wrong_kind
from shortcutlab.data.image_files import grey16, open_image, read_crop, refuse_deep
from shortcutlab.data.table import CropTable

__all__ = ["CropImages", "load_crops", "load_manifest_table", "read_crop"]  # read_crop: shortcutlab.data.image_files


@dataclass(frozen=True, eq=False)
class CropImages:
    """Crops of a table, aligned with its (id-sorted) rows.

    Attributes:
        images: (N, 3, H, W) uint8 tensor.
        masks: (N, 1, H, W) bool tensor, or None when the table has no mask column.
        table: the table the rows follow.
    """

    images: torch.Tensor
    masks: torch.Tensor | None
    table: CropTable

    def float_batch(self, index: torch.Tensor, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor | None]:
        """Crops `index` as float32 in [0, 1] on `device`, with their masks (float 0/1)."""
        x = self.images[index].to(device=device, dtype=torch.float32).div_(255.0)
        m = None if self.masks is None else self.masks[index].to(device=device, dtype=torch.float32)
        return x, m


def _resolve(path: str, root: str) -> str:
    return path if os.path.isabs(path) else os.path.join(root, path)


def _read_mask(path: str, crop_id: str) -> np.ndarray:
    """(H, W) bool mask: foreground where the value is above half the scale (127 of 255)."""
    with open_image(path, "mask", crop_id) as im:
        v = grey16(im)
        if v is not None:
            full, top = 65535, int(v.max(initial=0))
            m = v * 2 > full
        else:
            refuse_deep(im, path, "mask", crop_id)
            g = np.asarray(im.convert("L"))
            full, top = 255, int(g.max(initial=0))
            m = g > 127
    if 0 < top and not m.any():
        # A label image (0/1) would otherwise give an empty mask, and then an erased crop.
        raise TableError(
            f"mask {path!r} (id {crop_id!r}) holds values up to {top} of {full} and so no foreground; "
            f"masks are foreground above half the scale: save them as 0 and {full}"
        )
    return m


def load_crops(table: CropTable, root: str | None = None) -> CropImages:
    """Read every crop (and mask) of `table` with Pillow.

    Crops are held as 8-bit RGB. 8-bit files of any Pillow mode are converted to RGB; 16-bit
    grey files (PNG, TIFF) are scaled to 8 bits (value * 255 / 65535, rounded) and repeated over
    the three channels; for 16-bit RGB(A) PNGs Pillow keeps the high byte of each sample, which
    is within one 8-bit level of exact scaling. Masks are foreground where their value is above
    half the scale (127 for 8-bit files, 32767 for 16-bit). 32-bit and float images are refused.

    Args:
        table: a table with an image column (and optionally a mask column).
        root: folder that relative paths are relative to (default: the folder of the table's
            CSV, or the working directory for a DataFrame).

    Raises:
        TableError: no image column; a file that is missing or cannot be decoded (corrupt,
            truncated, not an image), 32-bit or float pixels, crops of different sizes, a mask
            of another size than its crop, or a mask with values but none above half the
            scale (a 0/1 label image). Each names the file and the crop id.
    """
    if not table.has_images:
        raise TableError("loading crops needs an image column (--image COL)")
    if root is None:
        root = os.path.dirname(os.path.abspath(table.source)) if os.path.exists(table.source) else os.getcwd()
    paths = table.frame["image"].tolist()
    mask_paths = table.frame["mask"].tolist() if "mask" in table.frame.columns else None
    ids = table.ids
    first_shape = None
    imgs = None
    masks = None
    for i, p in enumerate(paths):
        full = _resolve(p, root)
        if not os.path.isfile(full):
            raise TableError(f"crop image {full!r} (id {ids[i]!r}) {wrong_kind(full, 'file')}")
        arr = read_crop(full, ids[i])
        if first_shape is None:
            first_shape = arr.shape
            imgs = np.empty((len(paths), 3, arr.shape[0], arr.shape[1]), dtype=np.uint8)
            if mask_paths is not None:
                masks = np.empty((len(paths), 1, arr.shape[0], arr.shape[1]), dtype=bool)
        elif arr.shape != first_shape:
            raise TableError(
                f"crops must all have one size; {full!r} (id {ids[i]!r}) is {arr.shape[1]} x {arr.shape[0]} "
                f"but the first crop is {first_shape[1]} x {first_shape[0]}; resize them first"
            )
        imgs[i] = arr.transpose(2, 0, 1)
        if mask_paths is not None:
            mfull = _resolve(mask_paths[i], root)
            if not os.path.isfile(mfull):
                raise TableError(f"mask {mfull!r} (id {ids[i]!r}) {wrong_kind(mfull, 'file')}")
            m = _read_mask(mfull, ids[i])
            if m.shape != first_shape[:2]:
                raise TableError(
                    f"mask {mfull!r} (id {ids[i]!r}) is {m.shape[1]} x {m.shape[0]}, "
                    f"its crop is {first_shape[1]} x {first_shape[0]}"
                )
            masks[i, 0] = m
    return CropImages(torch.from_numpy(imgs), None if masks is None else torch.from_numpy(masks), table)


def load_manifest_table(path: str, id: str = "id", label: str = "label", parent: str = "parent", image: str = "path",
                        mask: str | None = "mask") -> CropTable:
    """Read a crop manifest (as written by `shortcutlab synth`): id, path, [mask], label, parent.

    The mask column is used when the file has it and ignored otherwise, so one call reads
    manifests with and without masks; `load_crops` then reads the images.

    Args:
        path: the crop manifest CSV.
        id, label, parent, image, mask: its column names.

    Raises:
        ShortcutlabError: a missing or empty file; the table reader's errors (`CropTable.from_csv`)
            for missing columns or bad values.

    Example:
        >>> crops = load_crops(load_manifest_table("bench/manifest.csv"))   # doctest: +SKIP
    """
    import pandas as pd

    from shortcutlab.paths import need_file

    need_file(path, "crop manifest")
    try:
        cols = pd.read_csv(path, nrows=0).columns
    except pd.errors.EmptyDataError:
        raise ShortcutlabError(f"crop manifest {path!r} is empty; expected a CSV file with a header row "
                               f"({id}, {image}, {label}, {parent}[, {mask}]) and one row per crop") from None
    except (ValueError, UnicodeDecodeError, OSError):
        cols = ()  # the table reader below names the problem
    return CropTable.from_csv(path, id=id, label=label, parent=parent, image=image, mask=mask if mask in cols else None)
