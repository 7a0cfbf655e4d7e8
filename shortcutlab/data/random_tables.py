"""Random crop tables with a known structure, for tests, benchmarks and examples.

`random_table` draws parents with a chosen number of crops each (Poisson around a mean, at
least one), single-class parents (SIPaKMeD-like) or mixed-class parents (CRIC-like), optional
patients and optional square crop boxes scattered in a parent image, so siblings may overlap.
No pixels are made; for images see the synthetic benchmark.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def random_table(
    n_parents: int = 100,
    mean_crops: float = 4.0,
    n_classes: int = 3,
    mixed: bool = False,
    parents_per_group: int | None = None,
    geometry: bool = True,
    image_size: tuple[int, int] = (1376, 1020),
    crop_size: int = 100,
    seed: int = 0,
) -> pd.DataFrame:
    """A crop table as a DataFrame with columns id, label, parent[, patient][, x, y, w, h].

    Args:
        n_parents: number of parents.
        mean_crops: mean crops per parent (1 + Poisson(mean_crops - 1)).
        n_classes: number of classes.
        mixed: parents mix classes (each crop drawn from a parent-specific class mix) instead
            of holding one class each.
        parents_per_group: if given, consecutive parents form patients of this size.
        geometry: add square boxes of side `crop_size` placed uniformly in the parent image.
        image_size: parent image (width, height) in pixels.
        crop_size: crop side in pixels.
        seed: random seed.
    """
    if n_parents < 1 or mean_crops < 1 or n_classes < 1:
        raise ValueError(f"need n_parents >= 1, mean_crops >= 1, n_classes >= 1; got {n_parents}, {mean_crops}, {n_classes}")
    rng = np.random.default_rng(seed)
    k = 1 + rng.poisson(mean_crops - 1.0, size=n_parents)
    parent = np.repeat(np.arange(n_parents), k)
    n = len(parent)
    if mixed:
        # A dominant class per parent plus a share of crops from the other classes.
        dom = rng.integers(0, n_classes, size=n_parents)[parent]
        other = rng.integers(0, n_classes, size=n)
        label = np.where(rng.random(n) < 0.6, dom, other)
    else:
        label = rng.integers(0, n_classes, size=n_parents)[parent]
    df = pd.DataFrame(
        {
            "id": "c" + pd.Series(np.arange(n)).astype(str),
            "label": "class" + pd.Series(label).astype(str),
            "parent": "p" + pd.Series(parent).astype(str),
        }
    )
    if parents_per_group:
        df["patient"] = "pt" + pd.Series(parent // parents_per_group).astype(str)
    if geometry:
        w, h = image_size
        df["x"] = rng.integers(0, max(w - crop_size, 1), size=n)
        df["y"] = rng.integers(0, max(h - crop_size, 1), size=n)
        df["w"] = crop_size
        df["h"] = crop_size
    return df
