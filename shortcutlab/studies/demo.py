"""The one-command demo: the leak/clean factorial on the synthetic benchmark.

For each condition (a planted acquisition mechanism, and `none` as the negative control) it
runs a sweep (`sweep_config`: tasks in ``OUT/sweep``, resumable) that renders a synthetic benchmark, builds the factorial split (one common test set;
leak cells train on the test fields' siblings, clean cells on other fields, at two diversity
levels with matched crop and field counts), trains one model per cell and seed with the
paper's recipe, and reports each cell's accuracy on the common test set and the leak effect
(leak minus clean, per level). With a planted mechanism leak cells should score clearly
higher; under `none` the difference should be near zero.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace

import pandas as pd
import torch

from shortcutlab.data.images import CropImages
from shortcutlab.io import atomic_files, check_writable, claim_output_dir, write_csv, write_json, write_marker
from shortcutlab.data.splits import FACTORIAL_CELLS
from shortcutlab.data.table import CropTable


@dataclass(frozen=True)
class DemoConfig:
    """Settings of the demo; the defaults run in a few minutes on 2 CPU cores.

    Attributes:
        mechanisms: planted mechanisms of the leak condition (comma-joined in reports).
        controls: also run the signature-free `none` condition.
        seeds: one factorial (and one model per cell) per seed.
        strength, class_signal, fields_per_class, mean_cells_per_field, crop_size, field_size,
            n_classes: synthetic benchmark settings (see `shortcutlab.synth.SynthConfig`).
            field_size None means 4 x crop_size (the benchmark's own default is 3x): with
            fewer shared pixels between siblings, the `none` control measures seen-field
            leakage rather than memorised pixels (at 3x, 91% of crops overlap a sibling and
            `none` leak cells gained +2.6 pp; at 4x, +1.5 pp overall and -0.2 pp on test crops
            sharing no pixel with a training crop).
        arch, epochs, batch_size, lr: training recipe (see `TrainConfig`). The models start
            from random weights, so the demo uses lr 1e-3 instead of the recipe's 1e-4, which
            is meant for fine-tuning pretrained backbones. The arch is ``cam_cnn``
            (`shortcutlab.models.cam_cnn`), whose Grad-CAM layer is 8 x 8 cells on a 32 px
            crop; ``test_resnet``'s last stage is 1 x 1 there, so every Grad-CAM map was a
            constant and the saliency diagnostic could show nothing.
        precise_bn: recompute BatchNorm statistics on the training crops before scoring (see
            `TrainConfig.precise_bn`). Without it some small random-init models score near
            chance although they fit their training crops, which swamps the leak effect.
        test_parent_share, diversity_contrast, reserve_parent_share: factorial settings
            (reserved fields are the targets of `reinhard_unseen_field`, F2).
        cells: the factorial cells trained (default all four).
        interventions, intervention_params: scored on every model (the sweep's
            ``interventions.names`` / ``params``).
        diagnostics: run on every model (the sweep's ``diagnostics.only``).
        report: after the sweep, write ``OUT/report/report.html`` (`build_report`).
        n_boot: bootstrap resamples of the report's intervals.
        threads: torch threads of the demo's sweeps (None: the cores available to the process,
            or OMP_NUM_THREADS where set: `sweep.threads.default_threads`); the sweep runs one
            task at a time, on all of them.
            The logits' last digits depend on the thread count: a direct `train` call matches
            a demo model when it runs on the same number of threads (recorded in run.json).
    """

    mechanisms: tuple[str, ...] = ("color", "illumination", "background", "focus", "noise")
    controls: bool = True
    seeds: tuple[int, ...] = (0,)
    strength: float = 1.0
    class_signal: float = 0.6
    fields_per_class: int = 100
    mean_cells_per_field: float = 6.0
    crop_size: int = 32
    field_size: int | None = None
    n_classes: int = 3
    arch: str = "cam_cnn"
    epochs: int = 30
    batch_size: int = 64
    lr: float = 1e-3
    precise_bn: bool = True
    test_parent_share: float = 0.3
    diversity_contrast: float = 1.43
    reserve_parent_share: float = 0.0
    cells: tuple[str, ...] = FACTORIAL_CELLS
    interventions: tuple[str, ...] = ("background_removal", "illumination_flattening", "low_pass", "greyscale")
    intervention_params: dict = field(default_factory=lambda: {"low_pass": {"sigma": 1.0}})
    diagnostics: tuple[str, ...] = ("parent_probe", "gradcam")
    report: bool = True
    n_boot: int = 2000
    threads: int | None = None
    progress: bool = True

    @classmethod
    def quick(cls, **changes) -> "DemoConfig":
        """The `--quick` demo: planted colour and `none`, 4 seeds, the high-diversity leak and
        clean cells, 30 fields per class, 12 epochs, fields reserved for the unseen-field
        Reinhard transfer (F2), four interventions, the parent probe and Grad-CAM.

        One torch thread per task: on 2 cores shared with other jobs (load 8), 2 threads per
        task made the same sweep (3 seeds, 5 epochs) take 6.6 min instead of 41 s, its threads
        waiting on each other."""
        base = cls(mechanisms=("color",), seeds=(0, 1, 2, 3), fields_per_class=30, epochs=12, cells=("leak-high", "clean-high"),
                   reserve_parent_share=0.2,
                   interventions=("reinhard_unseen_field", "background_removal", "illumination_flattening", "low_pass"),
                   threads=1)
        return replace(base, **changes)


def _crops_from_synth(data, source: str = "synthetic benchmark", all_cells: bool = False) -> CropImages:
    """Align in-memory synthetic crops with the (id-sorted) CropTable rows; masks: the centred
    cell's, or with `all_cells` every cell's in the crop (`SynthData.all_cells`)."""
    table = CropTable.from_frame(data.table, id="id", label="label", parent="parent", box="x,y,w,h", source=source)
    order = torch.from_numpy(pd.Index(data.table["id"].astype(str)).get_indexer(table.ids))
    masks = data.all_cells if all_cells else data.masks
    if masks is None:
        raise ValueError("this SynthData has no all-cells masks (all_cells is None)")
    return CropImages(data.images[order], masks[order], table)


def sweep_config(mechanisms: tuple[str, ...], seed: int, cfg: DemoConfig) -> dict:
    """The built-in sweep config of one demo factorial: the benchmark of `mechanisms` and
    `seed`, its factorial split, and one model per cell with the demo's recipe."""
    return full_sweep_config(cfg, [tuple(mechanisms)], [seed])


def full_sweep_config(cfg: DemoConfig, conditions: list[tuple[str, ...]] | None = None, seeds: list[int] | None = None) -> dict:
    """The built-in sweep config of the whole demo (every condition and seed): its tasks are
    those of the per-factorial configs, so after them it only gathers the tables."""
    if conditions is None:
        conditions = [tuple(cfg.mechanisms)] + ([("none",)] if cfg.controls else [])
    split_params = {"test_parent_share": cfg.test_parent_share, "diversity_contrast": cfg.diversity_contrast}
    if cfg.reserve_parent_share:
        split_params["reserve_parent_share"] = cfg.reserve_parent_share
    ivs: dict | str = "none"
    if cfg.interventions:
        ivs = {"names": list(cfg.interventions),
               "params": {k: v for k, v in cfg.intervention_params.items() if k in cfg.interventions}}
    return {
        "data": {"synthetic": {
            "mechanisms": [list(m) for m in conditions],
            "strength": cfg.strength,
            "class_signal": cfg.class_signal,
            "fields_per_class": cfg.fields_per_class,
            "mean_cells_per_field": cfg.mean_cells_per_field,
            "crop_size": cfg.crop_size,
            "field_size": cfg.field_size or 4 * cfg.crop_size,
            "n_classes": cfg.n_classes,
        }},
        "split": {"protocol": "factorial", "params": split_params},
        "seeds": list(cfg.seeds if seeds is None else seeds),
        "models": [{"arch": cfg.arch, "epochs": cfg.epochs, "batch_size": cfg.batch_size, "lr": cfg.lr, "precise_bn": cfg.precise_bn}],
        "cells": list(cfg.cells),
        "interventions": ivs,
        "diagnostics": list(cfg.diagnostics) if cfg.diagnostics else "none",
        # None: the sweep's default, the cores available (float reductions, hence the last
        # digits of the logits, depend on the thread count; each run.json records it)
        **({"threads": cfg.threads} if cfg.threads is not None else {}),
    }


def _link(target: str, link: str) -> None:
    """A relative symbolic link `link` -> `target`, replacing an earlier link."""
    if os.path.islink(link):
        os.remove(link)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(os.path.relpath(target, os.path.dirname(link)), link)


def run_condition(mechanisms: tuple[str, ...], seed: int, cfg: DemoConfig, out_dir: str) -> list[dict]:
    """One factorial on one benchmark, run as a sweep in ``out_dir/sweep`` (a demo started
    again resumes there): train the four cells, return one row per cell.

    ``<condition>_seed<seed>/`` links to the benchmark, the split and each cell's run folder,
    so that ``shortcutlab diagnose <condition>_seed0/leak-low`` works as before.
    """
    from shortcutlab.data.manifest import SplitManifest
    from shortcutlab.sweep.config import validate
    from shortcutlab.sweep.folder import SweepLayout
    from shortcutlab.sweep.plan import build_plan
    from shortcutlab.sweep.runner import run_sweep

    scfg = validate(sweep_config(mechanisms, seed, cfg), source="demo")
    root = os.path.abspath(os.path.join(out_dir, "sweep"))
    run_sweep(scfg, root, progress=cfg.progress)
    plan = build_plan(scfg)
    name = "+".join(scfg.conditions[0].params["mechanisms"])
    cond_dir = os.path.join(out_dir, f"{name}_seed{seed}")
    synth_id = next(t.id for t in plan.graph.ordered() if t.kind == "synthesise")
    split_id = plan.models[0]["split_id"]
    layout = SweepLayout(root)
    synth = layout.task("synthesise", synth_id)
    split_path = layout.task("split", split_id).split
    _link(synth.benchmark, os.path.join(cond_dir, "benchmark"))
    _link(split_path, os.path.join(cond_dir, "split.csv"))
    table = CropTable.from_csv(synth.benchmark_manifest, id="id", label="label", parent="parent", box="x,y,w,h")
    split = SplitManifest.read(split_path)
    no_shared = _no_shared_pixels(table, split)
    rows = []
    for m in plan.models:
        cell = m["cell"]
        run = layout.task("train", m["model"])
        _link(run.path, os.path.join(cond_dir, cell))
        rec = layout.read_result("train", m["model"])
        with open(run.run_record, encoding="utf-8") as f:
            durations = json.load(f)["durations_s"]
        subset = no_shared[cell.split("-")[1]]
        logits = pd.read_csv(run.run_logits, usecols=["id", "split", "label", "pred"], dtype={"id": str})
        test = logits[(logits["split"] == "test") & logits["id"].isin(subset)]
        rows.append(
            {
                "condition": name,
                "seed": seed,
                "cell": cell,
                "exposure": cell.split("-")[0],
                "diversity": cell.split("-")[1],
                "test_accuracy": rec["accuracy"]["test"],
                "train_accuracy": rec["accuracy"]["train"],
                "n_train": rec["n_crops"]["train"],
                "n_test": rec["n_crops"]["test"],
                "test_accuracy_no_shared_pixels": float((test["label"] == test["pred"]).mean()) if len(test) else float("nan"),
                "n_test_no_shared_pixels": int(len(test)),
                "n_train_parents": split.report["cells"][cell]["n_parents"],
                "train_s": durations["train"],
                "split_sha256": split.hash,
            }
        )
    return rows


def _no_shared_pixels(table: CropTable, split) -> dict[str, set]:
    """Per diversity level, the ids of common-test crops that share no pixel with any training
    crop of that level's leak cell (the paper's exploratory pixel-free subset;
    `data.audit.no_shared_pixel_ids`, which the report reads too)."""
    from shortcutlab.data.audit import no_shared_pixel_ids

    return {level: no_shared_pixel_ids(table, split, f"leak-{level}") for level in ("high", "low")}


def leak_effects(results: pd.DataFrame) -> pd.DataFrame:
    """Leak minus clean test accuracy per condition, seed and diversity level (tidy).

    ``leak_effect`` uses the whole common test set; ``leak_effect_no_shared_pixels`` only the
    test crops that share no pixel with a training crop of the level's leak cell (the same
    crops for the leak and the clean model): a leak that survives there comes from the seen
    field, not from memorised pixels.
    """
    index = ["condition", "seed", "diversity"]
    wide = results.pivot_table(index=index, columns="exposure", values="test_accuracy").reset_index()
    wide["leak_effect"] = wide["leak"] - wide["clean"]
    if "test_accuracy_no_shared_pixels" in results.columns:
        sub = results.pivot_table(index=index, columns="exposure", values="test_accuracy_no_shared_pixels").reset_index()
        sub["leak_effect_no_shared_pixels"] = sub["leak"] - sub["clean"]
        wide = wide.merge(sub[index + ["leak_effect_no_shared_pixels"]], on=index, how="left")
    wide.columns.name = None
    return wide


def demo_files(cfg: DemoConfig) -> list[str]:
    """What `run_demo` writes in its folder (``name/``: a folder it owns whole)."""
    from shortcutlab.sweep.config import validate

    conditions = [tuple(cfg.mechanisms)] + ([("none",)] if cfg.controls else [])
    cond = ["+".join(validate(sweep_config(m, s, cfg), source="demo").conditions[0].params["mechanisms"]) + f"_seed{s}/"
            for m in conditions for s in cfg.seeds]
    return ["results.csv", "effects.csv", "summary.json", "sweep/", "report/"] + cond


def _is_legacy_demo(out: str) -> bool:
    """A demo folder written before output markers: its summary.json is a demo's, or its
    sweep/ folder is a sweep (a demo stopped before its summary)."""
    from shortcutlab.sweep.folder import is_legacy_sweep

    try:
        with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
            d = json.load(f)
        return isinstance(d, dict) and "mean_leak_effect_pp" in d
    except (OSError, ValueError):
        return os.path.isdir(os.path.join(out, "sweep")) and is_legacy_sweep(os.path.join(out, "sweep"))


def run_demo(out_dir: str, cfg: DemoConfig = DemoConfig()) -> dict:
    """Run every condition and seed; write results.csv, effects.csv and summary.json.

    Returns:
        The summary: with the report, ``estimates``: the report's verdict rows
        (`report_estimates`: the pooled leak per condition with its interval and verdict, and
        the same on the test crops sharing no pixel with a training crop), the numbers the
        report opens with; always the per-seed means of effects.csv (``mean_leak_effect_pp``,
        ``mean_leak_effect_no_shared_pixels_pp``: no interval), the mean test accuracy, the
        minutes, the config and the file paths.
    """
    # A folder that cannot be written, or holds files the demo did not write, is refused
    # before the first model trains; it is marked as the demo's at once, so a demo stopped
    # at any point resumes there.
    names = demo_files(cfg)
    claim_output_dir(out_dir, "demo", names, _is_legacy_demo)
    check_writable(os.path.join(out_dir, "results.csv"))
    write_marker(out_dir, "demo", names)
    conditions = [tuple(cfg.mechanisms)] + ([("none",)] if cfg.controls else [])
    t0 = time.perf_counter()
    rows = []
    for mechanisms in conditions:
        for seed in cfg.seeds:
            rows += run_condition(mechanisms, seed, cfg, out_dir)
            # Rewritten (atomically) after each factorial so an interrupted demo keeps what it
            # finished, and never leaves half a table.
            write_csv(os.path.join(out_dir, "results.csv"), pd.DataFrame(rows))
    results = pd.DataFrame(rows)
    report = finish_sweep(out_dir, cfg) if cfg.report else None
    effects = leak_effects(results)
    summary = {
        "mean_leak_effect_pp": {c: round(100 * float(g["leak_effect"].mean()), 2) for c, g in effects.groupby("condition", sort=False)},
        "mean_leak_effect_no_shared_pixels_pp": {
            c: round(100 * float(g["leak_effect_no_shared_pixels"].mean()), 2) for c, g in effects.groupby("condition", sort=False)
        },
        "mean_test_accuracy": {c: round(float(g["test_accuracy"].mean()), 4) for c, g in results.groupby("condition", sort=False)},
        "minutes": round((time.perf_counter() - t0) / 60, 2),
        "config": asdict(cfg),
        "files": {"results": "results.csv", "effects": "effects.csv"},
    }
    if report is not None:
        summary["files"]["report"] = os.path.relpath(report["html"], out_dir)
        summary["report"] = report["html"]
        summary["estimates"] = report_estimates(report["verdicts"])
    # effects.csv and summary.json appear together (summary last) or not at all.
    with atomic_files() as stage:
        effects.to_csv(stage.path(os.path.join(out_dir, "effects.csv")), index=False)
        write_json(stage.path(os.path.join(out_dir, "summary.json")), summary)
    return summary


#: `report_estimates`' keys of the report's verdict rows (`report.summary.VERDICT_COLUMNS`)
#: in percentage points
PP_KEYS = {"leak": "leak_pp", "leak_ci_low": "leak_ci_low_pp", "leak_ci_high": "leak_ci_high_pp",
           "pixel_free_leak": "pixel_free_leak_pp", "pixel_free_ci_low": "pixel_free_ci_low_pp",
           "pixel_free_ci_high": "pixel_free_ci_high_pp"}


def report_estimates(verdicts_csv: str) -> list[dict]:
    """The report's verdict rows (its ``verdicts.csv``) as JSON-ready dicts: condition,
    diversity, arch, the leak and its interval in pp (None: no interval), its verdict, seeds,
    the same on the pixel-free test crops, and the interventions that remove it at an
    acceptable clean cost (a list of settings)."""
    v = pd.read_csv(verdicts_csv, keep_default_na=False, na_values=[""], dtype={"condition": str, "diversity": str})
    out = []
    for r in v.to_dict("records"):
        row = {"condition": r["condition"], "diversity": r["diversity"] or "", "arch": str(r["arch"]),
               "n_seeds": None if pd.isna(r["n_seeds"]) else int(r["n_seeds"]), "leak_verdict": r["leak_verdict"],
               "pixel_free_verdict": r["pixel_free_verdict"] if isinstance(r["pixel_free_verdict"], str) else "",
               "pixel_free_n_crops": None if pd.isna(r["pixel_free_n_crops"]) else int(r["pixel_free_n_crops"]),
               "removed_by": [x for x in str(r["removed_by"] if isinstance(r["removed_by"], str) else "").split(";") if x]}
        row.update({k: None if pd.isna(r[c]) else 100 * float(r[c]) for c, k in PP_KEYS.items()})
        out.append(row)
    return out


def summary_lines(summary: dict, level: float = 0.95) -> list[str]:
    """What `shortcutlab demo` prints of its summary: with the report, the report's pooled
    leak per condition with its interval and verdict, and on the pixel-free test crops (the
    words of `report.summary.leak_clause`); without it, the per-seed means and no interval."""
    from shortcutlab.report.readings import intervention_label
    from shortcutlab.report.summary import leak_clause

    rows = summary.get("estimates")
    if rows is None:
        lines = ["  leak - clean test accuracy, mean over seeds (no interval: the report was not written):"]
        for cond, eff in summary["mean_leak_effect_pp"].items():
            nsp = summary["mean_leak_effect_no_shared_pixels_pp"][cond]
            lines.append(f"  {cond:<12} {eff:+.1f} pp; on test crops sharing no pixel with a leak training crop {nsp:+.1f} pp")
        return lines
    several = len({r["diversity"] for r in rows}) > 1
    lines = ["  leak = leak-model minus clean-model accuracy on the common test crops, pooled over seeds and crops "
             "(the report's estimates):"]
    width = max(len(_where(r, several)) for r in rows) if rows else 0

    def frac(x):
        return float("nan") if x is None else x / 100

    for r in rows:
        pad = " " * width
        lines.append(f"  {_where(r, several):<{width}}  leak " + leak_clause(
            frac(r["leak_pp"]), frac(r["leak_ci_low_pp"]), frac(r["leak_ci_high_pp"]), r["leak_verdict"], level,
            f"{r['n_seeds']} seed(s)"))
        if r["pixel_free_verdict"]:
            lines.append(f"  {pad}  on the test crops sharing no pixel with a leak training crop: " + leak_clause(
                frac(r["pixel_free_leak_pp"]), frac(r["pixel_free_ci_low_pp"]), frac(r["pixel_free_ci_high_pp"]),
                r["pixel_free_verdict"], level, "too few seeds or parents"))
        if r["leak_verdict"] == "leak":
            lines.append(f"  {pad}  removed at an acceptable clean cost by: "
                         + (", ".join(intervention_label(i) for i in r["removed_by"]) or "nothing"))
    return lines


def _where(row: dict, several: bool) -> str:
    return f"{row['condition']} ({row['diversity']})" if several and row["diversity"] else str(row["condition"])


def finish_sweep(out_dir: str, cfg: DemoConfig) -> dict:
    """Gather every factorial of the demo into one sweep folder (``OUT/sweep``: its tasks are
    already done, so this only writes the tables) and write the report (``OUT/report``).

    Returns:
        `build_report`'s paths (``html`` is the report).
    """
    from shortcutlab.report import build_report
    from shortcutlab.sweep.config import validate
    from shortcutlab.sweep.runner import run_sweep

    scfg = validate(full_sweep_config(cfg), source="demo")
    root = os.path.abspath(os.path.join(out_dir, "sweep"))
    run_sweep(scfg, root, progress=cfg.progress)
    return build_report(root, os.path.join(out_dir, "report"), n_boot=cfg.n_boot, seed=0)
