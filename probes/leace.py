"""LEACE erasure of the parent code, a refitted head, and the paper's erasure check (F5).

`LeaceErasure` wraps concept-erasure's `LeaceFitter` (Belrose et al. 2023, least-squares
concept erasure) with the crop's **parent one-hot** as the concept z. Statistics are
accumulated and the eraser built in float64 whatever the input dtype. The eraser is the affine
map::

    x' = x - (x - mean_x) R^T L^T        L = W^+ U_r (D, r),  R = U_r^T W (r, D)

where W = Sigma_xx^(-1/2) is the whitening matrix of the (shrunk) feature covariance and U_r
holds the top-r left singular vectors of the whitened cross-covariance W Sigma_xz whose singular
values exceed ``svd_tol``. ``rank=None`` keeps them all and is concept-erasure's own eraser;
``rank=r`` keeps the r largest (concept-erasure has no rank argument, so the eraser is built
here from the fitter's statistics exactly as `LeaceFitter.eraser` builds it, truncated).
``x - x'`` then has rank r: exactly r directions are changed. After full erasure no linear
classifier of z beats a constant one on the data the eraser was fitted on.

``within_class=True`` erases the parent code **within class**: the one-hot z is first
residualised on the class one-hot (z - E[z | class], the least-squares residual), so the
differences between class means are not part of the concept and class information survives.
Without it, the class means differ along parent directions (parents nest in classes) and are
erased with them.

How many directions: z has as many columns as parents, so with P parents the whitened
cross-covariance has up to min(D, P - 1) nonzero singular values (P - K within class), sampling
noise included. With P > D, full LEACE erases every direction and leaves a constant: limit the
rank (the paper used 256) or raise ``svd_tol``.

**Cross-fitting.** An eraser fitted on the crops a probe is then scored on equalises each
parent's mean over exactly those crops, which pushes a held-out sibling away from its own
parent's other crops: a prototype on real texture features went from R = 0.994 to 0.000 with a
class-only floor of 0.0625, below the floor, an artefact. `erasure_check` therefore measures R
after erasure with `ParentProbe`'s ``cross_fit`` hook: every inner and outer probe reads
features erased by an eraser fitted without the crops it is validated or scored on.

`refit_head` trains a new linear head on erased training features and folds eraser,
standardisation and head into one ``nn.Linear`` on the model's own features, so that
``adapter.head = refit.head`` (or ``with refit.installed(adapter):``) makes the model erase and
classify in one step; the previous head is restored on exit.

`erasure_check` reports R before and after (a fresh probe on erased features), the share of the
above-floor R removed, the accuracy of heads refitted on original and on erased training
features, and the paper's check: at least ``min_removed`` (1/4) of the above-floor R removed at
an accuracy cost of at most ``max_cost`` (0.01 = 1 pp).

Probes establish availability, not use: erasing the linearly decodable parent code and seeing
no change in the leak says the leak does not need that code, not that the model holds no parent
information.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> parents = np.repeat(np.arange(6), 20); labels = parents % 2
    >>> X = rng.normal(size=(120, 16)); X[:, 0] += 3 * (parents % 3)
    >>> er = LeaceErasure(rank=1, within_class=True).fit(X, parents, labels)
    >>> Xe = er.transform(X.astype(np.float32))
    >>> Xe.dtype, er.rank_, int(np.linalg.matrix_rank(X - Xe, tol=1e-4))
    (dtype('float32'), 1, 1)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from .before_after import CheckDiagnostic, CheckOutcome, check_inputs, check_rows, fit_after, fit_before, outcome
from .logistic import fit_multinomial, standardise, torch_threads
from .base import DiagnosticContext, row
from .errors import DiagnosticError
from .parent_probe import ParentProbe, check_features, fitted_probe, require
from .registry import register
from .validation import as_numpy, bad, check_int, check_positive

__all__ = ["ErasureCheck", "HeadRefit", "LeaceDiagnostic", "LeaceErasure", "erasure_check", "refit_head"]


def _one_hot(codes: np.ndarray, n: int) -> np.ndarray:
    z = np.zeros((len(codes), n))
    z[np.arange(len(codes)), codes] = 1.0
    return z


def concept(parents: np.ndarray, labels: np.ndarray | None = None) -> np.ndarray:
    """(N, P) float64 parent one-hot, residualised on the class one-hot when labels are given.

    The residual of a least-squares fit of z on the class indicators is z minus its mean over
    the crop's class: ``z_res[i] = z[i] - mean_{j: class j = class i} z[j]``.
    """
    _, par = np.unique(parents, return_inverse=True)
    par = par.reshape(-1)
    z = _one_hot(par, int(par.max()) + 1 if len(par) else 0)
    if labels is not None:
        _, cls = np.unique(labels, return_inverse=True)
        cls = cls.reshape(-1)
        K = int(cls.max()) + 1
        sums = np.zeros((K, z.shape[1]))
        np.add.at(sums, cls, z)
        z -= (sums / np.bincount(cls, minlength=K)[:, None])[cls]
    return z


def build_eraser(fitter, rank: int | None = None):
    """A `concept_erasure.LeaceEraser` from a fitted `LeaceFitter`, keeping the top `rank` directions.

    The construction is `LeaceFitter.eraser`'s (whitening by the eigendecomposition of
    ``sigma_xx`` with its pseudo-inverse threshold, SVD of the whitened cross-covariance,
    singular values <= ``svd_tol`` dropped, the covariance-trace constraint) with U truncated to
    its first `rank` columns. ``rank=None`` gives concept-erasure's own eraser.

    Returns:
        (eraser, singular values (all, descending), number of directions kept, whether the
        trace constraint changed the projection).
    """
    from concept_erasure import LeaceEraser

    if fitter.method != "leace":  # pragma: no cover - LeaceErasure always uses "leace"
        raise DiagnosticError(f"build_eraser needs a 'leace' fitter; got method={fitter.method!r}")
    eye = torch.eye(fitter.x_dim, device=fitter.mean_x.device, dtype=fitter.mean_x.dtype)
    sigma = fitter.sigma_xx
    L, V = torch.linalg.eigh(sigma)
    mask = L > (L[-1] * sigma.shape[-1] * torch.finfo(L.dtype).eps)
    L = L.clamp_min(0.0)
    W = V * torch.where(mask, L.rsqrt(), 0.0) @ V.mH
    W_inv = V * torch.where(mask, L.sqrt(), 0.0) @ V.mH
    u, s, _ = torch.linalg.svd(W @ fitter.sigma_xz, full_matrices=False)
    keep = s > fitter.svd_tol
    if rank is not None:
        keep &= torch.arange(len(s), device=s.device) < rank
    u = u[:, keep]
    proj_left = W_inv @ u
    proj_right = u.mH @ W
    constrained = False
    if fitter.constrain_cov_trace:
        P = eye - proj_left @ proj_right
        old_trace = torch.trace(sigma)
        new_trace = torch.trace(P @ sigma @ P.mH)
        if new_trace.real > old_trace.real:  # as concept-erasure: mix towards the orthogonal projection
            constrained = True
            Q = eye - u @ u.mH
            x, y, z, w = new_trace, 2 * torch.trace(P @ sigma @ Q.mH), torch.trace(Q @ sigma @ Q.mH), old_trace
            discr = torch.sqrt(4 * w * x - 4 * w * y + 4 * w * z - 4 * x * z + y**2)
            alpha1 = (-y / 2 + z - discr / 2) / (x - y + z)
            alpha2 = (-y / 2 + z + discr / 2) / (x - y + z)
            alpha = torch.where(alpha1.real > 0, alpha1, alpha2).clamp(0, 1)
            P = alpha * P + (1 - alpha) * Q
            uu, ss, vh = torch.linalg.svd(eye - P)
            proj_left = uu * ss.sqrt()
            proj_right = vh * ss.sqrt()
    eraser = LeaceEraser(proj_left, proj_right, bias=fitter.mean_x if fitter.affine else None)
    return eraser, s.cpu().numpy(), int(keep.sum()), constrained


class LeaceErasure:
    """LEACE erasure of the parent one-hot, optionally within class and rank-limited.

    Args:
        rank: erase only the top-r directions (None: all with singular value > svd_tol).
        within_class: residualise the parent one-hot on the class one-hot first (`fit` then
            needs labels), so class information survives.
        svd_tol: concept-erasure's threshold on the whitened cross-covariance's singular values.
            Its default (0.01) suits a few standardised concept columns; a parent one-hot's
            columns have variance ~1/P, and with hundreds of parents a real parent code can
            fall under 0.01, so the default here is 1e-6.
        shrinkage: shrink the feature covariance (concept-erasure's optimal linear shrinkage).
        constrain_cov_trace: concept-erasure's covariance-trace constraint. With an exact
            whitening LEACE never raises the trace, so it only acts when the covariance is
            singular; when it acts, the erased subspace can exceed `rank` (recorded in
            ``trace_constrained_``).

    Attributes (fitted):
        fitter_: the `concept_erasure.LeaceFitter` (float64).
        eraser_: the `concept_erasure.LeaceEraser` built from it (float64).
        rank_: directions erased.
        singular_values_: (min(D, P),) singular values of the whitened cross-covariance.
        n_parents_: parents in the concept; n_features_in_: D.
        trace_constrained_: the trace constraint changed the eraser.
    """

    def __init__(self, rank: int | None = None, within_class: bool = False, svd_tol: float = 1e-6, shrinkage: bool = True,
                 constrain_cov_trace: bool = True) -> None:
        self.rank = rank
        self.within_class = within_class
        self.svd_tol = svd_tol
        self.shrinkage = shrinkage
        self.constrain_cov_trace = constrain_cov_trace

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rank={self.rank}, within_class={self.within_class}, svd_tol={self.svd_tol}, "
                f"shrinkage={self.shrinkage}, constrain_cov_trace={self.constrain_cov_trace})")

    def _check_params(self) -> None:
        owner = type(self).__name__
        if self.rank is not None:
            check_int(owner, "rank", self.rank, 1)
        check_positive(owner, "svd_tol", self.svd_tol)
        for name in ("within_class", "shrinkage", "constrain_cov_trace"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise bad(owner, name, "True or False", getattr(self, name))

    def fit(self, X, parents, labels=None) -> "LeaceErasure":
        """Fit the eraser.

        Args:
            X: (N, D) features (numpy or torch, any float or int dtype; fitted in float64).
            parents: (N,) parent of each crop (the concept, one-hot encoded).
            labels: (N,) class of each crop; required with ``within_class=True``.

        Returns:
            self.

        Raises:
            DiagnosticError: lengths differ, non-finite features, fewer than two crops or
                parents, or labels missing with ``within_class=True``.
        """
        from concept_erasure import LeaceFitter

        self._check_params()
        who = "LeaceErasure"
        if self.within_class and labels is None:
            raise DiagnosticError(f"{who}(within_class=True) needs labels= (one class per crop) to residualise the parent code on")
        require(f"{who}.fit", parents=parents)
        X, parents, labels = check_features(who, X, parents, labels, names=("parents", "labels"))
        n_par = len(np.unique(parents))
        if X.shape[0] < 2 or n_par < 2:
            raise DiagnosticError(f"{who} needs at least two crops from two parents; got {X.shape[0]} crops from {n_par} parent(s)")
        z = concept(parents, labels if self.within_class else None)
        x = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float64))
        fitter = LeaceFitter(X.shape[1], z.shape[1], method="leace", affine=True, constrain_cov_trace=bool(self.constrain_cov_trace),
                             dtype=torch.float64, shrinkage=bool(self.shrinkage), svd_tol=float(self.svd_tol))
        # One torch thread: a 512 x 512 eigh and SVD took 0.1 s on one thread and 14 s on two
        # contended OpenMP threads of a loaded 2-core machine; they gain little from threads anyway.
        with torch_threads(0):
            fitter.update(x, torch.from_numpy(z))
            self.fitter_ = fitter
            self.eraser_, self.singular_values_, self.rank_, self.trace_constrained_ = build_eraser(fitter, self.rank)
        self.n_parents_ = n_par
        self.n_features_in_ = X.shape[1]
        return self

    def transform(self, X):
        """Erase: ``x - (x - mean_x) R^T L^T``, computed in float64.

        Args:
            X: (N, D) features, numpy or torch.

        Returns:
            The erased features, same type, shape and (float) dtype as X (integer input
            gives float64).
        """
        if not hasattr(self, "eraser_"):
            raise DiagnosticError("LeaceErasure.transform called before fit")
        is_torch = isinstance(X, torch.Tensor)
        arr = X.detach().cpu().numpy() if is_torch else np.asarray(X)
        if arr.ndim != 2 or arr.shape[1] != self.n_features_in_:
            raise DiagnosticError(f"LeaceErasure was fitted on {self.n_features_in_} features; transform got shape {arr.shape}")
        with torch_threads(arr.shape[0] * arr.shape[1] * max(self.rank_, 1) * 2):
            out = self.eraser_(torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64))).numpy()
        dtype = arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.float64
        out = out.astype(dtype, copy=False)
        return torch.from_numpy(out).to(X.device) if is_torch else out

    def fit_transform(self, X, parents, labels=None):
        return self.fit(X, parents, labels).transform(X)

    def affine(self) -> tuple[np.ndarray, np.ndarray]:
        """(A, a) float64 with ``transform(x) == x @ A + a``: A (D, D), a (D,)."""
        e = self.eraser_
        M = (e.proj_right.mH @ e.proj_left.mH).numpy()  # (D, D): x -> (x - mean) R^T L^T
        A = np.eye(M.shape[0]) - M
        a = e.bias.numpy() @ M if e.bias is not None else np.zeros(M.shape[0])
        return A, a


# ------------------------------------------------------------------------------ refitted head
@dataclass
class HeadRefit:
    """A linear head trained on (erased) training features, folded onto the model's features.

    Attributes:
        head: ``nn.Linear(D, K)`` on the model's own features: ``head(f)`` erases f (when an
            eraser was given), standardises it as in training and applies the fitted head.
        accuracy: test-set name -> accuracy of `head` (fraction in [0, 1]).
        n: test-set name -> crops scored.
        n_iter: L-BFGS iterations of the fit.
    """

    head: nn.Linear
    accuracy: dict = field(default_factory=dict)
    n: dict = field(default_factory=dict)
    n_iter: int = 0

    def install(self, adapter) -> nn.Module:
        """Put `head` into the adapter's model; returns the head it replaces (to restore)."""
        old = adapter.head
        adapter.head = self.head
        return old

    @contextlib.contextmanager
    def installed(self, adapter):
        """``with refit.installed(adapter): ...`` uses the refitted head, then restores the old one."""
        old = self.install(adapter)
        try:
            yield adapter
        finally:
            adapter.head = old


def refit_head(adapter, features_train, y_train, test_sets: Mapping[str, tuple] | None = None, *, eraser: LeaceErasure | None = None,
               C: float = 1.0, tol: float = 1e-4, max_iter: int = 500) -> HeadRefit:
    """Train a new linear head on (erased) training features and score it on test sets.

    The head is scikit-learn's multinomial ``LogisticRegression(C=C, tol=tol, max_iter=max_iter)``
    on standardised (erased) features (`probes.logistic`); eraser, standardisation and head are
    folded into one ``nn.Linear`` on the model's raw features. The adapter is not changed: use
    ``result.installed(adapter)`` or ``result.install(adapter)`` to put the head in.

    Args:
        adapter: the wrapped model (`shortcutlab.wrap`), or None. It sets the head's number of
            outputs (``adapter.num_classes``), dtype and device.
        features_train: (n, D) the model's frozen features of the training crops.
        y_train: (n,) class index of each training crop, in [0, K).
        test_sets: name -> (features (m, D), class indices (m,)) to score (raw, un-erased
            features: the head erases them itself).
        eraser: a fitted `LeaceErasure` applied before the head (None: no erasure).
        C, tol, max_iter: the logistic fit.

    Returns:
        `HeadRefit`.

    Raises:
        DiagnosticError: bad shapes, non-finite features, a class index outside [0, K), or
            fewer than two classes in training.
    """
    who = "refit_head"
    X, y, _ = check_features(who, as_numpy(features_train), as_numpy(y_train), None, names=("y_train", ""))
    if not np.issubdtype(y.dtype, np.integer):
        raise DiagnosticError(f"{who} needs y_train as integer class indices; got dtype {y.dtype}")
    K = int(adapter.num_classes) if adapter is not None else int(y.max()) + 1
    if len(y) and (y.min() < 0 or y.max() >= K):
        raise DiagnosticError(f"{who}: y_train holds class indices outside [0, {K}) ({int(y.min())}..{int(y.max())})")
    present = np.unique(y)
    if len(present) < 2:
        raise DiagnosticError(f"{who} needs training crops of at least two classes; got {len(present)} class(es) ({present.tolist()})")
    D = X.shape[1]
    if adapter is not None and int(adapter.num_features) != D:
        raise DiagnosticError(f"{who}: features have {D} columns but the model's num_features is {adapter.num_features}")
    if eraser is not None:
        A_e, a_e = eraser.affine()
        if A_e.shape[0] != D:
            raise DiagnosticError(f"{who}: the eraser was fitted on {A_e.shape[0]} features; the training features have {D}")
    else:
        A_e, a_e = np.eye(D), np.zeros(D)
    Xe = X.astype(np.float64) @ A_e + a_e
    mu, sd = standardise(Xe)
    local = np.searchsorted(present, y)
    Wl, bl, it = fit_multinomial((Xe - mu) / sd, local, len(present), check_positive(who, "C", C), tol=tol, max_iter=max_iter)
    W = np.zeros((D, K))
    b = np.full(K, -1e4)  # classes absent from training are never predicted
    W[:, present] = Wl
    b[present] = bl
    # logits = ((x A + a - mu) / sd) W + b  =  x (A W / sd) + ((a - mu) / sd) W + b
    Wf = A_e @ (W / sd[:, None])
    bf = ((a_e - mu) / sd) @ W + b
    dtype = adapter.dtype if adapter is not None else torch.float32
    device = adapter.device if adapter is not None else torch.device("cpu")
    head = nn.Linear(D, K).to(device=device, dtype=dtype)
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(Wf.T))
        head.bias.copy_(torch.from_numpy(bf))
    out = HeadRefit(head=head, n_iter=it)
    for name, (Xt, yt) in (test_sets or {}).items():
        Xt, yt, _ = check_features(f"{who} test set {name!r}", as_numpy(Xt), as_numpy(yt), None, names=("labels", ""))
        if Xt.shape[1] != D:
            raise DiagnosticError(f"{who} test set {name!r} has {Xt.shape[1]} features; training has {D}")
        pred = (Xt.astype(np.float64) @ Wf + bf).argmax(1)
        out.accuracy[name] = float((pred == yt).mean()) if len(yt) else math.nan
        out.n[name] = int(len(yt))
    return out


# ------------------------------------------------------------------------------ the check
@dataclass(frozen=True, kw_only=True)
class ErasureCheck(CheckOutcome):
    """R before and after erasure, the accuracy cost, and the paper's pass/fail check.

    Attributes:
        rank: the requested rank (None: full); n_directions: directions the train-side
            eraser removed.
        probe_before, probe_after, R_before, R_after, floor, above_floor_before,
            above_floor_after, removed_share, check_on, cost, min_removed, max_cost, passed:
            as `probes.before_after.CheckOutcome` (probe_after: cross-fitted erasers).
        accuracy_before, accuracy_after: test-set name -> accuracy of heads refitted on the
            original / erased training features (same fit, so the difference is erasure's).
        head_after: the `HeadRefit` on erased features (install it to use the erased model).
    """

    rank: int | None
    n_directions: int
    head_after: HeadRefit


def erasure_check(X, labels, parents, *, train_idx, test_sets: Mapping[str, np.ndarray], rank: int | None = None,
                  within_class: bool = True, probe: ParentProbe | None = None, adapter=None, check_on: str | None = None,
                  min_removed: float = 0.25, max_cost: float = 0.01, C: float = 1.0, svd_tol: float = 1e-6,
                  probe_before: ParentProbe | None = None) -> ErasureCheck:
    """The paper's F5 check for one rank: erase, re-probe (cross-fitted), refit the head, compare.

    R is probed over all rows of X (R before: `probe`'s settings on X; R after: the same
    settings, each probe reading features erased by an eraser fitted without its validation /
    scored crops). The heads are fitted on ``train_idx`` (the eraser for the head too) and
    scored on each index set of `test_sets`.

    Args:
        X: (N, D) frozen features.
        labels: (N,) class index of each crop (integers in [0, K) when an adapter is given:
            the adapter's class order).
        parents: (N,) parent of each crop.
        train_idx: rows the head and its eraser are fitted on.
        test_sets: name -> rows to score the heads on (e.g. {"test": ..., "P2": ...}).
        rank, within_class, svd_tol: the eraser (`LeaceErasure`).
        probe: a `ParentProbe` whose settings are used (unfitted; default settings if None).
        adapter: optional wrapped model (sets the head's classes, dtype, device).
        check_on: the test set the cost is measured on (default: the first of `test_sets`).
        min_removed: smallest share of above-floor R that must go (0.25 in the paper).
        max_cost: largest accuracy loss allowed, as a fraction (0.01 = 1 pp).
        C: the heads' inverse L2 strength.
        probe_before: an already fitted probe on X with the same settings (saves refitting it
            when checking several ranks).

    Returns:
        `ErasureCheck`.
    """
    who = "erasure_check"
    X, labels, parents, train_idx, check_on = check_inputs(who, X, labels, parents, train_idx, test_sets, check_on)
    for name in ("min_removed", "max_cost"):
        v = locals()[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise bad(who, name, "a finite number", v)
    eraser_kw = dict(rank=rank, within_class=within_class, svd_tol=svd_tol)

    before = fit_before(probe, probe_before, X, labels, parents)

    def erased(mask: np.ndarray) -> np.ndarray:
        return LeaceErasure(**eraser_kw).fit(X[mask], parents[mask], labels[mask]).transform(X)

    after = fit_after(probe, X, labels, parents, cross_fit=erased)

    y = np.asarray(labels)
    if not np.issubdtype(y.dtype, np.integer):
        _, y = np.unique(y, return_inverse=True)
        y = y.reshape(-1)
    tests = {name: (X[np.asarray(rows, dtype=np.int64)], y[np.asarray(rows, dtype=np.int64)]) for name, rows in test_sets.items()}
    eraser = LeaceErasure(**eraser_kw).fit(X[train_idx], parents[train_idx], labels[train_idx])
    head_before = refit_head(adapter, X[train_idx], y[train_idx], tests, C=C)
    head_after = refit_head(adapter, X[train_idx], y[train_idx], tests, eraser=eraser, C=C)
    return ErasureCheck(
        rank=rank, n_directions=eraser.rank_, head_after=head_after,
        **outcome(before, after, dict(head_before.accuracy), dict(head_after.accuracy), check_on, min_removed, max_cost,
                  warn="erasure_check"),
    )


# ------------------------------------------------------------------------------ diagnostic
@register("leace")
class LeaceDiagnostic(CheckDiagnostic):
    """LEACE erasure of the parent code at each rank, with a refitted head (the paper's F5).

    R is probed over every crop of the table; heads and their eraser are fitted on the split's
    training side and scored on its test side (``test``) and on any extra named index sets.

    Rows per rank (setting ``rank=<r>`` or ``rank=full``): ``R`` and ``R_after`` (Wilson
    intervals), ``floor``, ``above_floor``, ``above_floor_after``, ``removed_share``,
    ``n_directions``, ``accuracy_before`` / ``accuracy_after`` / ``accuracy_cost`` per test set
    (setting ``rank=<r>,test_set=<name>``; cost = before - after, a fraction), and
    ``check_passed`` (1.0 / 0.0: at least `min_removed` of the above-floor R removed at a cost
    of at most `max_cost` on `check_on`).

    Args:
        ranks: ranks to erase (None: full LEACE); the paper used 256.
        within_class: erase the parent code within class (default True: class information
            survives).
        test_sets: extra name -> row indices to score the heads on (e.g. P1 and P2 test sets).
        check_on: the test set of the check (default "test", the split's test side).
        min_removed, max_cost: the check's thresholds.
        n_folds, Cs: the `ParentProbe`'s settings; random_state: its folds (None: ctx.seed).
        C: the heads' inverse L2 strength.
    """

    label = "LEACE"
    metric_labels = {"R": "R", "R_after": "R after erasure"}
    metric_units = {"R": "fraction", "R_after": "fraction"}
    supplies = {"recoverability_before_erasure": "R", "recoverability_after_erasure": "R_after",
                "head_accuracy_before_erasure": "accuracy_before", "head_accuracy_after_erasure": "accuracy_after"}

    def __init__(self, ranks: Sequence[int | None] = (256,), within_class: bool = True, test_sets: Mapping[str, Sequence[int]] | None = None,
                 check_on: str = "test", min_removed: float = 0.25, max_cost: float = 0.01, n_folds: int = 4,
                 Cs: float | Sequence[float] = (0.01, 0.1, 1.0), random_state: int | None = None, C: float = 1.0) -> None:
        ranks = (ranks,) if ranks is None or isinstance(ranks, (int, np.integer)) else ranks
        try:
            self.ranks = tuple(ranks)
        except TypeError:
            raise bad("leace", "ranks", "a list of ranks (integers >= 1, or null for full LEACE)", ranks) from None
        if not self.ranks:
            raise bad("leace", "ranks", "a non-empty list of ranks (integers >= 1, or null for full LEACE)", ranks)
        for r in self.ranks:
            if r is not None and (isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 1):
                raise bad("leace", "ranks", "a list of ranks (integers >= 1, or null for full LEACE)", list(self.ranks))
        if not isinstance(within_class, (bool, np.bool_)):
            raise bad("leace", "within_class", "True or False", within_class)
        check_positive("leace", "C", C)
        self.within_class = within_class
        self._check_settings(test_sets=test_sets, check_on=check_on, min_removed=min_removed, max_cost=max_cost, n_folds=n_folds,
                             Cs=Cs, random_state=random_state)
        self.C = C

    def run(self, ctx: DiagnosticContext) -> list[dict]:
        X, labels, parents, tests, probe, _ = self._prepare(ctx)
        before = fitted_probe(ctx, probe)  # shared with parent_probe and linear_adversary when the settings match
        out: list[dict] = []
        for r in self.ranks:
            chk = erasure_check(X, labels, parents, train_idx=ctx.train_idx, test_sets=tests, rank=r, within_class=self.within_class,
                                probe=probe, adapter=ctx.adapter, check_on=self.check_on, min_removed=self.min_removed,
                                max_cost=self.max_cost, C=self.C, probe_before=before)
            s = f"rank={'full' if r is None else r}"
            out += check_rows(ctx, self.name, chk, s, tests, [
                row(ctx, self.name, "n_directions", chk.n_directions, setting=s, n=len(ctx.train_idx)),
            ])
        return out
