"""AgentOPSD at turn level (the paper, docs/method.md): each trajectory's A_seq redistributed over its
turns by the self-teacher's evidence, vectorised over turn rows in any order."""

from __future__ import annotations

import torch
from torch import Tensor

from agentgym_opsd.credit._checks import _check_turn_rows, _per_trajectory
from agentgym_opsd.credit._grid import _AGENTOPSD_DETAILS, _reshape_on_grid
from agentgym_opsd.credit._layout import _layout_turn_rows
from agentgym_opsd.credit.config import CreditConfig


def agentopsd_advantages(
    seq_advantages: Tensor,
    evidence: Tensor,
    traj_ids: Tensor,
    turn_ids: Tensor,
    success_rate: Tensor,
    *,
    lam: float = 0.5,
    band: float = 0.2,
    gamma: float = 0.95,
    eps0: float = 1e-3,
    eps: float = 1e-6,
    variant: str = "paper",
) -> Tensor:
    """AgentOPSD advantage Ã_k of every turn row (docs/method.md), vectorised; rows may come in any order.

    All arguments are 1-D with one entry per turn row:
      ``seq_advantages`` A_seq of the row's trajectory (floating; sets the output dtype and device),
      ``evidence`` e_k, the summed teacher − student log-prob of the turn's response tokens,
      ``traj_ids`` any integer trajectory ids, ``turn_ids`` integer turn position within the trajectory
      (only their order matters: the smallest turn id of a trajectory is its first turn k=1),
      ``success_rate`` R̄, the row's group success rate in [0, 1] before clipping.
    ``seq_advantages`` and ``success_rate`` must be constant within a trajectory, and each (traj, turn)
    pair may occur once (a duplicated, e.g. padding, row would count a turn twice): otherwise ValueError.
    ``variant``: "paper"; "raw_gap" (q_k = sign(A)·e_k); "unsigned" (q_k = |ΔB_k|); "no_prior" (B_0 = 0.5).
    """
    cfg = CreditConfig(lam=lam, band=band, gamma=gamma, eps0=eps0, eps=eps, variant=variant)
    return _agentopsd_rows(seq_advantages, evidence, traj_ids, turn_ids, success_rate, cfg, None)


def _agentopsd_rows(
    seq_advantages: Tensor,
    evidence: Tensor,
    traj_ids: Tensor,
    turn_ids: Tensor,
    success_rate: Tensor,
    cfg: CreditConfig,
    details: dict[str, Tensor] | None,
) -> Tensor:
    """:func:`agentopsd_advantages` with a validated config; fills ``details`` (when given) with the per-row
    ``prior`` B_0, ``belief`` B_k, ``delta_belief`` ΔB_k and ``weight`` w_k."""
    _check_turn_rows(seq_advantages, evidence, traj_ids, turn_ids, success_rate)
    dtype = seq_advantages.dtype
    num_rows = seq_advantages.numel()
    if num_rows == 0:
        if details is not None:
            details.update({k: seq_advantages.new_zeros(0) for k in _AGENTOPSD_DETAILS})
        return seq_advantages.clone()

    layout = _layout_turn_rows(traj_ids, turn_ids)
    num_traj, max_turns = layout.num_turns.numel(), layout.max_turns
    flat = torch.add(layout.turn_pos, layout.traj_index, alpha=max_turns)  # (rows,) cell of the flat grid
    e_grid = seq_advantages.new_zeros(num_traj * max_turns).scatter_(0, flat, evidence.to(dtype))

    # Trajectory-level inputs: one value per trajectory (traj,), and every row must agree with it.
    adv = _per_trajectory("seq_advantages", seq_advantages, layout.traj_index, num_traj)
    rate = _per_trajectory("success_rate", success_rate.to(dtype), layout.traj_index, num_traj)
    grid_details: dict[str, Tensor] | None = {} if details is not None else None
    out_grid = _reshape_on_grid(e_grid.view(num_traj, max_turns), layout.num_turns, adv, rate, cfg, grid_details)
    if details is not None and grid_details is not None:
        details["prior"] = grid_details.pop("prior").take(layout.traj_index)
        details.update({k: v.take(flat) for k, v in grid_details.items()})
    return out_grid.take(flat)
