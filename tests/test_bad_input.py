"""The bad-input catalogue: every user mistake we know of, one case each.

Each case builds the bad input, calls the public API (or the CLI's `main`), and checks the
error type and that the one-line message names the culprit (the file, row, column, value or
shape) and what was expected. CLI cases also check that no traceback reaches the user and that
a failed command leaves no half-written output.

The catalogue grows with every feature: add a case to the section of the module you touch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest

from probes.base import DiagnosticError


@dataclass(frozen=True)
class Case:
    """One bad input: `call(tmp_path)` must raise `error` with every string of `names` in it."""

    id: str
    call: Callable
    error: type
    names: tuple[str, ...]


def check(case: Case, tmp_path) -> None:
    with pytest.raises(case.error) as info:
        case.call(tmp_path)
    message = str(info.value)
    assert "\n" not in message.strip(), f"message is not one line: {message!r}"
    for name in case.names:
        assert name.lower() in message.lower(), f"message {message!r} does not name {name!r}"


def cli_error(argv: list[str], capsys) -> str:
    """Run the CLI; it must exit 2 with one 'shortcutlab CMD: error: ...' line and no traceback."""
    from shortcutlab.cli import main

    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, f"exit code {rc}, stderr {err!r}"
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and ": error: " in lines[0], err
    return lines[0]


# --- tables, crop images and the CLI's table loading ----------------------------------------
TABLE_CASES: list[Case] = []


# --- splits, near-duplicate linking and manifests ---------------------------------------------
SPLIT_CASES: list[Case] = []


# --- interventions ---------------------------------------------------------------------------
INTERVENTION_CASES: list[Case] = []


# --- training ------------------------------------------------------------------------------
TRAINING_CASES: list[Case] = []


# --- probes ---------------------------------------------------------------------------------
PROBE_CASES: list[Case] = []


def _probe_data(n=12, d=3, n_classes=2, crops_per_parent=3):
    import numpy as np

    X = np.random.default_rng(0).normal(size=(n, d))
    parents = np.arange(n) // crops_per_parent
    labels = parents % n_classes
    return X, labels, parents


def _parent_probe(X, labels, parents):
    from probes import ParentProbe

    return ParentProbe(n_folds=2, Cs=1.0).fit(X, labels, parents)


def _probe_singletons(tmp_path):
    X, labels, parents = _probe_data(crops_per_parent=1)
    _parent_probe(X, labels, parents)


def _probe_lengths(tmp_path):
    X, labels, parents = _probe_data()
    _parent_probe(X, labels[:-1], parents)


def _probe_nan(tmp_path):
    X, labels, parents = _probe_data()
    X[4, 1] = float("nan")
    _parent_probe(X, labels, parents)


def _leace_lengths(tmp_path):
    from probes import LeaceErasure

    X, labels, parents = _probe_data()
    LeaceErasure().fit(X[:-2], parents)


def _leace_nan(tmp_path):
    from probes import LeaceErasure

    X, labels, parents = _probe_data()
    X[7, 0] = float("inf")
    LeaceErasure(within_class=True).fit(X, parents, labels)


def _refit_head_single_class(tmp_path):
    import numpy as np

    from probes import refit_head

    X, _, _ = _probe_data()
    refit_head(None, X, np.zeros(len(X), dtype=int))


def _adversary_single_class(tmp_path):
    import numpy as np

    from probes import LinearAdversary

    X, _, parents = _probe_data()
    LinearAdversary(steps=1).fit(X, np.zeros(len(X), dtype=int), parents)


PROBE_CASES += [
    Case("probe-parent-probe-parents-with-one-crop-only", _probe_singletons, DiagnosticError, ("ParentProbe", "one crop")),
    Case("probe-parent-probe-labels-length", _probe_lengths, DiagnosticError, ("labels", "12 rows", "11")),
    Case("probe-parent-probe-nan-features", _probe_nan, DiagnosticError, ("finite", "rows [4]")),
    Case("probe-leace-parents-length", _leace_lengths, DiagnosticError, ("LeaceErasure", "parents", "10 rows", "12")),
    Case("probe-leace-inf-features", _leace_nan, DiagnosticError, ("LeaceErasure", "finite", "rows [7]")),
    Case("probe-refit-head-single-class", _refit_head_single_class, DiagnosticError, ("refit_head", "two classes", "1 class")),
    Case("probe-linear-adversary-single-class", _adversary_single_class, DiagnosticError, ("LinearAdversary", "two classes", "1 class")),
]


ALL_CASES = TABLE_CASES + SPLIT_CASES + INTERVENTION_CASES + TRAINING_CASES + PROBE_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)
