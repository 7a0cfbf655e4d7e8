"""Parameter checks shared by the probes: each raises a `DiagnosticError` in one line that names
the owner, the parameter, what was expected and what was given (the scikit-learn wording)."""

from __future__ import annotations

import math

import numpy as np
import torch

from .errors import DiagnosticError


def bad(owner: str, name: str, expected: str, got) -> DiagnosticError:
    """The error for parameter `name` of `owner` that is not `expected` (got `got`)."""
    return DiagnosticError(f"The {name!r} parameter of {owner} must be {expected}. Got {got!r} instead.")


def check_int(owner: str, name: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < lo:
        raise bad(owner, name, f"an integer >= {lo}", value)
    return int(value)


def check_positive(owner: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not (math.isfinite(value) and value > 0):
        raise bad(owner, name, "a finite number > 0", value)
    return float(value)


def check_fraction(owner: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not (0.0 < float(value) < 1.0):
        raise bad(owner, name, "a number in (0, 1)", value)
    return float(value)


def as_numpy(X) -> np.ndarray:
    """A tensor (on any device) or array-like as a numpy array."""
    return X.detach().cpu().numpy() if isinstance(X, torch.Tensor) else np.asarray(X)
