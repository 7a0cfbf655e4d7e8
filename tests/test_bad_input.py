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
import numpy as _np  # noqa: E402  (imports of this section, kept beside the cases that use them)
import pandas as _pd  # noqa: E402
import torch  # noqa: E402

import interventions  # noqa: E402
from interventions import InterventionError, Reinhard, StainNormalize, field_target_tensors  # noqa: E402


def _iv_images(shape=(2, 3, 8, 8), fill: float | None = None) -> torch.Tensor:
    x = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    return x if fill is None else x.fill_(fill)


def _iv_mask(shape=(2, 1, 8, 8), value: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    return torch.full(shape, value, dtype=dtype)


def _iv_with(x: torch.Tensor, index, value) -> torch.Tensor:
    x[index] = value
    return x


def _iv_call(name: str, x, mask=None, **params):
    return interventions.get(name, **params)(x, mask)


def _iv_field_without_cell_pixels(tmp_path):
    columns = [f"{c}_{s}" for s in ("mean", "std") for c in "Lab"]
    stats = _pd.DataFrame([[60.0, 5.0, 0.0, 10.0, 4.0, 4.0], [_np.nan] * 6], index=_pd.Index(["p1", "p2"], name="parent"), columns=columns)
    return field_target_tensors(stats, ["p1", "p2"])


_IE = InterventionError
INTERVENTION_CASES: list[Case] = [
    Case("interv-uint8-images", lambda p: _iv_call("greyscale", (_iv_images() * 255).byte()), _IE, ("dtype torch.uint8", "float", "divide uint8 images by 255")),
    Case("interv-values-above-one", lambda p: _iv_call("low_pass", _iv_with(_iv_images(), (0, 0, 0, 0), 1.5)), _IE, ("[0, 1]", "max 1.5")),
    Case("interv-negative-values", lambda p: _iv_call("hed_jitter", _iv_with(_iv_images(), (1, 2, 3, 3), -0.25)), _IE, ("[0, 1]", "min -0.25")),
    Case("interv-nan", lambda p: _iv_call("greyscale", _iv_with(_iv_images(), (0, 0, 0, 0), float("nan"))), _IE, ("[0, 1]", "nan")),
    Case("interv-rank-3", lambda p: _iv_call("greyscale", _iv_images((3, 8, 8))), _IE, ("(B, 3, H, W)", "(3, 8, 8)")),
    Case("interv-two-channels", lambda p: _iv_call("reinhard", _iv_images((2, 2, 8, 8)), target_mean=(50, 0, 0), target_std=(10, 5, 5)), _IE, ("(B, 3, H, W)", "(2, 2, 8, 8)")),
    Case("interv-zero-height", lambda p: _iv_call("stain_normalize", _iv_images((2, 3, 0, 8))), _IE, ("at least 1 x 1 pixel", "(2, 3, 0, 8)")),
    Case("interv-mask-wrong-size", lambda p: _iv_call("background_removal", _iv_images(), _iv_mask((2, 1, 7, 8))), _IE, ("(2, 1, 8, 8)", "(2, 1, 7, 8)")),
    Case("interv-mask-wrong-batch", lambda p: _iv_call("illumination_flattening", _iv_images(), _iv_mask((3, 1, 8, 8))), _IE, ("(2, 1, 8, 8)", "(3, 1, 8, 8)")),
    Case("interv-mask-above-one", lambda p: _iv_call("background_noise", _iv_images(), _iv_mask(value=2.0)), _IE, ("mask", "[0, 1]", "max 2")),
    Case("interv-mask-integers", lambda p: _iv_call("background_removal", _iv_images(), _iv_with(_iv_mask(value=0, dtype=torch.long), (0, 0, 0, 0), 3)), _IE, ("0/1", "[0, 3]")),
    Case("interv-mask-missing", lambda p: _iv_call("background_transplant", _iv_images()), _IE, ("background_transplant needs a cell mask", "(B, 1, H, W)")),
    Case("interv-unknown-name", lambda p: _iv_call("grayscale", _iv_images()), _IE, ("unknown intervention 'grayscale'", "did you mean 'greyscale'")),
    Case("interv-unknown-parameter", lambda p: _iv_call("low_pass", _iv_images(), sigmma=2.0), _IE, ("'sigmma'", "takes: sigma")),
    Case("interv-sigma-not-a-number", lambda p: _iv_call("low_pass", _iv_images(), sigma=True), _IE, ("low_pass sigma", "positive number of pixels", "True")),
    Case("interv-params-to-deterministic", lambda p: interventions.get("greyscale")(_iv_images(), params={}), _IE, ("greyscale is deterministic",)),
    Case("interv-transplant-one-crop", lambda p: _iv_call("background_transplant", _iv_images((1, 3, 8, 8)), _iv_mask((1, 1, 8, 8), 0.0)), _IE, ("only one crop", "donors=")),
    Case("interv-patch-too-large", lambda p: _iv_call("corner_patches", _iv_images(), size=20), _IE, ("size 20", "8 x 8", "size <= 8")),
    Case("interv-reinhard-target-shape", lambda p: _iv_call("reinhard", _iv_images(), target_mean=(50, 0), target_std=(10, 5, 5)), _IE, ("target_mean", "3 LAB values", "(2,)")),
    Case("interv-reinhard-zero-std", lambda p: _iv_call("reinhard", _iv_images(), target_mean=(50, 0, 0), target_std=(10, 0, 5)), _IE, ("target_std must be positive", "0.0")),
    Case("interv-reinhard-fit-mask-count", lambda p: Reinhard().fit(_iv_images((3, 3, 8, 8)), _iv_mask()), _IE, ("one mask per image (N = 3)", "(2, 1, 8, 8)")),
    Case("interv-reinhard-fit-all-masks-empty", lambda p: Reinhard().fit(_iv_images(), _iv_mask(value=0.0)), _IE, ("all 2 crop(s) have an empty cell mask", "no cell pixel")),
    Case("interv-field-without-cell-pixels", _iv_field_without_cell_pixels, _IE, ("['p2']", "mask is empty")),
    Case("interv-stain-fit-no-images", lambda p: StainNormalize().fit(_iv_images((0, 3, 8, 8))), _IE, ("at least one target image", "(0, 3, 8, 8)")),
    Case("interv-stain-fit-no-tissue", lambda p: StainNormalize().fit(_iv_images(fill=0.97)), _IE, ("no stain estimate", "0 tissue pixels")),
]


# --- training ------------------------------------------------------------------------------
TRAINING_CASES: list[Case] = []


ALL_CASES = TABLE_CASES + SPLIT_CASES + INTERVENTION_CASES + TRAINING_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)
