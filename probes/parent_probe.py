"""Parent recoverability R: can a linear probe name a crop's parent from its frozen features?

R (main paper, F5-F8) is the **within-class** accuracy of a multinomial logistic probe that
predicts the acquisition parent (microscope field, slide) of a crop from a model's frozen pooled
features, scored on **held-out siblings**:

- **Within class.** One probe per class, choosing among the parents that hold crops of that
  class. Knowing the class alone already names some crops' parent: the **floor** is the
  accuracy of the class-only predictor "always the class's largest parent", **out of sample
  on the probe's own folds**: for each fold it is fitted on the other folds (the parent with
  the most training crops of the class; ties broken uniformly at random, i.e. their mean
  held-out count) and scored on the fold's crops, crop-weighted over classes
  (`class_only_correct`). ``above_floor = R - floor`` is what the features add. The
  in-sample version, ``sum_c max_p n_{c,p} / sum_c n_c``, counts the largest parent's
  held-out crops when choosing it; with sibling folds a parent with fewer crops in the scored
  fold has more in training, so the in-sample floor is too high (0.0381 where a class-only
  probe scores 0.0345 out of sample) and a probe that learned only the class prior, or an
  erasure down to it, landed below it (a removed share above 1).
- **Held-out siblings.** Folds are drawn inside each (class, parent) cell: the cell's n >= 2
  crops, shuffled, take folds ``(o, o + 1, ...) mod k`` from a random offset o, so a fold
  holds at most ``ceil(n / k) < n`` of them and every scored crop's parent was seen in fitting
  through its other crops. Every probed crop is scored once, by the probe fitted without its
  fold.
- **R** = correct / scored crops over all classes, i.e. the per-class accuracies averaged with
  weights equal to each class's scored crops. The interval is Wilson's score interval for a
  binomial proportion with n = scored crops; siblings are not independent trials, so it is
  narrower than a parent-level (cluster) interval would be.
- **Cannot be probed**: a (class, parent) cell with one crop (no sibling to learn from) and a
  class with fewer than two such cells (nothing to choose between). Their crops are excluded,
  counted (``n_singleton_parents_``, ``n_single_parent_classes_``, ``n_excluded_``) and
  announced with a warning, never dropped silently.
- **Constant features**: columns constant over the probed crops are counted
  (``n_constant_features_``); when all are, the features carry nothing, R is no measurement,
  and a `DiagnosticWarning` says so.

**The probe.** Features are standardised on each fit's training rows (constant columns keep
scale 1) and scikit-learn's ``LogisticRegression(C=C, tol=tol, max_iter=max_iter)`` objective
is minimised (multinomial cross-entropy + ||W||^2 / (2 C n), unpenalised intercept; see
`probes.logistic`), with float32 matrix products.

The stopping rule is scikit-learn's default (largest gradient entry below ``tol=1e-4``). With
hundreds of parents per class the gradient entries are small (order 1/parents), so fits at
C >= 1 stop after a few iterations, well before the optimum: there early stopping, not C, is
the regulariser (on the benchmark's features R was 0.327 at C=1 with ``tol=1e-4`` and 0.296
at ``tol=1e-6``; at C=0.01, 0.304 either way). R is therefore defined by the fit as specified
here, ``LogisticRegression(C, tol)``, as scikit-learn users run it; lower ``tol`` for probes at
convergence (slower).

**Choosing C: a nested inner split.** The C of outer fold f is chosen on its partner fold
g = (f + floor(k / 2)) mod k. An inner probe is fitted on the crops of the other k - 2 folds
(half of them, for k = 4) for each C of ``Cs`` in increasing order, each fit warm-started from
the previous C's, and scored on fold g's crops whose parent it saw; f gets the C of highest
accuracy (ties: the smaller C). For even k the pairs {f, g} are mutual, so one inner path
serves both folds (k / 2 paths per class); for odd k every fold has its own. The path stops
early: once every fold it serves has fewer correct crops at the last C than at some smaller
C, no larger C is fitted (nor a candidate). Where the inner training crops hold fewer than two
parents, or no crop of g has a parent the inner probe saw, f gets the middle value of
``Cs`` (``inner_accuracy`` NaN). So the crops a probe is scored on never influence its C. The
outer probe of fold f then starts from the inner probe at its C (re-expressed in the outer
fit's standardisation), which was fitted without fold f: the warm start only saves iterations
and cannot leak fold f. With one value in ``Cs`` there is no inner split.

**Cost.** Each fit runs L-BFGS with scipy's L-BFGS-B iterates but without its bookkeeping
(`probes.lbfgs`) and float32 matrix products (2-3x cheaper than scikit-learn's float64
evaluation); the classes of a fold are fitted in parallel threads, one BLAS thread each (a BLAS
pool synchronising on every few-millisecond product stalls on a loaded machine). On 10,000 x
512 features, 1,000 parents in 4 classes (``benchmarks/bench_parent_probe.py``) the full
evaluation, 260 L-BFGS iterations, took 0.15-0.7x the wall time of one default scikit-learn
fit per class on all crops, measured in the same run on a loaded 2-core machine, but 1.6-1.9x
that of the same scikit-learn fits on one BLAS thread (docs/benchmarks.md); PCA was not used
(it changes R when the parent code lies off the top-variance directions).

**Cross-fitting a transform.** `fit` accepts ``cross_fit=fn``: ``fn(mask)`` returns features of
every crop under a map (an eraser, an adversary) fitted only on the crops where the boolean
``mask`` is True. Every probe, inner and outer, then reads features from a map fitted without
the crops it is validated or scored on. A map fitted on all crops would push each held-out
sibling away from its own parent's other crops and drive R below the floor (an artefact, not a
success).

Probes establish availability, not use: a recoverable parent says the features could carry the
leak, not that the classifier relies on it.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> parents = np.repeat(np.arange(24), 6)                 # 24 parents, 6 crops each
    >>> labels = parents % 2                                  # 2 classes, 12 parents each
    >>> X = 2.0 * rng.normal(size=(24, 8))[parents] + rng.normal(size=(144, 8))
    >>> probe = ParentProbe(n_folds=4, random_state=0).fit(X, labels, parents)
    >>> round(probe.floor_, 4), probe.n_scored_, probe.R_ > 0.5   # in sample 1/12; out of sample 8/144
    (0.0556, 144, True)
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from shortcutlab.stats import wilson_interval

from .logistic import blas_threads, fit_multinomial, standardise
from .base import Diagnostic, DiagnosticContext, row
from .errors import DiagnosticError, DiagnosticWarning
from .registry import register
from .validation import bad, check_fraction, check_int, check_positive

__all__ = ["ParentProbe", "ParentProbeDiagnostic", "check_features", "class_only_correct", "sibling_folds", "wilson_interval"]


# ------------------------------------------------------------------------------ helpers
def check_features(who: str, X, labels=None, parents=None, *, names=("labels", "parents")) -> tuple[np.ndarray, ...]:
    """Validate (N, D) features and per-crop arrays of the same length; return numpy arrays.

    Args:
        who: the diagnostic's name, for the message.
        X: (N, D) numeric features (numpy or torch).
        labels, parents: optional (N,) arrays (any hashable values).
        names: how `labels` and `parents` are named in messages.

    Raises:
        DiagnosticError: X is not a numeric 2-D array, has no column, holds NaN or inf, or an
            array's length differs from X's rows.
    """
    try:
        import torch

        if isinstance(X, torch.Tensor):
            X = X.detach().cpu().numpy()
    except ImportError:  # pragma: no cover
        pass
    X = np.asarray(X)
    if X.ndim != 2 or not (np.issubdtype(X.dtype, np.floating) or np.issubdtype(X.dtype, np.integer)):
        raise DiagnosticError(f"{who} needs features as a numeric (N, D) array; got shape {X.shape}, dtype {X.dtype}")
    if X.shape[1] == 0:
        raise DiagnosticError(f"{who} needs at least one feature column; features have shape {X.shape}")
    out = [X]
    for arr, name in zip((labels, parents), names):
        if arr is None:
            out.append(None)
            continue
        arr = np.asarray(arr)
        if arr.ndim != 1:
            raise DiagnosticError(f"{who} needs {name} as a 1-D array (one per crop); got shape {arr.shape}")
        if len(arr) != X.shape[0]:
            raise DiagnosticError(f"{who} needs one entry of {name} per feature row; features have {X.shape[0]} rows but {name} has {len(arr)}")
        out.append(_check_codes(who, name, arr))
    finite = np.isfinite(X).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise DiagnosticError(f"{who} features must be finite; rows {bad[:5].tolist()} hold NaN or inf ({len(bad)} rows)")
    return tuple(out)


def require(who: str, **arrays) -> None:
    """A `DiagnosticError` naming the first of the required per-crop `arrays` that is None."""
    for name, arr in arrays.items():
        if arr is None:
            raise DiagnosticError(f"{who} needs {name}, one per crop (an (N,) array); got None")


def _check_codes(who: str, name: str, arr: np.ndarray) -> np.ndarray:
    """`arr` unchanged when every entry names a class or parent that can be sorted with the
    others; a `DiagnosticError` naming the rows otherwise (None or NaN, or mixed types such
    as 3 and '3', which np.unique cannot order)."""
    if arr.dtype.kind == "f":
        missing = np.isnan(arr)
    elif arr.dtype == object:
        missing = np.array([v is None or (isinstance(v, (float, np.floating)) and math.isnan(v)) for v in arr], dtype=bool)
    else:
        return arr
    if missing.any():
        bad = np.flatnonzero(missing)
        raise DiagnosticError(
            f"{who} needs a value of {name} for every crop; rows {bad[:5].tolist()} hold None or NaN ({len(bad)} rows)"
        )
    if arr.dtype == object:
        try:
            np.unique(arr)
        except TypeError:
            kinds = sorted({type(v).__name__ for v in arr})
            raise DiagnosticError(
                f"{who} needs {name} of one type; got a mix of {', '.join(kinds)} (e.g. 3 and '3' would be two {name})"
            ) from None
    return arr


def sibling_folds(cells: np.ndarray, n_folds: int, random_state: int | np.random.Generator | None = 0) -> np.ndarray:
    """Fold of every crop, drawn inside each cell (parent, or (class, parent)); -1 for singletons.

    A cell's n >= 2 crops, in random order, take folds ``(o, o + 1, ...) mod n_folds`` from a
    random offset o: every fold holds at most ``ceil(n / n_folds) < n`` of them, so each scored
    crop keeps a sibling in its training set, and fold sizes stay balanced.

    Args:
        cells: (N,) cell of each crop (any hashable labels).
        n_folds: k >= 2.
        random_state: integer seed or numpy Generator.

    Returns:
        (N,) int64 fold in [0, n_folds), or -1 for crops alone in their cell.
    """
    n_folds = check_int("sibling_folds", "n_folds", n_folds, 2)
    _, codes, counts = np.unique(np.asarray(cells), return_inverse=True, return_counts=True)
    codes = codes.reshape(-1)
    rng = np.random.default_rng(random_state)
    order = np.lexsort((rng.random(len(codes)), codes))  # crops grouped by cell, shuffled inside
    start = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    rank = np.empty(len(codes), dtype=np.int64)
    rank[order] = np.arange(len(codes)) - np.repeat(start, counts)
    offset = rng.integers(0, n_folds, size=len(counts))
    out = (offset[codes] + rank) % n_folds
    out[counts[codes] < 2] = -1
    return out


def _partner(f: int, k: int) -> int:
    """The fold whose crops choose C for fold f: ``(f + k // 2) mod k``.

    For even k the pairs {f, f + k/2} are shared both ways, so k/2 inner probes serve all k
    folds. Pairing folds half a cycle apart (not neighbours) keeps a two-crop parent, whose
    crops sit in neighbouring folds, in every inner probe's training set.
    """
    return (f + k // 2) % k


@contextlib.contextmanager
def _class_pool(n_tasks: int):
    """``run(fn, items) -> list`` over the per-class fits of one fold: in as many threads as
    there are cores (at most `n_tasks`), each with one BLAS thread, or inline with BLAS's own
    threads on one core or for one class.

    Independent fits in parallel beat one fit on several BLAS threads: each fit's products
    take a few milliseconds, and a BLAS thread pool synchronises on every one of them, so on a
    loaded machine a descheduled peer stalls the others (the benchmark's CPU time grew 4x at a
    load of 7 with two BLAS threads per fit).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    workers = min(cores, n_tasks)
    if workers <= 1:
        yield lambda fn, items: [fn(i) for i in items]
        return
    from concurrent.futures import ThreadPoolExecutor

    with blas_threads(0), ThreadPoolExecutor(max_workers=workers) as pool:
        yield lambda fn, items: list(pool.map(fn, items))


# ------------------------------------------------------------------------------ estimator
class ParentProbe:
    """Within-class, held-out-sibling accuracy R of a logistic parent probe (module docstring).

    Args:
        n_folds: k folds drawn inside each (class, parent) cell; >= 3 when C is chosen (the
            inner split needs two folds besides the scored one), >= 2 with one C.
        Cs: candidate inverse L2 strengths (scikit-learn's C, features standardised), chosen
            per class and fold by the nested inner split; one number: no inner split.
        tol: L-BFGS gradient tolerance (scikit-learn's ``tol``).
        max_iter: L-BFGS iterations per fit.
        random_state: seeds the folds.
        confidence: coverage of the Wilson interval `ci_`.

    Attributes (fitted):
        R_: correct / scored crops (within-class parent accuracy), in [0, 1].
        floor_: the class-only floor over the same crops and folds: the accuracy of "the
            largest parent of the class in the training folds", scored on each held-out fold
            (`class_only_correct`), crop-weighted over classes.
        above_floor_: ``R_ - floor_``.
        ci_: (low, high) Wilson interval of R_.
        n_scored_: crops scored; n_correct_: crops whose parent was named.
        n_classes_: classes probed; n_parents_: (class, parent) cells probed.
        n_singleton_parents_: (class, parent) cells with one crop, excluded.
        n_single_parent_classes_: classes with fewer than two probe-able parents, excluded.
        n_excluded_: crops excluded for either reason.
        n_constant_features_: feature columns constant over the probed crops (all of them:
            the features carry nothing, and a `DiagnosticWarning` says so).
        per_class_: DataFrame, one row per class that has crops: ``class, n_scored,
            n_parents, R, floor, above_floor, n_excluded, probed``.
        folds_: (N,) fold of each crop (-1: excluded).
        predicted_: (N,) predicted parent (a value of ``parents``; None where excluded),
            object array.
        correct_: (N,) bool, the prediction names the crop's parent (False where excluded).
        C_: DataFrame ``class, fold, C, inner_accuracy, inner_n`` of the C each outer probe used.
        n_iter_: total L-BFGS iterations over all fits.
    """

    def __init__(self, n_folds: int = 4, Cs: float | Sequence[float] = (0.01, 0.1, 1.0), tol: float = 1e-4,
                 max_iter: int = 100, random_state: int = 0, confidence: float = 0.95) -> None:
        self.n_folds = n_folds
        self.Cs = Cs
        self.tol = tol
        self.max_iter = max_iter
        self.random_state = random_state
        self.confidence = confidence

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(n_folds={self.n_folds}, Cs={self.Cs!r}, tol={self.tol}, max_iter={self.max_iter}, "
                f"random_state={self.random_state}, confidence={self.confidence})")

    # ---------------------------------------------------------------------- settings
    def _params(self) -> tuple[int, list[float]]:
        owner = type(self).__name__
        Cs = [self.Cs] if isinstance(self.Cs, (int, float, np.integer, np.floating)) and not isinstance(self.Cs, bool) else self.Cs
        try:
            Cs = [float(check_positive(owner, "Cs", c)) for c in Cs]
        except TypeError:
            raise bad(owner, "Cs", "a number > 0 or a sequence of them", self.Cs) from None
        if not Cs:
            raise bad(owner, "Cs", "a number > 0 or a non-empty sequence of them", self.Cs)
        lo = 3 if len(Cs) > 1 else 2
        if isinstance(self.n_folds, bool) or not isinstance(self.n_folds, (int, np.integer)) or int(self.n_folds) < lo:
            why = " (with several Cs the nested inner split needs two folds besides the scored one)" if lo == 3 else ""
            raise bad(owner, "n_folds", f"an integer >= {lo}{why}", self.n_folds)
        k = int(self.n_folds)
        check_positive(owner, "tol", self.tol)
        check_int(owner, "max_iter", self.max_iter, 1)
        if isinstance(self.random_state, bool) or not isinstance(self.random_state, (int, np.integer)) or self.random_state < 0:
            raise bad(owner, "random_state", "an integer >= 0", self.random_state)
        check_fraction(owner, "confidence", self.confidence)
        return k, sorted(set(Cs))

    # ---------------------------------------------------------------------- fitting
    def fit(self, X, labels, parents, *, cross_fit: Callable[[np.ndarray], np.ndarray] | None = None) -> "ParentProbe":
        """Fit the probes and score every held-out sibling.

        The steps: validate, lay out the crops (`_Crops`: codes, folds, who is probed), warn
        about exclusions and constant features, run the nested fits (`_SiblingFits`), then
        store R, the floor and the per-class table.

        Args:
            X: (N, D) frozen features (numpy or torch; any float or int dtype), one row per crop.
            labels: (N,) class of each crop.
            parents: (N,) parent of each crop.
            cross_fit: optional ``fn(mask) -> (N, D) features``: the features of every crop
                under a map fitted only on the crops where the (N,) bool ``mask`` is True
                (module docstring). When given, `X` is only validated and used for its shape.

        Returns:
            self, with the fitted attributes.

        Raises:
            DiagnosticError: lengths differ, features are not finite, or no class has two
                parents with two or more crops each.
        """
        k, Cs = self._params()
        who = "ParentProbe"
        require(f"{who}.fit", labels=labels, parents=parents)
        X, labels, parents = check_features(who, X, labels, parents)
        if X.shape[0] == 0:
            raise DiagnosticError(f"{who} needs crops; got none (features have shape {X.shape})")
        crops = _Crops.lay_out(who, labels, parents, k, int(self.random_state))
        if crops.n_excluded:
            _warn_excluded(who, crops)
        n_const = _constant_columns(who, X, crops.keep)
        fits = _SiblingFits(who, crops, X, Cs, k, self.tol, self.max_iter, cross_fit)
        predicted, C_rows, n_iter = fits.run()
        self._store(crops, predicted, n_const)
        self.C_ = pd.DataFrame(C_rows, columns=["class", "fold", "C", "inner_accuracy", "inner_n"])
        self.n_iter_ = n_iter
        return self

    def _store(self, crops: "_Crops", predicted: np.ndarray, n_const: int) -> None:
        """Set R, its floor and interval, the counts and the per-crop attributes from the
        predicted parent codes (-1 where excluded)."""
        keep, par = crops.keep, crops.par
        correct = keep & (predicted == par)
        per_class = _per_class_table(crops, correct)
        n = int(keep.sum())
        kc = int(correct.sum())
        probed = per_class[per_class["probed"]]
        self.per_class_ = per_class
        self.R_ = kc / n
        self.floor_ = float((probed["floor"] * probed["n_scored"]).sum() / n)
        self.above_floor_ = self.R_ - self.floor_
        self.ci_ = wilson_interval(kc, n, float(self.confidence))
        self.n_scored_ = n
        self.n_correct_ = kc
        self.n_classes_ = len(crops.classes)
        self.n_parents_ = int(probed["n_parents"].sum())
        self.n_singleton_parents_ = crops.n_single
        self.n_single_parent_classes_ = crops.n_single_class
        self.n_excluded_ = crops.n_excluded
        self.n_constant_features_ = n_const
        self.folds_ = crops.folds
        pred_names = np.empty(len(par), dtype=object)
        pred_names[keep] = crops.par_names[predicted[keep]]
        self.predicted_ = pred_names
        self.correct_ = correct


# ------------------------------------------------------------------------------ fitting steps
@dataclass(frozen=True, eq=False)
class _Crops:
    """The probe's view of its crops: class and parent codes, folds, and which are probed.

    Attributes:
        cls_names, par_names: the sorted class and parent values; cls, par: (N,) their codes.
        folds: (N,) fold drawn inside each (class, parent) cell, -1 where excluded.
        keep: (N,) bool, the crop is probed (``folds >= 0``).
        classes: codes of the classes probed (two or more parents of two or more crops).
        idx: class code -> rows of its probed crops; ycode: class code -> their parent codes
            within the class (0 .. parents of the class - 1).
        n_single: (class, parent) cells with one crop; n_single_class: classes with crops but
            fewer than two probe-able parents.
    """

    cls_names: np.ndarray
    cls: np.ndarray
    par_names: np.ndarray
    par: np.ndarray
    folds: np.ndarray
    keep: np.ndarray
    classes: list
    idx: dict
    ycode: dict
    n_single: int
    n_single_class: int

    @property
    def n_excluded(self) -> int:
        return int((~self.keep).sum())

    @classmethod
    def lay_out(cls_, who: str, labels: np.ndarray, parents: np.ndarray, k: int, random_state: int) -> "_Crops":
        """Codes, sibling folds and exclusions of the crops; a `DiagnosticError` when nothing
        can be probed."""
        cls_names, cls = np.unique(labels, return_inverse=True)
        cls = cls.reshape(-1)
        par_names, par = np.unique(parents, return_inverse=True)
        par = par.reshape(-1)
        cell_names, cell, cell_n = np.unique(np.stack([cls, par], axis=1), axis=0, return_inverse=True, return_counts=True)
        cell = cell.reshape(-1)
        cell_class = cell_names[:, 0]
        ok_cell = cell_n >= 2
        n_single = int((~ok_cell).sum())
        # Classes with fewer than two probe-able parents.
        ok_cells_per_class = np.bincount(cell_class[ok_cell], minlength=len(cls_names))
        ok_class = ok_cells_per_class >= 2
        n_single_class = int((~ok_class & (np.bincount(cls, minlength=len(cls_names)) > 0)).sum())
        folds = sibling_folds(cell, k, random_state)
        folds[~ok_class[cls]] = -1
        keep = folds >= 0
        if not keep.any():
            raise DiagnosticError(
                f"{who} has nothing to probe: no class has two parents with two or more crops each "
                f"({len(par_names)} parents, {n_single} (class, parent) cells with one crop, {len(cls_names)} classes)"
            )
        classes = [c for c in range(len(cls_names)) if ok_class[c]]
        idx = {c: np.flatnonzero(keep & (cls == c)) for c in classes}
        ycode = {}
        for c in classes:
            _, y = np.unique(par[idx[c]], return_inverse=True)
            ycode[c] = y.reshape(-1)
        return cls_(cls_names, cls, par_names, par, folds, keep, classes, idx, ycode, n_single, n_single_class)

    @property
    def lost_classes(self) -> list[str]:
        """Classes with crops but fewer than two probe-able parents, as strings."""
        probed = np.zeros(len(self.cls_names), dtype=bool)
        probed[self.classes] = True
        return [str(c) for c in self.cls_names[~probed]]


def _warn_excluded(who: str, crops: _Crops) -> None:
    """The `DiagnosticWarning` that counts the crops `ParentProbe.fit` cannot probe (it points
    at fit's caller)."""
    lost_classes = crops.lost_classes
    warnings.warn(
        f"{who}: {crops.n_excluded} crop(s) cannot be probed and are excluded: {crops.n_single} (class, parent) cell(s) with one crop "
        f"(no sibling to learn from) and {crops.n_single_class} class(es) with fewer than two parents of two or more crops"
        + (f" ({', '.join(lost_classes[:5])})" if lost_classes else "")
        + "; counted in n_singleton_parents_, n_single_parent_classes_, n_excluded_",
        DiagnosticWarning, stacklevel=3,
    )


def _constant_columns(who: str, X: np.ndarray, keep: np.ndarray) -> int:
    """Feature columns constant over the probed crops; a `DiagnosticWarning` when all are.

    Constant columns carry nothing (standardising keeps their scale 1); when every column is
    constant over the probed crops the probe can only guess, so R measures nothing.
    """
    Xk = X[keep]
    n_const = int((Xk == Xk[:1]).all(axis=0).sum())
    if n_const == X.shape[1]:
        warnings.warn(
            f"{who}: all {n_const} feature column(s) are constant over the {int(keep.sum())} probed crops: the features "
            "carry no parent information and R is not a measurement (counted in n_constant_features_)",
            DiagnosticWarning, stacklevel=3,
        )
    return n_const


def class_only_correct(parents: np.ndarray, folds: np.ndarray) -> float:
    """Expected crops named correctly by the class-only predictor, fitted and scored out of sample.

    The majority-class ("ZeroR") baseline under the probe's own cross-validation, i.e.
    scikit-learn's ``DummyClassifier(strategy="most_frequent")`` fitted per class on the training
    folds (tested equal where no parents tie): a baseline must be scored as the probe is, or
    the difference R - floor mixes what the features add with what in-sample scoring adds.
    For each fold f, the predictor "always the largest parent" is fitted on the crops of the
    other folds and scored on fold f's crops, as the probe is: it names the parent with the
    most training crops; a tie among several is broken uniformly at random, so its expected
    correct count on fold f is the mean held-out count of the tied parents (independent of
    how the parents are named). In-sample ("the largest parent's share of all crops") the
    largest parent is picked with its held-out crops counted, which favours it: with sibling
    folds a parent with fewer crops in fold f has more in training, so the out-of-sample floor
    is lower (0.0345 against 0.0381 on one benchmark) and a probe at the class-only level
    scored below the in-sample floor.

    Args:
        parents: (n,) integer parent codes of one class's scored crops.
        folds: (n,) their folds (>= 0).

    Returns:
        The expected number of correct crops over all folds (a float; divide by n for the floor).
    """
    size = int(parents.max()) + 1 if len(parents) else 0
    total = 0.0
    for f in np.unique(folds):
        held = folds == f
        n_train = np.bincount(parents[~held], minlength=size)
        if not n_train.any():  # nothing to fit on: no crop of this class outside fold f
            continue
        top = n_train == n_train.max()
        total += float(np.bincount(parents[held], minlength=size)[top].mean())
    return total


def _per_class_table(crops: _Crops, correct: np.ndarray) -> pd.DataFrame:
    """`ParentProbe.per_class_`: one row per class that has crops (module docstring)."""
    cls, par, keep = crops.cls, crops.par, crops.keep
    rows = []
    for c in range(len(crops.cls_names)):
        in_c = cls == c
        if not in_c.any():
            continue
        m = keep & in_c
        n_c = int(m.sum())
        if n_c:
            R_c, floor_c = float(correct[m].sum()) / n_c, class_only_correct(par[m], crops.folds[m]) / n_c
            n_par = int(len(np.unique(par[m])))
        else:
            R_c = floor_c = math.nan
            n_par = 0
        rows.append({"class": crops.cls_names[c], "n_scored": n_c, "n_parents": n_par, "R": R_c, "floor": floor_c,
                     "above_floor": R_c - floor_c, "n_excluded": int((in_c & ~keep).sum()), "probed": bool(n_c)})
    return pd.DataFrame(rows, columns=["class", "n_scored", "n_parents", "R", "floor", "above_floor", "n_excluded", "probed"])


class _SiblingFits:
    """The nested fits of one `ParentProbe.fit` (module docstring, "Choosing C"): an inner C
    path per class and pair of folds, then one outer probe per class and fold, warm-started
    from the inner probe at the chosen C."""

    def __init__(self, who: str, crops: _Crops, X: np.ndarray, Cs: list[float], k: int, tol: float, max_iter: int,
                 cross_fit: Callable[[np.ndarray], np.ndarray] | None) -> None:
        self.who, self.crops, self.X, self.Cs, self.k = who, crops, X, Cs, k
        self.tol, self.max_iter, self.cross_fit = tol, max_iter, cross_fit
        # Inner split: one probe per pair of folds, per class, along the C path.
        self.pairs = sorted({tuple(sorted((f, _partner(f, k)))) for f in range(k)}) if len(Cs) > 1 else []
        self.inner: dict[tuple[int, int], dict] = {}  # (class, pair id) -> fits

    def run(self) -> tuple[np.ndarray, list[dict], int]:
        """Fit every inner path and outer probe; return the (N,) predicted parent codes (-1
        where excluded), the rows of `ParentProbe.C_` and the total L-BFGS iterations."""
        crops = self.crops
        n_iter = 0
        predicted = np.full(len(crops.par), -1, dtype=np.int64)  # parent code
        C_rows = []
        with _class_pool(len(crops.classes)) as run:
            for pair in self.pairs:
                F = self.features(~np.isin(crops.folds, pair))
                for c, (fits, n_it) in zip(crops.classes, run(lambda c: self.inner_fit(pair, F, c), crops.classes)):
                    self.inner[(c, self.pairs.index(pair))] = fits
                    n_iter += n_it
            # Outer folds.
            for f in range(self.k):
                F = self.features(crops.folds != f)
                for out in run(lambda c: self.outer_fit(f, F, c), crops.classes):
                    if out is not None:
                        rows_, pred_, row_, it = out
                        predicted[rows_] = pred_
                        C_rows.append(row_)
                        n_iter += it
        return predicted, C_rows, n_iter

    def features(self, mask: np.ndarray | None) -> np.ndarray:
        """The features under a map fitted on the crops of `mask` (`X` without ``cross_fit``)."""
        if self.cross_fit is None or mask is None:
            return self.X
        N = self.X.shape[0]
        F = np.asarray(self.cross_fit(mask))
        if F.shape[0] != N or F.ndim != 2:
            raise DiagnosticError(f"{self.who}: cross_fit returned features of shape {F.shape}; expected ({N}, D)")
        return F

    def inner_fit(self, pair: tuple[int, int], F: np.ndarray, c: int) -> tuple[dict, int]:
        """Class c's inner C path trained without the folds of `pair`, scored on the folds it
        serves; returns ``{seen, models, val, mu, sd}`` and its iterations."""
        k, idx, ycode = self.k, self.crops.idx, self.crops.ycode
        n_it = 0
        fc = self.crops.folds[idx[c]]
        tr = ~np.isin(fc, pair)
        y_tr = ycode[c][tr]
        seen = np.unique(y_tr)
        fits = {"seen": seen, "models": [], "val": {}}
        if len(seen) < 2:
            return fits, n_it
        mu, sd = standardise(F[idx[c][tr]])
        A = (F[idx[c][tr]] - mu) / sd
        local = np.searchsorted(seen, y_tr)
        # Validation folds this pair serves (fold g chooses C for f when g = partner(f)).
        val = {}
        for g in pair:
            if any(_partner(f, k) == g and g != f and set((f, g)) == set(pair) for f in range(k)):
                va = (fc == g) & np.isin(ycode[c], seen)
                val[g] = ((F[idx[c][va]] - mu) / sd, np.searchsorted(seen, ycode[c][va]))
        fits["val"] = {g: [] for g in val}
        W = b = None
        for C in self.Cs:  # smallest C first, each warm-started from the previous one
            W, b, it = fit_multinomial(A, local, len(seen), C, tol=self.tol, max_iter=self.max_iter, W0=W, c0=b)
            n_it += it
            fits["models"].append((W, b))
            for g, (B, truth) in val.items():
                fits["val"][g].append((int(((B @ W + b).argmax(1) == truth).sum()), len(truth)))
            # Stop the path once every served fold's accuracy fell below its best so far.
            if len(fits["models"]) > 1 and all(v[-1][0] < max(a for a, _ in v[:-1]) for v in fits["val"].values()):
                break
        fits["mu"], fits["sd"] = mu, sd
        return fits, n_it

    def choose_C(self, f: int, c: int, mu: np.ndarray, sd: np.ndarray, P: int):
        """The C of class c's outer probe for fold f, its inner accuracy and validation crops,
        and the warm start ``(W0, b0)`` (None without an inner probe) in the outer fit's
        standardisation (`mu`, `sd`) and its `P` parents."""
        Cs = self.Cs
        if not self.pairs:
            return Cs[0], math.nan, 0, None, None
        g = _partner(f, self.k)
        fits = self.inner[(c, self.pairs.index(tuple(sorted((f, g)))))]
        if not fits["models"]:
            return Cs[len(Cs) // 2], math.nan, 0, None, None
        scores = fits["val"][g]  # (correct, n) per C along the (possibly stopped) path
        inner_n = scores[0][1]
        if inner_n:
            accs = [a / inner_n for a, _ in scores]
            j = int(np.argmax(accs))  # first maximum: the smallest C among ties
            inner_acc = accs[j]
        else:  # no validation crop whose parent the inner probe saw
            j, inner_acc = len(Cs) // 2, math.nan
        Wi, bi = fits["models"][j]
        # Re-express the inner probe in this fit's standardisation and label set.
        W0 = np.zeros((len(mu), P))
        b0 = np.zeros(P)
        W0[:, fits["seen"]] = Wi * (sd / fits["sd"])[:, None]
        b0[fits["seen"]] = bi + ((mu - fits["mu"]) / fits["sd"]) @ Wi
        return Cs[j], inner_acc, inner_n, W0, b0

    def outer_fit(self, f: int, F: np.ndarray, c: int):
        """Class c's probe fitted without fold f and scored on it: (rows, predicted parent
        codes, `C_` row, iterations), or None when fold f holds none of the class's crops."""
        idx, ycode, par = self.crops.idx, self.crops.ycode, self.crops.par
        fc = self.crops.folds[idx[c]]
        te = fc == f
        if not te.any():
            return None
        tr = ~te
        P = int(ycode[c].max()) + 1
        mu, sd = standardise(F[idx[c][tr]])
        A = (F[idx[c][tr]] - mu) / sd
        C, inner_acc, inner_n, W0, b0 = self.choose_C(f, c, mu, sd, P)
        W, b, it = fit_multinomial(A, ycode[c][tr], P, C, tol=self.tol, max_iter=self.max_iter, W0=W0, c0=b0)
        B = (F[idx[c][te]] - mu) / sd
        local_pred = (B @ W + b).argmax(1)
        parent_of_local = np.unique(par[idx[c]])
        row_ = {"class": self.crops.cls_names[c], "fold": f, "C": C, "inner_accuracy": inner_acc, "inner_n": inner_n}
        return idx[c][te], parent_of_local[local_pred], row_, it


# ------------------------------------------------------------------------------ diagnostic
_SIDES = {"all": None, "train": 0, "val": 1, "test": 2}


def crops_of(ctx: DiagnosticContext, on: str, who: str) -> np.ndarray:
    """Row indices of the crops a diagnostic measures on: 'all', or one side of the split."""
    if on not in _SIDES:
        raise bad(who, "on", f"one of {', '.join(map(repr, _SIDES))}", on)
    if on == "all":
        return np.arange(ctx.table.n_crops)
    idx = np.flatnonzero(ctx.side == _SIDES[on])
    if len(idx) == 0:
        raise DiagnosticError(f"{who}: on={on!r} but the split has no {on} crops")
    return idx


def clone_probe(probe: ParentProbe | None) -> ParentProbe:
    """An unfitted `ParentProbe` with `probe`'s settings (default settings for None)."""
    if probe is None:
        return ParentProbe()
    return ParentProbe(n_folds=probe.n_folds, Cs=probe.Cs, tol=probe.tol, max_iter=probe.max_iter,
                       random_state=probe.random_state, confidence=probe.confidence)


def fitted_probe(ctx: DiagnosticContext, probe: ParentProbe, rows: np.ndarray | None = None) -> ParentProbe:
    """`probe`'s settings fitted on the context's features of all crops (or of `rows`), once per context.

    The fit is kept in ``ctx.cache`` under the probe's effective settings (folds, the sorted Cs,
    tol, max_iter, random_state, confidence) and the rows, so diagnostics that measure R
    before on the same crops with the same settings (``parent_probe``, ``leace``,
    ``linear_adversary``) share one fit; the fitted probe is shared, not copied, and must not
    be refitted.

    Args:
        ctx: the diagnostic context (features from ``ctx.features()``).
        probe: an unfitted `ParentProbe` whose settings are used (it is not fitted itself).
        rows: row indices of the crops probed (None: every crop of the table).
    """
    k, Cs = probe._params()
    settings = (k, tuple(Cs), float(probe.tol), int(probe.max_iter), int(probe.random_state), float(probe.confidence))
    where = "all" if rows is None else hashlib.sha256(np.ascontiguousarray(rows, dtype=np.int64).tobytes()).hexdigest()
    key = ("ParentProbe", where, settings)  # on ctx.features(): the crops' own features, no transform
    if key not in ctx.cache:
        X = ctx.features()
        fresh = clone_probe(probe)
        if rows is None:
            ctx.cache[key] = fresh.fit(X, ctx.labels, ctx.parents)
        else:
            ctx.cache[key] = fresh.fit(X[rows], ctx.labels[rows], ctx.parents[rows])
    return ctx.cache[key]


def probe_rows(ctx: DiagnosticContext | None, name: str, probe: ParentProbe, *, setting: str = "", prefix: str = "",
               per_class: bool = True) -> list[dict]:
    """Tidy rows of a fitted `ParentProbe`: R (Wilson interval), floor, above_floor, exclusions,
    and per-class R / floor / above_floor (setting ``class=<name>``, joined to `setting`)."""
    n = probe.n_scored_
    out = [
        row(ctx, name, prefix + "R", probe.R_, setting=setting, ci=probe.ci_, n=n),
        row(ctx, name, prefix + "floor", probe.floor_, setting=setting, n=n),
        row(ctx, name, prefix + "above_floor", probe.above_floor_, setting=setting, n=n),
    ]
    if not prefix:
        out += [
            row(ctx, name, "n_singleton_parents", probe.n_singleton_parents_, setting=setting, n=n),
            row(ctx, name, "n_single_parent_classes", probe.n_single_parent_classes_, setting=setting, n=n),
            row(ctx, name, "n_excluded", probe.n_excluded_, setting=setting, n=n),
            row(ctx, name, "n_constant_features", probe.n_constant_features_, setting=setting, n=n),
        ]
    if per_class:
        for r in probe.per_class_[probe.per_class_["probed"]].itertuples(index=False):
            s = ",".join(x for x in (setting, f"class={r[0]}") if x)
            out += [
                row(ctx, name, prefix + "R", r.R, setting=s, n=r.n_scored),
                row(ctx, name, prefix + "floor", r.floor, setting=s, n=r.n_scored),
                row(ctx, name, prefix + "above_floor", r.above_floor, setting=s, n=r.n_scored),
            ]
    return out


@register("parent_probe")
class ParentProbeDiagnostic(Diagnostic):
    """Parent recoverability R and its class-only floor on a model's frozen features.

    Rows (metric): ``R`` (Wilson interval, n = scored crops), ``floor``, ``above_floor``,
    ``n_singleton_parents``, ``n_single_parent_classes``, ``n_excluded``,
    ``n_constant_features``; then ``R``, ``floor``,
    ``above_floor`` per class with setting ``class=<name>``.

    Args:
        on: the crops probed: "all" (default) or one side of the split ("train", "val", "test").
        n_folds, Cs, tol, max_iter: as `ParentProbe`.
        random_state: seeds the folds (None: the context's seed).
    """

    needs = frozenset({"features"})
    label = "parent probe"
    metric_labels = {"R": "R"}
    metric_units = {"R": "fraction"}
    supplies = {"recoverability": "R"}

    def __init__(self, on: str = "all", n_folds: int = 4, Cs: float | Sequence[float] = (0.01, 0.1, 1.0), tol: float = 1e-4,
                 max_iter: int = 100, random_state: int | None = None) -> None:
        if on not in _SIDES:
            raise bad("parent_probe", "on", f"one of {', '.join(map(repr, _SIDES))}", on)
        if random_state is not None:
            check_int("parent_probe", "random_state", random_state, 0)
        self.on = on
        self.probe_params = dict(n_folds=n_folds, Cs=Cs, tol=tol, max_iter=max_iter)
        self.random_state = random_state
        ParentProbe(**self.probe_params)._params()  # every setting checked here, before any work

    def run(self, ctx: DiagnosticContext) -> list[dict]:
        idx = crops_of(ctx, self.on, "parent_probe")
        seed = ctx.seed if self.random_state is None else self.random_state
        probe = fitted_probe(ctx, ParentProbe(random_state=seed, **self.probe_params), None if self.on == "all" else idx)
        return probe_rows(ctx, self.name, probe, setting=f"on={self.on}")
