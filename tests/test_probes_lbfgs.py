"""probes.lbfgs against scipy's L-BFGS-B: the same iterates, so the same early-stopped probes."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize, rosen, rosen_der

from probes.lbfgs import lbfgs
from probes.logistic import fit_multinomial, standardise


def scipy_lbfgsb(fun, x0, gtol, ftol, maxiter, maxls=50):
    res = minimize(fun, x0, jac=True, method="L-BFGS-B", options={"maxiter": maxiter, "maxls": maxls, "gtol": gtol, "ftol": ftol})
    return res.x, res.nit


@pytest.mark.parametrize("maxiter", [1, 2, 7, 1000])
@pytest.mark.parametrize("start", [(-1.2, 1.0), (2.0, -1.5, 0.3, 1.1, -0.7)])
def test_rosenbrock_iterates_match_scipy(start, maxiter) -> None:
    # Non-convex, with line searches that bracket and interpolate: every branch of dcstep runs.
    fun = lambda x: (rosen(x), rosen_der(x))  # noqa: E731
    x0 = np.array(start)
    ref, ref_nit = scipy_lbfgsb(fun, x0, gtol=1e-9, ftol=1e-15, maxiter=maxiter)
    x, f, nit = lbfgs(fun, x0, gtol=1e-9, ftol=1e-15, maxiter=maxiter, maxls=50)
    assert nit == ref_nit
    np.testing.assert_allclose(x, ref, rtol=1e-7, atol=1e-9)
    assert f == pytest.approx(rosen(x), rel=1e-12)


def test_gradient_already_small_stops_before_the_first_step() -> None:
    fun = lambda x: (float(x @ x), 2 * x)  # noqa: E731
    x, _, nit = lbfgs(fun, np.full(3, 1e-6), gtol=1e-4, ftol=1e-15, maxiter=10)
    assert nit == 0 and np.array_equal(x, np.full(3, 1e-6))


@pytest.mark.parametrize("C,tol,max_iter", [(0.01, 1e-4, 100), (1.0, 1e-4, 100), (100.0, 1e-6, 100), (1.0, 1e-8, 5)])
@pytest.mark.parametrize("rescale", [True, False])
def test_logistic_fits_match_scipy(C, tol, max_iter, rescale) -> None:
    # Early-stopped (C = 1, tol 1e-4: 3-5 iterations) and converged fits, cold and warm.
    rng = np.random.default_rng(0)
    n, D, K = 300, 12, 15
    y = rng.integers(0, K, n)
    X = rng.normal(size=(K, D))[y] + rng.normal(size=(n, D))
    mu, sd = standardise(X)
    A = (X - mu) / sd
    W0 = 0.1 * rng.normal(size=(D, K))
    for warm in (None, W0):
        Wr, br, itr = fit_multinomial(A, y, K, C, tol=tol, max_iter=max_iter, W0=warm, rescale=rescale, solver="scipy")
        W, b, it = fit_multinomial(A, y, K, C, tol=tol, max_iter=max_iter, W0=warm, rescale=rescale)
        assert it == itr
        np.testing.assert_allclose(W, Wr, rtol=1e-6, atol=1e-9 * np.abs(Wr).max())
        np.testing.assert_allclose(b, br, rtol=1e-6, atol=1e-9 * np.abs(br).max())
        np.testing.assert_array_equal((A @ W + b).argmax(1), (A @ Wr + br).argmax(1))


def test_unknown_solver_is_named() -> None:
    with pytest.raises(ValueError, match="solver must be 'lbfgs' or 'scipy'; got 'newton'"):
        fit_multinomial(np.zeros((4, 2)), np.array([0, 1, 0, 1]), 2, 1.0, solver="newton")
