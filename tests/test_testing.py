"""`shortcutlab.testing`: the contract checks catch broken plug-ins, naming the broken rule.

Each toy below breaks one rule on purpose (an intervention that changes the image shape or
mutates its input, a diagnostic whose rows lack ROW_COLUMNS, an executor that runs a task
before its dependency, ...) and the check must fail with that rule's message; a correct toy
of each kind passes. The registered built-ins pass in the contract test files.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
import torch

import interventions
from interventions import Intervention
from probes import Diagnostic, row
from shortcutlab.sweep import TaskFailed
from shortcutlab.testing import check_diagnostic, check_executor, check_intervention, synthetic_batch, synthetic_context, toy_graph, toy_outputs


# --- interventions -------------------------------------------------------------------------------
class Dim(Intervention):
    """A correct deterministic toy: halves the intensity."""

    def apply(self, x, mask, params, **context):
        return x * 0.5


class Shrink(Intervention):
    """Crops a column off."""

    def apply(self, x, mask, params, **context):
        return x[..., :-1]


class ShrinkPastTheChecks(Shrink):
    """Crops a column off, bypassing the base class's forward and its checks."""

    def forward(self, x, mask=None, **kw):
        return x[..., :-1].clone()


class Mutate(Intervention):
    """Writes into its input."""

    def apply(self, x, mask, params, **context):
        return x.mul_(0.5)


class Unseeded(Intervention):
    """Stochastic, but draws from the global generator: a seed does not fix it."""

    stochastic = True

    def draw_params(self, x, generator):
        return {"level": torch.rand(x.shape[0], dtype=torch.float64).to(x.dtype)}

    def apply(self, x, mask, params, **context):
        return x * params["level"].view(-1, 1, 1, 1)


class Tint(Intervention):
    """A correct label-conditioned toy whose per-crop `level` comes from `targets_for`."""

    label_conditioned = True
    label = "tint by class"
    seen: list = []

    @classmethod
    def targets_for(cls, crops, split, seed):
        codes = torch.as_tensor(np.asarray(crops.table.label_codes), dtype=torch.float32)
        return {"level": (codes + 1) / 4}

    def apply(self, x, mask, params, level, **context):
        Tint.seen.append(level.clone())
        return x * level.to(x.dtype).view(-1, 1, 1, 1)


class TintShortTargets(Tint):
    """targets_for gives one row too few."""

    @classmethod
    def targets_for(cls, crops, split, seed):
        return {"level": torch.ones(crops.table.n_crops - 1)}


class NoTargets(Intervention):
    label_conditioned = True

    def apply(self, x, mask, params, level, **context):
        return x


class NumberLabel(Dim):
    label = 3


def test_a_correct_intervention_passes_as_class_or_instance():
    assert check_intervention(Dim) is None
    assert check_intervention(Dim()) is None


def test_targets_for_feeds_a_label_conditioned_intervention():
    Tint.seen.clear()
    check_intervention(Tint)
    # synthetic crops: 12 parents of 4 crops, class k(parent % 3); the batch is the first 4 rows,
    # all of parent p00, class k0 -> level (0 + 1) / 4
    full = [lv for lv in Tint.seen if lv.shape == (4,)]
    assert full and all(torch.equal(lv, torch.full((4,), 0.25)) for lv in full)
    assert any(lv.shape == (0,) for lv in Tint.seen)  # the empty batch got empty targets


@pytest.mark.parametrize(
    "toy, rule",
    [
        (Shrink, "the output has the input's shape, dtype and device"),
        (ShrinkPastTheChecks, "the output has the input's shape, dtype and device"),
        (Mutate, "the input is not changed in place"),
        (Unseeded, "a seed fixes a stochastic intervention's draw"),
        (NoTargets, "a label-conditioned intervention gets its per-crop context"),
        (TintShortTargets, "targets_for(crops, split, seed) returns None or a dict of per-crop arrays, first dim = number of crops"),
        (NumberLabel, "the display label is a str"),
    ],
    ids=["changes-shape", "changes-shape-in-forward", "mutates-input", "ignores-seed", "no-context", "short-targets", "label-not-str"],
)
def test_a_broken_intervention_fails_naming_the_rule(toy, rule):
    with pytest.raises(AssertionError) as info:
        check_intervention(toy)
    assert str(info.value).startswith(rule + ": "), str(info.value)


def test_a_registered_intervention_needs_its_function_twin():
    interventions.register("dim_without_twin")(Dim)
    try:
        with pytest.raises(AssertionError, match=r"^every intervention has a plain function twin: .*dim_without_twin"):
            check_intervention(Dim)
    finally:
        interventions.unregister("dim_without_twin")
        Dim.name = ""


def test_a_wrong_batch_value_is_not_accepted_silently():
    # an intervention must refuse uint8; one whose forward casts and carries on breaks the rule
    class Lenient(Intervention):
        def forward(self, x, mask=None, **kw):
            return super().forward(x.float() / 255 if not x.is_floating_point() else x, mask, **kw)

        def apply(self, x, mask, params, **context):
            return x.clone()

    with pytest.raises(AssertionError, match=r"^bad input is refused \(uint8\): no InterventionError"):
        check_intervention(Lenient)
    x, _ = synthetic_batch()
    assert torch.equal(Lenient()(x), x)  # valid input was fine: only the bad-input rule broke


# --- diagnostics ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def context():
    return synthetic_context()


class LabelMean(Diagnostic):
    """A correct toy: the mean class code of the test crops."""

    needs = frozenset({"split"})

    def run(self, ctx):
        return [row(ctx, self.name, "label_mean", float(ctx.labels[ctx.test_idx].mean()), n=len(ctx.test_idx))]


class NoSchema(Diagnostic):
    def run(self, ctx):
        return [{"value": 1.0}]


class Retrains(Diagnostic):
    def run(self, ctx):
        with torch.no_grad():
            next(ctx.adapter.model.parameters()).add_(1.0)
        return [row(ctx, self.name, "m", 1.0, n=1)]


class LeavesEval(Diagnostic):
    def run(self, ctx):
        ctx.adapter.model.eval()
        return [row(ctx, self.name, "m", 1.0, n=1)]


class Jitters(Diagnostic):
    def run(self, ctx):
        return [row(ctx, self.name, "m", random.random(), n=1)]


class MasksUnchecked(Diagnostic):
    needs = frozenset({"masks"})

    def missing(self, ctx):
        return None

    def run(self, ctx):
        return [row(ctx, self.name, "m", 1.0, n=1)]


class OutsideInterval(Diagnostic):
    def run(self, ctx):
        return [row(ctx, self.name, "m", 0.9, ci=(0.1, 0.2), n=1)]


def test_a_correct_diagnostic_passes(context):
    assert check_diagnostic(LabelMean, context=context) is None
    # its value, by hand: the test crops' class codes
    (r,) = LabelMean().run(context)
    assert r["value"] == pytest.approx(np.mean(np.asarray(context.table.label_codes)[context.side == 2]))


@pytest.mark.parametrize(
    "toy, rule",
    [
        (NoSchema, "every row starts with ROW_COLUMNS"),
        (Retrains, "the model is left bit-identical"),
        (LeavesEval, "the model's train/eval modes are left as they were"),
        (Jitters, "a second run gives the same rows"),
        (MasksUnchecked, "needs are checked before running"),
        (OutsideInterval, "the interval holds the value"),
    ],
    ids=["no-schema", "changes-weights", "changes-mode", "not-deterministic", "needs-unchecked", "value-outside-ci"],
)
def test_a_broken_diagnostic_fails_naming_the_rule(toy, rule, context):
    import copy

    ctx = copy.deepcopy(context)  # a broken toy may change the model
    with pytest.raises(AssertionError) as info:
        check_diagnostic(toy, context=ctx)
    assert str(info.value).startswith(rule + ": "), str(info.value)


def test_check_diagnostic_refuses_what_is_not_a_diagnostic(context):
    with pytest.raises(AssertionError, match="check_diagnostic takes a Diagnostic subclass or instance"):
        check_diagnostic(Dim(), context=context)


# --- executors -----------------------------------------------------------------------------------
class Serial:
    """A correct toy executor: in order, in this process."""

    name = "serial"

    def run(self, tasks, fn, on_done=None):
        for t in tasks:
            try:
                result = fn(t)
            except Exception as e:
                raise TaskFailed(t, e) from e
            if on_done:
                on_done(t, result)


class Backwards(Serial):
    def run(self, tasks, fn, on_done=None):
        super().run(list(tasks)[::-1], fn, on_done)


class Silent(Serial):
    def run(self, tasks, fn, on_done=None):
        super().run(tasks, fn, None)


class Twice(Serial):
    def run(self, tasks, fn, on_done=None):
        super().run(tasks, fn, lambda t, r: (on_done(t, r), on_done(t, r)))


class Unwrapped(Serial):
    def run(self, tasks, fn, on_done=None):
        for t in tasks:
            result = fn(t)
            if on_done:
                on_done(t, result)


class KeepsGoing(Serial):
    """Runs every task it can and raises the first failure at the end."""

    def run(self, tasks, fn, on_done=None):
        failure = None
        for t in tasks:
            try:
                result = fn(t)
            except Exception as e:
                failure = failure or TaskFailed(t, e)
                continue
            if on_done:
                on_done(t, result)
        if failure:
            raise failure


class ForgetsResults(Serial):
    def run(self, tasks, fn, on_done=None):
        super().run(tasks, fn, lambda t, r: on_done(t, {}))


def test_a_correct_executor_passes():
    assert check_executor(Serial) is None
    assert check_executor(Serial()) is None


def test_the_toy_outputs_follow_the_graph():
    """The reference outputs of check_executor, by hand: a task's file is the SHA-256 of its
    sorted-key JSON parameters, '|', and its dependencies' files joined by '|'."""
    graph, ids = toy_graph()
    out = toy_outputs(graph)
    sha = lambda text: hashlib.sha256(text.encode()).hexdigest()  # noqa: E731
    a = sha('{"name": "a", "sleep": 0.05}|')
    b = sha('{"name": "b", "sleep": 0.05}|' + a)
    c = sha('{"name": "c", "sleep": 0.05, "weight": 2}|' + a)
    assert out[f"{ids['a']}.txt"] == a and out[f"{ids['b']}.txt"] == b and out[f"{ids['c']}.txt"] == c
    assert out[f"{ids['d']}.txt"] == sha('{"name": "d", "sleep": 0.05}|' + b + "|" + c)
    assert len(out) == 7


@pytest.mark.parametrize(
    "toy, rule",
    [
        (Backwards, "a task starts only after all its dependencies returned"),
        (Silent, "on_done is called once per task"),
        (Twice, "on_done is called once per task"),
        (Unwrapped, "a failing task raises TaskFailed naming the task and the cause"),
        (KeepsGoing, "no task is started after a failure"),
        (ForgetsResults, "on_done gets the task function's result"),
    ],
    ids=["dependency-last", "no-on-done", "on-done-twice", "raw-exception", "runs-past-failure", "wrong-result"],
)
def test_a_broken_executor_fails_naming_the_rule(toy, rule):
    with pytest.raises(AssertionError) as info:
        check_executor(toy)
    assert str(info.value).startswith(rule + ": "), str(info.value)


def test_an_executor_without_run_is_refused():
    class NoRun:
        name = "norun"

    with pytest.raises(AssertionError, match=r"^an executor has run\(tasks, fn, on_done\)"):
        check_executor(NoRun)


# --- issue 21: a diagnostic's rows carry the metrics it declares it supplies ----------------------
class SuppliesWhatItLacks(Diagnostic):
    supplies = {"recoverability": "R"}

    def run(self, ctx):
        return [row(ctx, self.name, "m", 1.0, n=1)]


def test_a_diagnostic_must_have_rows_of_what_it_supplies(context):
    with pytest.raises(AssertionError) as info:
        check_diagnostic(SuppliesWhatItLacks, context=context)
    assert str(info.value).startswith("rows carry every metric the diagnostic supplies: no rows of metric 'R'"), str(info.value)
