"""Grad-CAM saliency, the share of attribution outside the cell, and the randomised-head check.

**Grad-CAM** (Selvaraju et al. 2017) on ``adapter.cam_layer``: with A the layer's activations
laid out as a (B, C, h, w) map (`ModelAdapter.cam_reshape`: a ViT's patch tokens on their grid,
prefix tokens dropped) and s_k the logit of the target class k,

    w_c = mean_{i,j} ds_k / dA_{c,i,j},        map = ReLU(sum_c w_c A_c)          (h, w)

upsampled to the input size by bilinear interpolation with ``align_corners=False`` (PyTorch's
``F.interpolate``; the same as captum's ``LayerAttribution.interpolate(..., "bilinear")``).
ReLU comes before upsampling, so a bilinear map stays non-negative. Maps are in the units of
the layer's activations times logit per activation; they are not min-max scaled per crop
(the outside mass and Spearman's rho do not depend on the scale). The result equals captum's
``LayerGradCam(..., relu_attributions=True)`` followed by that interpolation.

Two ways to the same map:

- **autograd** (any model): one forward pass in which autograd starts at the cam_layer's
  output (a fresh leaf), so the backward pass runs only through the layers after it, then
  ``torch.autograd.grad`` of the summed target logits.
- **fast** (global average pooling then one linear head, timm CNNs among them): when the
  features are the spatial mean of A and the logits are W f + b, ds_k/dA_c = W_kc / (h w) at
  every position, so w = W_k / (h w) and the map of *any* linear head is a matrix product with
  the same activations: a re-initialised head costs no second forward or backward pass. It
  does not apply to timm's ViTs (class-token pooling, or a norm after the token mean).
  The conditions are checked numerically on every batch, never assumed: the model is in eval
  mode, the head is one ``nn.Linear``, the features equal the spatial mean of A and the
  logits equal ``head(features)``, to float tolerance (`fast_path_reason` says which failed).
  With ``path="auto"`` (default) the trained head's maps come from autograd (which, starting
  at the layer, costs little more than the forward pass) and the derivative is checked too:
  ds_k/dA must be W_k / (h w) at every position; where all of this holds, re-initialised
  heads reuse the activations, and where it does not, they get their own forward and
  backward passes. ``path="fast"`` checks the values only and skips the backward pass.

On both, the forward pass of the trained model's maps may run, in eval mode, on an **inference
twin** (`_inference_twin`): a copy in which every ``Conv2d`` registered right before a
``BatchNorm2d`` is folded with it into one conv (exact in real arithmetic) with a
channels-last weight, and the input is channels-last; all other modules share the user's
tensors, and the user's model is never modified. It is checked when built (each BN's input is
its conv's output; activations and logits match the user's model to 1e-4 of their maximum on
up to 16 crops), rebuilt when a folded tensor changes, and used only where it measured faster
on this machine (`forward_choice`: plain and twin forward passes timed once per model class,
device, dtype and crop shape; the twin must take at most `TWIN_MARGIN` of the plain time) and
the fast path then holds; otherwise the user's model runs. Whether it wins depends on the
machine: on resnet18 at 64 px with torch 2.14 on 2 shared CPU cores it measured 1.5x faster
in one run and 11-17% slower in another (docs/benchmarks.md). `HeadCheck.forward` and the diagnostic's note say
which ran. Maps agree with the unfolded model to about 1e-6 (relative to their maximum).

**Outside mass** (`outside_mass`): per crop, the positive attribution outside the cell over
all positive attribution, sum(max(M, 0) (1 - m)) / sum(max(M, 0)), with m the cell mask (1 on
the cell; soft masks weight the background by 1 - m). Unitless, in [0, 1]. A map with no
positive attribution gives NaN (undefined, not 0); so does an empty mask (no cell pixel: there
is no cell to be outside of, and counting such crops as 1 would bias the mean by a
segmentation failure), with a warning that counts them.

**Randomised-head check** (Adebayo et al. 2018, "Sanity checks for saliency maps"): the head
is re-initialised from a seed (`ModelAdapter.reset_head`), the maps are recomputed for the
same target classes, and Spearman's rho (average ranks for ties, over the H x W pixels) is
taken per crop between the original and the randomised map. Maps that merely outline the
input would barely change (rho near 1); maps that depend on the trained head change (rho
near 0; the paper: median 0.08). The **random-pair baseline** is the same statistic between
the original maps of different crops (crop i against crop i + 1, cyclically within the
batch; give the crops in random order): what rho is for unrelated maps that share only
layout. The **cascading** variant (``cascade=k``) also re-initialises the last k blocks
before the head, depth counting blocks (residual, transformer, ConvNeXt blocks), never single
layers such as a final LayerNorm (`cascade_blocks` says what depth k randomises per family). Re-initialisation follows the rule of
`ModelAdapter.reset_head`: weights and biases uniform in +-1/sqrt(fan_in), normalisation
layers back to identity, all drawn from one generator seeded with ``seed`` (the head first,
then the blocks from the top down, so a deeper cascade extends a shallower one). The model
always comes back unchanged: the state of every re-initialised module (the whole model, if
it is in training mode) is copied first and loaded back, bit for bit, also after an error.

Example:
    >>> import torch
    >>> from shortcutlab import wrap
    >>> from shortcutlab.models.adapter import create_model
    >>> adapter = wrap(create_model("test_resnet", num_classes=3)).eval()
    >>> x = torch.rand(4, 3, 64, 64)
    >>> maps = gradcam(adapter, x, targets=None)          # the predicted classes
    >>> maps.shape
    torch.Size([4, 64, 64])
    >>> m = torch.zeros(4, 1, 64, 64); m[..., 16:48, 16:48] = 1
    >>> outside_mass(maps, m).shape
    torch.Size([4])
    >>> check = randomized_head_check(adapter, x, None, m, seed=0)
    >>> check.spearman.shape, check.path
    (torch.Size([4]), 'fast')
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import time
import warnings
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Iterator, Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from shortcutlab.models.adapter import ModelAdapter, ModelError, reinit_parameters

from .base import Diagnostic, DiagnosticContext, row
from .errors import DiagnosticError
from shortcutlab.models.adapter import eval_mode
from .registry import register

__all__ = [
    "GradCamDiagnostic",
    "HeadCheck",
    "CONSTANT_ROUNDINGS",
    "cascade_blocks",
    "constant_maps",
    "fast_path_reason",
    "forward_choice",
    "pick_forward",
    "gradcam",
    "outside_mass",
    "preserved_state",
    "randomized_head_check",
    "spearman",
]

Upsample = Literal["bilinear", "nearest"]
CamPath = Literal["auto", "fast", "autograd"]
UPSAMPLE = ("bilinear", "nearest", None)
PATHS = ("auto", "fast", "autograd")


# ------------------------------------------------------------------------------ checks
def _check_adapter(adapter) -> ModelAdapter:
    if not isinstance(adapter, ModelAdapter):
        raise DiagnosticError(f"Grad-CAM needs a shortcutlab ModelAdapter (shortcutlab.wrap(model)); got {type(adapter).__name__}")
    adapter.cam_layer  # noqa: B018 - raises ModelError naming cam_layer= when there is none
    return adapter


def _check_batch(adapter: ModelAdapter, x, who: str) -> int:
    """B of a batch the adapter accepts (a float (B, 3, H, W) tensor in [0, 1] on its device and
    dtype: `InputError` otherwise) with at least one crop; before any targets or masks are read."""
    adapter.check_input(x)
    if x.shape[0] == 0:
        raise DiagnosticError(f"{who} needs at least one crop; got a batch of shape {tuple(x.shape)}")
    return int(x.shape[0])


def _check_options(relu, upsample, path) -> None:
    if not isinstance(relu, bool):
        raise DiagnosticError(f"relu must be True or False; got {relu!r}")
    if upsample not in UPSAMPLE:
        raise DiagnosticError(f"upsample must be 'bilinear', 'nearest' or None (maps at the cam_layer's resolution); got {upsample!r}")
    if path not in PATHS:
        raise DiagnosticError(f"path must be 'auto', 'fast' or 'autograd'; got {path!r}")


def _check_targets(targets, b: int, device) -> torch.Tensor | None:
    """(B,) int64 class indices, or None for the predicted classes."""
    if targets is None:
        return None
    if isinstance(targets, (bool, np.bool_)):
        raise DiagnosticError(f"targets must be class indices (an int, or one per crop); got {targets!r}")
    if isinstance(targets, (int, np.integer)):
        return torch.full((b,), int(targets), dtype=torch.long, device=device)
    t = torch.as_tensor(np.asarray(targets.detach().cpu() if isinstance(targets, torch.Tensor) else targets))
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.dtype.is_complex:
        raise DiagnosticError(f"targets must be integer class indices; got dtype {t.dtype}")
    if t.dim() != 1 or t.shape[0] != b:
        raise DiagnosticError(f"targets must have one class index per crop, shape ({b},); got shape {tuple(t.shape)}")
    return t.to(device=device, dtype=torch.long)


def _check_range(t: torch.Tensor, k: int) -> None:
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= k):
        bad = t[(t < 0) | (t >= k)][0]
        raise DiagnosticError(f"targets must be class indices in [0, {k}); got {int(bad)}")


def _check_masks(masks, b: int, size: tuple[int, int]) -> torch.Tensor:
    """(B, H, W) float mask (1 on the cell) matching maps of spatial `size`."""
    if not isinstance(masks, torch.Tensor):
        raise DiagnosticError(f"masks must be a (B, 1, H, W) tensor (1 on the cell); got {type(masks).__name__}")
    want = (b, 1, *size)
    m = masks
    if m.dim() == 4 and m.shape[1] == 1:
        m = m[:, 0]
    if m.dim() != 3 or tuple(m.shape) != (b, *size):
        raise DiagnosticError(
            f"masks must be (B, 1, H, W) = {want}, the size of the maps; got shape {tuple(masks.shape)} "
            "(resize the masks to the crops, or use upsample= so that maps have the input size)"
        )
    if m.dtype == torch.bool:
        return m.float()
    if not m.is_floating_point():
        m = m.float()
    if m.numel():
        lo, hi = torch.aminmax(m.detach())
        if float(lo) < 0 or float(hi) > 1:
            raise DiagnosticError(f"masks must hold values in [0, 1] (1 on the cell); got values in [{float(lo):.4g}, {float(hi):.4g}]")
    return m


# -------------------------------------------------------------------- forward passes
@dataclass
class _Pass:
    """One forward pass: the cam_layer output (a leaf when `grad`), features and logits."""

    raw: torch.Tensor
    feats: torch.Tensor
    logits: torch.Tensor


def _forward(adapter: ModelAdapter, x: torch.Tensor, *, grad: bool, order: list | None = None) -> _Pass:
    """Run the model once, capturing the cam_layer's output.

    With `grad`, the trunk up to cam_layer runs without autograd; the hook replaces the layer's
    output by a clone of a fresh leaf and turns autograd on, so the graph (and any backward
    pass) covers only what comes after the layer. `order`, when given, collects the names of
    the modules with parameters in the order they run.
    """
    if grad and torch.is_inference_mode_enabled():
        raise DiagnosticError("Grad-CAM's autograd path cannot run under torch.inference_mode(); call it outside (no_grad is fine)")
    layer = adapter.cam_layer
    seen: list[torch.Tensor] = []

    def hook(module, inputs, output):
        if not isinstance(output, torch.Tensor):
            raise ModelError(
                f"cam_layer={adapter.cam_layer_name!r} returned a {type(output).__name__}, not a tensor; wrap the model with "
                "another cam_layer="
            )
        leaf = output.detach()
        seen.append(leaf)
        if grad:
            leaf.requires_grad_(True)
            torch.set_grad_enabled(True)  # undone when the no_grad block below exits
            return leaf.clone()  # downstream in-place ops must not touch the leaf
        return None

    handles = [layer.register_forward_hook(hook)]
    if order is not None:
        names = {m: n for n, m in adapter.model.named_modules() if n and next(m.parameters(recurse=False), None) is not None}
        for m, n in names.items():
            handles.append(m.register_forward_pre_hook(lambda mod, inp, n=n: order.append(n)))
    try:
        with torch.no_grad():
            feats, logits = adapter.features_and_logits(x)
    finally:
        for h in handles:
            h.remove()
    if len(seen) != 1:
        raise ModelError(
            f"cam_layer={adapter.cam_layer_name!r} ran {len(seen)} times in one forward pass of {type(adapter.model).__name__}; "
            "Grad-CAM needs a layer that runs exactly once"
        )
    if logits.dim() != 2:
        raise ModelError(f"the model's logits must be (B, K); got shape {tuple(logits.shape)}")
    return _Pass(seen[0], feats, logits)


def _linear_head(adapter: ModelAdapter) -> nn.Linear | None:
    head = adapter.head
    return head if type(head) is nn.Linear else None


def _near(a: torch.Tensor, b: torch.Tensor, scale: float) -> bool:
    """max |a - b| <= sqrt(eps) * scale (one fused pass; allclose is slow on broadcast views)."""
    if a.numel() == 0:
        return True
    tol = math.sqrt(torch.finfo(a.dtype).eps) if a.is_floating_point() else 0.0
    with torch.no_grad():
        return float((a - b).abs().amax()) <= tol * scale


def _fast_reason(adapter: ModelAdapter, p: _Pass, a: torch.Tensor) -> str | None:
    """Why the fast path does not give this batch's Grad-CAM (None when it does)."""
    if adapter.model.training:
        return "the model is in training mode (dropout, batch statistics); call adapter.eval()"
    head = _linear_head(adapter)
    if head is None:
        return f"the head is a {type(adapter.head).__name__}, not a single nn.Linear"
    f = p.feats.detach()
    if f.shape[1] != a.shape[1]:
        return f"the features have {f.shape[1]} dimensions but the cam_layer has {a.shape[1]} channels"
    if not _near(f, a.mean(dim=(2, 3)), 1.0 + float(f.abs().amax()) if f.numel() else 1.0):
        return "the features are not the spatial mean of the cam_layer's activations"
    z = p.logits.detach()
    if not _near(z, F.linear(f, head.weight, head.bias), 1.0 + float(z.abs().amax()) if z.numel() else 1.0):
        return "the logits are not head(features)"
    return None


def _upsample(cam: torch.Tensor, size, upsample) -> torch.Tensor:
    if upsample is None or tuple(cam.shape[-2:]) == tuple(size):
        return cam
    if upsample == "bilinear":
        return F.interpolate(cam[:, None], size=tuple(size), mode="bilinear", align_corners=False)[:, 0]
    return F.interpolate(cam[:, None], size=tuple(size), mode="nearest")[:, 0]


def _finish(cam: torch.Tensor, relu: bool, size, upsample) -> torch.Tensor:
    if relu:
        cam = cam.clamp_min(0)
    return _upsample(cam, size, upsample)


def _fast_cam(a: torch.Tensor, weight: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """(B, h, w) un-rectified Grad-CAM of a GAP + linear head with weight (K, C)."""
    h, w = a.shape[-2:]
    return torch.einsum("bc,bchw->bhw", weight[t] / (h * w), a)


def _grad(adapter: ModelAdapter, p: _Pass, t: torch.Tensor, size) -> torch.Tensor:
    """d(sum of the target logits) / dA, laid out as A (B, C, h, w), from the pass's graph."""
    score = p.logits.gather(1, t[:, None]).sum()
    g = None
    if score.requires_grad:
        (g,) = torch.autograd.grad(score, p.raw, allow_unused=True)
    if g is None:  # the logits do not depend on this layer: a blank map (NaN outside mass)
        g = torch.zeros_like(p.raw)
    return adapter.cam_reshape(g, size)


def _uniform_grad_reason(adapter: ModelAdapter, gm: torch.Tensor, t: torch.Tensor) -> str | None:
    """The derivative half of the fast path's conditions: dA gets W[t] / (h w) at every position."""
    h, w = gm.shape[-2:]
    want = (_linear_head(adapter).weight.detach()[t] / (h * w))[:, :, None, None]
    if not _near(gm, want, float(want.abs().amax()) if want.numel() else 1.0):
        return "the gradient of the target logits is not W[target] / (h w) at every position of the cam_layer"
    return None


def _cams(adapter, x, targets, path, order=None, fold=False):
    """(raw (B, h, w) maps, targets, path, pass, reshaped activations, forward) of one batch.

    'auto' takes the gradient by autograd (from the cam_layer on, so about one forward pass)
    and reports 'fast' when the value and derivative conditions hold on this batch, so that
    other linear heads can reuse the activations; 'fast' checks the values only. With `fold`,
    the pass runs on the adapter's inference twin (`_inference_twin`) where it has one and it
    measured faster (`forward_choice`), and its result is kept only if it takes the fast path;
    otherwise the user's model runs. `forward` says which ran: 'twin' or 'plain'.
    """
    if fold and path != "autograd" and order is None and _forward_choice(adapter, x) == "twin":
        out = _cams_on(_inference_twin(adapter, x), adapter, x.contiguous(memory_format=torch.channels_last), targets, path,
                       None, strict=False)
        if out is not None:
            return (*out, "twin")
    return (*_cams_on(adapter, adapter, x, targets, path, order), "plain")


def _cams_on(runner, adapter, x, targets, path, order, strict=True):
    """`_cams` with the forward pass run by `runner` (the adapter or its twin); the fast path's
    conditions are checked against `adapter`'s head. Not `strict`: None unless the fast path holds."""
    size = tuple(x.shape[-2:])
    p = _forward(runner, x, grad=path != "fast", order=order)
    t = targets if targets is not None else p.logits.detach().argmax(dim=1)
    _check_range(t, p.logits.shape[1])
    a = adapter.cam_reshape(p.raw.detach(), size)
    if path == "fast":
        why = _fast_reason(adapter, p, a)
        if why is not None:
            if not strict:
                return None
            raise DiagnosticError(f"Grad-CAM's fast path does not apply: {why}; use path='auto' or 'autograd'")
        return _fast_cam(a, _linear_head(adapter).weight.detach(), t), t, "fast", p, a
    gm = _grad(adapter, p, t, size)
    if path == "auto" and _fast_reason(adapter, p, a) is None and _uniform_grad_reason(adapter, gm, t) is None:
        # the same map up to rounding; computed as the re-initialised heads' maps will be, so
        # that an unchanged head reproduces it bit for bit
        return _fast_cam(a, _linear_head(adapter).weight.detach(), t), t, "fast", p, a
    if not strict:
        return None
    return torch.einsum("bc,bchw->bhw", gm.mean(dim=(2, 3)), a), t, "autograd", p, a


# ------------------------------------------------------------------ the inference twin
# adapter -> (key, twin or None); weak, so a dropped adapter takes its twin with it.
_TWINS: "weakref.WeakKeyDictionary[ModelAdapter, tuple]" = weakref.WeakKeyDictionary()
_TWIN_TOL = 1e-4  # a folded twin must reproduce activations and logits to this share of their max


def _conv_bn_pairs(model: nn.Module) -> list[tuple[str, str, str]]:
    """(parent, conv, bn) names: an ``nn.Conv2d`` registered right before an ``nn.BatchNorm2d``
    (exact types, running statistics, matching channels) in the same parent module."""
    out = []
    for pname, parent in model.named_modules():
        kids = list(parent._modules.items())
        for (cn, conv), (bn_name, bn) in zip(kids, kids[1:]):
            if (type(conv) is nn.Conv2d and type(bn) is nn.BatchNorm2d and bn.track_running_stats
                    and bn.running_mean is not None and bn.running_var is not None and conv.out_channels == bn.num_features):
                out.append((pname, cn, bn_name))
    return out


def _twin_key(adapter: ModelAdapter, tensors: list[torch.Tensor]) -> tuple:
    return (tuple(map(id, adapter.modules())), tuple((id(t), t._version) for t in tensors))


def _inference_twin(adapter: ModelAdapter, x: torch.Tensor) -> ModelAdapter | None:
    """A copy of the adapter for eval-mode forward passes, with every conv -> BatchNorm pair
    folded into one conv (``w' = w g / sqrt(v + eps)``, ``b' = (b - m) g / sqrt(v + eps) + beta``)
    whose weight is channels-last, or None (training mode, nothing to fold, or the check failed).

    Every other module of the twin shares the user's parameters and buffers (a re-initialised
    head is seen at once); the user's model is never modified. The twin is rebuilt when a
    module of the adapter is replaced or a folded tensor changes in place (its version), and
    checked when built: on up to 16 crops of `x` each BN's input must be its conv's output
    (hooks on the user's model) and the cam_layer's activations and the logits must match the
    user's model to `_TWIN_TOL` of their largest magnitude; where not, the user's model is used.
    """
    model = adapter.model
    if any(m.training for m in model.modules()):
        return None
    cached = _TWINS.get(adapter)
    if cached is not None and cached[0] == _twin_key(adapter, cached[2]):
        return cached[1]
    pairs = _conv_bn_pairs(model)
    used = [t for pn, cn, bn in pairs for m in (model.get_submodule(pn)._modules[cn], model.get_submodule(pn)._modules[bn])
            for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))]
    key = _twin_key(adapter, used)
    twin = _build_twin(adapter, pairs, x) if pairs else None
    _TWINS[adapter] = (key, twin, used)
    return twin


def _build_twin(adapter: ModelAdapter, pairs, x: torch.Tensor) -> ModelAdapter | None:
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    memo = {id(t): t for t in (*adapter.parameters(), *adapter.buffers())}
    twin = copy.deepcopy(adapter, memo)  # new modules around the user's own tensors
    with torch.no_grad():
        for pn, cn, bn in pairs:
            parent = twin.model.get_submodule(pn)
            fused = fuse_conv_bn_eval(parent._modules[cn], parent._modules[bn])
            w = fused.weight.detach().contiguous(memory_format=torch.channels_last)
            fused.weight = nn.Parameter(w, requires_grad=False)
            fused.bias = nn.Parameter(fused.bias.detach().clone(), requires_grad=False)
            parent._modules[cn] = fused
            parent._modules[bn] = nn.Identity()
    twin.eval()
    xs = x[:16]
    ok: list[bool] = []
    last: dict[int, torch.Tensor] = {}
    hooks = []
    for pn, cn, bn in pairs:
        parent = adapter.model.get_submodule(pn)
        hooks.append(parent._modules[cn].register_forward_hook(lambda m, i, o, k=len(hooks): last.__setitem__(k, o)))
        hooks.append(parent._modules[bn].register_forward_pre_hook(lambda m, i, k=len(hooks) - 1: ok.append(i[0] is last.get(k))))
    try:
        ref = _forward(adapter, xs, grad=False)
    finally:
        for h in hooks:
            h.remove()
    if len(ok) != len(pairs) or not all(ok):
        return None
    got = _forward(twin, xs.contiguous(memory_format=torch.channels_last), grad=False)
    for u, v in ((got.raw, ref.raw), (got.logits, ref.logits)):
        if u.shape != v.shape or float((u - v).abs().amax()) > _TWIN_TOL * max(float(v.abs().amax()), 1e-12):
            return None
    return twin


# ------------------------------------------------- which forward pass: twin or plain
#: (model class, device, dtype, crop shape) -> 'twin' or 'plain', timed once per process.
_FORWARD_CHOICE: dict[tuple, str] = {}
#: The twin is used only where its forward pass takes at most this share of the plain one's
#: time: on some CPUs (torch 2.14, 2 cores) the folded channels-last forward measured 11-17%
#: slower than the plain one. A best of 3 on 32 crops varies by about 3% run to run here, so
#: 0.95 keeps a twin that is not faster out; at 0.9 a ResNet-18 twin 1.18x faster on batches
#: of 250 was turned down (its 32-crop ratio read 0.87-0.92).
TWIN_MARGIN = 0.95
#: Crops the forward choice is timed on: a ResNet-18's twin measured 0.91x the plain time on
#: 16 crops but 0.70-0.86x on batches of 32-250 (torch 2.14, 1 thread), so 16 understated it.
_PROBE_CROPS = 32
_PROBE_REPEATS = 3


def _wall_time(label: str, run) -> float:
    """Seconds `run()` takes on the wall clock (CUDA work waited for). `label` is 'plain' or 'twin'."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    run()
    sync()
    return time.perf_counter() - t0


def _forward_key(adapter: ModelAdapter, x: torch.Tensor) -> tuple:
    return (type(adapter.model), str(x.device), x.dtype, tuple(x.shape[1:]))


def pick_forward(plain_s: Sequence[float], twin_s: Sequence[float], margin: float = TWIN_MARGIN) -> str:
    """'twin' when the best twin time is at most `margin` times the best plain time, else 'plain'."""
    return "twin" if min(twin_s) <= margin * min(plain_s) else "plain"


def forward_choice(adapter: ModelAdapter, x: torch.Tensor, *, timer=_wall_time, refresh: bool = False) -> str:
    """Which forward pass the trained model's Grad-CAM runs on for batches like `x`: 'twin' or 'plain'.

    'plain' where the adapter has no inference twin (training mode, no conv -> BatchNorm pair,
    or the twin failed its check). Otherwise, the first time a (model class, device, dtype, crop
    shape) is seen, the plain and twin forward passes (no autograd) run on up to 32 crops of `x`,
    once untimed and `_PROBE_REPEATS` times timed, alternating; the twin is chosen only where
    it is faster by `TWIN_MARGIN` (`pick_forward`), so the check is never slower than the
    user's model by the twin's doing. The choice is kept for the process (``refresh=True``
    times again).

    Args:
        adapter: a `ModelAdapter` in eval mode.
        x: (B, 3, H, W) batch, as `gradcam` takes.
        timer: ``timer(label, run) -> seconds`` with label 'plain' or 'twin' (tests inject one).
        refresh: time again even where a choice is cached.

    Raises:
        DiagnosticError: not a `ModelAdapter` with a cam_layer, or an empty batch.
        InputError: x is not a batch the model takes.
    """
    adapter = _check_adapter(adapter)
    _check_batch(adapter, x, "forward_choice")
    return _forward_choice(adapter, x, timer, refresh)


def _forward_choice(adapter: ModelAdapter, x: torch.Tensor, timer=_wall_time, refresh: bool = False) -> str:
    """`forward_choice` without the input checks (a batch `_cams` has already checked)."""
    twin = _inference_twin(adapter, x)
    if twin is None:
        return "plain"
    key = _forward_key(adapter, x)
    if refresh or key not in _FORWARD_CHOICE:
        xs = x[:_PROBE_CROPS]
        xc = xs.contiguous(memory_format=torch.channels_last)
        runs = {"plain": lambda: adapter.logits(xs), "twin": lambda: twin.logits(xc)}
        got: dict[str, list[float]] = {"plain": [], "twin": []}
        with torch.no_grad():
            for run in runs.values():
                run()  # warm-up: allocator, kernels chosen
            for _ in range(_PROBE_REPEATS):
                for label, run in runs.items():
                    got[label].append(float(timer(label, run)))
        _FORWARD_CHOICE[key] = pick_forward(got["plain"], got["twin"])
    return _FORWARD_CHOICE[key]


def fast_path_reason(adapter: ModelAdapter, x: torch.Tensor) -> str | None:
    """Why the fast path does not apply to `adapter` on batch `x`; None when it does.

    The fast path needs (in eval mode, as `gradcam` runs): a head that is one ``nn.Linear``, features equal to the
    spatial mean of the cam_layer's (reshaped) activations, logits equal to
    ``head(features)``, and (the derivative) d logit_k / dA = W_k / (h w) at every position for
    each crop's predicted class k, all checked numerically on `x` (one forward pass and a
    backward pass from the logits to the cam_layer).
    """
    adapter = _check_adapter(adapter)
    _check_batch(adapter, x, "fast_path_reason")
    size = tuple(x.shape[-2:])
    with eval_mode(adapter):  # as gradcam runs it
        p = _forward(adapter, x, grad=True)
        a = adapter.cam_reshape(p.raw.detach(), size)
        why = _fast_reason(adapter, p, a)
        if why is None:
            t = p.logits.detach().argmax(dim=1)
            why = _uniform_grad_reason(adapter, _grad(adapter, p, t, size), t)
    return why


# --------------------------------------------------------------------------- Grad-CAM
def gradcam(
    adapter: ModelAdapter,
    x: torch.Tensor,
    targets=None,
    *,
    relu: bool = True,
    upsample: Upsample | None = "bilinear",
    path: CamPath = "auto",
) -> torch.Tensor:
    """Grad-CAM maps of a batch on ``adapter.cam_layer`` (see the module docstring).

    Runs the model in eval mode whatever its mode (`eval_mode`: each module's train / eval
    flag is put back afterwards, so batch-norm statistics are never updated); no parameter
    gradient is accumulated.

    Args:
        adapter: a `ModelAdapter` with a cam_layer.
        x: (B, 3, H, W) float batch in [0, 1] on the model's device and dtype.
        targets: the class whose logit is explained: an int, one index per crop ((B,) tensor,
            array or list), or None for each crop's predicted class (argmax of its logits).
        relu: rectify the map (Grad-CAM's ReLU; captum's ``relu_attributions=True``).
        upsample: 'bilinear' (``align_corners=False``), 'nearest', or None to keep the
            cam_layer's (h, w).
        path: 'auto' (checks the fast path's conditions, values and derivative, on the
            batch and takes it where they hold, else autograd), 'fast' (the GAP + linear
            formula after a check of the values only; an error where they fail) or
            'autograd'.

    Returns:
        (B, H, W) maps (or (B, h, w) with ``upsample=None``), in the model's dtype.

    Raises:
        ModelError: the adapter has no cam_layer. InputError: x is not a (B, 3, H, W) float
        batch the model takes. DiagnosticError: an empty batch, bad targets or options.
    """
    adapter = _check_adapter(adapter)
    _check_options(relu, upsample, path)
    b = _check_batch(adapter, x, "gradcam")
    t = _check_targets(targets, b, adapter.device)
    with eval_mode(adapter):
        cam = _cams(adapter, x, t, path, fold=True)[0]
    return _finish(cam, relu, x.shape[-2:], upsample)


def outside_mass(maps: torch.Tensor, masks: torch.Tensor, *, warn: bool = True) -> torch.Tensor:
    """Share of each map's positive attribution that lies outside the cell mask.

    ``sum(max(M, 0) * (1 - m)) / sum(max(M, 0))`` per crop (see the module docstring).

    Args:
        maps: (B, H, W) (or (B, 1, H, W)) attribution maps.
        masks: (B, 1, H, W) (or (B, H, W)) cell masks, bool or float in [0, 1], 1 on the cell,
            of the maps' size.
        warn: warn when some masks are empty.

    Returns:
        (B,) float64 in [0, 1]; NaN for a map with no positive attribution (or a non-finite
        one) and for an empty mask (no cell pixel), never 0.
    """
    if not isinstance(maps, torch.Tensor) or maps.dim() not in (3, 4) or (maps.dim() == 4 and maps.shape[1] != 1):
        shape = tuple(maps.shape) if isinstance(maps, torch.Tensor) else type(maps).__name__
        raise DiagnosticError(f"maps must be a (B, H, W) tensor; got {shape}")
    if maps.dim() == 4:
        maps = maps[:, 0]
    m = _check_masks(masks, int(maps.shape[0]), tuple(maps.shape[-2:])).to(device=maps.device, dtype=torch.float64)
    pos = maps.detach().to(torch.float64).clamp_min(0)
    total = pos.sum(dim=(1, 2))
    out = (pos * (1 - m)).sum(dim=(1, 2)) / total
    out = torch.where(total > 0, out, torch.full_like(out, math.nan))
    empty = m.sum(dim=(1, 2)) <= 0
    if bool(empty.any()):
        out = torch.where(empty, torch.full_like(out, math.nan), out)
        if warn:
            warnings.warn(
                f"{int(empty.sum())} of {len(empty)} masks have no cell pixel; their outside mass is NaN", RuntimeWarning, stacklevel=2
            )
    return out


#: A map is constant when its values spread by at most this many roundings of its dtype
#: (relative to its largest magnitude): a 1 x 1 cam_layer upsampled bilinearly differs from a
#: constant by a rounding or two, and ranking those differences would give a rho of noise.
CONSTANT_ROUNDINGS = 100


def constant_maps(maps: torch.Tensor) -> torch.Tensor:
    """Which maps are constant: every pixel has the same finite value, up to
    `CONSTANT_ROUNDINGS` roundings of the map's dtype relative to its largest magnitude.

    A constant map (all zero after ReLU, or one cell of a 1 x 1 cam_layer upsampled) has no
    ranking, so its Spearman rho with any map is undefined (`spearman` gives NaN), and its
    outside mass is only the background's share of the crop. A map with a non-finite value is
    not counted here (its rho is undefined for another reason; `outside_mass` gives it NaN).

    Args:
        maps: (B, H, W) (or (B, ...)) maps.

    Returns:
        (B,) bool.
    """
    if not isinstance(maps, torch.Tensor) or maps.dim() < 2:
        shape = tuple(maps.shape) if isinstance(maps, torch.Tensor) else type(maps).__name__
        raise DiagnosticError(f"maps must be a (B, H, W) tensor; got {shape}")
    x = maps.detach().reshape(int(maps.shape[0]), -1)
    if x.shape[1] == 0:
        return torch.zeros(int(x.shape[0]), dtype=torch.bool, device=x.device)
    finite = torch.isfinite(x).all(dim=1)
    hi, lo = x.amax(dim=1), x.amin(dim=1)
    eps = torch.finfo(x.dtype).eps if x.is_floating_point() else 0.0
    return finite & ((hi - lo) <= CONSTANT_ROUNDINGS * eps * torch.maximum(hi.abs(), lo.abs()))


# --------------------------------------------------------------------------- Spearman
def _centred_ranks(v: torch.Tensor) -> torch.Tensor:
    """(B, N) -> (B, N) float64 average ranks (ties share the mean of their ranks) less their mean (N + 1) / 2."""
    b, n = v.shape
    s, idx = v.sort(dim=1)
    start = torch.ones_like(s, dtype=torch.bool)  # where a run of equal values begins (every row starts one)
    torch.ne(s[:, 1:], s[:, :-1], out=start[:, 1:])
    starts = start.view(-1).nonzero().view(-1)  # positions in the flattened (B * N) order
    ends = torch.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[-1] = b * n
    mid = (starts + ends - 1).to(torch.float64).mul_(0.5)  # a run's mean position = its average rank - 1
    centred = mid.repeat_interleave(ends - starts, output_size=b * n).view(b, n)
    centred -= (torch.arange(b, device=v.device, dtype=torch.float64) * n + (n - 1) / 2)[:, None]
    return torch.empty_like(centred).scatter_(1, idx, centred)


@dataclass(frozen=True)
class _Ranked:
    """Centred average ranks of B maps, their norms, and which maps are finite."""

    r: torch.Tensor
    norm: torch.Tensor
    ok: torch.Tensor


def _ranked(maps: torch.Tensor) -> _Ranked:
    x = maps.detach().reshape(int(maps.shape[0]), -1)
    ok = torch.isfinite(x.sum(dim=1, dtype=torch.float64))  # a float64 sum of float32 values cannot overflow
    if x.shape[1]:
        ok &= ~constant_maps(x)  # a near-constant map's ranks are rounding noise: rho undefined
    if not bool(ok.all()):
        x = torch.where(ok[:, None], x, torch.zeros_like(x))
    r = _centred_ranks(x)
    return _Ranked(r, torch.linalg.vector_norm(r, dim=1), ok)


def _rho(a: _Ranked, b: _Ranked) -> torch.Tensor:
    den = a.norm * b.norm
    rho = torch.einsum("bn,bn->b", a.r, b.r) / den
    return torch.where(a.ok & b.ok & (den > 0), rho.clamp(-1, 1), torch.full_like(rho, math.nan))


def _rolled(a: _Ranked) -> _Ranked:
    return _Ranked(a.r.roll(-1, dims=0), a.norm.roll(-1, dims=0), a.ok.roll(-1, dims=0))


def spearman(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman's rho between matching maps, per crop, over all their pixels.

    Ties get average ranks (as ``scipy.stats.spearmanr``). A constant map (e.g. all zero
    after ReLU; within `CONSTANT_ROUNDINGS` roundings, see `constant_maps`) or one with a
    non-finite value gives NaN.

    Args:
        a, b: (B, ...) tensors of the same shape.

    Returns:
        (B,) float64.
    """
    if a.shape != b.shape:
        raise DiagnosticError(f"spearman() needs maps of one shape; got {tuple(a.shape)} and {tuple(b.shape)}")
    if int(a.shape[0]) == 0:
        return torch.zeros(0, dtype=torch.float64, device=a.device)
    return _rho(_ranked(a), _ranked(b))


def _pair_spearman(ranked: _Ranked) -> torch.Tensor:
    """Crop i's map against crop (i + 1) mod B's; NaN for a batch of one."""
    if ranked.r.shape[0] < 2:
        return torch.full((ranked.r.shape[0],), math.nan, dtype=torch.float64, device=ranked.r.device)
    return _rho(ranked, _rolled(ranked))


# -------------------------------------------------------------- re-initialisation
_NUMBER = re.compile(r"^\d+$")


def _block_of(name: str) -> str:
    """The block a parameterised module belongs to: its path up to the last numeric part above it.

    'layer4.1.conv2' -> 'layer4.1', 'layer4.0.downsample.0' -> 'layer4.0', 'blocks.11.attn.qkv'
    -> 'blocks.11', 'stages.3.blocks.2.conv_dw' -> 'stages.3.blocks.2'; a module under no
    numbered container ('norm', 'conv_head', 'patch_embed.proj') is a block of its own.
    """
    parts = name.split(".")[:-1]
    for i in range(len(parts) - 1, -1, -1):
        if _NUMBER.match(parts[i]):
            return ".".join(parts[: i + 1])
    return name


def _in_head(adapter: ModelAdapter, name: str) -> bool:
    h = adapter.head_name
    return name == h or name.startswith(h + ".")


def _cascade_items(adapter: ModelAdapter, order: Sequence[str]) -> list[tuple[str, bool]]:
    """Every module a cascade can reach, the last to run first: ``(path, counts as a block)``.

    The modules with parameters that run before the head (`order`, in the order they run) are
    grouped by `_block_of`. A group counts as a block when its path ends in a number, it holds
    at least two modules with parameters (a layer, not a block: a ConvNeXt stem's 'stem.0'
    conv and 'stem.1' norm) and no other group (a residual block 'layer4.1', a transformer
    block 'blocks.11', a ConvNeXt block 'stages.3.blocks.1'; not 'stages.3', whose own modules
    are the stage's downsampling layer). Modules outside the blocks ('norm', 'fc_norm',
    'patch_embed.proj', 'conv1', 'stages.3.downsample.1') are listed one by one, not counted.
    A model without such a block (a hand-written net of named layers, a plain sequence of
    layers) counts each of its groups as a block.
    """
    first: dict[str, int] = {}
    for i, name in enumerate(order):
        if not _in_head(adapter, name):
            first.setdefault(name, i)
    # A module with parameters of its own and submodules with parameters (a ConvNeXt block's
    # layer-scale gamma) is its children's block, not a layer of the container above it.
    above = {".".join(n.split(".")[:i]) for n in first for i in range(1, n.count(".") + 1)}
    unit = {n: n if n in above else _block_of(n) for n in first}
    units = set(unit.values())
    size = Counter(unit.values())
    counted = {u for u in units
               if _NUMBER.match(u.rsplit(".", 1)[-1]) and size[u] >= 2 and not any(v.startswith(u + ".") for v in units)}
    if not counted:
        counted = units
    start: dict[str, int] = {}
    for n, i in first.items():
        if unit[n] in counted:
            start[unit[n]] = min(start.get(unit[n], i), i)
    items = [(u, True, i) for u, i in start.items()] + [(n, False, i) for n, i in first.items() if unit[n] not in counted]
    return [(path, is_block) for path, is_block, _ in sorted(items, key=lambda t: -t[2])]


def _blocks_from_order(adapter: ModelAdapter, order: Sequence[str]) -> list[str]:
    """The blocks before the head (`_cascade_items`), the last to run first."""
    return [path for path, is_block in _cascade_items(adapter, order) if is_block]


def _cascade_modules(items: Sequence[tuple[str, bool]], k: int) -> list[str]:
    """What ``cascade=k`` re-initialises besides the head, from the top down: the last k blocks
    and the modules that run between them (none that run above the top block or below the k-th)."""
    out: list[str] = []
    n = 0
    for path, is_block in items:
        if n == k:
            break
        if is_block:
            n += 1
            out.append(path)
        elif n > 0:
            out.append(path)
    return out


def cascade_blocks(adapter: ModelAdapter, x: torch.Tensor) -> list[str]:
    """The blocks a cascading randomisation counts, from the top (nearest the head) down.

    ``cascade=k`` re-initialises the last k **blocks** to run before the head, and the modules
    with parameters that run between them; depth counts blocks, never single layers. Adebayo et
    al.'s cascading randomisation goes down an Inception's named layers one at a time; in a
    residual or transformer network the unit of depth is the block (a single LayerNorm or
    layer-scale vector re-initialised alone leaves the maps almost as they were and would spend
    a depth on nothing). A block is
    a numbered unit that holds no other (`_cascade_items`), ordered by when it first runs in a
    forward pass of `x`. What depth k randomises, by family:

    - ResNet: the last k residual blocks ('layer4.1', 'layer4.0', 'layer3.1', ...; each with its
      shortcut's downsampling conv); the stem ('conv1', 'bn1') is never counted.
    - ViT / DeiT: the last k transformer blocks ('blocks.11', 'blocks.10', ...: attention, MLP,
      their norms and layer scales). The final norm ('norm', or 'fc_norm' with average pooling)
      runs above the top block and keeps its trained weights at every depth (a per-channel
      affine map, reset to identity it would change the maps at every depth without counting as
      one); so do the patch embedding, the class token and the position embedding.
    - ConvNeXt: the last k ConvNeXt blocks across stages ('stages.3.blocks.2', ..., then
      'stages.2.blocks.8', ...); a stage's downsampling layer ('stages.3.downsample') is
      re-initialised once the cascade reaches the block below it (it runs between two
      re-initialised blocks); the head's norm ('head.norm', above the top block) and the stem
      keep their weights.
    - EfficientNet: the last k MBConv blocks ('blocks.6.0', 'blocks.5.3', ...); 'conv_head' and
      'bn2', above the top block, keep their weights.
    - A model without numbered blocks: each module with parameters (or each group of them)
      counts as a block.

    The head is never counted (it is re-initialised at every depth, cascade=0 included), nor
    are parameters owned by the model itself.
    """
    adapter = _check_adapter(adapter)
    _check_batch(adapter, x, "cascade_blocks")
    order: list[str] = []
    with eval_mode(adapter):
        _forward(adapter, x, grad=False, order=order)
    return _blocks_from_order(adapter, order)


@contextlib.contextmanager
def preserved_state(adapter: ModelAdapter, modules: Sequence[nn.Module] | None = None) -> Iterator[None]:
    """Restore the model's weights (bit for bit) and train / eval modes on exit, even after an error.

    Args:
        adapter: the wrapped model.
        modules: the modules that will be changed (their state dicts are copied; none for an
            empty list); None, or a model in training mode (whose forward passes update
            batch-norm statistics anywhere), copies the whole model's state dict.
    """
    model = adapter.model
    whole = modules is None or any(m.training for m in model.modules())
    targets = [model] if whole else list(modules)
    saved = [(m, {k: v.detach().clone() for k, v in m.state_dict().items()}) for m in targets]
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, state in saved:
                m.load_state_dict(state)
        for m, mode in modes:
            m.training = mode


# ------------------------------------------------------------------ randomised head
@dataclass(frozen=True)
class HeadCheck:
    """The randomised-head check of one batch.

    Attributes:
        maps: (B, H, W) Grad-CAM maps of the trained model.
        randomized_maps: (B, H, W) maps for the same targets after re-initialisation.
        targets: (B,) the classes explained.
        spearman: (B,) float64 Spearman's rho between `maps` and `randomized_maps` (NaN where
            either is constant).
        random_pair_spearman: (B,) float64 rho between crop i's map and crop (i + 1) mod B's.
        outside_mass: (B,) float64 outside mass of `maps` (None without masks).
        randomized_outside_mass: (B,) float64 outside mass of `randomized_maps` (or None).
        path: 'fast' or 'autograd' (of the original maps; the randomised ones use the same
            unless a cascade broke the fast path's conditions, which is then re-checked).
        cascade_blocks: the blocks re-initialised besides the head, from the top down (the
            depth counts these).
        seed: the seed of the re-initialisation.
        cascade_modules: every module path re-initialised besides the head, from the top down:
            the blocks and the modules that run between them (a ConvNeXt stage's downsampling).
        cam_size: (h, w), the cells of the cam_layer's map before upsampling (a 1 x 1 map
            upsamples to a constant).
        forward: which model the original maps' forward pass ran on: 'twin' (the BN-folded
            inference twin, where it measured faster here: `forward_choice`) or 'plain' (the
            user's model).
    """

    maps: torch.Tensor
    randomized_maps: torch.Tensor
    targets: torch.Tensor
    spearman: torch.Tensor
    random_pair_spearman: torch.Tensor
    outside_mass: torch.Tensor | None
    randomized_outside_mass: torch.Tensor | None
    path: str
    cascade_blocks: tuple[str, ...]
    seed: int
    cascade_modules: tuple[str, ...] = ()
    cam_size: tuple[int, int] | None = None
    forward: str = "plain"

    @property
    def median_spearman(self) -> float:
        """Median rho over the crops where it is defined (NaN if none)."""
        return _nanmedian(self.spearman)

    @property
    def median_random_pair_spearman(self) -> float:
        return _nanmedian(self.random_pair_spearman)


def _nanmedian(v: torch.Tensor) -> float:
    a = v.detach().cpu().numpy()
    a = a[np.isfinite(a)]
    return float(np.median(a)) if a.size else math.nan


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise DiagnosticError(f"seed must be an int; got {seed!r}")
    return int(seed)


def _check_cascade(cascade) -> int:
    if isinstance(cascade, bool) or not isinstance(cascade, (int, np.integer)) or int(cascade) < 0:
        raise DiagnosticError(f"cascade must be an int >= 0 (the number of blocks below the head to re-initialise); got {cascade!r}")
    return int(cascade)


def _head_checks(adapter, x, targets, masks, seed, cascades: Sequence[int], relu, upsample, path, warn=False) -> list[HeadCheck]:
    """Original maps once, then one randomised set per cascade depth (same targets)."""
    # In training mode every forward pass updates batch-norm statistics: keep the whole model.
    with preserved_state(adapter, modules=()):
        return _head_checks_inner(adapter, x, targets, masks, seed, cascades, relu, upsample, path, warn)


def _head_checks_inner(adapter, x, targets, masks, seed, cascades, relu, upsample, path, warn) -> list[HeadCheck]:
    size = tuple(x.shape[-2:])
    need_order = any(k > 0 for k in cascades)
    order: list[str] | None = [] if need_order else None
    raw, t, used, p, a, forward = _cams(adapter, x, targets, path, order=order, fold=True)
    maps = _finish(raw, relu, size, upsample)
    m = None if masks is None else _check_masks(masks, int(x.shape[0]), tuple(maps.shape[-2:]))
    om = None if m is None else outside_mass(maps, m, warn=warn)
    ranked = _ranked(maps)  # ranked once for the pairs and every cascade depth
    pair = _pair_spearman(ranked)
    items = _cascade_items(adapter, order) if need_order else []
    blocks_all = [path for path, is_block in items if is_block]
    deepest = max(cascades) if cascades else 0
    if deepest > len(blocks_all) and need_order:
        raise DiagnosticError(
            f"cascade={deepest} asks for more blocks than the model has below its head: {len(blocks_all)} "
            f"({', '.join(map(repr, blocks_all[:5]))}{', ...' if len(blocks_all) > 5 else ''}; see cascade_blocks())"
        )
    touched = [adapter.head] + [adapter.model.get_submodule(b) for b in _cascade_modules(items, deepest)]
    out = []
    with preserved_state(adapter, touched):
        for k in cascades:
            blocks = blocks_all[:k]
            gen = torch.Generator(device="cpu").manual_seed(seed)
            adapter.reset_head(gen)
            for b in _cascade_modules(items, k):  # reset_head's rule, continuing the same generator, top down
                reinit_parameters(adapter.model.get_submodule(b), gen)
            if k == 0 and used == "fast":
                # Same activations, another linear head: a matrix product, no forward pass.
                rraw = _fast_cam(a, _linear_head(adapter).weight.detach(), t)
                rused = "fast"
            else:
                rraw, _, rused, _, _, _ = _cams(adapter, x, t, "autograd" if used == "autograd" else path)
            rmaps = _finish(rraw, relu, size, upsample)
            out.append(
                HeadCheck(
                    maps=maps,
                    randomized_maps=rmaps,
                    targets=t,
                    spearman=_rho(ranked, _ranked(rmaps)),
                    random_pair_spearman=pair,
                    outside_mass=om,
                    randomized_outside_mass=None if m is None else outside_mass(rmaps, m, warn=False),
                    path=used if rused == used else f"{used}/{rused}",
                    cascade_blocks=tuple(blocks),
                    seed=seed,
                    cascade_modules=tuple(_cascade_modules(items, k)),
                    cam_size=(int(raw.shape[-2]), int(raw.shape[-1])),
                    forward=forward,
                )
            )
    return out


def randomized_head_check(
    adapter: ModelAdapter,
    x: torch.Tensor,
    targets=None,
    masks: torch.Tensor | None = None,
    seed: int = 0,
    cascade: int = 0,
    *,
    relu: bool = True,
    upsample: Upsample | None = "bilinear",
    path: CamPath = "auto",
) -> HeadCheck:
    """Grad-CAM before and after re-initialising the head (and the last `cascade` blocks).

    See the module docstring for the definition. The maps are those of the model in eval mode
    (as `gradcam`); the model's weights, batch-norm statistics and modes are restored exactly
    before this returns or raises.

    Args:
        adapter: a `ModelAdapter` with a cam_layer (put it in eval mode first).
        x: (B, 3, H, W) float batch in [0, 1]; for a random-pair baseline, in random order.
        targets: as for `gradcam` (None: the trained model's predicted classes); the
            randomised maps explain the same classes.
        masks: optional (B, 1, H, W) cell masks (1 on the cell), for the outside mass of both
            sets of maps.
        seed: seeds the re-initialisation (the head is ``reset_head`` with this seed).
        cascade: also re-initialise the last `cascade` blocks before the head (transformer,
            residual or ConvNeXt blocks, not single layers; `cascade_blocks` says which per
            family).
        relu, upsample, path: as for `gradcam`.

    Returns:
        `HeadCheck`.
    """
    adapter = _check_adapter(adapter)
    _check_options(relu, upsample, path)
    seed, cascade = _check_seed(seed), _check_cascade(cascade)
    b = _check_batch(adapter, x, "randomized_head_check")
    t = _check_targets(targets, b, adapter.device)
    if masks is not None and upsample is not None:
        _check_masks(masks, b, tuple(x.shape[-2:]))  # fail before any forward pass
    with eval_mode(adapter):
        return _head_checks(adapter, x, t, masks, seed, [cascade], relu, upsample, path, warn=True)[0]


# ------------------------------------------------------------------------ diagnostic
def _cluster_bootstrap(values: np.ndarray, clusters: np.ndarray, stat: str, n_boot: int, seed: int, level: float = 0.95):
    """Percentile interval of the mean or median, resampling clusters (parents) with replacement."""
    ok = np.isfinite(values)
    v, c = values[ok], clusters[ok]
    if v.size == 0 or n_boot <= 0:
        return (math.nan, math.nan)
    _, cid = np.unique(c, return_inverse=True)
    g = int(cid.max()) + 1
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(g, np.full(g, 1.0 / g), size=n_boot).astype(np.float64)  # (n_boot, g)
    if stat == "mean":
        sums = np.bincount(cid, weights=v, minlength=g)
        sizes = np.bincount(cid, minlength=g).astype(np.float64)
        reps = (counts @ sums) / (counts @ sizes)
    else:
        order = np.argsort(v, kind="stable")
        vs, cs = v[order], cid[order]
        w = counts[:, cs]  # (n_boot, n): each crop weighted by its parent's draw count
        cw = np.cumsum(w, axis=1)
        half = cw[:, -1:] / 2
        reps = vs[np.argmax(cw >= half, axis=1)]
    alpha = (1 - level) / 2
    return (float(np.quantile(reps, alpha)), float(np.quantile(reps, 1 - alpha)))


@register("gradcam")
class GradCamDiagnostic(Diagnostic):
    """Grad-CAM outside-the-cell mass and the randomised-head check on the test side.

    On the test crops (in a seeded random order, so that the random-pair baseline pairs
    unrelated crops), batched by ``ctx.batch_size``, in eval mode (modes restored after):
    the Grad-CAM map of each crop's target class, its outside mass, and the randomised-head
    check for each cascade depth. Intervals are 95% percentile bootstraps that resample
    parents (siblings share a parent and are not independent), seeded by ``ctx.seed``.

    Rows (setting ``target=<target>`` plus ``cascade=k`` where it applies):

    - ``outside_mass``: mean outside mass (n: crops with a defined value);
      ``outside_mass_median``: its median.
    - ``nan_maps``: crops whose map has no positive attribution (n: all test crops);
      ``empty_masks``: crops whose mask has no cell pixel. Both are NaN in the outside mass.
    - ``randomized_head_spearman``: median Spearman rho between original and randomised maps
      (per cascade depth; n: crops with a defined rho); ``randomized_nan``: crops where it is
      undefined (a constant map); ``randomized_outside_mass``: mean outside mass of the
      randomised maps.
    - ``random_pair_spearman``: median rho between maps of consecutive (random) crops.
    - ``constant_maps``, ``constant_share``: trained-model maps that are constant
      (`constant_maps`; n: all test crops), as a count and as a share of the crops;
      ``randomized_constant_maps``, ``randomized_constant_share``: the same for the randomised
      maps (per cascade depth). Where most maps are constant, rho is undefined for most crops
      and the randomised-head check says nothing (the report calls it undefined).
    - ``cam_height``, ``cam_width``: the cells of the cam_layer's map (h, w) before upsampling;
      the note names the layer.

    Read the outside mass against ``randomized_outside_mass`` and the randomised-head rho
    against ``random_pair_spearman``: on a coarse cam grid (resnet18 at 64 px has a 2 x 2
    grid) the bilinear maps share much of their layout, so any map puts about the same share
    outside a small cell (a random-init resnet18 on the synthetic demo: 0.84 for trained and
    randomised heads alike, random pairs at rho 0.85). Saliency shows where evidence is
    read, never what is used: with a per-parent tint painted only on background pixels
    (``tests/test_saliency_background.py``), models trained with it put 0.12 to 0.19 more of
    their mass outside the cells than models of an untinted control, but leak models (39 to 48
    points of accuracy gained from the tint) put no more there than clean models, which learn
    the same tint on their own training parents. Compare conditions (a mechanism against
    ``none``), not leak against clean.

    Args:
        target: 'predicted' (each crop's predicted class, the usual Grad-CAM choice) or
            'label' (its true class: the table's label codes, assumed to be the model's
            class indices, as `shortcutlab train` makes them).
        cascade: cascade depths to report (0: the head only).
        seed: seed of the re-initialisation (None: ``ctx.seed``).
        relu, upsample, path: as for `gradcam`.
        n_boot: bootstrap replicates (0: no intervals).
        max_crops: score at most this many test crops (a seeded random subset; None: all).
    """

    needs = frozenset({"masks", "split", "head"})
    label = "Grad-CAM"
    metric_labels = {"outside_mass": "outside mass"}
    metric_units = {"outside_mass": "fraction"}
    leak_metrics = ("outside_mass",)
    supplies = {"outside_mass": "outside_mass", "randomized_outside_mass": "randomized_outside_mass",
                "randomized_head_spearman": "randomized_head_spearman", "random_pair_spearman": "random_pair_spearman",
                "randomized_constant_maps": "randomized_constant_maps", "randomized_undefined": "randomized_nan",
                "cam_height": "cam_height", "cam_width": "cam_width"}

    def __init__(
        self,
        target: Literal["predicted", "label"] = "predicted",
        cascade: Sequence[int] = (0, 1, 2),
        seed: int | None = None,
        relu: bool = True,
        upsample: Upsample | None = "bilinear",
        path: CamPath = "auto",
        n_boot: int = 1000,
        max_crops: int | None = None,
    ) -> None:
        if target not in ("predicted", "label"):
            raise DiagnosticError(f"gradcam target must be 'predicted' or 'label'; got {target!r}")
        if isinstance(cascade, (int, np.integer)) and not isinstance(cascade, bool):
            cascade = (int(cascade),)
        self.cascade = tuple(_check_cascade(k) for k in cascade)
        if not self.cascade:
            raise DiagnosticError("gradcam cascade must list at least one depth (0: the head only)")
        _check_options(relu, upsample, path)
        if upsample is None:
            raise DiagnosticError("the gradcam diagnostic needs maps at the crops' size for their masks; use upsample='bilinear' or 'nearest'")
        if seed is not None:
            _check_seed(seed)
        if max_crops is not None and (isinstance(max_crops, bool) or int(max_crops) < 1):
            raise DiagnosticError(f"gradcam max_crops must be a positive int or None; got {max_crops!r}")
        if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 0:
            raise DiagnosticError(f"gradcam n_boot must be an int >= 0 (0: no intervals); got {n_boot!r}")
        self.target, self.seed, self.relu, self.upsample, self.path = target, seed, relu, upsample, path
        self.n_boot, self.max_crops = int(n_boot), max_crops

    def run(self, ctx: DiagnosticContext) -> list[dict]:
        adapter = _check_adapter(ctx.adapter)
        seed = ctx.seed if self.seed is None else int(self.seed)
        rng = np.random.default_rng(seed)
        idx = rng.permutation(ctx.test_idx)
        if self.max_crops is not None:
            idx = idx[: int(self.max_crops)]
        cascades = sorted(set(self.cascade))
        got = self._collect(ctx, adapter, idx, seed, cascades)
        if got.empty:
            warnings.warn(f"gradcam: {got.empty} of {len(idx)} test masks have no cell pixel; their outside mass is NaN",
                          RuntimeWarning, stacklevel=2)
        return self._rows(ctx, got, ctx.parents[idx], seed, cascades)

    def _collect(self, ctx: DiagnosticContext, adapter: ModelAdapter, idx: np.ndarray, seed: int, cascades: list[int]) -> "_Collected":
        """The per-crop values of the test crops `idx`, batch by batch, in eval mode."""
        from tqdm.auto import tqdm

        got = _Collected(cascades)
        labels = ctx.labels
        with eval_mode(adapter):
            for s in tqdm(range(0, len(idx), ctx.batch_size), desc="gradcam", disable=not ctx.progress, leave=False):
                bi = idx[s : s + ctx.batch_size]
                # as the run scores them (its preprocess: masked background, input size), with
                # the masks resized beside the crops
                x, m = ctx.batch(bi)
                t = None if self.target == "predicted" else torch.as_tensor(labels[bi], dtype=torch.long, device=adapter.device)
                got.add(_head_checks(adapter, x, t, m, seed, cascades, self.relu, self.upsample, self.path), m)
        return got

    def _rows(self, ctx: DiagnosticContext, got: "_Collected", parents: np.ndarray, seed: int, cascades: list[int]) -> list[dict]:
        n = got.n
        base = f"target={self.target}"
        note = f"path={'+'.join(sorted(got.paths))}; forward={'+'.join(sorted(got.forwards))}" if got.paths else ""
        boot = dict(n_boot=self.n_boot, seed=seed)

        def stat(v, kind):
            f = v[np.isfinite(v)]
            val = (float(np.mean(f)) if kind == "mean" else float(np.median(f))) if f.size else math.nan
            return val, _cluster_bootstrap(v, parents, kind, **boot), int(f.size)

        def add(metric, value, setting=base, ci=None, n=None, note=note):
            rows.append(row(ctx, self.name, metric, value, setting=setting, ci=ci, n=n, note=note))

        def count(metric, k, setting, what):
            add(metric, k, setting, n=n, note=what)
            add(metric.replace("_maps", "_share"), k / n if n else math.nan, setting, n=n, note=what + " (share of the crops)")

        rows: list[dict] = []
        om_v = got.cat(got.om)
        for metric, kind in (("outside_mass", "mean"), ("outside_mass_median", "median")):
            val, ci, k_ok = stat(om_v, kind)
            add(metric, val, ci=ci, n=k_ok)
        add("nan_maps", got.no_mass, n=n, note="maps with no positive attribution")
        add("empty_masks", got.empty, n=n, note="masks with no cell pixel")
        count("constant_maps", got.constant, base, "trained-model maps that are constant")
        h, w = got.cam_size or (math.nan, math.nan)
        cells = f"cam_layer {ctx.adapter.cam_layer_name!r}: {h} x {w} cells"
        add("cam_height", h, note=cells)
        add("cam_width", w, note=cells)
        for k in cascades:
            setting = f"{base},cascade={k}"
            r = got.cat(got.rho[k])
            val, ci, k_ok = stat(r, "median")
            add("randomized_head_spearman", val, setting, ci=ci, n=k_ok)
            add("randomized_nan", int(np.isnan(r).sum()), setting, n=n, note="constant maps: rho undefined")
            count("randomized_constant_maps", got.rconstant[k], setting, "randomised-head maps that are constant")
            val, ci, k_ok = stat(got.cat(got.rom[k]), "mean")
            add("randomized_outside_mass", val, setting, ci=ci, n=k_ok)
        val, ci, k_ok = stat(got.cat(got.pair), "median")
        add("random_pair_spearman", val, ci=ci, n=k_ok, note="crop i vs crop i+1 in random order")
        return rows


class _Collected:
    """Per-crop values of the Grad-CAM diagnostic, gathered batch by batch (`add`)."""

    def __init__(self, cascades: Sequence[int]) -> None:
        self.om: list[np.ndarray] = []
        self.pair: list[np.ndarray] = []
        self.rho: dict[int, list[np.ndarray]] = {k: [] for k in cascades}
        self.rom: dict[int, list[np.ndarray]] = {k: [] for k in cascades}
        self.rconstant: dict[int, int] = {k: 0 for k in cascades}
        self.paths: set[str] = set()
        self.forwards: set[str] = set()
        self.n = self.empty = self.no_mass = self.constant = 0
        self.cam_size: tuple[int, int] | None = None

    def add(self, checks: list[HeadCheck], m: torch.Tensor) -> None:
        first = checks[0]
        self.n += int(first.maps.shape[0])
        self.empty += int((m.flatten(1).sum(1) <= 0).sum())
        self.no_mass += int((~(first.maps.clamp_min(0).flatten(1).sum(1) > 0)).sum())  # zero or non-finite
        self.constant += int(constant_maps(first.maps).sum())
        self.cam_size = self.cam_size or first.cam_size
        self.om.append(first.outside_mass.cpu().numpy())
        self.pair.append(first.random_pair_spearman.cpu().numpy())
        for k, c in zip(self.rho, checks):
            self.rho[k].append(c.spearman.cpu().numpy())
            self.rom[k].append(c.randomized_outside_mass.cpu().numpy())
            self.rconstant[k] += int(constant_maps(c.randomized_maps).sum())
            self.paths.add(c.path)
            self.forwards.add(c.forward)

    @staticmethod
    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0)
