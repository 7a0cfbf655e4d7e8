"""A toy estimand plug-in: the share of test predictions the toy intervention turns from right
to wrong or back.

Recomputable from ``predictions.parquet`` alone: per condition, the (model, test crop) pairs
whose ``correct`` under ``toy_invert`` differs from the one on the unaltered crops, over all.
"""

from __future__ import annotations

import pandas as pd

from shortcutlab.stats import register_estimand, unregister_estimand

NAME = "toy_flip_rate"
INTERVENTION = "toy_invert"
READING = "the toy colour inversion turns {estimate} of the test predictions from right to wrong or back"


def flip_rate(ctx) -> pd.DataFrame | None:
    """Per condition: the share of (model, test crop) pairs whose correctness under
    ``toy_invert`` differs from the unaltered crop's; None when no model was scored under it."""
    pred = ctx.pred
    base = pred[pred["intervention"] == ctx.baseline]
    inv = pred[pred["intervention"] == INTERVENTION]
    if inv.empty:
        return None
    both = base.merge(inv, on=["model", "id"], suffixes=("", "_inv"))
    both["flipped"] = (both["correct"] != both["correct_inv"]).astype(float)
    per = both.groupby("condition", sort=True)
    return pd.DataFrame({"condition": list(per.groups), "intervention": INTERVENTION,
                         "estimate": per["flipped"].mean().to_numpy(), "n_crops": per.size().to_numpy()})


def register():
    """Register `flip_rate` as the estimand ``toy_flip_rate`` (unit 'share', read in the
    report's 'Further estimates')."""
    return register_estimand(NAME, unit="share", reading=READING)(flip_rate)


def unregister() -> None:
    unregister_estimand(NAME)
