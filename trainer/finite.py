"""The run stops at the first non-finite number it would train on or save: a loss, a gradient norm or a weight.

A NaN or an infinity does not heal: once in the weights, every later step, checkpoint and evaluation carries it.
So the loss is checked before its backward pass, the gradient norm before the optimiser applies it, and the
weights before a checkpoint is written and after one is loaded; the first that fails raises `NonFiniteError`,
which the CLI reports with the checkpoint a resume would start from.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = ["NonFiniteError", "require_finite", "nonfinite_weights", "require_finite_weights"]


class NonFiniteError(RuntimeError):
    """Training met a NaN or an infinity; the message says where. Nothing of the step was written."""


def require_finite(value: float, what: str) -> None:
    """Raise `NonFiniteError` naming `what` when `value` is NaN or infinite."""
    if not math.isfinite(value):
        raise NonFiniteError(f"{what} is {value}: training stopped before it was applied or written")


def nonfinite_weights(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, int]:
    """The floating tensors of `named` that hold a NaN or an infinity, with how many values of each."""
    bad = {}
    with torch.no_grad():
        for name, tensor in named:
            if tensor.is_floating_point() and tensor.numel():
                count = int((~torch.isfinite(tensor)).sum())
                if count:
                    bad[name] = count
    return bad


def require_finite_weights(named: Iterable[tuple[str, torch.Tensor]], what: str) -> None:
    """Raise `NonFiniteError` naming `what` and up to five of its tensors when a weight is NaN or infinite."""
    bad = nonfinite_weights(named)
    if bad:
        shown = ", ".join(f"{name} ({count})" for name, count in list(bad.items())[:5])
        raise NonFiniteError(f"{what}: {sum(bad.values())} non-finite values in {len(bad)} tensors: {shown}"
                             f"{', ...' if len(bad) > 5 else ''}")
