"""The sweep config: a YAML file read into frozen dataclasses, checked before any work, and
expanded into a grid.

Schema (every key but `data`, `split`, `seeds` and `models` optional)::

    data:                       # exactly one of synthetic / manifest
      synthetic: {mechanisms: [color, none], strength: 1.0, fields_per_class: 100, crop_size: 32}
      # manifest: {path: crops.csv, id: id, label: label, parent: parent, image: path, mask: mask, name: mydata}
    split: {protocol: factorial, params: {test_parent_share: 0.3}}   # protocol may be a list: [crop, parent]
    seeds: [0, 1, 2]
    models:
      - {arch: test_resnet, epochs: 30, lr: 0.001, precise_bn: true}
      # - {checkpoint: runs/a}   # a run folder of `shortcutlab train`: scored and diagnosed, not trained
      # - {weights: ext.pt, arch: resnet18, classes: [a, b, c]}   # trained elsewhere: scored on each split's test side
    cells: [leak-high, clean-high]
    interventions: {names: [greyscale, low_pass], params: {low_pass: {sigma: 2.0}}}
    diagnostics: {only: [parent_probe], params: {parent_probe: {n_folds: 4}}}
    device: cpu
    threads: 2                  # torch threads of the whole sweep (default: the cores available; see sweep.threads)
    limits: {tasks: 100000, seeds: 10000}   # caps (DEFAULT_LIMITS); `sweep --limit NAME=N` sets any
    analysis: {n_boot: 10000, seed: 0, level: 0.95, interval: cgm, alpha: 0.05,
               families: {primary: [H1, H2]}, estimands: [leak, leak_cut],
               hypotheses: {H3: {estimand: leak_pooled, condition: color}}}   # `results`/`report` defaults; registered

Lists expand to a grid: a list of mechanisms gives one data condition per entry (an entry may
itself be a list: mechanisms planted together), a list for any other synthetic setting, split
parameter or model setting gives one value per entry (for settings whose value is a list,
`levels`, `rrc_scale`, `rrc_ratio`, a list of lists). Every error names the key path, the
value and what is allowed (`SweepConfigError`).
"""

from __future__ import annotations

import difflib
import itertools
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from shortcutlab.errors import ShortcutlabError
from shortcutlab.models.train_config import TrainConfig, pair_names, train_settings
from shortcutlab.paths import wrong_kind


class SweepConfigError(ShortcutlabError):
    """A sweep config is invalid; the message names the file, the key path, the value and what is allowed."""


TOP_KEYS = ("data", "split", "seeds", "models", "cells", "interventions", "diagnostics", "device", "threads", "limits",
            "analysis")
REQUIRED = ("data", "split", "seeds", "models")
SYNTH_KEYS = ("mechanisms", "strength", "strengths", "fields_per_class", "mean_cells_per_field", "crop_size", "field_size",
              "n_classes", "class_signal", "mixed_fields", "mix_dominance", "baseline_noise", "illumination_shading")
MANIFEST_KEYS = ("path", "id", "label", "parent", "image", "mask", "name")
#: settings whose single value is itself a list: a list of lists expands
LIST_VALUED = frozenset({"levels"}) | pair_names()
#: Caps checked before the work they guard, so a runaway config is refused in one line at once
#: rather than planning or parsing for minutes. `bytes`, `scalar` and `depth` guard the YAML
#: parsing itself (the file's size, its longest scalar in characters, its nesting depth) and
#: are set with `--limit NAME=N`; `seeds` and `tasks` (the planned task count, computed
#: arithmetically from the list lengths before the grid is built) may also be set in the
#: config's `limits:` mapping. The defaults are far above real studies: the schema nests
#: five levels, a 100-seed x 20-condition x 4-cell x 5-model study plans about 26,000 tasks,
#: and a 10,000-seed list is 70 kB of YAML.
DEFAULT_LIMITS = {"bytes": 2_000_000, "scalar": 100_000, "depth": 50, "seeds": 10_000, "tasks": 100_000}
#: the limits a config's own `limits:` mapping may set (the others guard reading it)
CONFIG_LIMITS = ("seeds", "tasks")
_LIMIT_WHAT = {"bytes": "bytes of YAML", "scalar": "characters in one YAML scalar", "depth": "levels of nesting",
               "seeds": "seeds", "tasks": "tasks"}
#: diagnostics left out by default: the score task measures accuracy under each intervention
DEFAULT_EXCLUDED_DIAGNOSTICS = ("interventions",)


def _close(name: str, allowed) -> str:
    close = difflib.get_close_matches(str(name), [str(a) for a in allowed], n=3, cutoff=0.5)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def _type_name(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a mapping",
            type(None): "null"}.get(type(v), type(v).__name__)


class _Checker:
    """Builds errors that name the config file and the key path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, path: str, message: str) -> SweepConfigError:
        where = f"{self.source}: " if self.source else ""
        return SweepConfigError(f"{where}{path}: {message}")

    def keys(self, path: str, value: Any, allowed, required=()) -> dict:
        if not isinstance(value, Mapping):
            raise self.error(path, f"expected a mapping with keys {', '.join(allowed)}; got {_type_name(value)} {value!r}")
        for k in value:
            if k not in allowed:
                raise self.error(f"{path}.{k}" if path else str(k), f"unknown key {k!r}{_close(k, allowed)} Allowed keys: {', '.join(allowed)}")
        for k in required:
            if k not in value:
                raise self.error(f"{path}.{k}" if path else str(k), f"missing required key {k!r}")
        return dict(value)

    def typed(self, path: str, value: Any, kinds: tuple, expected: str) -> Any:
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if not ok:
            raise self.error(path, f"expected {expected}; got {_type_name(value)} {value!r}")
        return value


def _grid_values(key: str, value: Any) -> list:
    """The values a setting takes in the grid: a list expands, except a flat list for a
    list-valued setting (one value)."""
    if isinstance(value, list):
        if key in LIST_VALUED and not any(isinstance(v, list) for v in value):
            return [value]
        return list(value) if value else [value]
    return [value]


def expand(params: Mapping[str, Any]) -> list[dict]:
    """Every combination of the list values of `params` (keys in sorted order, values in the given order)."""
    keys = sorted(params)
    values = [_grid_values(k, params[k]) for k in keys]
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)]


# ------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Condition:
    """One data condition: a synthetic benchmark setting (without its seed) or a manifest."""

    name: str
    kind: str  # "synthetic" | "manifest"
    params: dict = field(hash=False)  # SynthConfig settings, or the manifest spec


@dataclass(frozen=True)
class ModelSpec:
    """One model of the grid: a training recipe (`train`, TrainConfig fields without seed and
    device) or an existing checkpoint (`checkpoint`: a run folder)."""

    train: dict | None = field(default=None, hash=False)
    checkpoint: str | None = None
    wrap: dict | None = field(default=None, hash=False)  # {arch, weights, classes, name, weights_sha256}

    @property
    def arch(self) -> str:
        if self.wrap is not None:
            return self.wrap["arch"]
        return (self.train or {}).get("arch", "test_resnet")


@dataclass(frozen=True)
class SweepConfig:
    """A validated sweep config (see the module docstring). `raw` is the file as read."""

    conditions: tuple[Condition, ...]
    protocols: tuple[str, ...]
    split_params: tuple[dict, ...]  # one per split setting, each with its "protocol"
    seeds: tuple[int, ...]
    models: tuple[ModelSpec, ...]
    cells: tuple[str, ...] | None
    interventions: tuple[tuple[str, str, dict], ...]  # (setting name, intervention, params)
    diagnostics: tuple[str, ...]
    diagnostic_params: dict = field(hash=False)
    device: str = "cpu"
    #: torch threads of the whole sweep on this machine (None: not given, the cores available);
    #: how they are shared among tasks running at once is `sweep.threads`
    threads: int | None = None
    source: str = ""
    raw: dict = field(default_factory=dict, hash=False, compare=False)
    #: the `analysis:` mapping as given (checked; None when the config has none): it sets the
    #: defaults of `results` and `report` and is registered, never part of a task's id
    analysis: dict | None = field(default=None, hash=False)

    @property
    def protocol(self) -> str:
        """The protocols, comma-separated (one name for a single-protocol sweep)."""
        return ",".join(self.protocols)

    def to_dict(self) -> dict:
        """The resolved config, JSON-ready (saved in sweep.json)."""
        return {
            "conditions": [{"name": c.name, "kind": c.kind, "params": c.params} for c in self.conditions],
            "split": {"protocols": list(self.protocols), "params": list(self.split_params)},
            "seeds": list(self.seeds),
            "models": [{"train": m.train} if m.train is not None else {"wrap": m.wrap} if m.wrap is not None else {"checkpoint": m.checkpoint}
                       for m in self.models],
            "cells": None if self.cells is None else list(self.cells),
            "interventions": [{"setting": s, "name": n, "params": p} for s, n, p in self.interventions],
            "diagnostics": {"only": list(self.diagnostics), "params": self.diagnostic_params},
            "device": self.device,
            "threads": self.threads,
            "source": self.source,
            # only when given, so that sweep.json of a config without it is as before
            **({"analysis": dict(self.analysis)} if self.analysis is not None else {}),
        }

    def replace(self, **changes) -> "SweepConfig":
        from dataclasses import replace

        return replace(self, **changes)


# ------------------------------------------------------------------------------- loading
def check_limits(limits: Mapping[str, Any] | None, where: str = "--limit") -> dict[str, int]:
    """`DEFAULT_LIMITS` updated with `limits` (each a positive integer; names checked)."""
    out = dict(DEFAULT_LIMITS)
    for k, v in (limits or {}).items():
        if k not in DEFAULT_LIMITS:
            raise SweepConfigError(f"{where}: unknown limit {k!r}{_close(k, DEFAULT_LIMITS)} Limits: {', '.join(DEFAULT_LIMITS)}")
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise SweepConfigError(f"{where}: limit {k!r} must be a positive integer; got {_type_name(v)} {v!r}")
        out[k] = v
    return out


def _over(source: str, name: str, n: int, cap: int, lead: str = "") -> SweepConfigError:
    """'sweep.yaml: seeds: 20,000 seeds, over the cap of 10,000; raise it with ...'"""
    how = f"`limits: {{{name}: N}}` in the config or `--limit {name}=N`" if name in CONFIG_LIMITS else f"`--limit {name}=N`"
    where = f"{source}: " if source else ""
    return SweepConfigError(f"{where}{lead}{n:,} {_LIMIT_WHAT[name]}, over the cap of {cap:,}; raise it with {how} if you mean it")


def _yaml_loader(yaml):
    """A safe loader (libyaml's when installed) that refuses a key given twice in one mapping."""
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.setdefault(key, key_node.start_mark.line + 1)
                    except TypeError:  # an unhashable key: the base class names it
                        continue
                    if first != key_node.start_mark.line + 1:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r} at lines {first} and {key_node.start_mark.line + 1} "
                            "(the later would silently win; give it once)", key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    return Loader


def _check_events(yaml, text: str, Loader, limits: dict, path: str) -> None:
    """Nesting depth and scalar length from the event stream (iterative: no recursion, and no
    object is built), so a deep or huge config is refused while it is being read."""
    depth = 0
    for ev in yaml.parse(text, Loader=Loader):
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > limits["depth"]:
                raise _over(path, "depth", depth, limits["depth"], f"line {ev.start_mark.line + 1}: ")
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        elif isinstance(ev, yaml.ScalarEvent) and len(ev.value) > limits["scalar"]:
            raise _over(path, "scalar", len(ev.value), limits["scalar"], f"line {ev.start_mark.line + 1}: ")


def load_config(path: str | os.PathLike, limits: Mapping[str, int] | None = None) -> SweepConfig:
    """Read and validate a YAML sweep config.

    Args:
        path: the YAML file.
        limits: caps over `DEFAULT_LIMITS` (the config's own `limits:` mapping overrides
            the defaults of `seeds` and `tasks`, and `limits` overrides both).

    Raises:
        SweepConfigError: the file is missing, too large, too deep or not YAML, a key is given
            twice in one mapping (both lines named), the grid is over a cap, or any key is
            wrong (named).
    """
    import yaml

    path = os.fspath(path)
    caps = check_limits(limits)
    if not os.path.isfile(path):
        raise SweepConfigError(f"sweep config {path!r} {wrong_kind(path, 'file')}")
    size = os.path.getsize(path)
    if size > caps["bytes"]:
        raise _over(path, "bytes", size, caps["bytes"])
    Loader = _yaml_loader(yaml)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        _check_events(yaml, text, Loader, caps, path)
        raw = yaml.load(text, Loader=Loader)  # noqa: S506 - a safe loader (see _yaml_loader)
    except UnicodeDecodeError as e:
        raise SweepConfigError(f"{path}: not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset {e.start})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if "maximum nesting depth" in str(getattr(e, "problem", "")):  # libyaml's own cap (1,000) met while scanning ahead
            line = f"line {mark.line + 1}: " if mark is not None else ""
            raise SweepConfigError(f"{path}: {line}over 1,000 levels of nesting, over the cap of {caps['depth']:,} "
                                   "(and over libyaml's own cap of 1,000)") from None
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise SweepConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    except RecursionError:  # only past a depth cap raised far above the default
        raise SweepConfigError(f"{path}: nested too deeply to read; lower the nesting or the --limit depth") from None
    return validate(raw, source=path, base_dir=os.path.dirname(os.path.abspath(path)), limits=limits)


def validate(raw: Any, source: str = "", base_dir: str | None = None, limits: Mapping[str, int] | None = None) -> SweepConfig:
    """Validate a config mapping (as read from YAML) into a `SweepConfig`.

    Relative paths (a manifest, a checkpoint) are resolved against `base_dir` (the config
    file's folder; default the working directory). The seed count and the planned task count
    are capped (`DEFAULT_LIMITS`, then the config's `limits:`, then `limits`) before the grid
    is built.
    """
    ck = _Checker(source)
    base_dir = base_dir or os.getcwd()
    if raw is None:
        raise ck.error("(top level)", f"the config is empty; it needs the keys {', '.join(REQUIRED)}")
    raw = ck.keys("", raw, TOP_KEYS, REQUIRED)
    device = ck.typed("device", raw.get("device", "cpu"), (str,), "a device name such as 'cpu' or 'cuda'")
    try:
        from shortcutlab.models.devices import resolve_device

        resolve_device(device)
    except ShortcutlabError as e:
        raise ck.error("device", str(e)) from None
    threads = raw.get("threads")
    if threads is not None:
        threads = ck.typed("threads", threads, (int,), "a positive integer (torch threads of the sweep)")
        if threads < 1:
            raise ck.error("threads", f"expected a positive integer (torch threads of the sweep); got {threads!r}")
    caps = _limits(ck, raw.get("limits"), limits)
    seeds = _seeds(ck, raw["seeds"], caps["seeds"])
    n_tasks = planned_tasks(raw)
    if n_tasks > caps["tasks"]:
        raise _over(source, "tasks", n_tasks, caps["tasks"], "the grid plans up to ")
    conditions = _data(ck, raw["data"], base_dir)
    protocols, split_params = _split(ck, raw["split"])
    models = _models(ck, raw["models"], base_dir, conditions)
    cells = _cells(ck, raw.get("cells"), protocols, split_params)
    has_masks = all(c.kind == "synthetic" or c.params.get("mask") for c in conditions)
    ivs = _interventions(ck, raw.get("interventions"), has_masks)
    _check_split_needs(ck, ivs, split_params)
    diags, dparams = _diagnostics(ck, raw.get("diagnostics"))
    analysis = check_analysis(raw["analysis"], source) if raw.get("analysis") is not None else None
    return SweepConfig(conditions=conditions, protocols=protocols, split_params=split_params, seeds=seeds, models=models,
                       cells=cells, interventions=ivs, diagnostics=diags, diagnostic_params=dparams, device=device,
                       threads=threads, source=source, raw=raw, analysis=analysis)


def _limits(ck: _Checker, value: Any, given: Mapping[str, int] | None) -> dict[str, int]:
    """The caps: the defaults, then the config's `limits:` (seeds, tasks), then `given`."""
    if value is None:
        value = {}
    if isinstance(value, Mapping):
        early = next((k for k in value if k in DEFAULT_LIMITS and k not in CONFIG_LIMITS), None)
        if early is not None:
            raise ck.error(f"limits.{early}", f"{early!r} caps the reading of this very file, so it cannot be set inside it; "
                           f"use `--limit {early}=N` (the config may set {', '.join(CONFIG_LIMITS)})")
    v = ck.keys("limits", value, CONFIG_LIMITS)
    caps = check_limits(v, where=f"{ck.source}: limits" if ck.source else "limits")
    return {**caps, **{k: n for k, n in check_limits(given).items() if given and k in given}}


def _n_values(key: str, value: Any) -> int:
    return len(_grid_values(key, value)) if isinstance(value, list) else 1


def _product(mapping: Any, keys=None) -> int:
    n = 1
    if isinstance(mapping, Mapping):
        for k, v in mapping.items():
            if keys is None or k in keys:
                n *= _n_values(k, v)
    return n


def planned_tasks(raw: Mapping) -> int:
    """An upper bound on the tasks a config plans, from its list lengths alone (nothing is
    expanded, so a runaway grid is refused at once): per condition and seed one synthesise
    task, per split setting one split task, per trained model and cell a train, a score and
    a diagnose task, per model trained elsewhere a score and a diagnose task per split.
    Parts not yet checked count as one."""
    import inspect

    from shortcutlab.data.splits import get_protocol

    data = raw.get("data")
    n_cond, synth = 1, 0
    if isinstance(data, Mapping) and "synthetic" in data:
        s = data["synthetic"] if isinstance(data["synthetic"], Mapping) else {}
        from shortcutlab.synth import MECHANISMS

        mech = s.get("mechanisms", list(MECHANISMS))
        n_cond = max(len(mech), 1) if isinstance(mech, list) else 1
        n_cond *= _product({k: v for k, v in s.items() if k != "mechanisms"})
        synth = 1
    seeds = raw.get("seeds")
    n_seeds = max(len(seeds), 1) if isinstance(seeds, list) else 1
    split = raw.get("split")
    protocols, params = ["factorial"], {}
    if isinstance(split, Mapping):
        protocols = split.get("protocol", protocols)
        protocols = [p for p in (protocols if isinstance(protocols, list) else [protocols]) if isinstance(p, str)]
        params = split.get("params") if isinstance(split.get("params"), Mapping) else {}
    elif isinstance(split, str):
        protocols = [split]
    n_split, n_cells = 0, 1
    for p in protocols:
        fn = get_protocol(p)
        n_split += _product(params, set(inspect.signature(fn).parameters) if fn else set())
        if p == "factorial":
            n_cells = max(n_cells, 4)
        elif p == "ladder":
            levels = params.get("levels", [0] * 5)
            n_cells = max(n_cells, max((len(x) for x in _grid_values("levels", levels) if isinstance(x, list)), default=1))
    cells = raw.get("cells")
    if isinstance(cells, list) and cells and n_cells > 1:
        n_cells = len(cells)
    models = raw.get("models")
    models = models if isinstance(models, list) else [models]
    n_train = n_wrap = n_ckpt = 0
    for m in models:
        if isinstance(m, Mapping) and "classes" in m:
            n_wrap += 1
        elif isinstance(m, Mapping) and "checkpoint" in m:
            n_ckpt += 1
        else:
            n_train += _product(m)
    per_split = 1 + n_train * n_cells * 3 + n_wrap * 2
    return n_cond * n_seeds * (synth + max(n_split, 1) * per_split) + n_ckpt * 2


def _seeds(ck: _Checker, value: Any, cap: int = DEFAULT_LIMITS["seeds"]) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ck.error("seeds", "expected a non-empty list of non-negative integers; got []")
    if len(values) > cap:
        raise _over(ck.source, "seeds", len(values), cap, "seeds: ")
    for i, s in enumerate(values):
        p = f"seeds[{i}]" if isinstance(value, list) else "seeds"
        ck.typed(p, s, (int,), "a non-negative integer")
        if s < 0:
            raise ck.error(p, f"expected a non-negative integer; got {s!r}")
    seen: set[int] = set()
    for s in values:
        if s in seen:
            raise ck.error("seeds", f"seed {s} is listed twice; each replicate needs its own seed")
        seen.add(s)
    return tuple(values)


def _data(ck: _Checker, value: Any, base_dir: str) -> tuple[Condition, ...]:
    d = ck.keys("data", value, ("synthetic", "manifest"))
    if len(d) != 1:
        given = ", ".join(d) or "neither"
        raise ck.error("data", f"give exactly one of 'synthetic' or 'manifest'; got {given}")
    if "synthetic" in d:
        return _synthetic(ck, d["synthetic"])
    return (_manifest(ck, d["manifest"], base_dir),)


def _synthetic(ck: _Checker, value: Any) -> tuple[Condition, ...]:
    from shortcutlab.synth import MECHANISMS, NONE, SynthConfig

    s = ck.keys("data.synthetic", {} if value is None else value, SYNTH_KEYS)
    mech = s.pop("mechanisms", list(MECHANISMS))
    mech_list = mech if isinstance(mech, list) else [mech]
    if not mech_list:
        raise ck.error("data.synthetic.mechanisms", f"expected a mechanism, or a list of them; got []. Allowed: {', '.join(MECHANISMS + (NONE,))}")
    allowed = MECHANISMS + (NONE,)
    mechanism_sets = []
    for i, m in enumerate(mech_list):
        p = f"data.synthetic.mechanisms[{i}]" if isinstance(mech, list) else "data.synthetic.mechanisms"
        names = m if isinstance(m, list) else [m]
        for j, n in enumerate(names):
            pj = f"{p}[{j}]" if isinstance(m, list) else p
            ck.typed(pj, n, (str,), f"a mechanism name ({', '.join(allowed)})")
            for part in n.split(","):
                if part.strip().lower() not in allowed:
                    raise ck.error(pj, f"unknown mechanism {part.strip()!r}{_close(part.strip(), allowed)} Allowed: {', '.join(allowed)}")
        mechanism_sets.append(names)
    for k, v in s.items():
        if isinstance(v, list) and not v:
            raise ck.error(f"data.synthetic.{k}", "an empty list gives no grid point; give a value or a non-empty list")
    grid = expand(s)
    varying = sorted(k for k in s if len(_grid_values(k, s[k])) > 1)
    conditions = []
    strengths = s.get("strengths")
    if isinstance(strengths, Mapping):
        planted = {part.strip().lower() for names in mechanism_sets for n in names for part in n.split(",")}
        for k in strengths:
            if str(k).lower() not in planted:
                raise ck.error(f"data.synthetic.strengths.{k}", f"{k!r} is planted in no condition (mechanisms: {', '.join(sorted(planted))})")
    for names in mechanism_sets:
        for point in grid:
            params = {"mechanisms": list(names), **point}
            if isinstance(point.get("strengths"), Mapping):
                # one mapping for every condition: each condition takes the entries of its own mechanisms
                own = {part.strip().lower() for n in names for part in n.split(",")}
                params["strengths"] = {k: v for k, v in point["strengths"].items() if str(k).lower() in own}
            try:
                cfg = SynthConfig(**params)
            except ShortcutlabError as e:
                bad = _culprit(str(e), ["mechanisms", *point])
                raise ck.error(f"data.synthetic{'.' + bad if bad else ''}", str(e)) from None
            except TypeError as e:
                raise ck.error("data.synthetic", str(e)) from None
            d = cfg.to_dict()
            d.pop("seed")
            name = "+".join(cfg.mechanisms)
            if varying:
                name += "," + ",".join(f"{k}={point[k]}" for k in varying)
            conditions.append(Condition(name, "synthetic", d))
    names = [c.name for c in conditions]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ck.error("data.synthetic.mechanisms", f"condition {dup[0]!r} appears twice")
    return tuple(conditions)


def _culprit(message: str, keys) -> str:
    for k in keys:
        if f"'{k}'" in message or f"{k} " in message or message.startswith(k):
            return k
    return ""


def _param_culprit(message: str, keys) -> str:
    """The parameter of `keys` an error message is about: one it quotes ('n_folds'), else one
    it names as a word (gradcam target must be ...); "" when it names none."""
    import re

    keys = [str(k) for k in keys]
    for k in keys:
        if f"'{k}'" in message:
            return k
    for k in keys:
        if len(k) > 1 and re.search(rf"(?<![\w.]){re.escape(k)}(?![\w])", message):
            return k
    return ""


def _built(ck: _Checker, path: str, build, params: Mapping) -> None:
    """Build a component (`build(**params)`); its error becomes a one-line config error whose
    path ends in the parameter the error names (``diagnostics.params.parent_probe.n_folds``)."""
    try:
        build(**params)
    except (ShortcutlabError, TypeError, ValueError) as e:
        bad = _param_culprit(str(e), params)
        raise ck.error(f"{path}.{bad}" if bad else path, str(e)) from None


def _manifest(ck: _Checker, value: Any, base_dir: str) -> Condition:
    import pandas as pd

    if isinstance(value, str):
        value = {"path": value}
    m = ck.keys("data.manifest", value, MANIFEST_KEYS, ("path",))
    for k, v in m.items():
        if k != "mask" or v is not None:
            ck.typed(f"data.manifest.{k}", v, (str,), "a string")
    path = m["path"] if os.path.isabs(m["path"]) else os.path.normpath(os.path.join(base_dir, m["path"]))
    if not os.path.isfile(path):
        raise ck.error("data.manifest.path", f"crop manifest {m['path']!r} {wrong_kind(path, 'file')} (looked for {path})")
    try:
        cols = list(pd.read_csv(path, nrows=0).columns)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise ck.error("data.manifest.path", f"cannot read {path!r} as CSV: {e}") from None
    spec = {"path": path, "id": m.get("id", "id"), "label": m.get("label", "label"), "parent": m.get("parent", "parent"),
            "image": m.get("image", "path"), "mask": m.get("mask", "mask" if "mask" in cols else None)}
    for k in ("id", "label", "parent", "image", "mask"):
        if spec[k] is not None and spec[k] not in cols:
            raise ck.error(f"data.manifest.{k}", f"column {spec[k]!r} is not in {path}{_close(spec[k], cols)} Columns: {', '.join(cols)}")
    name = m.get("name") or os.path.splitext(os.path.basename(path))[0]
    return Condition(name, "manifest", spec)


def _split(ck: _Checker, value: Any) -> tuple[tuple[str, ...], tuple[dict, ...]]:
    import inspect

    from shortcutlab.data.splits import available_protocols, get_protocol

    if isinstance(value, str):
        value = {"protocol": value}
    s = ck.keys("split", value, ("protocol", "params"), ("protocol",))
    names = s["protocol"]
    listed = isinstance(names, list)
    names = names if listed else [names]
    if not names:
        raise ck.error("split.protocol", f"expected a protocol name or a list of them; got []. Allowed: {', '.join(available_protocols())}")
    for i, protocol in enumerate(names):
        pp = f"split.protocol[{i}]" if listed else "split.protocol"
        ck.typed(pp, protocol, (str,), f"a protocol name ({', '.join(available_protocols())})")
        if protocol not in available_protocols():
            raise ck.error(pp, f"unknown protocol {protocol!r}{_close(protocol, available_protocols())} Allowed: {', '.join(available_protocols())}")
    protocols = tuple(dict.fromkeys(names))
    multi = [p for p in protocols if p in ("factorial", "ladder")]
    if len(multi) > 1:
        raise ck.error("split.protocol", f"at most one multi-cell protocol per sweep (their cells differ); got {', '.join(multi)}")
    params = s.get("params") or {}
    accepted = {p: [a for a in inspect.signature(get_protocol(p)).parameters if a not in ("table", "seed", "hashes")] for p in protocols}
    allowed = list(dict.fromkeys(a for p in protocols for a in accepted[p]))
    params = ck.keys("split.params", params, allowed)
    for k, v in params.items():
        if isinstance(v, list) and not v:
            raise ck.error(f"split.params.{k}", "an empty list gives no grid point")
        for i, x in enumerate(_grid_values(k, v)):
            p = f"split.params.{k}" + (f"[{i}]" if isinstance(v, list) and len(_grid_values(k, v)) > 1 else "")
            if k in LIST_VALUED:
                ck.typed(p, x, (list,), "a list of numbers")
            elif k in ("unit", "allocation"):
                ck.typed(p, x, (str,), "a string")
                choices = {"unit": ("parent", "group"), "allocation": ("balanced", "proportional")}[k]
                if x not in choices:
                    raise ck.error(p, f"unknown value {x!r}{_close(x, choices)} Allowed: {', '.join(choices)}")
            elif k in ("n_per_class", "max_distance"):
                if x is not None:
                    ck.typed(p, x, (int,), "an integer")
            else:
                if x is not None:
                    ck.typed(p, x, (int, float), "a number")
    # each protocol takes the parameters it accepts (test_fraction is shared by crop and parent)
    from shortcutlab.data.splits import check_params

    settings: list[dict] = []
    for protocol in protocols:
        for point in expand({k: v for k, v in params.items() if k in accepted[protocol]}):
            # the protocol's own range checks, without data: refused now, not when the split task runs
            try:
                check_params(protocol, **point)
            except ShortcutlabError as e:
                bad = _param_culprit(str(e), point) or next((k for k in point if k.replace("_", " ") in str(e)), "")
                listed = bad and isinstance(params.get(bad), list) and len(_grid_values(bad, params[bad])) > 1
                at = f"[{_grid_values(bad, params[bad]).index(point[bad])}]" if listed else ""
                raise ck.error(f"split.params{'.' + bad + at if bad else ''}", f"{protocol}: {e}") from None
            setting = {"protocol": protocol, **point}
            if setting not in settings:
                settings.append(setting)
    return protocols, tuple(settings)


def _cells(ck: _Checker, value: Any, protocols, split_params) -> tuple[str, ...] | None:
    from shortcutlab.data.splits import FACTORIAL_CELLS

    protocol = next((p for p in protocols if p in ("factorial", "ladder")), protocols[0])
    split_params = [sp for sp in split_params if sp["protocol"] == protocol]
    if protocol == "factorial":
        allowed = FACTORIAL_CELLS
    elif protocol == "ladder":
        allowed = tuple(sorted({f"level_{float(f):.2f}" for p in split_params for f in p.get("levels", (0.0, 0.25, 0.5, 0.75, 1.0))}))
    else:
        if value is not None:
            ck.typed("cells", value, (list, str), "a list of cell names")
        return None  # single-cell protocols: the key is ignored
    if value is None:
        return tuple(allowed)
    values = [value] if isinstance(value, str) else value
    ck.typed("cells", values, (list,), f"a list of cell names ({', '.join(allowed)})")
    if not values:
        raise ck.error("cells", f"expected at least one cell; allowed: {', '.join(allowed)}")
    for i, c in enumerate(values):
        ck.typed(f"cells[{i}]", c, (str,), f"a cell name ({', '.join(allowed)})")
        if c not in allowed:
            raise ck.error(f"cells[{i}]", f"unknown {protocol} cell {c!r}{_close(c, allowed)} Allowed: {', '.join(allowed)}")
    return tuple(dict.fromkeys(values))


def train_types() -> dict[str, tuple[tuple[type, ...], str]]:
    """The settings a model entry of the config trains with: name -> (accepted YAML types, what
    a valid value is in words), as `TrainConfig` declares them (`train_settings`); the settings
    that top-level keys set for every model (seed, device) are left out."""
    return {s.name: (s.kinds, s.expected) for s in train_settings() if s.sweep_key is None}


def _archs() -> list[str]:
    import timm

    from shortcutlab.models.cam_cnn import register

    register()  # shortcutlab's own model names join timm's
    return timm.list_models()


WRAP_KEYS = ("weights", "arch", "classes", "name")


def _data_classes(cond: Condition) -> list[str]:
    """The class names of a data condition (read from the manifest's label column)."""
    import pandas as pd

    if cond.kind == "synthetic":
        from shortcutlab.synth import SynthConfig

        return list(SynthConfig.from_dict({**cond.params, "seed": 0}).labels)
    col = cond.params["label"]
    labels = pd.read_csv(cond.params["path"], usecols=[col], dtype={col: str}, keep_default_na=False)[col]
    return sorted(set(labels))


def _wrap_spec(ck: _Checker, p: str, entry: Mapping, base_dir: str, conditions) -> ModelSpec:
    """A model trained elsewhere: a timm architecture, a local state dict and the class names in
    the model's logit order. Checked here: the file, the architecture, the classes against
    every data condition's labels, and that the weights load into the architecture."""
    from shortcutlab.models.adapter import ModelError, create_model
    from shortcutlab.io import file_sha256

    bad = next((k for k in entry if k not in WRAP_KEYS), None)
    if bad is not None:
        raise ck.error(f"{p}.{bad}", f"unknown key {bad!r} for a model trained elsewhere (an entry with 'classes' is scored, not "
                       f"trained){_close(bad, WRAP_KEYS)} Allowed keys: {', '.join(WRAP_KEYS)}")
    e = ck.keys(p, entry, WRAP_KEYS, ("weights", "arch", "classes"))
    w = ck.typed(f"{p}.weights", e["weights"], (str,), "a local .safetensors or .pt/.pth state dict file")
    full = w if os.path.isabs(w) else os.path.normpath(os.path.join(base_dir, w))
    if not os.path.isfile(full):
        raise ck.error(f"{p}.weights", f"weights file {w!r} {wrong_kind(full, 'file')} (looked for {full})")
    arch = ck.typed(f"{p}.arch", e["arch"], (str,), "a timm model name")
    if arch not in _archs():
        raise ck.error(f"{p}.arch", f"unknown architecture {arch!r}{_close(arch, _archs())} (any timm model name: timm.list_models())")
    classes = ck.typed(f"{p}.classes", e["classes"], (list,), "a list of class names in the model's logit order")
    for j, c in enumerate(classes):
        ck.typed(f"{p}.classes[{j}]", c, (str,), "a class name")
    if len(classes) < 2 or len(set(classes)) != len(classes):
        dup = [c for c in classes if classes.count(c) > 1]
        why = f"{dup[0]!r} is listed twice" if dup else f"got {len(classes)}"
        raise ck.error(f"{p}.classes", f"expected at least two distinct class names in the model's logit order; {why}")
    for cond in conditions:
        data = _data_classes(cond)
        missing = [c for c in data if c not in classes]
        extra = [c for c in classes if c not in data]
        if missing or extra:
            parts = ([f"missing {', '.join(map(repr, missing))}"] if missing else []) + ([f"not in the data {', '.join(map(repr, extra))}"] if extra else [])
            raise ck.error(f"{p}.classes", f"the classes {classes} do not match the labels of data condition {cond.name!r} "
                           f"({', '.join(data)}): {'; '.join(parts)}")
    name = e.get("name")
    if name is not None:
        ck.typed(f"{p}.name", name, (str,), "a string naming the model in the tables")
    try:
        model = create_model(arch, num_classes=len(classes), pretrained=full, new_head=False)
    except ModelError as err:
        raise ck.error(f"{p}.weights", str(err)) from None
    if list(classes) != sorted(classes) and not isinstance(model.get_classifier(), __import__("torch").nn.Linear):
        raise ck.error(f"{p}.classes", f"the classes {classes} are not in name order and the model's classifier is not a Linear "
                       "layer whose rows can be reordered; list them in name order")
    return ModelSpec(wrap={"arch": arch, "weights": full, "classes": list(classes),
                           "name": name or os.path.splitext(os.path.basename(full))[0], "weights_sha256": file_sha256(full)})


def _models(ck: _Checker, value: Any, base_dir: str, conditions=()) -> tuple[ModelSpec, ...]:
    entries = value if isinstance(value, list) else [value]
    if not entries:
        raise ck.error("models", "expected a non-empty list of models (arch: ..., checkpoint: ... or weights/arch/classes)")
    types = train_types()
    train_keys = tuple(types)
    top_level = {s.name: s.sweep_key for s in train_settings() if s.sweep_key is not None}  # seed -> seeds, device -> device
    out: list[ModelSpec] = []
    for i, entry in enumerate(entries):
        p = f"models[{i}]"
        if isinstance(entry, str):
            entry = {"arch": entry}
        if isinstance(entry, Mapping) and "classes" in entry:
            out.append(_wrap_spec(ck, p, entry, base_dir, conditions))
            continue
        if isinstance(entry, Mapping) and "checkpoint" in entry:
            e = ck.keys(p, entry, ("checkpoint",))
            cp = ck.typed(f"{p}.checkpoint", e["checkpoint"], (str,), "a run folder written by `shortcutlab train`")
            full = cp if os.path.isabs(cp) else os.path.normpath(os.path.join(base_dir, cp))
            if os.path.exists(full) and not os.path.isdir(full):
                raise ck.error(f"{p}.checkpoint", f"run folder {cp!r} {wrong_kind(full, 'folder')} (looked for {full})")
            for f in ("run.json", "model.safetensors"):
                if not os.path.isfile(os.path.join(full, f)):
                    raise ck.error(f"{p}.checkpoint", f"{cp!r} is not a run folder of `shortcutlab train`: it has no {f} (looked in {full})")
            out.append(ModelSpec(checkpoint=full))
            continue
        if isinstance(entry, Mapping) and any(k in entry for k in top_level):
            k = next(k for k in top_level if k in entry)
            raise ck.error(f"{p}.{k}", f"a model takes no {k!r}: the top-level {top_level[k]} sets it")
        e = ck.keys(p, entry, train_keys + ("checkpoint",))
        for k, v in e.items():
            if isinstance(v, list) and not v:
                raise ck.error(f"{p}.{k}", "an empty list gives no grid point")
            kinds, expected = types[k]
            vals = _grid_values(k, v)
            for j, x in enumerate(vals):
                pj = f"{p}.{k}" + (f"[{j}]" if len(vals) > 1 else "")
                ck.typed(pj, x, kinds, expected)
                if k == "arch" and x not in _archs():
                    raise ck.error(pj, f"unknown architecture {x!r}{_close(x, _archs())} (any timm model name: timm.list_models())")
                if k == "augment" and x is not None:
                    _intervention_class(ck, pj, x)
                if k in pair_names() and (len(x) != 2 or not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in x)):
                    raise ck.error(pj, f"expected a list of two numbers [low, high]; got {x!r}")
                if k == "weights" and x is not None:
                    full = x if os.path.isabs(x) else os.path.normpath(os.path.join(base_dir, x))
                    if not os.path.isfile(full):
                        raise ck.error(pj, f"weights file {x!r} {wrong_kind(full, 'file')} (looked for {full})")
        for point in expand(e):
            if point.get("weights"):
                w = point["weights"]
                point["weights"] = w if os.path.isabs(w) else os.path.normpath(os.path.join(base_dir, w))
            try:
                cfg = TrainConfig.from_dict(point)
            except ShortcutlabError as err:
                bad = _culprit(str(err), list(point))
                raise ck.error(f"{p}{'.' + bad if bad else ''}", str(err)) from None
            d = {k: v for k, v in cfg.to_dict().items() if k not in top_level}
            if cfg.augment:
                import interventions

                _built(ck, f"{p}.augment_params", lambda **kw: interventions.get(cfg.augment, **kw), cfg.augment_params)
            out.append(ModelSpec(train=d))
    return tuple(out)


def _intervention_class(ck: _Checker, path: str, name: Any):
    import interventions

    ck.typed(path, name, (str,), "an intervention name")
    allowed = interventions.available()
    if name not in allowed:
        raise ck.error(path, f"unknown intervention {name!r}{_close(name, allowed)} Allowed: {', '.join(allowed)}")
    return interventions.get_class(name)


def setting_name(name: str, params: Mapping) -> str:
    """The `intervention` value of a setting: the name, with its parameters when given
    ('low_pass:sigma=2.0')."""
    if not params:
        return name
    return name + ":" + ",".join(f"{k}={params[k]}" for k in sorted(params))


def _interventions(ck: _Checker, value: Any, has_masks: bool) -> tuple[tuple[str, str, dict], ...]:
    import interventions

    if value is None or value == "none":
        return ()
    if isinstance(value, (str, list)):
        value = {"names": value}
    v = ck.keys("interventions", value, ("names", "params"))
    names = v.get("names", "all")
    params = v.get("params") or {}
    ck.typed("interventions.params", params, (dict,), "a mapping intervention name -> parameters")
    if names == "all":
        names = [n for n in interventions.available() if not interventions.get_class(n).label_conditioned
                 and (has_masks or not interventions.get_class(n).requires_mask)]
        explicit = False
    else:
        ck.typed("interventions.names", names, (list,), "a list of intervention names, or 'all'")
        if not names:
            raise ck.error("interventions.names", "an empty list names no intervention; write `interventions: none` to "
                           "score only the unaltered crops, or list names (or 'all')")
        explicit = True
    out = []
    for i, n in enumerate(names):
        p = f"interventions.names[{i}]"
        cls = _intervention_class(ck, p, n)
        if explicit and cls.requires_mask and not has_masks:
            raise ck.error(p, f"intervention {n!r} needs cell masks and the manifest has no mask column")
        if cls.label_conditioned and not interventions.declares_targets(cls):
            raise ck.error(p, f"intervention {n!r} is label-conditioned and the sweep cannot choose its targets")
        settings = params.get(n, {})
        if settings == []:
            raise ck.error(f"interventions.params.{n}", f"an empty list gives no setting, so {n!r} would be scored under none; give a "
                           "mapping of its parameters ({} for the defaults) or a non-empty list of them")
        settings = settings if isinstance(settings, list) else [settings]
        for j, s in enumerate(settings):
            ps = f"interventions.params.{n}" + (f"[{j}]" if len(settings) > 1 else "")
            ck.typed(ps, s, (dict,), "a mapping of the intervention's parameters")
            _built(ck, ps, lambda _n=n, **kw: interventions.get(_n, **kw), s)
            out.append((setting_name(n, s), n, dict(s)))
    for k in params:
        if k not in names:
            raise ck.error(f"interventions.params.{k}", f"{k!r} is not among interventions.names{_close(k, names)} ({', '.join(names)})")
    seen: set[str] = set()
    for s, _, _ in out:
        if s in seen:
            raise ck.error("interventions.names", f"intervention setting {s!r} is listed twice")
        seen.add(s)
    return tuple(out)


def _check_split_needs(ck: _Checker, ivs, split_params) -> None:
    """Every split setting of the sweep must serve every listed intervention: each class is
    asked (`Intervention.check_split`; e.g. ``reinhard_unseen_field`` draws each test crop's
    target from a field no cell trained on, F2, which only a factorial with
    ``reserve_parent_share > 0`` is sure to leave)."""
    import interventions

    for name in dict.fromkeys(n for _, n, _ in ivs):
        cls = interventions.get_class(name)
        for sp in split_params:
            params = {k: v for k, v in sp.items() if k != "protocol"}
            try:
                cls.check_split(sp.get("protocol", "factorial"), params)
            except interventions.SplitRequirementError as e:
                raise ck.error(f"split.params.{e.param}" if e.param else "interventions.names", str(e)) from None


def _diagnostics(ck: _Checker, value: Any) -> tuple[tuple[str, ...], dict]:
    import probes

    if value is None:
        value = {}
    if value == "none" or value is False:
        return (), {}
    if isinstance(value, list):
        value = {"only": value}
    v = ck.keys("diagnostics", value, ("only", "params"))
    allowed = probes.available()
    only = v.get("only")
    if only == "none":  # as `diagnostics: none`
        only = []
    if only is None:
        only = [n for n in allowed if n not in DEFAULT_EXCLUDED_DIAGNOSTICS]
    else:
        ck.typed("diagnostics.only", only, (list,), "a list of diagnostic names")
    for i, n in enumerate(only):
        ck.typed(f"diagnostics.only[{i}]", n, (str,), "a diagnostic name")
        if n not in allowed:
            raise ck.error(f"diagnostics.only[{i}]", f"unknown diagnostic {n!r}{_close(n, allowed)} Allowed: {', '.join(allowed)}")
    params = v.get("params") or {}
    ck.typed("diagnostics.params", params, (dict,), "a mapping diagnostic name -> parameters")
    for n, p in params.items():
        if n not in only:
            raise ck.error(f"diagnostics.params.{n}", f"{n!r} is not among the diagnostics run{_close(n, only)} ({', '.join(only)})")
        ck.typed(f"diagnostics.params.{n}", p, (dict,), "a mapping of the diagnostic's parameters")
    # every diagnostic is built with its parameters now, as the diagnose task will build it:
    # each checks all its settings in its constructor, so a bad one stops the sweep before any work
    for n in dict.fromkeys(only):
        _built(ck, f"diagnostics.params.{n}", lambda _n=n, **kw: probes.get(_n, **kw), params.get(n, {}))
    return tuple(dict.fromkeys(only)), {k: dict(p) for k, p in params.items()}


# ------------------------------------------------------------------------------- analysis
#: the keys of the `analysis:` mapping and their defaults (None: the statistics' own default,
#: `interval` the estimates' interval method, `families` their Holm families, `hypotheses` the
#: default rows of each label, `estimands` every registered estimand)
ANALYSIS_DEFAULTS = {"n_boot": 10_000, "seed": 0, "level": 0.95, "interval": None, "alpha": 0.05, "families": None,
                     "hypotheses": None, "estimands": None}


def _fraction(ck: _Checker, path: str, value: Any) -> float:
    ck.typed(path, value, (int, float), "a number strictly between 0 and 1")
    if not 0 < value < 1:
        raise ck.error(path, f"expected a number strictly between 0 and 1; got {value!r}")
    return float(value)


def _hypotheses(ck: _Checker, value: Any) -> dict[str, dict]:
    """Which rows carry which hypothesis label: label -> selector {estimates column: value(s)}
    (`shortcutlab.stats.hypotheses.check_hypotheses`); replaces the default labels."""
    from shortcutlab.stats import StatsError
    from shortcutlab.stats.hypotheses import check_hypotheses

    ck.typed("analysis.hypotheses", value, (dict,), "a mapping hypothesis label -> selector {column: value(s)}")
    try:
        check_hypotheses(value)
    except StatsError as e:
        raise ck.error("analysis." + str(e).split(":", 1)[0], str(e).split(":", 1)[1].strip()) from None
    return {str(k): {c: (list(v) if isinstance(v, (list, tuple)) else v) for c, v in sel.items()} for k, sel in value.items()}


def _families(ck: _Checker, value: Any, own_labels=()) -> dict[str, list[str]]:
    """Holm families: family name -> the labels of its hypotheses (each label in one family);
    `own_labels`: those the config's `hypotheses` names beside the paper's."""
    ck.typed("analysis.families", value, (dict,), "a mapping family name -> list of hypothesis labels")
    if not value:
        raise ck.error("analysis.families", "expected at least one family (leave the key out for the default families)")
    owner: dict[str, str] = {}
    for name, labels in value.items():
        p = f"analysis.families.{name}"
        ck.typed(p, name, (str,), "a family name (a string)")
        ck.typed(p, labels, (list,), "a non-empty list of hypothesis labels")
        if not labels:
            raise ck.error(p, "expected a non-empty list of hypothesis labels; got []")
        for i, label in enumerate(labels):
            ck.typed(f"{p}[{i}]", label, (str,), "a hypothesis label (a string such as 'H3')")
            if label in owner:
                raise ck.error(f"{p}[{i}]", f"hypothesis {label!r} is already in family {owner[label]!r}; Holm adjusts each "
                               "hypothesis within one family")
            owner[label] = name
    from shortcutlab.stats import StatsError
    from shortcutlab.stats.hypotheses import check_families

    try:  # each label must be one the statistics know
        check_families(value, own_labels)
    except StatsError as e:
        raise ck.error("analysis.families", str(e).removeprefix("families: ")) from None
    return {k: list(v) for k, v in value.items()}


def _estimand_names(ck: _Checker, value: Any) -> list[str]:
    from shortcutlab.stats import available_estimands

    allowed = available_estimands()
    ck.typed("analysis.estimands", value, (list,), f"a non-empty list of estimand names ({', '.join(allowed)})")
    if not value:
        raise ck.error("analysis.estimands", f"expected at least one estimand; allowed: {', '.join(allowed)}")
    for i, name in enumerate(value):
        ck.typed(f"analysis.estimands[{i}]", name, (str,), "an estimand name")
        if name not in allowed:
            raise ck.error(f"analysis.estimands[{i}]", f"unknown estimand {name!r}{_close(name, allowed)} Allowed: {', '.join(allowed)}")
    if len(set(value)) != len(value):
        dup = next(n for n in value if value.count(n) > 1)
        raise ck.error("analysis.estimands", f"estimand {dup!r} is listed twice")
    return list(value)


def check_analysis(value: Any, source: str = "") -> dict:
    """Check a config's `analysis:` mapping (the settings a study registers for its
    estimates): `n_boot` (resamples >= 0), `seed` (>= 0), `level` and `alpha` (in (0, 1)),
    `interval` (the name of the interval method, a string passed through to
    `shortcutlab.stats.estimates`), `families` (Holm families: name -> hypothesis labels),
    `hypotheses` (label -> selector of the rows it names, replacing the default labels) and
    `estimands` (registered names).

    Args:
        value: the mapping as read from YAML.
        source: the config file, named in errors.

    Returns:
        The mapping with every key of `ANALYSIS_DEFAULTS`, the missing ones at their default.

    Raises:
        SweepConfigError: an unknown key or a bad value, naming the key path and the value.
    """
    ck = _Checker(source)
    a = ck.keys("analysis", value, tuple(ANALYSIS_DEFAULTS))
    out = dict(ANALYSIS_DEFAULTS)
    for key in ("n_boot", "seed"):
        if key in a:
            v = ck.typed(f"analysis.{key}", a[key], (int,), "an integer >= 0")
            if v < 0:
                raise ck.error(f"analysis.{key}", f"expected an integer >= 0; got {v!r}")
            out[key] = v
    for key in ("level", "alpha"):
        if key in a:
            out[key] = _fraction(ck, f"analysis.{key}", a[key])
    if a.get("interval") is not None:
        v = ck.typed("analysis.interval", a["interval"], (str,), "the name of an interval method (a string)")
        if not v.strip():
            raise ck.error("analysis.interval", "expected the name of an interval method; got an empty string")
        out["interval"] = v
    if a.get("hypotheses") is not None:
        out["hypotheses"] = _hypotheses(ck, a["hypotheses"])
    if a.get("families") is not None:
        out["families"] = _families(ck, a["families"], tuple(out["hypotheses"] or ()))
    if a.get("estimands") is not None:
        out["estimands"] = _estimand_names(ck, a["estimands"])
    return out
