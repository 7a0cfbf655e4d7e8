"""Accuracy on the test side under every registered intervention that applies.

For each intervention the run's test crops are altered batch by batch and re-scored by the
trained model; a row gives the accuracy with its Wilson interval and its change from the
unaltered crops (metric ``accuracy_change``, in accuracy units). Which interventions apply:

- mask-requiring ones only when the crops have masks;
- label-conditioned ones (Reinhard to an unseen field of the crop's class, F2) only when their
  per-crop targets are given (``ctx.targets[name]``), since choosing targets is a design
  decision of the study, not something to guess;
- stochastic ones draw from a generator seeded by the context's seed, so reruns agree;
- ones with a reference to fit (``fit(images, masks)``: Reinhard's global target, Macenko's
  stain reference) are fitted on (up to `fit_crops` of) the run's training crops, cell pixels
  only, unless their parameters are given: test crops are normalised to the training data.
"""

from __future__ import annotations

import numpy as np
import torch

from shortcutlab.stats import wilson_interval

from .base import Diagnostic, DiagnosticContext, DiagnosticError, row
from .registry import register


@register("interventions")
class InterventionAccuracy(Diagnostic):
    """Test accuracy under each intervention (and none).

    Args:
        names: interventions to run (default: every registered one that applies).
        params: constructor arguments per intervention name.
    """

    needs = frozenset({"split", "head"})

    def __init__(self, names: list[str] | None = None, params: dict | None = None, fit_crops: int = 1024) -> None:
        self.names = names
        self.params = params or {}
        self.fit_crops = int(fit_crops)

    def applicable(self, ctx: DiagnosticContext) -> tuple[list[str], dict[str, str]]:
        """(names to run, {name: reason skipped})."""
        import interventions

        names = self.names if self.names is not None else interventions.available()
        run, skipped = [], {}
        for name in names:
            cls = interventions.get_class(name)
            if cls.requires_mask and not ctx.has_masks:
                skipped[name] = "needs cell masks and the crops have none"
            elif cls.label_conditioned and name not in ctx.targets:
                skipped[name] = "label-conditioned: give its per-crop targets"
            else:
                run.append(name)
        return run, skipped

    def _accuracy(self, ctx: DiagnosticContext, fn=None, targets: dict | None = None) -> tuple[int, int]:
        idx = ctx.test_idx
        labels = torch.as_tensor(ctx.labels)
        correct = 0
        with torch.no_grad():
            for b in range(0, len(idx), ctx.batch_size):
                sel = idx[b : b + ctx.batch_size]
                x, m = ctx.batch(sel)
                if fn is not None:
                    kw = {k: v[torch.as_tensor(sel)].to(x.device) for k, v in (targets or {}).items()}
                    x = fn(x, m, **kw)
                pred = ctx.adapter.logits(x).argmax(1).cpu()
                correct += int((pred == labels[torch.as_tensor(sel)]).sum())
        return correct, len(idx)

    def run(self, ctx: DiagnosticContext) -> list[dict]:
        import interventions

        names, skipped = self.applicable(ctx)
        k0, n = self._accuracy(ctx)
        base = k0 / n
        rows = [row(ctx, self.name, "accuracy", base, setting="intervention=none", ci=wilson_interval(k0, n), n=n)]
        for name in names:
            try:
                fn = interventions.get(name, **self.params.get(name, {}))
            except Exception as e:
                raise DiagnosticError(f"intervention {name!r}: {e}") from None
            if callable(getattr(fn, "fit", None)) and name not in self.params:
                rng = np.random.default_rng(ctx.seed)
                train = ctx.train_idx
                pick = np.sort(rng.choice(train, size=min(len(train), self.fit_crops), replace=False))
                x, m = ctx.batch(pick)
                fn.fit(x, m)
            if getattr(fn, "stochastic", False):
                fn.generator = torch.Generator().manual_seed(ctx.seed)
            k, n = self._accuracy(ctx, fn, ctx.targets.get(name))
            rows.append(row(ctx, self.name, "accuracy", k / n, setting=f"intervention={name}", ci=wilson_interval(k, n), n=n))
            rows.append(row(ctx, self.name, "accuracy_change", k / n - base, setting=f"intervention={name}", n=n))
        for name, why in skipped.items():
            rows.append(row(ctx, self.name, "skipped", np.nan, setting=f"intervention={name}", n=0, note=why))
        return rows
