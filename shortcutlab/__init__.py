"""shortcutlab: measure and diagnose acquisition-sibling leakage in image classifiers.

The public entry points:

- `CropTable`: a validated crop -> parent table (`shortcutlab.table`);
- closed forms `sibling_share`, `exposure`, `diversity_ratio`, `pixel_overlap`
  (`shortcutlab.exposure`);
- split protocols `crop_split`, `parent_split`, `dedup_split`, `factorial_split`,
  `ladder_split` and `make_split` (`shortcutlab.splits`), returning a `SplitManifest`;
- `audit` and `measure_split` (`shortcutlab.audit`), `reporting_card` (`shortcutlab.card`);
- `wrap` / `ModelAdapter` / `create_model` (`shortcutlab.adapter`), `train` / `TrainConfig`
  (`shortcutlab.recipe`) and `synthesize` / `SynthConfig` (`shortcutlab.synth`). These need
  torch and are imported on first use, so table work stays light.
"""

__version__ = "0.1.0"

from .audit import audit, measure_split
from .card import reporting_card
from .errors import ManifestHashError, ShortcutlabError, SplitError, TableError
from .exposure import diversity_ratio, exposure, pixel_overlap, sibling_share, summarize
from .manifest import SplitManifest, content_hash, verify
from .splits import (
    available_protocols,
    crop_split,
    dedup_split,
    factorial_split,
    ladder_split,
    make_split,
    parent_split,
)
from .table import CropTable

# Names whose modules import torch/timm: resolved on first access (PEP 562).
_LAZY = {
    "wrap": "adapter",
    "ModelAdapter": "adapter",
    "ModelError": "adapter",
    "InputError": "adapter",
    "create_model": "adapter",
    "train": "recipe",
    "TrainConfig": "recipe",
    "synthesize": "synth",
    "SynthConfig": "synth",
    "write_synth": "synth",
    "load_synth": "synth",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'shortcutlab' has no attribute {name!r}")

__all__ = [
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
