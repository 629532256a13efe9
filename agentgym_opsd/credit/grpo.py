"""GRPO group advantages ``A_seq``, and the two ways of booking the invalid-action penalty next to them."""

from __future__ import annotations

import torch
from torch import Tensor

from agentgym_opsd.credit._checks import _check_1d_same_length, _check_floating, _check_integer


def grpo_advantages(
    rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6, normalize_std: bool = True
) -> Tensor:
    """Group-relative advantage of each trajectory: ``(r − mean_g) / (std_g + eps)``.

    ``rewards`` (trajectories,) floating; ``group_ids`` (trajectories,) integer, any values and order.
    ``std_g`` is the unbiased (n − 1) std of the group; a group of one has advantage 0.
    With ``normalize_std=False`` the result is just ``r − mean_g``.
    """
    _check_1d_same_length(rewards=rewards, group_ids=group_ids)
    _check_floating("rewards", rewards)
    _check_integer("group_ids", group_ids)
    _, group = torch.unique(group_ids, return_inverse=True)  # (trajectories,) dense 0..G-1
    mean, std = _group_mean_std(rewards, group, int(group.max()) + 1 if group.numel() else 0)
    centred = rewards - mean[group]
    if not normalize_std:
        return centred
    return centred / (std[group] + eps)


def _group_mean_std(values: Tensor, group: Tensor, num_groups: int) -> tuple[Tensor, Tensor]:
    """(groups,) mean and unbiased (n − 1) std of `values` by dense `group` index (a group of one: std 0)."""
    count = values.new_zeros(num_groups).index_add_(0, group, torch.ones_like(values))
    mean = values.new_zeros(num_groups).index_add_(0, group, values) / count.clamp_min(1.0)
    centred = values - mean[group]
    sq = values.new_zeros(num_groups).index_add_(0, group, centred * centred)
    return mean, torch.sqrt(sq / (count - 1).clamp_min(1.0))


def grpo_turn_penalty_advantages(
    traj_rewards: Tensor,
    traj_group_ids: Tensor,
    row_traj_index: Tensor,
    row_penalties: Tensor,
    *,
    cross_steps: bool = True,
    eps: float = 1e-6,
    normalize_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """GRPO with the invalid-action penalty on the invalid turn's own row (the released code's semantics).

    A turn row's score is its trajectory's reward minus its own penalty, ``s = R − p``. Normalised with its
    group's statistics, ``(s − mean_g) / (std_g + eps)`` splits exactly into a trajectory part
    ``(R − mean_g) / (std_g + eps)`` (constant over a trajectory: the A_seq a credit estimator reshapes) and
    a row part ``−p / (std_g + eps)``; this returns the two as ``(A_seq (trajectories,), A_pen (rows,))``.
    With ``cross_steps`` (released ``compute_mean_std_cross_steps=True``) mean and unbiased std run over all
    turn rows of the group, so long trajectories weigh more; otherwise over one score per trajectory, its
    reward without penalties. Without ``normalize_std`` the std is 1 (``eps`` dropped).
    """
    _check_1d_same_length(traj_rewards=traj_rewards, traj_group_ids=traj_group_ids)
    _check_1d_same_length(row_traj_index=row_traj_index, row_penalties=row_penalties)
    _check_floating("traj_rewards", traj_rewards)
    _check_integer("traj_group_ids", traj_group_ids)
    _, group = torch.unique(traj_group_ids, return_inverse=True)
    num_groups = int(group.max()) + 1 if group.numel() else 0
    penalties = row_penalties.to(traj_rewards.dtype)
    if cross_steps:
        values, value_group = traj_rewards[row_traj_index] - penalties, group[row_traj_index]
    else:
        values, value_group = traj_rewards, group
    mean, std = _group_mean_std(values, value_group, num_groups)
    scale = std + eps if normalize_std else torch.ones_like(std)
    seq = (traj_rewards - mean[group]) / scale[group]
    return seq, -penalties / scale[group[row_traj_index]]


def outcome_penalty_advantages(
    traj_rewards: Tensor,
    traj_group_ids: Tensor,
    row_penalties: Tensor,
    *,
    eps: float = 1e-6,
    normalize_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """GRPO on trajectory outcomes, with the invalid-action penalty as a separate push on its own row.

    ``A_seq`` is :func:`grpo_advantages` of the rewards (outcomes only, no penalty in them), and each row's
    penalty term is ``−p`` in advantage units, never scaled by a group statistic. So a failed trajectory's
    rows never gain from the penalty bookkeeping (a lost rollout is at or below its group's mean, and the
    penalty only subtracts), and with binary outcomes in a group of G the push on an invalid turn is at
    most ``p·√G`` times the smallest non-zero outcome advantage (|A_seq| ≥ 1/√G with the unbiased std):
    ``p = 0.1, G = 4`` makes it at most a fifth. Returns ``(A_seq (trajectories,), A_pen (rows,))``.
    """
    _check_floating("row_penalties", row_penalties)
    if bool((row_penalties < 0).any()):
        raise ValueError("row_penalties must be >= 0 (a penalty pushes its turn down)")
    seq = grpo_advantages(traj_rewards, traj_group_ids, eps=eps, normalize_std=normalize_std)
    return seq, -row_penalties.to(traj_rewards.dtype)
