"""Registration of a sweep: what a study fixes before any model is trained, hashed, and
checked again when the sweep starts and when its results are read.

`register(config, out)` resolves the sweep (the config loaded and planned), builds its split
manifests exactly as the sweep's split tasks build them (the same task functions, in a
temporary folder), and writes a JSON record with the SHA-256 of

- the config: its canonical resolved form (`SweepConfig.to_dict` without the file's path) and
  the file's bytes;
- every split manifest, by condition, seed and protocol: the bytes of ``split.csv`` as the
  sweep writes it, and the manifest's content hash (`SplitManifest.hash`, the ``sha256`` of
  the sweep's ``splits.json`` and the ``split_sha256`` column of its tables);
- the design table: every planned task (kind, parameters, id);
- the analysis settings (`analysis_settings`: estimands, Holm families, n_boot, seed, level,
  interval method, alpha);
- the code: ``shortcutlab.version.__version__`` and a hash of the ``.py`` files of the
  packages shortcutlab, interventions and probes (`source_tree_hash`);

and the time. This is pre-registration in the sense of the clinical-trial and
reproducible-ML literature (e.g. Nosek et al. 2018, "The preregistration revolution"): the
analysis, the data partition and the code are fixed and hashed before any outcome is seen,
so that a reader can verify that nothing was changed after the results came in.

`check_registration` recomputes the same record for a config (hashing the split manifests a
sweep folder already holds, building the others) and raises `RegistrationError` naming every
difference; `sweep --registration FILE` calls it before it writes anything. The sweep folder
keeps a copy of the registration (``registration.json``, `SweepLayout.registration`), and
`registration_statement` compares the split hashes the sweep recorded with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from typing import Any

from shortcutlab.errors import ShortcutlabError
from shortcutlab.io import file_sha256, read_json_object, write_json
from shortcutlab.paths import wrong_kind
from shortcutlab.sweep.config import ANALYSIS_DEFAULTS, SweepConfig, load_config
from shortcutlab.sweep.folder import SweepLayout
from shortcutlab.sweep.plan import Plan, build_plan

#: the format of a registration file (raised when its fields change)
FORMAT = 1
#: the packages whose ``.py`` files make up the code version
CODE_PACKAGES = ("shortcutlab", "interventions", "probes")


class RegistrationError(ShortcutlabError):
    """A registration file is unreadable, or a sweep differs from its registration (named)."""


# ------------------------------------------------------------------------------- hashes
def canonical_sha256(obj: Any) -> str:
    """SHA-256 of `obj` as canonical JSON (keys sorted, no spaces, UTF-8)."""
    from shortcutlab.io import to_json

    return hashlib.sha256(to_json(obj, sort_keys=True, indent=None, separators=(",", ":")).encode("utf-8")).hexdigest()


def package_roots() -> dict[str, str]:
    """The folder of each package of `CODE_PACKAGES`, as imported."""
    import importlib

    return {name: os.path.dirname(os.path.abspath(importlib.import_module(name).__file__)) for name in CODE_PACKAGES}


def source_tree_hash(roots: dict[str, str] | None = None) -> dict:
    """A hash of the source of the packages: each ``.py`` file under each root (``__pycache__``
    left out) as the line ``<package>/<relative path>\\t<sha256 of its bytes>\\n``, the lines
    sorted, and the SHA-256 of their concatenation (a Merkle-style hash: one changed byte in
    any file changes it, and it does not depend on the file system's listing order).

    Args:
        roots: package name -> folder (default `package_roots`).

    Returns:
        ``{"sha256": ..., "n_files": ...}``.
    """
    roots = package_roots() if roots is None else roots
    lines = []
    for name, root in sorted(roots.items()):
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    rel = os.path.relpath(path, root).replace(os.sep, "/")
                    lines.append(f"{name}/{rel}\t{file_sha256(path)}\n")
    lines.sort()
    return {"sha256": hashlib.sha256("".join(lines).encode("utf-8")).hexdigest(), "n_files": len(lines)}


def code_version() -> dict:
    """The code a sweep runs: the package version and the hash of its source tree."""
    from shortcutlab.version import __version__

    return {"version": __version__, "source": source_tree_hash()}


# ------------------------------------------------------------------------------- the parts
def analysis_settings(cfg: SweepConfig) -> dict:
    """The analysis a sweep registers: its `analysis:` mapping with every default filled in
    (`ANALYSIS_DEFAULTS`; `estimands`: every registered estimand, `interval`: the estimates'
    default method, `families`: the paper's registered families,
    ``shortcutlab.stats.hypotheses.PAPER_FAMILIES``).
    """
    from shortcutlab.stats import available_estimands

    a = dict(ANALYSIS_DEFAULTS, **(cfg.analysis or {}))
    if a["estimands"] is None:
        a["estimands"] = available_estimands()
    if a["interval"] is None:
        from shortcutlab.stats.bootstrap import DEFAULT_INTERVAL

        a["interval"] = DEFAULT_INTERVAL
    if a["families"] is None:  # the paper's registered families
        from shortcutlab.stats.hypotheses import PAPER_FAMILIES

        a["families"] = {k: list(v) for k, v in PAPER_FAMILIES.items()}
    return a


def canonical_config(cfg: SweepConfig) -> dict:
    """The resolved config without the file's path (`SweepConfig.to_dict`): what it means, not
    where it lies."""
    d = cfg.to_dict()
    d.pop("source", None)
    return d


def design_table(plan: Plan) -> list[dict]:
    """Every planned task, dependencies first: kind, id, parameters."""
    return [{"kind": t.kind, "id": t.id, "params": t.params} for t in plan.graph.ordered()]


def split_label(s: dict) -> str:
    """How a split is named in messages: 'condition=color seed=1 protocol=parent'."""
    return f"condition={s['condition']} seed={s['seed']} protocol={s['protocol']}"


def _split_entry(s: dict, path: str) -> dict:
    """One split's hashes; a manifest that no longer reads as one (edited on disk) keeps its
    file hash, which then differs from the registered one, and an empty content hash."""
    from shortcutlab.data.manifest import SplitManifest

    try:
        content = SplitManifest.read(path).hash
    except ShortcutlabError:
        content = ""
    return {"split": s["split"], "condition": s["condition"], "seed": s["seed"], "protocol": s["protocol"],
            "params": s["params"], "sha256": file_sha256(path), "content_sha256": content}


def split_hashes(plan: Plan, sweep_dir: str | None = None) -> list[dict]:
    """The hashes of every split manifest of the plan: those a sweep folder already holds are
    read there (the files the sweep will use), the others are built by the sweep's own split
    task (`tasks.run_task`, with its synthesise task before it) in a temporary folder that is
    removed afterwards. No model is trained.

    Returns:
        One dict per split (as `Plan.splits`): split, condition, seed, protocol, params,
        sha256 (of the ``split.csv`` bytes), content_sha256 (`SplitManifest.hash`).
    """
    from shortcutlab.sweep.tasks import run_task

    out: list[dict] = []
    with tempfile.TemporaryDirectory(prefix=".shortcutlab-register-") as work:
        for s in plan.splits:
            if sweep_dir and SweepLayout(sweep_dir).is_done("split", s["split"]):
                out.append(_split_entry(s, SweepLayout(sweep_dir).task("split", s["split"]).split))
                continue
            task = plan.graph[s["split"]]
            for dep in task.deps:
                run_task(plan.graph[dep], work)
            run_task(task, work)
            out.append(_split_entry(s, SweepLayout(work).task("split", s["split"]).split))
    return out


def build_registration(cfg: SweepConfig, config_path: str | None = None, plan: Plan | None = None,
                       sweep_dir: str | None = None) -> dict:
    """The registration record of a config (see the module docstring); splits from
    `split_hashes`. `config_path` gives the file whose bytes are hashed (default `cfg.source`)."""
    plan = plan or build_plan(cfg)
    path = config_path or cfg.source
    config = canonical_config(cfg)
    design = design_table(plan)
    analysis = analysis_settings(cfg)
    return {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": {"sha256": canonical_sha256(config), "file": os.path.abspath(path) if path else "",
                   "file_sha256": file_sha256(path) if path and os.path.isfile(path) else "", "resolved": config},
        "splits": split_hashes(plan, sweep_dir),
        "design": {"sha256": canonical_sha256(design), "counts": plan.graph.counts(), "n_tasks": len(design),
                   "ids": {k: [t["id"] for t in design if t["kind"] == k] for k in plan.graph.counts()}},
        "analysis": {"sha256": canonical_sha256(analysis), "settings": analysis},
        "code": code_version(),
    }


def register(config: str | os.PathLike, out: str | os.PathLike, limits: dict | None = None, device: str | None = None) -> dict:
    """Register a sweep config: build its record (`build_registration`) and write it to `out`
    atomically (a temporary name renamed into place).

    Args:
        config: the YAML sweep config.
        out: the registration file (JSON).
        limits: caps over the config's (`load_config`).
        device: overrides the config's device, as ``sweep --device`` will (the device is part
            of a train task's id, so a sweep run with another device differs from its
            registration).

    Returns:
        The record written.
    """
    from shortcutlab.io import check_writable
    from shortcutlab.sweep.config import validate

    out = os.fspath(out)
    check_writable(out)
    cfg = load_config(config, limits=limits)
    if device:
        cfg = validate(dict(cfg.raw, device=device), source=cfg.source, base_dir=os.path.dirname(os.path.abspath(config)),
                       limits=limits)
    record = build_registration(cfg, os.fspath(config))
    write_json(out, record)
    return record


# ------------------------------------------------------------------------------- checking
def read_registration(path: str | os.PathLike) -> dict:
    """A registration file, checked for the fields `check_registration` compares.

    Raises:
        RegistrationError: the file is missing, not JSON, or lacks a field (named).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise RegistrationError(f"registration file {path!r} {wrong_kind(path, 'file')}")
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise RegistrationError(f"registration file {path!r} is not JSON ({' '.join(str(e).split())[:120]}); "
                                "write it with `shortcutlab register CONFIG --out FILE`") from None
    if not isinstance(rec, dict):
        raise RegistrationError(f"registration file {path!r} holds a JSON {type(rec).__name__}, not an object; "
                                "write it with `shortcutlab register CONFIG --out FILE`")
    for key, kind in (("config", dict), ("splits", list), ("design", dict), ("analysis", dict), ("code", dict)):
        if not isinstance(rec.get(key), kind):
            raise RegistrationError(f"registration file {path!r} has no {key!r} {'object' if kind is dict else 'list'}; "
                                    "it was not written by `shortcutlab register`")
    if rec.get("format") != FORMAT:
        raise RegistrationError(f"registration file {path!r} has format {rec.get('format')!r}; this shortcutlab reads "
                                f"format {FORMAT} (register the config again)")
    return rec


def _short(sha: Any) -> str:
    return f"{str(sha)[:12]}..."


def _leaf_diffs(path: str, old: Any, new: Any, out: list[str]) -> None:
    """The key paths at which two JSON values differ, each with both values."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in list(old) + [k for k in new if k not in old]:
            _leaf_diffs(f"{path}.{k}" if path else str(k), old.get(k), new.get(k), out)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            _leaf_diffs(f"{path}[{i}]", a, b, out)
    elif json.dumps(old, sort_keys=True) != json.dumps(new, sort_keys=True):
        out.append(f"{path}: {json.dumps(old)[:60]} registered, {json.dumps(new)[:60]} now")


def _split_key(s: dict) -> tuple:
    return (str(s.get("condition")), s.get("seed"), str(s.get("protocol")))


def _split_diffs(old: list[dict], new: list[dict]) -> list[str]:
    """Each split is matched with its registered one by its task id, else (its parameters
    changed) by condition, seed and protocol where that names one registered split."""
    reg = {s.get("split"): s for s in old if isinstance(s, dict)}
    now = {s["split"]: s for s in new}
    by_key: dict[tuple, list[dict]] = {}
    for r in reg.values():
        by_key.setdefault(_split_key(r), []).append(r)
    out, matched = [], set()
    for sid, s in now.items():
        r = reg.get(sid)
        if r is None and len(by_key.get(_split_key(s), [])) == 1 and len([x for x in now.values() if _split_key(x) == _split_key(s)]) == 1:
            r = by_key[_split_key(s)][0]
        if r is None:
            out.append(f"split manifest {split_label(s)} is not in the registration (its task {sid} was not planned then)")
            continue
        matched.add(r.get("split"))
        if r.get("sha256") != s["sha256"]:
            out.append(f"split manifest {split_label(s)} differs from the registration: sha256 {_short(r.get('sha256'))} "
                       f"registered, {_short(s['sha256'])} now")
    gone = [r for sid, r in reg.items() if sid not in matched]
    if gone:
        out.append(f"{len(gone)} registered split manifest(s) are no longer planned (first: {split_label(gone[0])})")
    return out


def registration_diffs(registered: dict, now: dict) -> list[str]:
    """What differs between a registration record and the one computed now, most specific
    first: the analysis settings (by key), the split manifests (by condition/seed/protocol),
    the resolved config (by key path), the config file's bytes, the design table, the code."""
    out: list[str] = []
    a_old, a_new = registered["analysis"].get("settings") or {}, now["analysis"]["settings"]
    for k in list(a_old) + [k for k in a_new if k not in a_old]:
        if json.dumps(a_old.get(k), sort_keys=True) != json.dumps(a_new.get(k), sort_keys=True):
            out.append(f"analysis.{k} differs: {json.dumps(a_old.get(k))[:60]} registered, {json.dumps(a_new.get(k))[:60]} now")
    out += _split_diffs(registered["splits"], now["splits"])
    c_old, c_new = registered["config"], now["config"]
    if c_old.get("sha256") != c_new["sha256"]:
        leaves: list[str] = []
        # the analysis settings are named above, key by key
        _leaf_diffs("", {k: v for k, v in (c_old.get("resolved") or {}).items() if k != "analysis"},
                    {k: v for k, v in c_new["resolved"].items() if k != "analysis"}, leaves)
        if leaves or not out:
            out.append("the resolved config differs" + (f" at {', '.join(leaves[:3])}" if leaves else ""))
    elif c_old.get("file_sha256") != c_new["file_sha256"]:
        out.append(f"the config file's bytes differ (sha256 {_short(c_old.get('file_sha256'))} registered, "
                   f"{_short(c_new['file_sha256'])} now; the resolved config is the same: a comment or the layout changed)")
    d_old, d_new = registered["design"], now["design"]
    if d_old.get("sha256") != d_new["sha256"]:
        old_ids = {i for ids in (d_old.get("ids") or {}).values() for i in ids}
        new_ids = {i for ids in d_new["ids"].values() for i in ids}
        out.append(f"the design table differs ({len(new_ids - old_ids)} planned task(s) not registered, "
                   f"{len(old_ids - new_ids)} registered task(s) not planned)")
    k_old, k_new = registered["code"], now["code"]
    if json.dumps(k_old, sort_keys=True) != json.dumps(k_new, sort_keys=True):
        out.append(f"code version differs: shortcutlab {k_old.get('version')} with source "
                   f"{_short((k_old.get('source') or {}).get('sha256'))} registered, {k_new['version']} with source "
                   f"{_short(k_new['source']['sha256'])} now")
    return out


def check_registration(cfg: SweepConfig, registration: str | os.PathLike, config_path: str | None = None,
                       sweep_dir: str | None = None) -> dict:
    """Check a sweep against its registration before it starts; nothing is written.

    Args:
        cfg: the validated config the sweep would run.
        registration: the file `register` wrote.
        config_path: the config file (default `cfg.source`), whose bytes were registered.
        sweep_dir: the sweep folder; split manifests it already holds are the ones hashed.

    Returns:
        ``{"path": ..., "sha256": ..., "record": ...}`` of the registration file.

    Raises:
        RegistrationError: the file is unreadable, or one line naming every difference.
    """
    path = os.path.abspath(os.fspath(registration))
    registered = read_registration(path)
    sweep_dir = sweep_dir if sweep_dir and os.path.isdir(sweep_dir) else None
    now = build_registration(cfg, config_path, sweep_dir=sweep_dir)
    diffs = registration_diffs(registered, now)
    if diffs:
        raise RegistrationError(f"the sweep differs from its registration {path!r} in {len(diffs)} point(s): "
                                + "; ".join(diffs) + ". Nothing was run; register again if the change is intended")
    return {"path": path, "sha256": file_sha256(path), "record": registered}


# ------------------------------------------------------------------------------- analysis
def sweep_analysis(sweep_dir: str | os.PathLike, **given: Any) -> dict:
    """The analysis settings of a sweep folder: `ANALYSIS_DEFAULTS`, then the `analysis:`
    mapping of the config it ran (sweep.json), then the values `given` that are not None
    (the command line's flags, which override the config).

    Returns:
        Every key of `ANALYSIS_DEFAULTS`, plus ``from_config`` (whether the config had one).
    """
    meta = read_json_object(SweepLayout(os.fspath(sweep_dir)).config) or {}
    config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    from_config = config.get("analysis") if isinstance(config.get("analysis"), dict) else None
    out = dict(ANALYSIS_DEFAULTS, **{k: v for k, v in (from_config or {}).items() if k in ANALYSIS_DEFAULTS})
    out.update({k: v for k, v in given.items() if v is not None})
    out["from_config"] = from_config is not None
    return out


def estimates_options(settings: dict) -> dict:
    """The keywords of `shortcutlab.stats.estimates` for analysis settings: n_boot, seed,
    level, alpha, the interval method and, where set, the hypotheses and their families (the
    `estimands` list is applied by `keep_estimands`)."""
    kw = {k: settings[k] for k in ("n_boot", "seed", "level", "alpha", "interval", "families", "hypotheses")
          if settings.get(k) is not None}
    return kw


def keep_estimands(table, settings: dict | None):
    """The estimates rows of the estimands the analysis settings register (all without a list)."""
    if not settings or settings.get("estimands") is None:
        return table
    return table[table["estimand"].isin(settings["estimands"])].reset_index(drop=True)


# ------------------------------------------------------------------------------- statement
def registration_statement(sweep_dir: str | os.PathLike) -> str:
    """Whether every result of a sweep folder matched its registered split hash: the content
    hash of each split the sweep recorded (``splits.json``), and the ``split_sha256`` each
    model's rows carry in ``predictions.parquet``, against the registration the sweep folder
    keeps (``registration.json``); 'not registered' without one.

    Returns:
        One sentence: 'every result matched its registered split hash (N splits, M models)',
        or 'not every result matched ...' and the splits and models that did not (named, both
        hashes), or 'not registered'.
    """
    layout = SweepLayout(os.fspath(sweep_dir))
    if not os.path.isfile(layout.registration):
        return "Registration: not registered (the sweep ran without --registration)."
    rec = read_json_object(layout.registration)
    splits = _read_list(layout.splits)
    if rec is None or not isinstance(rec.get("splits"), list) or splits is None:
        what = layout.registration if rec is None or not isinstance(rec.get("splits"), list) else layout.splits
        return f"Registration: cannot be checked ({what} is unreadable)."
    reg = {s.get("split"): s for s in rec["splits"] if isinstance(s, dict)}
    bad = []
    for s in splits:
        r = reg.get(s.get("split"))
        if r is None or r.get("content_sha256") != s.get("sha256"):
            was = _short(r.get("content_sha256")) if r else "none"
            bad.append(f"split {split_label(s)} (sha256 {was} registered, {_short(s.get('sha256'))} now)")
    models, bad_models = _model_hashes(layout, reg)
    bad += bad_models
    sha = file_sha256(layout.registration)
    counted = f"{len(splits)} split(s)" + (f", {models} model(s)" if models is not None else "")
    if not bad:
        return f"Registration {_short(sha)}: every result matched its registered split hash ({counted})."
    return (f"Registration {_short(sha)}: not every result matched its registered split hash ({counted}); {len(bad)} differ: "
            + "; ".join(bad[:10]) + (f"; and {len(bad) - 10} more" if len(bad) > 10 else "") + ".")


def _model_hashes(layout: SweepLayout, reg: dict) -> tuple[int | None, list[str]]:
    """The models of predictions.parquet (None when it cannot be read) and those whose rows
    carry a split hash other than their split's registered one."""
    import pandas as pd

    try:
        pred = pd.read_parquet(layout.table("predictions"), columns=["model", "seed", "split_id", "split_sha256"])
    except Exception:  # noqa: BLE001 - no or an unreadable table: the splits alone are checked
        return None, []
    pairs = pred.drop_duplicates(["model", "split_id", "split_sha256"])
    bad = []
    for r in pairs.itertuples(index=False):
        want = (reg.get(r.split_id) or {}).get("content_sha256")
        if r.split_id and want != r.split_sha256:
            bad.append(f"model {r.model} (seed {r.seed}: sha256 {_short(want) if want else 'none'} registered, "
                       f"{_short(r.split_sha256)} in its rows)")
    return int(pred["model"].nunique()), bad


def _read_list(path: str) -> list | None:
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, list) and all(isinstance(s, dict) for s in d) else None
