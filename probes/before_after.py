"""What the removal checks share: LEACE's `erasure_check` and the adversary's `adversary_check`.

Both remove the parent code from frozen features by a fitted map (an eraser, an adversary),
re-measure R with a fresh `ParentProbe` and compare a class head before and after:

- the inputs: features, labels and parents, the training rows, the named test sets and the
  one the cost is measured on (`check_inputs`);
- R before (a probe on the original features, or one already fitted) and after (a fresh probe
  with the same settings on the mapped features, its exclusion warnings silenced: the probe
  before announced the same ones) (`fit_before`, `fit_after`);
- the outcome (`outcome`): the share of the above-floor R removed, the accuracy cost on
  ``check_on`` and the pass / fail of "at least ``min_removed`` removed at a cost of at most
  ``max_cost``";
- the diagnostics' settings and set-up (`CheckDiagnostic`) and their rows (`check_rows`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from .base import Diagnostic, DiagnosticContext, row
from .errors import DiagnosticError, DiagnosticWarning
from .parent_probe import ParentProbe, check_features, clone_probe, probe_rows, require
from .validation import bad, check_int


@dataclass(frozen=True, kw_only=True)
class CheckOutcome:
    """R before and after the removal, the accuracy cost, and the pass/fail check (`outcome`).

    Attributes:
        probe_before, probe_after: the fitted `ParentProbe`s (after: on the mapped features).
        R_before, R_after, floor, above_floor_before, above_floor_after: fractions.
        removed_share: (above_floor_before - above_floor_after) / above_floor_before (NaN when
            nothing is above the floor); `probes.adversary.AdversaryCheck` measures it against
            R on its weight-0 map's features instead, and keeps this one as ``removed_share_raw``.
            The floor is the probe's out-of-sample class-only floor, the same before and after
            (same crops, same folds), so a removal down to the class prior gives 1, not more.
        accuracy_before, accuracy_after: test-set name -> class accuracy of the head before / after.
        check_on: the test set the cost is measured on; cost: accuracy_before - accuracy_after
            there (fraction; 0.01 = 1 pp).
        min_removed, max_cost: the thresholds; passed: removed_share >= min_removed and
            cost <= max_cost.
    """

    probe_before: ParentProbe
    probe_after: ParentProbe
    R_before: float
    R_after: float
    floor: float
    above_floor_before: float
    above_floor_after: float
    removed_share: float
    accuracy_before: dict
    accuracy_after: dict
    check_on: str
    cost: float
    min_removed: float
    max_cost: float
    passed: bool


def check_rows_index(who: str, name: str, rows, n: int) -> np.ndarray:
    """(m,) int64 row positions in [0, n), or a `DiagnosticError` naming `name` and the value.

    Floats (even whole ones), booleans and negative positions are refused: numpy would truncate
    0.5 to row 0, read a boolean mask as rows 0 and 1, and take -1 as the last row, silently.
    """
    arr = np.asarray(rows.detach().cpu() if hasattr(rows, "detach") else rows)
    if arr.ndim != 1:
        raise DiagnosticError(f"{who}: {name} must be a 1-D array of row positions; got shape {arr.shape}")
    if arr.size and arr.dtype == bool:
        raise DiagnosticError(f"{who}: {name} must hold row positions, not a boolean mask; use np.flatnonzero(mask)")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        first = arr.flat[0].item() if hasattr(arr.flat[0], "item") else arr.flat[0]
        raise DiagnosticError(f"{who}: {name} must hold integer row positions in [0, {n}); got dtype {arr.dtype} (e.g. {first!r})")
    arr = arr.astype(np.int64, copy=False)
    bad = (arr < 0) | (arr >= n)
    if bad.any():
        raise DiagnosticError(
            f"{who}: {name} must hold row positions in [0, {n}) (the feature rows); got {int(arr[bad][0])} "
            f"({int(bad.sum())} of {arr.size} out of range)"
        )
    return arr


def check_inputs(who: str, X, labels, parents, train_idx, test_sets: Mapping, check_on: str | None):
    """Validated ``(X, labels, parents, train_idx, check_on)``; check_on defaults to the first test set."""
    require(who, labels=labels, parents=parents)
    X, labels, parents = check_features(who, X, labels, parents)
    train_idx = check_rows_index(who, "train_idx", train_idx, X.shape[0])
    if len(train_idx) == 0:
        raise DiagnosticError(f"{who} needs training rows (train_idx is empty)")
    if not test_sets:
        raise DiagnosticError(f"{who} needs at least one test set (name -> rows)")
    for name, rows in test_sets.items():
        check_rows_index(who, f"test_sets[{name!r}]", rows, X.shape[0])
    check_on = next(iter(test_sets)) if check_on is None else check_on
    if check_on not in test_sets:
        raise DiagnosticError(f"{who}: check_on={check_on!r} is not a test set; the test sets are {sorted(test_sets)}")
    return X, labels, parents, train_idx, check_on


def check_reused_probe(who: str, name: str, fitted: ParentProbe, n: int) -> ParentProbe:
    """`fitted` when it is a `ParentProbe` fitted on `n` rows; a `DiagnosticError` naming `name` otherwise.

    A probe handed in for reuse (R before, R at weight 0) must have measured the rows the check
    measures; one fitted elsewhere would compare R over different crops, silently.
    """
    if not isinstance(fitted, ParentProbe) or not hasattr(fitted, "folds_"):
        raise DiagnosticError(f"{who}: {name} must be a fitted ParentProbe (or None); got {type(fitted).__name__}"
                              + (" before fit" if isinstance(fitted, ParentProbe) else ""))
    if len(fitted.folds_) != n:
        raise DiagnosticError(f"{who}: {name} was fitted on {len(fitted.folds_)} rows, but this check measures R on {n} rows; "
                              "pass a probe fitted on the same rows, or None")
    return fitted


def fit_before(probe: ParentProbe | None, probe_before: ParentProbe | None, X, labels, parents, who: str = "the check") -> ParentProbe:
    """R before: `probe_before` when given (already fitted on these rows, `check_reused_probe`), else a fresh fit."""
    if probe_before is not None:
        return check_reused_probe(who, "probe_before", probe_before, len(X))
    return clone_probe(probe).fit(X, labels, parents)


def fit_after(probe: ParentProbe | None, X, labels, parents, cross_fit: Callable[[np.ndarray], np.ndarray] | None = None) -> ParentProbe:
    """R after: a fresh probe with `probe`'s settings (cross-fitted through `cross_fit` when given)."""
    with warnings.catch_warnings():  # the same exclusions were announced by the probe before
        warnings.simplefilter("ignore", UserWarning)
        return clone_probe(probe).fit(X, labels, parents, cross_fit=cross_fit)


def outcome(before: ParentProbe, after: ParentProbe, accuracy_before: dict, accuracy_after: dict, check_on: str,
            min_removed: float, max_cost: float, warn: str | None = None) -> dict:
    """The `CheckOutcome` fields of a check, as keyword arguments of its result class.

    With nothing above the floor before (R <= floor) there is nothing to remove: the removed
    share is NaN and the check fails; `warn` (the check's name) says so in a `DiagnosticWarning`.
    """
    af_b = before.R_ - before.floor_
    af_a = after.R_ - after.floor_
    removed = (af_b - af_a) / af_b if af_b > 0 else math.nan
    if af_b <= 0 and warn:
        warnings.warn(f"{warn}: R {before.R_:.4f} is not above the class-only floor {before.floor_:.4f} on {before.n_scored_} crops: "
                      "there is nothing to remove, so removed_share is NaN and the check fails", DiagnosticWarning, stacklevel=3)
    cost = accuracy_before[check_on] - accuracy_after[check_on]
    passed = bool(removed >= min_removed and cost <= max_cost) if not math.isnan(removed) else False
    return dict(probe_before=before, probe_after=after, R_before=before.R_, R_after=after.R_, floor=before.floor_,
                above_floor_before=af_b, above_floor_after=af_a, removed_share=removed, accuracy_before=accuracy_before,
                accuracy_after=accuracy_after, check_on=check_on, cost=cost, min_removed=float(min_removed),
                max_cost=float(max_cost), passed=passed)


def named_test_sets(ctx: DiagnosticContext, extra: Mapping) -> dict[str, np.ndarray]:
    """The split's test side as ``test``, then the diagnostic's extra named index sets."""
    return {"test": ctx.test_idx, **{k: np.asarray(v, dtype=np.int64) for k, v in extra.items()}}


def check_rows(ctx: DiagnosticContext, name: str, chk, setting: str, tests: Mapping, extra: list[dict]) -> list[dict]:
    """The rows of one check: R before (`probe_rows`), ``R_after``, ``above_floor_after``,
    ``removed_share``, the diagnostic's `extra` rows, ``accuracy_before`` / ``_after`` /
    ``_cost`` per test set (setting ``<setting>,test_set=<name>``) and ``check_passed``."""
    n = chk.probe_before.n_scored_
    n_after = chk.probe_after.n_scored_
    out = probe_rows(ctx, name, chk.probe_before, setting=setting, per_class=False)
    out += [
        row(ctx, name, "R_after", chk.R_after, setting=setting, ci=chk.probe_after.ci_, n=n_after),
        row(ctx, name, "above_floor_after", chk.above_floor_after, setting=setting, n=n_after),
        row(ctx, name, "removed_share", chk.removed_share, setting=setting, n=n),
        *extra,
    ]
    for test in tests:
        st = f"{setting},test_set={test}"
        m = len(tests[test])
        out += [
            row(ctx, name, "accuracy_before", chk.accuracy_before[test], setting=st, n=m),
            row(ctx, name, "accuracy_after", chk.accuracy_after[test], setting=st, n=m),
            row(ctx, name, "accuracy_cost", chk.accuracy_before[test] - chk.accuracy_after[test], setting=st, n=m),
        ]
    out.append(row(ctx, name, "check_passed", float(chk.passed), setting=f"{setting},test_set={chk.check_on}", n=n,
                   min_removed=chk.min_removed, max_cost=chk.max_cost))
    return out


class CheckDiagnostic(Diagnostic):
    """What the check diagnostics (``leace``, ``linear_adversary``) share: the settings of the
    check and of its `ParentProbe`, and the set-up of a run (features, test sets, probe)."""

    needs = frozenset({"features", "split"})

    def _check_settings(self, *, test_sets: Mapping | None, check_on: str, min_removed: float, max_cost: float, n_folds: int,
                        Cs, random_state: int | None) -> None:
        who = self.name or type(self).__name__
        if test_sets is not None and not isinstance(test_sets, Mapping):
            raise bad(who, "test_sets", "a mapping of test-set name -> row indices", test_sets)
        names = ["test", *(test_sets or {})]
        if not isinstance(check_on, str) or check_on not in names:
            raise bad(who, "check_on", f"one of the test sets ({', '.join(map(repr, names))})", check_on)
        for name in ("min_removed", "max_cost"):
            v = min_removed if name == "min_removed" else max_cost
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
                raise bad(who, name, "a finite number (a fraction)", v)
        if random_state is not None:
            check_int(who, "random_state", random_state, 0)
        ParentProbe(n_folds=n_folds, Cs=Cs)._params()  # the probe's settings, checked before any work
        self.test_sets = dict(test_sets or {})
        self.check_on = check_on
        self.min_removed = min_removed
        self.max_cost = max_cost
        self.n_folds = n_folds
        self.Cs = Cs
        self.random_state = random_state

    def _prepare(self, ctx: DiagnosticContext) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray], ParentProbe, int]:
        """``(X, labels, parents, tests, probe, seed)`` of a run: the context's features, the test
        sets (`named_test_sets`) and an unfitted probe with this diagnostic's settings."""
        why = self.missing(ctx)
        if why:
            raise DiagnosticError(f"{self.name} {why}")
        seed = ctx.seed if self.random_state is None else self.random_state
        probe = ParentProbe(n_folds=self.n_folds, Cs=self.Cs, random_state=seed)
        return ctx.features(), ctx.labels, ctx.parents, named_test_sets(ctx, self.test_sets), probe, seed
