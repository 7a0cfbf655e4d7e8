"""Contract checks for plug-ins, to call in a plug-in's own tests (scikit-learn's ``check_estimator``).

- `check_intervention`: an image intervention (`interventions.Intervention`);
- `check_diagnostic`: a diagnostic (`probes.Diagnostic`);
- `check_executor`: a sweep executor (`shortcutlab.sweep.executors.base`).

Each takes the plug-in's class (made with its default arguments) or an instance, runs the
contract on small synthetic inputs, returns None when every rule holds and raises
`AssertionError` naming the first broken rule otherwise. shortcutlab's own contract tests
(``tests/test_interventions_contract.py``, ``tests/test_probes_contract.py``,
``tests/test_sweep_executors.py``) run them over every registered plug-in.

Example (in a plug-in's test file):
    >>> from shortcutlab.testing import check_intervention
    >>> from my_package.blur import MyBlur                       # doctest: +SKIP
    >>> check_intervention(MyBlur)                               # doctest: +SKIP
    >>> check_intervention(MyBlur(sigma=3.0))                    # doctest: +SKIP

This module sits at the top of the package (it imports interventions, probes and the sweep);
the heavy imports happen inside the checks, so that executor workers that import the toy task
below stay light.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import json
import math
import os
import tempfile
import time
import warnings
from typing import Any, Callable, Mapping

#: Batch size and image size of the synthetic intervention inputs.
B, H, W = 4, 24, 24

SHAPE_RULE = "the output has the input's shape, dtype and device"


def _fail(rule: str, detail: str) -> AssertionError:
    return AssertionError(f"{rule}: {detail}")


def _instance(obj, kind: str, base: type):
    """An instance of `obj` (a class is made with its default arguments)."""
    if inspect.isclass(obj):
        try:
            return obj()
        except TypeError as e:
            raise AssertionError(f"{obj.__name__} cannot be made with its default arguments ({e}); pass an instance to check_{kind}") from None
    if base is not None and not isinstance(obj, base):
        raise _fail(f"check_{kind} takes a {base.__name__} subclass or instance", f"got {type(obj).__name__}")
    return obj


# --- synthetic inputs ----------------------------------------------------------------------------
def synthetic_batch(dtype=None, device="cpu", seed: int = 0, n: int = B):
    """A float ``(n, 3, H, W)`` batch in [0, 1] of darker, purplish cells on a bright
    background (so that stain methods find tissue) and its ``(n, 1, H, W)`` cell masks.

    Args:
        dtype: torch dtype of both (default float32).
        device: where they are made.
        seed: seeds the pixel noise.
        n: the number of crops.
    """
    import torch

    dtype = dtype or torch.float32
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, H, W, generator=g, dtype=torch.float64)
    yy, xx = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    r2 = (yy - H / 2 + 0.5) ** 2 + (xx - W / 2 + 0.5) ** 2
    mask = (r2 < (H / 3) ** 2).to(torch.float64).expand(n, 1, H, W).clone()
    x = mask * (0.35 + 0.3 * x * torch.tensor([1.0, 0.6, 1.0]).view(1, 3, 1, 1)) + (1 - mask) * (0.8 + 0.15 * x)
    return x.to(device=device, dtype=dtype), mask.to(device=device, dtype=dtype)


def synthetic_crops(n_parents: int = 12, per_parent: int = 6, size: int = 32, seed: int = 0):
    """Synthetic `shortcutlab.data.images.CropImages`: ``n_parents * per_parent`` uint8 crops
    with a per-parent tint (a parent shortcut to find), square cell masks, three classes
    ('k0', 'k1', 'k2') assigned by parent, ids 'c000'..., parents 'p00'..."""
    import pandas as pd
    import torch

    from shortcutlab.data.images import CropImages
    from shortcutlab.data.table import CropTable

    g = torch.Generator().manual_seed(seed)
    n = n_parents * per_parent
    ids = [f"c{i:03d}" for i in range(n)]
    parents = [f"p{i // per_parent:02d}" for i in range(n)]
    labels = [f"k{(i // per_parent) % 3}" for i in range(n)]
    table = CropTable.from_frame(pd.DataFrame({"id": ids, "label": labels, "parent": parents}), id="id", label="label", parent="parent")
    tint = torch.rand(n_parents, 3, 1, 1, generator=g)
    images = (0.5 * torch.rand(n, 3, size, size, generator=g) + 0.5 * tint.repeat_interleave(per_parent, 0)) * 255
    masks = torch.zeros(n, 1, size, size, dtype=torch.bool)
    masks[:, :, size // 4 : 3 * size // 4, size // 4 : 3 * size // 4] = True
    order = torch.from_numpy(pd.Index(ids).get_indexer(table.ids))
    return CropImages(images.to(torch.uint8)[order], masks[order], table)


def synthetic_context(run_id: str = "tiny", seed: int = 0):
    """A `probes.DiagnosticContext` for diagnostics: a tiny untrained ResNet with BatchNorm
    (``test_resnet``, 3 classes, eval mode) on `synthetic_crops` with a parent split (a third
    of the crops in test)."""
    import torch

    from probes import DiagnosticContext
    from shortcutlab.data.audit import side_codes
    from shortcutlab.data.splits import parent_split
    from shortcutlab.models.adapter import create_model, wrap

    torch.manual_seed(seed)
    crops = synthetic_crops(seed=seed)
    split = parent_split(crops.table, test_fraction=0.34, seed=seed)
    adapter = wrap(create_model("test_resnet", num_classes=3)).eval()
    return DiagnosticContext(adapter, crops, side_codes(crops.table, split.cell()), run_id=run_id, batch_size=32)


# --- interventions -------------------------------------------------------------------------------
def _first_dim(value) -> int | None:
    shape = getattr(value, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else None


def _targets_context(cls) -> Callable | None:
    """Check the optional ``targets_for(crops, split, seed)`` hook on synthetic crops; return a
    context function (x -> per-crop keyword arguments for x's rows) when it gives targets."""
    targets_for = getattr(cls, "targets_for", None)
    if targets_for is None:
        return None
    rule = "targets_for(crops, split, seed) returns None or a dict of per-crop arrays, first dim = number of crops"
    from shortcutlab.data.splits import parent_split

    crops = synthetic_crops(n_parents=12, per_parent=4, size=H)
    split = parent_split(crops.table, test_fraction=0.5, seed=0)
    targets = targets_for(crops, split, 0)
    if targets is None:
        return None
    n = crops.table.n_crops
    if not isinstance(targets, Mapping):
        raise _fail(rule, f"got {type(targets).__name__}")
    for key, value in targets.items():
        if not isinstance(key, str) or _first_dim(value) != n:
            raise _fail(rule, f"{key!r} has shape {getattr(value, 'shape', type(value).__name__)}; expected first dim {n}")
    return lambda x: {k: _rows(v, len(x), x.device) for k, v in targets.items()}


def _rows(value, k: int, device):
    import torch

    v = value[:k]
    return v.to(device) if isinstance(v, torch.Tensor) else v


def _check_metadata(t) -> None:
    for attr in ("requires_mask", "stochastic", "label_conditioned"):
        if not isinstance(getattr(t, attr, None), bool):
            raise _fail("metadata class attributes are bools", f"{attr} is {getattr(t, attr, None)!r}")
    if hasattr(type(t), "label") and not isinstance(type(t).label, str):
        raise _fail("the display label is a str", f"label is {type(t).label!r}")


def _check_twin(t) -> None:
    """A registered intervention has a function twin named like it in its module."""
    import sys

    if not t.name:
        return
    twin = getattr(sys.modules.get(type(t).__module__), t.name, None)
    if not (callable(twin) and not inspect.isclass(twin)):
        raise _fail("every intervention has a plain function twin", f"{type(t).__module__}.{t.name} (the twin of {type(t).__name__}) is missing")


def _check_output(t, call, dtype, device) -> None:
    """Shape, dtype, device, range; the input batch and mask are not changed in place."""
    import torch

    x, mask = synthetic_batch(dtype, device)
    g = torch.Generator().manual_seed(1) if t.stochastic else None
    before, mask_before = x.clone(), mask.clone()
    try:
        y = call(x, mask, generator=g)
    except Exception as e:  # the base class's forward refuses an output of another shape
        rule = SHAPE_RULE if "broke the contract" in str(e) else "a valid batch is transformed"
        raise _fail(rule, f"{dtype} on {device}: {type(e).__name__}: {e}") from e
    if not (torch.equal(x, before) and torch.equal(mask, mask_before)):
        raise _fail("the input is not changed in place", "the input batch or mask was modified in place")
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != dtype or y.device != x.device:
        got = f"{tuple(y.shape)} {y.dtype} on {y.device}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise _fail(SHAPE_RULE, f"input {tuple(x.shape)} {dtype} on {x.device}, output {got}")
    if not torch.isfinite(y).all() or float(y.min()) < 0.0 or float(y.max()) > 1.0:
        raise _fail("the output is finite and in [0, 1]", f"got min {float(y.min()):.4g}, max {float(y.max()):.4g}")
    if y.requires_grad and not x.requires_grad:
        raise _fail("the output needs no gradient when the input needs none", "y.requires_grad is True")


def _check_empty_batch(t, call, dtype, with_mask: bool) -> None:
    """B = 0 gives an empty batch of the same dtype, silently, with empty draws and flags."""
    import torch

    rule = "an empty batch (B = 0) gives an empty batch, silently"
    x, mask = synthetic_batch(dtype)
    x, mask = x[:0], (mask[:0] if with_mask else None)
    g = torch.Generator().manual_seed(0) if t.stochastic else None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            y = call(x, mask, generator=g)
        except Exception as e:
            raise _fail(rule, f"{'with' if with_mask else 'without'} a mask it raised {type(e).__name__}: {e}") from e
    if y.shape != (0, 3, H, W) or y.dtype != dtype or y.device != x.device:
        raise _fail(rule, f"got {tuple(y.shape)} {y.dtype}")
    if t.stochastic:
        if not all(v.shape[0] == 0 for v in t.last_params.values() if isinstance(v, torch.Tensor)):
            raise _fail(rule, "the draw (last_params) of an empty batch is not empty")
        try:
            torch.testing.assert_close(call(x, mask, params=t.last_params), y)
        except AssertionError as e:
            raise _fail(rule, f"replaying the empty draw gives another output: {e}") from None
    if t.last_applicable is not None and (t.last_applicable.shape != (0,) or t.last_applicable.dtype != torch.bool):
        raise _fail(rule, f"last_applicable is {tuple(t.last_applicable.shape)} {t.last_applicable.dtype}, not (0,) bool")


def _check_determinism(t, call) -> None:
    """Deterministic: equal twice, params refused. Stochastic: a seed fixes the draw, replay works."""
    import torch

    from interventions import InterventionError

    x, mask = synthetic_batch()
    if not t.stochastic:
        if not torch.equal(call(x, mask), call(x, mask)):
            raise _fail("a deterministic intervention gives the same output twice", "two calls differ")
        try:
            call(x, mask, params={})
        except InterventionError as e:
            if "deterministic" in str(e):
                return
        raise _fail("a deterministic intervention refuses params", "params={} gave no InterventionError naming 'deterministic'")
    seeded = lambda s: call(x, mask, generator=torch.Generator().manual_seed(s))  # noqa: E731
    a = seeded(7)
    params = t.last_params
    if not torch.equal(seeded(7), a):
        raise _fail("a seed fixes a stochastic intervention's draw", "two calls with seed 7 differ")
    if torch.equal(seeded(8), a):
        raise _fail("a different seed gives a different draw", "seeds 7 and 8 gave the same output")
    if not torch.equal(call(x, mask, params=params), a):
        raise _fail("params=last_params replays the draw", "the replay differs from the draw")
    t2 = copy.deepcopy(t)
    t2.generator = torch.Generator().manual_seed(7)
    if not torch.equal(call(x, mask, module=t2), a):
        raise _fail("the constructor's generator is used when the call gives none", "a generator seeded 7 gave another draw")


def _expect_error(call, rule: str, pattern: str) -> None:
    import re

    from interventions import InterventionError

    try:
        call()
    except InterventionError as e:
        if re.search(pattern, str(e)):
            return
        raise _fail(rule, f"the InterventionError does not say {pattern!r}: {e}") from e
    except Exception as e:
        raise _fail(rule, f"raised {type(e).__name__} instead of InterventionError: {e}") from e
    raise _fail(rule, "no InterventionError")


def _check_masks(t, call) -> None:
    import torch

    x, mask = synthetic_batch()
    gen = lambda: torch.Generator().manual_seed(0) if t.stochastic else None  # noqa: E731
    if t.requires_mask:
        _expect_error(lambda: call(x, None), "requires_mask: a call without a mask is refused", "mask")
    else:
        call(x, None, generator=gen())
    _expect_error(lambda: call(x, mask[..., :-1], generator=gen()), "a mask of the wrong shape is refused", r"\(B, 1, H, W\)")
    _expect_error(lambda: call(x, mask * 2.0, generator=gen()), "a mask outside [0, 1] is refused", "mask")
    try:
        torch.testing.assert_close(call(x, mask.bool(), generator=gen()), call(x, mask, generator=gen()))
    except AssertionError as e:
        raise _fail("a bool mask means the same as a 0/1 float mask", str(e).splitlines()[0]) from None


def _check_bad_input(t, call) -> None:
    import torch

    x, mask = synthetic_batch()
    bad = {
        "uint8": ((x * 255).to(torch.uint8), "float"),
        "rank 3": (x[0], r"\(B, 3, H, W\)"),
        "two channels": (x[:, :2], r"\(B, 3, H, W\)"),
        "above one": (x * 2.0, r"\[0, 1\]"),
        "NaN": (x.clone().fill_(float("nan")), r"\[0, 1\]"),
        "zero height": (x[:, :, :0], "at least 1 x 1 pixel"),
    }
    for what, (xb, pattern) in bad.items():
        _expect_error(lambda: call(xb, mask), f"bad input is refused ({what})", pattern)


def check_intervention(intervention, *, context: Callable | Mapping | None = None, device: str = "cpu") -> None:
    """Run the intervention contract (`interventions.base`) on synthetic cell crops.

    Rules: bool metadata (``requires_mask``, ``stochastic``, ``label_conditioned``) and a str
    ``label`` where there is one; a function twin named like a registered intervention in its
    module; ``targets_for(crops, split, seed)``, where defined, returns None or per-crop
    arrays; for float32 and float64 the output has the input's shape, dtype and device, is
    finite, in [0, 1], needs no gradient, and the input is not changed in place; an empty
    batch gives an empty batch without warnings (with and, unless ``requires_mask``, without a
    mask); deterministic ones repeat and refuse ``params``, stochastic ones repeat with a seed,
    change with another, replay ``last_params`` and use the constructor's generator; masks
    (missing, wrong shape, outside [0, 1], bool) and bad images (uint8, rank 3, two
    channels, > 1, NaN, zero height) are handled as documented, with `InterventionError`.

    Args:
        intervention: an `interventions.Intervention` subclass (made with its defaults) or
            instance.
        context: for a label-conditioned intervention, its per-crop keyword arguments: a
            function ``x -> dict`` or a dict of per-crop arrays (the first rows are used);
            default: from its ``targets_for`` hook.
        device: a further device to run the output rule on (e.g. "cuda").

    Raises:
        AssertionError: naming the broken rule.
    """
    import torch

    from interventions import Intervention

    t = _instance(intervention, "intervention", Intervention)
    _check_metadata(t)
    _check_twin(t)
    from_hook = _targets_context(type(t))
    if isinstance(context, Mapping):
        context = functools.partial(lambda c, x: {k: _rows(v, len(x), x.device) for k, v in c.items()}, dict(context))
    context = context or from_hook
    if t.label_conditioned and context is None:
        raise _fail("a label-conditioned intervention gets its per-crop context",
                    f"{type(t).__name__} defines no targets_for(crops, split, seed) giving targets; pass context= to check_intervention")

    def call(x, mask, module=None, **kw):
        m = module or t
        return m(x, mask, **(context(x) if m.label_conditioned else {}), **kw)

    devices = ["cpu"] + ([device] if device != "cpu" else [])
    for dev in devices:
        for dtype in (torch.float32, torch.float64):
            _check_output(t.to(dev), call, dtype, dev)
    t.to("cpu")
    for dtype in (torch.float32, torch.float64):
        for with_mask in (True, False) if not t.requires_mask else (True,):
            _check_empty_batch(t, call, dtype, with_mask)
    _check_determinism(t, call)
    _check_masks(t, call)
    _check_bad_input(t, call)


# --- diagnostics ---------------------------------------------------------------------------------
def _model_state(adapter) -> dict:
    return {k: v.detach().clone() for k, v in adapter.model.state_dict().items()}


def _same_rows(a: list[dict], b: list[dict]) -> bool:
    ka = [(r["setting"], r["metric"], r["value"]) for r in a]
    kb = [(r["setting"], r["metric"], r["value"]) for r in b]
    return len(ka) == len(kb) and all(x[:2] == y[:2] and (x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2]))) for x, y in zip(ka, kb))


def _check_rows(d, rows, ctx) -> None:
    from probes import ROW_COLUMNS

    if not rows:
        raise _fail("a diagnostic returns rows", f"{d.name or type(d).__name__} returned no rows")
    for r in rows:
        if tuple(r)[: len(ROW_COLUMNS)] != ROW_COLUMNS:
            raise _fail("every row starts with ROW_COLUMNS", f"got columns {tuple(r)}; expected {ROW_COLUMNS} first (use probes.row)")
        if r["diagnostic"] != d.name or r["run_id"] != ctx.run_id:
            raise _fail("rows name the diagnostic and the run", f"diagnostic {r['diagnostic']!r}, run_id {r['run_id']!r}; expected {d.name!r}, {ctx.run_id!r}")
        if not isinstance(r["value"], float) or not isinstance(r["n"], int):
            raise _fail("value is a float and n an int", f"value {r['value']!r}, n {r['n']!r}")
        if not math.isnan(r["ci_low"]) and not r["ci_low"] <= r["value"] + 1e-12 <= r["ci_high"] + 2e-12:
            raise _fail("the interval holds the value", f"{r['metric']}: {r['value']} outside [{r['ci_low']}, {r['ci_high']}]")
    lacking = sorted(set(type(d).supplies.values()) - {r["metric"] for r in rows})
    if lacking:
        raise _fail("rows carry every metric the diagnostic supplies", f"no rows of metric {', '.join(map(repr, lacking))}, "
                    f"named in {type(d).__name__}.supplies")


def _check_untouched(d, run, ctx) -> list[dict]:
    """Run on ctx; the model's weights and train/eval modes come back as they were."""
    before = _model_state(ctx.adapter)
    modes = [m.training for m in ctx.adapter.modules()]
    rows = run(ctx)
    after = _model_state(ctx.adapter)
    if not all(before[k].equal(after[k]) for k in before):
        raise _fail("the model is left bit-identical", f"{d.name or type(d).__name__} changed the model's weights or statistics (BatchNorm?)")
    if [m.training for m in ctx.adapter.modules()] != modes:
        raise _fail("the model's train/eval modes are left as they were", f"{d.name or type(d).__name__} changed train/eval modes")
    return rows


def _check_needs(d, ctx) -> None:
    import numpy as np

    from probes import DiagnosticContext
    from shortcutlab.data.images import CropImages

    if "masks" in d.needs:
        no_masks = DiagnosticContext(ctx.adapter, CropImages(ctx.crops.images, None, ctx.table), ctx.side)
        if "masks" not in (d.missing(no_masks) or ""):
            raise _fail("needs are checked before running", "needs masks, but missing() on crops without masks does not say 'masks'")
    if "split" in d.needs:
        no_test = DiagnosticContext(ctx.adapter, ctx.crops, np.where(ctx.side == 2, -1, ctx.side))
        if "test" not in (d.missing(no_test) or ""):
            raise _fail("needs are checked before running", "needs a split, but missing() on a split without test crops does not say 'test'")


def check_diagnostic(diagnostic, *, context=None) -> None:
    """Run the diagnostic contract (`probes.base`) on a tiny model and synthetic crops.

    Rules: ``missing(ctx)`` is None on a context that has everything and names what lacks
    (masks, test crops) for one that does not; ``run(ctx)`` returns rows that start with
    `probes.ROW_COLUMNS`, name the diagnostic and the run, hold a float value and an int n,
    with the value inside its interval, and of every metric its ``supplies`` names; the model's weights, statistics and train/eval
    modes are left as they were, also for a model left in train mode, whose rows equal
    those of the same model in eval mode; a second run (a fresh copy of the diagnostic)
    gives the same rows.

    Args:
        diagnostic: a `probes.Diagnostic` subclass (made with its defaults) or instance.
        context: the `probes.DiagnosticContext` to run on (default `synthetic_context`);
            build it once to check many diagnostics.

    Raises:
        AssertionError: naming the broken rule.
    """
    from probes import Diagnostic, DiagnosticContext

    d = _instance(diagnostic, "diagnostic", Diagnostic)
    fresh = copy.deepcopy(d)
    ctx = context or synthetic_context()
    if d.missing(ctx) is not None:
        raise _fail("missing() is None when the context has everything", f"it says {d.missing(ctx)!r}")
    _check_needs(d, ctx)
    rows = _check_untouched(d, d.run, ctx)
    _check_rows(d, rows, ctx)
    if not _same_rows(rows, copy.deepcopy(fresh).run(ctx)):
        raise _fail("a second run gives the same rows", "the (setting, metric, value) rows differ")
    in_train = DiagnosticContext(copy.deepcopy(ctx.adapter).train(), ctx.crops, ctx.side, run_id=ctx.run_id, batch_size=ctx.batch_size)
    train_rows = _check_untouched(d, copy.deepcopy(fresh).run, in_train)
    if not all(m.training for m in in_train.adapter.modules()):
        raise _fail("the model's train/eval modes are left as they were", "a model in train mode was left in eval mode")
    if not all(not m.training for m in ctx.adapter.modules()):
        eval_ctx = DiagnosticContext(copy.deepcopy(ctx.adapter).eval(), ctx.crops, ctx.side, run_id=ctx.run_id, batch_size=ctx.batch_size)
        rows = copy.deepcopy(fresh).run(eval_ctx)
    if not _same_rows(train_rows, rows):
        raise _fail("a model in train mode is measured in eval mode", "its rows differ from those of the same model in eval mode")


# --- executors -----------------------------------------------------------------------------------
def _digest(params: dict, inputs: list[str]) -> str:
    return hashlib.sha256((json.dumps(params, sort_keys=True) + "|" + "|".join(inputs)).encode()).hexdigest()


def toy_task(out_dir: str, task) -> dict:
    """The task function of `check_executor` (module level, so process pools and Ray workers
    import it by name): marks its start, checks that its dependencies' outputs exist (a
    ``<id>.early`` marker and a RuntimeError otherwise), writes ``<id>.txt`` (a SHA-256 of its
    parameters and inputs) and returns ``{"name", "digest"}``; ``params["fail"]`` plants a
    ValueError."""
    from shortcutlab.io import write_text

    write_text(os.path.join(out_dir, f"{task.id}.started"), "")
    inputs = []
    for d in task.deps:
        path = os.path.join(out_dir, f"{d}.txt")
        if not os.path.exists(path):
            write_text(os.path.join(out_dir, f"{task.id}.early"), d)
            raise RuntimeError(f"dependency {d} of {task.id} has no output yet")
        with open(path) as f:
            inputs.append(f.read())
    name = task.params["name"]
    if task.params.get("fail"):
        raise ValueError(f"planted failure in {name}")
    time.sleep(task.params.get("sleep", 0.0))
    text = _digest(task.params, inputs)
    write_text(os.path.join(out_dir, f"{task.id}.txt"), text)
    return {"name": name, "digest": text[:12]}


def toy_graph(fail: str | None = None):
    """a -> (b, c) -> d, plus e -> g and a lone f, as a `shortcutlab.sweep.TaskGraph` of
    `toy_task` tasks; `fail` names the task that raises. Returns the graph and name -> id."""
    from shortcutlab.sweep import TaskGraph

    g = TaskGraph()
    ids: dict[str, str] = {}
    for name, deps, extra in (("a", (), {}), ("b", ("a",), {}), ("c", ("a",), {"weight": 2}), ("d", ("b", "c"), {}),
                              ("e", (), {}), ("f", (), {"sleep": 0.2}), ("g", ("e",), {})):
        params = {"name": name, "sleep": 0.05, **extra}
        if name == fail:
            params["fail"] = True
        ids[name] = g.add("toy", params, [ids[d] for d in deps])
    return g, ids


def toy_outputs(graph) -> dict[str, str]:
    """The files `toy_task` must leave for `graph`, by a plain recursion (no executor)."""
    memo: dict[str, str] = {}

    def out(tid: str) -> str:
        if tid not in memo:
            t = graph[tid]
            memo[tid] = _digest(t.params, [out(d) for d in t.deps])
        return memo[tid]

    return {f"{t.id}.txt": out(t.id) for t in graph.ordered()}


def _files(folder: str, suffix: str) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(suffix):
            with open(os.path.join(folder, name)) as f:
                out[name] = f.read()
    return out


def _run_toy(ex, graph, folder: str) -> tuple[list, BaseException | None]:
    """Run `graph` on `ex`; return the on_done calls (id, result, pid) and the exception."""
    calls: list[tuple[str, Any, int]] = []
    try:
        ex.run(graph.ordered(), functools.partial(toy_task, folder), lambda t, r: calls.append((t.id, r, os.getpid())))
    except Exception as e:  # judged by the caller
        return calls, e
    return calls, None


def _check_early(graph, folder: str) -> None:
    for name, dep in _files(folder, ".early").items():
        tid = name[: -len(".early")]
        raise _fail("a task starts only after all its dependencies returned", f"task {tid} ({graph[tid].params['name']}) started before its dependency {dep} finished")


def _check_success(ex, folder: str) -> None:
    graph, ids = toy_graph()
    calls, err = _run_toy(ex, graph, folder)
    _check_early(graph, folder)
    if err is not None:
        raise _fail("a graph whose tasks succeed runs to the end", f"run raised {type(err).__name__}: {err}") from err
    expected = toy_outputs(graph)
    if _files(folder, ".txt") != expected:
        raise _fail("the outputs equal those of running the functions in order", "the task files differ from the plain recursion's")
    done = [tid for tid, _, _ in calls]
    if sorted(done) != sorted(ids.values()):
        raise _fail("on_done is called once per task", f"called for {len(done)} task(s), {len(set(done))} distinct, of {len(ids)}")
    if any(pid != os.getpid() for _, _, pid in calls):
        raise _fail("on_done is called in the calling process", "it ran in another process")
    for tid, result, _ in calls:
        want = {"name": graph[tid].params["name"], "digest": expected[f"{tid}.txt"][:12]}
        if result != want:
            raise _fail("on_done gets the task function's result", f"task {tid}: got {result!r}, expected {want!r}")
    position = {tid: i for i, tid in enumerate(done)}
    for t in graph.ordered():
        if not all(position[d] < position[t.id] for d in t.deps):
            raise _fail("on_done is called as tasks finish, dependencies first", f"task {t.id} reported before a dependency")


def _check_failure(ex, folder: str) -> None:
    from shortcutlab.sweep import TaskFailed

    graph, ids = toy_graph(fail="b")
    calls, err = _run_toy(ex, graph, folder)
    if os.path.exists(os.path.join(folder, f"{ids['d']}.started")):
        raise _fail("no task is started after a failure", f"task {ids['d']} (d), which depends on the failed one, was started")
    _check_early(graph, folder)
    rule = "a failing task raises TaskFailed naming the task and the cause"
    if not isinstance(err, TaskFailed):
        raise _fail(rule, f"got {type(err).__name__ if err else 'no exception'}: {err}")
    if err.task.id != ids["b"] or not isinstance(err.cause, ValueError) or str(err) != f"toy task {ids['b']} failed: ValueError: planted failure in b":
        raise _fail(rule, f"got task {err.task.id}, cause {err.cause!r}: {err}")
    reported = sorted(tid for tid, _, _ in calls)
    finished = sorted(name[: -len(".txt")] for name in _files(folder, ".txt"))
    if reported != finished:
        raise _fail("on_done is called for every task that finished, also after a failure", f"reported {reported}, finished {finished}")


def check_executor(executor) -> None:
    """Run the executor contract (`shortcutlab.sweep.executors.base`) on a small task graph.

    The toy graph (`toy_graph`: a -> (b, c) -> d, e -> g, a lone f; `toy_task` writes files)
    runs twice in a temporary folder, once as is and once with b failing. Rules: a task
    starts only after its dependencies returned; the outputs and the results handed to
    ``on_done`` equal those of running the functions in order (`toy_outputs`); ``on_done``
    is called once per task, dependencies first, in the calling process; a failing task
    raises `TaskFailed` naming the task and the original exception, no dependant is started,
    and every task that finished is still reported. The local executor takes a few seconds.

    Args:
        executor: an executor class (made with its defaults) or instance.

    Raises:
        AssertionError: naming the broken rule.
    """
    ex = _instance(executor, "executor", None)
    if not callable(getattr(ex, "run", None)):
        raise _fail("an executor has run(tasks, fn, on_done)", f"{type(ex).__name__} has no run method")
    with tempfile.TemporaryDirectory(prefix="shortcutlab-check-executor-") as root:
        for step, check in (("ok", _check_success), ("fail", _check_failure)):
            folder = os.path.join(root, step)
            os.mkdir(folder)
            check(ex, folder)
