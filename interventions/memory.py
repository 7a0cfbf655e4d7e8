"""New output tensors for the interventions, backed by huge pages where the system allows.

Every intervention returns a new tensor, so a call at 224 x 224 px writes about 600 KB a crop
into memory that was never touched: on Linux that memory is mapped fresh and the kernel
supplies it one 4 KB page (one page fault) at a time. On the shared 2-core machine of issue 25
that cost 390 us a crop (64 crops copied into a new tensor: 449 us a crop, into an existing
one: 58 us), more than the arithmetic of HED jitter itself. Transparent huge pages supply
2 MB at a time (84-112 us a crop for the same copy); where the system's setting is
``madvise`` (a common default, and this machine's) they are only used for memory marked with
``madvise(MADV_HUGEPAGE)``, which is what `new_output` does before anything is written.

The hint only changes how the kernel backs the memory, never its contents; it is given on
Linux for CPU tensors of at least `MIN_HINT_BYTES`, and anything else (another system, no
libc, a kernel that refuses) simply returns the plain tensor.

Example:
    >>> import torch
    >>> y = new_output((2, 3, 8, 8), torch.float32, torch.device("cpu"))
    >>> tuple(y.shape), y.dtype
    ((2, 3, 8, 8), torch.float32)
"""

from __future__ import annotations

import functools
import sys
from typing import Sequence

import torch

HUGE_PAGE = 1 << 21  # bytes: x86-64 and arm64 transparent huge pages
MIN_HINT_BYTES = 2 * HUGE_PAGE  # smaller tensors reuse the allocator's memory anyway
_MADV_HUGEPAGE = 14  # linux/mman.h


@functools.lru_cache(maxsize=1)
def _madvise():
    """libc's madvise, or None where there is none to call (not Linux, no libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def hint_huge_pages(t: torch.Tensor) -> None:
    """Ask the kernel to back t's not yet touched memory with huge pages (the whole 2 MB pages
    inside it); does nothing for small or non-CPU tensors, or where the hint is unavailable."""
    nbytes = t.numel() * t.element_size()
    if t.device.type != "cpu" or nbytes < MIN_HINT_BYTES:
        return
    madvise = _madvise()
    if madvise is None:
        return
    start = t.data_ptr()
    lo = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    hi = (start + nbytes) & ~(HUGE_PAGE - 1)
    if hi > lo:
        madvise(lo, hi - lo, _MADV_HUGEPAGE)  # a refusal (setting "never") leaves plain pages


def new_output(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An uninitialised contiguous tensor for an intervention's output (see the module docstring).

    Args:
        shape: its shape, e.g. (B, 3, H, W).
        dtype, device: its dtype and device.

    Returns:
        torch.empty(shape) with the huge-page hint given where it applies.
    """
    t = torch.empty(tuple(shape), dtype=dtype, device=device)
    hint_huge_pages(t)
    return t


class Workspace:
    """Named scratch buffers that the chunks of one batched call reuse (`take`).

    A CPU chunk's large intermediates (a few MB each) are freshly allocated memory every time
    when each chunk allocates its own: the allocator hands such blocks back to the kernel, and
    the next chunk page-faults (and the kernel zeroes) them anew, which at 224 x 224 px costs
    about as much as the arithmetic of a stain normalisation or an illumination flattening.
    Taking them from one workspace per call keeps them mapped. Buffers are made on first use,
    with the huge-page hint of `new_output`, and grown when a larger one is wanted.

    Example:
        >>> import torch
        >>> work = Workspace()
        >>> a = work.take("d", (2, 3), torch.float32, "cpu")
        >>> b = work.take("d", (1, 3), torch.float32, "cpu")  # the first row of the same buffer
        >>> a.data_ptr() == b.data_ptr()
        True
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """An uninitialised contiguous (shape) tensor: the leading rows of the buffer `name`
        (made, or made anew, when it has fewer rows, other trailing dimensions, dtype or device)."""
        shape = tuple(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.shape[1:] != shape[1:] or buf.shape[0] < shape[0] or buf.dtype != dtype or buf.device != torch.device(device):
            buf = self._buffers[name] = new_output(shape, dtype, device)
        return buf[: shape[0]]
