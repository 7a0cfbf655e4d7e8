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
  torch.

Every name but the version and the errors is imported on first use, so table work does not
load torch and the sibling search loads neither torch nor pandas.
"""

from shortcutlab.version import __version__

from shortcutlab.errors import ManifestHashError, ShortcutlabError, SplitError, TableError

# Every other name is resolved on first access (PEP 562), so that `import shortcutlab` (which
# `python -m shortcutlab` and every `shortcutlab.x.y` import run first) costs the version and
# the errors only: pandas, scipy.sparse and pyarrow come with the table names (about 100 MB and
# 2 s on 2 cores), torch and timm with the model names. A command that needs none of them (the
# sibling search) never loads them.
_LAZY = {
    "audit": "data.audit",
    "measure_split": "data.audit",
    "reporting_card": "data.card",
    "diversity_ratio": "data.exposure",
    "exposure": "data.exposure",
    "pixel_overlap": "data.exposure",
    "sibling_share": "data.exposure",
    "summarize": "data.exposure",
    "SplitManifest": "data.manifest",
    "content_hash": "data.manifest",
    "verify": "data.manifest",
    "available_protocols": "data.splits",
    "crop_split": "data.splits",
    "dedup_split": "data.splits",
    "factorial_split": "data.splits",
    "ladder_split": "data.splits",
    "make_split": "data.splits",
    "parent_split": "data.splits",
    "CropTable": "data.table",
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


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

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
