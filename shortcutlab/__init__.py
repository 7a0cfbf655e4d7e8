"""shortcutlab: measure and diagnose acquisition-sibling leakage in image classifiers.

The public entry points:

- `CropTable`: a validated crop -> parent table (`shortcutlab.data.table`);
- closed forms `sibling_share`, `exposure`, `diversity_ratio`, `pixel_overlap`
  (`shortcutlab.data.exposure`);
- split protocols `crop_split`, `parent_split`, `dedup_split`, `factorial_split`,
  `ladder_split` and `make_split` (`shortcutlab.data.splits`), returning a `SplitManifest`;
- `audit` and `measure_split` (`shortcutlab.data.audit`), `reporting_card` (`shortcutlab.data.card`);
- `wrap` / `ModelAdapter` / `create_model` (`shortcutlab.models.adapter`), `train` / `TrainConfig`
  (`shortcutlab.models.recipe`) and `synthesize` / `SynthConfig` (`shortcutlab.synth`). These need
  torch and are imported on first use, so table work stays light.
"""

from shortcutlab.version import __version__

from shortcutlab.data.audit import audit, measure_split
from shortcutlab.data.card import reporting_card
from shortcutlab.errors import ManifestHashError, ShortcutlabError, SplitError, TableError
from shortcutlab.data.exposure import diversity_ratio, exposure, pixel_overlap, sibling_share, summarize
from shortcutlab.data.manifest import SplitManifest, content_hash, verify
from shortcutlab.data.splits import (
    available_protocols,
    crop_split,
    dedup_split,
    factorial_split,
    ladder_split,
    make_split,
    parent_split,
)
from shortcutlab.data.table import CropTable

# Names whose modules import torch/timm: resolved on first access (PEP 562).
_LAZY = {
    "wrap": "models.adapter",
    "ModelAdapter": "models.adapter",
    "ModelError": "models.adapter",
    "InputError": "models.adapter",
    "create_model": "models.adapter",
    "train": "models.recipe",
    "TrainConfig": "models.train_config",
    "synthesize": "synth",
    "SynthConfig": "synth",
    "write_synth": "synth",
    "load_synth": "synth",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"shortcutlab.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'shortcutlab' has no attribute {name!r}")

__all__ = [
    "__version__",
    "CropTable",
    "InputError",
    "ModelAdapter",
    "ModelError",
    "SynthConfig",
    "TrainConfig",
    "create_model",
    "load_synth",
    "synthesize",
    "train",
    "wrap",
    "write_synth",
    "ManifestHashError",
    "ShortcutlabError",
    "SplitError",
    "SplitManifest",
    "TableError",
    "audit",
    "available_protocols",
    "content_hash",
    "crop_split",
    "dedup_split",
    "diversity_ratio",
    "exposure",
    "factorial_split",
    "ladder_split",
    "make_split",
    "measure_split",
    "parent_split",
    "pixel_overlap",
    "reporting_card",
    "sibling_share",
    "summarize",
    "verify",
]
