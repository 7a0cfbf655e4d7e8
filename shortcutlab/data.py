"""Load the crops of a crop table into memory as tensors.

Crops are small (tens of pixels) and datasets in this field hold thousands to tens of
thousands of them, so the whole set is held as one uint8 tensor: training then draws batches
with tensor indexing instead of per-item file reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from .errors import TableError
from .table import CropTable


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


def load_crops(table: CropTable, root: str | None = None) -> CropImages:
    """Read every crop (and mask) of `table` with PIL.

    Args:
        table: a table with an image column (and optionally a mask column).
        root: folder that relative paths are relative to (default: the folder of the table's
            CSV, or the working directory for a DataFrame).

    Raises:
        TableError: no image column, a missing file, or crops of different sizes.
    """
    from PIL import Image

    if not table.has_images:
        raise TableError("loading crops needs an image column (--image COL)")
    if root is None:
        root = os.path.dirname(os.path.abspath(table.source)) if os.path.exists(table.source) else os.getcwd()
    paths = table.frame["image"].tolist()
    mask_paths = table.frame["mask"].tolist() if "mask" in table.frame.columns else None
    first_shape = None
    imgs = None
    masks = None
    for i, p in enumerate(paths):
        full = _resolve(p, root)
        if not os.path.exists(full):
            raise TableError(f"crop image {full!r} (row {i}, id {table.ids[i]!r}) does not exist")
        arr = np.asarray(Image.open(full).convert("RGB"))
        if first_shape is None:
            first_shape = arr.shape
            imgs = np.empty((len(paths), 3, arr.shape[0], arr.shape[1]), dtype=np.uint8)
            if mask_paths is not None:
                masks = np.empty((len(paths), 1, arr.shape[0], arr.shape[1]), dtype=bool)
        elif arr.shape != first_shape:
            raise TableError(
                f"crops must all have one size; {full!r} (id {table.ids[i]!r}) is {arr.shape[1]} x {arr.shape[0]} "
                f"but the first crop is {first_shape[1]} x {first_shape[0]}; resize them first"
            )
        imgs[i] = arr.transpose(2, 0, 1)
        if mask_paths is not None:
            mfull = _resolve(mask_paths[i], root)
            if not os.path.exists(mfull):
                raise TableError(f"mask {mfull!r} (row {i}, id {table.ids[i]!r}) does not exist")
            m = np.asarray(Image.open(mfull).convert("L"))
            if m.shape != first_shape[:2]:
                raise TableError(f"mask {mfull!r} is {m.shape[1]} x {m.shape[0]}, its crop is {first_shape[1]} x {first_shape[0]}")
            masks[i, 0] = m > 127
    return CropImages(torch.from_numpy(imgs), None if masks is None else torch.from_numpy(masks), table)
