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

``dcsrch`` and ``dcstep`` are MINPACK-2's line search (Moré and Thuente; public domain),
following scipy's Python port (``scipy/optimize/_dcsrch.py``, BSD-3-Clause, Copyright (c)
2001-2002 Enthought, Inc. 2003, SciPy Developers).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

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
        # Direction: -H g by the two-loop recursion (H0 = I / theta).
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
        d = q
        gd0 = float(g @ d)
        failed = gd0 >= 0
        if not failed:
            stp = min(1.0 / float(np.linalg.norm(d)), _BIG) if nit == 0 else 1.0
            search = _LineSearch(f, gd0, stp)
            stp, n_eval = search.stp, 0
            while True:
                if n_eval >= maxls:
                    failed = True
                    break
                xt = x + stp * d
                ft, gt = fun(xt)
                n_eval += 1
                gdt = float(gt @ d)
                stp, done = search.step(stp, ft, gdt)
                if done:
                    break
                if not math.isfinite(stp):  # scipy's line search gives up on a NaN step
                    failed = True
                    break
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


class _LineSearch:
    """MINPACK-2 ``dcsrch`` as a state machine: `step` takes f and f' at the step just evaluated
    and returns (next step, done). On done the step returned is the one just evaluated."""

    ftol, gtol, xtol, stpmin, stpmax = 1e-3, 0.9, 0.1, 0.0, _BIG

    def __init__(self, f0: float, g0: float, stp: float) -> None:
        self.stp = stp
        self.brackt = False
        self.stage = 1
        self.finit, self.ginit = f0, g0
        self.gtest = self.ftol * g0
        self.width = self.stpmax - self.stpmin
        self.width1 = self.width / 0.5
        self.stx, self.fx, self.gx = 0.0, f0, g0
        self.sty, self.fy, self.gy = 0.0, f0, g0
        self.stmin = 0.0
        self.stmax = stp + 4.0 * stp

    def step(self, stp: float, f: float, g: float) -> tuple[float, bool]:
        ftest = self.finit + stp * self.gtest
        if self.stage == 1 and f <= ftest and g >= 0:
            self.stage = 2
        if self.brackt and (stp <= self.stmin or stp >= self.stmax):
            return stp, True  # rounding errors prevent progress
        if self.brackt and self.stmax - self.stmin <= self.xtol * self.stmax:
            return stp, True  # xtol test satisfied
        if stp == self.stpmax and f <= ftest and g <= self.gtest:
            return stp, True
        if stp == self.stpmin and (f > ftest or g >= self.gtest):
            return stp, True
        if f <= ftest and abs(g) <= self.gtol * -self.ginit:
            return stp, True  # converged
        if self.stage == 1 and f <= self.fx and f > ftest:
            gt = self.gtest
            (self.stx, fxm, gxm, self.sty, fym, gym, stp, self.brackt) = _dcstep(
                self.stx, self.fx - self.stx * gt, self.gx - gt, self.sty, self.fy - self.sty * gt, self.gy - gt,
                stp, f - stp * gt, g - gt, self.brackt, self.stmin, self.stmax)
            self.fx = fxm + self.stx * gt
            self.fy = fym + self.sty * gt
            self.gx = gxm + gt
            self.gy = gym + gt
        else:
            (self.stx, self.fx, self.gx, self.sty, self.fy, self.gy, stp, self.brackt) = _dcstep(
                self.stx, self.fx, self.gx, self.sty, self.fy, self.gy, stp, f, g, self.brackt, self.stmin, self.stmax)
        if self.brackt:
            if abs(self.sty - self.stx) >= 0.66 * self.width1:
                stp = self.stx + 0.5 * (self.sty - self.stx)
            self.width1 = self.width
            self.width = abs(self.sty - self.stx)
            self.stmin = min(self.stx, self.sty)
            self.stmax = max(self.stx, self.sty)
        else:
            self.stmin = stp + 1.1 * (stp - self.stx)
            self.stmax = stp + 4.0 * (stp - self.stx)
        stp = min(max(stp, self.stpmin), self.stpmax)
        if self.brackt and (stp <= self.stmin or stp >= self.stmax or self.stmax - self.stmin <= self.xtol * self.stmax):
            stp = self.stx
        return stp, False


def _sqrt(v: float) -> float:
    return math.sqrt(v) if v >= 0 else math.nan  # as numpy's: a NaN step ends the search


def _sign(v: float) -> float:
    return 0.0 if v == 0 or v != v else math.copysign(1.0, v)


def _dcstep(stx, fx, dx, sty, fy, dy, stp, fp, dp, brackt, stpmin, stpmax):
    """MINPACK-2 ``dcstep``: a safeguarded cubic/quadratic step and the updated interval."""
    sgnd = _sign(dp) * _sign(dx)
    if fp > fx:
        theta = 3.0 * (fx - fp) / (stp - stx) + dx + dp
        s = max(abs(theta), abs(dx), abs(dp))
        gamma = s * _sqrt((theta / s) ** 2 - dx / s * (dp / s))
        if stp < stx:
            gamma = -gamma
        p = gamma - dx + theta
        q = gamma - dx + gamma + dp
        stpc = stx + p / q * (stp - stx)
        stpq = stx + dx / ((fx - fp) / (stp - stx) + dx) / 2.0 * (stp - stx)
        stpf = stpc if abs(stpc - stx) <= abs(stpq - stx) else stpc + (stpq - stpc) / 2.0
        brackt = True
    elif sgnd < 0.0:
        theta = 3.0 * (fx - fp) / (stp - stx) + dx + dp
        s = max(abs(theta), abs(dx), abs(dp))
        gamma = s * _sqrt((theta / s) ** 2 - dx / s * (dp / s))
        if stp > stx:
            gamma = -gamma
        p = gamma - dp + theta
        q = gamma - dp + gamma + dx
        stpc = stp + p / q * (stx - stp)
        stpq = stp + dp / (dp - dx) * (stx - stp)
        stpf = stpc if abs(stpc - stp) > abs(stpq - stp) else stpq
        brackt = True
    elif abs(dp) < abs(dx):
        theta = 3.0 * (fx - fp) / (stp - stx) + dx + dp
        s = max(abs(theta), abs(dx), abs(dp))
        gamma = s * math.sqrt(max(0.0, (theta / s) ** 2 - dx / s * (dp / s)))
        if stp > stx:
            gamma = -gamma
        p = gamma - dp + theta
        q = gamma + (dx - dp) + gamma
        r = p / q if q != 0 else math.nan
        if r < 0 and gamma != 0:
            stpc = stp + r * (stx - stp)
        elif stp > stx:
            stpc = stpmax
        else:
            stpc = stpmin
        stpq = stp + dp / (dp - dx) * (stx - stp)
        if brackt:
            stpf = stpc if abs(stpc - stp) < abs(stpq - stp) else stpq
            if stp > stx:
                stpf = min(stp + 0.66 * (sty - stp), stpf)
            else:
                stpf = max(stp + 0.66 * (sty - stp), stpf)
        else:
            stpf = stpc if abs(stpc - stp) > abs(stpq - stp) else stpq
            stpf = min(max(stpf, stpmin), stpmax)
    elif brackt:
        theta = 3.0 * (fp - fy) / (sty - stp) + dy + dp
        s = max(abs(theta), abs(dy), abs(dp))
        gamma = s * _sqrt((theta / s) ** 2 - dy / s * (dp / s))
        if stp > sty:
            gamma = -gamma
        p = gamma - dp + theta
        q = gamma - dp + gamma + dy
        stpf = stp + p / q * (sty - stp)
    elif stp > stx:
        stpf = stpmax
    else:
        stpf = stpmin
    if fp > fx:
        sty, fy, dy = stp, fp, dp
    else:
        if sgnd < 0:
            sty, fy, dy = stx, fx, dx
        stx, fx, dx = stp, fp, dp
    return stx, fx, dx, sty, fy, dy, stpf, brackt
