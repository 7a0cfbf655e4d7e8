"""scikit-learn's multinomial logistic regression, computed with float32 matrix products.

The probes fit many multinomial logistic regressions (one per class, fold and regularisation
value). Each is scikit-learn's ``LogisticRegression(C=C, tol=tol, max_iter=max_iter)`` objective
and stopping rule, minimised by L-BFGS with the iterates of scipy's L-BFGS-B, the optimiser
scikit-learn uses (`probes.lbfgs`; tested to give scipy's iterates)::

    f(W, c) = 1/n * sum_i [logsumexp_k (x_i W_k + c_k) - (x_i W_{y_i} + c_{y_i})]
              + 1 / (2 C n) * ||W||_F^2          (intercept c unpenalised)

stopping when the largest absolute gradient entry is below ``tol``. The optimiser works on
``w / a`` with one scalar ``a = (1 / (C n) + 1 / K)^(-1/2)``, the inverse square root of the
Hessian's scale at w = 0 for standardised features: this sets L-BFGS's first step on the
right scale (a strongly regularised problem otherwise spends its first iterations finding
it), and because it is one scalar the stopping rule ``max |grad_w| <= tol`` is applied exactly
(as ``max |grad_v| <= a tol``). Only the two matrix
products of each evaluation run in float32 (the parameters, the line search and the sums
stay in float64), which makes an evaluation 2-3x cheaper than scikit-learn's float64 one on
the same BLAS. The L-BFGS recursion runs in numpy (`probes.lbfgs`) rather than in scipy's
``setulb``, whose bookkeeping for bounds cost as much as the evaluations (on 1,875 x 513 x 250
one fit took 0.16 s of CPU against scipy's 0.22-0.35 s, same iterations); while it ran, the
BLAS threads spun idle. A warm start (``W0``, ``c0``) continues from another fit.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import numpy as np

from .lbfgs import lbfgs

# Multiply-adds per matrix product below which BLAS runs on one thread: waking a second
# thread for a product of a few milliseconds costs more than it saves on a loaded machine
# (group identifiability's folds: 4 s instead of 0.8 s on a loaded 2-core machine).
_SMALL_PRODUCT = 20_000_000


def blas_threads(size: int):
    """One BLAS thread for small products, the library's default otherwise."""
    global _CONTROLLER
    if size >= _SMALL_PRODUCT:
        return contextlib.nullcontext()
    if _CONTROLLER is None:  # scanning the loaded libraries costs milliseconds: once
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1, user_api="blas")


_CONTROLLER = None


# Multiply-adds per step below which torch runs on one thread. torch's OpenMP threads spin
# against other processes: on a loaded 2-core machine a 200-step adversary on 250 x 32
# features took 6-25 s with two threads and 0.3-2 s with one, and 100 steps on 4,000 x 512
# features (120 M multiply-adds a step) 9.4 s with two and 1.8 s with one.
_SMALL_TORCH_STEP = 1_000_000_000


@contextlib.contextmanager
def torch_threads(size: int):
    """One torch thread for work below `_SMALL_TORCH_STEP` multiply-adds, restored afterwards."""
    import torch

    if size >= _SMALL_TORCH_STEP:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def standardise(X_train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) of each column over the training rows, in float64.

    Columns constant on the training rows keep scale 1 (they carry nothing to standardise).
    """
    Xt = np.asarray(X_train, dtype=np.float64)
    mu = Xt.mean(axis=0)
    sd = Xt.std(axis=0)
    sd[sd <= 10 * np.finfo(np.float64).eps * np.maximum(np.abs(mu), 1.0)] = 1.0
    return mu, sd


def fit_multinomial(
    A: np.ndarray,
    y: np.ndarray,
    K: int,
    C: float,
    *,
    tol: float = 1e-4,
    max_iter: int = 100,
    W0: np.ndarray | None = None,
    c0: np.ndarray | None = None,
    rescale: bool = True,
    solver: str = "lbfgs",
) -> tuple[np.ndarray, np.ndarray, int]:
    """Minimise scikit-learn's multinomial logistic objective (module docstring) by L-BFGS.

    Args:
        A: (n, D) standardised features (cast to float32 for the products).
        y: (n,) int label codes in [0, K).
        K: number of labels (columns of W); a code absent from y gets an ever lower intercept,
            as in scikit-learn, so pass only labels that occur.
        C: inverse L2 strength (scikit-learn's C), > 0.
        tol: stop when max |gradient| <= tol (scikit-learn's ``tol``).
        max_iter: L-BFGS iterations at most.
        W0, c0: optional warm start, (D, K) and (K,).
        rescale: let L-BFGS work on ``w / a`` (module docstring); False: on w itself, as
            scikit-learn does (group identifiability's fit, kept as it was measured). The
            objective and the stopping rule are the same; the iterates, and so the early-
            stopped solution, differ slightly.
        solver: "lbfgs" (`probes.lbfgs`: L-BFGS-B's iterates without its bookkeeping) or
            "scipy" (``scipy.optimize.minimize(method="L-BFGS-B")``, the reference it is tested
            against).

    Returns:
        W (D, K) float64, c (K,) float64, and the number of L-BFGS iterations.
    """
    A = np.ascontiguousarray(A, dtype=np.float32)
    n, D = A.shape
    lam = 1.0 / (float(C) * n)
    a = 1.0 / math.sqrt(lam + 1.0 / K) if rescale else 1.0
    loss_grad = _objective(A, np.asarray(y, dtype=np.int64), K, lam, a)

    w0 = np.zeros((D + 1, K))
    if W0 is not None:
        w0[:-1] = W0
    if c0 is not None:
        w0[-1] = c0
    ftol = 64 * np.finfo(float).eps
    with blas_threads(n * (D + 1) * K):
        if solver == "lbfgs":
            v, _, nit = lbfgs(loss_grad, w0.ravel() / a, gtol=float(tol) * a, ftol=ftol, maxiter=int(max_iter), maxls=50)
        elif solver == "scipy":
            from scipy.optimize import minimize

            res = minimize(loss_grad, w0.ravel() / a, jac=True, method="L-BFGS-B",
                           options={"maxiter": int(max_iter), "maxls": 50, "gtol": float(tol) * a, "ftol": ftol})
            v, nit = res.x, int(res.nit)
        else:
            raise ValueError(f"solver must be 'lbfgs' or 'scipy'; got {solver!r}")
    W = (a * v).reshape(D + 1, K)
    return W[:-1], W[-1].copy(), int(nit)


def _objective(A: np.ndarray, y: np.ndarray, K: int, lam: float, a: float) -> Callable[[np.ndarray], tuple[float, np.ndarray]]:
    """``loss_grad(v) -> (loss, gradient)`` of the objective (module docstring) in the scaled
    variables ``v = w / a``, w the (D + 1, K) weights with the intercepts last, flattened.

    Args:
        A: (n, D) float32 features; y: (n,) int64 codes; K: labels; lam: ``1 / (C n)``, the
            L2 weight (intercepts unpenalised); a: the scale of the variables.
    """
    n, D = A.shape
    A1 = np.empty((n, D + 1), dtype=np.float32)
    A1[:, :D] = A
    A1[:, D] = 1.0
    A1t = np.ascontiguousarray(A1.T)
    rows = np.arange(n)

    def loss_grad(v: np.ndarray) -> tuple[float, np.ndarray]:
        Wf = (a * v).reshape(D + 1, K)
        Z = A1 @ Wf.astype(np.float32)
        Z -= Z.max(axis=1, keepdims=True)
        zy = Z[rows, y].astype(np.float64)
        np.exp(Z, out=Z)
        S = Z.sum(axis=1, keepdims=True)
        loss = float((np.log(S[:, 0].astype(np.float64)) - zy).mean())
        Z /= S
        Z[rows, y] -= 1.0
        G = (A1t @ Z).astype(np.float64)
        G /= n
        coef = Wf[:-1]
        loss += 0.5 * lam * float(np.dot(coef.ravel(), coef.ravel()))
        G[:-1] += lam * coef
        G *= a
        return loss, G.ravel()

    return loss_grad
