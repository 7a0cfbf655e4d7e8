"""One adapter over any trained image classifier: `wrap(model) -> ModelAdapter`.

Interventions, probes, erasure and saliency code talk to a `ModelAdapter`, never to an
architecture. The adapter follows timm's model contract (``forward_features`` ->
``forward_head(pre_logits=True)`` -> features -> ``get_classifier()`` -> logits) and adapts
anything else once, here, from explicit arguments:

==============  ==========================================================================
logits(x)       (B, K) logits of a float (B, 3, H, W) batch in [0, 1]; the adapter applies
                the input normalisation ``(x - mean) / std`` itself
features(x)     (B, D) pooled penultimate features; ``head(features(x)) == logits(x)``
head            the classifier module; assigning ``adapter.head = m`` replaces it in the model
reset_head(s)   re-initialise the classifier's weights from a seed (randomised-head checks)
cam_layer       the module whose activations Grad-CAM uses; ``cam_reshape`` maps them to
                (B, C, h, w) (dropping a ViT's class / register tokens)
mean, std       (1, 3, 1, 1) buffers; they follow ``adapter.to(...)``
==============  ==========================================================================

timm models need no arguments. Any other ``nn.Module`` (a torchvision model, a hand-written
net) needs ``head=`` and ``mean=`` / ``std=``; ``feature_layer=`` defaults to the input of
``head``, and ``cam_layer=`` is needed only for Grad-CAM. Nothing is guessed silently: a
missing argument is an error that names it, an unknown layer name lists the close matches,
and the first eval-mode call of `ModelAdapter.features` checks that ``head(features)``
reproduces the model's logits.

The adapter never moves tensors and never switches the model between train and eval mode:
an input on another device than the model, or of another dtype, is an error; call
``adapter.eval()`` (an ordinary ``nn.Module`` method) before measuring.

Example:
    >>> import torch
    >>> model = create_model("test_resnet", num_classes=3).eval()
    >>> adapter = wrap(model)
    >>> x = torch.rand(2, 3, 64, 64)
    >>> adapter.logits(x).shape, adapter.features(x).shape
    (torch.Size([2, 3]), torch.Size([2, 96]))
    >>> torch.allclose(adapter.head(adapter.features(x)), adapter.logits(x), atol=1e-5)
    True
"""

from __future__ import annotations

import contextlib
import difflib
import math
import os
import re
from dataclasses import dataclass, fields
from typing import Iterator, Literal, Sequence

import torch
from torch import nn

from shortcutlab.errors import ShortcutlabError

__all__ = ["InputError", "ModelAdapter", "ModelError", "TokenLayout", "WeightsFit", "create_model", "create_model_fit",
           "input_size_kw", "reinit_parameters", "wrap"]


class ModelError(ShortcutlabError):
    """A model cannot be adapted with the given arguments (or a weights file cannot be used)."""


class InputError(ShortcutlabError):
    """A tensor passed to a `ModelAdapter` does not meet its input contract."""


# Tolerance on the [0, 1] input range: resampling (bicubic, antialiasing) overshoots slightly.
_RANGE_TOL = 1e-3

# Top-level timm children that belong to the head: the spatial map ends before the first one.
_HEAD_PARTS = frozenset({"global_pool", "head", "fc_norm", "head_drop", "attn_pool", "pool", "pre_logits", "classifier", "fc"})


@dataclass(frozen=True)
class TokenLayout:
    """How a `ModelAdapter.cam_layer` output maps onto the image grid.

    Attributes:
        fmt: ``"NCHW"`` (CNN maps, returned as is), ``"NHWC"`` (channels-last maps, permuted)
            or ``"NLC"`` (a token sequence (B, N, C), as ViT blocks produce).
        num_prefix_tokens: tokens before the patch tokens (class, register, distillation
            tokens; timm's ``num_prefix_tokens``); dropped by `ModelAdapter.cam_reshape`.
        patch_size: (ph, pw) pixels per patch, to find the grid from the input size.
        grid_size: (h, w) patch grid at the model's native input size.
        dynamic_pad: the patch embedding pads the input to a multiple of the patch size
            (the grid is then rounded up, not down).
    """

    fmt: Literal["NCHW", "NHWC", "NLC"] = "NCHW"
    num_prefix_tokens: int = 0
    patch_size: tuple[int, int] | None = None
    grid_size: tuple[int, int] | None = None
    dynamic_pad: bool = False

    def __post_init__(self) -> None:
        if self.fmt not in ("NCHW", "NHWC", "NLC"):
            raise ModelError(f"token_layout fmt must be 'NCHW', 'NHWC' or 'NLC'; got {self.fmt!r}")
        if int(self.num_prefix_tokens) < 0:
            raise ModelError(f"token_layout num_prefix_tokens must be >= 0; got {self.num_prefix_tokens}")
        for name in ("patch_size", "grid_size"):
            value = getattr(self, name)
            if value is not None:
                pair = _pair(value, f"token_layout {name}")
                object.__setattr__(self, name, pair)

    @classmethod
    def coerce(cls, value: TokenLayout | str | dict) -> TokenLayout:
        """Accept a `TokenLayout`, a format string ('NLC') or a dict of its fields."""
        if isinstance(value, TokenLayout):
            return value
        if isinstance(value, str):
            return cls(fmt=value)  # type: ignore[arg-type]
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ModelError(f"token_layout has unknown keys {unknown}; the keys are {sorted(known)}")
            return cls(**value)
        raise ModelError(f"token_layout must be a TokenLayout, 'NCHW' / 'NHWC' / 'NLC' or a dict; got {type(value).__name__}")


def _pair(value, what: str) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    try:
        a, b = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ModelError(f"{what} must be an int or a pair of ints; got {value!r}") from None
    return (a, b)


# ---------------------------------------------------------------------------------- layers
def _module_names(model: nn.Module) -> list[str]:
    return [n for n, _ in model.named_modules() if n]


def _name_of(model: nn.Module, module: nn.Module, arg: str) -> str:
    """The dotted name under which ``module`` is registered in ``model``."""
    for name, m in model.named_modules():
        if m is module:
            if not name:
                raise ModelError(f"{arg}= is the whole model ({type(model).__name__}); pass one of its submodules")
            return name
    raise ModelError(
        f"{arg}= is a {type(module).__name__} that is not a submodule of {type(model).__name__}; "
        f"pass a module of the model (or its name, e.g. {arg}={_example_names(model)[0]!r})"
    )


def _example_names(model: nn.Module, limit: int = 8) -> list[str]:
    names = [n for n, _ in model.named_children()] or ["<none>"]
    return names[-limit:]


def _resolve(model: nn.Module, layer: nn.Module | str, arg: str) -> str:
    """Turn a module or a dotted name into the module's dotted name inside ``model``."""
    if isinstance(layer, nn.Module):
        return _name_of(model, layer, arg)
    if not isinstance(layer, str):
        raise ModelError(f"{arg}= must be an nn.Module of the model or its name (a str); got {type(layer).__name__}")
    try:
        model.get_submodule(layer)
    except AttributeError:
        names = _module_names(model)
        close = difflib.get_close_matches(layer, names, n=5, cutoff=0.5)
        hint = f"close matches: {', '.join(close)}" if close else f"its top-level modules are: {', '.join(_example_names(model))}"
        raise ModelError(f"{arg}={layer!r} is not a module of {type(model).__name__}; {hint}") from None
    if not layer:
        raise ModelError(f"{arg}='' is the whole model ({type(model).__name__}); pass one of its submodules")
    return layer


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent, _, attr = name.rpartition(".")
    return (model.get_submodule(parent) if parent else model), attr


def _first_with(module: nn.Module, attr: str, last: bool = False):
    """``module.<attr>`` or that of its first (or last) submodule that has it (an int)."""
    found = None
    for m in module.modules():
        value = getattr(m, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            if not last:
                return value
            found = value
    return found


def _is_timm(model: nn.Module) -> bool:
    return all(callable(getattr(model, a, None)) for a in ("forward_features", "forward_head", "get_classifier"))


def _vit_like(model: nn.Module) -> bool:
    """timm ViT family: token sequences (B, N, C) out of ``model.blocks``."""
    blocks = getattr(model, "blocks", None)
    return (
        isinstance(getattr(model, "num_prefix_tokens", None), int)
        and hasattr(model, "patch_embed")
        and isinstance(blocks, (nn.Sequential, nn.ModuleList))
        and len(blocks) > 0
    )


def _timm_layout(model: nn.Module) -> TokenLayout:
    if _vit_like(model):
        pe = model.patch_embed
        # CaiT and XCiT join their class token only after `blocks` (class-attention layers).
        late_cls = hasattr(model, "blocks_token_only") or hasattr(model, "cls_attn_blocks")
        return TokenLayout(
            fmt="NLC",
            num_prefix_tokens=0 if late_cls else int(model.num_prefix_tokens),
            patch_size=getattr(pe, "patch_size", None),
            grid_size=getattr(pe, "grid_size", None),
            dynamic_pad=bool(getattr(pe, "dynamic_img_pad", False)),
        )
    fmt = str(getattr(model, "output_fmt", "NCHW"))
    return TokenLayout(fmt="NHWC" if fmt.upper() == "NHWC" else "NCHW")


def _timm_cam_layer(model: nn.Module, head_name: str) -> str | None:
    """The last module of a timm model that yields the spatial map before pooling."""
    if _vit_like(model):
        last = f"blocks.{len(model.blocks) - 1}"
        # With class-token pooling the last block's patch tokens never reach the classifier
        # (the final norm is per token), so their gradients are zero and Grad-CAM is blank.
        # The last block's first norm still feeds the class token through attention.
        if getattr(model, "global_pool", None) == "token" and isinstance(getattr(model.blocks[-1], "norm1", None), nn.Module):
            return last + ".norm1"
        return last
    head_top = head_name.split(".")[0]
    before: list[tuple[str, nn.Module]] = []
    for name, child in model.named_children():
        if name == head_top or name in _HEAD_PARTS:
            break
        before.append((name, child))
    for name, child in reversed(before):
        if next(child.parameters(), None) is None:  # pooling, dropout, identity, activation
            continue
        # A container of stages (ConvNeXt's `stages`): take its last stage, as timm's
        # feature_info names it.
        info = getattr(model, "feature_info", None)
        if isinstance(info, list):
            inside = [d.get("module", "") for d in info if isinstance(d, dict) and str(d.get("module", "")).startswith(name + ".")]
            if inside and not any(d.get("module") == name for d in info if isinstance(d, dict)):
                return inside[-1]
        return name
    return None


# ---------------------------------------------------------------------------- normalisation
def _stats(value, what: str) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.float64).flatten()
    if t.numel() == 1:
        t = t.expand(3)
    if t.numel() != 3:
        raise ModelError(f"{what} must be one number or one per channel (3); got {t.numel()} values: {value!r}")
    if not torch.isfinite(t).all():
        raise ModelError(f"{what} must be finite; got {value!r}")
    return t.clone()


_MEAN_HINT = (
    "mean= and std= (the per-channel normalisation it was trained with, for inputs in [0, 1]; "
    "torchvision's ImageNet weights use mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225); "
    "a net trained on raw [0, 1] inputs uses mean=0, std=1)"
)


def _normalisation_of(model: nn.Module, mean, std, missing: list[str]) -> tuple:
    """(mean, std) as given, or from a timm model's ``pretrained_cfg`` when neither is given;
    appends the hint to `missing` when there is none.

    Raises:
        ModelError: only one of mean and std is given.
    """
    cfg = getattr(model, "pretrained_cfg", None)
    cfg = cfg if isinstance(cfg, dict) else {}
    if mean is None and std is None and cfg.get("mean") is not None and cfg.get("std") is not None:
        mean, std = cfg["mean"], cfg["std"]
    elif (mean is None) != (std is None):
        raise ModelError(f"pass both mean= and std= (or neither for a timm model); got only {'mean' if std is None else 'std'}=")
    elif mean is None:
        missing.append(_MEAN_HINT)
    return mean, std


# ---------------------------------------------------------------------------------- adapter
_NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)


def reinit_parameters(module: nn.Module, generator: torch.Generator) -> None:
    """Re-initialise every parameter of `module` (and its submodules) in place, drawing from `generator`.

    The rule of `ModelAdapter.reset_head`: weights and biases uniform in ±1/sqrt(fan_in)
    (PyTorch's default for Linear and Conv layers; a bias takes its module's weight's fan-in),
    drawn in float32 (float64 for float64 parameters) on the generator's device, so the same
    generator state gives the same weights on every device; normalisation layers return to
    their identity (``reset_parameters``).
    """
    with torch.no_grad():
        for m in module.modules():
            own = list(m.named_parameters(recurse=False))
            if not own:
                continue
            if isinstance(m, _NORMS) and callable(getattr(m, "reset_parameters", None)):
                m.reset_parameters()
                continue
            w = getattr(m, "weight", None)
            fan_in = w[0].numel() if isinstance(w, torch.Tensor) and w.dim() >= 2 else None
            for _, p in own:
                fi = p[0].numel() if p.dim() >= 2 else (fan_in or p.numel())
                bound = 1.0 / math.sqrt(max(fi, 1))
                draw_dtype = torch.float64 if p.dtype == torch.float64 else torch.float32
                draw = torch.empty(p.shape, dtype=draw_dtype, device=generator.device).uniform_(-bound, bound, generator=generator)
                p.copy_(draw)


class ModelAdapter(nn.Module):
    """A trained image classifier behind one interface; build it with `wrap`.

    Attributes:
        model: the wrapped ``nn.Module`` (a submodule: ``.to()``, ``.eval()``, ``.parameters()``
            reach it).
        mean, std: (1, 3, 1, 1) normalisation buffers in the model's dtype.
        token_layout: how `cam_layer` outputs map onto the image grid.
        is_timm: features come from timm's ``forward_head(pre_logits=True)``; otherwise from a
            hook on ``feature_layer`` during an ordinary forward pass.
        check_range: check that inputs lie in [0, 1] (one device sync per call; set False in
            a hot loop whose inputs are known to be in range).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        feature_layer: nn.Module | str | None = None,
        head: nn.Module | str | None = None,
        cam_layer: nn.Module | str | None = None,
        mean: float | Sequence[float] | torch.Tensor | None = None,
        std: float | Sequence[float] | torch.Tensor | None = None,
        device: torch.device | str | None = None,
        token_layout: TokenLayout | str | dict | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise ModelError(f"wrap() needs a torch nn.Module; got {type(model).__name__}")
        self.model = model
        timm_like = _is_timm(model)
        missing: list[str] = []  # what the caller must pass, gathered into one error
        head_name = self._find_head(model, head, timm_like, missing)

        # Where features come from: timm's forward_head, or a hook.
        self.is_timm = timm_like and feature_layer is None
        self._feature_name: str | None = None
        if feature_layer is not None:
            self._feature_name = _resolve(model, feature_layer, "feature_layer")

        mean, std = _normalisation_of(model, mean, std, missing)
        if missing:
            self._refuse_guess(model, timm_like, missing)
        self._register_normalisation(model, mean, std)

        self._head_name: str = head_name  # type: ignore[assignment]
        self._check_head(self._get(self._head_name), "head")
        self._set_cam(model, cam_layer, token_layout, timm_like)

        self._num_features: int | None = None
        self._num_classes: int | None = None
        self._verified = False
        self.check_range = True
        if device is not None:
            self.to(device)

    # --------------------------------------------------------------------- construction steps
    def _find_head(self, model: nn.Module, head, timm_like: bool, missing: list[str]) -> str | None:
        """The classifier's module name: `head` resolved, or timm's ``get_classifier()``; None
        (with a hint appended to `missing`) for a non-timm model without `head`."""
        kind = type(model).__name__
        if head is not None:
            return _resolve(model, head, "head")
        if not timm_like:
            missing.append(f"head= (the final classifier module or its name, e.g. head={self._suggest_head(model)!r})")
            return None
        clf = model.get_classifier()
        if not isinstance(clf, nn.Module) or isinstance(clf, (nn.ModuleList, nn.ModuleDict)):
            n = len(clf) if isinstance(clf, (tuple, list, nn.ModuleList, nn.ModuleDict)) else 1
            raise ModelError(
                f"get_classifier() of {kind} returns {n} modules ({type(clf).__name__}), e.g. a distilled "
                "model's two heads; one adapter needs one classifier: pass head= and feature_layer= explicitly"
            )
        if isinstance(clf, nn.Identity) or next(clf.parameters(), None) is None:
            raise ModelError(
                f"{kind} has no classifier (get_classifier() is {type(clf).__name__}, num_classes="
                f"{getattr(model, 'num_classes', '?')}); create it with num_classes=K or pass head="
            )
        return _name_of(model, clf, "head")

    def _refuse_guess(self, model: nn.Module, timm_like: bool, missing: list[str]) -> None:
        """The `ModelError` listing everything in `missing` that the caller must pass."""
        why = (
            "it is not a timm model (no get_classifier() / forward_head())"
            if not timm_like
            else "its timm pretrained_cfg has no mean / std"
        )
        optional = "" if timm_like else (
            "; optionally feature_layer= (default: the input of head) and cam_layer= (for Grad-CAM, "
            f"e.g. cam_layer={self._suggest_cam(model)!r})"
        )
        raise ModelError(f"cannot adapt {type(model).__name__}: {why}, and shortcutlab does not guess; pass "
                         + ", ".join(missing) + optional)

    def _register_normalisation(self, model: nn.Module, mean, std) -> None:
        """The (1, 3, 1, 1) `mean` and `std` buffers, on the model's device in its float dtype."""
        mean_t, std_t = _stats(mean, "mean"), _stats(std, "std")
        if (std_t <= 0).any():
            raise ModelError(f"std must be > 0 for every channel; got {tuple(std_t.tolist())}")
        ref = next(model.parameters(), None)
        if ref is None:
            ref = next(model.buffers(), torch.empty(0))
        dtype = ref.dtype if ref.is_floating_point() else torch.get_default_dtype()
        self.register_buffer("mean", mean_t.to(device=ref.device, dtype=dtype).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", std_t.to(device=ref.device, dtype=dtype).view(1, 3, 1, 1), persistent=False)

    def _set_cam(self, model: nn.Module, cam_layer, token_layout, timm_like: bool) -> None:
        """The Grad-CAM layer's name (given, timm's last stage, or None) and its token layout."""
        if token_layout is not None:
            self.token_layout = TokenLayout.coerce(token_layout)
        elif timm_like:
            self.token_layout = _timm_layout(model)
        else:
            self.token_layout = TokenLayout()
        if cam_layer is not None:
            self._cam_name: str | None = _resolve(model, cam_layer, "cam_layer")
        else:
            self._cam_name = _timm_cam_layer(model, self._head_name) if timm_like else None

    # --------------------------------------------------------------------- suggestions
    @staticmethod
    def _suggest_head(model: nn.Module) -> str:
        linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        return linears[-1] if linears else "fc"

    @staticmethod
    def _suggest_cam(model: nn.Module) -> str:
        convs = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
        return convs[-1].split(".")[0] if convs else "layer4"

    # ---------------------------------------------------------------------- attributes
    def _get(self, name: str) -> nn.Module:
        return self.model.get_submodule(name)

    def __setattr__(self, name: str, value) -> None:
        # nn.Module.__setattr__ would register a Module value as a child and skip the property.
        if name == "head":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def head(self) -> nn.Module:
        """The classifier: ``head(features(x)) == logits(x)``. Assign a module to replace it."""
        return self._get(self._head_name)

    @head.setter
    def head(self, module: nn.Module) -> None:
        if not isinstance(module, nn.Module):
            raise ModelError(f"adapter.head must be set to an nn.Module (e.g. nn.Linear(D, K)); got {type(module).__name__}")
        self._check_head(module, "the new head")
        d_new = _first_with(module, "in_features")
        d_old = self._known_num_features()
        if d_new is not None and d_old is not None and d_new != d_old:
            raise ModelError(f"the new head takes {d_new} features but the model's features have {d_old} (num_features)")
        ref = next(self.model.parameters(), None)
        for p in module.parameters():
            if ref is not None and (p.device != ref.device or p.dtype != ref.dtype):
                raise ModelError(
                    f"the new head's parameters are {p.dtype} on {p.device} but the model's are {ref.dtype} on "
                    f"{ref.device}; move it first: head.to(device={str(ref.device)!r}, dtype={ref.dtype})"
                )
            break
        parent, attr = _owner(self.model, self._head_name)
        setattr(parent, attr, module)
        k = _first_with(module, "out_features", last=True)
        if k is not None:
            if isinstance(getattr(self.model, "num_classes", None), int):
                self.model.num_classes = k  # keep timm's bookkeeping in step
            self._num_classes = None
        self._verified = False

    def _check_head(self, module: nn.Module, what: str) -> None:
        if next(module.parameters(), None) is None:
            raise ModelError(f"{what} ({type(module).__name__}) has no parameters; it must be the classifier, e.g. an nn.Linear")

    def _known_num_features(self) -> int | None:
        d = _first_with(self.head, "in_features")
        if d is None and self.is_timm:
            d = getattr(self.model, "head_hidden_size", None) or getattr(self.model, "num_features", None)
        return d if d is not None else self._num_features

    @property
    def num_features(self) -> int:
        """D, the width of `features` (the classifier's input)."""
        d = self._known_num_features()
        if d is None:
            raise ModelError(f"num_features of a {type(self.head).__name__} head is known after the first call of features()")
        return int(d)

    @property
    def num_classes(self) -> int:
        """K, the number of logits."""
        k = _first_with(self.head, "out_features", last=True)
        if k is None and self.is_timm and isinstance(getattr(self.model, "num_classes", None), int):
            k = self.model.num_classes
        if k is None:
            k = self._num_classes
        if k is None:
            raise ModelError(f"num_classes of a {type(self.head).__name__} head is known after the first call of logits()")
        return int(k)

    @property
    def feature_layer(self) -> nn.Module | None:
        """The module whose output gives the features (None: timm's forward_head, or head's input)."""
        return None if self._feature_name is None else self._get(self._feature_name)

    @property
    def cam_layer(self) -> nn.Module:
        """The module whose output Grad-CAM uses; pass its output through `cam_reshape`."""
        if self._cam_name is None:
            raise ModelError(
                f"no Grad-CAM layer for {type(self.model).__name__}: wrap it with cam_layer= (the last module "
                f"with a spatial output, e.g. cam_layer={self._suggest_cam(self.model)!r})"
            )
        return self._get(self._cam_name)

    @property
    def cam_layer_name(self) -> str | None:
        return self._cam_name

    @property
    def head_name(self) -> str:
        return self._head_name

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live (inputs must be there too)."""
        ref = next(self.model.parameters(), None)
        return ref.device if ref is not None else self.mean.device

    @property
    def dtype(self) -> torch.dtype:
        ref = next(self.model.parameters(), None)
        return ref.dtype if ref is not None and ref.is_floating_point() else self.mean.dtype

    def extra_repr(self) -> str:
        src = "timm forward_head" if self.is_timm else (f"feature_layer={self._feature_name!r}" if self._feature_name else "head input")
        return f"features from {src}, head={self._head_name!r}, cam_layer={self._cam_name!r}"

    # -------------------------------------------------------------------------- inputs
    def check_input(self, x) -> None:
        """Refuse, in one line, anything but a float (B, 3, H, W) tensor in [0, 1] (`InputError`)."""
        expect = "a float (B, 3, H, W) tensor with values in [0, 1]"
        if not isinstance(x, torch.Tensor):
            raise InputError(f"x must be {expect}; got {type(x).__name__}")
        if not x.is_floating_point():
            hint = " (convert images with x.float() / 255)" if x.dtype == torch.uint8 else ""
            raise InputError(f"x must be {expect}; got dtype {x.dtype}{hint}")
        if x.dim() != 4:
            hint = " (add the batch dimension with x.unsqueeze(0))" if x.dim() == 3 else ""
            raise InputError(f"x must be {expect}; got shape {tuple(x.shape)}{hint}")
        if x.shape[1] != 3:
            hint = " (repeat a grey channel with x.expand(-1, 3, -1, -1))" if x.shape[1] == 1 else ""
            hint = " (channels-last? use x.permute(0, 3, 1, 2))" if x.shape[-1] == 3 and not hint else hint
            raise InputError(f"x must be {expect}; got shape {tuple(x.shape)} ({x.shape[1]} channels){hint}")
        device, dtype = self.device, self.dtype
        if x.device != device:
            raise InputError(
                f"x is on {x.device} but the model is on {device}; move the batch with x.to({str(device)!r}) "
                f"(or the adapter with adapter.to({str(x.device)!r})): the adapter does not move tensors"
            )
        if x.dtype != dtype:
            raise InputError(f"x has dtype {x.dtype} but the model's parameters are {dtype}; use x.to({dtype})")
        if self.check_range and x.numel() and not x.is_meta:
            lo, hi = torch.aminmax(x.detach())
            lo_v, hi_v = float(lo), float(hi)
            if not (lo_v >= -_RANGE_TOL and hi_v <= 1 + _RANGE_TOL):
                hint = ""
                if hi_v > 1.5:
                    hint = " (images in [0, 255] need x / 255)"
                elif lo_v < 0:
                    hint = " (do not normalise inputs: the adapter applies mean / std itself)"
                raise InputError(f"x must be {expect}; got values in [{lo_v:.4g}, {hi_v:.4g}]{hint}")

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``(x - mean) / std`` of a checked (B, 3, H, W) batch in [0, 1]."""
        self.check_input(x)
        return (x - self.mean) / self.std

    # ------------------------------------------------------------------------- outputs
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, K) logits of a float (B, 3, H, W) batch in [0, 1] (unnormalised).

        Runs in whatever train / eval mode the model is in; differentiable.
        """
        out = self.model(self.normalize(x))
        if not isinstance(out, torch.Tensor):
            raise ModelError(f"{type(self.model).__name__}(x) returned {type(out).__name__}, not a logits tensor")
        if self._num_classes is None and out.dim() == 2:
            self._num_classes = int(out.shape[1])
        return out

    forward = logits

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, D) pooled penultimate features of a float (B, 3, H, W) batch in [0, 1].

        For timm models ``forward_head(forward_features(xn), pre_logits=True)``; otherwise the
        output of ``feature_layer`` (global-average-pooled if 4-D) or the input of ``head``.
        The first call in eval mode checks that ``head(features) == logits`` (`verify`).
        """
        return self.features_and_logits(x)[0]

    def features_and_logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Features (B, D) and logits (B, K) from one forward pass."""
        xn = self.normalize(x)
        if self.is_timm:
            fmap = self.model.forward_features(xn)
            feats = self.model.forward_head(fmap, pre_logits=True)
            # head(feats) is the logits once verified, and shares the features' dropout draw
            # in train mode; the model's own head path is needed only for the check.
            checking = not self._verified and not self.model.training
            logits = self.model.forward_head(fmap) if checking else self.head(feats)
        else:
            feats, logits = self._hooked(xn)
        if feats.dim() != 2:
            raise ModelError(f"features must be (B, D); {self._feature_source()} gave shape {tuple(feats.shape)}")
        self._num_features = int(feats.shape[1])
        if logits.dim() == 2:
            self._num_classes = int(logits.shape[1])
        if not self._verified and not self.model.training:
            self._compare(feats, logits)
        return feats, logits

    def _feature_source(self) -> str:
        if self.is_timm:
            return f"{type(self.model).__name__}.forward_head(pre_logits=True)"
        if self._feature_name is not None:
            return f"feature_layer={self._feature_name!r}"
        return f"the input of head={self._head_name!r}"

    def _hooked(self, xn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen: list = []
        if self._feature_name is not None:
            handle = self._get(self._feature_name).register_forward_hook(lambda m, i, o: seen.append(o))
        else:
            handle = self.head.register_forward_pre_hook(lambda m, i: seen.append(i[0] if len(i) == 1 else i))
        try:
            logits = self.model(xn)
        finally:
            handle.remove()
        if len(seen) != 1:
            raise ModelError(
                f"{self._feature_source()} ran {len(seen)} times in one forward pass of {type(self.model).__name__}; "
                "pass a feature_layer= that runs exactly once"
            )
        out = seen[0]
        if not isinstance(out, torch.Tensor):
            raise ModelError(f"{self._feature_source()} produced a {type(out).__name__}, not a tensor; pass another feature_layer=")
        if out.dim() == 4:
            out = out.mean(dim=(2, 3))  # global average pooling; (B, C, 1, 1) -> (B, C)
        elif out.dim() != 2:
            raise ModelError(
                f"{self._feature_source()} gave shape {tuple(out.shape)}; features must be (B, D) or a (B, C, H, W) "
                "map to average-pool: pass the feature_layer= whose output feeds the head"
            )
        if not isinstance(logits, torch.Tensor):
            raise ModelError(f"{type(self.model).__name__}(x) returned {type(logits).__name__}, not a logits tensor")
        return out, logits

    def _compare(self, feats: torch.Tensor, logits: torch.Tensor) -> None:
        fix = (
            "pass head= and feature_layer= explicitly"
            if self.is_timm
            else "feature_layer= must be the module whose output (average-pooled if 4-D) feeds head=, and head= the final classifier"
        )
        with torch.no_grad():
            try:
                again = self.head(feats)
            except RuntimeError as e:
                if isinstance(self.head, nn.modules.conv._ConvNd):
                    fix = "the classifier is a convolution; the adapter needs a head that maps (B, D) features to logits (an nn.Linear)"
                raise ModelError(
                    f"head={self._head_name!r} cannot take the features of {self._feature_source()} "
                    f"(shape {tuple(feats.shape)}): {str(e).splitlines()[0]}; {fix}"
                ) from None
            if again.shape != logits.shape:
                raise ModelError(
                    f"head={self._head_name!r} maps the features to shape {tuple(again.shape)} but the model's logits "
                    f"have shape {tuple(logits.shape)}; {fix}"
                )
            tol = math.sqrt(torch.finfo(logits.dtype).eps) if logits.is_floating_point() else 0.0
            scale = 1.0 + float(logits.abs().max()) if logits.numel() else 1.0
            if not torch.allclose(again, logits, rtol=tol, atol=tol * scale):
                diff = float((again - logits).abs().max())
                raise ModelError(
                    f"head({self._feature_source()}) does not reproduce the logits of {type(self.model).__name__} "
                    f"(max abs difference {diff:.3g}); {fix}"
                )
        self._verified = True

    def verify(self, x: torch.Tensor) -> ModelAdapter:
        """Check now that ``head(features(x))`` reproduces the logits; returns self.

        Runs in eval mode without gradients and restores every submodule's mode afterwards.
        Raises `ModelError` naming the argument to fix.
        """
        modes = {m: m.training for m in self.model.modules()}
        self._verified = False
        try:
            self.model.eval()
            with torch.no_grad():
                self.features_and_logits(x)
        finally:
            for m, mode in modes.items():
                m.training = mode
        return self

    # ----------------------------------------------------------------------------- head
    def reset_head(self, seed: int | torch.Generator | None = None) -> ModelAdapter:
        """Re-initialise the classifier's weights in place; returns self.

        Weights and biases of every layer in the head are drawn uniformly in
        ±1/sqrt(fan_in) (PyTorch's default for Linear and Conv layers); normalisation layers
        return to their identity. The same int seed gives the same weights on every device.

        Args:
            seed: an int (a fresh CPU generator), a ``torch.Generator`` (draws on its device,
                advancing it) or None (torch's global CPU generator).
        """
        if seed is None:
            gen = torch.default_generator
        elif isinstance(seed, torch.Generator):
            gen = seed
        elif isinstance(seed, int) and not isinstance(seed, bool):
            gen = torch.Generator(device="cpu").manual_seed(seed)
        else:
            raise ModelError(f"reset_head() takes an int seed, a torch.Generator or None; got {type(seed).__name__}")
        reinit_parameters(self.head, gen)
        return self

    # ------------------------------------------------------------------------- Grad-CAM
    def cam_reshape(self, activations: torch.Tensor, input_size: Sequence[int] | None = None) -> torch.Tensor:
        """Map `cam_layer` activations to a (B, C, h, w) map (a differentiable view).

        NCHW maps come back unchanged, NHWC maps are permuted, and token sequences (B, N, C)
        lose their prefix tokens (class, register, distillation) before the patch tokens are
        laid out on the patch grid.

        Args:
            activations: the output of `cam_layer`.
            input_size: (H, W) of the input batch; fixes the patch grid of token sequences when
                it is neither the model's native grid nor square.
        """
        lay = self.token_layout
        if not isinstance(activations, torch.Tensor):
            raise ModelError(f"cam_reshape() takes the cam_layer's output tensor; got {type(activations).__name__}")
        shape = tuple(activations.shape)
        if lay.fmt in ("NCHW", "NHWC"):
            if activations.dim() != 4:
                raise ModelError(
                    f"cam_layer={self._cam_name!r} gave shape {shape}, not a 4-D {lay.fmt} map; pass a cam_layer= with a "
                    "spatial output, or token_layout='NLC' (with num_prefix_tokens) for a token sequence"
                )
            return activations if lay.fmt == "NCHW" else activations.permute(0, 3, 1, 2)
        if activations.dim() != 3:
            raise ModelError(f"cam_layer={self._cam_name!r} gave shape {shape}; token layout 'NLC' expects (B, N, C)")
        b, n, c = shape
        prefix = lay.num_prefix_tokens
        grid = self._grid(n - prefix, input_size)
        if grid is None:
            raise ModelError(
                f"cannot lay {n - prefix} patch tokens ({n} tokens less {prefix} prefix tokens) on a grid: the native "
                f"grid is {lay.grid_size} and {n - prefix} is not a square; pass input_size=x.shape[-2:] (or a token_layout=)"
            )
        tokens = activations[:, prefix:, :]
        return tokens.transpose(1, 2).reshape(b, c, grid[0], grid[1])

    def _grid(self, n_patch: int, input_size) -> tuple[int, int] | None:
        lay = self.token_layout
        if input_size is not None and lay.patch_size is not None:
            h, w = (int(v) for v in tuple(input_size)[-2:])
            ph, pw = lay.patch_size
            g = (math.ceil(h / ph), math.ceil(w / pw)) if lay.dynamic_pad else (h // ph, w // pw)
            if g[0] * g[1] == n_patch:
                return g
        if lay.grid_size is not None and lay.grid_size[0] * lay.grid_size[1] == n_patch:
            return lay.grid_size
        side = math.isqrt(max(n_patch, 0))
        if n_patch > 0 and side * side == n_patch:
            return (side, side)
        return None


def wrap(
    model: nn.Module,
    *,
    feature_layer: nn.Module | str | None = None,
    head: nn.Module | str | None = None,
    cam_layer: nn.Module | str | None = None,
    mean: float | Sequence[float] | torch.Tensor | None = None,
    std: float | Sequence[float] | torch.Tensor | None = None,
    device: torch.device | str | None = None,
    token_layout: TokenLayout | str | dict | None = None,
) -> ModelAdapter:
    """Wrap a trained image classifier in a `ModelAdapter`.

    Args:
        model: a timm model (no other argument needed) or any ``nn.Module`` classifier.
        feature_layer: module or dotted name whose output is the penultimate features
            ((B, D), or a (B, C, H, W) map that is average-pooled). Default: timm's
            ``forward_head(pre_logits=True)``, else the input of ``head``.
        head: the classifier module or its name (default: timm's ``get_classifier()``).
        cam_layer: module or name for Grad-CAM (default for timm: the last stage or final
            norm before pooling; the last block's first norm for class-token ViTs).
        mean, std: per-channel input normalisation for inputs in [0, 1] (default: the timm
            model's ``pretrained_cfg``).
        device: move the model (and the adapter's buffers) there.
        token_layout: how ``cam_layer`` outputs map onto the image (`TokenLayout`, 'NCHW',
            'NHWC', 'NLC' or a dict); default from the timm model, else 'NCHW'.

    Returns:
        The adapter; the model is shared, not copied.

    Raises:
        ModelError: an argument is missing or does not fit the model; the message names it.
    """
    if isinstance(model, ModelAdapter):
        given = dict(feature_layer=feature_layer, head=head, cam_layer=cam_layer, mean=mean, std=std, token_layout=token_layout)
        if any(v is not None for v in given.values()):
            raise ModelError("wrap() got a ModelAdapter and layer / normalisation arguments; wrap its .model instead")
        return model.to(device) if device is not None else model
    return ModelAdapter(
        model,
        feature_layer=feature_layer,
        head=head,
        cam_layer=cam_layer,
        mean=mean,
        std=std,
        device=device,
        token_layout=token_layout,
    )


# ------------------------------------------------------------------------------ creation
@dataclass(frozen=True)
class WeightsFit:
    """How a weights file went into a model (`create_model_fit`); run.json's ``weights_fit``.

    Attributes:
        file: the weights file.
        route: ``"strict"`` (every key of the file loaded as it is: a run's own weights, a
            checkpoint of the task) or ``"new_head"`` (fine-tuning: timm's own loading dropped
            the file's classifier and gave the model a new one, and adapted what it adapts).
        dropped: keys of the file that were not loaded (its classifier).
        reinitialised: keys of the model that were not in the file and kept their random
            initialisation (the new classifier).
        adapted: keys loaded with another shape than the file's (timm resamples position
            embeddings to the model's input size and sums input-channel weights).
    """

    file: str
    route: Literal["strict", "new_head"]
    dropped: tuple[str, ...] = ()
    reinitialised: tuple[str, ...] = ()
    adapted: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """The JSON form (lists for the key tuples)."""
        return {"file": self.file, "route": self.route, "dropped": list(self.dropped),
                "reinitialised": list(self.reinitialised), "adapted": list(self.adapted)}


def create_model(name: str, num_classes: int, pretrained: str | os.PathLike | None = None, *, new_head: bool = True,
                 **kw) -> nn.Module:
    """A timm model with random weights, or with weights from a local file.

    Never downloads. A file whose classifier fits ``num_classes`` is loaded strictly. A file
    whose classifier differs (an ImageNet checkpoint of timm or torchvision, 1000 classes) is
    loaded for fine-tuning when ``new_head`` is True: timm's own loading
    (``timm.create_model(name, pretrained=True, num_classes=K, pretrained_cfg_overlay=...)``)
    drops the file's classifier, initialises a new one, and adapts position embeddings and
    input channels. Any other key that does not fit stays an error. `create_model_fit` also
    says which keys were dropped and re-initialised.

    Args:
        name: a timm model name, e.g. 'resnet18', 'convnext_atto', 'vit_tiny_patch16_224'.
        num_classes: K, the number of logits.
        pretrained: a local ``.safetensors`` or torch (``.pt`` / ``.pth`` / ``.bin``) file
            holding a state dict (or a checkpoint dict with 'state_dict' / 'model'), or None.
        new_head: accept a file whose classifier differs and give the model a new one (False:
            the file must fit as it is, as a trained model's own weights must).
        **kw: passed to ``timm.create_model`` (e.g. ``img_size=64``, ``in_chans``).

    Raises:
        ModelError: unknown model name, missing file, or weights that do not fit the model.
    """
    return create_model_fit(name, num_classes, pretrained, new_head=new_head, **kw)[0]


def create_model_fit(name: str, num_classes: int, pretrained: str | os.PathLike | None = None, *, new_head: bool = True,
                     **kw) -> tuple[nn.Module, WeightsFit | None]:
    """`create_model` and how its weights file fitted (None without a file).

    Example:
        >>> model, fit = create_model_fit("resnet18", 4, "resnet18_in1k.safetensors")   # doctest: +SKIP
        >>> fit.dropped, fit.reinitialised                                              # doctest: +SKIP
        (('fc.weight', 'fc.bias'), ('fc.weight', 'fc.bias'))
    """
    import timm

    from shortcutlab.models.cam_cnn import register

    register()  # shortcutlab's own model names join timm's
    path = _weights_path(pretrained)
    try:
        model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kw)
    except RuntimeError as e:
        if "Unknown model" in str(e):
            close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise ModelError(f"timm has no model named {name!r}{hint}") from None
        raise
    if path is None:
        return model, None
    state = _load_state_dict(path)
    heads = _classifier_keys(model)
    own = model.state_dict()
    head_fits = all(k in state and state[k].shape == own[k].shape for k in heads)
    if not new_head or not heads or head_fits:
        _check_state(model, state, path, name)
        model.load_state_dict(state, strict=True)
        return model, WeightsFit(file=path, route="strict")
    return _fine_tune_model(name, num_classes, model, state, heads, path, kw)


def input_size_kw(name: str, input_size: int | None) -> dict:
    """The ``timm.create_model`` arguments that make model `name` take N x N inputs.

    A model whose input size is fixed (timm's ``pretrained_cfg.fixed_input_size``: ViT, Swin,
    MaxViT, whose position embeddings or attention windows follow the patch grid) is built
    for N (``img_size=N``; timm resamples a file's position embeddings when it loads them);
    any other model takes any size and needs nothing.

    Example:
        >>> input_size_kw("vit_small_patch14_dinov2", 224), input_size_kw("resnet18", 224)
        ({'img_size': 224}, {})
    """
    if input_size is None:
        return {}
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    if cfg is None or not getattr(cfg, "fixed_input_size", False) or tuple(cfg.input_size[-2:]) == (input_size, input_size):
        return {}
    return {"img_size": int(input_size)}


def _weights_path(pretrained) -> str | None:
    """The weights file as a str (or None), checked to exist; never a download request."""
    if isinstance(pretrained, bool):
        raise ModelError(
            f"pretrained must be a local weights file path or None; got {pretrained!r} (shortcutlab never downloads weights)"
        )
    if pretrained is None:
        return None
    path = os.fspath(pretrained)
    if not os.path.isfile(path):
        from shortcutlab.paths import wrong_kind

        where = os.path.dirname(os.path.abspath(path))
        raise ModelError(
            f"weights file {path!r} {wrong_kind(path, 'file')} (looked in {where}); pass the path of a local .safetensors or "
            ".pt file (shortcutlab never downloads weights)"
        )
    return path


def _classifier_keys(model: nn.Module) -> list[str]:
    """The state-dict keys of a timm model's classifier (``pretrained_cfg['classifier']``)."""
    cfg = getattr(model, "pretrained_cfg", None)
    names = cfg.get("classifier") if isinstance(cfg, dict) else None
    names = (names,) if isinstance(names, str) else tuple(names or ())
    own = model.state_dict()
    return [f"{n}.{p}" for n in names for p in ("weight", "bias") if f"{n}.{p}" in own]


def _fine_tune_model(name: str, num_classes: int, model: nn.Module, state: dict, heads: list[str], path: str,
                     kw: dict) -> tuple[nn.Module, WeightsFit]:
    """The model with the file's backbone and a new classifier, loaded by timm.

    The file's keys must be the model's keys (but for the classifier): a key either side lacks
    is an error naming it, before timm loads anything (timm's non-strict load would skip it
    silently). A key of another shape is left to timm, which adapts position embeddings and
    input channels and raises for anything else.
    """
    import timm

    own = model.state_dict()
    file_heads = [k for k in heads if k in state]
    missing = [k for k in own if k not in state and k not in heads]
    extra = [k for k in state if k not in own]
    if missing or extra:
        parts = ([f"{len(missing)} keys of the model are missing from the file, e.g. {missing[0]!r}"] if missing else []) \
            + ([f"{len(extra)} keys of the file are not in the model, e.g. {extra[0]!r}"] if extra else [])
        raise ModelError(f"weights file {path!r} does not fit timm model {name!r}: " + "; ".join(parts)
                         + " (was it saved from another architecture?)")
    # The file's class count, so that timm drops its classifier (num_classes 0: it has none).
    file_classes = int(state[file_heads[0]].shape[0]) if file_heads else 0
    overlay = dict(file=path, state_dict=dict(state), source="", custom_load=False, num_classes=file_classes)
    try:
        tuned = timm.create_model(name, pretrained=True, num_classes=num_classes, pretrained_cfg_overlay=overlay, **kw)
    except RuntimeError as e:
        text = " ".join(str(e).split())
        m = re.search(r"size mismatch for ([^:]+): copying a param with shape (torch.Size\(\[[^]]*\]\)) from checkpoint, "
                      r"the shape in current model is (torch.Size\(\[[^]]*\]\))", text)
        detail = f"{m.group(1)} has shape {_size(m.group(2))} in the file but {_size(m.group(3))} in the model" if m else text[:200]
        raise ModelError(f"weights file {path!r} does not fit timm model {name!r}: {detail} "
                         "(only the classifier is replaced; was it saved from another architecture or variant?)") from None
    adapted = tuple(k for k in own if k in state and k not in heads and state[k].shape != own[k].shape)
    return tuned, WeightsFit(file=path, route="new_head", dropped=tuple(file_heads), reinitialised=tuple(heads), adapted=adapted)


def _size(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.findall(r"\d+", text))


def _load_state_dict(path: str) -> dict[str, torch.Tensor]:
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        try:
            state = load_file(path, device="cpu")
        except Exception as e:  # noqa: BLE001 - reported to the user with the path
            raise ModelError(f"cannot read safetensors file {path!r}: {' '.join(str(e).split())[:200]}") from None
    else:
        import pickle

        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            text = " ".join(str(e).split())
            if "Unsupported global" not in text:  # not a pickle of objects: a corrupt or foreign file
                detail = text.split("WeightsUnpickler error:", 1)[1].split(" Check the documentation")[0].strip() \
                    if "WeightsUnpickler error:" in text else type(e).__name__
                raise ModelError(f"cannot read weights file {path!r}: it is not a torch state dict file ({detail[:120]}); "
                                 "pass a .safetensors file or a .pt/.pth state dict saved with torch.save") from None
            # torch's own message suggests loading with weights_only=False, which runs any code
            # the file holds: never pass that advice on
            raise ModelError(
                f"weights file {path!r} is not a weights-only checkpoint: it pickles Python objects, which shortcutlab "
                "does not load because unpickling can run code; if you trust the file, load it in your own code and "
                "save its state dict as safetensors (safetensors.torch.save_file(model.state_dict(), 'model.safetensors')), "
                "then pass that file"
            ) from None
        except Exception as e:  # noqa: BLE001
            raise ModelError(f"cannot read weights file {path!r} with torch.load: {' '.join(str(e).split())[:200]}") from None
    if isinstance(state, dict):
        for key in ("state_dict", "model"):
            if isinstance(state.get(key), dict):
                state = state[key]
                break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelError(f"weights file {path!r} does not hold a state dict (a mapping of names to tensors)")
    if state and all(k.startswith("module.") for k in state):  # saved from DataParallel / DDP
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def _check_state(model: nn.Module, state: dict[str, torch.Tensor], path: str, name: str) -> None:
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    wrong = [(k, tuple(state[k].shape), tuple(v.shape)) for k, v in own.items() if k in state and state[k].shape != v.shape]
    if not (missing or unexpected or wrong):
        return
    parts = []
    if wrong:
        k, got, want = wrong[0]
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        parts.append(f"{k} has shape {got} in the file but {want} in the model{more}")
    if missing:
        parts.append(f"{len(missing)} keys are missing from the file, e.g. {missing[0]!r}")
    if unexpected:
        parts.append(f"{len(unexpected)} keys of the file are not in the model, e.g. {unexpected[0]!r}")
    raise ModelError(
        f"weights file {path!r} does not fit timm model {name!r}: " + "; ".join(parts)
        + " (was it saved from another architecture, num_classes or img_size?)"
    )


@contextlib.contextmanager
def eval_mode(adapter) -> Iterator[None]:
    """Run the block with every module of the adapter in eval mode; put back each module's own
    train / eval flag on exit, also after an error.

    In training mode a forward pass updates batch-norm running statistics (and draws dropout):
    a diagnostic would change the user's model and depend on the batch. Every forward pass of
    the diagnostics on the user's model runs inside this (features, predictions, Grad-CAM).
    """
    modes = [(m, m.training) for m in adapter.modules()]
    adapter.eval()
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode
