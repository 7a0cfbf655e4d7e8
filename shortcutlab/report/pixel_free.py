"""The leak on the test crops that share no pixel with a training crop (the paper's
exploratory pixel-free subset): the headline leak's estimand and interval, on fewer crops.

A leak cell trains on siblings of the common test crops; some of those siblings overlap a test
crop, so a leak model may score it from memorised pixels rather than from its acquisition
parent. On the test crops sharing no pixel with any training crop of the leak cell
(`data.audit.no_shared_pixel_ids`, the same crops for the leak and the clean model of a seed),
only the parent's signature is left to exploit. The subset is fixed by the split and the boxes
alone (never by the outcome), so the leak on it is `stats.leak_effect` on the predictions of
those crops, with the same two-way interval as the headline.
"""

from __future__ import annotations

import warnings

import pandas as pd

from shortcutlab.report.folder import SweepFolder

#: the keys that pick a prediction row of the subset
SUBSET_KEYS = ["condition", "seed", "diversity", "id"]


def pixel_free_crops(folder: SweepFolder) -> pd.DataFrame:
    """Per condition, seed and diversity level of every leak cell trained in the sweep, the ids
    of the common test crops sharing no pixel with a training crop of that leak cell.

    Returns:
        columns condition, seed, diversity, id (str); empty when no leak model's benchmark has
        boxes (no geometry: which crops share pixels is unknown) or its files are not on disk.
    """
    from shortcutlab.data.audit import no_shared_pixel_ids
    from shortcutlab.data.manifest import SplitManifest
    from shortcutlab.data.table import CropTable

    frames, tables = [], {}
    wanted = {(m.condition, m.seed, m.cell, m.manifest, m.split, tuple(sorted((m.columns or {}).items())))
              for m in folder.models() if m.exposure == "leak" and m.geometry and m.manifest and m.split and "-" in m.cell}
    for condition, seed, cell, manifest, split, cols in sorted(wanted):
        c = {"id": "id", "label": "label", "parent": "parent", **dict(cols)}
        key = (manifest, split)
        if key not in tables:
            tables[key] = (CropTable.from_csv(manifest, id=c["id"], label=c["label"], parent=c["parent"], box="x,y,w,h"),
                           SplitManifest.read(split))
        table, sm = tables[key]
        ids = sorted(no_shared_pixel_ids(table, sm, cell))
        frames.append(pd.DataFrame({"condition": condition, "seed": seed, "diversity": cell.split("-", 1)[1], "id": ids}))
    if not frames:
        return pd.DataFrame(columns=SUBSET_KEYS)
    return pd.concat(frames, ignore_index=True)


def pixel_free_leak(pred: pd.DataFrame, crops: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95,
                    interval: str = "cgm", baseline: str = "none") -> pd.DataFrame:
    """`stats.leak_effect` on the unaltered predictions of the pixel-free crops.

    Args:
        pred: the sweep's predictions.
        crops: `pixel_free_crops`.
        n_boot, seed, level, interval: as the report's estimates.
        baseline: the setting of the unaltered crops.

    Returns:
        `stats.LEAK_COLUMNS` rows of the unaltered crops (one per condition, architecture,
        pooled where there are several, and diversity level); empty without pixel-free crops.
    """
    from shortcutlab.stats import LEAK_COLUMNS, leak_effect

    if crops.empty:
        return pd.DataFrame(columns=LEAK_COLUMNS)
    p = pred[(pred["intervention"].astype(str) == baseline) & pred["exposure"].isin(["leak", "clean"])]
    keys = crops.assign(condition=crops["condition"].astype(str), diversity=crops["diversity"].astype(str),
                        seed=crops["seed"].astype("int64"), id=crops["id"].astype(str))
    p = p.assign(_c=p["condition"].astype(str), _d=p["diversity"].astype(str), _s=p["seed"].astype("int64"),
                 _i=p["id"].astype(str))
    p = p.merge(keys.rename(columns={"condition": "_c", "diversity": "_d", "seed": "_s", "id": "_i"}), on=["_c", "_d", "_s", "_i"])
    p = p.drop(columns=["_c", "_d", "_s", "_i"])
    if p.empty:
        return pd.DataFrame(columns=LEAK_COLUMNS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the headline's estimates already warn of the same design
        rows = leak_effect(p, n_boot=n_boot, level=level, seed=seed, interval=interval)
    return rows[rows["intervention"].astype(str) == baseline].reset_index(drop=True)


__all__ = ["SUBSET_KEYS", "pixel_free_crops", "pixel_free_leak"]
