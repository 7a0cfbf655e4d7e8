"""Reading one image file with Pillow: decoded, 16-bit grey scaled to 8 bits, deeper modes refused.

The one place that says how a crop file becomes 8-bit pixels. `images.load_crops` (crops as
tensors) and the sibling search (`siblings`, which hashes files without holding them) both read
through it. It needs only numpy and Pillow, so a path that reads images without training
(the sibling search) never imports torch.
"""

from __future__ import annotations

import numpy as np

from shortcutlab.errors import TableError

__all__ = ["GREY16_MODES", "grey16", "open_image", "read_crop", "read_grey", "refuse_deep"]

GREY16_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
"""Pillow modes of 16-bit grey images (PNG, TIFF): ``.convert("RGB")`` clips them at 255, so a
16-bit crop would load white. They are scaled instead (`grey16`)."""


def open_image(path: str, what: str, crop_id: str, error: type[Exception] = TableError):
    """Open and decode one image file (a Pillow image); a file Pillow cannot decode is a
    one-line `error` naming the file, the id and Pillow's reason."""
    import struct
    import zlib

    from PIL import Image

    try:
        im = Image.open(path)
        im.load()
        return im
    except (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error, Image.DecompressionBombError) as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        raise error(f"{what} {path!r} (id {crop_id!r}) cannot be read as an image: {reason}") from None


def grey16(im) -> np.ndarray | None:
    """(H, W) uint32 values in 0 .. 65535 of a 16-bit grey image, else None.

    Older Pillow versions open a 16-bit grey PNG as mode 'I' (32-bit); PNG has no deeper grey,
    so an 'I' image from a PNG is 16-bit.
    """
    if im.mode in GREY16_MODES or (im.mode == "I" and im.format == "PNG"):
        return np.asarray(im).astype(np.uint32)
    return None


def refuse_deep(im, path: str, what: str, crop_id: str, error: type[Exception] = TableError) -> None:
    """A one-line `error` for 32-bit integer, float or signed images (no 8-bit reading of them
    is safe to guess)."""
    if im.mode in ("I", "F") or im.mode.startswith("I;"):
        raise error(
            f"{what} {path!r} (id {crop_id!r}) has Pillow mode {im.mode!r} (32-bit integer, float or signed pixels); "
            "expected an 8-bit or 16-bit image"
        )


def _scaled16(v: np.ndarray) -> np.ndarray:
    """16-bit values -> 8-bit: value * 255 / 65535, rounded."""
    return ((v * 255 + 32767) // 65535).astype(np.uint8)


def read_crop(path: str, crop_id: str, error: type[Exception] = TableError) -> np.ndarray:
    """(H, W, 3) uint8 pixels of a crop; 16-bit grey is scaled by 255 / 65535 and rounded."""
    with open_image(path, "crop image", crop_id, error) as im:
        v = grey16(im)
        if v is not None:
            return np.repeat(_scaled16(v)[:, :, None], 3, axis=2)
        refuse_deep(im, path, "crop image", crop_id, error)
        return np.asarray(im.convert("RGB"))


def read_grey(path: str, crop_id: str, error: type[Exception] = TableError):
    """The crop as a Pillow 8-bit grey ('L') image: what ``imagehash`` hashes of `read_crop`'s
    pixels (``Image.fromarray(read_crop(...)).convert("L")``), without the array round trip.

    Pillow's RGB -> L is (R*19595 + G*38470 + B*7471 + 0x8000) >> 16, so a grey image repeated
    over three channels converts back to itself: a 16-bit grey crop gives its scaled values.
    """
    from PIL import Image

    with open_image(path, "crop image", crop_id, error) as im:
        v = grey16(im)
        if v is not None:
            return Image.fromarray(_scaled16(v))
        refuse_deep(im, path, "crop image", crop_id, error)
        if im.mode in ("L", "RGB"):  # L -> RGB -> L is the identity; RGB -> RGB a copy
            return im.convert("L")
        return im.convert("RGB").convert("L")
