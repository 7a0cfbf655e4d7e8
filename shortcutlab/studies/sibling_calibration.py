"""How the sibling search's Hamming threshold was chosen: the synthetic benchmark's crops, each
augmented in the ways a re-acquired or re-encoded copy differs (`AUGMENTATIONS`), searched
against distinct crops of held-out fields.

`calibrate_threshold()` reproduces `shortcutlab.data.siblings.DEFAULT_THRESHOLD`; its docstring
gives the rule and the distributions. This is a study on the synthetic benchmark, so it sits
above the data layer and the benchmark generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from shortcutlab.data.siblings import (
    TRANSFORMS,
    SiblingError,
    SiblingResult,
    apply_transform,
    dihedral_hashes,
    phash_images,
    search_hashes,
)
from shortcutlab.synth import SynthConfig, synthesize


AUGMENTATIONS: tuple[str, ...] = tuple(TRANSFORMS[1:]) + ("brightness+20", "brightness-20", "blur1", "jpeg75", "combined")
"""Augmentations of the calibration set: the seven non-identity dihedral transforms, brightness
x1.2 and x0.8 (clipped to 0-255), Gaussian blur sigma 1 px, JPEG quality 75, and all at once (a
random transform, x1.2 or x0.8, blur, JPEG)."""


def augment(image: np.ndarray, name: str, rng: np.random.Generator | None = None) -> np.ndarray:
    """One named augmentation of AUGMENTATIONS applied to an (H, W, 3) uint8 image."""
    import io

    from PIL import Image
    from scipy.ndimage import gaussian_filter

    a = np.asarray(image)
    if name in TRANSFORMS:
        return apply_transform(a, name)
    if name.startswith("brightness"):
        f = 1.2 if name.endswith("+20") else 0.8
        return np.clip(np.round(a * f), 0, 255).astype(np.uint8)
    if name == "blur1":
        return np.clip(np.round(gaussian_filter(a.astype(np.float64), (1.0, 1.0, 0.0))), 0, 255).astype(np.uint8)
    if name == "jpeg75":
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="JPEG", quality=75)
        return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
    if name == "combined":
        rng = rng or np.random.default_rng(0)
        a = apply_transform(a, int(rng.integers(8)))
        a = augment(a, "brightness+20" if rng.random() < 0.5 else "brightness-20")
        return augment(augment(a, "blur1"), "jpeg75")
    raise SiblingError(f"unknown augmentation {name!r}; expected one of {', '.join(AUGMENTATIONS)}")


@dataclass(frozen=True, eq=False)
class CalibrationSet:
    """Sources (training side), augmented copies and distinct crops (test side).

    Attributes:
        train: (S, H, W, 3) source crops (the fields of one half).
        test: (T, H, W, 3) augmented copies of every source, then the distinct crops.
        source: (T,) index of each test image's source in `train`, -1 for a distinct crop.
        augmentation: (T,) name of the augmentation ('' for a distinct crop).
    """

    train: np.ndarray
    test: np.ndarray
    source: np.ndarray
    augmentation: np.ndarray


def calibration_set(seed: int = 0, fields_per_class: int = 50) -> CalibrationSet:
    """The synthetic benchmark (64 px crops, all five mechanisms) split by field in halves: the
    crops of one half are the sources, each augmented with every entry of AUGMENTATIONS; the
    crops of the other half (every class, so also distinct crops of the sources' classes) are
    the distinct test crops, which should link to nothing."""
    data = synthesize(SynthConfig(seed=seed, fields_per_class=fields_per_class))
    images = data.images.permute(0, 2, 3, 1).numpy()
    parents = data.table["parent"].to_numpy()
    fields = np.unique(parents)
    rng = np.random.default_rng(seed)
    is_source = np.isin(parents, rng.permutation(fields)[: len(fields) // 2])
    train = images[is_source]
    distinct = images[~is_source]
    test, source, names = [], [], []
    for name in AUGMENTATIONS:
        for s, img in enumerate(train):
            test.append(augment(img, name, rng))
            source.append(s)
            names.append(name)
    test.extend(distinct)
    source.extend([-1] * len(distinct))
    names.extend([""] * len(distinct))
    return CalibrationSet(train, np.stack(test), np.array(source), np.array(names))


def precision_recall(result: SiblingResult, source: np.ndarray) -> dict:
    """Precision and recall of a search on a calibration set.

    Recall: augmented copies whose nearest training image is their source. Precision: of all
    test images called siblings, those linked to their own source (a distinct crop linked to
    anything, or a copy linked to another source, is a false link).
    """
    called = result.is_sibling
    correct = called & (source >= 0) & (result.nearest == source)
    n_copies = int((source >= 0).sum())
    return {
        "threshold": result.threshold,
        "recall": float(correct.sum() / max(n_copies, 1)),
        "precision": float(correct.sum() / called.sum()) if called.any() else float("nan"),
        "n_copies": n_copies,
        "n_distinct": int((source < 0).sum()),
        "false_links_distinct": int((called & (source < 0)).sum()),
        "false_links_copies": int((called & (source >= 0) & (result.nearest != source)).sum()),
    }


def calibrate_threshold(seeds: Sequence[int] = (0, 1), thresholds: Sequence[int] = tuple(range(0, 15, 2))) -> dict:
    """Choose the Hamming threshold on the synthetic augmentations.

    Rule: pool `calibration_set(seed)` over `seeds` and take the threshold that maximises
    min(precision, recall), the smaller on a tie. (Distances between two pHashes are even:
    each holds 32 ones, one per coefficient above the median, unless coefficients tie.)

    Returns:
        {"threshold": t, "rule": ..., "table": [pooled precision_recall per threshold],
        "distances_to_source": {augmentation: histogram of the invariant distance to the source}}.
    """
    from shortcutlab.data.dedup import hamming_distance

    counts = {t: {"correct": 0, "called": 0, "copies": 0, "false_distinct": 0} for t in thresholds}
    hist = {n: np.zeros(16, dtype=np.int64) for n in AUGMENTATIONS}
    for seed in seeds:
        cal = calibration_set(seed)
        train_h = phash_images(cal.train)
        test_v = dihedral_hashes(cal.test)
        for t in thresholds:
            r = search_hashes(train_h, test_v, t)
            c = counts[t]
            c["correct"] += int((r.is_sibling & (r.nearest == cal.source) & (cal.source >= 0)).sum())
            c["called"] += int(r.is_sibling.sum())
            c["copies"] += int((cal.source >= 0).sum())
            c["false_distinct"] += int((r.is_sibling & (cal.source < 0)).sum())
        is_copy = cal.source >= 0
        d = hamming_distance(test_v[is_copy], train_h[cal.source[is_copy]][:, None]).min(axis=1)
        for n in AUGMENTATIONS:
            hist[n] += np.bincount(np.minimum(d[cal.augmentation[is_copy] == n], 15), minlength=16)
    table = [
        {"threshold": t, "recall": c["correct"] / c["copies"], "precision": c["correct"] / max(c["called"], 1),
         "false_links_distinct": c["false_distinct"]}
        for t, c in counts.items()
    ]
    best = max(table, key=lambda r: (min(r["recall"], r["precision"]), -r["threshold"]))
    return {"threshold": best["threshold"], "rule": "max over t of min(precision, recall), pooled over seeds; smaller t on a tie",
            "seeds": list(seeds), "table": table, "distances_to_source": {k: v.tolist() for k, v in hist.items()}}
