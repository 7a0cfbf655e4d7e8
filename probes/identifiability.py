"""Group identifiability: can a classifier name the parent of a held-out sibling crop?

Reference 003's first leakage check: train a classifier to predict the group (here the
acquisition parent: the field or slide a crop was cut from) and score it on crops it did not
see. Accuracy far above chance says the parent is recoverable from the input, so a split that
lets siblings cross it leaks. The paper's ResNet-18 named 424 SIPaKMeD fields from held-out
siblings at 25.7% (chance 0.24%), and at 18.7% from cell-free backgrounds.

Here the classifier is a multinomial logistic regression over ALL parents (not within class:
that is `ParentProbe`'s R) on a model's frozen pooled features:

- **Held-out siblings.** Folds are drawn inside each parent: a parent's crops, shuffled, go to
  folds ``(o + 0, o + 1, ...) mod k`` from a random offset o, so every fold holds at most
  ``ceil(n_p / k)`` of its ``n_p >= 2`` crops and the parent keeps at least one crop in every
  training set. Each crop is scored once, by the model fitted without its fold.
- **Accuracy** = correct / scored crops; **chance** = 1 / number of parents probed (a uniform
  guess); **majority** = the largest parent's share of the scored crops (always naming it);
  with class labels, **class chance** = the mean over scored crops of 1 / (parents probed that
  hold crops of the crop's class): a guess that knows the class and nothing else about the
  parent. Where each parent holds one class (SIPaKMeD), anything the features say about the
  class alone lifts the accuracy from chance towards class chance, so read the two together.
- **Interval**: a binomial interval on the accuracy (Wilson by default,
  `shortcutlab.stats.wilson_interval`, or Clopper-Pearson "exact", `scipy.stats.binomtest`).
  It treats the scored crops as independent trials; siblings are not, so it is narrower than
  a parent-level (cluster) interval would be.
- Parents with one crop cannot be scored (no sibling to learn from) and are counted in
  ``n_singletons_`` / ``n_excluded_`` and excluded, with a warning; never silently dropped.

Fit. Features are standardised on each training fold (zero-variance columns keep scale 1), then
scikit-learn's multinomial objective is minimised: mean cross-entropy + ||W||^2 / (2 C n) with an
unpenalised intercept, by L-BFGS with scipy's L-BFGS-B iterates (`probes.lbfgs`) and
scikit-learn's stopping rule (``gtol=tol``,
``maxiter=max_iter``, ``maxls=50``; `probes.logistic.fit_multinomial`, ParentProbe's fit,
without its step rescaling). The fit is therefore ``LogisticRegression(C=C, tol=tol,
max_iter=max_iter)`` on the standardised features (the tests check it), computed with float32
matrix products and no threads but BLAS's (one BLAS thread for small problems, where waking
threads costs more than it gives on a busy machine). On 3,975 crops x 512 features x 424 parents
the five folds took 1.75 s on one BLAS thread (scikit-learn's fold loop 1.94 s) and 4.9 s on two
threads of a loaded 2-core machine (scikit-learn 8.8 s), same accuracy. Two shortcuts were
measured and rejected: PCA to 32-128 dimensions cut the accuracy on Gaussian parents spread
over all 512 dimensions from 0.40 to 0.03-0.10 (the top-variance directions need not carry the
parent), and warm-starting a fold from the previous fold's fit leaked its held-out crops
(0.23 -> 0.84).

Probes establish availability, not use: a recoverable parent says the features could carry the
leak, not that the classifier relies on it.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> parents = np.repeat(np.arange(20), 5)
    >>> X = rng.normal(size=(20, 8))[parents] * 3 + rng.normal(size=(100, 8))
    >>> gi = GroupIdentifiability(folds=5, seed=0).fit_score(X, parents)
    >>> gi.chance_, gi.n_, gi.accuracy_ > 0.5
    (0.05, 100, True)
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

import numpy as np
import torch

from shortcutlab.stats import wilson_interval

from .logistic import fit_multinomial, standardise
from .base import Diagnostic, DiagnosticContext, row
from .errors import DiagnosticError
from .validation import bad, check_int, check_positive
from .parent_probe import sibling_folds as _sibling_folds
from .registry import register

__all__ = [
    "GroupIdentifiability",
    "GroupIdentifiabilityDiagnostic",
    "binomial_interval",
    "remove_cell",
    "sibling_folds",
]

INTERVALS = ("wilson", "exact")
FILLS = ("mean", "constant")


# ------------------------------------------------------------------------------ helpers
def sibling_folds(parents, folds: int, seed: int | np.random.Generator | None = 0) -> np.ndarray:
    """Fold of every crop, drawn inside each parent; -1 for crops whose parent has one crop.

    `probes.parent_probe.sibling_folds` with the parents as cells (one implementation for
    both probes): a parent's n >= 2 crops, in random order, take folds ``(o, o + 1, ...) mod
    folds`` from a random offset o, so each scored crop's parent keeps a sibling in every
    training set, and fold sizes stay balanced.

    Args:
        parents: (N,) parent of each crop (any hashable labels).
        folds: k >= 2.
        seed: integer seed or numpy Generator.

    Returns:
        (N,) int64 fold in [0, folds), or -1 for singleton parents.
    """
    return _sibling_folds(parents, check_int("sibling_folds", "folds", folds, 2), seed)


def binomial_interval(k: int, n: int, confidence: float = 0.95, method: Literal["wilson", "exact"] = "wilson") -> tuple[float, float]:
    """Two-sided interval for a binomial proportion k / n.

    Args:
        k: successes.
        n: trials (> 0).
        confidence: coverage in (0, 1).
        method: "wilson" (score interval, `shortcutlab.stats.wilson_interval`) or "exact"
            (Clopper-Pearson, `scipy.stats.binomtest`).

    Returns:
        (low, high) in [0, 1]; (nan, nan) when n == 0.
    """
    if method not in INTERVALS:
        raise bad("binomial_interval", "method", f"one of {', '.join(map(repr, INTERVALS))}", method)
    if not (0.0 < float(confidence) < 1.0):
        raise bad("binomial_interval", "confidence", "a number in (0, 1)", confidence)
    if int(n) == 0:
        return (math.nan, math.nan)
    if method == "wilson":
        return wilson_interval(int(k), int(n), float(confidence))
    from scipy.stats import binomtest

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=float(confidence), method=method)
    return (float(ci.low), float(ci.high))


def _class_chance(codes: np.ndarray, labels: np.ndarray) -> float:
    """Mean over crops of 1 / (distinct parents among the crops of the crop's class)."""
    _, cls = np.unique(labels, return_inverse=True)
    cls = cls.reshape(-1)
    pairs = np.unique(np.stack([cls, codes], axis=1), axis=0)
    per_class = np.bincount(pairs[:, 0], minlength=int(cls.max()) + 1)
    return float(np.mean(1.0 / per_class[cls]))


def _scorable_parents(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted parent names, (N,) parent code of each crop, crops per parent); a
    `DiagnosticError` unless at least two parents have two or more crops (held-out siblings)."""
    names, codes, counts = np.unique(parents, return_inverse=True, return_counts=True)
    codes = codes.reshape(-1)
    if len(names) == 0:
        raise DiagnosticError("group identifiability needs crops from at least two parents; got no crops")
    if len(names) < 2:
        shown = repr(names[0].item() if hasattr(names[0], "item") else names[0])
        raise DiagnosticError(
            f"group identifiability needs crops from at least two parents; all {len(parents)} crops have parent {shown}"
        )
    probed = counts >= 2
    if probed.sum() < 2:
        raise DiagnosticError(
            f"group identifiability needs at least two parents with two or more crops (held-out siblings); "
            f"{len(names)} parents, {int((~probed).sum())} of them with one crop only"
        )
    return names, codes, counts


# ------------------------------------------------------------------------------ estimator
class GroupIdentifiability:
    """Held-out-sibling accuracy of a multinomial logistic classifier of the parent.

    See the module docstring for the folds, the fit, chance and the interval.

    Args:
        folds: k >= 2 folds drawn inside each parent.
        C: inverse L2 strength, as scikit-learn's `LogisticRegression` (features standardised).
        seed: seeds the folds.
        max_iter: L-BFGS iterations per fold.
        tol: L-BFGS gradient tolerance (scikit-learn's `tol`).
        confidence: coverage of the binomial interval.
        interval: "wilson" or "exact" (Clopper-Pearson).

    Attributes (fitted):
        accuracy_: correct / scored crops.
        chance_: 1 / n_parents_.
        majority_: the largest probed parent's share of the scored crops.
        class_chance_: mean over scored crops of 1 / (probed parents holding crops of the
            crop's class); NaN without labels.
        ci_: (low, high) binomial interval of accuracy_.
        n_: scored crops; n_correct_: correctly named ones.
        n_parents_: parents probed (two or more crops).
        n_singletons_: parents with one crop, excluded; n_excluded_: their crops (= n_singletons_).
        parents_: (n_parents_,) the probed parents' labels, sorted; codes index it.
        fold_: (N,) fold of each input row (-1: excluded).
        predicted_: (N,) predicted parent code (index into parents_; -1: excluded).
        correct_: (N,) bool, the prediction names the crop's parent (False where excluded).
        n_iter_: (folds,) L-BFGS iterations per fold.

    Example:
        >>> import numpy as np
        >>> X = np.random.default_rng(0).normal(size=(60, 4))
        >>> gi = GroupIdentifiability(folds=3).fit_score(X, np.repeat(np.arange(12), 5))
        >>> round(gi.chance_, 4), gi.n_parents_
        (0.0833, 12)
    """

    def __init__(self, folds: int = 5, C: float = 1.0, seed: int = 0, max_iter: int = 100, tol: float = 1e-4,
                 confidence: float = 0.95, interval: Literal["wilson", "exact"] = "wilson") -> None:
        self.folds = folds
        self.C = C
        self.seed = seed
        self.max_iter = max_iter
        self.tol = tol
        self.confidence = confidence
        self.interval = interval

    def _check_params(self) -> None:
        owner = type(self).__name__
        check_int(owner, "folds", self.folds, 2)
        check_positive(owner, "C", self.C)
        check_int(owner, "max_iter", self.max_iter, 1)
        check_positive(owner, "tol", self.tol)
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise bad(owner, "seed", "an integer >= 0", self.seed)
        if isinstance(self.confidence, bool) or not isinstance(self.confidence, (int, float)) or not (0.0 < self.confidence < 1.0):
            raise bad(owner, "confidence", "a number in (0, 1)", self.confidence)
        if self.interval not in INTERVALS:
            raise bad(owner, "interval", f"one of {', '.join(map(repr, INTERVALS))}", self.interval)

    @staticmethod
    def _check_data(X, parents, labels=None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if isinstance(X, torch.Tensor):
            X = X.detach().cpu().numpy()
        X = np.asarray(X)
        if X.ndim != 2 or not (np.issubdtype(X.dtype, np.floating) or np.issubdtype(X.dtype, np.integer)):
            raise DiagnosticError(f"group identifiability needs features X as a numeric (N, D) array; got shape {X.shape}, dtype {X.dtype}")
        parents = np.asarray(parents)
        if parents.ndim != 1:
            raise DiagnosticError(f"group identifiability needs parents as a 1-D array (one per crop); got shape {parents.shape}")
        if len(parents) != X.shape[0]:
            raise DiagnosticError(
                f"group identifiability needs one parent per feature row; features have {X.shape[0]} rows but parents has {len(parents)}"
            )
        if X.shape[1] == 0:
            raise DiagnosticError("group identifiability needs at least one feature column; X has shape " f"{X.shape}")
        if labels is not None:
            labels = np.asarray(labels)
            if labels.shape != parents.shape:
                raise DiagnosticError(
                    f"group identifiability needs one class label per crop; parents has {len(parents)} entries but labels has shape {labels.shape}"
                )
        finite = np.isfinite(X).all(axis=1)
        if not finite.all():
            bad = np.flatnonzero(~finite)
            raise DiagnosticError(f"group identifiability features must be finite; rows {bad[:5].tolist()} hold NaN or inf ({len(bad)} rows)")
        return X, parents, labels

    def fit_score(self, X, parents, labels=None) -> "GroupIdentifiability":
        """Fit one classifier per fold and score every held-out sibling.

        Args:
            X: (N, D) features (numpy or torch), one row per crop.
            parents: (N,) parent of each crop.
            labels: optional (N,) class of each crop, for `class_chance_`.

        Returns:
            self, with the fitted attributes.

        Raises:
            DiagnosticError: lengths differ, non-finite features, or fewer than two parents
                with two or more crops.
        """
        self._check_params()
        X, parents, labels = self._check_data(X, parents, labels)
        names, codes, counts = _scorable_parents(parents)
        probed = counts >= 2
        n_single = int((~probed).sum())
        if n_single:
            warnings.warn(
                f"group identifiability: {n_single} parent(s) with one crop cannot be scored (no sibling to learn from); "
                f"their {n_single} crop(s) are excluded and counted in n_singletons_",
                UserWarning, stacklevel=2,
            )
        fold = sibling_folds(codes, int(self.folds), int(self.seed))
        keep = fold >= 0
        # Codes over the probed parents only.
        remap = np.full(len(names), -1, dtype=np.int64)
        remap[probed] = np.arange(int(probed.sum()))
        y = remap[codes]
        K = int(probed.sum())
        predicted, n_iter = self._predict_folds(X, y, K, fold)

        correct = keep & (predicted == y)
        n = int(keep.sum())
        k = int(correct.sum())
        self.parents_ = names[probed]
        self.fold_ = fold
        self.predicted_ = predicted
        self.correct_ = correct
        self.n_iter_ = np.asarray(n_iter)
        self.n_ = n
        self.n_correct_ = k
        self.n_parents_ = K
        self.n_singletons_ = n_single
        self.n_excluded_ = int((~keep).sum())
        self.accuracy_ = k / n
        self.chance_ = 1.0 / K
        self.majority_ = float(counts[probed].max()) / n
        self.class_chance_ = math.nan if labels is None else _class_chance(y[keep], labels[keep])
        self.ci_ = binomial_interval(k, n, float(self.confidence), self.interval)
        return self

    def _predict_folds(self, X: np.ndarray, y: np.ndarray, K: int, fold: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """(N,) parent code predicted for every crop by the classifier fitted without its fold
        (-1 where excluded), and the L-BFGS iterations of each fold's fit."""
        keep = fold >= 0
        predicted = np.full(len(y), -1, dtype=np.int64)
        n_iter = []
        for f in range(int(self.folds)):
            te = np.flatnonzero(fold == f)
            if len(te) == 0:
                n_iter.append(0)
                continue
            tr = np.flatnonzero(keep & (fold != f))
            A = X[tr].astype(np.float64)  # standardised in float64 (features with large offsets), in place
            mu, sd = standardise(A)
            A -= mu
            A /= sd
            W, b, it = fit_multinomial(A.astype(np.float32), y[tr], K, float(self.C), tol=float(self.tol), max_iter=int(self.max_iter),
                                       rescale=False)
            W, b = W.astype(np.float32), b.astype(np.float32)
            del A
            B = ((X[te].astype(np.float64) - mu) / sd).astype(np.float32)
            predicted[te] = (B @ W + b).argmax(axis=1)
            n_iter.append(it)
        return predicted, n_iter

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(folds={self.folds}, C={self.C}, seed={self.seed}, max_iter={self.max_iter}, "
                f"tol={self.tol}, confidence={self.confidence}, interval={self.interval!r})")


# ------------------------------------------------------------------------------ backgrounds
def remove_cell(x: torch.Tensor, mask: torch.Tensor, fill: Literal["mean", "constant"] = "mean", value: float = 0.5) -> torch.Tensor:
    """The cell-free background of each crop: the cell's pixels get the fill, the rest is kept.

    The `background_removal` intervention with the roles of cell and background swapped:
    ``y = (1 - m) x + m f``. ``fill="constant"`` is ``background_removal(x, 1 - m, "constant",
    value)`` (a grey cell silhouette); ``fill="mean"`` fills the cell with the crop's own
    background mean colour (``background_stats``), which hides its colour and most of its
    outline. A crop with no background pixel (mask 1 everywhere) becomes the constant `value`.

    Args:
        x: (B, 3, H, W) float images in [0, 1].
        mask: (B, 1, H, W) cell mask (1 = cell), bool or float in [0, 1].
        fill: "mean" or "constant".
        value: the constant grey level in [0, 1] (fill="constant", and crops without background).

    Returns:
        (B, 3, H, W) tensor of x's dtype and device.
    """
    from interventions.background import background_removal, background_stats
    from interventions.base import check_image, check_mask

    if fill not in FILLS:
        raise bad("remove_cell", "fill", f"one of {', '.join(map(repr, FILLS))}", fill)
    check_image(x)
    m = check_mask(mask, x)
    grey = background_removal(x, 1.0 - m, fill="constant", value=value)
    if fill == "constant":
        return grey
    mean, _, has_bg = background_stats(x, m)
    return torch.where(has_bg, (1.0 - m) * x + m * mean, grey)


# ------------------------------------------------------------------------------ diagnostic
@register("group_identifiability")
class GroupIdentifiabilityDiagnostic(Diagnostic):
    """Group identifiability from the crops' frozen features and from cell-free backgrounds.

    Rows, per input (setting ``input=crops``; ``input=background`` when the crops have masks):
    ``accuracy`` (with its binomial interval), ``chance`` (1 / parents probed), ``class_chance``
    (knowing the class only) and ``majority`` (the largest parent's share); ``n`` is the number
    of scored crops, and every row carries
    ``n_parents``, ``n_singletons`` and ``note``. Without masks the background row is an
    ``accuracy`` of NaN whose note says why.

    The background features are the model's features of `remove_cell` images, cached under the
    key ``cell_removed(fill=..., value=...)`` (not "background_removal": that name belongs to
    the intervention itself, which keeps the cell and removes the background).

    Args:
        folds, C, seed, max_iter, interval: as `GroupIdentifiability` (seed None: the context's).
        inputs: which of "crops", "background" to probe.
        fill, value: the cell fill of `remove_cell`.
        subset: "all" crops of the table, or only the split's "train" or "test" side.
    """

    needs = frozenset({"features"})
    label = "group identifiability"

    def __init__(self, folds: int = 5, C: float = 1.0, seed: int | None = None, max_iter: int = 100,
                 interval: Literal["wilson", "exact"] = "wilson", inputs: tuple[str, ...] = ("crops", "background"),
                 fill: Literal["mean", "constant"] = "mean", value: float = 0.5,
                 subset: Literal["all", "train", "test"] = "all") -> None:
        owner = type(self).__name__
        inputs = tuple(inputs) if not isinstance(inputs, str) else (inputs,)
        if not inputs or any(i not in ("crops", "background") for i in inputs):
            raise bad(owner, "inputs", "a non-empty subset of ('crops', 'background')", inputs)
        if fill not in FILLS:
            raise bad(owner, "fill", f"one of {', '.join(map(repr, FILLS))}", fill)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 <= value <= 1.0):
            raise bad(owner, "value", "a grey level in [0, 1]", value)
        if subset not in ("all", "train", "test"):
            raise bad(owner, "subset", "'all', 'train' or 'test'", subset)
        self.settings = dict(folds=folds, C=C, max_iter=max_iter, interval=interval)
        GroupIdentifiability(**self.settings, seed=0 if seed is None else seed)._check_params()
        self.seed = seed
        self.inputs = inputs
        self.fill = fill
        self.value = float(value)
        self.subset = subset

    @property
    def background_key(self) -> str:
        return f"cell_removed(fill={self.fill},value={self.value:g})"

    def _rows(self, ctx, setting: str, X: np.ndarray, parents: np.ndarray, labels: np.ndarray) -> list[dict]:
        est = GroupIdentifiability(**self.settings, seed=ctx.seed if self.seed is None else self.seed)
        est.fit_score(X, parents, labels)
        extra = dict(n_parents=est.n_parents_, n_singletons=est.n_singletons_, note="")
        return [
            row(ctx, self.name, "accuracy", est.accuracy_, setting=setting, ci=est.ci_, n=est.n_, **extra),
            row(ctx, self.name, "chance", est.chance_, setting=setting, n=est.n_, **extra),
            row(ctx, self.name, "class_chance", est.class_chance_, setting=setting, n=est.n_, **extra),
            row(ctx, self.name, "majority", est.majority_, setting=setting, n=est.n_, **extra),
        ]

    def run(self, ctx: DiagnosticContext) -> list[dict]:
        if self.subset == "all":
            idx = np.arange(len(ctx.parents))
        else:
            idx = ctx.train_idx if self.subset == "train" else ctx.test_idx
            if len(idx) == 0:
                raise DiagnosticError(f"{self.name}: subset={self.subset!r} but the split has no {self.subset} crops")
        parents, labels = ctx.parents[idx], ctx.labels[idx]
        out: list[dict] = []
        if "crops" in self.inputs:
            out += self._rows(ctx, "input=crops", ctx.features()[idx], parents, labels)
        if "background" in self.inputs:
            if not ctx.has_masks:
                out.append(row(ctx, self.name, "accuracy", math.nan, setting="input=background", n=0, n_parents=0,
                               n_singletons=0, note="skipped: the crops have no cell masks"))
            else:
                fill, value = self.fill, self.value
                F = ctx.features(transform=lambda x, m: remove_cell(x, m, fill=fill, value=value), key=self.background_key)
                out += self._rows(ctx, "input=background", F[idx], parents, labels)
        return out
