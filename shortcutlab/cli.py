"""The `shortcutlab` command line: audit, split, verify, synth, train, demo, diagnose, siblings,
sweep, results, report, litmus, control.

Run ``shortcutlab COMMAND --help`` for the options of each command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from shortcutlab.errors import ManifestHashError, ShortcutlabError
from shortcutlab.io import claim_output_files, read_json_object, register_output_files


def _add_table_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("table", help="CSV or Parquet (.parquet) file, one row per crop")
    g = p.add_argument_group("table columns")
    g.add_argument("--parent", required=True, help="acquisition-parent column (field, slide image, ...)")
    g.add_argument("--label", required=True, help="class column")
    g.add_argument("--id", help="crop id column, or several joined with commas (default: row number)")
    g.add_argument("--group", help="higher-level unit column, e.g. patient")
    g.add_argument("--image", help="crop image path column")
    g.add_argument("--mask", help="cell mask path column")
    g.add_argument("--hash-column", help="column of 16-hex-digit perceptual hashes of the crops (for parent-dedup)")
    g.add_argument("--box", metavar="X,Y,W,H", help="box columns (top-left corner and size in parent pixels)")
    g.add_argument("--center", metavar="X,Y", help="crop centre columns (needs --crop-size)")
    g.add_argument("--crop-size", metavar="S", help="square crop side in pixels (a number or a column)")


def _load_table(args):
    from shortcutlab.data.table import CropTable

    read = CropTable.from_parquet if str(args.table).lower().endswith((".parquet", ".pq")) else CropTable.from_csv
    return read(
        args.table,
        id=args.id,
        label=args.label,
        parent=args.parent,
        group=args.group,
        image=args.image,
        mask=args.mask,
        box=args.box,
        center=args.center,
        crop_size=args.crop_size,
        phash=getattr(args, "hash_column", None),
    )


def _check_output_files(table: str | None, outputs: list[tuple[str, str | None]]) -> None:
    """Refuse, before any work, output files that cannot be written or would overwrite an input.

    Args:
        table: the input table path (never overwritten), or None.
        outputs: (option, path) pairs; a None path is an option not given.
    """
    from shortcutlab.io import OutputError, check_writable

    seen: dict[str, str] = {}
    inputs = {os.path.realpath(table): "the input table"} if table else {}
    for flag, path in outputs:
        if path is None:
            continue
        where = os.path.realpath(path)
        if where in inputs:
            raise OutputError(f"{flag} {path!r} is {inputs[where]}; choose another output path")
        if where in seen:
            raise OutputError(f"{flag} {path!r} is also the path of {seen[where]}; give each output its own path")
        seen[where] = flag
        check_writable(path)


def _json_of(name: str):
    """A test of an --out folder written before output markers: its `name` (litmus.json,
    control.json, diagnostics.json) is a JSON object with a list of rows, as shortcutlab writes
    them, so the CSV beside it is shortcutlab's too."""

    def legacy(folder: str) -> bool:
        d = read_json_object(os.path.join(folder, name))
        return d is not None and isinstance(d.get("rows"), list)

    return legacy


def _check_output_folder(path: str, flag: str, *, replaced: bool = False) -> None:
    """Refuse, before any work, an output folder that cannot be made or written.

    Nothing is created. With `replaced` the folder is built beside `path` and swapped in, so
    its parent must be writable; otherwise files are written inside it.
    """
    from shortcutlab.io import OutputError

    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"{flag} {path!r} is a file; give a folder")
    full = os.path.abspath(path)
    probe = os.path.dirname(full) if replaced else full
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise OutputError(f"cannot write folder {path!r}: {probe!r} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write folder {path!r}: {probe!r} is not writable")


def _numbers(text: str, flag: str, kind: type = float, example: str = "") -> list:
    """Parse a comma-separated option ('0,0.5,1'); a part that is not a number names itself."""
    out = []
    for part in text.split(","):
        try:
            out.append(kind(part.strip()))
        except ValueError:
            what = "integers" if kind is int else "numbers"
            raise ShortcutlabError(
                f"{flag} takes comma-separated {what}{example}; {part.strip()!r} is not one (in {text!r})"
            ) from None
    return out


def _print_warnings(caught: list, category: type) -> None:
    """Print a command's own warnings of `category` (collapsed: a repeated one once, with a
    count; `warnings_summary`) and raise the others again for the summary at the end."""
    import warnings

    from shortcutlab.warnings_summary import summary_lines

    for line in summary_lines([w for w in caught if issubclass(w.category, category)], category=False):
        print(line)
    for w in caught:
        if not issubclass(w.category, category):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _fmt(x) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.4f}"
    return str(x)


def _print_audit(result: dict) -> None:
    rows = [
        ("crops", result["n_crops"]),
        ("parents", result["n_parents"]),
        ("groups", result["n_groups"]),
        ("classes", result["n_classes"]),
        ("test fraction q", result["test_fraction"]),
        ("sibling share", result["sibling_share"]),
        ("exposure (crop-level split)", result["exposure"]),
        ("diversity ratio", result["diversity_ratio"]),
        ("pixel overlap (crop-level split)", result["pixel_overlap"]),
        ("crops overlapping a sibling", result["overlap_share"]),
    ]
    print(f"Audit of {result['source']}")
    print("closed forms")
    for k, v in rows:
        print(f"  {k:<34} {_fmt(v)}")
    measured = result.get("measured")
    if not measured:
        return
    split = result["split"]
    print(f"measured on split ({split['protocol']}, sha256 {split['sha256'][:16]}...)")
    if result.get("n_unassigned") is not None:  # crops of the table in no cell of the manifest
        print(f"  table crops missing from the manifest: {result['n_unassigned']}")
    for name, sib in (result.get("pixel_siblings") or {}).items():
        if sib.get("share") is not None:
            where = f" (cell {name})" if name else ""
            print(f"  pixel siblings{where}: {sib['n_with_sibling']} of {sib['n_test']} test crops ({100 * sib['share']:.2f}%) "
                  f"within {sib['threshold']} bits of a training crop under flips/rotations, confirmed by the aligned detail"
                  + (f" ({sib['n_hash_candidates']} hash candidates)" if sib.get("n_hash_candidates", sib["n_with_sibling"]) != sib["n_with_sibling"] else ""))
    cells = {"": measured} if "parents_crossing" in measured else measured
    for name, m in cells.items():
        if not isinstance(m, dict):
            continue  # a figure about the whole manifest, beside its cells
        if name:
            print(f"  cell {name}")
        if m.get("n_unassigned") is not None:
            print(f"  table crops not in this {'cell' if name else 'split'}: {m['n_unassigned']}")
        print(f"  {'side':<6} {'crops':>9} {'parents':>8} {'groups':>7} {'w/ train sib':>13} {'w/ overlap':>11}")
        for side in ("train", "val", "test"):
            s = m.get(side)
            if not s:
                continue
            print(
                f"  {side:<6} {s['n_crops']:>9} {s['n_parents']:>8} {_fmt(s['n_groups']):>7} "
                f"{_fmt(s.get('with_train_sibling')) if side != 'train' else '':>13} "
                f"{_fmt(s.get('with_overlapping_train_sibling')) if side != 'train' else '':>11}"
            )
        print(f"  parents crossing sides: {m['parents_crossing']}; groups crossing: {_fmt(m['groups_crossing'])}")
        for side in ("train", "val", "test"):
            s = m.get(side)
            if s:
                shares = ", ".join(f"{c} {v:.3f}" for c, v in s["class_share"].items())
                print(f"  class share {side}: {shares}")


def _engine_source(args):
    """The table of `audit` / `split` as an engine's `TableSource`."""
    from shortcutlab.data.engines import TableSource

    for flag in ("image", "mask", "hash_column"):
        if getattr(args, flag, None):
            raise ShortcutlabError(f"--{flag.replace('_', '-')} is not used by --engine {args.engine}, which computes the closed forms "
                                   "and the parent split from the table's columns; leave it out or run without --engine")
    return TableSource(args.table, label=args.label, parent=args.parent, id=args.id, group=args.group, box=args.box,
                       center=args.center, crop_size=args.crop_size)


def _engine(args):
    """The engine named by --engine, with --memory-limit and --threads where given."""
    from shortcutlab.data.engines import get_engine

    options = {k: getattr(args, k) for k in ("memory_limit", "threads") if getattr(args, k, None) is not None}
    if getattr(args, "ray_address", None):
        options["address"] = args.ray_address
    return get_engine(args.engine, **options)


def _audit_with_engine(args) -> int:
    """`audit --engine NAME`: the closed forms only (a split is measured in memory)."""
    from shortcutlab.io import write_text, to_json

    for flag, value in (("--split", args.split), ("--card", args.card), ("--augmentation-order", args.augmentation_order)):
        if value:
            raise ShortcutlabError(f"{flag} needs the table in memory; --engine {args.engine} computes the closed forms only (run without --engine)")
    _check_output_files(args.table, [("--json", args.json)])
    result = _engine(args).audit(_engine_source(args), test_fraction=args.test_fraction)
    _print_audit(result)
    if args.json:
        write_text(args.json, to_json(result))
        print(f"wrote {args.json}")
    return 0


def cmd_audit(args) -> int:
    if args.engine:
        return _audit_with_engine(args)
    from shortcutlab.data.audit import audit
    from shortcutlab.data.card import reporting_card
    from shortcutlab.io import atomic_files, to_json
    from shortcutlab.data.manifest import SplitManifest

    _check_output_files(args.table, [("--json", args.json), ("--card", args.card)])
    table = _load_table(args)
    split = SplitManifest.read(args.split) if args.split else None
    result = audit(table, test_fraction=args.test_fraction, split=split, cell=args.cell, augmentation=args.augmentation_order,
                   pixel_siblings=False if args.no_pixel_siblings else None)
    _print_audit(result)
    texts = {}
    if args.json:
        texts[args.json] = to_json(result)
    if args.card:
        texts[args.card] = reporting_card(result)
    # Both files or neither: a card without its figures (or the reverse) is not a report.
    with atomic_files() as stage:
        for path, text in texts.items():
            with open(stage.path(path), "w", encoding="utf-8") as f:
                f.write(text)
    for path in texts:
        print(f"wrote {path}")
    return 0


def _split_with_engine(args) -> int:
    """`split --engine NAME`: a manifest folder of Parquet files (``split=<side>/``) and its
    sidecar ``<folder>.json``."""
    from shortcutlab.io import OutputError
    from shortcutlab.data.engines import sidecar_of_folder

    if str(args.out).lower().endswith(".csv"):
        raise OutputError(f"--engine {args.engine} writes a manifest folder of Parquet files; give --out a folder name "
                          f"(say {os.path.splitext(args.out)[0]}.parquet), not {args.out!r}")
    _check_output_files(args.table, [("--out", args.out), ("the sidecar of --out", sidecar_of_folder(args.out))])
    unit = args.unit or ("group" if args.group else "parent")
    record = _engine(args).split(_engine_source(args), args.out, protocol=args.protocol, test_fraction=args.test_fraction,
                                 val_fraction=args.val_fraction, seed=args.seed, unit=unit)
    print(f"protocol {args.protocol} (engine {args.engine}): {record['n_rows']} rows written to {args.out}/split=*/")
    for key in ("test_share", "n_test", "n_train", "n_val", "max_class_deviation"):
        if key in record["report"]:
            print(f"  {key}: {record['report'][key]}")
    print(f"sha256 {record['sha256']}")
    return 0


def cmd_split(args) -> int:
    if args.engine:
        return _split_with_engine(args)
    from shortcutlab.io import OutputError
    from shortcutlab.data.manifest import sidecar_path
    from shortcutlab.data.splits import make_split

    levels = None
    if args.protocol == "ladder" and args.levels:
        levels = _numbers(args.levels, "--levels", example=" in [0, 1], e.g. 0,0.5,1")
    if sidecar_path(args.out) == os.fspath(args.out):
        raise OutputError(f"--out {args.out!r} would be overwritten by its JSON sidecar; name the manifest *.csv")
    _check_output_files(args.table, [("--out", args.out), ("the sidecar of --out", sidecar_path(args.out))])
    table = _load_table(args)
    params: dict = {"seed": args.seed}
    p = args.protocol
    if p in ("crop", "parent", "parent-dedup", "ladder"):
        params["test_fraction"] = args.test_fraction
    if p in ("crop", "parent", "parent-dedup") and args.val_fraction:
        params["val_fraction"] = args.val_fraction
    if p in ("parent", "parent-dedup"):
        unit = args.unit or ("group" if args.group else "parent")
        params["unit"] = unit
    if p == "parent-dedup":
        params["max_distance"] = args.max_distance
        if args.invariant:
            params["invariant"] = True
    if p == "factorial":
        params["test_parent_share"] = args.test_parent_share
        params["diversity_contrast"] = args.diversity_contrast
        if args.n_per_class:
            params["n_per_class"] = args.n_per_class
        params["allocation"] = args.allocation
        if args.reserve_parent_share:
            params["reserve_parent_share"] = args.reserve_parent_share
    if levels is not None:
        params["levels"] = levels
    manifest = make_split(table, p, **params)
    digest = manifest.to_csv(args.out)
    print(f"protocol {p}: {len(manifest.assignments)} rows written to {args.out}")
    for key in ("test_share", "n_test", "n_train", "n_val", "max_class_deviation", "parents_after_merge", "n_per_class", "achieved_diversity_contrast"):
        if key in manifest.report:
            print(f"  {key}: {manifest.report[key]}")
    if "cells" in manifest.report:
        for name, c in manifest.report["cells"].items():
            print(f"  {name}: {c['n_crops']} crops, {c['n_parents']} parents, test with a training sibling {c['test_with_train_sibling']:.3f}")
    if "levels" in manifest.report:
        for name, c in manifest.report["levels"].items():
            print(f"  {name}: test share {c['test_share']:.4f}, test with a training sibling {c['test_with_train_sibling']:.3f}")
    print(f"sha256 {digest}")
    return 0


def cmd_verify(args) -> int:
    from shortcutlab.data.manifest import verify

    try:
        digest = verify(args.manifest, args.hash)
    except ManifestHashError as e:
        print(f"MISMATCH: {e}", file=sys.stderr)
        return 1
    print(f"OK {digest}")
    return 0


def cmd_synth(args) -> int:
    import time

    from shortcutlab.synth import SynthConfig, parse_mechanisms, claim_synth_dir, synthesize, write_synth

    # Options left out keep SynthConfig's defaults (one source of truth).
    given = {
        "seed": args.seed,
        "n_classes": args.n_classes,
        "fields_per_class": args.fields_per_class,
        "mean_cells_per_field": args.cells_per_field,
        "crop_size": args.crop_size,
        "field_size": args.field_size,
        "strength": args.strength,
        "class_signal": args.class_signal,
        "illumination_shading": args.illumination_shading,
    }
    params = {k: v for k, v in given.items() if v is not None}
    if args.mechanism is not None:
        params["mechanisms"], params["strengths"] = parse_mechanisms(args.mechanism)
    params["mixed_fields"] = args.mixed_fields
    config = SynthConfig(**params)
    _check_output_folder(args.out, "--out", replaced=True)
    claim_synth_dir(args.out)  # before the benchmark is drawn: a folder of someone else's files is refused
    t0 = time.perf_counter()
    data = synthesize(config)
    t1 = time.perf_counter()
    paths = write_synth(data, args.out, compress_level=args.compress_level)
    t2 = time.perf_counter()
    n = len(data)
    strength = ", ".join(f"{m} {s:g}" for m, s in config.effective_strengths.items() if m in config.mechanisms) or "none"
    print(
        f"synthetic benchmark: {n} crops of {config.crop_size}x{config.crop_size} px from {config.n_fields} fields "
        f"({config.n_classes} classes, {'mixed' if config.mixed_fields else 'single-class'} fields, seed {config.seed})"
    )
    shading = f"; illumination shading {config.illumination_shading:g}" if config.illumination_shading != 1.0 else ""
    print(f"  mechanisms (strength): {strength}; class signal {config.class_signal:g}{shading}")
    print(f"  wrote {paths['manifest']} (paths relative to its folder), {paths['json']}, {paths['cells']}")
    print(f"  crops in {paths['crops']}, masks in {paths['masks']}")
    print(
        f"  {n / max(t2 - t0, 1e-9):.0f} crops/s ({t1 - t0:.2f} s rendering, {n / max(t1 - t0, 1e-9):.0f} crops/s; "
        f"{t2 - t1:.2f} s writing)"
    )
    print(
        f"  audit it: shortcutlab audit {paths['manifest']} --id id --label label --parent parent --box x,y,w,h"
    )
    return 0


def _key_values(items: list[str], flag: str) -> dict:
    """Parse repeated KEY=VALUE options; values are JSON when they parse (numbers, lists), else strings."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ShortcutlabError(f"{flag} takes KEY=VALUE; got {item!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def _add_train_settings(p: argparse.ArgumentParser, retrain: bool = False) -> None:
    """Add a flag per training setting, as `TrainConfig` declares it (`train_settings`): every
    setting for `train`, those declared ``retrain`` for `litmus` and `control`. Each flag stores
    under the field's name; `_train_config` turns the parsed flags into the config."""
    from shortcutlab.models.train_config import train_settings

    for s in train_settings():
        if retrain and not s.retrain:
            continue
        kw = {"dest": s.name, "help": (s.retrain_help if retrain and s.retrain_help else s.help)}
        if s.metavar:
            kw["metavar"] = s.metavar
        if s.cli == "switch":
            kw["action"] = "store_false" if s.default else "store_true"
        elif s.cli == "key_values":
            kw.update(action="append", default=[])
        elif s.cli == "pair":
            kw["default"] = None  # the config's default
        else:
            kw["default"] = s.default
            kind = float if float in s.kinds else int if int in s.kinds else None
            if kind is not None:
                kw["type"] = kind
        p.add_argument(s.option, **kw)


def _pair(text: str, flag: str) -> tuple[float, float]:
    """Parse a LOW,HIGH option ('0.5,1')."""
    values = _numbers(text, flag, float, " LOW,HIGH (e.g. 0.5,1)")
    if len(values) != 2:
        raise ShortcutlabError(f"{flag} takes two comma-separated numbers LOW,HIGH (e.g. 0.5,1); got {text!r}")
    return values[0], values[1]


def _train_config(args, retrain: bool = False):
    """The `TrainConfig` of the flags `_add_train_settings(p, retrain)` added, as parsed.

    Raises:
        ShortcutlabError: a malformed --augment-param or LOW,HIGH value, or a value the config
            refuses (it names the setting).
    """
    from shortcutlab.models.train_config import TrainConfig, train_settings

    kw = {}
    for s in train_settings():
        if retrain and not s.retrain:
            continue
        value = getattr(args, s.name)
        if s.cli == "key_values":
            value = _key_values(value, s.option)
        elif s.cli == "pair":
            if value is None:
                continue
            value = _pair(value, s.option)
        kw[s.name] = value
    return TrainConfig(**kw)


def cmd_train(args) -> int:
    from shortcutlab.data.images import load_manifest_table
    from shortcutlab.models.recipe import train

    cfg = _train_config(args)
    _check_output_folder(args.out, "--out")
    table = load_manifest_table(args.manifest, id=args.id, label=args.label, parent=args.parent, image=args.image, mask=args.mask)
    rec = train(table, args.split, args.out, cfg, cell=args.cell, progress=not args.quiet)
    acc = ", ".join(f"{k} {v:.4f}" for k, v in rec.accuracy.items())
    print(f"trained {cfg.arch} for {cfg.epochs} epochs on {rec.n_crops['train']} crops ({rec.durations_s['train']:.1f} s, "
          f"{rec.durations_s['train_crops_per_s']:.0f} crops/s); accuracy: {acc}")
    fit = rec.weights_fit
    if fit is not None and fit["route"] == "new_head":
        print(f"weights {fit['file']}: fine-tuned with a new classifier; dropped from the file: {', '.join(fit['dropped']) or 'none'}; "
              f"re-initialised: {', '.join(fit['reinitialised'])}" + (f"; adapted by timm: {', '.join(fit['adapted'])}" if fit["adapted"] else ""))
    if cfg.input_size is not None:
        print(f"crops resized to {cfg.input_size} x {cfg.input_size} before the model (recorded in run.json)")
    print(f"wrote {os.path.join(args.out, 'model.safetensors')}, logits.csv, run.json")
    return 0


def cmd_demo(args) -> int:
    from shortcutlab.studies.demo import DemoConfig, run_demo, summary_lines

    kw = {}
    if args.seeds:
        kw["seeds"] = tuple(_numbers(args.seeds, "--seeds", int, " (e.g. 0,1,2)"))
    if args.epochs:
        kw["epochs"] = args.epochs
    if args.mechanism:
        kw["mechanisms"] = tuple(m.strip() for m in args.mechanism.split(","))
    if args.no_report:
        kw["report"] = False
    if args.threads is not None:
        from shortcutlab.sweep.threads import check_threads

        kw["threads"] = check_threads(args.threads)
    cfg = DemoConfig.quick(progress=not args.quiet, **kw) if args.quick else DemoConfig(progress=not args.quiet, **kw)
    _check_output_folder(args.out, "--out")
    summary = run_demo(args.out, cfg)
    print(f"leak/clean factorial on the synthetic benchmark{' (--quick)' if args.quick else ''} ({summary['minutes']} min)")
    for line in summary_lines(summary):
        print(line)
    print(f"tables in {args.out}: results.csv (one row per model), effects.csv, summary.json; the sweep in {os.path.join(args.out, 'sweep')}")
    if "report" in summary:
        print(f"report: {summary['report']}")
    return 0


#: what `shortcutlab siblings` writes in its --out folder
SIBLINGS_FILES = ("siblings.csv", "siblings.json", "contact_sheet.png")


def _is_legacy_siblings(out: str) -> bool:
    """A siblings folder written before output markers: its siblings.json is a summary."""
    return read_json_object(os.path.join(out, "siblings.json")) is not None


def cmd_siblings(args) -> int:
    from shortcutlab.io import claim_output_dir, write_marker
    from shortcutlab.data.siblings import DEFAULT_CONFIRM, SiblingError, run

    if args.pairs < 0:
        raise SiblingError(f"--pairs takes the number of pairs on the contact sheet, an integer >= 0; got {args.pairs}")
    if args.no_confirm and args.confirm is not None:
        raise SiblingError(f"give --confirm {args.confirm} or --no-confirm, not both")
    confirm = None if args.no_confirm else DEFAULT_CONFIRM if args.confirm is None else args.confirm
    _check_output_folder(args.out, "--out")
    claim_output_dir(args.out, "siblings", SIBLINGS_FILES, _is_legacy_siblings)
    import warnings

    from shortcutlab.errors import SplitWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SplitWarning)
        summary = run(args.train, args.test, args.out, threshold=args.threshold, ssim_min=args.ssim, image=args.image,
                      id=args.id, cell=args.cell, n_sheet=args.pairs, confirm=confirm)
    write_marker(args.out, "siblings", SIBLINGS_FILES)
    _print_warnings(caught, SplitWarning)
    how = "" if args.threshold is not None else " (default, chosen on synthetic augmentations)"
    print(f"{summary['n_with_sibling']} of {summary['n_test']} test images ({100 * summary['share']:.2f}%) have a training sibling "
          f"within {summary['threshold']} bits{how}" + (f" and SSIM >= {args.ssim}" if args.ssim is not None else "")
          + (f", confirmed by detail correlation >= {confirm}" if confirm is not None else ", unconfirmed (--no-confirm)")
          + (f" ({summary['n_hash_siblings']} hash candidates)" if summary["n_hash_siblings"] != summary["n_with_sibling"] else ""))
    print(f"wrote {os.path.join(args.out, 'siblings.csv')}, siblings.json, contact_sheet.png ({summary['seconds']} s)")
    return 0

# --- locate (issue 22): each crop found in the released field images ---------------------------
def _add_locate_command(sub) -> None:
    """`shortcutlab locate`: each crop's field (parent) and box, by template matching."""
    from shortcutlab.ingest.locate import DEFAULT_MIN_SCORE

    p = sub.add_parser("locate", help="find each crop in the released field images: parent, x, y, w, h, match score")
    p.add_argument("table", help="CSV file, one row per crop, with a crop image path column")
    p.add_argument("--fields", required=True, metavar="DIR", help="folder of field images (searched recursively; parent = file stem)")
    p.add_argument("--image", default="path", metavar="COL", help="crop image path column (default path)")
    p.add_argument("--id", metavar="COL", help="crop id column (default id when there is one, else the row number)")
    p.add_argument("--parent", metavar="COL", help="the table's own parent column to check against (default parent when there is one)")
    p.add_argument("--min-score", type=float, default=DEFAULT_MIN_SCORE, metavar="NCC",
                   help=f"normalised cross-correlation a crop must reach to be matched (default {DEFAULT_MIN_SCORE})")
    p.add_argument("--allow-unmatched", action="store_true", help="keep crops found in no field (empty parent) instead of failing")
    p.add_argument("--fallback", choices=("auto", "always", "never"), default="auto",
                   help="coarse-to-fine NCC over every field for crops the votes miss: auto (only low-texture crops; default), always, never")
    p.add_argument("--out", required=True, metavar="TABLE.csv", help="the located table; its summary goes beside it as TABLE.json")
    p.set_defaults(func=cmd_locate)


def cmd_locate(args) -> int:
    from shortcutlab.data.manifest import sidecar_path
    from shortcutlab.io import OutputError
    from shortcutlab.ingest.locate import locate, write_located

    if sidecar_path(args.out) == os.fspath(args.out):
        raise OutputError(f"--out {args.out!r} would be overwritten by its JSON sidecar; name the table *.csv")
    _check_output_files(args.table, [("--out", args.out), ("the sidecar of --out", sidecar_path(args.out))])
    frame, summary = locate(args.table, args.fields, image=args.image, id=args.id, parent=args.parent,
                            min_score=args.min_score, allow_unmatched=args.allow_unmatched, fallback=args.fallback)
    side = write_located(frame, summary, args.out)
    methods = ", ".join(f"{v} by {k}" for k, v in sorted(summary["n_by_method"].items()))
    print(f"located {summary['n_matched']} of {summary['n_crops']} crops in {summary['n_fields']} fields "
          f"at NCC >= {args.min_score} ({methods}; {summary['seconds']} s)")
    if summary["n_unmatched"]:
        print(f"  unmatched: {summary['n_unmatched']} (first: {', '.join(repr(u['id']) for u in summary['unmatched'][:5])})")
    if summary["n_ambiguous"]:
        print(f"  in two fields (column ambiguous): {summary['n_ambiguous']} "
              f"(first: {', '.join(repr(a['id']) for a in summary['ambiguous'][:5])})")
    a = summary["agreement"]
    if a is not None:
        share = "n/a" if a["share"] is None else f"{100 * a['share']:.1f}%"
        print(f"  table column {a['column']!r} agrees with the located parent for {a['n_agree']} of {a['n_compared']} crops ({share})")
        for d in a["first_disagreements"]:
            print(f"    row {d['row']} (id {d['id']!r}): table {d['table']!r}, located {d['located']!r}")
    print(f"wrote {args.out} and {side}")
    return 0


def _retrain_config(args):
    """The `TrainConfig` of `litmus` / `control`: their training flags (see `_add_retrain_options`)."""
    return _train_config(args, retrain=True)


def _retrain_inputs(args):
    """The table and split of `litmus` / `control`, after refusing an output folder that cannot
    be made (nothing is created: the output files are checked once the inputs are)."""
    from shortcutlab.data.manifest import SplitManifest
    from shortcutlab.data.images import load_manifest_table
    from shortcutlab.paths import need_file

    _check_output_folder(args.out, "--out")
    for path, what in ((args.manifest, "crop manifest"), (args.split, "split manifest")):
        need_file(path, what)
    table = load_manifest_table(args.manifest, id=args.id, label=args.label, parent=args.parent, image=args.image, mask=args.mask)
    return table, SplitManifest.read(args.split)


def _score_line(label: str, r: dict) -> str:
    verdict = "above chance" if r["above_chance"] else "not above chance"
    return (f"  {label:<14} {r['accuracy']:.4f}  chance {r['chance']:.4f}  binomial [{r['ci_low']:.3f}, {r['ci_high']:.3f}]  "
            f"parent-cluster [{r['cluster_ci_low']:.3f}, {r['cluster_ci_high']:.3f}]  n={r['n']} ({r['n_test_parents']} parents)  {verdict}")


def cmd_litmus(args) -> int:
    from shortcutlab.data.images import load_crops
    from shortcutlab.io import atomic_files, to_json
    from shortcutlab.studies.litmus import check_positions, check_size, check_split_sides, litmus

    positions = check_positions(args.positions)
    cfg = _retrain_config(args)
    table, split = _retrain_inputs(args)
    crops = load_crops(table)
    check_size(args.size, crops)
    check_split_sides(crops, split, args.cell, "the litmus test")
    _check_output_files(args.manifest, [("--out", os.path.join(args.out, n)) for n in ("litmus.csv", "litmus.json")])
    claim_output_files(args.out, ("litmus.csv", "litmus.json"), _json_of("litmus.json"))
    import warnings

    from shortcutlab.errors import SplitWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SplitWarning)  # printed below, from the result's notes
        res = litmus(crops, split, positions=positions, size=args.size, config=cfg, cell=args.cell, progress=not args.quiet)
    for n in res.notes:
        print(f"warning: {n}")
    frame = res.frame()
    print(f"litmus: {cfg.arch} trained on one {res.size} x {res.size} patch of the {res.crop_size[0]} x {res.crop_size[1]} crops per position "
          f"(split {split.protocol}, sha256 {split.hash[:16]}...); chance = {res.chance_rule}")
    for r in res.rows:
        cov = "" if r["cell_coverage"] != r["cell_coverage"] else f"  cell coverage {r['cell_coverage']:.3f}"
        print(_score_line(r["position"], r) + cov)
    with atomic_files() as stage:
        frame.to_csv(stage.path(os.path.join(args.out, "litmus.csv")), index=False)
        with open(stage.path(os.path.join(args.out, "litmus.json")), "w", encoding="utf-8") as f:
            f.write(to_json(res.to_dict()))
    register_output_files(args.out, ("litmus.csv", "litmus.json"))
    print(f"wrote {os.path.join(args.out, 'litmus.csv')} and litmus.json")
    return 0


def cmd_control(args) -> int:
    import warnings

    from shortcutlab.studies.control import ControlWarning, deleted_signal_control, empty_masks
    from shortcutlab.data.images import load_crops
    from shortcutlab.io import atomic_files, to_json
    from shortcutlab.studies.litmus import check_split_sides
    from shortcutlab.synth import ALL_CELLS_COLUMN

    cfg = _retrain_config(args)
    if args.delete == "cell" and args.dilate < 0:
        raise ShortcutlabError(f"--dilate takes a whole number of pixels >= 0; got {args.dilate}")
    note = None
    if args.mask is None:  # the all-cells masks where the manifest has them
        args.mask = "mask"
        if args.delete == "cell" and os.path.isfile(args.manifest):
            import pandas as pd

            try:
                columns = set(pd.read_csv(args.manifest, nrows=0).columns)
            except (ValueError, UnicodeDecodeError):
                columns = set()  # the table reader names the problem
            if ALL_CELLS_COLUMN in columns:
                args.mask = ALL_CELLS_COLUMN
                note = f"masks: column {ALL_CELLS_COLUMN!r} (every cell in the crop; --mask mask deletes the centred cell only)"
    table, split = _retrain_inputs(args)
    if args.delete == "cell" and "mask" not in table.frame.columns:
        raise ShortcutlabError(f"--delete cell needs cell masks, but crop manifest {args.manifest!r} has no mask column {args.mask!r} (--mask COL); or use --delete labels")
    if note:
        print(note)
    crops = load_crops(table)
    side = check_split_sides(crops, split, args.cell, "the deleted-signal control")
    if args.delete == "cell":
        empty_masks(crops, side, args.mask)  # every mask empty: refused before any output
    _check_output_files(args.manifest, [("--out", os.path.join(args.out, n)) for n in ("control.csv", "control.json")])
    claim_output_files(args.out, ("control.csv", "control.json"), _json_of("control.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ControlWarning)  # printed below, from the result's notes
        res = deleted_signal_control(crops, split, delete=args.delete, config=cfg, cell=args.cell, fill=args.fill, dilate=args.dilate,
                                     seed=args.control_seed, progress=not args.quiet, mask_name=args.mask if args.delete == "cell" else None)
    for n in res.notes:
        print(f"{'note' if args.delete == 'labels' else 'warning'}: {n}")
    how = f"cells deleted (mask column {args.mask!r}, fill {args.fill}, dilated {args.dilate} px)" if args.delete == "cell" else "labels permuted within parent"
    print(f"deleted-signal control: {how}; {cfg.arch} retrained under the given split and a parent split; chance = {res.chance_rule}")
    for r in res.rows:
        print(_score_line(f"{r['split']} ({r['protocol']})", r))
    print(f"verdict ({res.verdict}): {res.comparison['reading']}")
    with atomic_files() as stage:
        res.frame().to_csv(stage.path(os.path.join(args.out, "control.csv")), index=False)
        with open(stage.path(os.path.join(args.out, "control.json")), "w", encoding="utf-8") as f:
            f.write(to_json(res.to_dict()))
    register_output_files(args.out, ("control.csv", "control.json"))
    print(f"wrote {os.path.join(args.out, 'control.csv')} and control.json")
    return 0


def _diagnose_params(items: list[str]) -> dict[str, dict]:
    """--param DIAGNOSTIC.KEY=VALUE options as {diagnostic: {key: value}}."""
    out: dict[str, dict] = {}
    for key, value in _key_values(items, "--param").items():
        diag, dot, name = key.partition(".")
        if not dot or not diag or not name:
            raise ShortcutlabError(f"--param takes DIAGNOSTIC.KEY=VALUE (e.g. leace.ranks=[8,64]); got {key!r}")
        out.setdefault(diag, {})[name] = value
    return out


def _diagnose_listing() -> str:
    """`diagnose --list`: each registered diagnostic, what it needs, and its settings with
    their defaults as --param takes them (JSON values)."""
    import inspect
    import json

    import probes.registry as reg

    def value(v) -> str:
        if v is inspect.Parameter.empty:
            return "(required)"
        try:
            return json.dumps(list(v) if isinstance(v, tuple) else v)
        except TypeError:
            return repr(v)

    lines = []
    for d in reg.describe():
        lines.append(f"{d['name']}  (needs: {', '.join(d['needs']) or 'nothing'})  {d['summary']}")
        lines += [f"    {d['name']}.{k}={value(v)}" for k, v in d["settings"].items()]
    lines.append("set one with --param DIAGNOSTIC.KEY=VALUE (VALUE read as JSON), e.g. --param leace.ranks=[8,64]")
    return "\n".join(lines)


def cmd_diagnose(args) -> int:
    import time

    import probes

    from shortcutlab.models.runs import Run, load_run, load_run_data, read_record

    if args.list:
        print(_diagnose_listing())
        return 0
    if not args.run:
        raise ShortcutlabError("diagnose needs a RUN folder (written by `shortcutlab train`); or --list to list the diagnostics")
    only = [s.strip() for s in args.only.split(",") if s.strip()] if args.only else None
    params = _diagnose_params(args.param)
    for name in (only or []) + list(params):
        probes.get_class(name)  # an unknown name lists the close matches, before any work
    from shortcutlab.models.devices import resolve_device

    resolve_device(args.device)  # as train and sweep: a device that is not here is named before any work
    out_dir = args.out or args.run
    if not args.arch:
        read_record(args.run)  # a folder that is no run is named before anything is created
    # a user's table where ours would go is named before any work (this reads, creates nothing)
    claim_output_files(out_dir, ("diagnostics.csv", "diagnostics.json"), _json_of("diagnostics.json"))
    if args.arch:
        if not args.weights or not args.classes:
            raise ShortcutlabError("--arch needs --weights FILE and --classes A,B,... (in the model's logit order)")
        classes = [c.strip() for c in args.classes.split(",")]
        run = Run.from_weights(args.arch, args.weights, classes, path=os.path.abspath(args.run), run_id=args.run_id, device=args.device)
    else:
        run = load_run(args.run, device=args.device)
    # the model is built first: weights that cannot be loaded are named before --out is made
    _check_output_files(None, [("--out", os.path.join(out_dir, "diagnostics.csv")), ("--out", os.path.join(out_dir, "diagnostics.json"))])
    crops, split, side = load_run_data(run, args.manifest, args.split, args.cell)
    targets = probes.intervention_targets(crops, split, seed=args.seed) if args.unseen_field_targets else None
    log: list = []
    t0 = time.perf_counter()
    rows = probes.diagnose(
        run.adapter, crops, side, only=only, params=params, run_id=args.run_id or run.run_id, batch_size=args.batch_size,
        seed=args.seed, cache_dir=os.path.join(out_dir, ".features") if args.cache else None, progress=not args.quiet,
        targets=targets, preprocess=run.preprocess, log=log,
    )
    rows["split_sha256"] = split.hash
    meta = {"run": run.path, "run_id": args.run_id or run.run_id, "split_sha256": split.hash, "cell": run.record.get("cell"),
            "diagnostics": log, "params": params, "seed": args.seed, "seconds": round(time.perf_counter() - t0, 2)}
    paths = probes.write_diagnostics(out_dir, rows, meta)
    register_output_files(out_dir, ("diagnostics.csv", "diagnostics.json"))
    for entry in log:
        if entry["status"] != "ok":
            print(f"  {entry['diagnostic']}: {entry['status']} ({entry['reason']})")
    shown = rows[rows["metric"].isin(["accuracy", "R", "floor", "R_after", "removed_share", "outside_mass", "randomized_head_spearman", "check_passed"])]
    for r in shown.itertuples():
        ci = "" if _isnan(r.ci_low) else f"  [{r.ci_low:.3f}, {r.ci_high:.3f}]"
        print(f"  {r.diagnostic:<22} {r.setting:<38} {r.metric:<26} {r.value:8.4f}{ci}  n={r.n}")
    print(f"wrote {paths['csv']} ({len(rows)} rows) and {paths['json']}")
    return 0


def _sweep_limits(items) -> dict:
    """--limit NAME=N (repeatable) as a mapping; names and values are checked by load_config."""
    out = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = int(value.replace("_", "").replace(",", ""))
        except ValueError:
            sep = ""
        if not sep:
            raise ShortcutlabError(f"--limit takes NAME=N with N a positive integer (e.g. --limit tasks=200000); got {item!r}")
    return out


#: `sweep` options handed to the executor, by the executor option each one sets.
_EXECUTOR_FLAGS = {"workers": "--workers", "address": "--address"}


def _executor_flag_help(option: str) -> str:
    """'for --executor NAME' naming the registered executors that take `option`."""
    from shortcutlab.sweep import executors

    owners = [n for n in executors.available() if option in executors.options(n)]
    return f"for --executor {' or '.join(owners) or '(none registered)'}"


def _sweep_executor(args):
    """The executor of `sweep`: the registered one named by --executor, made with the options
    given for it (--workers, --address); one it does not take is refused, naming those that do."""
    from shortcutlab.sweep import executors

    takes = executors.options(args.executor)
    opts = {}
    for option, flag in _EXECUTOR_FLAGS.items():
        value = getattr(args, option)
        if value is None:
            continue
        if option not in takes:
            raise ShortcutlabError(f"{flag} is {_executor_flag_help(option)}")
        opts[option] = value
    return executors.get_executor(args.executor, **opts)


def cmd_sweep(args) -> int:
    from shortcutlab.sweep.config import load_config
    from shortcutlab.sweep.runner import run_sweep

    limits = _sweep_limits(args.limit)
    cfg = load_config(args.config, limits=limits)
    if args.device:
        from shortcutlab.sweep.config import validate

        raw = dict(cfg.raw, device=args.device)
        cfg = validate(raw, source=cfg.source, base_dir=os.path.dirname(os.path.abspath(args.config)), limits=limits)
    if args.workers is not None and args.workers < 1:
        raise ShortcutlabError(f"--workers must be a positive integer; got {args.workers}")
    from shortcutlab.sweep.threads import check_threads

    check_threads(args.threads)
    registration = None
    if args.registration:  # checked before anything is written (a dry run too)
        from shortcutlab.sweep.registration import check_registration

        registration = check_registration(cfg, args.registration, config_path=args.config, sweep_dir=args.out)
    if args.dry_run:
        if registration:
            print(f"the sweep matches its registration {args.registration}")
        summary = run_sweep(cfg, args.out, dry_run=True)
        for t in summary["tasks"]:
            print(f"  {'done' if t['done'] else '    '}  {t['kind']:<10} {t['id']}  {t['params']}")
        print("tasks: " + ", ".join(f"{k} {n} ({summary['done_before'][k]} done)" for k, n in summary["counts"].items())
              + f"; {summary['n_tasks']} in all, {summary['n_models']} models")
        for dev, n in summary["other_devices"].items():
            print(f"note: {n} model(s) in {args.out} were trained with device {dev!r}; with device {cfg.device!r} they are trained "
                  "again (the device is part of a train task's id: results can differ across devices)")
        return 0
    _check_output_folder(args.out, "--out")
    summary = run_sweep(cfg, args.out, _sweep_executor(args), progress=not args.quiet, registration=registration,
                        threads=args.threads)
    ran = summary["n_tasks"] - sum(summary["done_before"].values())
    th = summary.get("threads") or {}
    threads = "" if not th else f", {th['per_task']} torch thread(s) per task" + (
        f" ({th['total']} shared by {th['workers']} worker(s))" if th["total"] is not None else "")
    print(f"sweep: {summary['n_tasks']} tasks ({ran} run now, {summary['n_tasks'] - ran} already done), "
          f"{summary['n_models']} models, {summary['seconds']:.1f} s{threads}")
    from shortcutlab.sweep.folder import SweepLayout

    print(f"wrote {SweepLayout(args.out).table('predictions')} (.csv), results.parquet (.csv), splits.json, sweep.json"
          + (", registration.json (the sweep matched its registration)" if registration else ""))
    return 0


def cmd_register(args) -> int:
    """`shortcutlab register`: hash what the sweep of a config fixes before any model is trained."""
    from shortcutlab.sweep.registration import register

    rec = register(args.config, args.out, limits=_sweep_limits(args.limit), device=args.device)
    a = rec["analysis"]["settings"]
    print(f"registered {args.config}: {len(rec['splits'])} split manifest(s), {rec['design']['n_tasks']} planned tasks, "
          f"analysis n_boot={a['n_boot']} seed={a['seed']} level={a['level']} interval={a['interval']} alpha={a['alpha']}, "
          f"shortcutlab {rec['code']['version']} ({rec['code']['source']['n_files']} source files)")
    print(f"wrote {args.out}; run the sweep with `shortcutlab sweep {args.config} --out DIR --registration {args.out}`")
    return 0


def cmd_results(args) -> int:
    import warnings

    from shortcutlab.warnings_summary import summary_lines

    from shortcutlab.stats import StatsWarning
    from shortcutlab.sweep.runner import estimates_table, results_table

    from shortcutlab.sweep.registration import registration_statement, sweep_analysis

    if args.n_boot is not None and args.n_boot < 0:
        raise ShortcutlabError(f"--n-boot takes a number of resamples >= 0; got {args.n_boot}")
    accuracy = results_table(args.dir)
    # a flag given overrides the config's analysis: (an --interval option, where there is one, too)
    settings = sweep_analysis(args.dir, n_boot=args.n_boot, seed=args.seed, interval=getattr(args, "interval", None))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StatsWarning)
        table = estimates_table(args.dir, analysis=settings)
        if args.sensitivity:
            from shortcutlab.stats.sensitivity import sensitivity_summary, sensitivity_table
            from shortcutlab.sweep.runner import read_predictions

            sens = sensitivity_table(read_predictions(args.dir), mixed_model=args.mixed_model, seed=settings["seed"])
            summary = sensitivity_summary(sens, table)
    with _pd_display():
        print("accuracy (mean over models)")
        print(accuracy.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        print()
        print("registered tests (the paper's Table 2; p_holm: Holm within the registered family"
              + ("; the sign-flip, t and GLMM p-values beside them are described below)" if args.sensitivity else ")"))
        print(_registered_text(table, summary if args.sensitivity else None))
        print()
        print(f"estimates (percentage points; {settings['level'] * 100:g}% two-way cluster bootstrap over seeds and test parents, "
              f"{settings['n_boot']} resamples, seed {settings['seed']}"
              + (", settings from the config's analysis section" if settings["from_config"] else "")
              + f", {INTERVAL_TEXT.get(settings.get('interval') or 'cgm', settings.get('interval'))}; "
              "p_holm: Holm within the family)")
        print(_estimates_text(table))
        if args.sensitivity:
            print()
            print(_sensitivity_text(summary, args.mixed_model))
    print(registration_statement(args.dir))
    for line in summary_lines(caught, prefix="note", category=False):
        print(line)
    return 0


def _sensitivity_text(summary, mixed_model: bool) -> str:
    """The sensitivity analyses beside each primary estimate (`shortcutlab.stats.sensitivity`),
    one row each: the estimate in pp, the bootstrap p, the sign-flip p, t (df) and its p, the
    binomial mixed model's log-odds and p, and why an analysis has no result."""
    import numpy as np

    head = ("sensitivity analyses (estimate in pp; p_boot: the primary bootstrap; sign-flip over seeds; t on per-seed "
            "differences; GLMM: binomial mixed model, crossed seed and parent intercepts, log-odds)")
    if summary.empty:
        return head + "\n(no primary estimate: no factorial and no protocol pair)"
    t = summary.copy()
    t["estimate"] = [f"{100 * v:+.2f}" if np.isfinite(v) else "nan" for v in t["estimate"]]
    for c in ("p_bootstrap", "p_sign_flip", "p_t", "p_glmm"):
        t[c] = [f"{v:.4f}" if np.isfinite(v) else "" for v in t[c]]
    t["t"] = [f"{v:+.2f}" if np.isfinite(v) else "" for v in t["t"]]
    t["df"] = [f"{v:.1f}" if np.isfinite(v) else "" for v in t["df"]]
    t["glmm_log_odds"] = [f"{v:+.3f}" if np.isfinite(v) else "" for v in t["glmm_log_odds"]]
    if not mixed_model:
        t = t.drop(columns=["glmm_log_odds", "p_glmm"])
    return head + "\n" + t.rename(columns={"p_bootstrap": "p_boot"}).to_string(index=False)


def _estimates_text(table) -> str:
    """The estimates table for a terminal: each estimand in its registered unit
    (`shortcutlab.stats.estimand_units`): 'pp' in percentage points and 'share' in % (x 100),
    any other unit as is (the slope, a plug-in's count); unregistered estimands as pp."""
    import numpy as np

    from shortcutlab.stats import estimand_units

    if table.empty:
        return "(no estimates: the sweep has no factorial and no protocol pair)"
    t = table.copy()
    units = estimand_units(t)
    percent = t["estimand"].map(lambda e: units.get(e, "pp") in ("pp", "share")).to_numpy(bool)
    for c in ("estimate", "ci_low", "ci_high"):
        t[c] = np.where(percent, 100 * t[c], t[c])
    t["ci"] = [f"[{lo:+.1f}, {hi:+.1f}]" if np.isfinite(lo) else "" for lo, hi in zip(t["ci_low"], t["ci_high"])]
    t["estimate"] = [f"{v:+.1f}" if np.isfinite(v) else "nan" for v in t["estimate"]]
    for c in ("p_value", "p_holm"):
        t[c] = [f"{v:.4f}" if np.isfinite(v) else "" for v in t[c]]
    cols = ["hypothesis", "estimand", "family", "condition", "arch", "diversity", "intervention", "estimate", "ci", "p_value", "p_holm",
            "n_seeds", "n_parents", "reason"]
    return t[[c for c in cols if c in t.columns]].to_string(index=False)


def _registered_text(table, sensitivity=None) -> str:
    """The registered tests (`shortcutlab.report.tables.registered_table`) for a terminal, with
    the sensitivity p-values where `sensitivity` (a `sensitivity_summary`) is given."""
    from shortcutlab.report.tables import registered_table

    reg = registered_table(table, sensitivity=sensitivity)
    if reg.empty:
        return "(none: no estimate tests a registered hypothesis)"
    return reg.to_string(index=False)


def _pd_display():
    import pandas as pd

    return pd.option_context("display.width", 200, "display.max_rows", 10000, "display.max_columns", 50)


def cmd_report(args) -> int:
    from shortcutlab.report import build_report

    from shortcutlab.sweep.registration import sweep_analysis

    if args.n_boot is not None and args.n_boot < 0:
        raise ShortcutlabError(f"--n-boot takes a number of resamples >= 0; got {args.n_boot}")
    settings = (sweep_analysis(args.dir, n_boot=args.n_boot, seed=args.seed, interval=getattr(args, "interval", None))
                if os.path.isdir(args.dir) else {})
    if not settings.get("from_config"):  # the report's own defaults (fewer resamples than `results`)
        settings = None
    paths = build_report(args.dir, args.out, n_boot=2000 if args.n_boot is None else args.n_boot, seed=args.seed or 0,
                         examples=not args.no_examples, device=args.device, analysis=settings,
                         interval=args.interval or "cgm")
    print(paths["html"])
    return 0


def _isnan(v) -> bool:
    import math

    return v is None or (isinstance(v, float) and math.isnan(v))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `shortcutlab` command line: one sub-command per `_add_*_command` below, in this order.

    With `only` (a sub-command's name) just that sub-command is added: building every one
    imports what their options list (the split protocols, pandas with them; the training
    settings; the executors), which a command such as `siblings` never needs.
    """
    from shortcutlab.version import __version__

    parser = argparse.ArgumentParser(prog="shortcutlab", description="Audit and split crop tables for acquisition-sibling leakage.")
    parser.add_argument("--version", action="version", version=f"shortcutlab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _COMMANDS:
        if only is None or add.__name__ == f"_add_{only}_command":
            add(sub)
    return parser


def _command_named(argv: list[str]) -> str | None:
    """The sub-command `argv` starts with when it names one, else None (then every sub-command
    is built, for the full help or argparse's error)."""
    if argv and any(add.__name__ == f"_add_{argv[0]}_command" for add in _COMMANDS):
        return argv[0]
    return None


def _add_audit_command(sub) -> None:
    """`shortcutlab audit`: the exposure closed forms of a table and the figures of a split."""
    a = sub.add_parser("audit", help="exposure closed forms of a table, and figures measured on a split")
    _add_table_options(a)
    a.add_argument("--split", metavar="MANIFEST", help="manifest CSV to measure")
    a.add_argument("--cell", help="one cell of a multi-cell manifest (default: all)")
    a.add_argument("--test-fraction", type=float, default=0.2, metavar="Q", help="q for the closed forms (default 0.2)")
    a.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    a.add_argument("--card", metavar="OUT.md", help="write a Markdown reporting card")
    a.add_argument("--augmentation-order", choices=("split-then-augment", "augment-then-split", "no-augmentation"),
                   help="declare where augmentation sat relative to the split, for the card (reference 002)")
    a.add_argument("--no-pixel-siblings", action="store_true",
                   help="skip the pixel-sibling share (measured on the --image files when a split is given)")
    _add_engine_options(a)
    a.set_defaults(func=cmd_audit)


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    from shortcutlab.data.engines import available

    g = p.add_argument_group("engine (tables larger than memory)")
    g.add_argument("--engine", choices=available(), help="where to compute: duckdb reads the table (Parquet file, folder or glob, "
                   "or CSV) out of core; ray runs on a Ray cluster (Parquet), partitioned by parent; with an engine, split writes --out as a folder of Parquet files (default: in memory, CSV)")
    g.add_argument("--memory-limit", metavar="SIZE", help="duckdb: memory limit, e.g. 2GB (default 2GB); beyond it sorts spill to disk")
    g.add_argument("--threads", type=int, metavar="N", help="duckdb: threads (default: the cores available); ray: CPUs of a local Ray")
    g.add_argument("--ray-address", metavar="ADDR", help="ray: the cluster to run on, 'auto' or HOST:PORT (default: $RAY_ADDRESS, "
                   "else a local Ray started for the command)")


def _add_split_command(sub) -> None:
    """`shortcutlab split`: a split manifest built by a protocol."""
    from shortcutlab.data.splits import available_protocols

    s = sub.add_parser("split", help="build a split manifest with a protocol")
    _add_table_options(s)
    s.add_argument("--protocol", required=True, choices=available_protocols())
    s.add_argument("--test-fraction", type=float, default=0.2, metavar="Q")
    s.add_argument("--val-fraction", type=float, default=0.0, metavar="V")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", required=True, metavar="MANIFEST.csv")
    s.add_argument("--unit", choices=("parent", "group"), help="split unit for parent/parent-dedup (default: group when --group is given)")
    s.add_argument("--max-distance", type=int, default=4, help="parent-dedup: Hamming threshold in bits (default 4)")
    s.add_argument("--invariant", action="store_true", help="parent-dedup: link crops under flips and right-angle rotations too (hashes the --image files)")
    s.add_argument("--test-parent-share", type=float, default=0.3, help="factorial: share of multi-crop parents giving half their crops to test")
    s.add_argument("--diversity-contrast", type=float, default=1.43, help="factorial: parents in the high over the low level")
    s.add_argument("--reserve-parent-share", type=float, default=0.0, metavar="R",
                   help="factorial: share of non-test parents kept out of every cell (unseen fields for F2 colour transfer)")
    s.add_argument("--n-per-class", type=int, help="factorial: training crops per class, of the largest class with proportional allocation (default: the most every cell allows)")
    s.add_argument("--allocation", choices=("balanced", "proportional"), default="balanced", help="factorial: equal crops per class (default) or the table's class shares")
    s.add_argument("--levels", help="ladder: comma-separated crossing shares (default 0,0.25,0.5,0.75,1)")
    _add_engine_options(s)
    s.set_defaults(func=cmd_split)


def _add_synth_command(sub) -> None:
    """`shortcutlab synth`: the synthetic benchmark."""
    y = sub.add_parser("synth", help="write the synthetic cytology benchmark (crops from fields with planted acquisition signatures)")
    y.add_argument("--out", required=True, metavar="DIR", help="output folder (new, or one holding an earlier benchmark)")
    y.add_argument("--seed", type=int, help="random seed (default 0)")
    y.add_argument(
        "--mechanism",
        metavar="NAME[=X][,NAME[=X]...]",
        help="acquisition mechanisms planted per field, each optionally with its own strength factor: "
        "color, illumination, background, focus, noise; or 'none' (default: all five)",
    )
    y.add_argument("--strength", type=float, metavar="X", help="multiplier of every mechanism's magnitude (default 1)")
    y.add_argument("--fields-per-class", type=int, metavar="N", help="fields whose dominant class is each class (default 50)")
    y.add_argument("--cells-per-field", type=float, metavar="M", help="mean cells (crops) per field, 2 + Poisson (default 6)")
    y.add_argument("--crop-size", type=int, metavar="PX", help="crop side in pixels (default 64)")
    y.add_argument("--field-size", type=int, metavar="PX", help="field side in pixels (default 3 x crop size)")
    y.add_argument("--n-classes", type=int, metavar="K", help="number of classes (default 3)")
    y.add_argument("--class-signal", type=float, metavar="X", help="class separation in [0, 1] (default 0.6)")
    y.add_argument("--illumination-shading", type=float, metavar="X",
                   help="illumination gradient and vignetting relative to its gain (default 1; 0: one uniform gain per field)")
    y.add_argument("--mixed-fields", action="store_true", help="CRIC-like fields mixing classes (default: one class per field)")
    y.add_argument("--compress-level", type=int, default=0, metavar="L", help="zlib level of the crop PNGs, 0 (stored, fastest; default) to 9")
    y.set_defaults(func=cmd_synth)


def _add_train_command(sub) -> None:
    """`shortcutlab train`: one run of the recipe; the training flags come from `TrainConfig`."""
    t = sub.add_parser("train", help="train one model on a split with the paper's recipe")
    t.add_argument("--manifest", required=True, help="crop manifest CSV (as written by `shortcutlab synth`)")
    t.add_argument("--split", required=True, metavar="SPLIT.csv", help="split manifest from `shortcutlab split`")
    t.add_argument("--cell", help="cell of a multi-cell split (factorial, ladder)")
    _add_train_settings(t)
    t.add_argument("--out", required=True, metavar="RUN_DIR")
    t.add_argument("--quiet", action="store_true", help="no progress bars")
    for flag, default in (("--id", "id"), ("--label", "label"), ("--parent", "parent"), ("--image", "path"), ("--mask", "mask")):
        t.add_argument(flag, default=default, help=f"manifest column (default {default})")
    t.set_defaults(func=cmd_train)


def _add_demo_command(sub) -> None:
    """`shortcutlab demo`: the leak/clean factorial on the synthetic benchmark."""
    d = sub.add_parser("demo", help="the leak/clean factorial on the synthetic benchmark, planted mechanism vs none")
    d.add_argument("--out", default="shortcutlab-demo", help="output folder (default shortcutlab-demo)")
    d.add_argument("--seeds", help="comma-separated seeds (default 0)")
    d.add_argument("--epochs", type=int, help="training epochs per model")
    d.add_argument("--mechanism", help="planted mechanisms, comma-separated (default all five; color with --quick)")
    d.add_argument("--quick", action="store_true", help="the small demo: color vs none, 4 seeds, 2 cells, 12 epochs (about a minute on 2 cores)")
    d.add_argument("--no-report", action="store_true", help="skip the HTML report")
    d.add_argument("--threads", type=int, metavar="N", help="torch threads (default: OMP_NUM_THREADS where set, else the cores available "
                   "to this process; 1 with --quick, faster on a shared machine); recorded in each run.json")
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(func=cmd_demo)


def _add_diagnose_command(sub) -> None:
    """`shortcutlab diagnose`: the registered diagnostics on a trained run."""
    d = sub.add_parser("diagnose", help="run the probes, saliency and intervention diagnostics on a trained run")
    d.add_argument("run", nargs="?", help="run folder written by `shortcutlab train` (or, with --arch, where to write)")
    d.add_argument("--list", action="store_true", help="list the registered diagnostics and their settings (defaults), then exit")
    d.add_argument("--manifest", help="crop manifest CSV (default: the one run.json records)")
    d.add_argument("--split", help="split manifest CSV (default: the one run.json records)")
    d.add_argument("--cell", help="cell of a multi-cell split (default: the run's)")
    d.add_argument("--only", help="comma-separated diagnostics to run (default: all; see --list)")
    d.add_argument("--param", action="append", default=[], metavar="DIAG.KEY=VALUE", help="a diagnostic's setting, e.g. leace.ranks=[8,64] (repeatable)")
    d.add_argument("--unseen-field-targets", action="store_true", help="give every intervention that declares per-crop targets (targets_for; reinhard_unseen_field, F2) its targets from the split")
    d.add_argument("--arch", help="timm architecture of a model trained elsewhere (with --weights and --classes)")
    d.add_argument("--weights", help="local weight file for --arch")
    d.add_argument("--classes", help="class names in logit order, comma-separated, for --arch")
    d.add_argument("--run-id", help="name of the model in the rows (default: the run folder)")
    d.add_argument("--out", help="folder for diagnostics.csv and diagnostics.json (default: the run folder)")
    d.add_argument("--batch-size", type=int, default=256)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--device", default="cpu")
    d.add_argument("--no-cache", dest="cache", action="store_false", help="do not cache features on disk (OUT/.features)")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    d.set_defaults(func=cmd_diagnose)


def _add_siblings_command(sub) -> None:
    """`shortcutlab siblings`: pixel siblings between training and test images."""
    b = sub.add_parser("siblings", help="share of test images that are flipped/rotated/re-exposed copies of training images (no parent labels)")
    b.add_argument("train", help="training images: a folder, a crop manifest CSV, or a split manifest CSV (then TEST is its crop manifest)")
    b.add_argument("test", nargs="?", help="test images: a folder or a crop manifest CSV (or the crop manifest of a split manifest)")
    b.add_argument("--out", default="siblings", metavar="DIR", help="folder for siblings.csv, siblings.json, contact_sheet.png (default siblings)")
    b.add_argument("--threshold", type=int, metavar="BITS", help="Hamming threshold of the 64-bit pHash (default: chosen on synthetic augmentations, 6)")
    b.add_argument("--ssim", type=float, metavar="MIN", help="confirm each sibling by the SSIM of the aligned pair (e.g. 0.7)")
    b.add_argument("--confirm", type=float, metavar="MIN", help="a hash candidate counts when the correlation of the aligned pair's "
                   "detail band reaches MIN (default 0.97: flips, rotations, re-exposure and JPEG re-encoding pass, look-alike distinct crops do not)")
    b.add_argument("--no-confirm", action="store_true", help="count every hash candidate (also heavily blurred copies, "
                   "and look-alike distinct crops)")
    b.add_argument("--image", default="path", help="image column of crop manifests (default path)")
    b.add_argument("--id", default="id", help="id column of crop manifests (default id)")
    b.add_argument("--cell", help="cell of a multi-cell split manifest")
    b.add_argument("--pairs", type=int, default=24, help="pairs on the contact sheet (default 24)")
    b.set_defaults(func=cmd_siblings)


def _add_sweep_command(sub) -> None:
    """`shortcutlab sweep`: a grid from a YAML config."""
    w = sub.add_parser("sweep", help="run a grid of benchmarks, splits, models, interventions and diagnostics from a YAML config")
    w.add_argument("config", metavar="CONFIG.yaml")
    w.add_argument("--out", required=True, metavar="DIR", help="sweep folder (a sweep started again there resumes)")
    w.add_argument("--dry-run", action="store_true", help="print the tasks and their counts (done ones marked); run nothing")
    from shortcutlab.sweep import executors  # the choices are the registered executors

    w.add_argument("--workers", type=int, metavar="N", help=f"{_executor_flag_help('workers')}: processes running tasks (default 1: in this process)")
    w.add_argument("--executor", choices=executors.available(), default=executors.DEFAULT_EXECUTOR,
                   help=f"what runs the tasks (default {executors.DEFAULT_EXECUTOR})")
    w.add_argument("--address", help=f"{_executor_flag_help('address')}: cluster address (default: a local instance)")
    w.add_argument("--device", help="override the config's device (cpu, cuda, cuda:1, mps)")
    w.add_argument("--threads", type=int, metavar="N", help="torch threads of the whole sweep, shared among the --workers "
                   "(each task gets N // workers, at least 1; default: the config's threads, else OMP_NUM_THREADS where "
                   "set, else the cores available); "
                   "with --executor ray, the threads each task reserves and runs on (default 1)")
    w.add_argument("--quiet", action="store_true", help="no progress bar")
    w.add_argument("--limit", action="append", metavar="NAME=N",
                   help="raise or lower a cap: tasks (default 100000), seeds (10000), bytes (2000000), scalar (100000), depth (50)")
    w.add_argument("--registration", metavar="FILE",
                   help="a file of `shortcutlab register`: refuse to start (writing nothing) if the config, a split manifest, "
                        "the design, the analysis settings or the code differ from it, naming what")
    w.set_defaults(func=cmd_sweep)


def _add_register_command(sub) -> None:
    """`shortcutlab register`: the registration of a sweep, before any model is trained."""
    r = sub.add_parser("register", help="hash a sweep's config, split manifests, design, analysis settings and code "
                                        "before any model is trained")
    r.add_argument("config", metavar="CONFIG.yaml")
    r.add_argument("--out", required=True, metavar="REGISTRATION.json", help="the registration file (JSON)")
    r.add_argument("--limit", action="append", metavar="NAME=N", help="raise or lower a cap, as for `sweep`")
    r.add_argument("--device", help="override the config's device, as `sweep --device` will (it is part of the design)")
    r.set_defaults(func=cmd_register)


def _add_results_command(sub) -> None:
    """`shortcutlab results`: the estimates table of a sweep folder."""
    r = sub.add_parser("results", help="print the estimates table of a sweep folder")
    r.add_argument("dir", metavar="DIR")
    r.add_argument("--n-boot", type=int, help="bootstrap resamples (default: the config's analysis.n_boot, else 10000)")
    r.add_argument("--seed", type=int, help="seed of the bootstrap draws (default: the config's analysis.seed, else 0)")
    _add_interval_option(r)
    r.add_argument("--no-sensitivity", dest="sensitivity", action="store_false",
                   help="leave out the sensitivity analyses (sign-flip, per-seed t, binomial mixed model)")
    r.add_argument("--no-mixed-model", dest="mixed_model", action="store_false",
                   help="leave out the binomial mixed model of the sensitivity analyses (the slowest)")
    r.set_defaults(func=cmd_results)


#: How `results` names each interval method (`shortcutlab.stats.bootstrap.INTERVAL_METHODS`).
INTERVAL_TEXT = {"cgm": "Cameron-Gelbach-Miller two-way intervals",
                 "pigeonhole": "pigeonhole percentile intervals, conservative"}


def _add_interval_option(r) -> None:
    """--interval: the interval method of the estimates."""
    r.add_argument("--interval", choices=sorted(INTERVAL_TEXT), default=None,
                   help="interval method: cgm (Cameron-Gelbach-Miller two-way clustering, calibrated) or pigeonhole "
                        "(seeds and parents resampled independently, percentile; conservative); default: the "
                        "config's analysis.interval, else cgm")


def _add_report_command(sub) -> None:
    """`shortcutlab report`: the HTML and Markdown report of a sweep folder."""
    r = sub.add_parser("report", help="one self-contained HTML report (and a Markdown twin) over a sweep folder")
    r.add_argument("dir", help="sweep folder written by `shortcutlab sweep`")
    r.add_argument("--out", help="report folder (default DIR/report; replaced whole)")
    r.add_argument("--n-boot", type=int, help="bootstrap resamples of the estimates (default: the config's analysis.n_boot, "
                                             "else 2000)")
    r.add_argument("--seed", type=int, help="seed of the resampling (default: the config's analysis.seed, else 0)")
    _add_interval_option(r)
    r.add_argument("--no-examples", action="store_true", help="leave out the example crops (no model is loaded)")
    r.add_argument("--device", default="cpu", help="where the example crops' models run")
    r.set_defaults(func=cmd_report)


def _add_litmus_command(sub) -> None:
    """`shortcutlab litmus`: reference 004's corner-patch test."""
    lt = sub.add_parser("litmus", help="reference 004's corner-patch test: train on one fixed patch per position, accuracy against chance")
    _add_retrain_options(lt, "litmus.csv and litmus.json")
    lt.add_argument("--positions", default="top_left,top_right,bottom_left,bottom_right,centre", help="comma-separated patch positions (default all five)")
    lt.add_argument("--size", type=int, default=20, metavar="PX", help="patch side in pixels (default 20, as reference 004)")
    lt.set_defaults(func=cmd_litmus)


def _add_control_command(sub) -> None:
    """`shortcutlab control`: reference 003's deleted-signal control."""
    c = sub.add_parser("control", help="reference 003's deleted-signal control: retrain without the cell (or with labels permuted within parent) under the split and a parent split")
    _add_retrain_options(c, "control.csv and control.json",
                    mask_help="mask column of the cells to delete; it should cover every cell in the crop (default: all_cells_mask "
                              "where the manifest has it, as `shortcutlab synth` writes, else mask)")
    c.set_defaults(mask=None)
    c.add_argument("--delete", required=True, choices=("cell", "labels"), help="cell: remove the cell under its mask; labels: permute the classes within each parent")
    c.add_argument("--fill", default="noise", choices=("noise", "mean", "constant"),
                   help="--delete cell: what replaces the cell: the crop's background mean and grain (default), its mean colour, or the recipe's grey")
    c.add_argument("--dilate", type=int, default=2, metavar="PX", help="--delete cell: grow the mask by PX pixels first (default 2)")
    c.add_argument("--control-seed", type=int, help="seed of the permutations, the noise and the parent split (default: the split's seed)")
    c.set_defaults(func=cmd_control)


def _add_verify_command(sub) -> None:
    """`shortcutlab verify`: a manifest against its registered hash."""
    v = sub.add_parser("verify", help="check a manifest against a registered hash")
    v.add_argument("manifest")
    v.add_argument("--hash", help="expected SHA-256 (default: the one in the manifest's JSON sidecar)")
    v.set_defaults(func=cmd_verify)


# --- issue 22: masks -----------------------------------------------------------------------
def cmd_masks(args) -> int:
    import warnings

    from shortcutlab.ingest.masks import MASKS_FILES, MaskWarning, write_masks
    from shortcutlab.io import claim_output_dir

    _check_output_folder(args.out, "--out", replaced=True)
    claim_output_dir(args.out, "masks", MASKS_FILES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MaskWarning)
        summary = write_masks(args.table, args.out, image=args.image, id=args.id, column=args.column,
                              method=args.method, channel=args.channel, smooth=args.smooth, n_sheet=args.sheet)
    _print_warnings(caught, MaskWarning)
    c = summary["counts"]
    print(f"{c['crops']} masks ({summary['method']} threshold on the {summary['channel']} channel): {c['empty']} empty, "
          f"{c['full']} full, {c['touches_border']} touch the border, {c['several_components']} with several components; "
          f"median foreground share {summary['median_foreground_share'] or 0:.3f}")
    print(f"wrote {os.path.join(args.out, 'masks.csv')} (column {args.column!r}), masks/, masks.json, contact_sheet.png")
    return 0


def _add_masks_command(sub) -> None:
    """`shortcutlab masks`: one estimated cell mask per crop."""
    from shortcutlab.ingest.masks import CHANNELS, METHODS

    m = sub.add_parser("masks", help="estimate one cell mask per crop (scikit-image), with quality fields and a contact sheet")
    m.add_argument("table", help="CSV file, one row per crop (image paths relative to its folder)")
    m.add_argument("--out", required=True, metavar="DIR", help="folder for masks/, masks.csv, masks.json, contact_sheet.png")
    m.add_argument("--image", default="path", help="crop image path column (default path)")
    m.add_argument("--id", default="id", help="crop id column; ids name the mask files (default id)")
    m.add_argument("--column", default="mask", help="name of the mask column added to masks.csv (default mask)")
    m.add_argument("--method", choices=METHODS, default="multiotsu",
                   help="threshold: multiotsu (lower of three-class Otsu: background | cytoplasm | nucleus; default), otsu, li")
    m.add_argument("--channel", choices=CHANNELS, default="od",
                   help="stain channel: od (optical density above the background's; default), hematoxylin (rgb2hed), gray")
    m.add_argument("--smooth", type=float, default=1.0, metavar="PX", help="Gaussian smoothing of the channel, in pixels (default 1)")
    m.add_argument("--sheet", type=int, default=24, metavar="N", help="crops on the contact sheet (default 24)")
    m.set_defaults(func=cmd_masks)


def _add_retrain_options(p: argparse.ArgumentParser, outputs: str, mask_help: str = "manifest column (default mask)") -> None:
    """The inputs, output folder and training flags (those `TrainConfig` declares for retraining)
    shared by `litmus` and `control`."""
    p.add_argument("manifest", help="crop manifest CSV (id, path, mask, label, parent; as written by `shortcutlab synth`)")
    p.add_argument("split", help="split manifest CSV from `shortcutlab split`")
    p.add_argument("--out", required=True, metavar="DIR", help=f"folder for {outputs}")
    p.add_argument("--cell", help="cell of a multi-cell split (factorial, ladder)")
    _add_train_settings(p, retrain=True)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    for flag, default in (("--id", "id"), ("--label", "label"), ("--parent", "parent"), ("--image", "path")):
        p.add_argument(flag, default=default, help=f"manifest column (default {default})")
    p.add_argument("--mask", default="mask", help=mask_help)


# --- issue 22: `shortcutlab table`, a crop table from a released folder ---------------------
def _add_table_command(sub) -> None:
    """`shortcutlab table`: a crop table from the files of a folder whose paths match a pattern."""
    t = sub.add_parser("table", help="a crop table from the files of a released folder whose paths match a pattern")
    t.add_argument("folder", metavar="DIR", help="the released folder")
    t.add_argument("--pattern", required=True, help="relative path with fields, e.g. 'im_{label}/CROPPED/{parent}_{*}.bmp' "
                   "or '{patient}/{parent}/{id}.png'; {name} keeps a path part as a column, {*} matches without keeping it")
    t.add_argument("--labels", metavar="CSV", help="CSV joined on its 'file' (path relative to DIR) or 'id' column; its "
                   "other columns (label, parent, ...) join the table")
    t.add_argument("--parent-from", metavar="FIELD,FIELD", help="make the parent from these fields of the pattern, joined "
                   "with '/' (e.g. label,field when field numbers restart in each class folder); the pattern has no {parent}")
    t.add_argument("--out", required=True, metavar="TABLE.csv", help="the table; its summary goes to TABLE.json beside it")
    t.set_defaults(func=cmd_table)


def cmd_table(args) -> int:
    from shortcutlab.ingest.files import summary_path, table_from_files, write_file_table
    from shortcutlab.io import OutputError

    side = summary_path(args.out)
    if side == os.fspath(args.out):
        raise OutputError(f"--out {args.out!r} would be overwritten by its JSON summary; name the table *.csv")
    _check_output_files(args.labels, [("--out", args.out), ("the summary of --out", side)])
    folder = os.path.dirname(os.path.abspath(args.out))
    parent_from = None if args.parent_from is None else args.parent_from.split(",")
    frame, report = table_from_files(args.folder, args.pattern, labels=args.labels, relative_to=folder, parent_from=parent_from)
    write_file_table(frame, report, args.out)
    r = report
    print(f"table: {r['n_crops']} crops, {len(r['classes'])} classes, {r['n_parents']} parents, from {r['n_files']} files "
          f"under {args.folder} ({r['n_matched']} match the pattern, {r['n_unmatched']} do not)")
    if r["n_unmatched"]:
        print(f"  not matched (first {len(r['unmatched_first'])}): {', '.join(r['unmatched_first'])}")
    if r["n_labels_unused"]:
        print(f"  warning: {r['n_labels_unused']} rows of {args.labels} match no crop (first: {', '.join(r['labels_unused_first'])})")
    if r["n_parents_with_several_labels"]:
        print(f"  note: {r['n_parents_with_several_labels']} parents hold crops of several labels (first: "
              f"{', '.join(r['parents_with_several_labels_first'])}); right for mixed fields, wrong if the parent names "
              "restart in each class folder (then --parent-from)")
    print(f"  classes: {', '.join(f'{k} {v}' for k, v in r['classes'].items())}")
    print(f"  wrote {args.out} (columns {', '.join(r['columns'])}; paths relative to its folder) and {side}")
    print(f"  audit it: shortcutlab audit {args.out} --id id --label label --parent parent --image path")
    return 0


# --- crops: windows cut from parent images (issue 22) ---------------------------------------
def cmd_crops(args) -> int:
    import warnings

    from shortcutlab.ingest.windows import WindowWarning, cut_crops

    if (args.center is None) == (args.box is None):
        raise ShortcutlabError("give the windows as --center X,Y with --size N, or as --box X,Y,W,H")
    _check_output_folder(args.out, "--out", replaced=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", WindowWarning)
        result = cut_crops(args.table, args.parent_image, args.out, center=args.center, size=args.size, box=args.box,
                           border=args.border, fill=args.fill, id=args.id, label=args.label, parent=args.parent,
                           group=args.group, root=args.root, compress_level=args.compress_level)
    _print_warnings(caught, WindowWarning)
    print(f"cut {result.n_crops} crops from {result.n_images} parent images ({len(result.padded)} padded, border {args.border})")
    print(f"  wrote {result.table_path} (paths relative to its folder), {result.sidecar_path}, crops in "
          f"{os.path.join(args.out, 'crops')}")
    group = " --group group" if args.group else ""
    print(f"  audit it: shortcutlab audit {result.table_path} --id id --label label --parent parent{group} --box x,y,w,h")
    return 0


def _add_crops_command(sub) -> None:
    """`shortcutlab crops`: windows cut from parent images around given coordinates."""
    c = sub.add_parser("crops", help="cut windows from parent images (around centres, or given boxes) and write a crop table")
    c.add_argument("table", help="CSV file, one row per crop, with its parent image path and coordinates")
    c.add_argument("--parent-image", required=True, metavar="COL", help="column of parent image paths (relative to the table's folder, or --root)")
    c.add_argument("--center", metavar="X,Y", help="window centre columns (with --size)")
    c.add_argument("--size", type=int, metavar="N", help="window side in pixels (with --center)")
    c.add_argument("--box", metavar="X,Y,W,H", help="window columns: top-left corner and size in parent pixels")
    c.add_argument("--border", choices=("refuse", "constant", "edge", "reflect"), default="refuse",
                   help="a window past the image border: refuse it (default), or pad it with this numpy.pad mode")
    c.add_argument("--fill", type=float, default=0, metavar="V", help="value of --border constant padding (default 0)")
    c.add_argument("--out", required=True, metavar="DIR", help="output folder: crops/, crops.csv, crops.json (new, or an earlier crops output)")
    for flag, default in (("--id", "id"), ("--label", "label"), ("--parent", "parent")):
        c.add_argument(flag, default=default, help=f"table column (default {default})")
    c.add_argument("--group", help="higher-level unit column (patient), carried into crops.csv")
    c.add_argument("--root", metavar="DIR", help="folder relative image paths start from (default: the table's folder)")
    c.add_argument("--compress-level", type=int, default=1, metavar="L", help="zlib level of the crop PNGs, 0 to 9 (default 1)")
    c.set_defaults(func=cmd_crops)


# --- power (issue 23, item 4): power of the leak test for a planned factorial ----------------
def _design_values(text: str, flag: str, low: int) -> list[int]:
    """A design flag's comma-separated integers, each >= low."""
    values = _numbers(text, flag, int, " (e.g. 5,10,20)")
    for v in values:
        if v < low:
            raise ShortcutlabError(f"{flag} values must be integers >= {low}; got {v} (in {text!r})")
    return values


def cmd_power(args) -> int:
    import itertools
    import warnings

    from shortcutlab.warnings_summary import summary_lines

    from shortcutlab.io import claim_output_dir
    from shortcutlab.report.power import POWER_FILES, pilot_components, write_power
    from shortcutlab.stats import StatsWarning
    from shortcutlab.stats.power import Design, parse_params, simulate_power

    designs = dict(seeds=_design_values(args.seeds, "--seeds", 2), archs=_design_values(args.archs, "--archs", 1),
                   parents=_design_values(args.parents, "--parents", 2))
    crops = _design_values(args.crops, "--crops", 1) if args.crops else None
    effects = _numbers(args.effects, "--effects", float, " (fractions, e.g. 0,0.004,0.008)")
    bad = [e for e in effects if not -1 < e < 1]
    if bad:
        raise ShortcutlabError(f"--effects are leak effects as fractions in (-1, 1) (0.008 is 0.8 pp); got {bad[0]!r}")
    if args.n_sim < 1:
        raise ShortcutlabError(f"--n-sim takes the number of simulated data sets, an integer >= 1; got {args.n_sim}")
    if not 0 < args.alpha < 1:
        raise ShortcutlabError(f"--alpha must be in (0, 1); got {args.alpha}")
    _check_output_folder(args.out, "--out")
    claim_output_dir(args.out, "power", POWER_FILES)        # before the simulation, which can take minutes
    if args.pilot is not None:
        comp, pilot_crops = pilot_components(args.pilot, condition=args.condition, baseline=args.baseline)
        source = {"pilot": os.path.abspath(args.pilot), "condition": args.condition, "baseline": args.baseline}
    else:
        comp, pilot_crops = parse_params(args.params), 3
        source = {"params": args.params}
    crops = crops or [pilot_crops]
    if args.pool is not None and args.pool < max(designs["parents"]):
        raise ShortcutlabError(f"--pool is the number of parents each seed draws its test parents from, at least the "
                               f"largest --parents {max(designs['parents'])}; got {args.pool}")
    grid = [Design(s, a, p, c, args.pool) for s, a, p, c in itertools.product(designs["seeds"], designs["archs"],
                                                                             designs["parents"], crops)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StatsWarning)
        table = simulate_power(comp, grid, effects, test=args.test, n_sim=args.n_sim, alpha=args.alpha,
                               n_boot=args.n_boot, seed=args.seed)
    settings = dict(source, pool=args.pool, test=args.test, n_sim=args.n_sim, alpha=args.alpha, n_boot=args.n_boot, seed=args.seed)
    paths = write_power(args.out, table, comp, settings)
    print("components (probability scale; pp = x 100): " + ", ".join(
        f"{k} {getattr(comp, k):.4g}" for k in ("baseline", "sd_seed", "sd_parent", "sd_seed_parent", "sd_seed_arch",
                                               "sd_crop")) + (f"; pilot leak effect {100 * comp.pilot_effect:+.2f} pp"
                                                              if comp.pilot_effect == comp.pilot_effect else ""))
    for note in comp.notes:
        print(f"note: {note}")
    shown = table.drop(columns=["alpha", "test"])
    shown.insert(shown.columns.get_loc("effect"), "effect_pp", 100 * shown.pop("effect"))
    with _pd_display():
        print(f"power of the {'paired t on per-seed leak effects' if args.test == 't' else 'two-way cluster bootstrap'} "
              f"at alpha {args.alpha:g} ({args.n_sim} simulated data sets per row; mc_se: Monte Carlo SE)")
        print(shown.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    for line in summary_lines(caught, prefix="note", category=False):
        print(line)
    print(f"wrote {paths['power.csv']}, power.png, components.json")
    return 0


def _add_power_command(sub) -> None:
    """`shortcutlab power`: power of the leak test for planned designs, from a pilot or stated components."""
    p = sub.add_parser("power", help="power of the leak test for planned designs (a table and a figure)",
                       description="Simulate planned factorials from variance components of the leak effect (from a pilot "
                                   "sweep or stated) and report the power of the leak test with its Monte Carlo error.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--pilot", metavar="SWEEP_DIR", help="pilot sweep folder: components estimated from its factorial")
    src.add_argument("--params", metavar="K=V,...",
                     help="stated components: baseline, sd_seed, sd_parent, sd_seed_parent, sd_seed_arch, sd_crop "
                          "(fractions; unnamed ones keep their defaults 0.85, 0, 0, 0, 0, 0.3)")
    p.add_argument("--seeds", default="5,10,20", help="numbers of seeds (default 5,10,20)")
    p.add_argument("--archs", default="4,12", help="numbers of architectures (default 4,12)")
    p.add_argument("--parents", default="50,150", help="numbers of test parents per seed (default 50,150; see --pool)")
    p.add_argument("--pool", type=int, help="parents each seed draws its test parents from (default: every seed tests "
                                            "the same parents, a crossed design)")
    p.add_argument("--crops", help="test crops per parent (default: the pilot's median, or 3 with --params)")
    p.add_argument("--effects", default="0,0.004,0.008,0.015", help="leak effects as fractions (default 0,0.004,0.008,0.015)")
    p.add_argument("--test", choices=("t", "bootstrap"), default="t",
                   help="t: paired t on per-seed effects (default, fast); bootstrap: the registered two-way cluster bootstrap")
    p.add_argument("--n-sim", type=int, default=500, help="simulated data sets per design and effect (default 500)")
    p.add_argument("--n-boot", type=int, default=200, help="bootstrap resamples with --test bootstrap (default 200)")
    p.add_argument("--alpha", type=float, default=0.05, help="level of the test (default 0.05)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulation (default 0)")
    p.add_argument("--condition", help="the pilot's factorial condition (needed when it has several)")
    p.add_argument("--baseline", default="none", help="the pilot's intervention of unaltered crops (default none)")
    p.add_argument("--out", required=True, help="output folder: power.csv, power.png, components.json")
    p.set_defaults(func=cmd_power)


_COMMANDS = (_add_audit_command, _add_split_command, _add_synth_command, _add_train_command, _add_demo_command,
             _add_diagnose_command, _add_siblings_command, _add_sweep_command, _add_register_command, _add_results_command,
             _add_report_command,
             _add_litmus_command, _add_control_command, _add_verify_command,
             _add_table_command,
             _add_crops_command,
             _add_masks_command,
             _add_locate_command,
             _add_power_command,
             )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_named(argv))
    args = parser.parse_args(argv)
    from shortcutlab.warnings_summary import collected

    try:
        with collected():  # repeated warnings print once, with a count, when the command ends
            return int(args.func(args) or 0)
    except ShortcutlabError as e:
        print(f"shortcutlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Whoever read our output stopped (`| head`): nothing to report. Point stdout at
        # /dev/null so that the flush at exit does not fail again (Python's documented recipe).
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):
            pass  # stdout is not a file (a test's capture)
        return 1
    except OSError as e:
        # The file system said no after the up-front checks (disk full, a file vanished).
        where = f": {e.filename!r}" if e.filename else ""
        print(f"shortcutlab {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
