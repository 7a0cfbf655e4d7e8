"""examples/real_dataset/run.sh, docs/real-datasets.md's walk-through from a released folder to the
report, run as a user would (the shell script and the `shortcutlab` command), checked against
what the generator knows and a download does not: each crop's field and box, and the
checkpoint's own classifier keys."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    work = tmp_path_factory.mktemp("example")
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(["bash", str(ROOT / "examples" / "real_dataset" / "run.sh"), "study"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return work / "study", done.stdout


@pytest.mark.slow
def test_every_crop_is_located_in_its_true_field_at_its_true_box(study):
    folder, out = study
    truth = pd.read_csv(folder / "released_truth.csv")
    located = pd.read_csv(folder / "located.csv")
    got = located.assign(file=located["path"].str.replace("released/", "", n=1, regex=False)).set_index("file")
    t = truth.set_index("file").loc[got.index]
    assert (got["parent"] == t["field"]).all()
    assert (got[["x", "y", "w", "h"]].to_numpy() == t[["x", "y", "w", "h"]].to_numpy()).all()  # exact copies: exact boxes
    assert "agrees with the located parent for 88 of 88 crops (100.0%)" in out


@pytest.mark.slow
def test_the_masks_load_with_the_table_and_the_report_is_written(study):
    from shortcutlab.data.images import load_crops
    from shortcutlab.data.table import CropTable

    folder, _ = study
    table = CropTable.from_csv(str(folder / "masks" / "masks.csv"), image="path", mask="mask", box="x,y,w,h")
    crops = load_crops(table)
    share = crops.masks.float().mean(dim=(1, 2, 3)).numpy()
    assert crops.masks.shape[0] == table.n_crops == 88 and table.n_parents == 18
    assert (share > 0.02).all() and (share < 0.9).all()  # a cell in every crop, never the whole crop
    for name in ("report.html", "report.md", "estimates.csv", "validity.csv"):
        assert (folder / "sweep" / "report" / name).stat().st_size > 0


@pytest.mark.slow
def test_the_models_were_fine_tuned_from_the_checkpoint_with_its_head_replaced(study):
    from safetensors.numpy import load_file

    folder, _ = study
    ckpt = load_file(str(folder / "imagenet_like.safetensors"))
    thousand = sorted(k for k, v in ckpt.items() if v.shape[:1] == (1000,))
    runs = sorted((folder / "sweep" / "tasks" / "train").glob("*/run.json"))
    assert len(runs) == 4  # 2 seeds x leak-high, clean-high
    for path in runs:
        record = json.loads(path.read_text())
        fit = record["weights_fit"]
        assert sorted(fit["dropped"]) == thousand and record["config"]["input_size"] == 64
        assert len(record["classes"]) == 3
    assert np.isfinite(pd.read_parquet(folder / "sweep" / "predictions.parquet")["correct"].astype(float)).all()
