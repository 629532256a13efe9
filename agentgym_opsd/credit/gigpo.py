"""GiGPO (verl-agent, Group-in-Group Policy Optimization) and its combination with AgentOPSD: a step-level
advantage within anchor-state groups (turns of one task group that acted on the same state), from the
discounted return of per-turn rewards."""

from __future__ import annotations

import torch
from torch import Tensor

from agentgym_opsd.credit._checks import _check_1d_same_length, _check_floating, _check_integer
from agentgym_opsd.credit.agentopsd import _agentopsd_rows, _discounted_cumsum, _layout_turn_rows
from agentgym_opsd.credit.config import STEP_NORMS, CreditConfig
from agentgym_opsd.credit.grpo import _group_mean_std


def step_discounted_returns(
    traj_ids: Tensor, turn_ids: Tensor, turn_rewards: Tensor, *, step_gamma: float = 0.95
) -> Tensor:
    """``G_k = Σ_{j ≥ k} γ^(j − k) r_j`` over the row's own trajectory, turns ranked by turn id; rows in any
    order. Returns (rows,) in the dtype of ``turn_rewards`` (floating)."""
    _check_1d_same_length(traj_ids=traj_ids, turn_ids=turn_ids, turn_rewards=turn_rewards)
    _check_floating("turn_rewards", turn_rewards)
    _check_integer("traj_ids", traj_ids)
    _check_integer("turn_ids", turn_ids)
    if turn_rewards.numel() == 0:
        return turn_rewards.clone()
    layout = _layout_turn_rows(traj_ids, turn_ids)
    num_traj, max_turns = layout.num_turns.numel(), layout.max_turns
    flat = torch.add(layout.turn_pos, layout.traj_index, alpha=max_turns)
    r_grid = turn_rewards.new_zeros(num_traj * max_turns).scatter_(0, flat, turn_rewards).view(num_traj, max_turns)
    # A forward scan over the time-reversed grid sums the future; the padding after a short trajectory comes
    # first once reversed and adds nothing.
    returns = _discounted_cumsum(r_grid.flip(1), step_gamma).flip(1)
    return returns.reshape(-1).take(flat)


def anchor_groups(group_ids: Tensor, anchor_keys: Tensor) -> tuple[Tensor, Tensor]:
    """GiGPO's anchor-state groups: rows of the same task group whose turn acted on the same state.

    ``group_ids`` and ``anchor_keys`` (rows,) integer. Returns the (rows,) dense anchor-group index and the
    (rows,) size of each row's anchor group.
    """
    _check_1d_same_length(group_ids=group_ids, anchor_keys=anchor_keys)
    _check_integer("group_ids", group_ids)
    _check_integer("anchor_keys", anchor_keys)
    if group_ids.numel() == 0:
        return group_ids.new_zeros(0), group_ids.new_zeros(0)
    # Dense codes of each key (both < rows) combine into one int64 without overflow; a 1-D unique is far
    # cheaper than torch.unique(dim=1) on the (2, rows) pairs.
    group = torch.unique(group_ids, return_inverse=True)[1]
    anchor_codes, anchor = torch.unique(anchor_keys, return_inverse=True)
    _, index, counts = torch.unique(group * anchor_codes.numel() + anchor, return_inverse=True, return_counts=True)
    return index, counts.take(index)


def gigpo_step_advantages(
    traj_ids: Tensor,
    turn_ids: Tensor,
    group_ids: Tensor,
    anchor_keys: Tensor,
    turn_rewards: Tensor,
    *,
    turn_penalties: Tensor | None = None,
    step_gamma: float = 0.95,
    step_norm: str = "mean_norm",
    eps: float = 1e-6,
    details: dict[str, Tensor] | None = None,
) -> Tensor:
    """GiGPO's step-level advantage of every turn row, vectorised; rows may come in any order.

    The step return is ``G_k = Σ_{j ≥ k} γ^(j − k) r_j − p_k``: the discounted return of the per-turn rewards
    ``turn_rewards`` of the row's trajectory, minus the row's own invalid-action penalty ``turn_penalties``
    (the released code subtracts it after discounting, so it is not carried to earlier turns). Rows of the
    same task group (``group_ids``) with the same ``anchor_keys`` (the state the turn acted on) form an
    anchor group; ``A_step = G − mean_anchor`` (``mean_norm``) or ``(G − mean) / (std + ε)``
    (``mean_std_norm``, unbiased std). An anchor group of one row has ``A_step = 0``. ``details``, when
    given, receives ``step_return`` and ``anchor_size`` per row.
    """
    if step_norm not in STEP_NORMS:
        raise ValueError(f"step_norm: expected one of {STEP_NORMS}, got {step_norm!r}.")
    returns = step_discounted_returns(traj_ids, turn_ids, turn_rewards, step_gamma=step_gamma)
    if turn_penalties is not None:
        _check_1d_same_length(turn_rewards=turn_rewards, turn_penalties=turn_penalties)
        returns = returns - turn_penalties.to(returns.dtype)
    index, size = anchor_groups(group_ids, anchor_keys)
    if details is not None:
        details.update(step_return=returns, anchor_size=size)
    if returns.numel() == 0:
        return returns.clone()
    mean, std = _group_mean_std(returns, index, int(index.max()) + 1)
    centred = returns - mean.take(index)
    # A lone row is its own mean: exactly 0 either way (the released code divides 0 by 1 + ε there).
    return centred if step_norm == "mean_norm" else centred / (std.take(index) + eps)


def gigpo_advantages(
    seq_advantages: Tensor,
    traj_ids: Tensor,
    turn_ids: Tensor,
    group_ids: Tensor,
    anchor_keys: Tensor,
    turn_rewards: Tensor,
    *,
    turn_penalties: Tensor | None = None,
    omega: float = 1.0,
    step_gamma: float = 0.95,
    step_norm: str = "mean_norm",
    eps: float = 1e-6,
) -> Tensor:
    """GiGPO (verl-agent, Group-in-Group Policy Optimization): ``Ã_k = A_seq + ω · A_step,k``.

    ``seq_advantages`` is the episode-level group advantage (GRPO over trajectory returns) of the row's
    trajectory, as the trainer computes it; ``A_step`` is :func:`gigpo_step_advantages`. Output dtype is
    that of ``seq_advantages``.
    """
    _check_1d_same_length(seq_advantages=seq_advantages, traj_ids=traj_ids)
    _check_floating("seq_advantages", seq_advantages)
    step = gigpo_step_advantages(traj_ids, turn_ids, group_ids, anchor_keys, turn_rewards,
                                 turn_penalties=turn_penalties, step_gamma=step_gamma, step_norm=step_norm, eps=eps)
    return torch.add(seq_advantages, step.to(seq_advantages.dtype), alpha=omega)


def agentopsd_gigpo_advantages(
    seq_advantages: Tensor,
    evidence: Tensor,
    traj_ids: Tensor,
    turn_ids: Tensor,
    success_rate: Tensor,
    group_ids: Tensor,
    anchor_keys: Tensor,
    turn_rewards: Tensor,
    *,
    turn_penalties: Tensor | None = None,
    config: CreditConfig = CreditConfig.PAPER,
) -> Tensor:
    """AgentOPSD + GiGPO: ``Ã_k = A_seq [(1 − λ) + λ w_k] + ω · A_step,k``.

    The two signals answer different questions and are added, not multiplied: AgentOPSD redistributes the
    *episode* advantage over a trajectory's turns by the self-teacher's evidence (its sign and bounds are
    those of A_seq), and GiGPO's step term compares a turn with the other turns of the group that acted on
    the same state (it sums to zero over each anchor group, so it moves no advantage mass between groups).
    Hence: ω = 0 is AgentOPSD exactly; λ = 0 is GiGPO exactly; when every anchor group has one row (no state
    was revisited) the step term vanishes and this is AgentOPSD; with zero evidence every w_k is 1 and this
    is GiGPO. All hyper-parameters come from ``config`` (``lam, band, gamma, eps0, eps, variant`` for
    AgentOPSD, ``omega, step_gamma, step_norm`` for GiGPO).
    """
    opsd = _agentopsd_rows(seq_advantages, evidence, traj_ids, turn_ids, success_rate, config, None)
    step = gigpo_step_advantages(traj_ids, turn_ids, group_ids, anchor_keys, turn_rewards,
                                 turn_penalties=turn_penalties, step_gamma=config.step_gamma,
                                 step_norm=config.step_norm, eps=config.eps)
    return torch.add(opsd, step.to(opsd.dtype), alpha=config.omega)
