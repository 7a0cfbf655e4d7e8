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
from shortcutlab.errors import ShortcutlabError  # noqa: E402
from shortcutlab.io import OutputError  # noqa: E402


def _train_inputs(tmp_path):
    """A 16-crop manifest (8 parents, 2 classes, 12 x 12 crops with masks) and a parent split."""
    import os

    import numpy as np
    import pandas as pd
    from PIL import Image

    from shortcutlab import parent_split
    from shortcutlab.recipe import load_manifest_table

    os.makedirs(tmp_path / "crops", exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(16):
        Image.fromarray((rng.random((12, 12, 3)) * 255).astype(np.uint8)).save(tmp_path / "crops" / f"c{i}.png")
        mask = np.zeros((12, 12), np.uint8)
        mask[3:9, 3:9] = 255
        Image.fromarray(mask).save(tmp_path / "crops" / f"m{i}.png")
        rows.append({"id": f"c{i}", "path": f"crops/c{i}.png", "mask": f"crops/m{i}.png", "label": f"k{i % 2}", "parent": f"f{i // 2}"})
    man = str(tmp_path / "manifest.csv")
    pd.DataFrame(rows).to_csv(man, index=False)
    split = str(tmp_path / "split.csv")
    parent_split(load_manifest_table(man), 0.25, seed=0).to_csv(split)
    return man, split


def _train(tmp_path, out="run", **config):
    from shortcutlab.recipe import TrainConfig, train

    man, split = _train_inputs(tmp_path)
    return train(man, split, str(tmp_path / out), TrainConfig(arch="test_resnet", epochs=1, batch_size=8, **config), progress=False)


def _train_without_cuda(tmp_path, device):
    from unittest import mock

    import torch

    with mock.patch.object(torch.cuda, "is_available", lambda: False):
        return _train(tmp_path, device=device)


def _train_into_a_file(tmp_path, out):
    (tmp_path / "afile").write_text("not a folder")
    return _train(tmp_path, out=out)


def _demo_into_a_file(tmp_path):
    from shortcutlab.demo import DemoConfig, run_demo

    (tmp_path / "afile").write_text("not a folder")
    return run_demo(str(tmp_path / "afile"), DemoConfig(fields_per_class=4, epochs=1, crop_size=16, progress=False))


TRAINING_CASES: list[Case] = [
    Case("train-device-cuda-without-gpu", lambda p: _train_without_cuda(p, "cuda"), ShortcutlabError, ("'cuda'", "no CUDA GPU", "available here: cpu")),
    Case("train-device-cuda-index-beyond", lambda p: _train_without_cuda(p, "cuda:99"), ShortcutlabError, ("'cuda:99'", "available here: cpu")),
    Case("train-device-unknown", lambda p: _train(p, device="tpu"), ShortcutlabError, ("'tpu'", "not a torch device", "available here: ")),
    Case("train-out-dir-is-a-file", lambda p: _train_into_a_file(p, "afile"), OutputError, ("afile", "is a file, not a folder")),
    Case("train-out-dir-parent-is-a-file", lambda p: _train_into_a_file(p, "afile/run"), OutputError, ("afile/run", "'", "is a file, not a folder")),
    Case("demo-out-dir-is-a-file", _demo_into_a_file, OutputError, ("afile", "not a folder")),
]


@pytest.mark.parametrize("device", ["tpu", "cuda:99"])
def test_cli_train_refuses_a_missing_device_in_one_line(device, tmp_path, capsys):
    man, split = _train_inputs(tmp_path)
    line = cli_error(["train", "--manifest", man, "--split", split, "--epochs", "1", "--device", device, "--out", str(tmp_path / "run"), "--quiet"], capsys)
    assert f"'{device}'" in line and "available here: " in line
    assert not (tmp_path / "run").exists()


def test_cli_train_refuses_a_run_folder_inside_a_file(tmp_path, capsys):
    man, split = _train_inputs(tmp_path)
    (tmp_path / "afile").write_text("x")
    line = cli_error(["train", "--manifest", man, "--split", split, "--epochs", "1", "--out", str(tmp_path / "afile" / "run"), "--quiet"], capsys)
    assert "afile" in line and "is a file, not a folder" in line


ALL_CASES = TABLE_CASES + SPLIT_CASES + INTERVENTION_CASES + TRAINING_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)
