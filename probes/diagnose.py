"""Run every applicable diagnostic on one trained model and collect tidy rows.

`diagnose(adapter, crops, split)` is the Python API; `shortcutlab diagnose RUN_DIR` the command
line. Each registered diagnostic (`probes.available()`) whose needs the run meets is run with
its settings from `params`; one that cannot run is skipped with its reason, and one that fails
on the user's data is recorded with the diagnostic's name and the cause. The rows of all
diagnostics share `ROW_COLUMNS`; `write_diagnostics` writes them as diagnostics.csv and
diagnostics.json (atomically, both or neither).

The diagnostics of one call share one `DiagnosticContext`: the frozen features are extracted
once, and ``parent_probe``, ``leace`` and ``linear_adversary`` fit one R-before `ParentProbe`
between them when their probe settings match (``DiagnosticContext.cache``).

Example:
    >>> from probes import diagnose                                # doctest: +SKIP
    >>> rows = diagnose(adapter, crops, "split.csv", cell="leak-low", only=["parent_probe"])  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import time
import warnings
from typing import Any, Sequence

import numpy as np
import pandas as pd

from shortcutlab.errors import ShortcutlabError

from .base import ROW_COLUMNS, Diagnostic, DiagnosticContext
from .errors import DiagnosticError
from .registry import REGISTRY, available, get


def _side(crops, split, cell) -> tuple[np.ndarray, str]:
    from shortcutlab.data.audit import side_codes
    from shortcutlab.data.manifest import SplitManifest

    if isinstance(split, np.ndarray):
        return split, ""
    if isinstance(split, (str, os.PathLike)):
        split = SplitManifest.read(split)
    if isinstance(split, SplitManifest):
        return np.asarray(side_codes(crops.table, split.cell(cell))), split.hash
    if isinstance(split, pd.DataFrame):
        return np.asarray(side_codes(crops.table, split)), ""
    raise DiagnosticError(f"split must be a SplitManifest, a manifest CSV path, an id/split frame or side codes; got {type(split).__name__}")


def _instances(only, params) -> list[Diagnostic]:
    params = params or {}
    names = list(only) if only else available()
    unknown = [k for k in params if k not in REGISTRY.classes()]
    if unknown:
        # get_class names the close matches
        REGISTRY.get_class(unknown[0])
    out = []
    for name in names:
        if isinstance(name, Diagnostic):
            out.append(name)
        else:
            out.append(get(name, **params.get(name, {})))
    return out


def diagnose(
    adapter,
    crops,
    split,
    *,
    cell: str | None = None,
    only: list[str | Diagnostic] | None = None,
    params: dict[str, dict] | None = None,
    run_id: str = "",
    batch_size: int = 256,
    seed: int = 0,
    cache_dir: str | None = None,
    progress: bool = False,
    targets: dict | None = None,
    preprocess=None,
    log: list | None = None,
) -> pd.DataFrame:
    """Run diagnostics on one trained model; returns one row per diagnostic x setting x metric.

    Args:
        adapter: the wrapped model (`shortcutlab.wrap`); it is put in eval mode.
        crops: `CropImages` (or a `CropTable` with an image column).
        split: a `SplitManifest`, its CSV path, an id/split frame, or (N,) side codes.
        cell: the cell of a multi-cell manifest.
        only: diagnostic names (or instances) to run (default: every registered one).
        params: constructor arguments per diagnostic name.
        run_id: names the model in the rows.
        batch_size, seed, cache_dir, progress, targets, preprocess: see `DiagnosticContext`.
        log: a list that receives one dict per diagnostic (name, status, reason, seconds).

    Returns:
        A DataFrame whose first columns are `ROW_COLUMNS`.

    Raises:
        DiagnosticError: a diagnostic failed; the message names it and the cause.
    """
    from tqdm.auto import tqdm

    from shortcutlab.data.images import load_crops
    from shortcutlab.data.table import CropTable

    if isinstance(crops, CropTable):
        crops = load_crops(crops)
    side, split_hash = _side(crops, split, cell)
    adapter.eval()
    ctx = DiagnosticContext(adapter, crops, side, run_id=run_id, split_sha256=split_hash, batch_size=batch_size, seed=seed,
                            cache_dir=cache_dir, progress=progress, targets=targets or {}, preprocess=preprocess)
    diagnostics = _instances(only, params)
    rows: list[dict] = []
    log = log if log is not None else []
    for d in tqdm(diagnostics, desc="diagnose", disable=not progress, leave=False):
        why = d.missing(ctx)
        if why is not None:
            warnings.warn(f"diagnostic {d.name!r} skipped: {why}", stacklevel=2)
            log.append({"diagnostic": d.name, "status": "skipped", "reason": why, "seconds": 0.0})
            continue
        t0 = time.perf_counter()
        try:
            out = d.run(ctx)
        except ShortcutlabError as e:
            raise DiagnosticError(f"diagnostic {d.name!r} failed: {e}") from None
        except Exception as e:  # a bug or a model that breaks: name the diagnostic, keep the cause
            raise DiagnosticError(f"diagnostic {d.name!r} failed: {type(e).__name__}: {e}") from e
        rows.extend(out.to_dict("records") if isinstance(out, pd.DataFrame) else out)
        log.append({"diagnostic": d.name, "status": "ok", "reason": "", "seconds": round(time.perf_counter() - t0, 3)})
    frame = pd.DataFrame(rows)
    for c in ROW_COLUMNS:
        if c not in frame.columns:
            frame[c] = pd.Series(dtype=float if c in ("value", "ci_low", "ci_high") else object)
    frame["run_id"] = run_id
    frame["split_sha256"] = split_hash
    rest = [c for c in frame.columns if c not in ROW_COLUMNS]
    return frame[list(ROW_COLUMNS) + rest]


def write_diagnostics(out_dir: str, frame: pd.DataFrame, meta: dict[str, Any]) -> dict[str, str]:
    """Write diagnostics.csv and diagnostics.json (rows and `meta`) into `out_dir`, both or neither."""
    from shortcutlab.io import atomic_files, to_json

    csv_path = os.path.join(out_dir, "diagnostics.csv")
    json_path = os.path.join(out_dir, "diagnostics.json")
    records = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in frame.to_dict("records")]
    with atomic_files() as stage:
        frame.to_csv(stage.path(csv_path), index=False)
        with open(stage.path(json_path), "w", encoding="utf-8") as f:
            f.write(to_json({**meta, "rows": records}))
    return {"csv": csv_path, "json": json_path}


def intervention_targets(crops, split, names: Sequence[str] | None = None, seed: int = 0) -> dict[str, dict]:
    """Per-crop targets of every intervention that declares them, for `diagnose(targets=...)`.

    Asks each intervention class its `interventions.Intervention.targets_for` hook; those that
    need none (the default hook, or a hook returning None) are left out.

    Args:
        crops: a `shortcutlab.data.images.CropImages`.
        split: a `shortcutlab.data.manifest.SplitManifest` or the path of its CSV.
        names: the interventions to ask (default: every registered one); repeats are asked once.
        seed: passed to the hooks.

    Returns:
        ``{name: {keyword: (N, ...) array or tensor}}`` aligned with the table's rows.

    Raises:
        InterventionError: an unknown name, a hook that cannot give its targets, or one whose
            result is not a dict of arrays with one row per crop.

    Example:
        >>> targets = intervention_targets(crops, "split.csv", seed=0)  # doctest: +SKIP
        >>> sorted(targets)  # doctest: +SKIP
        ['reinhard_unseen_field']
    """
    import interventions
    from shortcutlab.data.manifest import SplitManifest

    names = interventions.available() if names is None else list(dict.fromkeys(names))
    classes = {n: interventions.get_class(n) for n in names}
    classes = {n: c for n, c in classes.items() if interventions.declares_targets(c)}
    if classes and isinstance(split, (str, os.PathLike)):
        split = SplitManifest.read(split)
    out = {}
    for name, cls in classes.items():
        targets = interventions.check_targets(cls.targets_for(crops, split, seed=seed), crops.table.n_crops, name)
        if targets is not None:
            out[name] = targets
    return out


def unseen_field_targets_for(crops, split, cells=None, seed: int = 0) -> dict[str, dict]:
    """Per-crop targets of the F2 transfer (``reinhard_unseen_field``) for `diagnose(targets=...)`.

    Kept for compatibility: `intervention_targets` gives every intervention that declares
    targets its own. This one also takes the compared `cells` (see
    `interventions.unseen_field_target_tensors`).

    Returns:
        ``{"reinhard_unseen_field": {"target_mean": (N, 3), "target_std": (N, 3)}}`` aligned
        with the table's rows.
    """
    from interventions import ReinhardToField, unseen_field_target_tensors

    return {ReinhardToField.name: unseen_field_target_tensors(crops, split, cells=cells, seed=seed)}
