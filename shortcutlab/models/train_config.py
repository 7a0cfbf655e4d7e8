"""The training recipe's settings, each declared once: `TrainConfig` and its `Setting`s.

Every field of `TrainConfig` carries a `Setting` (in the field's metadata) that says how users
reach it: the help text and flag of `shortcutlab train`, the value types and wording a sweep
config's model entry accepts, and whether `shortcutlab litmus` / `control` retrain with it.
The command line (`shortcutlab.cli`) and the sweep config (`shortcutlab.sweep.config`) build
their options and type table from `train_settings()`, so a new field needs one declaration
here. This module imports neither torch nor timm: building the command line stays light.

Example:
    >>> from shortcutlab.models.train_config import TrainConfig, train_settings
    >>> TrainConfig(epochs=3).lr
    0.0001
    >>> [s.name for s in train_settings() if s.retrain][:3]
    ['arch', 'epochs', 'batch_size']
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from shortcutlab.errors import ShortcutlabError

#: the key of a `TrainConfig` field's metadata that holds its `Setting`
SETTING = "setting"


@dataclass(frozen=True)
class Setting:
    """How users reach one `TrainConfig` field (kept in the field's metadata under `SETTING`).

    Attributes:
        help: help text of the command-line flag (None: argparse shows none).
        expected: what a valid value is, in words; a sweep config's type errors say it.
        kinds: the YAML value types a sweep config accepts (bool is never taken for int).
        cli: how the flag reads its value: "value" (one value of the type in `kinds`),
            "switch" (no value: ``--name`` turns a False default on, ``--no-name`` turns a True
            default off), "pair" (``LOW,HIGH``) or "key_values" (repeatable ``KEY=VALUE``).
        flag: the flag when it is not ``--`` plus the name with dashes (or ``--no-...`` for a
            switch that defaults to True).
        metavar: argparse's metavar (None: argparse's own).
        retrain: `shortcutlab litmus` and `control` take the flag too.
        retrain_help: help text there, where it differs from `help`.
        sweep_key: None when a sweep config's model entry takes the setting; else the
            top-level key of the sweep config that sets it for every model ("seeds", "device").
        added_later: a setting added after sweeps were first written: `to_dict` leaves it out at
            its default, so the task ids (content hashes) of sweeps written before it existed
            stay the same and a resumed sweep does not retrain its models.
        name, default: the field's name and default, filled in by `train_settings()`.
    """

    help: str | None
    expected: str
    kinds: tuple[type, ...]
    cli: Literal["value", "switch", "pair", "key_values"] = "value"
    flag: str | None = None
    metavar: str | None = None
    retrain: bool = False
    retrain_help: str | None = None
    sweep_key: str | None = None
    added_later: bool = False
    name: str = ""
    default: Any = None

    @property
    def option(self) -> str:
        """The command-line flag, e.g. ``--batch-size``, ``--no-hflip``."""
        if self.flag:
            return self.flag
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.cli == "switch" and self.default is True else f"--{dashed}"


def _setting(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, **setting: Any):
    """A dataclass field with `default` (or `factory`) and its `Setting` in the metadata."""
    return field(default=default, default_factory=factory, metadata={SETTING: Setting(**setting)})


_BOOL = ((bool,), "true or false")
_PAIR = ((list,), "a list [low, high]")


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run (all recorded in run.json).

    Attributes:
        arch: timm model name (random init unless `weights` is a local file).
        epochs: fixed number of epochs; the final epoch is scored.
        batch_size, lr, weight_decay: AdamW settings.
        seed: seeds initialisation, shuffling and augmentation.
        weights: local weight file to start from (never downloaded); a file whose classifier
            differs from the task (an ImageNet checkpoint) loses it and the model gets a new
            one (`create_model_fit`; the keys are recorded in run.json's ``weights_fit``).
        input_size: N: every crop is resized to N x N (bilinear, antialiased) before the model,
            in training, scoring and diagnosis (`runs.Resize`); None: crops as they are.
        rrc_scale, rrc_ratio: random resized crop area and aspect ranges.
        hflip, vflip: random flips (cells have no canonical orientation).
        mask_background: replace the background outside the cell mask, in training and scoring.
        augment: name of a registered intervention (`interventions.available()`) applied to
            every training batch as augmentation; None for none. Label-conditioned
            interventions cannot be used (they need test-time targets).
        augment_params: constructor arguments of `augment`.
        background_fill: the grey level (0-1) used by `mask_background`.
        adversary_weight: lambda_max of the gradient-reversal parent adversary (0: off).
        precise_bn: after the last epoch, set every BatchNorm layer's running mean and
            unbiased variance to the exact moments of its input over all un-augmented training
            crops, in shuffled training-size batches with the model in train mode (PreciseBN;
            Wu & Johnson 2021; see `precise_batchnorm`), instead of scoring with the
            exponential moving average collected while the weights were still moving. Off in
            the paper's recipe; the demo turns it on because small models trained from scratch
            at a high learning rate can end with running statistics far from the final
            weights' activations.
        device: torch device for training ("cpu", "cuda", "cuda:1", "mps"); checked before
            any work (`resolve_device`), and on CUDA ``CUBLAS_WORKSPACE_CONFIG`` is set for
            deterministic algorithms.

    Each field's `Setting` (see `train_settings`) says how the command line and a sweep config
    reach it.

    Raises:
        ShortcutlabError: a value out of range, naming the field and the value.
    """

    arch: str = _setting("test_resnet", help="timm model name (default test_resnet)", expected="a timm model name",
                         kinds=(str,), retrain=True)
    epochs: int = _setting(10, help=None, expected="a positive integer", kinds=(int,), retrain=True)
    batch_size: int = _setting(64, help=None, expected="a positive integer", kinds=(int,), retrain=True)
    lr: float = _setting(1e-4, help=None, expected="a positive number", kinds=(int, float), retrain=True)
    weight_decay: float = _setting(0.01, help="AdamW weight decay (default 0.01)", metavar="W", expected="a number", kinds=(int, float))
    seed: int = _setting(0, help=None, expected="an integer", kinds=(int,), retrain=True, retrain_help="training seed",
                         sweep_key="seeds")
    weights: str | None = _setting(None, help="local weight file to start from (never downloaded)", metavar="FILE",
                                   expected="a weight file path or null", kinds=(str, type(None)), retrain=True)
    input_size: int | None = _setting(None, added_later=True, metavar="N", expected="a positive integer or null", kinds=(int, type(None)), retrain=True,
                                      help="resize every crop to N x N (bilinear, antialiased) before the model, in training, "
                                           "scoring and diagnosis (e.g. 224 for a ViT, Swin or MaxViT; default: crops as they are)")
    rrc_scale: tuple[float, float] = _setting((0.5, 1.0), cli="pair", metavar="LOW,HIGH", expected=_PAIR[1], kinds=_PAIR[0],
                                              help="random resized crop: range of the crop's area share (default 0.5,1)")
    rrc_ratio: tuple[float, float] = _setting((3 / 4, 4 / 3), cli="pair", metavar="LOW,HIGH", expected=_PAIR[1], kinds=_PAIR[0],
                                              help="random resized crop: range of the aspect ratio, width / height (default 0.75,1.333)")
    hflip: bool = _setting(True, cli="switch", expected=_BOOL[1], kinds=_BOOL[0],
                           help="no random horizontal flips (default: half the training crops are flipped)")
    vflip: bool = _setting(True, cli="switch", expected=_BOOL[1], kinds=_BOOL[0],
                           help="no random vertical flips (default: half the training crops are flipped)")
    mask_background: bool = _setting(False, cli="switch", expected=_BOOL[1], kinds=_BOOL[0],
                                     help="replace the background outside the cell mask (F3)")
    background_fill: float = _setting(0.5, help="--mask-background: the grey level in [0, 1] (default 0.5)", metavar="X",
                                      expected="a number in [0, 1]", kinds=(int, float))
    augment: str | None = _setting(None, help="a registered intervention applied to training batches (e.g. hed_jitter for F4)",
                                   metavar="NAME", expected="an intervention name or null", kinds=(str, type(None)))
    augment_params: dict = _setting(factory=dict, cli="key_values", flag="--augment-param", metavar="KEY=VALUE",
                                    help="a parameter of --augment (repeatable; VALUE read as JSON when it parses)",
                                    expected="a mapping of the augmentation's parameters", kinds=(dict,))
    adversary_weight: float = _setting(0.0, help="lambda_max of a gradient-reversal parent adversary (DANN schedule)",
                                       expected="a number >= 0", kinds=(int, float))
    precise_bn: bool = _setting(False, cli="switch", expected=_BOOL[1], kinds=_BOOL[0], retrain=True,
                                help="recompute BatchNorm statistics on the training crops before scoring")
    device: str = _setting("cpu", help=None, expected="a torch device name (cpu, cuda, cuda:1, mps)", kinds=(str,),
                           retrain=True, sweep_key="device")

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ShortcutlabError(f"epochs and batch_size must be >= 1, got {self.epochs} and {self.batch_size}")
        if not self.lr > 0:
            raise ShortcutlabError(f"lr must be positive, got {self.lr}")
        if not self.weight_decay >= 0:
            raise ShortcutlabError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not (0 < self.rrc_scale[0] <= self.rrc_scale[1] <= 1):
            raise ShortcutlabError(f"rrc_scale must satisfy 0 < low <= high <= 1, got {self.rrc_scale}")
        if not (0 < self.rrc_ratio[0] <= self.rrc_ratio[1] < math.inf):
            raise ShortcutlabError(f"rrc_ratio must satisfy 0 < low <= high < inf, got {self.rrc_ratio}")
        if not 0 <= self.background_fill <= 1:
            raise ShortcutlabError(f"background_fill must lie in [0, 1], got {self.background_fill}")
        if self.augment_params and not self.augment:
            raise ShortcutlabError(f"augment_params {self.augment_params} were given without augment=NAME")
        if self.input_size is not None and (isinstance(self.input_size, bool) or not isinstance(self.input_size, int)
                                            or self.input_size < 1):
            raise ShortcutlabError(f"input_size must be a positive integer (pixels) or None, got {self.input_size!r}")
        if not self.adversary_weight >= 0:
            raise ShortcutlabError(f"adversary_weight must be >= 0, got {self.adversary_weight}")

    def to_dict(self) -> dict:
        """The JSON form: field -> value, the (low, high) pairs as lists (as in a sweep task)."""
        pairs = pair_names()
        later = {s.name: s.default for s in train_settings() if s.added_later}
        return {k: list(v) if k in pairs else v for k, v in dataclasses.asdict(self).items()
                if not (k in later and v == later[k])}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "TrainConfig":
        """The config of its JSON form (`to_dict`, run.json's ``config``): pairs may be lists.

        Raises:
            ShortcutlabError: a value out of range. TypeError: a key that is not a field.
        """
        pairs = pair_names()
        return cls(**{k: tuple(v) if k in pairs and isinstance(v, list) else v for k, v in values.items()})


def pair_names() -> frozenset[str]:
    """The settings whose value is a (low, high) pair: a list in YAML and JSON, LOW,HIGH on the
    command line."""
    return frozenset(s.name for s in train_settings() if s.cli == "pair")


def train_settings() -> tuple[Setting, ...]:
    """The `Setting` of every `TrainConfig` field, in field order, with its name and default.

    Example:
        >>> s = {s.name: s for s in train_settings()}
        >>> s["batch_size"].option, s["hflip"].option, s["seed"].sweep_key
        ('--batch-size', '--no-hflip', 'seeds')
    """
    out = []
    for f in dataclasses.fields(TrainConfig):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        out.append(dataclasses.replace(f.metadata[SETTING], name=f.name, default=default))
    return tuple(out)
