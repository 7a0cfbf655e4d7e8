"""Which torch device a run uses, and how that device is prepared.

`resolve_device` checks that a device exists here before any work starts, and prepares CUDA
for deterministic runs (``CUBLAS_WORKSPACE_CONFIG``). Training (`recipe.train`), loading and
scoring a run (`runs.load_run`, `runs.Run.from_weights`), the sweep's config check and the
CLI all ask it, so that a device that is not here is named the same way everywhere.

Example:
    >>> from shortcutlab.models.devices import resolve_device
    >>> resolve_device("cpu")
    device(type='cpu')
"""

from __future__ import annotations

import os

import torch

from shortcutlab.errors import ShortcutlabError


def available_devices() -> list[str]:
    """The torch devices this process can train on: 'cpu', then 'cuda:0', ..., 'mps', 'xpu:0', ..."""
    out = ["cpu"]
    if torch.cuda.is_available():
        out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        out += [f"xpu:{i}" for i in range(xpu.device_count())]
    return out


def resolve_device(name: str | torch.device) -> torch.device:
    """Check that device `name` exists here and prepare it for deterministic training.

    For CUDA, ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` is set (unless already set) before anything
    touches CUDA: with ``torch.use_deterministic_algorithms(True)``, cuBLAS matrix products
    need a fixed workspace and torch refuses to run them without this variable. It takes
    effect only if cuBLAS has not started yet in this process; a program that uses CUDA before
    calling `train` should set it in the environment before starting Python.

    Raises:
        ShortcutlabError: a name torch does not know, or a device that is not available here
            (no GPU, an index beyond the GPUs present, an unavailable backend), naming the
            devices that are.
    """
    text = str(name)
    if text.strip().lower().startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ShortcutlabError(f"device {text!r} is not a torch device name (cpu, cuda, cuda:N, mps, ...); available here: {', '.join(available_devices())}") from None
    if device.type == "cpu":
        return device
    available = available_devices()
    where = f"available here: {', '.join(available)}"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA support"
            raise ShortcutlabError(f"device {text!r} is not available: torch sees no CUDA GPU (torch {torch.__version__}, built with {build}); {where}")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ShortcutlabError(f"device {text!r} does not exist: this machine has {torch.cuda.device_count()} CUDA GPU(s); {where}")
        return device
    if device.type == "mps":
        if "mps" not in available:
            raise ShortcutlabError(f"device {text!r} is not available: torch.backends.mps.is_available() is False; {where}")
        return device
    if device.type == "xpu":
        if not any(a.startswith("xpu") for a in available) or (device.index is not None and f"xpu:{device.index}" not in available):
            raise ShortcutlabError(f"device {text!r} is not available; {where}")
        return device
    raise ShortcutlabError(f"device {text!r} cannot be used for training; {where}")
