"""Macenko stain normalisation (F6): against a numpy Macenko written here, torchstain, stain recovery.

The numpy reference (`_numpy_macenko`) is written from the paper's steps, as torchstain's numpy
normaliser takes them, and needs nothing but numpy, so the reference comparison runs everywhere;
torchstain (in the dev extra) and scikit-image's IHC image (dev too) add checks where installed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interventions import InterventionError, InterventionWarning, StainNormalize, estimate_stains, stain_normalize
from interventions.hed import RGB_FROM_HED
from interventions.macenko import DEFAULT_IO, OD_OFFSET, REFERENCE_MAX_CONC, REFERENCE_STAIN_MATRIX, _masked_percentiles

H_VEC = RGB_FROM_HED[0] / np.linalg.norm(RGB_FROM_HED[0])
E_VEC = RGB_FROM_HED[1] / np.linalg.norm(RGB_FROM_HED[1])


def _he_tile(seed: int = 0, size: int = 64) -> np.ndarray:
    """A synthetic 8-bit H&E tile with known stains (scikit-image's Ruifrok H and E vectors).

    A quarter of the pixels is pure haematoxylin, a quarter pure eosin, the rest mixtures, a
    fifth of all is near-white background; OD = density * (f h + (1 - f) e) + noise, and the
    image is Io exp(-OD) - 1/255 (the inverse of the OD convention), rounded to uint8.
    """
    rng = np.random.default_rng(seed)
    d = rng.uniform(0.3, 1.5, (size, size))
    f = rng.uniform(0, 1, (size, size))
    u = rng.random((size, size))
    f[u < 0.25], f[u > 0.75] = 1.0, 0.0
    od = d[..., None] * (f[..., None] * H_VEC + (1 - f[..., None]) * E_VEC) + rng.normal(0, 0.004, (size, size, 3))
    bg = rng.random((size, size)) < 0.2
    od[bg] = rng.uniform(0, 0.05, (int(bg.sum()), 3))
    x = np.clip(DEFAULT_IO * np.exp(-od) - OD_OFFSET, 0, 1)
    return (x * 255).round().astype(np.uint8)


def _to_batch(*imgs: np.ndarray, dtype=torch.float64) -> torch.Tensor:
    return torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).to(dtype).div(255.0).contiguous()


@pytest.fixture(scope="module")
def ihc_tiles() -> np.ndarray:
    skdata = pytest.importorskip("skimage.data")
    ihc = skdata.immunohistochemistry()
    return np.stack([ihc[i : i + 64, j : j + 64] for i in (0, 192, 384) for j in (64, 320)])


def _cosines(stain_matrix: torch.Tensor, reference: np.ndarray) -> np.ndarray:
    return (stain_matrix.double().numpy() * reference).sum(0)  # columns are unit vectors


def _numpy_macenko(img: np.ndarray, mask: np.ndarray | None = None, Io: float = 240.0, alpha: float = 1.0, beta: float = 0.15):
    """Macenko et al. (2009) on one 8-bit RGB image (H, W, 3), in float64 numpy.

    OD = -ln((I + 1) / Io); tissue: every OD channel >= beta (and mask >= 0.5); the plane of the
    two largest eigenvectors of the tissue OD covariance; the angle of every tissue pixel in it;
    stain vectors at the alpha-th and (100 - alpha)-th angle percentiles, haematoxylin the one
    with the larger red OD; concentrations by least squares; their 99th percentiles over the
    (cell) pixels; the image rebuilt as Io exp(-HE_ref C maxC_ref / maxC) with torchstain's
    reference, on the 0-255 scale and not truncated.

    Returns:
        The normalised image (H, W, 3) on the 0-255 scale, HE (3, 2) and maxC (2,).
    """
    od = -np.log((img.reshape(-1, 3).astype(np.float64) + 1.0) / Io)
    sel = np.ones(len(od), dtype=bool) if mask is None else mask.reshape(-1) >= 0.5
    od_hat = od[sel & ~np.any(od < beta, axis=1)]
    _, vecs = np.linalg.eigh(np.cov(od_hat.T))
    plane = vecs[:, 1:3]
    proj = od_hat @ plane
    phi = np.arctan2(proj[:, 1], proj[:, 0])
    lo, hi = np.percentile(phi, alpha), np.percentile(phi, 100 - alpha)
    v_lo = plane @ np.array([np.cos(lo), np.sin(lo)])
    v_hi = plane @ np.array([np.cos(hi), np.sin(hi)])
    he = np.stack([v_lo, v_hi], 1) if v_lo[0] > v_hi[0] else np.stack([v_hi, v_lo], 1)
    conc = np.linalg.lstsq(he, od.T, rcond=None)[0]  # (2, N)
    max_c = np.percentile(conc[:, sel], 99, axis=1)
    out = Io * np.exp(-REFERENCE_STAIN_MATRIX @ (conc * (REFERENCE_MAX_CONC / max_c)[:, None]))
    return out.T.reshape(img.shape), he, max_c


def _disc(size: int, cy: float, cx: float, r: float) -> np.ndarray:
    yy, xx = np.mgrid[:size, :size]
    return ((yy - cy) ** 2 + (xx - cx) ** 2 < r**2).astype(np.float64)


@pytest.mark.parametrize("dtype, tol, tol_255", [(torch.float64, 1e-12, 1e-9), (torch.float32, 2e-6, 5e-4)], ids=["f64", "f32"])
def test_equals_a_numpy_macenko(dtype, tol, tol_255):
    """Every step against `_numpy_macenko`: the stain matrices, maximal concentrations and the
    normalised image (ours is the reference's Io exp(...) less the 1 / 255 offset, 0-255 scale)."""
    imgs = [_he_tile(s) for s in (5, 6, 7)]
    masks = [None, _disc(64, 30, 34, 22), _disc(64, 20, 40, 18)]
    x = _to_batch(*imgs, dtype=dtype)
    for use_mask in (False, True):
        m = torch.from_numpy(np.stack([np.ones((64, 64)) if k is None else k for k in masks]))[:, None].to(dtype) if use_mask else None
        est = estimate_stains(x, m)
        y = stain_normalize(x, m).double().permute(0, 2, 3, 1).numpy() * 255
        assert est.applicable.all()
        for b, img in enumerate(imgs):
            ref, he, max_c = _numpy_macenko(img, None if m is None else m[b, 0].double().numpy())
            np.testing.assert_allclose(est.stain_matrix[b].double().numpy(), he, rtol=0, atol=tol)
            np.testing.assert_allclose(est.max_conc[b].double().numpy(), max_c, rtol=tol, atol=0)
            np.testing.assert_allclose(y[b], np.clip(ref - 1.0, 0, 255), rtol=0, atol=tol_255)


def test_fit_equals_the_numpy_macenko_of_the_pooled_images():
    imgs = [_he_tile(8), _he_tile(9)]
    masks = np.stack([_disc(64, 32, 32, 25), _disc(64, 28, 36, 20)])
    t = StainNormalize().fit(_to_batch(*imgs), torch.from_numpy(masks)[:, None])
    _, he, max_c = _numpy_macenko(np.concatenate(imgs, axis=0), np.concatenate(masks, axis=0))  # one tall image
    np.testing.assert_allclose(t.stain_matrix_, he, rtol=0, atol=1e-9)
    np.testing.assert_allclose(t.max_conc_, max_c, rtol=1e-9, atol=0)


def test_an_empty_batch_has_an_empty_estimate():
    for mask in (None, torch.zeros(0, 1, 8, 8)):
        est = estimate_stains(torch.rand(0, 3, 8, 8), mask)
        assert [tuple(t.shape) for t in est] == [(0, 3, 2), (0, 2), (0,), (0,)]


def test_masked_percentiles_equal_numpys():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(6, 301, generator=g, dtype=torch.float64)
    valid = torch.rand(6, 301, generator=g) < torch.linspace(0.05, 1.0, 6)[:, None]
    got = _masked_percentiles(v, valid, (1.0, 37.5, 99.0))
    for r in range(6):
        np.testing.assert_allclose(got[r].numpy(), np.percentile(v[r][valid[r]].numpy(), [1.0, 37.5, 99.0]), rtol=0, atol=1e-12)
    np.testing.assert_allclose(_masked_percentiles(v, None, (99.0,))[:, 0].numpy(), np.percentile(v.numpy(), 99.0, axis=1), atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_masked_percentiles_of_long_rows_equal_numpys(dtype):
    """Rows of a 224 x 224 crop take numpy's per-row partition on CPU instead of torch's topk:
    the same percentiles as np.percentile (linear interpolation), with few or all pixels valid,
    ties included (values rounded to 1/64)."""
    g = torch.Generator().manual_seed(1)
    N = 224 * 224
    v = (torch.randn(5, N, generator=g, dtype=torch.float64) * 64).round() / 64
    valid = torch.rand(5, N, generator=g) < torch.tensor([0.0005, 0.1, 0.5, 0.9, 1.0])[:, None]
    valid[0, :] = False
    valid[0, 123] = True  # one valid pixel: every percentile is that value
    qs = (1.0, 37.5, 99.0, 100.0)
    got = _masked_percentiles(v.to(dtype), valid, qs)
    atol = 1e-12 if dtype == torch.float64 else 1e-5
    for r in range(5):
        ref = np.percentile(v[r][valid[r]].numpy(), qs)
        np.testing.assert_allclose(got[r].double().numpy(), ref, rtol=0, atol=atol)
    np.testing.assert_allclose(_masked_percentiles(v.to(dtype), None, (1.0, 99.0)).double().numpy(), np.percentile(v.numpy(), [1.0, 99.0], axis=1).T, atol=atol)


def test_estimate_recovers_the_stains_of_an_he_tile():
    x = _to_batch(_he_tile(0), _he_tile(1))
    # beta 0.05: pure eosin has little red OD, so the default 0.15 keeps only its densest pixels
    est = estimate_stains(x, beta=0.05)
    assert est.applicable.all()
    for b in range(2):
        assert (_cosines(est.stain_matrix[b], np.stack([H_VEC, E_VEC], 1)) > 0.999).all()
    default = estimate_stains(x)
    assert (_cosines(default.stain_matrix[0], np.stack([H_VEC, E_VEC], 1)) > 0.98).all()


def test_normalised_output_has_the_reference_stains(ihc_tiles):
    x = torch.cat([_to_batch(_he_tile(2)), _to_batch(*ihc_tiles[:3])])
    y, ok = stain_normalize(x, return_applicable=True)
    assert ok.all()
    again = estimate_stains(y)  # re-estimated with our own function
    for b in range(len(x)):
        cos = _cosines(again.stain_matrix[b], REFERENCE_STAIN_MATRIX)
        assert (cos > 0.99).all(), f"crop {b}: cosines {cos}"


def test_batch_equals_one_crop_at_a_time(ihc_tiles):
    x = _to_batch(*ihc_tiles[:4, ::2, ::2], dtype=torch.float32)
    y = stain_normalize(x)
    for b in range(4):
        torch.testing.assert_close(y[b : b + 1], stain_normalize(x[b : b + 1]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_agrees_with_torchstain(ihc_tiles, backend):
    """torchstain returns Io exp(-OD') without taking the 1/255 offset back and truncates to
    uint8, so on the same 8-bit input its output is 0 to 1/255 above ours; its torch backend
    takes nearest-rank percentiles (numpy's and ours interpolate), which moves a few pixels by
    up to another 0.5/255."""
    torchstain = pytest.importorskip("torchstain")
    imgs = [_he_tile(3)] + list(ihc_tiles[3:6])
    ours = stain_normalize(_to_batch(*imgs)).permute(0, 2, 3, 1).numpy()
    tol = 0.02 if backend == "numpy" else 0.5
    for b, img in enumerate(imgs):
        norm = torchstain.normalizers.MacenkoNormalizer(backend=backend)
        inp = img if backend == "numpy" else torch.from_numpy(img).permute(2, 0, 1)
        ref = np.asarray(norm.normalize(I=inp, stains=False)[0], dtype=np.float64) / 255
        d = (ref - ours[b]) * 255
        assert d.min() >= -tol and d.max() <= 1 + tol, f"crop {b}: torchstain - ours in [{d.min():.3f}, {d.max():.3f}] / 255"


def test_fit_equals_torchstains_fit_and_self_normalisation_is_identity():
    torchstain = pytest.importorskip("torchstain")
    img = _he_tile(4)
    ts = torchstain.normalizers.MacenkoNormalizer(backend="numpy")
    ts.fit(img)
    t = StainNormalize().fit(torch.from_numpy(img).permute(2, 0, 1)[None])  # uint8 accepted
    np.testing.assert_allclose(t.stain_matrix_, ts.HERef, atol=1e-6)
    np.testing.assert_allclose(t.max_conc_, ts.maxCRef, rtol=1e-6)
    # normalising the fitted image to itself changes only what lies off the stain plane
    x = _to_batch(img)
    y = t(x)
    assert (y - x).abs().max() < 0.05 and (y - x).abs().mean() < 0.005


def test_background_only_crop_is_not_applicable_and_unchanged(ihc_tiles):
    x = _to_batch(ihc_tiles[0], ihc_tiles[1], dtype=torch.float32)
    white = torch.full((1, 3, 64, 64), 0.96) + 0.02 * torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    batch = torch.cat([x[:1], white, x[1:]])
    with pytest.warns(InterventionWarning, match="stain_normalize: 1 of 3 crop"):
        y, ok = stain_normalize(batch, return_applicable=True)
    assert ok.tolist() == [True, False, True]
    assert torch.equal(y[1], batch[1])
    torch.testing.assert_close(y[[0, 2]], stain_normalize(x), rtol=0, atol=1e-6)
    t = StainNormalize()
    with pytest.warns(InterventionWarning, match="1 of 1"):
        assert torch.equal(t(white), white) and t.last_applicable.tolist() == [False]
    # a cell mask restricts the estimate: an empty mask leaves nothing to estimate from
    mask = torch.zeros(3, 1, 64, 64)
    mask[0] = 1
    with pytest.warns(InterventionWarning, match="2 of 3"):
        _, ok = stain_normalize(batch, mask, return_applicable=True)
    assert ok.tolist() == [True, False, False]


def test_errors():
    x = torch.rand(1, 3, 8, 8)
    with pytest.raises(InterventionError, match="stain_matrix"):
        stain_normalize(x, stain_matrix=np.ones((2, 3)))
    with pytest.raises(InterventionError, match="max_conc"):
        StainNormalize(max_conc=(1.0, -1.0))
    with pytest.raises(InterventionError, match="alpha"):
        StainNormalize(alpha=50)
    with pytest.raises(InterventionError, match="no stain estimate"):
        StainNormalize().fit(torch.full((2, 3, 8, 8), 0.97))


def test_masked_percentiles_of_long_rows_on_several_threads_equal_numpys():
    """The per-row selection with torch on 3 threads (more rows than threads, a row without valid
    entries among them): every percentile as np.percentile's, adjacent order statistics near
    both ends of a row and in its middle (the middle ones wider than the tails the cut takes,
    so partitioned whole), coinciding positions (0 and 0.001 on a short row), ties; the input
    is left as it was (the invalid entries are made NaN on a copy)."""
    g = torch.Generator().manual_seed(2)
    R, N = 7, 200 * 200
    v = (torch.randn(R, N, generator=g, dtype=torch.float64) * 256).round() / 256
    valid = torch.rand(R, N, generator=g) < torch.linspace(0.002, 1.0, R)[:, None]
    valid[3] = False  # no valid entry: garbage for the caller to flag, and no failure
    qs = (0.0, 0.001, 1.0, 50.0, 98.7, 99.99, 100.0)
    before = v.clone()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        got = _masked_percentiles(v, valid, qs)
        got_all = _masked_percentiles(v, None, qs)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(v, before)
    for r in range(R):
        if r != 3:
            np.testing.assert_allclose(got[r].numpy(), np.percentile(v[r][valid[r]].numpy(), qs), rtol=0, atol=1e-12)
    np.testing.assert_allclose(got_all.numpy(), np.percentile(v.numpy(), qs, axis=1).T, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-14), (torch.float32, 1e-6)])
def test_pseudo_angle_orders_points_as_atan2_and_inverts_to_it(dtype, atol):
    """The pseudo-angle the percentiles are taken of: strictly increasing in numpy's arctan2
    over all four quadrants, the axes and both signed zeros on the negative x axis (the branch
    cut at +-pi), and mapped back onto arctan2 by `_angle_of_pseudo`."""
    from interventions.macenko import _angle_of_pseudo, _pseudo_angle

    g = torch.Generator().manual_seed(3)
    pts = torch.randn(2, 4000, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, 4000, dtype=torch.float64)
    # (x, y) on the axes: +-pi/2, 0, and the negative x axis with y = +0.0 (pi) and -0.0 (-pi)
    axis_x = [0.0, 0.0, 1.0, 2.0, -1.0, -2.0, -1.0, -3.0]
    axis_y = [1.0, -1.0, 0.0, -0.0, 0.0, 0.0, -0.0, -0.0]
    y, x = torch.cat((pts, torch.tensor([axis_y, axis_x], dtype=torch.float64)), 1).to(dtype)
    psi = _pseudo_angle(y, x, out=torch.empty_like(x), scratch=torch.empty_like(x))
    ref = np.arctan2(y.double().numpy(), x.double().numpy())
    order = np.argsort(ref, kind="stable")
    d = np.diff(psi.double().numpy()[order])
    distinct = np.diff(ref[order]) > 1e-5  # points whose angles differ beyond float32 rounding
    assert (d[distinct] > 0).all()
    np.testing.assert_allclose(_angle_of_pseudo(psi).double().numpy(), ref, rtol=0, atol=atol * 4)


def test_angle_percentiles_through_the_pseudo_angle_equal_numpys():
    """Percentiles of the angles taken on the pseudo-angle (its order statistics turned into
    angles, then interpolated) equal np.percentile of np.arctan2, on long rows (numpy's cut)
    and short ones (topk), with a mask."""
    from interventions.macenko import _angle_of_pseudo, _pseudo_angle

    g = torch.Generator().manual_seed(4)
    for N in (300, 224 * 224):
        y, x = torch.randn(2, 3, N, generator=g, dtype=torch.float64)
        y = y + 0.5
        valid = torch.rand(3, N, generator=g) < 0.6
        psi = _pseudo_angle(y, x, out=torch.empty_like(x), scratch=torch.empty_like(x))
        got = _masked_percentiles(psi, valid, (1.0, 50.0, 99.0), transform=_angle_of_pseudo)
        for r in range(3):
            ref = np.percentile(np.arctan2(y[r][valid[r]].numpy(), x[r][valid[r]].numpy()), [1.0, 50.0, 99.0])
            np.testing.assert_allclose(got[r].numpy(), ref, rtol=0, atol=1e-12)


def test_a_misleading_sample_falls_back_to_the_whole_row():
    """The tails are cut with thresholds read from every 16th entry; where those entries are not
    like the rest (here far above it, so the cut holds too few entries, or far below, so it holds
    nearly all), the percentiles are still np.percentile's."""
    g = torch.Generator().manual_seed(5)
    N = 224 * 224
    v = torch.randn(4, N, generator=g, dtype=torch.float64)
    v[0, ::16] += 1000.0
    v[1, ::16] -= 1000.0
    v[2, ::16] = 7.0  # ties at the sample's entries
    qs = (0.5, 1.0, 99.0, 99.9)
    got = _masked_percentiles(v, None, qs)
    np.testing.assert_allclose(got.numpy(), np.percentile(v.numpy(), qs, axis=1).T, rtol=0, atol=1e-12)
    valid = torch.rand(4, N, generator=g) < 0.3
    got = _masked_percentiles(v, valid, qs)
    for r in range(4):
        np.testing.assert_allclose(got[r].numpy(), np.percentile(v[r][valid[r]].numpy(), qs), rtol=0, atol=1e-12)
