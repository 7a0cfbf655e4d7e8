"""A probe-matched linear adversary on frozen features (the paper's F7), and R after an adversary.

`LinearAdversary` learns, on a model's frozen features, a linear map (D -> D, initialised at
the identity) and a new class head, against a linear parent classifier through gradient
reversal (Ganin & Lempitsky's DANN)::

    h = A z + a                   z: standardised features (mean / scale of the training rows)
    loss = CE(class head(h), y) + CE(parent head(GRL_lambda(h)), parent | class)
           + ||W_class||^2 / (2 C n) + ||W_parent||^2 / (2 C_adv n)

The parent head is the probe's family: a multinomial logistic regression over the parents of
the crop's own class (logits of other classes' parents masked), L2-penalised as
`ParentProbe`'s objective. The gradient-reversal layer GRL_lambda is the identity forward and
multiplies the gradient by -lambda backward, so the parent head learns to name the parent
while the map learns to defeat it; lambda follows DANN's schedule
``weight * (2 / (1 + exp(-10 p)) - 1)`` over training progress p (the schedule of
``shortcutlab train --adversary-weight``). Training is minibatch Adam, seeded.

**R afterwards is measured with a fresh `ParentProbe`** on the mapped features, never with the
adversary's own accuracy: a parent head that lost the game says what that head can read, not
what a new probe can (a map that only rescales a direction defeats a head trained against it
and leaves R unchanged; the fresh probe standardises the features again). `adversary_check`
cross-fits it as `erasure_check` does: every inner and outer probe reads features mapped by an
adversary trained without the crops it is validated or scored on. The class accuracy is that
of the new head on the test sets.

**The baseline is the same training with ``weight=0``** (no adversary), for the cost and for
the removed share alike: the map trained for the class task alone already changes what a
probe reads (it lowered R by 14-28% of its above-floor value in a review's four runs, and the
check, then measured against R on the raw features, passed in two of them with no adversary).
So `adversary_check` measures R three times, on the raw features, on the weight-0 map's and
on the adversary's (each cross-fitted), and the check's removed share is
``(above_floor_baseline - above_floor_after) / above_floor_baseline``; the share against the
raw features is reported beside it (``removed_share_raw``).

`remeasure_R` is for a model trained end to end with ``shortcutlab train --adversary-weight``
(hypothesis H5): the adversary acted on the backbone during training, so R is simply
`ParentProbe` on the trained model's frozen features (its adversary head is not used).

Probes establish availability, not use.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> parents = np.repeat(np.arange(12), 10); labels = parents % 2
    >>> X = rng.normal(size=(120, 8)); X[:, 0] += 2 * rng.normal(size=12)[parents]; X[:, 1] += 3 * labels
    >>> adv = LinearAdversary(weight=1.0, steps=100, random_state=0).fit(X, labels, parents)
    >>> adv.transform(X).shape, adv.score(X, labels) > 0.9
    ((120, 8), True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from shortcutlab.models.grad_reverse import dann_lambda, grad_reverse

from .before_after import CheckDiagnostic, CheckOutcome, check_inputs, check_reused_probe, check_rows, fit_after, fit_before, outcome
from .logistic import standardise, torch_threads
from .base import DiagnosticContext, row
from .errors import DiagnosticError
from .parent_probe import ParentProbe, check_features, clone_probe, fitted_probe, require
from .validation import as_numpy, bad, check_int, check_positive
from .registry import register

__all__ = ["AdversaryCheck", "LinearAdversary", "LinearAdversaryDiagnostic", "adversary_check", "remeasure_R"]


class LinearAdversary:
    """Linear map + class head trained against a within-class linear parent head (module docstring).

    Args:
        weight: lambda_max of the gradient reversal (0: no adversary, the baseline).
        steps: Adam steps.
        batch_size: crops per step (None or >= n: full batch).
        lr: Adam learning rate.
        C: inverse L2 strength of the class head; C_adv: of the parent head (the probe's C
            convention: penalty ||W||^2 / (2 C n)).
        schedule: "dann" (lambda ramps up as DANN's) or "constant" (lambda = weight).
        random_state: seeds the batches.

    Attributes (fitted):
        mean_, scale_: (D,) standardisation of the training rows.
        map_weight_, map_bias_: (D, D), (D,) float32: h = ((x - mean_) / scale_) @ map_weight_.T + map_bias_.
        head_weight_, head_bias_: (K, D), (K,) the class head on h.
        classes_: (K,) class labels; parents_: (P,) parents; history_: per-step
            (class loss, parent loss) as an (steps, 2) array.
        adversary_accuracy_: the parent head's own within-class accuracy on the training
            crops at the end (what the adversary reads, not what remains; see `adversary_check`).
    """

    def __init__(self, weight: float = 1.0, steps: int = 300, batch_size: int | None = 256, lr: float = 1e-2, C: float = 1.0,
                 C_adv: float = 1.0, schedule: str = "dann", random_state: int = 0) -> None:
        self.weight = weight
        self.steps = steps
        self.batch_size = batch_size
        self.lr = lr
        self.C = C
        self.C_adv = C_adv
        self.schedule = schedule
        self.random_state = random_state

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(weight={self.weight}, steps={self.steps}, batch_size={self.batch_size}, lr={self.lr}, "
                f"C={self.C}, C_adv={self.C_adv}, schedule={self.schedule!r}, random_state={self.random_state})")

    def get_params(self) -> dict:
        return dict(weight=self.weight, steps=self.steps, batch_size=self.batch_size, lr=self.lr, C=self.C, C_adv=self.C_adv,
                    schedule=self.schedule, random_state=self.random_state)

    def _check_params(self) -> None:
        owner = type(self).__name__
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not (math.isfinite(self.weight) and self.weight >= 0):
            raise bad(owner, "weight", "a finite number >= 0", self.weight)
        check_int(owner, "steps", self.steps, 1)
        if self.batch_size is not None:
            check_int(owner, "batch_size", self.batch_size, 1)
        for name in ("lr", "C", "C_adv"):
            check_positive(owner, name, getattr(self, name))
        if self.schedule not in ("dann", "constant"):
            raise bad(owner, "schedule", "'dann' or 'constant'", self.schedule)
        check_int(owner, "random_state", self.random_state, 0)

    def fit(self, X, labels, parents) -> "LinearAdversary":
        """Train map, class head and parent head on these crops.

        Args:
            X: (N, D) frozen features.
            labels: (N,) class of each crop (at least two classes).
            parents: (N,) parent of each crop.

        Returns:
            self.

        Raises:
            DiagnosticError: bad shapes, non-finite features, or fewer than two classes.
        """
        self._check_params()
        who = "LinearAdversary"
        require(f"{who}.fit", labels=labels, parents=parents)
        X, labels, parents = check_features(who, X, labels, parents)
        classes, y = np.unique(labels, return_inverse=True)
        y = y.reshape(-1)
        if len(classes) < 2:
            raise DiagnosticError(f"{who} needs crops of at least two classes to train a class head; got {len(classes)} class(es)")
        # Within-class parent codes: one column per (class, parent) cell.
        cells, pc = np.unique(np.stack([y, np.unique(parents, return_inverse=True)[1].reshape(-1)], axis=1), axis=0, return_inverse=True)
        pc = pc.reshape(-1)
        cell_class = torch.from_numpy(cells[:, 0])
        n, D = X.shape
        K, P = len(classes), len(cells)
        mu, sd = standardise(X)
        Z = torch.from_numpy(((X - mu) / sd).astype(np.float32))
        yt, pt = torch.from_numpy(y), torch.from_numpy(pc)
        gen = torch.Generator().manual_seed(int(self.random_state))
        A = torch.eye(D, requires_grad=True)
        a = torch.zeros(D, requires_grad=True)
        Wc = torch.zeros(K, D, requires_grad=True)
        bc = torch.zeros(K, requires_grad=True)
        Wa = torch.zeros(P, D, requires_grad=True)
        ba = torch.zeros(P, requires_grad=True)
        opt = torch.optim.Adam([A, a, Wc, bc, Wa, ba], lr=float(self.lr))
        bs = n if self.batch_size is None else min(int(self.batch_size), n)
        lc, la_ = 1.0 / (float(self.C) * n), 1.0 / (float(self.C_adv) * n)
        steps = int(self.steps)
        hist = np.zeros((steps, 2))
        with torch_threads(bs * D * (D + K + P)):
            self._train(Z, yt, pt, cell_class, (A, a, Wc, bc, Wa, ba), opt, gen, bs, lc, la_, hist)
        with torch.no_grad():
            h = Z @ A.T + a
            la = (h @ Wa.T + ba).masked_fill(cell_class[None, :] != yt[:, None], -1e9)
            self.adversary_accuracy_ = float((la.argmax(1) == pt).float().mean())
        self.mean_, self.scale_ = mu, sd
        self.map_weight_ = A.detach().numpy().copy()
        self.map_bias_ = a.detach().numpy().copy()
        self.head_weight_ = Wc.detach().numpy().copy()
        self.head_bias_ = bc.detach().numpy().copy()
        self.classes_ = classes
        self.parents_ = np.unique(parents)
        self.history_ = hist
        self.n_features_in_ = D
        return self

    def _train(self, Z, yt, pt, cell_class, params, opt, gen, bs, lc, la_, hist) -> None:
        A, a, Wc, bc, Wa, ba = params
        n, steps = Z.shape[0], len(hist)
        order = torch.randperm(n, generator=gen)
        pos = 0
        for step in range(steps):
            if pos + bs > n:
                order, pos = torch.randperm(n, generator=gen), 0
            idx = order[pos : pos + bs]
            pos += bs
            lam = float(self.weight) if self.schedule == "constant" else dann_lambda(step / max(steps - 1, 1), float(self.weight))
            h = Z[idx] @ A.T + a
            loss_c = F.cross_entropy(h @ Wc.T + bc, yt[idx])
            logits_a = grad_reverse(h, lam) @ Wa.T + ba
            logits_a = logits_a.masked_fill(cell_class[None, :] != yt[idx][:, None], -1e9)
            loss_a = F.cross_entropy(logits_a, pt[idx])
            loss = loss_c + loss_a + 0.5 * lc * (Wc * Wc).sum() + 0.5 * la_ * (Wa * Wa).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            hist[step] = (loss_c.item(), loss_a.item())

    def _check_fitted(self, X) -> np.ndarray:
        if not hasattr(self, "map_weight_"):
            raise DiagnosticError("LinearAdversary used before fit")
        X = as_numpy(X)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise DiagnosticError(f"LinearAdversary was fitted on {self.n_features_in_} features; got shape {X.shape}")
        return X

    def transform(self, X) -> np.ndarray:
        """(N, D) mapped features h (float32, or X's float dtype)."""
        X = self._check_fitted(X)
        h = ((X.astype(np.float64) - self.mean_) / self.scale_) @ self.map_weight_.T.astype(np.float64) + self.map_bias_
        return h.astype(X.dtype if np.issubdtype(X.dtype, np.floating) else np.float32)

    def predict(self, X) -> np.ndarray:
        """(N,) class label from the new head on the mapped features."""
        h = self.transform(X).astype(np.float64)
        return self.classes_[(h @ self.head_weight_.T + self.head_bias_).argmax(1)]

    def score(self, X, labels) -> float:
        """Class accuracy of the new head."""
        return float((self.predict(X) == np.asarray(labels)).mean())


# ------------------------------------------------------------------------------ the check
@dataclass(frozen=True, kw_only=True)
class AdversaryCheck(CheckOutcome):
    """R on raw, weight-0-mapped and adversary-mapped features (fresh, cross-fitted probes), the
    accuracy cost, the check.

    The check compares like with like: the adversary against the same map trained with weight 0
    (the class task alone). Training the map for the class task alone already lowers R (the
    review measured 14-28% of the above-floor R "removed" at weight 0 against the raw
    features, and the check passed in two of four runs with no adversary), and the accuracy
    cost was always measured against the weight-0 run; so the removed share is too.

    Attributes:
        adversary: the `LinearAdversary` trained on the training rows; baseline: the same
            training with weight 0.
        probe_before, R_before, above_floor_before: R on the raw features.
        probe_baseline, R_baseline, above_floor_baseline: R on the weight-0 map's features
            (cross-fitted as R after).
        probe_after, R_after, above_floor_after: R on the adversary's mapped features.
        removed_share: (above_floor_baseline - above_floor_after) / above_floor_baseline, the
            share the check uses (NaN when nothing is above the floor at weight 0).
        removed_share_raw: (above_floor_before - above_floor_after) / above_floor_before, against
            the raw features (for contrast: what the map and the adversary remove together).
        floor, check_on, cost, min_removed, max_cost, passed: as
            `probes.before_after.CheckOutcome` (passed: on `removed_share` and `cost`).
        accuracy_before, accuracy_after: test-set name -> class accuracy of the baseline's /
            the adversary's head.
        adversary_accuracy: the parent head's own training accuracy (for contrast only).
    """

    adversary: LinearAdversary
    baseline: LinearAdversary
    adversary_accuracy: float
    probe_baseline: ParentProbe
    R_baseline: float
    above_floor_baseline: float
    removed_share_raw: float


def adversary_check(X, labels, parents, *, train_idx, test_sets: Mapping[str, np.ndarray], adversary: LinearAdversary | None = None,
                    probe: ParentProbe | None = None, check_on: str | None = None, min_removed: float = 0.25, max_cost: float = 0.01,
                    cross_fit: bool = True, probe_before: ParentProbe | None = None,
                    probe_baseline: ParentProbe | None = None) -> AdversaryCheck:
    """Train the adversary and its weight-0 baseline on ``train_idx``, re-measure R with fresh
    probes on both maps' features, score both class heads.

    The removed share the check uses is measured against R on the weight-0 map's features,
    the baseline the accuracy cost is measured against (`AdversaryCheck`); the share against
    the raw features is reported beside it.

    Args:
        X, labels, parents: (N, D) features and (N,) classes and parents.
        train_idx: rows the adversary (and its weight-0 baseline) is trained on.
        test_sets: name -> rows on which the class heads are scored.
        adversary: an unfitted `LinearAdversary` whose settings are used (default settings if None).
        probe: a `ParentProbe` whose settings are used (default settings if None).
        check_on, min_removed, max_cost: the check (as `probes.leace.erasure_check`).
        cross_fit: R at weight 0 and after over all rows, each probe reading features mapped by
            a map trained without its validation / scored crops (True, ``n_folds / 2 + n_folds``
            extra trainings each); False: R on the rows outside ``train_idx`` only, mapped by
            the maps trained on ``train_idx``.
        probe_before: a fitted probe on the raw features of the same rows and settings, to reuse.
        probe_baseline: a fitted probe on the weight-0 map's features (an earlier check's
            ``probe_baseline`` with the same adversary settings but the weight), to reuse.

    Returns:
        `AdversaryCheck`.
    """
    who = "adversary_check"
    X, labels, parents, train_idx, check_on = check_inputs(who, X, labels, parents, train_idx, test_sets, check_on)
    params = (adversary or LinearAdversary()).get_params()
    zero = {**params, "weight": 0.0}
    adv = LinearAdversary(**params).fit(X[train_idx], labels[train_idx], parents[train_idx])
    base = adv if params["weight"] == 0 else LinearAdversary(**zero).fit(X[train_idx], labels[train_idx], parents[train_idx])
    if cross_fit:

        def mapped_by(settings: dict):
            return lambda mask: LinearAdversary(**settings).fit(X[mask], labels[mask], parents[mask]).transform(X)

        before = fit_before(probe, probe_before, X, labels, parents, who=who)
        baseline = (check_reused_probe(who, "probe_baseline", probe_baseline, len(X)) if probe_baseline is not None
                    else fit_after(probe, X, labels, parents, cross_fit=mapped_by(zero)))
        after = baseline if params["weight"] == 0 else fit_after(probe, X, labels, parents, cross_fit=mapped_by(params))
    else:
        rows = np.setdiff1d(np.arange(len(X)), train_idx)
        if len(rows) == 0:
            raise DiagnosticError(f"{who}(cross_fit=False) measures R on the rows outside train_idx; there are none")
        before = fit_before(probe, probe_before, X[rows], labels[rows], parents[rows], who=who)
        baseline = (check_reused_probe(who, "probe_baseline", probe_baseline, len(rows)) if probe_baseline is not None
                    else fit_after(probe, base.transform(X[rows]), labels[rows], parents[rows]))
        after = baseline if params["weight"] == 0 else fit_after(probe, adv.transform(X[rows]), labels[rows], parents[rows])
    acc_b, acc_a = {}, {}
    for name, r in test_sets.items():
        r = np.asarray(r, dtype=np.int64)
        acc_b[name] = base.score(X[r], labels[r]) if len(r) else math.nan
        acc_a[name] = adv.score(X[r], labels[r]) if len(r) else math.nan
    raw = outcome(before, after, acc_b, acc_a, check_on, min_removed, max_cost)
    same = outcome(baseline, after, acc_b, acc_a, check_on, min_removed, max_cost, warn=f"{who} (R at weight 0)")  # like against like
    return AdversaryCheck(
        adversary=adv, baseline=base, adversary_accuracy=adv.adversary_accuracy_, probe_baseline=baseline,
        R_baseline=baseline.R_, above_floor_baseline=same["above_floor_before"], removed_share_raw=raw["removed_share"],
        **{**raw, "removed_share": same["removed_share"], "passed": same["passed"]},
    )


def remeasure_R(adapter, crops, *, index: np.ndarray | None = None, probe: ParentProbe | None = None, batch_size: int = 256,
                cache_dir=None, progress: bool = False) -> ParentProbe:
    """R of a model trained with ``shortcutlab train --adversary-weight`` (H5): a fresh probe.

    The training-time adversary's own accuracy is not a measure of what the features still
    carry; this fits a new `ParentProbe` on the trained model's frozen features
    (`probes.extract_features`) of the crops (or of ``index``), and is the same call for any
    model, adversary or not, so trained and untrained R compare directly.

    Args:
        adapter: the trained model, wrapped (`shortcutlab.wrap`); put it in eval mode.
        crops: `shortcutlab.data.images.CropImages` (or a `CropTable` with an image column).
        index: rows to probe (default all).
        probe: an unfitted `ParentProbe` whose settings are used (default settings if None).
        batch_size, cache_dir, progress: as `probes.extract_features`.

    Returns:
        The fitted `ParentProbe` (``R_``, ``floor_``, ``above_floor_``, ``ci_``, ...).
    """
    from shortcutlab.data.images import CropImages, load_crops
    from shortcutlab.data.table import CropTable

    from .features import extract_features

    if isinstance(crops, CropTable):
        crops = load_crops(crops)
    if not isinstance(crops, CropImages):
        raise DiagnosticError(f"remeasure_R needs crops as CropImages or a CropTable with images (labels and parents come from its table); got {type(crops).__name__}")
    F_ = extract_features(adapter, crops, batch_size=batch_size, cache_dir=cache_dir, progress=progress)
    rows = np.arange(len(F_)) if index is None else np.asarray(index, dtype=np.int64)
    table = crops.table
    return clone_probe(probe).fit(F_[rows], np.asarray(table.label_codes)[rows], np.asarray(table.parent_codes)[rows])


# ------------------------------------------------------------------------------ diagnostic
@register("linear_adversary")
class LinearAdversaryDiagnostic(CheckDiagnostic):
    """The probe-matched linear adversary on frozen features (the paper's F7).

    Trained on the split's training side; R before and after (fresh probe, cross-fitted over
    every crop by default); class accuracy of the new head on the test side (``test``) and
    extra named index sets.

    Rows per weight (setting ``weight=<w>``): ``R`` (raw features), ``R_baseline`` (the
    weight-0 map's features) and ``R_after`` (the adversary's; Wilson intervals), ``floor``,
    ``above_floor``, ``above_floor_baseline``, ``above_floor_after``, ``removed_share``
    (against the weight-0 map: what the check uses), ``removed_share_raw`` (against the raw
    features), ``adversary_accuracy`` (the adversary's own, for contrast), and per test set (setting
    ``weight=<w>,test_set=<name>``) ``accuracy_before`` (same training, weight 0),
    ``accuracy_after``, ``accuracy_cost``; then ``check_passed`` (1.0 / 0.0).

    Args:
        weights: adversary weights (lambda_max) to run.
        steps, batch_size, lr, C_adv: the adversary's training (`LinearAdversary`).
        cross_fit: as `adversary_check`.
        test_sets, check_on, min_removed, max_cost: as `probes.leace.LeaceDiagnostic`.
        n_folds, Cs: the `ParentProbe`'s settings; random_state: folds and batches (None: ctx.seed).
    """

    label = "linear adversary"

    def __init__(self, weights: Sequence[float] = (1.0,), steps: int = 300, batch_size: int | None = 256, lr: float = 1e-2,
                 C_adv: float = 1.0, cross_fit: bool = True, test_sets: Mapping[str, Sequence[int]] | None = None, check_on: str = "test",
                 min_removed: float = 0.25, max_cost: float = 0.01, n_folds: int = 4, Cs: float | Sequence[float] = (0.01, 0.1, 1.0),
                 random_state: int | None = None) -> None:
        weights = (weights,) if isinstance(weights, (int, float, np.integer, np.floating)) and not isinstance(weights, bool) else weights
        try:
            self.weights = tuple(weights)
        except TypeError:
            raise bad("linear_adversary", "weights", "a list of adversary weights (finite numbers >= 0)", weights) from None
        if not self.weights:
            raise bad("linear_adversary", "weights", "a non-empty list of adversary weights (finite numbers >= 0)", weights)
        self.adversary_params = dict(steps=steps, batch_size=batch_size, lr=lr, C_adv=C_adv)
        for w in self.weights:  # every weight and training setting, checked here, before any work
            LinearAdversary(weight=w, **self.adversary_params)._check_params()
        if not isinstance(cross_fit, (bool, np.bool_)):
            raise bad("linear_adversary", "cross_fit", "True or False", cross_fit)
        self.cross_fit = cross_fit
        self._check_settings(test_sets=test_sets, check_on=check_on, min_removed=min_removed, max_cost=max_cost, n_folds=n_folds,
                             Cs=Cs, random_state=random_state)

    def run(self, ctx: DiagnosticContext) -> list[dict]:
        X, labels, parents, tests, probe, seed = self._prepare(ctx)
        # R before over every crop is shared with parent_probe and leace when the settings match;
        # without cross-fitting it is measured outside the training rows (fitted by the first check).
        before = fitted_probe(ctx, probe) if self.cross_fit else None
        baseline = None  # R at weight 0: one fit shared by every weight
        out: list[dict] = []
        for w in self.weights:
            chk = adversary_check(X, labels, parents, train_idx=ctx.train_idx, test_sets=tests,
                                  adversary=LinearAdversary(weight=w, random_state=seed, **self.adversary_params), probe=probe,
                                  check_on=self.check_on, min_removed=self.min_removed, max_cost=self.max_cost, cross_fit=self.cross_fit,
                                  probe_before=before, probe_baseline=baseline)
            before, baseline = chk.probe_before, chk.probe_baseline
            s = f"weight={w:g}"
            n0 = baseline.n_scored_
            out += check_rows(ctx, self.name, chk, s, tests, [
                row(ctx, self.name, "R_baseline", chk.R_baseline, setting=s, ci=baseline.ci_, n=n0),
                row(ctx, self.name, "above_floor_baseline", chk.above_floor_baseline, setting=s, n=n0),
                row(ctx, self.name, "removed_share_raw", chk.removed_share_raw, setting=s, n=chk.probe_before.n_scored_),
                row(ctx, self.name, "adversary_accuracy", chk.adversary_accuracy, setting=s, n=len(ctx.train_idx)),
            ])
        return out
