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


# --- saliency (probes.saliency) ----------------------------------------------------------------
def _saliency_net(cam: bool = True):
    import torch
    from torch import nn

    from shortcutlab import wrap

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()
    return wrap(model, head="4", mean=0.5, std=0.25, **({"cam_layer": "1"} if cam else {}))


def _crops(n: int = 2, size: int = 16):
    import torch

    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(0))


def _mask_wrong_size(tmp_path):
    import torch

    from probes import randomized_head_check

    randomized_head_check(_saliency_net(), _crops(), None, masks=torch.ones(2, 1, 8, 8))


def _outside_mask_wrong_size(tmp_path):
    import torch

    from probes import outside_mass

    outside_mass(torch.rand(2, 16, 16), torch.ones(2, 1, 16, 12))


def _targets_wrong_length(tmp_path):
    from probes import gradcam

    gradcam(_saliency_net(), _crops(), targets=[0, 1, 2])


def _target_out_of_range(tmp_path):
    from probes import gradcam

    gradcam(_saliency_net(), _crops(), targets=[0, 7])


def _no_cam_layer(tmp_path):
    from probes import gradcam

    gradcam(_saliency_net(cam=False), _crops(), targets=None)


def _cascade_too_deep(tmp_path):
    from probes import randomized_head_check

    randomized_head_check(_saliency_net(), _crops(), None, cascade=5)


def _saliency_cases() -> list[Case]:
    from probes import DiagnosticError
    from shortcutlab.adapter import ModelError

    return [
        Case("saliency-mask-wrong-size", _mask_wrong_size, DiagnosticError, ("masks", "(2, 1, 16, 16)", "(2, 1, 8, 8)")),
        Case("saliency-outside-mass-mask-wrong-size", _outside_mask_wrong_size, DiagnosticError, ("masks", "(2, 1, 16, 16)", "(2, 1, 16, 12)")),
        Case("saliency-targets-wrong-length", _targets_wrong_length, DiagnosticError, ("targets", "(2,)", "(3,)")),
        Case("saliency-target-out-of-range", _target_out_of_range, DiagnosticError, ("targets", "[0, 3)", "7")),
        Case("saliency-no-cam-layer", _no_cam_layer, ModelError, ("cam_layer=", "Sequential")),
        Case("saliency-cascade-too-deep", _cascade_too_deep, DiagnosticError, ("cascade=5", "1 ('0'")),
    ]


SALIENCY_CASES: list[Case] = _saliency_cases()


ALL_CASES = TABLE_CASES + SPLIT_CASES + INTERVENTION_CASES + TRAINING_CASES + SALIENCY_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)
