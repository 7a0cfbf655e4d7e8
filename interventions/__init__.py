"""shortcutlab's `interventions` package: plug-in test-time image interventions.

Every intervention is an ``nn.Module`` with ``forward(x, mask=None)`` on a float
``(B, 3, H, W)`` batch in [0, 1] (see `interventions.base` for the contract) and a function
twin. Look them up by name:

    >>> import torch, interventions
    >>> blur = interventions.get("low_pass", sigma=2.0)
    >>> blur(torch.rand(4, 3, 32, 32)).shape
    torch.Size([4, 3, 32, 32])

`available()` lists the registered names (built-ins and plug-ins of the entry-point group
``shortcutlab.interventions``); `register` adds your own.
"""

from .base import (
    Intervention,
    InterventionError,
    InterventionWarning,
    SplitRequirementError,
    check_image,
    check_mask,
    check_targets,
    declares_targets,
    display_label,
    target_rows,
)
from .registry import ENTRY_POINT_GROUP, available, get, get_class, load_entry_points, register, unregister

# Built-ins register themselves on import.
from .greyscale import Greyscale, greyscale
from .low_pass import LowPass, low_pass
from .reinhard import (
    Reinhard,
    ReinhardToField,
    field_lab_statistics,
    field_target_tensors,
    reinhard,
    reinhard_unseen_field,
    unseen_field_target_tensors,
    unseen_field_targets,
)
from .hed import HEDJitter, hed_jitter, hed_to_rgb, rgb_to_hed
from .macenko import StainNormalize, estimate_stains, stain_normalize
from .background import (
    BackgroundNoise,
    BackgroundRemoval,
    BackgroundTransplant,
    background_noise,
    background_removal,
    background_transplant,
)
from .illumination import IlluminationFlattening, illumination_flattening
from .corner_patches import POSITIONS, CornerPatches, corner_patches, patch_boxes, patch_mask_coverage

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackgroundNoise",
    "BackgroundRemoval",
    "BackgroundTransplant",
    "CornerPatches",
    "IlluminationFlattening",
    "POSITIONS",
    "background_noise",
    "background_removal",
    "background_transplant",
    "corner_patches",
    "illumination_flattening",
    "patch_boxes",
    "patch_mask_coverage",
    "Greyscale",
    "Intervention",
    "InterventionError",
    "InterventionWarning",
    "HEDJitter",
    "LowPass",
    "Reinhard",
    "ReinhardToField",
    "StainNormalize",
    "available",
    "check_image",
    "check_mask",
    "check_targets",
    "get",
    "get_class",
    "greyscale",
    "load_entry_points",
    "low_pass",
    "estimate_stains",
    "field_lab_statistics",
    "field_target_tensors",
    "hed_jitter",
    "hed_to_rgb",
    "reinhard",
    "reinhard_unseen_field",
    "rgb_to_hed",
    "stain_normalize",
    "unseen_field_target_tensors",
    "unseen_field_targets",
    "SplitRequirementError",
    "declares_targets",
    "display_label",
    "target_rows",
    "register",
    "unregister",
]
