"""The intervention contract: what every test-time image intervention takes and returns.

An intervention is an ``nn.Module`` whose ``forward(x, mask=None, ...)`` takes a float
``(B, 3, H, W)`` tensor with values in [0, 1] and an optional ``(B, 1, H, W)`` cell mask (1 on
the cell, 0 on the background; soft values in [0, 1] are allowed) and returns a tensor of the
same shape, dtype and device with values in [0, 1]. Every intervention also has a plain
function twin (``greyscale(x)`` next to ``Greyscale()``) for scripting.

Metadata lives in class attributes, so that sweeps and the shared contract test can select
what applies without instantiating anything:

- ``requires_mask``: the intervention cannot run without a cell mask;
- ``stochastic``: the output depends on a random draw. Random interventions separate drawing
  from applying (kornia's ``generate_parameters`` / ``apply_transform``): ``draw_params(x,
  generator)`` returns a dict of tensors, ``forward(x, params=...)`` replays a given draw, and
  the last draw is kept in ``last_params``. Draws come from a CPU ``torch.Generator`` (the
  one given to the constructor, or ``generator=`` in the call) and are then moved to x's
  device, so a seed gives the same draw on CPU and GPU;
- ``label_conditioned``: the intervention needs per-crop information chosen from the labels
  (for example Reinhard transfer to an unseen field of the crop's own class, the paper's F2),
  passed as keyword arguments to ``forward``. Its effect on accuracy is then a controlled
  diagnostic, not an unconditional test-time transform;
- ``label``: how reports name the intervention ("Reinhard transfer to an unseen field").

Two class-method hooks say what an intervention needs beyond the images, so that the sweep,
the CLI, the diagnostics and the report ask the class instead of knowing names:

- ``targets_for(crops, split, seed)``: the per-crop keyword arguments of ``forward`` (a dict
  of arrays or tensors whose first dimension is the number of crops, aligned with the crop
  table's rows), or None (the default: it needs none);
- ``check_split(protocol, params)``: raise `SplitRequirementError` when a split made with this
  protocol and these parameters cannot serve the intervention (the default accepts any).

Subclasses implement ``apply(x, mask, params, **context)`` (and ``draw_params`` when
stochastic); ``forward`` validates the input, draws, applies and checks the output.

Example:
    >>> import torch
    >>> from interventions import get
    >>> grey = get("greyscale")
    >>> y = grey(torch.rand(2, 3, 16, 16))
    >>> bool((y[:, 0] == y[:, 1]).all())
    True
"""

from __future__ import annotations

import abc
import os
import sys
import warnings
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from shortcutlab.errors import ShortcutlabError

from .memory import new_output

# Inputs may overshoot [0, 1] by this much (resampling, float rounding) and are then clamped.
RANGE_TOL = 1e-4


class InterventionError(ShortcutlabError):
    """An intervention got input that breaks its contract, or bad parameters."""


class SplitRequirementError(InterventionError):
    """A split cannot serve an intervention (`Intervention.check_split`).

    Attributes:
        param: the split parameter at fault (e.g. ``"reserve_parent_share"``), or None when the
            protocol itself cannot serve it.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InterventionWarning(UserWarning):
    """Some crops of a batch could not get the intervention as documented (see `last_applicable`)."""


def warn_not_applicable(owner: str, applicable: torch.Tensor, what: str) -> None:
    """One warning per call naming how many crops were flagged not applicable, if any.

    Args:
        owner: the intervention's name.
        applicable: (B,) bool flags (False: not applicable).
        what: what happened to those crops, e.g. "have an empty cell mask: ...".
    """
    n = int((~applicable).sum()) if applicable.numel() else 0
    if n:
        warnings.warn(f"{owner}: {n} of {applicable.numel()} crop(s) {what} (flagged False in last_applicable)", InterventionWarning, stacklevel=_outside_stacklevel())


# Frames in these folders are skipped when a warning names the line that caused it.
_INTERNAL = (os.path.dirname(os.path.abspath(__file__)) + os.sep, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)


def _outside_stacklevel() -> int:
    """The `warnings.warn` stacklevel, for its caller, of the first frame outside this package
    and torch (the user's call, through nn.Module's call machinery)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level


def check_image(x: torch.Tensor, name: str = "x") -> tuple[float, float]:
    """Raise `InterventionError` unless x is a float (B, 3, H, W) tensor with values in [0, 1].

    Args:
        x: the batch to check.
        name: how the error message refers to the argument.

    Returns:
        x's (min, max) (one pass over the data; (0, 0) for an empty batch, B = 0, which is
        valid: every intervention returns an empty batch for it).
    """
    if not isinstance(x, torch.Tensor):
        raise InterventionError(f"{name} must be a torch.Tensor of shape (B, 3, H, W); got {type(x).__name__}")
    if not x.is_floating_point():
        hint = " (divide uint8 images by 255)" if x.dtype == torch.uint8 else ""
        raise InterventionError(f"{name} must be a float tensor with values in [0, 1]; got dtype {x.dtype}{hint}")
    if x.ndim != 4 or x.shape[1] != 3:
        raise InterventionError(f"{name} must have shape (B, 3, H, W); got {tuple(x.shape)}")
    if x.shape[2] == 0 or x.shape[3] == 0:
        raise InterventionError(f"{name} must have images of at least 1 x 1 pixel (H, W >= 1); got shape {tuple(x.shape)}")
    if x.numel() == 0:  # an empty batch (B = 0) is valid: interventions return an empty batch
        return 0.0, 0.0
    lo_t, hi_t = torch.aminmax(x)
    lo, hi = float(lo_t), float(hi_t)
    if not (lo >= -RANGE_TOL and hi <= 1 + RANGE_TOL):  # also catches NaN
        raise InterventionError(f"{name} must hold values in [0, 1]; got min {lo:.4g}, max {hi:.4g}")
    return lo, hi


def check_mask(mask: torch.Tensor, x: torch.Tensor, name: str = "mask") -> torch.Tensor:
    """Validate a cell mask against x and return it as x's dtype on x's device.

    Args:
        mask: (B, 1, H, W) bool or float tensor with values in [0, 1]; (B, H, W) is accepted.
        x: the image batch the mask belongs to.
        name: how the error message refers to the argument.

    Returns:
        The mask as a float (B, 1, H, W) tensor of x's dtype and device.
    """
    if not isinstance(mask, torch.Tensor):
        raise InterventionError(f"{name} must be a torch.Tensor of shape (B, 1, H, W); got {type(mask).__name__}")
    if mask.ndim == 3:
        mask = mask.unsqueeze(1)
    B, _, H, W = x.shape
    if mask.ndim != 4 or mask.shape[1] != 1 or tuple(mask.shape[2:]) != (H, W) or mask.shape[0] != B:
        raise InterventionError(f"{name} must have shape (B, 1, H, W) = {(B, 1, H, W)} to match the images; got {tuple(mask.shape)}")
    if mask.device != x.device:
        raise InterventionError(f"{name} is on {mask.device} but the images are on {x.device}; move both to one device")
    if mask.dtype == torch.bool:  # through its bytes (0/1): on CPU 5 times faster than bool -> float
        return _converted(mask.view(torch.uint8), x.dtype)
    if not mask.is_floating_point():
        if mask.numel() and int(mask.max()) > 1 or (mask.numel() and int(mask.min()) < 0):
            raise InterventionError(f"{name} must hold 0/1 values (or floats in [0, 1]); got integers in [{int(mask.min())}, {int(mask.max())}]")
        return _converted(mask, x.dtype)
    if mask.numel() and not (float(mask.min()) >= 0 and float(mask.max()) <= 1):
        raise InterventionError(f"{name} must hold values in [0, 1]; got min {float(mask.min()):.4g}, max {float(mask.max()):.4g}")
    return _converted(mask, x.dtype)


def _converted(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t as dtype: t itself if it already is, else a copy in memory with the huge-page hint
    (`memory.new_output`: a batch's mask at 224 px is 50 MB, page-faulted 4 KB at a time otherwise)."""
    if t.dtype == dtype:
        return t
    return new_output(t.shape, dtype, t.device).copy_(t)


class Intervention(nn.Module, metaclass=abc.ABCMeta):
    """Base class of every intervention (see the module docstring for the contract).

    Class attributes:
        name: the registry name (set by `interventions.register`).
        requires_mask: forward raises without a cell mask.
        stochastic: the output depends on a random draw (`draw_params`).
        label_conditioned: forward needs per-crop context chosen from the labels.
        label: the display name reports use (default: the name with spaces for underscores).
        output_in_range: `apply` returns a new tensor already clamped to [0, 1] (clamped chunk
            by chunk while in cache), so forward skips its own clamp, a pass over the whole
            output (about a tenth of a 224 x 224 stain normalisation on CPU).
            `shortcutlab.testing.check_intervention` checks the promise.

    Hooks (class methods): `targets_for` (per-crop keyword arguments of forward, or None) and
    `check_split` (a split that cannot serve the intervention raises).

    Attributes:
        last_params: the last draw (stochastic interventions).
        last_applicable: (B,) bool flags of the last call, False for the crops the intervention
            could not treat as documented (an empty cell mask, a crop without tissue), each call
            warning once with their count (`InterventionWarning`); None for interventions that
            treat every crop.
    """

    name: ClassVar[str] = ""
    requires_mask: ClassVar[bool] = False
    stochastic: ClassVar[bool] = False
    label_conditioned: ClassVar[bool] = False
    label: ClassVar[str] = ""
    output_in_range: ClassVar[bool] = False

    def __init__(self, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if generator is not None and not isinstance(generator, torch.Generator):
            raise InterventionError(f"generator must be a torch.Generator; got {type(generator).__name__}")
        self.generator = generator
        self.last_params: dict[str, torch.Tensor] | None = None
        # (B,) bool flags of the last call, for interventions that can meet a crop they cannot
        # treat as documented (an empty cell mask, no tissue); None for the others.
        self.last_applicable: torch.Tensor | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Fail when the class is defined, not at its first call: a random intervention
        # without draw_params would otherwise only break inside a sweep.
        super().__init_subclass__(**kwargs)
        concrete = not getattr(cls.apply, "__isabstractmethod__", False)
        if concrete and cls.stochastic and cls.draw_params is Intervention.draw_params:
            raise TypeError(f"{cls.__qualname__} sets stochastic = True but does not define draw_params(x, generator)")

    # -- what the intervention needs (class methods: asked before anything is built) ---------
    @classmethod
    def targets_for(cls, crops: Any, split: Any, seed: int = 0) -> dict[str, Any] | None:
        """The per-crop keyword arguments `forward` takes for these crops, or None (needs none).

        Args:
            crops: a `shortcutlab.data.images.CropImages` (its table's rows are the crops).
            split: the `shortcutlab.data.manifest.SplitManifest` the crops are scored under.
            seed: non-negative integer for any random choice.

        Returns:
            None (the default), or a dict keyword -> array or tensor whose first dimension is
            the number of crops, row i belonging to the table's crop i; callers pass the rows
            of a batch as ``forward(x, mask, **{k: v[rows]})``.

        Raises:
            InterventionError: the crops or the split cannot give the targets (the message says why).
        """
        return None

    @classmethod
    def check_split(cls, protocol: str, params: dict[str, Any]) -> None:
        """Raise `SplitRequirementError` if a split of `protocol` made with `params` cannot serve
        this intervention (for example, it needs fields no model trained on); the default
        accepts every split.

        Args:
            protocol: the split protocol's name ("factorial", "parent", ...).
            params: the split's parameters, as the sweep config gives them.
        """

    # -- to implement ------------------------------------------------------------------
    def draw_params(self, x: torch.Tensor, generator: torch.Generator | None) -> dict[str, torch.Tensor]:
        """Draw the random parameters for batch x (stochastic interventions define this)."""
        return {}

    @abc.abstractmethod
    def apply(self, x: torch.Tensor, mask: torch.Tensor | None, params: dict[str, torch.Tensor] | None, **context: Any) -> torch.Tensor:
        """Apply the intervention to a validated batch (x float in [0, 1], mask float or None)."""

    # -- the contract --------------------------------------------------------------------
    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        params: dict[str, torch.Tensor] | None = None,
        generator: torch.Generator | None = None,
        **context: Any,
    ) -> torch.Tensor:
        """Validate, draw (if stochastic and no `params`), apply, and check the output.

        Args:
            x: (B, 3, H, W) float tensor with values in [0, 1].
            mask: optional (B, 1, H, W) cell mask (bool, 0/1 or float in [0, 1]).
            params: a previous draw to replay (stochastic interventions).
            generator: CPU generator for this call's draw (default: the constructor's).
            **context: per-crop context of label-conditioned interventions.

        Returns:
            (B, 3, H, W) tensor of x's dtype and device with values in [0, 1].
        """
        lo, hi = check_image(x)
        if mask is not None:
            mask = check_mask(mask, x)
        elif self.requires_mask:
            raise InterventionError(f"{self.name or type(self).__name__} needs a cell mask: call it as f(x, mask) with a (B, 1, H, W) mask")
        if self.stochastic:
            if params is None:
                params = self.draw_params(x, generator if generator is not None else self.generator)
            self.last_params = params
        elif params is not None:
            raise InterventionError(f"{self.name or type(self).__name__} is deterministic and takes no params")
        # Values within RANGE_TOL outside [0, 1] are clamped; in-range input is passed as is.
        y = self.apply(x if 0.0 <= lo and hi <= 1.0 else x.clamp(0.0, 1.0), mask, params, **context)
        if y.shape != x.shape or y.dtype != x.dtype or y.device != x.device:
            raise RuntimeError(
                f"{type(self).__name__}.apply broke the contract: returned {tuple(y.shape)} {y.dtype} on {y.device} "
                f"for input {tuple(x.shape)} {x.dtype} on {x.device}"
            )
        # apply() may return its input (or a view of it); never clamp the caller's tensor in place.
        if y.data_ptr() == x.data_ptr() or y._base is not None:
            return y.clamp(0.0, 1.0)
        if self.output_in_range:
            return y
        return y.clamp_(0.0, 1.0) if not y.requires_grad else y.clamp(0.0, 1.0)

    def extra_repr(self) -> str:
        flags = [f for f in ("requires_mask", "stochastic", "label_conditioned") if getattr(self, f)]
        return ", ".join(flags)


def declares_targets(cls: type[Intervention] | Intervention) -> bool:
    """Whether an intervention class (or instance) defines its own `Intervention.targets_for`."""
    cls = cls if isinstance(cls, type) else type(cls)
    return getattr(cls.targets_for, "__func__", None) is not Intervention.targets_for.__func__


def check_targets(targets: Any, n_crops: int, owner: str) -> dict[str, Any] | None:
    """Raise `InterventionError` unless `targets` is what `Intervention.targets_for` promises.

    Args:
        targets: a hook's result: None, or a dict keyword (str) -> array or tensor whose first
            dimension is `n_crops`.
        n_crops: the number of crops the hook was asked about.
        owner: the intervention's name, for the message.

    Returns:
        `targets`, unchanged.
    """
    if targets is None:
        return None
    if not isinstance(targets, dict):
        raise InterventionError(f"intervention {owner!r}: targets_for must return None or a dict keyword -> per-crop array; got {type(targets).__name__}")
    for k, v in targets.items():
        shape = tuple(getattr(v, "shape", ()))
        if not isinstance(k, str) or not shape or shape[0] != n_crops:
            raise InterventionError(f"intervention {owner!r}: targets_for gave {k!r} of shape {shape}; expected an array or tensor "
                                    f"with one row per crop ({n_crops}, ...)")
    return targets


def target_rows(targets: dict[str, Any], rows: Any, device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """The rows of a batch from per-crop targets (`Intervention.targets_for`), as tensors.

    Args:
        targets: keyword -> array or tensor with one row per crop of the table.
        rows: the batch's crop indices (a sequence, array or tensor of integers).
        device: where to put the result (default: where each value is).

    Returns:
        keyword -> ``value[rows]`` as a tensor on `device`, ready for ``forward(x, mask, **kw)``.
    """
    idx = np.asarray(rows.cpu() if isinstance(rows, torch.Tensor) else rows, dtype=np.int64)
    out = {}
    for k, v in targets.items():
        t = v[torch.as_tensor(idx, device=v.device)] if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v)[idx])
        out[k] = t.to(device) if device is not None else t
    return out


def display_label(cls: type[Intervention] | Intervention) -> str:
    """An intervention's `label`, or its name with spaces for underscores when it sets none."""
    label = getattr(cls, "label", "")
    return label if isinstance(label, str) and label else str(getattr(cls, "name", "")).replace("_", " ")


def uniform(low: float, high: float, shape: tuple[int, ...], generator: torch.Generator | None, like: torch.Tensor) -> torch.Tensor:
    """U(low, high) draws made on the CPU generator, returned on `like`'s device and dtype."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    return (low + (high - low) * u).to(device=like.device, dtype=like.dtype)
