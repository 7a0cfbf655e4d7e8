"""Unconstrained L-BFGS with the iterates of scipy's L-BFGS-B, without its per-iteration overhead.

The probes' logistic fits have 100,000+ parameters (513 x 250 for a class of 250 parents) and
a function evaluation of a few milliseconds. scipy's L-BFGS-B (``minimize(method="L-BFGS-B")``)
spent about as long in its own bookkeeping (``setulb``, 3-9 ms a call, two calls an iteration)
as in the function: its compact representation serves bounds the probes do not have. Without
bounds, L-BFGS-B's step is the classic two-loop L-BFGS step, so this module runs that
recursion in numpy with L-BFGS-B's other rules kept as they are:

- memory ``m = 10`` corrections (scipy's ``maxcor``); initial inverse Hessian ``1 / theta`` with
  ``theta = y'y / s'y`` of the newest pair (1 before any); a pair with
  ``s'y <= eps * (-g_old'd * step)`` is skipped;
- first direction ``-g`` with step ``1 / ||g||``, afterwards step 1; Moré-Thuente line search
  (MINPACK-2 ``dcsrch``: ``ftol=1e-3, gtol=0.9, xtol=0.1``, step bounds ``[0, 1e10]``), at most
  ``maxls`` evaluations, then the memory is dropped and the iteration restarted (stop if
  the memory was already empty);
- stop when ``max |g| <= gtol`` (at the start, too), when the relative decrease
  ``(f_old - f) / max(|f_old|, |f|, 1) <= ftol``, or after ``maxiter`` iterations.

`tests/test_probes_parent_probe.py` checks that the iterates match scipy's L-BFGS-B (same
number of iterations, same point to float rounding) on early-stopped and converged fits.

The line search is scipy's own MINPACK-2 ``dcsrch`` (``scipy.optimize._dcsrch.DCSRCH``), driven
one function evaluation at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.optimize._dcsrch import DCSRCH  # scipy >= 1.11

_BIG = 1e10  # L-BFGS-B's step bound without bounds on the variables


def lbfgs(
    fun: Callable[[np.ndarray], tuple[float, np.ndarray]],
    x0: np.ndarray,
    *,
    gtol: float,
    ftol: float,
    maxiter: int,
    maxls: int = 20,
    m: int = 10,
) -> tuple[np.ndarray, float, int]:
    """Minimise ``fun`` (returning value and gradient) from ``x0``; rules in the module docstring.

    Each iteration: direction (`_two_loop`), line search (`_search_line`), then the stopping
    rules and the memory update.

    Returns:
        x (float64, a new array), f(x), and the number of iterations.
    """
    eps = np.finfo(np.float64).eps
    x = np.array(x0, dtype=np.float64)
    f, g = fun(x)
    if float(np.abs(g).max(initial=0.0)) <= gtol:
        return x, f, 0
    S: list[np.ndarray] = []
    Y: list[np.ndarray] = []
    rho: list[float] = []
    theta = 1.0
    nit = 0
    while True:
        d = _two_loop(g, S, Y, rho, theta)
        gd0 = float(g @ d)
        failed = gd0 >= 0
        if not failed:
            stp = min(1.0 / float(np.linalg.norm(d)), _BIG) if nit == 0 else 1.0
            failed, stp, xt, ft, gt = _search_line(fun, x, f, d, gd0, stp, maxls)
        if failed:
            if not S:  # nothing to drop: stop at the last accepted point (scipy: ABNORMAL)
                return x, f, nit
            S, Y, rho, theta = [], [], [], 1.0
            continue
        f_old, g_old = f, g
        x, f, g = xt, ft, gt
        nit += 1
        if nit >= maxiter or float(np.abs(g).max()) <= gtol:
            return x, f, nit
        if f_old - f <= ftol * max(abs(f_old), abs(f), 1.0):
            return x, f, nit
        y = g - g_old
        s = stp * d
        dr = float(s @ y)
        if dr <= eps * (-gd0 * stp):  # curvature too small: skip the update, as L-BFGS-B does
            continue
        if len(S) == m:
            S.pop(0), Y.pop(0), rho.pop(0)
        S.append(s)
        Y.append(y)
        rho.append(1.0 / dr)
        theta = float(y @ y) / dr


def _two_loop(g: np.ndarray, S: list[np.ndarray], Y: list[np.ndarray], rho: list[float], theta: float) -> np.ndarray:
    """The direction -H g by the two-loop recursion over the stored pairs (H0 = I / theta);
    -g itself (a new array) with no pair stored."""
    q = -g
    if S:
        alpha = []
        for s, y, r in zip(reversed(S), reversed(Y), reversed(rho)):
            a_ = r * float(s @ q)
            alpha.append(a_)
            q -= a_ * y
        q /= theta
        for s, y, r, a_ in zip(S, Y, rho, reversed(alpha)):
            q += (a_ - r * float(y @ q)) * s
    return q


def _search_line(fun, x: np.ndarray, f: float, d: np.ndarray, gd0: float, stp: float, maxls: int):
    """Moré-Thuente line search along `d` from `x` (f(x) = `f`, slope `gd0`), first trying
    `stp`: (failed, step, x + step d, f and gradient there). It fails after `maxls`
    evaluations or on a NaN step (where scipy's line search gives up)."""
    search = _LineSearch(f, gd0, stp)
    stp, n_eval = search.stp, 0
    xt = ft = gt = None
    while True:
        if n_eval >= maxls:
            return True, stp, xt, ft, gt
        xt = x + stp * d
        ft, gt = fun(xt)
        n_eval += 1
        gdt = float(gt @ d)
        stp, done = search.step(stp, ft, gdt)
        if done:
            return False, stp, xt, ft, gt
        if not math.isfinite(stp):
            return True, stp, xt, ft, gt


class _LineSearch:
    """scipy's MINPACK-2 line search (``scipy.optimize._dcsrch.DCSRCH``, Moré-Thuente ``dcsrch``)
    driven one evaluation at a time: `step` takes f and f' at the step just evaluated and
    returns (next step, done). On done the step returned is the one just evaluated; a search
    that ends with ``WARNING`` (rounding errors, the xtol interval) is accepted, as L-BFGS-B
    accepts it; an ``ERROR`` returns a NaN step (the caller treats it as a failed search).

    The state machine (`DCSRCH._iterate`) is private scipy API: scipy's own `DCSRCH.__call__`
    cannot be used because it evaluates f and f' separately and rejects ``WARNING`` steps.
    """

    ftol, gtol, xtol, stpmin, stpmax = 1e-3, 0.9, 0.1, 0.0, _BIG

    def __init__(self, f0: float, g0: float, stp: float) -> None:
        self._search = DCSRCH(None, None, self.ftol, self.gtol, self.xtol, self.stpmin, self.stpmax)
        self.stp, _, _, self._task = self._search._iterate(stp, f0, g0, b"START")

    def step(self, stp: float, f: float, g: float) -> tuple[float, bool]:
        nxt, _, _, self._task = self._search._iterate(stp, f, g, self._task)
        if self._task[:2] == b"FG":
            return nxt, False
        if self._task[:4] in (b"CONV", b"WARN"):
            return stp, True
        return math.nan, False
