"""Does Grad-CAM's outside mass move with a leak that lives in the background? (issue 24, item 4)

The benchmark: the synthetic benchmark without any signature (``none``), plus a per-parent
RGB tint (normal, SD 0.08 in [0, 1] units) painted only on background pixels, outside every
cell of the crop (`SynthData.all_cells`). A leak model (factorial cell leak-high: it trained on
siblings of the test crops' parents) can read each test parent's tint; a clean model
(clean-high) cannot. Both are ``cam_cnn`` (the demo's model: 8 x 8 Grad-CAM cells at 32 px),
trained with the demo's quick recipe (12 epochs, lr 1e-3), and the Grad-CAM diagnostic runs
on the common test crops with all-cells masks, so that "outside" is the background.

What holds (seeds 0, 1 and 2, the only seeds tried; each takes about 30 s on 2 shared cores):
the leak is large (leak minus clean test accuracy +0.475, +0.392, +0.481) and lives in the
background (without the tint the leak model falls to 0.338, 0.703, 0.286 against the clean
model's 0.488, 0.662, 0.403).

What does not: the leak models' outside mass is not higher than the clean models' (0.778 vs
0.800, 0.750 vs 0.780, 0.806 vs 0.824; about the background's share of the crop, 0.81, for
both), nor at the network's earlier stages (stages.0 to stages.2 gave differences of both
signs), nor with the class-contrastive head (w_k minus the mean over classes). Grad-CAM on a
global-average-pooled network is an additive split of the logit's level over positions
(logit_k = mean over positions of w_k . A + b); a tint spread over 80% of the crop moves that
level a little at every background position, while the large, shared part of the level sits on
cell edges and the crop border for every model, leak or clean. The outside mass measures where
the evidence is, not where the evidence that separates parents is. That test is kept as a
strict expected failure: it fails loudly (XPASS) if a change makes Grad-CAM separate them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

SEEDS = (0, 1, 2)
TINT_SD = 0.08


def _tinted_crops(seed: int):
    """The benchmark's crops (all-cells masks), with and without the per-parent background tint."""
    from shortcutlab.data.images import CropImages
    from shortcutlab.studies.demo import _crops_from_synth
    from shortcutlab.synth import SynthConfig, synthesize

    data = synthesize(SynthConfig(seed=seed, n_classes=3, fields_per_class=30, mean_cells_per_field=6.0, crop_size=32,
                                  field_size=128, mechanisms=("none",), class_signal=0.6))
    plain = _crops_from_synth(data, all_cells=True)
    parents = np.asarray(plain.table.parent_codes)
    tint = np.random.default_rng(1000 + seed).normal(0.0, TINT_SD, size=(int(parents.max()) + 1, 3))
    background = ~plain.masks[:, 0].bool()
    x = plain.images.float() / 255 + torch.from_numpy(tint[parents]).float()[:, :, None, None] * background[:, None]
    tinted = CropImages((x.clamp(0, 1) * 255).round().to(torch.uint8), plain.masks, plain.table)
    return tinted, plain


def _accuracy(adapter, crops, test: np.ndarray) -> float:
    x, _ = crops.float_batch(torch.from_numpy(test))
    y = torch.as_tensor(np.asarray(crops.table.label_codes)[test])
    with torch.no_grad():
        return float((adapter.logits(x).argmax(1) == y).float().mean())


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Per seed and cell: test accuracy with and without the tint, and Grad-CAM's outside mass."""
    import probes
    from probes.base import DiagnosticContext
    from shortcutlab.data.audit import side_codes
    from shortcutlab.data.splits import factorial_split
    from shortcutlab.models.recipe import TrainConfig, train
    from shortcutlab.models.runs import load_run
    from shortcutlab.studies.demo import DemoConfig

    quick = DemoConfig.quick()
    out = {}
    for seed in SEEDS:
        tinted, plain = _tinted_crops(seed)
        split = factorial_split(tinted.table, seed=seed, test_parent_share=0.3, diversity_contrast=1.43)
        folder = tmp_path_factory.mktemp(f"seed{seed}")
        split.to_csv(str(folder / "split.csv"))
        for cell in ("leak-high", "clean-high"):
            cfg = TrainConfig(arch=quick.arch, epochs=quick.epochs, batch_size=quick.batch_size, lr=quick.lr, precise_bn=True, seed=seed)
            train(tinted, str(folder / "split.csv"), str(folder / cell), cfg, cell=cell, progress=False)
            run = load_run(str(folder / cell))
            side = side_codes(tinted.table, split.cell(cell))
            test = np.flatnonzero(side == 2)
            ctx = DiagnosticContext(run.adapter, tinted, side, run_id=cell, batch_size=64, seed=0)
            rows = probes.get("gradcam", cascade=0, n_boot=0).run(ctx)
            got = {r["metric"]: r["value"] for r in rows if "cascade" not in r["setting"]}
            out[(seed, cell)] = {"acc": _accuracy(run.adapter, tinted, test), "acc_untinted": _accuracy(run.adapter, plain, test),
                                 "outside_mass": got["outside_mass"], "cells": (got["cam_height"], got["cam_width"])}
    return out


@pytest.mark.slow
def test_the_planted_background_leak_is_real_and_lives_in_the_background(measured):
    for seed in SEEDS:
        leak, clean = measured[(seed, "leak-high")], measured[(seed, "clean-high")]
        assert leak["cells"] == clean["cells"] == (8, 8)
        assert leak["acc"] - clean["acc"] > 0.2, (seed, leak, clean)               # seen +0.39 .. +0.48
        assert leak["acc"] - leak["acc_untinted"] > 0.1, (seed, leak)              # seen 0.16 .. 0.57
        assert leak["acc_untinted"] - clean["acc_untinted"] < 0.1, (seed, leak, clean)  # seen -0.15 .. +0.04


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="Grad-CAM's outside mass does not move with a leak that lives in the background: "
                                       "leak minus clean -0.021, -0.029, -0.018 (see the module docstring)")
def test_grad_cam_puts_more_mass_outside_the_cells_in_leak_models(measured):
    for seed in SEEDS:
        assert measured[(seed, "leak-high")]["outside_mass"] > measured[(seed, "clean-high")]["outside_mass"] + 0.02, seed
