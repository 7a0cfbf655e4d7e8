"""The diagnostic contract: what every probe, erasure, adversary or saliency check takes and returns.

A diagnostic is a small class with its settings in ``__init__`` and one method,
``run(ctx) -> rows``. `DiagnosticContext` carries everything a diagnostic may need about one
trained model: the wrapped model, the crops (images, masks, labels, parents), the split's
sides, and a cache of frozen features shared by every diagnostic of the run. Every diagnostic
returns rows of one tidy schema (`ROW_COLUMNS`, plus any columns of its own), so that
`diagnose`, the sweeps, the statistics and the report never special-case one.

Metadata lives in class attributes, as for interventions:

- ``needs``: what the diagnostic uses, a subset of ``{"features", "masks", "head", "split"}``
  ("head": the trained classifier head; "split": the run's train/test sides). `diagnose`
  skips, with a recorded reason, a diagnostic whose needs the run cannot meet (no masks).
- ``label``, ``metric_labels``, ``metric_units``: how the report names the diagnostic and
  its metrics (``label = "parent probe"``, ``metric_labels = {"R": "R"}``,
  ``metric_units = {"R": "fraction"}``);
- ``leak_metrics``: metrics the report's validity table reads against the leak (the
  leak-model minus clean-model value, paired by seed; it "moves" when the interval excludes 0
  and reaches 0.01): fractions on a 0-1 scale, one row each, named "<label> <metric label>";
- ``supplies``: the named quantities of `QUANTITIES` that the diagnostic's rows carry, each
  mapped to the metric that carries it (``supplies = {"recoverability": "R"}``). The report
  finds the rows it reads by asking for a quantity (`probes.suppliers`), never by a
  diagnostic's name, so a plug-in that supplies "recoverability" feeds the report's R.

A new diagnostic is a module with a subclass and ``@register("name")``; third-party packages
join through the entry-point group ``shortcutlab.diagnostics``.

Example:
    >>> from probes import Diagnostic, register, row
    >>> @register("mean_feature")                                 # doctest: +SKIP
    ... class MeanFeature(Diagnostic):
    ...     needs = frozenset({"features"})
    ...     def run(self, ctx):
    ...         f = ctx.features()[ctx.test_idx]
    ...         return [row(ctx, self.name, "mean_feature", float(f.mean()), n=len(f))]
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import numpy as np

from .errors import DiagnosticError

#: The columns every diagnostic row has, in this order.
ROW_COLUMNS = ("run_id", "diagnostic", "setting", "metric", "value", "ci_low", "ci_high", "n")

NEEDS = frozenset({"features", "masks", "head", "split"})

#: The quantities a diagnostic may supply (`Diagnostic.supplies`), each with what it is and the
#: settings of the rows the report reads. A setting names the diagnostic's own settings
#: ('on=all', 'rank=256', 'target=predicted'); the report reads:
QUANTITIES: Mapping[str, str] = {
    "recoverability": "parent recoverability R of the model's features (a fraction); the overall "
                      "rows are those whose setting names no class ('class='), the shortest such setting is read",
    "recoverability_before_erasure": "R before an erasure of the parent code, at each erasure setting "
                                     "('rank=<r>' or 'rank=full'); read when no diagnostic supplies 'recoverability'",
    "recoverability_after_erasure": "R after the erasure, at the same settings; the report reads the largest "
                                    "erasure setting ('<name>=<number>', 'full' above every number)",
    "head_accuracy_before_erasure": "accuracy of a head refitted on the features before erasure, on the split's "
                                    "test side (setting '<erasure setting>,test_set=test'; a fraction)",
    "head_accuracy_after_erasure": "the same head refitted after erasure (setting '<erasure setting>,test_set=test')",
    "outside_mass": "mean share of a saliency map outside the cell (a fraction); the overall setting is the "
                    "shortest without 'cascade='",
    "randomized_outside_mass": "the same share for the maps of a randomised head (setting '<overall setting>,cascade=0')",
    "randomized_head_spearman": "median Spearman rho between the trained and the randomised-head maps "
                                "(setting '<overall setting>,cascade=0')",
    "random_pair_spearman": "median Spearman rho between the maps of random pairs of crops (the overall setting)",
    "randomized_constant_maps": "how many randomised-head maps are constant, with n the crops mapped (setting "
                                "'<overall setting>,cascade=0'); most constant: the randomised-head check is undefined",
    "randomized_undefined": "how many crops have an undefined trained-vs-randomised rho (a constant map), with n the "
                            "crops mapped (setting '<overall setting>,cascade=0')",
    "cam_height": "rows of cells of the saliency layer's map before upsampling (the overall setting)",
    "cam_width": "columns of cells of the saliency layer's map before upsampling (the overall setting)",
}


def row(ctx: "DiagnosticContext | None", diagnostic: str, metric: str, value: float, *, setting: str = "",
        ci: tuple[float, float] | None = None, n: int | None = None, **extra: Any) -> dict:
    """One tidy result row.

    Args:
        ctx: the context (for the run id), or None.
        diagnostic: the diagnostic's registry name.
        metric: what `value` is ('R', 'floor', 'accuracy', 'outside_mass', ...).
        value: the number (NaN when undefined, never a silent 0).
        setting: the diagnostic's setting for this row ('rank=256', 'intervention=greyscale').
        ci: (low, high) interval where there is one.
        n: the number of crops (or pairs) the value rests on.
        **extra: diagnostic-specific columns.
    """
    lo, hi = ci if ci is not None else (math.nan, math.nan)
    out = {
        "run_id": "" if ctx is None else ctx.run_id,
        "diagnostic": diagnostic,
        "setting": setting,
        "metric": metric,
        "value": float(value) if value is not None else math.nan,
        "ci_low": float(lo),
        "ci_high": float(hi),
        "n": -1 if n is None else int(n),
    }
    out.update(extra)
    return out


@dataclass(eq=False)
class DiagnosticContext:
    """Everything diagnostics may use about one trained model.

    Attributes:
        adapter: the wrapped model (`shortcutlab.wrap`); diagnostics run it in eval mode
            (`eval_mode`), whatever its mode, and leave its mode and statistics as they were.
        crops: the crops as `shortcutlab.data.images.CropImages` (images, masks, table).
        side: (N,) side of each table row: 0 train, 1 val, 2 test, -1 not in the split.
        run_id: names the model in the rows.
        split_sha256: the split manifest's hash, carried into results.
        batch_size: crops per forward pass.
        seed: seeds every random choice of the diagnostics (folds, initialisations).
        cache_dir: folder of the on-disk feature cache (None: memory only).
        progress: show progress bars.
        targets: per-crop context of label-conditioned interventions, by intervention name:
            ``{name: {kwarg: tensor with one row per table row}}`` (`probes.intervention_targets`
            asks each intervention's ``targets_for`` hook for them).
        preprocess: ``fn(x, mask) -> x`` applied to every batch before anything else, as the
            run scored its crops (e.g. masked backgrounds for a run trained with them).
        cache: results that diagnostics of this context share, keyed by everything that
            determines them (e.g. the R-before `ParentProbe` of ``parent_probe``, ``leace``
            and ``linear_adversary``: `probes.parent_probe.fitted_probe`). Entries are read,
            never changed.
    """

    adapter: Any
    crops: Any
    side: np.ndarray
    run_id: str = ""
    split_sha256: str = ""
    batch_size: int = 256
    seed: int = 0
    cache_dir: str | None = None
    progress: bool = False
    targets: dict = field(default_factory=dict)
    preprocess: Any = None
    _features: dict = field(default_factory=dict, repr=False)
    cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.side = np.asarray(self.side)
        n = self.crops.table.n_crops
        if self.side.shape != (n,):
            raise DiagnosticError(f"side must have one entry per crop, shape ({n},); got {self.side.shape}")

    # -- the table --------------------------------------------------------------------
    @property
    def table(self):
        return self.crops.table

    @property
    def labels(self) -> np.ndarray:
        """(N,) class codes."""
        return np.asarray(self.table.label_codes)

    @property
    def parents(self) -> np.ndarray:
        """(N,) parent codes."""
        return np.asarray(self.table.parent_codes)

    @property
    def classes(self) -> list[str]:
        return list(self.table.classes)

    @property
    def train_idx(self) -> np.ndarray:
        return np.flatnonzero(self.side == 0)

    @property
    def test_idx(self) -> np.ndarray:
        return np.flatnonzero(self.side == 2)

    @property
    def has_masks(self) -> bool:
        return self.crops.masks is not None

    @property
    def device(self):
        return self.adapter.device

    def batch(self, index) -> tuple[Any, Any]:
        """Crops `index` as a float (B, 3, H, W) batch in [0, 1] on the model's device, with
        their (B, 1, H, W) masks (None without masks), preprocessed as the run scored them."""
        import torch

        idx = torch.as_tensor(np.asarray(index), dtype=torch.long)
        x, m = self.crops.float_batch(idx, device=self.device)
        x = x.to(self.adapter.dtype)
        if m is not None:
            m = m.to(x.dtype)
        if self.preprocess is not None:
            x, m = apply_preprocess(self.preprocess, x, m)
        return x, m

    # -- frozen features ---------------------------------------------------------------
    def features(self, transform=None, key: str | None = None) -> np.ndarray:
        """(N, D) float32 frozen pooled features of every crop of the table (cached).

        Args:
            transform: optional ``fn(x, mask) -> x`` applied to each batch first (an
                intervention); give `key` to cache its features under a name.
            key: the cache name of `transform` (required with a transform).
        """
        from .features import extract_features

        if transform is not None and key is None:
            raise DiagnosticError("features(transform=...) needs key= naming the transform, so its features can be cached")
        name = key or ""
        if name not in self._features:
            pre, fn = self.preprocess, transform
            if pre is not None:
                fn = (lambda x, m: transform(*apply_preprocess(pre, x, m))) if transform is not None else pre
                key = f"{getattr(pre, 'key', 'preprocess')}+{key or ''}"
            self._features[name] = extract_features(
                self.adapter, self.crops, batch_size=self.batch_size, cache_dir=self.cache_dir,
                progress=self.progress, transform=fn, transform_key=key,
            )
        return self._features[name]


def apply_preprocess(preprocess, x, m) -> tuple[Any, Any]:
    """A run's preprocess on a batch, ``(preprocess(x, m), m)``, with the (B, 1, H, W) masks
    resized (nearest) to the crops' new size when the preprocess resized them (a run trained
    with an ``input_size``), so that interventions and Grad-CAM see matching crops and masks."""
    import torch

    x_out = preprocess(x, m)
    if m is not None and tuple(m.shape[-2:]) != tuple(x_out.shape[-2:]):
        m = torch.nn.functional.interpolate(m, size=tuple(x_out.shape[-2:]), mode="nearest")
    return x_out, m


class Diagnostic(abc.ABC):
    """Base class of every diagnostic (see the module docstring for the contract).

    Class attributes:
        name: the registry name (set by `probes.register`).
        needs: what `run` uses, a subset of {"features", "masks", "head", "split"}.
        label: the report's name for it ('' : the name with spaces; `display_label`).
        metric_labels: the report's names of its metrics ({metric: label}; `metric_label`).
        metric_units: units of its metrics ({metric: unit}, e.g. 'fraction' on a 0-1 scale).
        leak_metrics: metrics the report's validity table reads against the leak (fractions).
        supplies: {quantity: metric}: which metric of its rows carries each quantity of
            `QUANTITIES` it supplies to the report ({} : none).
    """

    name: ClassVar[str] = ""
    needs: ClassVar[frozenset] = frozenset()
    label: ClassVar[str] = ""
    metric_labels: ClassVar[Mapping[str, str]] = {}
    metric_units: ClassVar[Mapping[str, str]] = {}
    leak_metrics: ClassVar[tuple[str, ...]] = ()
    supplies: ClassVar[Mapping[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        unknown = set(cls.needs) - NEEDS
        if unknown:
            raise TypeError(f"{cls.__qualname__}.needs has unknown entries {sorted(unknown)}; allowed: {sorted(NEEDS)}")
        for metric in cls.leak_metrics:
            if cls.metric_units.get(metric, "fraction") != "fraction":
                raise TypeError(f"{cls.__qualname__}.leak_metrics holds {metric!r} with unit {cls.metric_units[metric]!r}; "
                                f"the report reads leak metrics as fractions (unit 'fraction')")
        unknown = set(cls.supplies) - set(QUANTITIES)
        if unknown:
            raise TypeError(f"{cls.__qualname__}.supplies has unknown quantities {sorted(unknown)}; known: {sorted(QUANTITIES)}")
        for quantity, metric in cls.supplies.items():
            if not isinstance(metric, str) or not metric:
                raise TypeError(f"{cls.__qualname__}.supplies[{quantity!r}] must name a metric of its rows (a string); got {metric!r}")

    @classmethod
    def display_label(cls) -> str:
        """How the report names the diagnostic: `label`, else its name with spaces."""
        return cls.label or cls.name.replace("_", " ")

    @classmethod
    def metric_label(cls, metric: str) -> str:
        """How the report names one of its metrics: `metric_labels`, else the metric with spaces."""
        return cls.metric_labels.get(metric, metric.replace("_", " "))

    def missing(self, ctx: DiagnosticContext) -> str | None:
        """Why this diagnostic cannot run on `ctx` (None when it can)."""
        if "masks" in self.needs and not ctx.has_masks:
            return "needs cell masks and the crops have none"
        if "split" in self.needs:
            if len(ctx.train_idx) == 0:
                return "needs a split with training crops"
            if len(ctx.test_idx) == 0:
                return "needs a split with test crops"
        return None

    @abc.abstractmethod
    def run(self, ctx: DiagnosticContext) -> list[dict]:
        """Run on one model; return tidy rows (`row`)."""
