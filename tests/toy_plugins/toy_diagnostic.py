"""A toy diagnostic plug-in: how exposed the test crops are to their siblings, and the mean
logit the model gives their true class.

Both can be computed by hand from a sweep's files: the sibling share from the split's sides
and the crops' parents, the mean true-class logit from the run's ``logits.csv``.
"""

from __future__ import annotations

import numpy as np

import probes
from probes import Diagnostic, row

NAME = "toy_exposure"


class ToyExposure(Diagnostic):
    """Share of test crops whose parent has a crop on the training side, and the test crops'
    mean true-class logit."""

    needs = frozenset({"split"})
    label = "toy exposure"
    metric_labels = {"sibling_share": "sibling share", "mean_true_logit": "mean true-class logit"}
    metric_units = {"sibling_share": "fraction", "mean_true_logit": "logit"}
    leak_metrics = ("sibling_share",)  # a 0-1 fraction the report reads against the leak

    def __init__(self, batch_size: int = 64) -> None:
        self.batch_size = batch_size

    def run(self, ctx):
        import torch

        from shortcutlab.models.adapter import eval_mode

        test = ctx.test_idx
        share = float(np.isin(ctx.parents[test], ctx.parents[ctx.train_idx]).mean())
        true = []
        with torch.no_grad(), eval_mode(ctx.adapter):
            for start in range(0, len(test), self.batch_size):
                idx = test[start:start + self.batch_size]
                x, _ = ctx.batch(idx)
                logits = ctx.adapter.logits(x).double().cpu().numpy()
                true.append(logits[np.arange(len(idx)), ctx.labels[idx]])
        mean_logit = float(np.concatenate(true).mean())
        return [row(ctx, self.name, "sibling_share", share, n=len(test)),
                row(ctx, self.name, "mean_true_logit", mean_logit, n=len(test))]


def register() -> type[ToyExposure]:
    """Register `ToyExposure` as ``toy_exposure``."""
    probes.register(NAME)(ToyExposure)
    return ToyExposure


def unregister() -> None:
    probes.unregister(NAME)
