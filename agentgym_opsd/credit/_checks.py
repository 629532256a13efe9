"""Input validation shared by the estimators: shapes, dtypes, and trajectory-level values given per row."""

from __future__ import annotations

import torch
from torch import Tensor


def _check_turn_rows(
    seq_advantages: Tensor, evidence: Tensor, traj_ids: Tensor, turn_ids: Tensor, success_rate: Tensor
) -> None:
    _check_1d_same_length(
        seq_advantages=seq_advantages,
        evidence=evidence,
        traj_ids=traj_ids,
        turn_ids=turn_ids,
        success_rate=success_rate,
    )
    _check_floating("seq_advantages", seq_advantages)
    _check_integer("traj_ids", traj_ids)
    _check_integer("turn_ids", turn_ids)


def _check_1d_same_length(**tensors: Tensor) -> None:
    for name, t in tensors.items():
        if not isinstance(t, Tensor) or t.dim() != 1:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 1-D tensor with one entry per row; got {shape}.")
    lengths = {name: t.shape[0] for name, t in tensors.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"all inputs must have the same length; got {lengths}.")


def _check_floating(name: str, t: Tensor) -> None:
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor (it sets the output dtype); got {t.dtype}.")


def _check_integer(name: str, t: Tensor) -> None:
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor; got {t.dtype}.")


def _per_trajectory(name: str, per_row: Tensor, traj_index: Tensor, num_traj: int) -> Tensor:
    """(traj,) value of a trajectory-level input given per row; ValueError if its rows disagree."""
    per_traj = per_row.new_zeros(num_traj).scatter_(0, traj_index, per_row)
    if not torch.equal(per_traj.take(traj_index), per_row):
        if bool(per_row.isnan().any()):
            raise ValueError(f"{name} contains NaN.")
        raise ValueError(
            f"{name} must be the same for every turn row of a trajectory (it is a trajectory-level value); "
            "check that traj_ids align with the other inputs."
        )
    return per_traj
