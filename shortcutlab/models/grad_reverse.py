"""Gradient reversal (Ganin & Lempitsky's DANN): the identity forward, -lambda x the gradient backward.

One implementation for the training recipe's parent adversary (``shortcutlab train
--adversary-weight``) and the probes' linear adversary on frozen features, with DANN's
schedule for lambda over training progress.

Example:
    >>> import torch
    >>> x = torch.ones(2, requires_grad=True)
    >>> grad_reverse(x, 0.5).sum().backward()
    >>> x.grad
    tensor([-0.5000, -0.5000])
"""

from __future__ import annotations

import math

import torch

__all__ = ["GradReverse", "dann_lambda", "grad_reverse"]


class GradReverse(torch.autograd.Function):
    """``GradReverse.apply(x, lam)``: x forward (a view), ``-lam * grad`` backward (nothing for lam)."""

    @staticmethod
    def forward(ctx, x, lam):
        ctx.lam = lam
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -ctx.lam * grad, None


def grad_reverse(x: torch.Tensor, lam: float) -> torch.Tensor:
    """x unchanged forward; the gradient reaching x is multiplied by -lam."""
    return GradReverse.apply(x, lam)


def dann_lambda(progress: float, weight: float) -> float:
    """DANN's schedule: weight * (2 / (1 + exp(-10 p)) - 1), p in [0, 1]."""
    return weight * (2.0 / (1.0 + math.exp(-10.0 * progress)) - 1.0)
