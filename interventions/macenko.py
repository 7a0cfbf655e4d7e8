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
partition of each tail, cut out of the row with a threshold from a sample; least squares by a
batched 2 x 2 solve); OD is never materialised (all steps are affine in ln(x + 1/255), and a row
of ones beside it carries the constant), the angles are ordered by a pseudo-angle that is
monotone in them and computed as angles only at the order statistics, and steps 5-6 fold into
one 3 x 4 map of [ln(x + 1/255); 1] per image, so the output costs a batched product and an
exp. On CPU the batch goes in chunks of 256K (64 px) to 512K (224 px) pixels per thread, whose
large intermediates reuse one set of buffers (`memory.Workspace`), so that they stay in cache
and are not page-faulted in anew for every chunk.

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
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch

from .base import Intervention, InterventionError, check_image, check_mask, warn_not_applicable
from .memory import Workspace, new_output
from .registry import register

# torchstain's (and Macenko's reference implementation's) defaults: columns H, E over R, G, B.
REFERENCE_STAIN_MATRIX = np.array([[0.5626, 0.2159], [0.7201, 0.8012], [0.4062, 0.5581]])
REFERENCE_MAX_CONC = np.array([1.9705, 1.0308])
DEFAULT_IO = 240.0 / 255.0
OD_OFFSET = 1.0 / 255.0
_LN2 = math.log(2.0)
# pixels per CPU chunk and thread: the intermediates stay in cache, and each chunk's fixed cost
# (about 1 ms of small steps) is spread over enough crops. Measured on 2 threads: 1 << 18 fastest
# at 64 px (1 << 17 and 1 << 19 cost 10-20% more); with the per-row numpy selection (crops of
# _NUMPY_SELECT_MIN pixels and more) 1 << 19, 10% faster than 1 << 18 at 224 px.
_CPU_CHUNK_PIXELS = 1 << 18
_CPU_CHUNK_PIXELS_LONG_ROWS = 1 << 19
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
    entries (valid a bool mask or None) from the largest (or smallest) end: one `topk` over the
    rows, k = max(rank) + 1 (off CPU, and on CPU for rows shorter than `_NUMPY_SELECT_MIN`, such
    as a 64 x 64 crop's 4096, where it is faster than numpy's per-row partition; cutting the rows
    first with a subsample threshold and sorting only the kept values was tried: on CPU the
    gather costs about what it saves for 64 x 64 crops)."""
    vv = v if valid is None else torch.where(valid, v, -math.inf if largest else math.inf)
    return torch.topk(vv, int(rank.max()) + 1, dim=-1, largest=largest, sorted=True).values.gather(1, rank)


def _count(valid: torch.Tensor) -> torch.Tensor:
    """(R,) long: the valid entries of each row of a bool or 0/1 float (R, N) mask (a float32
    sum of 0/1 is exact below 2^24 entries a row; longer rows are summed in float64)."""
    if valid.dtype == torch.bool:
        return valid.sum(-1)
    exact = valid.dtype == torch.float64 or valid.shape[-1] < (1 << 24)
    return (valid.sum(-1) if exact else valid.sum(-1, dtype=torch.float64)).long()


def _nan_outside(v: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """v where the 0/1 float mask w is 1, NaN where it is 0: ``v / w * w`` is v exactly where
    w = 1 and (+-inf or NaN) * 0 = NaN where w = 0. Multiplication and division, because on CPU
    a torch comparison into bool (for `where` or `masked_fill`) costs three times as much. out
    may be v itself."""
    return torch.div(v, w, out=out).mul_(w) if out is not None else torch.div(v, w).mul_(w)


_SAMPLE_STRIDE = 16  # every 16th entry of a row estimates its tails' thresholds (`_select_row`)


def _order_statistics_numpy(a: np.ndarray, p: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Values at 0-based ascending positions p (R, m) among the non-NaN entries of every row of
    a (R, N) (NaN marks an invalid entry; a row has counts of the others, and the positions are
    clipped to [0, count - 1]; NaN for a row without any), row by row (`_select_row`).

    One thread: the work of a row is a handful of numpy calls of 5-20 us, too short to gain from
    a thread pool (measured: no faster on 2 threads than on one).
    """
    out = np.empty(p.shape, dtype=a.dtype)
    for i in range(a.shape[0]):
        out[i] = _select_row(a[i], int(counts[i]), p[i])
    return out


def _select_row(r: np.ndarray, n: int, pos: np.ndarray) -> np.ndarray:
    """The values at ascending positions pos among the n non-NaN entries of r (NaN if n = 0).

    The positions below the row's middle lie in its low tail, the others in its high tail;
    each tail needs its k most extreme entries. Thresholds are read from every
    `_SAMPLE_STRIDE`-th entry, at the rank that, scaled up, holds about k entries plus a margin
    of three standard deviations and 8, and the entries at or beyond them (NaN never compares)
    are cut out in one pass. If a tail's cut holds at least its k entries, they are exactly the
    row's most extreme ones, so its positions are found by partitioning only the cut (about 2%
    of the row for a 1% tail). Otherwise (a short row, a wide tail, an unlucky sample) the row's
    non-NaN entries are partitioned whole; so are rows where the tails would meet.
    """
    if n == 0:
        return np.full(len(pos), np.nan, dtype=r.dtype)
    want = [min(max(q, 0), n - 1) for q in pos.tolist()]
    low = [q for q in want if 2 * q < n]
    high = [q for q in want if 2 * q >= n]
    k_low = max(low) + 1 if low else 0
    k_high = n - min(high) if high else 0
    N = len(r)
    if N >= 64 * _SAMPLE_STRIDE and 8 * max(k_low, k_high) <= n:
        sample = r[::_SAMPLE_STRIDE]
        sample = sample[~np.isnan(sample)] if n < N else sample.copy()
        m = len(sample)
        j_low, j_high = (_sample_rank(k, m, n) if k else 0 for k in (k_low, k_high))
        if j_low + j_high + 2 <= m:
            kth = ([j_low] if low else []) + ([m - 1 - j_high] if high else [])
            sample.partition(kth)
            t_low = sample[j_low] if low else -np.inf
            t_high = sample[m - 1 - j_high] if high else np.inf
            if t_low < t_high:
                cut = r[(r <= t_low) | (r >= t_high)] if low and high else (r[r <= t_low] if low else r[r >= t_high])
                n_low = int(np.count_nonzero(cut <= t_low)) if low else 0
                n_high = len(cut) - n_low
                if n_low >= k_low and n_high >= k_high:
                    # ascending, the cut is the row's n_low lowest entries, then its n_high highest
                    local = [q if 2 * q < n else q - (n - n_high) + n_low for q in want]
                    cut.partition(sorted(set(local)))
                    return cut[local]
    row = r[~np.isnan(r)] if n < N else r.copy()
    local = [min(q, len(row) - 1) for q in want]
    row.partition(sorted(set(local)))
    return row[local]


def _sample_rank(k: int, m: int, n: int) -> int:
    """The rank in a sample of m of n entries that holds a row's k most extreme entries with a
    margin: k m / n, plus three standard deviations and 8."""
    j = math.ceil(k * m / n)
    return j + int(3.0 * math.sqrt(j)) + 8


def _masked_percentiles(v: torch.Tensor, valid: torch.Tensor | None, qs: Sequence[float], *, n: torch.Tensor | None = None, overwrite: bool = False,
                       transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Percentiles of every row of v (R, N) over its valid entries, linear interpolation (numpy's).

    valid is a bool or 0/1 float (R, N) mask, or None for all; n its (R,) counts if the caller
    has them; with `overwrite`, v may be overwritten (it is a scratch buffer of the caller's).
    `transform`, an increasing function, maps the order statistics before they are
    interpolated: the percentiles of transform(v) at the cost of computing it at 2 points a
    percentile.
    Only the tail that holds a percentile is sorted (`_tail_values`, from the near end), so a
    99th percentile sorts about 1% of the row; on CPU, rows of at least `_NUMPY_SELECT_MIN`
    entries take every percentile from one numpy selection per row (`_order_statistics_numpy`),
    the invalid entries first made NaN (`_nan_outside`). Rows without valid entries give garbage (the caller flags
    them).

    Returns:
        (R, len(qs)).
    """
    R, N = v.shape
    if R == 0 or N == 0:  # an empty batch (or no pixels): nothing to take, garbage is NaN
        return torch.full((R, len(qs)), math.nan, dtype=v.dtype, device=v.device)
    if n is None:
        n = torch.full((R,), N, device=v.device, dtype=torch.long) if valid is None else _count(valid)
    last = (n - 1).clamp(min=0)
    if v.device.type == "cpu" and N >= _NUMPY_SELECT_MIN:  # every percentile from one selection per row
        if valid is not None:
            v = _nan_outside(v, valid if valid.dtype == v.dtype else valid.to(v.dtype), out=v if overwrite else None)
        counts = n.numpy()
        end = np.maximum(counts - 1, 0)[:, None]
        pos = end * (np.asarray(qs, dtype=np.float64) / 100.0)
        lo = np.floor(pos).astype(np.int64)
        ab = torch.from_numpy(_order_statistics_numpy(v.detach().numpy(), np.concatenate((lo, np.minimum(lo + 1, end)), 1), counts))
        if transform is not None:
            ab = transform(ab)
        a, b = ab[:, : len(qs)], ab[:, len(qs) :]
        return a + (b - a) * torch.from_numpy(pos - lo).to(a.dtype)
    if valid is not None and valid.dtype != torch.bool:
        valid = valid != 0
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
        if transform is not None:
            ab = transform(ab)
        out.append(ab[:, 0] + (ab[:, 1] - ab[:, 0]) * frac)
    return torch.stack(out, dim=1)


def _take(work: Workspace | None, name: str, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """A (shape) buffer like `like`: work's buffer `name` (see `memory.Workspace`), or new."""
    if work is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    return work.take(name, shape, like.dtype, like.device)


def _estimate(L: torch.Tensor, pix: torch.Tensor | None, Io: float, alpha: float, beta: float, min_px: int, work: Workspace | None = None):
    """Macenko's estimate on the rows L = [ln(x + 1/255); 1] (B, 4, N) of `_prepare`; pix
    (B, N) 0/1 float pixels to use or None; `work` the buffers of the large intermediates,
    reused from chunk to chunk (or None).

    OD = ln Io - ln(x + 1/255) is never materialised: every step is affine in it, and the row of
    ones in L carries the constant, so that each affine map of OD is one batched product (torch's
    `baddbmm` would first copy its broadcast bias into the output). Masks are 0/1 floats: on CPU
    a torch comparison into bool, and sums of bool, cost several times their float versions.

    Returns:
        HE (B, 3, 2), pinv(HE) (B, 2, 3), maxC (B, 2), applicable (B,), n_tissue (B,).
    """
    B, _, N = L.shape
    dt = L.dtype
    logx = L[:, :3]
    logIo = math.log(Io)
    # every OD channel >= beta (torchstain's rule), as 0/1
    tissue = torch.amax(logx, dim=1, out=_take(work, "tissue", (B, N), L))
    torch.le(tissue, logIo - beta, out=tissue)
    if pix is not None:
        tissue.mul_(pix)
    n = _count(tissue)
    applicable = n >= min_px
    nf = n.clamp(min=1).to(dt)[:, None, None]
    mean = torch.bmm(L, tissue[:, None, :].transpose(1, 2))[:, :3] / nf  # all of L, and this stride of the vector: both faster
    d = torch.sub(logx, mean, out=_take(work, "d", (B, 3, N), L)).mul_(tissue[:, None, :])  # the covariance of OD equals that of -OD
    cov = torch.bmm(d, d.transpose(1, 2)) / (nf - 1).clamp(min=1)
    eye = torch.eye(3, dtype=dt, device=L.device).expand(B, 3, 3)
    cov = torch.where(applicable[:, None, None], cov, eye)  # eigh of a degenerate crop must not fail
    _, vecs = torch.linalg.eigh(cov)
    E = vecs[:, :, 1:3]  # (B, 3, 2): second largest, largest
    C = _od_map(logIo, L)
    proj = torch.bmm(E.transpose(1, 2) @ C, L, out=_take(work, "two", (B, 2, N), L))  # E^T OD
    # the angles' percentiles, ordered by a pseudo-angle (a fifth of atan2's cost) and turned
    # into angles only at the order statistics that make them
    psi = _pseudo_angle(proj[:, 1], proj[:, 0], out=_take(work, "phi", (B, N), L), scratch=_take(work, "scratch", (B, N), L))
    ext = _masked_percentiles(psi, tissue, (alpha, 100.0 - alpha), n=n, overwrite=True, transform=_angle_of_pseudo)  # (B, 2)
    V = E @ torch.stack((ext.cos(), ext.sin()), 1)  # (B, 3, 2): the unit vectors at the two extreme angles
    h_first = (V[:, 0, 0] > V[:, 0, 1])[:, None, None]  # haematoxylin first: the larger red OD
    HE = torch.where(h_first, V, V.flip(2))
    G = HE.transpose(1, 2) @ HE
    G = torch.where(applicable[:, None, None], G, torch.eye(2, dtype=dt, device=L.device).expand(B, 2, 2))
    P, info = torch.linalg.solve_ex(G, HE.transpose(1, 2))  # (B, 2, 3) = pinv(HE)
    conc = torch.bmm(P @ C, L, out=_take(work, "two", (B, 2, N), L))  # P OD (proj is done)
    cvalid = cn = None
    if pix is not None:
        cvalid = pix[:, None, :].expand(B, 2, N).reshape(B * 2, N)
        cn = _count(pix).repeat_interleave(2)
    maxC = _masked_percentiles(conc.reshape(B * 2, N), cvalid, (99.0,), n=cn, overwrite=True).reshape(B, 2)
    # a degenerate estimate (equal stain vectors, no positive concentration) is not applicable
    det = torch.linalg.det(G)
    applicable &= (info == 0) & (det > 1e-8) & (maxC > 0).all(1) & torch.isfinite(P).flatten(1).all(1) & torch.isfinite(maxC).all(1)
    return HE, P, maxC, applicable, n


def _pseudo_angle(y: torch.Tensor, x: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """psi = copysign((s - x) / s, y), s = |x| + |y|, written to out (scratch: a buffer like it).

    Over (-pi, pi], psi is a strictly increasing function of the angle atan2(y, x) (0 at 0,
    +-1 at +-pi/2, +-2 at +-pi, with atan2's signed-zero conventions on the negative x axis),
    so it orders points by angle exactly as atan2 would (to rounding, about 1e-7 rad in float32);
    `_angle_of_pseudo` inverts it. The one exception is the point (0, 0), whose angle is
    undefined: atan2 gives it 0 or pi, psi puts it at +-pi/2. Seven passes of additions and
    one division cost a fifth of atan2's on CPU.
    """
    s = torch.abs(x, out=scratch).add_(torch.abs(y, out=out)).clamp_(min=torch.finfo(x.dtype).tiny)
    return torch.copysign(torch.sub(s, x, out=out).div_(s), y, out=out)


def _angle_of_pseudo(psi: torch.Tensor) -> torch.Tensor:
    """atan2(y, x) of the points whose `_pseudo_angle` is psi: x / s = 1 - |psi| and
    |y| / s = 1 - |x| / s, with y of psi's sign."""
    d = 1.0 - psi.abs()
    return torch.atan2(torch.copysign(1.0 - d.abs(), psi), d)


def _od_map(logIo: float, like: torch.Tensor) -> torch.Tensor:
    """C (3, 4) with A C [ln(x + 1/255); 1] = A OD for any A (k, 3): OD = ln Io - ln(x + 1/255),
    so C = [-I | ln Io 1]."""
    C = torch.zeros((3, 4), dtype=like.dtype, device=like.device)
    C[:, :3].fill_diagonal_(-1.0)
    C[:, 3] = logIo
    return C


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _prepare(x: torch.Tensor, mask: torch.Tensor | None, work: Workspace | None = None):
    """The rows [ln(x + 1/255); 1] as (B, 4, H*W) in the working dtype (the row of ones is
    written once per buffer), and the (B, H*W) mask pixels as 0/1 floats, or None."""
    B, _, H, W = x.shape
    x3 = x.reshape(B, 3, H * W).to(_work_dtype(x))
    L = _take(work, "logx", (B, 4, H * W), x3)
    if work is None or getattr(work, "ones_at", None) != L.data_ptr():  # once per buffer: `take` hands out its leading rows
        L[:, 3] = 1.0
        if work is not None:
            work.ones_at = L.data_ptr()
    torch.add(x3, OD_OFFSET, out=L[:, :3]).log_()
    pix = None if mask is None else torch.ge(mask.reshape(B, H * W), 0.5, out=_take(work, "pix", (B, H * W), L))
    return L, pix


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
    L, pix = _prepare(x, mask)
    HE, _, maxC, ok, n = _estimate(L, pix, Io, alpha, beta, min_px)
    return StainEstimate(HE.to(x.dtype), maxC.to(x.dtype), ok, n)


def _normalize(x, mask, HE_ref: np.ndarray, maxC_ref: np.ndarray, Io, alpha, beta, min_px) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise a validated batch; returns the output and the (B,) applicable flags.

    On CPU the batch goes in chunks of about _CPU_CHUNK_PIXELS(_LONG_ROWS) pixels a thread (every step is
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
    # the output is made in its final shape and worked on as (B, 3, H*W); each chunk is clamped
    # while in cache (the module's `output_in_range`)
    result = new_output(x.shape, x.dtype, x.device)
    out = result.view(B, 3, HW)
    ok_all = torch.empty(B, dtype=torch.bool, device=x.device)
    per_thread = _CPU_CHUNK_PIXELS_LONG_ROWS if HW >= _NUMPY_SELECT_MIN else _CPU_CHUNK_PIXELS
    step = B if x.device.type != "cpu" else max(1, min(B, per_thread * torch.get_num_threads() // max(HW, 1)))
    work = Workspace()
    for i in range(0, B, step):
        j = min(i + step, B)
        L, pix = _prepare(x3[i:j].reshape(j - i, 3, 1, HW), None if m3 is None else m3[i:j], work)
        _, P, maxC, ok, _ = _estimate(L, pix, Io, alpha, beta, min_px, work)
        # OD' = HE_ref diag(maxC_ref / maxC) pinv(HE) OD = K OD and OD = ln Io - ln(x + off), so
        # ln(x' + off) = ln Io - OD' = K ln(x + off) + ln Io (1 - K 1): one product with L
        K = HEr @ ((mcr / maxC.clamp(min=1e-12))[:, :, None] * P)  # (n, 3, 3)
        K = torch.where(ok[:, None, None], K, eye)  # keeps the not-applicable rows finite
        KL = torch.cat((K, logIo * (1.0 - K.sum(-1, keepdim=True))), dim=2) / _LN2  # exp2 is the fast exponential on CPU
        if dt == x.dtype:
            torch.bmm(KL, L, out=out[i:j]).exp2_().sub_(OD_OFFSET).clamp_(0.0, 1.0)
        else:  # half precision in, float32 inside
            out[i:j] = torch.bmm(KL, L).exp2_().sub_(OD_OFFSET).clamp_(0.0, 1.0)
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
    output_in_range = True  # `_normalize` clamps each chunk

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
