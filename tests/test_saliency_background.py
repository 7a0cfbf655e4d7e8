"""Does Grad-CAM's outside mass move with a mechanism that lives in the background? (issue 24, item 4)

The benchmark: the synthetic benchmark without any signature (``none``), plus a per-parent
RGB tint (normal, SD 0.08 in [0, 1] units) painted only on background pixels, outside every
cell of the crop (`SynthData.all_cells`); the control is the same benchmark untinted. A leak
model (factorial cell leak-high: it trained on siblings of the test crops' parents) can read
each test parent's tint; a clean model (clean-high) cannot. All are ``cam_cnn`` (the demo's
model: 8 x 8 Grad-CAM cells at 32 px), trained with the demo's quick recipe (12 epochs, lr
1e-3), and the Grad-CAM diagnostic runs on the common test crops with all-cells masks, so that
"outside" is the background. Seeds 0, 1 and 2, the only seeds tried (12 models, about 10 s a
seed on 2 idle cores, 30 s loaded).

What holds:

- the leak is large (leak minus clean test accuracy +0.475, +0.392, +0.481) and lives in the
  background (without the tint the leak model falls to 0.338, 0.703, 0.286 against the clean
  model's 0.488, 0.662, 0.403);
- the tint moves the outside mass: models trained and scored with it put 0.778, 0.750, 0.806
  (leak) and 0.800, 0.780, 0.824 (clean) of their mass outside the cells, models of the
  untinted control 0.586, 0.629, 0.662 and 0.625, 0.615, 0.655 (+0.12 to +0.19 each).

What does not: the leak models' outside mass is not higher than the clean models' (-0.021,
-0.029, -0.018). The clean models learned the same shortcut on their own training parents (it
identifies the parent, hence the class, there too) and read the tint just as much; it only
fails them on unseen parents (their accuracy is lower with the tint than without: 0.375 vs
0.488, 0.473 vs 0.662, 0.377 vs 0.403). The leak / clean contrast is whether the test parents
were seen, not which features are used, and saliency measures the features. The same held at
the network's earlier stages, with a class-contrastive head, with a 2-stage variant whose
Grad-CAM layer has a 7 px receptive field, and with class_signal 1.0. That test is kept as a
strict expected failure: it fails loudly (XPASS) if a change makes Grad-CAM separate them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

SEEDS = (0, 1, 2)
TINT_SD = 0.08


def _accuracy(adapter, crops, test: np.ndarray) -> float:
    x, _ = crops.float_batch(torch.from_numpy(test))
    y = torch.as_tensor(np.asarray(crops.table.label_codes)[test])
    with torch.no_grad():
        return float((adapter.logits(x).argmax(1) == y).float().mean())


def _tinted_crops(seed: int, sd: float):
    """The benchmark's crops (all-cells masks), with a per-parent background tint of SD `sd`,
    and without it."""
    from shortcutlab.data.images import CropImages
    from shortcutlab.studies.demo import _crops_from_synth
    from shortcutlab.synth import SynthConfig, synthesize

    data = synthesize(SynthConfig(seed=seed, n_classes=3, fields_per_class=30, mean_cells_per_field=6.0, crop_size=32,
                                  field_size=128, mechanisms=("none",), class_signal=0.6))
    plain = _crops_from_synth(data, all_cells=True)
    parents = np.asarray(plain.table.parent_codes)
    tint = np.random.default_rng(1000 + seed).normal(0.0, sd, size=(int(parents.max()) + 1, 3))
    background = ~plain.masks[:, 0].bool()
    x = plain.images.float() / 255 + torch.from_numpy(tint[parents]).float()[:, :, None, None] * background[:, None]
    tinted = CropImages((x.clamp(0, 1) * 255).round().to(torch.uint8), plain.masks, plain.table)
    return tinted, plain


def _train_and_measure(crops, plain, split, folder, cell: str, seed: int) -> dict:
    """Train one cell's model on `crops` and measure it on the test crops."""
    import probes
    from probes.base import DiagnosticContext
    from shortcutlab.data.audit import side_codes
    from shortcutlab.models.recipe import TrainConfig, train
    from shortcutlab.models.runs import load_run
    from shortcutlab.studies.demo import DemoConfig

    quick = DemoConfig.quick()
    cfg = TrainConfig(arch=quick.arch, epochs=quick.epochs, batch_size=quick.batch_size, lr=quick.lr, precise_bn=True, seed=seed)
    train(crops, str(folder / "split.csv"), str(folder / cell), cfg, cell=cell, progress=False)
    run = load_run(str(folder / cell))
    side = side_codes(crops.table, split.cell(cell))
    test = np.flatnonzero(side == 2)
    ctx = DiagnosticContext(run.adapter, crops, side, run_id=cell, batch_size=64, seed=0)
    got = {r["metric"]: r["value"] for r in probes.get("gradcam", cascade=0, n_boot=0).run(ctx) if "cascade" not in r["setting"]}
    return {"acc": _accuracy(run.adapter, crops, test), "acc_untinted": _accuracy(run.adapter, plain, test),
            "outside_mass": got["outside_mass"], "cells": (got["cam_height"], got["cam_width"])}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Per (seed, tint SD, cell): test accuracy with and without the tint, and Grad-CAM's outside mass."""
    from shortcutlab.data.splits import factorial_split

    out = {}
    for seed in SEEDS:
        for sd in (TINT_SD, 0.0):
            tinted, plain = _tinted_crops(seed, sd)
            split = factorial_split(tinted.table, seed=seed, test_parent_share=0.3, diversity_contrast=1.43)
            folder = tmp_path_factory.mktemp(f"seed{seed}-sd{sd}")
            split.to_csv(str(folder / "split.csv"))
            for cell in ("leak-high", "clean-high"):
                out[(seed, sd, cell)] = _train_and_measure(tinted, plain, split, folder, cell, seed)
    return out


@pytest.mark.slow
def test_the_planted_background_leak_is_real_and_lives_in_the_background(measured):
    for seed in SEEDS:
        leak, clean = measured[(seed, TINT_SD, "leak-high")], measured[(seed, TINT_SD, "clean-high")]
        assert leak["cells"] == clean["cells"] == (8, 8)
        assert leak["acc"] - clean["acc"] > 0.2, (seed, leak, clean)                    # seen +0.39 .. +0.48
        assert leak["acc"] - leak["acc_untinted"] > 0.1, (seed, leak)                   # seen 0.16 .. 0.57
        assert leak["acc_untinted"] - clean["acc_untinted"] < 0.1, (seed, leak, clean)  # seen -0.15 .. +0.04


@pytest.mark.slow
def test_the_background_tint_moves_the_outside_mass_of_leak_and_clean_models_alike(measured):
    """Models trained with the tint against models of the untinted control, per seed and cell."""
    for seed in SEEDS:
        for cell in ("leak-high", "clean-high"):
            with_tint, control = measured[(seed, TINT_SD, cell)], measured[(seed, 0.0, cell)]
            assert with_tint["outside_mass"] - control["outside_mass"] > 0.05, (seed, cell)  # seen +0.12 .. +0.19


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="Grad-CAM's outside mass does not separate leak from clean models when both learned "
                                       "the background shortcut: leak minus clean -0.021, -0.029, -0.018 (module docstring)")
def test_grad_cam_puts_more_mass_outside_the_cells_in_leak_models(measured):
    for seed in SEEDS:
        assert measured[(seed, TINT_SD, "leak-high")]["outside_mass"] > measured[(seed, TINT_SD, "clean-high")]["outside_mass"] + 0.02, seed
