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


# --- group identifiability and feature extraction ----------------------------------------------
from probes.base import DiagnosticError  # noqa: E402


def _ident(X_rows: int, parents) -> Callable:
    def call(tmp_path):
        import numpy as np

        from probes import GroupIdentifiability

        GroupIdentifiability().fit_score(np.random.default_rng(0).normal(size=(X_rows, 4)), np.asarray(parents))

    return call


def _extract(images) -> Callable:
    def call(tmp_path):
        import torch

        from probes import extract_features
        from shortcutlab.adapter import wrap

        net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2))
        extract_features(wrap(net, head="3", mean=0.5, std=0.25), images())

    return call


def _tensor(shape, dtype_name: str) -> Callable:
    return lambda: __import__("torch").zeros(shape, dtype=getattr(__import__("torch"), dtype_name))


IDENT_CASES: list[Case] = [
    Case("ident-lengths-differ", _ident(12, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5]), DiagnosticError, ("12 rows", "parents has 11")),
    Case("ident-single-parent", _ident(6, ["slide7"] * 6), DiagnosticError, ("two parents", "'slide7'")),
    Case("ident-all-singletons", _ident(5, [0, 1, 2, 3, 4]), DiagnosticError, ("two or more crops", "5 parents", "5 of them with one crop")),
    Case("features-crops-wrong-shape", _extract(_tensor((4, 1, 16, 16), "uint8")), DiagnosticError, ("(N, 3, H, W)", "(4, 1, 16, 16)")),
    Case("features-crops-channels-last", _extract(_tensor((4, 16, 16, 3), "uint8")), DiagnosticError, ("(N, 3, H, W)", "(4, 16, 16, 3)", "permute(0, 3, 1, 2)")),
    Case("features-crops-wrong-dtype", _extract(_tensor((4, 3, 16, 16), "int32")), DiagnosticError, ("uint8", "torch.int32")),
    Case("features-crops-not-a-tensor", _extract(lambda: [[0.0]]), DiagnosticError, ("(N, 3, H, W) tensor", "list")),
]


ALL_CASES = TABLE_CASES + SPLIT_CASES + INTERVENTION_CASES + TRAINING_CASES + IDENT_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)
