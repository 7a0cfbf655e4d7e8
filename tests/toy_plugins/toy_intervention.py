"""A toy intervention plug-in: every crop's colours inverted, ``1 - x``.

Its effect is easy to predict outside shortcutlab: the model's prediction under it is the
argmax of the model's logits on ``1 - crops / 255``.
"""

from __future__ import annotations

import interventions
from interventions import Intervention

NAME = "toy_invert"


class ToyInvert(Intervention):
    """Colours inverted, ``1 - x``, on the whole crop (the mask is not used)."""

    label = "toy colour inversion"

    def apply(self, x, mask, params, **context):
        return 1.0 - x


def toy_invert(x, mask=None):
    """The function twin of `ToyInvert`: ``1 - x`` for a float (B, 3, H, W) batch in [0, 1]."""
    return ToyInvert()(x, mask)


def register() -> type[ToyInvert]:
    """Register `ToyInvert` as ``toy_invert``."""
    interventions.register(NAME)(ToyInvert)
    return ToyInvert


def unregister() -> None:
    interventions.unregister(NAME)
