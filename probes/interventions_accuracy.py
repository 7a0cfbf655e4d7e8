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

from .base import Diagnostic, DiagnosticContext, row
from .errors import DiagnosticError
from shortcutlab.models.adapter import eval_mode
from .registry import register


@register("interventions")
class InterventionAccuracy(Diagnostic):
    """Test accuracy under each intervention (and none).

    Args:
        names: interventions to run (default: every registered one that applies).
        params: constructor arguments per intervention name.
    """

    needs = frozenset({"split", "head"})
    label = "intervention accuracy"

    def __init__(self, names: list[str] | None = None, params: dict | None = None, fit_crops: int = 1024) -> None:
        import interventions

        if names is not None:
            if isinstance(names, str) or not isinstance(names, (list, tuple)):
                raise DiagnosticError(f"interventions names must be a list of intervention names or None (all); got {names!r}")
            for n in names:
                try:
                    interventions.get_class(n)  # an unknown name lists the close matches
                except Exception as e:
                    raise DiagnosticError(f"interventions names: {e}") from None
        if params is not None and not isinstance(params, dict):
            raise DiagnosticError(f"interventions params must be a mapping intervention name -> parameters; got {params!r}")
        for n, p in (params or {}).items():
            if not isinstance(p, dict):
                raise DiagnosticError(f"interventions params[{n!r}] must be a mapping of the intervention's parameters; got {p!r}")
            try:
                interventions.get(n, **p)  # built once here, so a bad setting is refused before any work
            except Exception as e:
                raise DiagnosticError(f"interventions params: intervention {n!r}: {e}") from None
        if isinstance(fit_crops, bool) or not isinstance(fit_crops, (int, np.integer)) or fit_crops < 1:
            raise DiagnosticError(f"interventions fit_crops must be an int >= 1; got {fit_crops!r}")
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

    def run(self, ctx: DiagnosticContext) -> list[dict]:
        names, skipped = self.applicable(ctx)
        labels = ctx.labels[ctx.test_idx]
        k0 = int((predict_test_side(ctx) == labels).sum())
        n = len(labels)
        base = k0 / n
        rows = [row(ctx, self.name, "accuracy", base, setting="intervention=none", ci=wilson_interval(k0, n), n=n)]
        for name in names:
            fn = prepare_intervention(ctx, name, self.params.get(name, {}), fit=name not in self.params, fit_crops=self.fit_crops)
            k = int((predict_test_side(ctx, fn, ctx.targets.get(name)) == labels).sum())
            rows.append(row(ctx, self.name, "accuracy", k / n, setting=f"intervention={name}", ci=wilson_interval(k, n), n=n))
            rows.append(row(ctx, self.name, "accuracy_change", k / n - base, setting=f"intervention={name}", n=n))
        for name, why in skipped.items():
            rows.append(row(ctx, self.name, "skipped", np.nan, setting=f"intervention={name}", n=0, note=why))
        return rows


def prepare_intervention(ctx: DiagnosticContext, name: str, params: dict | None = None, *, fit: bool = True, fit_crops: int = 1024):
    """The intervention `name` built with `params`, ready to score the run's crops.

    One with a reference to fit (``fit(images, masks)``) is fitted, when `fit` is true, on up
    to `fit_crops` of the run's training crops drawn with the context's seed; a stochastic one
    draws from a generator seeded with the context's seed.
    """
    import interventions

    try:
        fn = interventions.get(name, **(params or {}))
    except Exception as e:
        raise DiagnosticError(f"intervention {name!r}: {e}") from None
    if fit and callable(getattr(fn, "fit", None)):
        rng = np.random.default_rng(ctx.seed)
        train = ctx.train_idx
        pick = np.sort(rng.choice(train, size=min(len(train), fit_crops), replace=False))
        x, m = ctx.batch(pick)
        fn.fit(x, m)
    if getattr(fn, "stochastic", False):
        fn.generator = torch.Generator().manual_seed(ctx.seed)
    return fn


def predict_test_side(ctx: DiagnosticContext, fn=None, targets: dict | None = None) -> np.ndarray:
    """(n_test,) predicted class codes of the run's test crops (``ctx.test_idx`` order), each
    batch altered by ``fn(x, mask, **targets)`` first when `fn` is given."""
    from interventions import target_rows

    idx = ctx.test_idx
    out = []
    with torch.no_grad(), eval_mode(ctx.adapter):
        for b in range(0, len(idx), ctx.batch_size):
            sel = idx[b : b + ctx.batch_size]
            x, m = ctx.batch(sel)
            if fn is not None:
                kw = target_rows(targets, sel, x.device) if targets else {}
                x = fn(x, m, **kw)
            out.append(ctx.adapter.logits(x).argmax(1).cpu().numpy())
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, dtype=np.int64)


def score_interventions(ctx: DiagnosticContext, settings, fit_crops: int = 1024):
    """Per-crop predictions on the test side, unaltered and under each intervention setting.

    The sweep's score task and the ``interventions`` diagnostic share `prepare_intervention`
    and `predict_test_side`, so their accuracies agree.

    Args:
        ctx: the run's context.
        settings: (setting name, intervention name, parameters) triples; an intervention is
            fitted on the training crops unless parameters are given.

    Returns:
        A DataFrame, one row per setting x test crop: intervention ('none' first), row (table
        row), id, parent, label and pred (class codes), correct.
    """
    import pandas as pd

    idx = ctx.test_idx
    table = ctx.table
    labels = ctx.labels[idx]
    frames = []
    for setting, name, params in [("none", None, None), *settings]:
        if name is None:
            pred = predict_test_side(ctx)
        else:
            fn = prepare_intervention(ctx, name, params, fit=not params, fit_crops=fit_crops)
            pred = predict_test_side(ctx, fn, ctx.targets.get(name))
        frames.append(pd.DataFrame({
            "intervention": setting,
            "row": idx,
            "id": np.asarray(table.ids, dtype=object)[idx].astype(str),
            "parent": np.asarray(table.parents, dtype=object)[ctx.parents[idx]].astype(str),
            "label": labels.astype(np.int64),
            "pred": pred,
            "correct": pred == labels,
        }))
    return pd.concat(frames, ignore_index=True)
