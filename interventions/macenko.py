"""Macenko stain normalisation (Macenko et al. 2009), batched (the paper's F6).

Per image, with x in [0, 1] and torchstain's conventions (its ``Io=240`` on the 0-255 scale):

1. optical density OD = -ln((x + 1/255) / Io), Io = 240/255 by default. On 8-bit input
   x = I/255 this is torchstain's -ln((I + 1) / 240) exactly; the 1/255 offset keeps the log
   finite;
2. tissue pixels: every OD channel >= beta (0.15), inside the cell mask when one is given
   (mask >= 0.5);
3. the plane of the two largest eigenvectors of the tissue OD covariance; the angle of every
   tissue pixel in it, phi = atan2(OD . v_1, OD . v_2) (v_1 the largest);
4. stain vectors at the robust extreme angles, the alpha-th and (100 - alpha)-th percentiles
   (alpha = 1; linear interpolation, as numpy), haematoxylin first (the one with the larger red
   OD): the (3, 2) stain matrix HE;
5. concentrations C = pinv(HE) OD for every pixel (least squares), and their 99th percentiles
   maxC (over all pixels, or the cell pixels with a mask);
6. the normalised image Io exp(-HE_ref (C * maxC_ref / maxC)) - 1/255, clamped to [0, 1], with
   the reference HE_ref and maxC_ref (torchstain's defaults, or `StainNormalize.fit` on target
   images).

torchstain returns Io exp(...) without taking the 1/255 offset back and truncates to uint8, so
on the same 8-bit input its output is 0 to 1/255 above this one's (its torch backend takes
nearest-rank percentiles, which moves a few pixels by up to another 0.5/255).

Batched: every step is a tensor operation over (B, 3, H*W) with per-image reductions (masked
sums and 3 x 3 covariances by batched products, `torch.linalg.eigh` on (B, 3, 3), percentiles
from `topk` over the 1% tail of each row, or on CPU for crops of 128 x 128 px and more numpy's
per-row partition, least squares by a batched 2 x 2 solve); OD is never materialised (all
steps are affine in ln(x + 1/255)), and steps 5-6 fold into one 3 x 3 map of ln(x + 1/255) per
image, so the output costs a batched product and an exp. On CPU the batch goes in chunks of
about 256K pixels per thread, whose large intermediates reuse one set of buffers, so that they
stay in cache and are not page-faulted in anew for every chunk.

Not applicable: a crop with fewer than `min_tissue_pixels` tissue pixels (a background-only
crop, say), or whose estimate degenerates (both stain vectors equal, non-finite values), is
returned unchanged and flagged: `StainNormalize.last_applicable` holds the (B,) flags of the
last call and ``stain_normalize(..., return_applicable=True)`` returns them; each call warns
once with their count (`InterventionWarning`).

Example:
    >>> import torch
    >>> x = torch.full((1, 3, 16, 16), 0.97)  # background only
    >>> y, ok = stain_normalize(x, return_applicable=True)
    >>> bool(ok[0]), bool(torch.equal(y, x))
    (False, True)
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, Sequence

import numpy as np
import torch

from .base import Intervention, InterventionError, check_image, check_mask, warn_not_applicable
from .memory import new_output
from .registry import register

# torchstain's (and Macenko's reference implementation's) defaults: columns H, E over R, G, B.
REFERENCE_STAIN_MATRIX = np.array([[0.5626, 0.2159], [0.7201, 0.8012], [0.4062, 0.5581]])
REFERENCE_MAX_CONC = np.array([1.9705, 1.0308])
DEFAULT_IO = 240.0 / 255.0
OD_OFFSET = 1.0 / 255.0
_LN2 = math.log(2.0)
_CPU_CHUNK_PIXELS = 1 << 18  # pixels per CPU chunk and thread: intermediates stay in cache (1 << 17 cost 10-20% more CPU at 64 and 224 px, 1 << 19 more at 64 px)
_NUMPY_SELECT_MIN = 1 << 14  # row length from which numpy's per-row partition beats torch's topk on CPU


class StainEstimate(NamedTuple):
    """Per-image Macenko estimate.

    Attributes:
        stain_matrix: (B, 3, 2) unit OD vectors of haematoxylin and eosin (columns).
        max_conc: (B, 2) 99th-percentile concentrations (natural-log OD units).
        applicable: (B,) bool, False where the estimate could not be made.
        n_tissue: (B,) number of tissue pixels used.
    """

    stain_matrix: torch.Tensor
    max_conc: torch.Tensor
    applicable: torch.Tensor
    n_tissue: torch.Tensor


def _check_settings(Io: float, alpha: float, beta: float, min_tissue_pixels: int) -> tuple[float, float, float, int]:
    if not (isinstance(Io, (int, float)) and 0.0 < Io <= 1.0 + 1e-9):
        raise InterventionError(f"stain_normalize Io (transmitted light on the [0, 1] scale, torchstain's Io / 255) must lie in (0, 1]; got {Io!r}")
    if not (isinstance(alpha, (int, float)) and 0.0 <= alpha < 50.0):
        raise InterventionError(f"stain_normalize alpha (the extreme-angle percentile) must lie in [0, 50); got {alpha!r}")
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta >= 0.0):
        raise InterventionError(f"stain_normalize beta (the tissue OD threshold) must be a number >= 0; got {beta!r}")
    if not (isinstance(min_tissue_pixels, (int, np.integer)) and min_tissue_pixels >= 3):
        raise InterventionError(f"stain_normalize min_tissue_pixels must be an integer >= 3; got {min_tissue_pixels!r}")
    return float(Io), float(alpha), float(beta), int(min_tissue_pixels)


def _check_reference(stain_matrix, max_conc) -> tuple[np.ndarray, np.ndarray]:
    HE = np.asarray(REFERENCE_STAIN_MATRIX if stain_matrix is None else torch.as_tensor(stain_matrix).detach().cpu().numpy(), dtype=np.float64)
    mc = np.asarray(REFERENCE_MAX_CONC if max_conc is None else torch.as_tensor(max_conc).detach().cpu().numpy(), dtype=np.float64)
    if HE.shape != (3, 2) or not np.isfinite(HE).all():
        raise InterventionError(f"stain_matrix must be a finite (3, 2) matrix, columns the H and E OD vectors over R, G, B; got shape {HE.shape}")
    if mc.shape != (2,) or not (np.isfinite(mc).all() and (mc > 0).all()):
        raise InterventionError(f"max_conc must hold 2 positive numbers (H, E); got {mc.tolist()}")
    return HE, mc


def _tail_values(v: torch.Tensor, valid: torch.Tensor | None, rank: torch.Tensor, largest: bool) -> torch.Tensor:
    """Values at 0-based positions `rank` (R, m) of every row of v (R, N), counted over the valid
    entries from the largest (or smallest) end.

    On CPU, for rows of at least `_NUMPY_SELECT_MIN` pixels, numpy's `partition` (introselect)
    per row finds exactly these order statistics in a fifth of the time of torch's `topk` over
    a 224 x 224 crop's 1% tail (70 vs 300 us a row); shorter rows (64 x 64 crops: 4096) are
    faster with one `topk` over the rows, k = max(rank) + 1, as on other devices. (Cutting the rows first with a
    subsample threshold and sorting only the kept values was tried: on CPU the gather costs
    about what it saves for 64 x 64 crops.)
    """
    if v.device.type == "cpu" and v.shape[1] >= _NUMPY_SELECT_MIN:
        return _order_statistics_numpy(v, valid, rank, largest)
    vv = v if valid is None else torch.where(valid, v, -math.inf if largest else math.inf)
    return torch.topk(vv, int(rank.max()) + 1, dim=-1, largest=largest, sorted=True).values.gather(1, rank)


def _order_statistics_numpy(v: torch.Tensor, valid: torch.Tensor | None, rank: torch.Tensor, largest: bool) -> torch.Tensor:
    """`_tail_values` on CPU: each row's valid entries, partitioned at the smallest position
    wanted (numpy's partition with one position; with two it took 6 times longer); a position
    one above it is the minimum of the part above, any other a second partition.

    The rows are shared among torch's threads (`torch.get_num_threads`, a small thread pool):
    numpy's compress and partition release the GIL, and this per-row selection is a third of
    a 224 x 224 crop's time on one thread, which the torch steps around it do not parallelise.
    """
    a = v.detach().numpy()
    R, N = a.shape
    keep = None if valid is None else valid.numpy()
    n = np.full(R, N) if keep is None else keep.sum(-1)
    r = rank.numpy()
    pos = n[:, None] - 1 - r if largest else r  # ascending positions among the valid entries
    out = np.full(pos.shape, np.nan, dtype=a.dtype)
    threads = min(torch.get_num_threads(), R)
    if threads <= 1:
        _select_rows(a, keep, pos, out, range(R))
    else:  # every thread writes its own rows of out
        list(_row_pool(threads).map(lambda rows: _select_rows(a, keep, pos, out, rows), [range(t, R, threads) for t in range(threads)]))
    return torch.from_numpy(out)


def _select_rows(a: np.ndarray, keep: np.ndarray | None, pos: np.ndarray, out: np.ndarray, rows: range) -> None:
    """out[i] = the values at ascending positions pos[i] among row i's valid entries, for i in rows.

    One copy of the row (its valid entries), partitioned in place from the lowest position wanted
    up, each partition over the part above the previous one. Two adjacent positions (a
    percentile's lo and hi) cost one partition: at the upper one and the maximum of the
    few entries below it near the row's start, at the lower one and the minimum of the few above it near the end.
    """
    for i in rows:
        row = a[i].copy() if keep is None else np.compress(keep[i], a[i])  # 4x faster than a[i][keep[i]]
        L = len(row)
        if L == 0:
            continue  # no valid entry: garbage (NaN), flagged by the caller
        want = np.clip(pos[i], 0, L - 1)
        ps, vals, start, k = sorted(set(want.tolist())), {}, 0, 0
        while k < len(ps):
            q = ps[k]
            if k + 1 < len(ps) and ps[k + 1] == q + 1 and q - start <= L - q - 2:  # near the start
                row[start:].partition(q + 1 - start)
                vals[q], vals[q + 1] = row[start : q + 1].max(), row[q + 1]
                start, k = q + 2, k + 2
            elif k + 1 < len(ps) and ps[k + 1] == q + 1:  # near the end: the minimum above, moved to q + 1
                row[start:].partition(q - start)
                m = q + 1 + int(row[q + 1 :].argmin())
                row[q + 1], row[m] = row[m], row[q + 1]
                vals[q], vals[q + 1] = row[q], row[q + 1]
                start, k = q + 2, k + 2
            else:
                row[start:].partition(q - start)
                vals[q] = row[q]
                start, k = q + 1, k + 1
        out[i] = [vals[q] for q in want.tolist()]


_POOL: dict = {}  # "pool" -> (pid, workers, ThreadPoolExecutor) of `_row_pool`


def _row_pool(workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of `workers` threads for `_order_statistics_numpy`, made anew after a
    fork (a forked child has none of its parent's threads) or when more workers are wanted."""
    pid, have, pool = _POOL.get("pool", (None, 0, None))
    if pid != os.getpid() or have < workers:
        if pid == os.getpid():
            pool.shutdown(wait=False)  # a smaller one: its threads end once idle
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="macenko-select")
        _POOL["pool"] = (os.getpid(), workers, pool)
    return pool


def _masked_percentiles(v: torch.Tensor, valid: torch.Tensor | None, qs: Sequence[float]) -> torch.Tensor:
    """Percentiles of every row of v (R, N) over its valid entries, linear interpolation (numpy's).

    Only the tail that holds a percentile is sorted (`_tail_values`, from the near end), so a
    99th percentile sorts about 1% of the row; on CPU, rows of at least `_NUMPY_SELECT_MIN`
    entries take every percentile from one numpy selection per row (`_order_statistics_numpy`).
    Rows without valid entries give garbage (the caller flags them).

    Returns:
        (R, len(qs)).
    """
    R, N = v.shape
    if R == 0 or N == 0:  # an empty batch (or no pixels): nothing to take, garbage is NaN
        return torch.full((R, len(qs)), math.nan, dtype=v.dtype, device=v.device)
    n = torch.full((R,), N, device=v.device, dtype=torch.long) if valid is None else valid.sum(-1)
    last = (n - 1).clamp(min=0)
    if v.device.type == "cpu" and N >= _NUMPY_SELECT_MIN:  # every percentile from one selection per row
        pos = last.to(torch.float64)[:, None] * (torch.tensor(qs, dtype=torch.float64) / 100.0)
        lo = pos.floor().long()
        ab = _order_statistics_numpy(v, valid, torch.cat((lo, torch.minimum(lo + 1, last[:, None])), 1), largest=False)
        a, b = ab[:, : len(qs)], ab[:, len(qs) :]
        return a + (b - a) * (pos - lo.to(torch.float64)).to(v.dtype)
    out = []
    for q in qs:
        pos = last.to(torch.float64) * (q / 100.0)
        lo = pos.floor().long()
        hi = torch.minimum(lo + 1, last)
        frac = (pos - lo.to(torch.float64)).to(v.dtype)
        high_end = q >= 50.0
        # from the top, ascending position i is descending position n - 1 - i
        rank = torch.stack((n - 1 - lo, n - 1 - hi) if high_end else (lo, hi), 1).clamp(0, N - 1)
        ab = _tail_values(v, valid, rank, largest=high_end)
        out.append(ab[:, 0] + (ab[:, 1] - ab[:, 0]) * frac)
    return torch.stack(out, dim=1)


class _Workspace(dict):
    """Buffers for the large per-chunk intermediates of `_estimate` (name -> tensor of the
    largest chunk), so that a batch's chunks reuse them: freshly allocated each time they cost
    about a sixth of the call at 224 px on CPU (the allocator hands the memory back and the
    kernel page-faults it in again)."""


def _take(work: _Workspace | None, name: str, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """A (shape) buffer like `like`: the first rows of work[name] (made on first use), or new."""
    if work is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    buf = work.get(name)
    if buf is None or buf.shape[1:] != tuple(shape[1:]) or buf.shape[0] < shape[0] or buf.dtype != like.dtype:
        buf = work[name] = torch.empty(shape, dtype=like.dtype, device=like.device)
    return buf[: shape[0]]


def _estimate(logx: torch.Tensor, pix: torch.Tensor | None, Io: float, alpha: float, beta: float, min_px: int, work: _Workspace | None = None):
    """Macenko's estimate on ln(x + 1/255) (B, 3, N); pix (B, N) bool pixels to use or None;
    `work` the buffers of the large intermediates, reused from chunk to chunk (or None).

    Returns:
        HE (B, 3, 2), pinv(HE) (B, 2, 3), maxC (B, 2), applicable (B,), n_tissue (B,).
    """
    B, _, N = logx.shape
    dt = logx.dtype
    logIo = math.log(Io)
    # OD = ln Io - ln(x + off) is never materialised: every step below is affine in it
    tissue = logx.amax(dim=1) <= logIo - beta  # every OD channel >= beta (torchstain's rule)
    if pix is not None:
        tissue &= pix
    n = tissue.sum(-1)
    applicable = n >= min_px
    w = tissue.to(dt)[:, None, :]  # (B, 1, N)
    nf = n.clamp(min=1).to(dt)[:, None, None]
    mean = torch.bmm(logx, w.transpose(1, 2)) / nf
    d = torch.sub(logx, mean, out=_take(work, "d", logx.shape, logx)).mul_(w)  # the covariance of OD equals that of -OD
    cov = torch.bmm(d, d.transpose(1, 2)) / (nf - 1).clamp(min=1)
    eye = torch.eye(3, dtype=dt, device=logx.device).expand(B, 3, 3)
    cov = torch.where(applicable[:, None, None], cov, eye)  # eigh of a degenerate crop must not fail
    _, vecs = torch.linalg.eigh(cov)
    E = vecs[:, :, 1:3]  # (B, 3, 2): second largest, largest
    Et = E.transpose(1, 2)
    proj = torch.baddbmm(logIo * Et.sum(-1, keepdim=True), -Et, logx, out=_take(work, "two", (B, 2, N), logx))  # E^T OD
    phi = torch.atan2(proj[:, 1], proj[:, 0], out=_take(work, "phi", (B, N), logx))
    ext = _masked_percentiles(phi, tissue, (alpha, 100.0 - alpha))  # (B, 2)
    vmin = torch.bmm(E, torch.stack((ext[:, 0].cos(), ext[:, 0].sin()), 1)[:, :, None])[:, :, 0]
    vmax = torch.bmm(E, torch.stack((ext[:, 1].cos(), ext[:, 1].sin()), 1)[:, :, None])[:, :, 0]
    h_first = (vmin[:, 0] > vmax[:, 0])[:, None]
    HE = torch.stack((torch.where(h_first, vmin, vmax), torch.where(h_first, vmax, vmin)), dim=2)
    G = HE.transpose(1, 2) @ HE
    G = torch.where(applicable[:, None, None], G, torch.eye(2, dtype=dt, device=logx.device).expand(B, 2, 2))
    P, info = torch.linalg.solve_ex(G, HE.transpose(1, 2))  # (B, 2, 3) = pinv(HE)
    conc = torch.baddbmm(logIo * P.sum(-1, keepdim=True), -P, logx, out=_take(work, "two", (B, 2, N), logx))  # P OD (proj is done)
    cvalid = None if pix is None else pix[:, None, :].expand(B, 2, N).reshape(B * 2, N)
    maxC = _masked_percentiles(conc.reshape(B * 2, N), cvalid, (99.0,)).reshape(B, 2)
    # a degenerate estimate (equal stain vectors, no positive concentration) is not applicable
    det = torch.linalg.det(G)
    applicable &= (info == 0) & (det > 1e-8) & (maxC > 0).all(1) & torch.isfinite(P).flatten(1).all(1) & torch.isfinite(maxC).all(1)
    return HE, P, maxC, applicable, n


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _prepare(x: torch.Tensor, mask: torch.Tensor | None, work: _Workspace | None = None):
    """ln(x + 1/255) as (B, 3, H*W) in the working dtype, and the (B, H*W) mask pixels or None."""
    B, _, H, W = x.shape
    x3 = x.reshape(B, 3, H * W).to(_work_dtype(x))
    logx = torch.add(x3, OD_OFFSET, out=_take(work, "logx", x3.shape, x3)).log_()
    pix = None if mask is None else (mask.reshape(B, H * W) >= 0.5)
    return logx, pix


def estimate_stains(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    Io: float = DEFAULT_IO,
    alpha: float = 1.0,
    beta: float = 0.15,
    min_tissue_pixels: int = 32,
) -> StainEstimate:
    """Macenko's stain matrix and maximal concentrations of every image (steps 1-5 above).

    Args:
        x: (B, 3, H, W) in [0, 1].
        mask: optional (B, 1, H, W) cell mask; stains are estimated from its pixels.
        Io, alpha, beta, min_tissue_pixels: see `StainNormalize`.

    Returns:
        A `StainEstimate` (stain_matrix (B, 3, 2), max_conc (B, 2), applicable (B,), n_tissue (B,)).
    """
    check_image(x)
    if mask is not None:
        mask = check_mask(mask, x)
    Io, alpha, beta, min_px = _check_settings(Io, alpha, beta, min_tissue_pixels)
    logx, pix = _prepare(x, mask)
    HE, _, maxC, ok, n = _estimate(logx, pix, Io, alpha, beta, min_px)
    return StainEstimate(HE.to(x.dtype), maxC.to(x.dtype), ok, n)


def _normalize(x, mask, HE_ref: np.ndarray, maxC_ref: np.ndarray, Io, alpha, beta, min_px) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise a validated batch; returns the output and the (B,) applicable flags.

    On CPU the batch goes in chunks of about _CPU_CHUNK_PIXELS pixels per thread (every step is
    per image), so that the intermediates stay in cache and their memory is reused.
    """
    B, _, H, W = x.shape
    HW = H * W
    x3 = x.reshape(B, 3, HW)
    m3 = None if mask is None else mask.reshape(B, 1, 1, HW)
    dt = _work_dtype(x)
    HEr = torch.as_tensor(HE_ref, dtype=dt, device=x.device)
    mcr = torch.as_tensor(maxC_ref, dtype=dt, device=x.device)
    eye = torch.eye(3, dtype=dt, device=x.device)
    logIo = math.log(Io)
    # the output is made in its final shape, so that the module's forward clamps it in place
    # (a view would make it copy), and worked on as (B, 3, H*W)
    result = new_output(x.shape, x.dtype, x.device)
    out = result.view(B, 3, HW)
    ok_all = torch.empty(B, dtype=torch.bool, device=x.device)
    step = B if x.device.type != "cpu" else max(1, min(B, _CPU_CHUNK_PIXELS * torch.get_num_threads() // max(HW, 1)))
    work = _Workspace()
    for i in range(0, B, step):
        j = min(i + step, B)
        logx, pix = _prepare(x3[i:j].reshape(j - i, 3, 1, HW), None if m3 is None else m3[i:j], work)
        _, P, maxC, ok, _ = _estimate(logx, pix, Io, alpha, beta, min_px, work)
        # OD' = HE_ref diag(maxC_ref / maxC) pinv(HE) OD = K OD and OD = ln Io - ln(x + off), so
        # ln(x' + off) = ln Io - OD' = K ln(x + off) + ln Io (1 - K 1)
        K = HEr @ ((mcr / maxC.clamp(min=1e-12))[:, :, None] * P)  # (n, 3, 3)
        K = torch.where(ok[:, None, None], K, eye)  # keeps the not-applicable rows finite
        bias = logIo * (1.0 - K.sum(-1))
        K2, bias2 = K / _LN2, (bias / _LN2)[:, :, None]  # exp2 is the fast exponential on CPU
        if dt == x.dtype:
            torch.baddbmm(bias2, K2, logx, out=out[i:j]).exp2_().sub_(OD_OFFSET).clamp_(0.0, 1.0)
        else:  # half precision in, float32 inside
            out[i:j] = torch.baddbmm(bias2, K2, logx).exp2_().sub_(OD_OFFSET).clamp_(0.0, 1.0)
        bad = torch.nonzero(~ok)[:, 0]
        if len(bad):
            out[i + bad] = x3[i + bad].clamp(0.0, 1.0)  # not applicable: returned unchanged
        ok_all[i:j] = ok
    return result, ok_all


_NOT_APPLICABLE = "give no stain estimate (too few tissue pixels, inside the mask if given, or a degenerate one), so they were returned unchanged"


def stain_normalize(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    stain_matrix=None,
    max_conc=None,
    Io: float = DEFAULT_IO,
    alpha: float = 1.0,
    beta: float = 0.15,
    min_tissue_pixels: int = 32,
    return_applicable: bool = False,
):
    """Function twin of `StainNormalize`: Macenko normalisation of every image to a reference.

    Args:
        x: (B, 3, H, W) in [0, 1].
        mask: optional (B, 1, H, W) cell mask; stains are estimated from its pixels, every pixel
            is normalised.
        stain_matrix: reference (3, 2) H and E OD vectors (default: torchstain's).
        max_conc: reference (2,) 99th-percentile concentrations (default: torchstain's).
        Io, alpha, beta, min_tissue_pixels: see `StainNormalize`.
        return_applicable: also return the (B,) bool flags.

    Returns:
        (B, 3, H, W) in [0, 1], crops that are not applicable unchanged; with
        `return_applicable`, the tuple (output, applicable).
    """
    check_image(x)
    if mask is not None:
        mask = check_mask(mask, x)
    settings = _check_settings(Io, alpha, beta, min_tissue_pixels)
    HE, mc = _check_reference(stain_matrix, max_conc)
    y, ok = _normalize(x, mask, HE, mc, *settings)  # the tolerated overshoot needs no clamp: ln(x + 1/255) is finite
    warn_not_applicable("stain_normalize", ok, _NOT_APPLICABLE)
    return (y, ok) if return_applicable else y


@register("stain_normalize")
class StainNormalize(Intervention):
    """Macenko stain normalisation to a reference (see the module docstring).

    Args:
        Io: transmitted light on the [0, 1] scale (torchstain's Io / 255; default 240/255).
        alpha: percentile of the robust extreme angles (default 1, i.e. 1st and 99th).
        beta: OD threshold of tissue pixels (every channel >= beta; default 0.15).
        min_tissue_pixels: fewer tissue pixels make a crop "not applicable" (default 32).
        stain_matrix, max_conc: the reference (default torchstain's H&E reference); `fit`
            replaces them.

    Attributes:
        stain_matrix_, max_conc_: the reference fitted by `fit` ((3, 2) and (2,), float64).
        last_applicable: (B,) bool flags of the last call (None before the first).

    Example:
        >>> import torch
        >>> t = StainNormalize()
        >>> y = t(torch.full((2, 3, 8, 8), 0.95))
        >>> t.last_applicable.tolist()
        [False, False]
    """

    label = "Macenko stain normalisation"

    def __init__(
        self,
        Io: float = DEFAULT_IO,
        alpha: float = 1.0,
        beta: float = 0.15,
        min_tissue_pixels: int = 32,
        stain_matrix=None,
        max_conc=None,
    ) -> None:
        super().__init__()
        self.Io, self.alpha, self.beta, self.min_tissue_pixels = _check_settings(Io, alpha, beta, min_tissue_pixels)
        _check_reference(stain_matrix, max_conc)
        self.stain_matrix = stain_matrix
        self.max_conc = max_conc
        self.last_applicable: torch.Tensor | None = None

    def fit(self, images: torch.Tensor, masks: torch.Tensor | None = None) -> "StainNormalize":
        """Take the reference from target images, pooled as one image (torchstain's `fit`).

        Args:
            images: (N, 3, H, W) uint8 or float in [0, 1].
            masks: optional (N, 1, H, W) cell masks.

        Returns:
            self, with `stain_matrix_` and `max_conc_` set.

        Raises:
            InterventionError: the images hold too few tissue pixels for an estimate.
        """
        if isinstance(images, torch.Tensor) and images.dtype == torch.uint8:
            images = images.to(torch.float32).div_(255.0)
        check_image(images, "images")
        if len(images) == 0:
            raise InterventionError(f"stain_normalize.fit needs at least one target image; got images of shape {tuple(images.shape)}")
        if masks is not None:
            masks = check_mask(masks, images, "masks")
        N, _, H, W = images.shape
        pooled = images.clamp(0.0, 1.0).permute(1, 0, 2, 3).reshape(1, 3, 1, N * H * W)
        pm = None if masks is None else masks.permute(1, 0, 2, 3).reshape(1, 1, 1, N * H * W)
        logx, pix = _prepare(pooled, pm)
        HE, _, maxC, ok, n = _estimate(logx, pix, self.Io, self.alpha, self.beta, self.min_tissue_pixels)
        if not bool(ok[0]):
            raise InterventionError(
                f"stain_normalize.fit: the target images give no stain estimate ({int(n[0])} tissue pixels with every OD channel >= {self.beta}; "
                f"at least {self.min_tissue_pixels} needed); fit on stained tissue"
            )
        self.stain_matrix_ = HE[0].double().cpu().numpy()
        self.max_conc_ = maxC[0].double().cpu().numpy()
        return self

    def _reference(self) -> tuple[np.ndarray, np.ndarray]:
        if hasattr(self, "stain_matrix_"):
            return self.stain_matrix_, self.max_conc_
        return _check_reference(self.stain_matrix, self.max_conc)

    def apply(self, x, mask, params, **context):
        if context:
            raise InterventionError(f"stain_normalize takes no per-crop context; got {sorted(context)}")
        HE, mc = self._reference()
        y, ok = _normalize(x, mask, HE, mc, self.Io, self.alpha, self.beta, self.min_tissue_pixels)
        self.last_applicable = ok
        warn_not_applicable(self.name, ok, _NOT_APPLICABLE)
        return y

    def extra_repr(self) -> str:
        return f"Io={self.Io:.4g}, alpha={self.alpha}, beta={self.beta}, min_tissue_pixels={self.min_tissue_pixels}"
