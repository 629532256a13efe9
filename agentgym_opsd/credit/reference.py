"""SLOW reference implementations: docs/method.md and GiGPO written out as plain Python loops per trajectory,
in float64 Python math. They are the readable ground truth that tests/test_credit.py,
tests/test_credit_gigpo.py and the credit benchmark check the vectorised estimators against; never
use them for training."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from agentgym_opsd.credit._checks import _check_turn_rows
from agentgym_opsd.credit.agentopsd import _AGENTOPSD_DETAILS
from agentgym_opsd.credit.config import CreditConfig


def reference_agentopsd_advantages(
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
    details: dict[str, Tensor] | None = None,
) -> Tensor:
    """SLOW reference: docs/method.md written out as a plain Python loop per trajectory, in float64 Python math.

    Same contract as :func:`agentopsd_advantages`; it exists only so tests and the benchmark can check
    the vectorised path against something obviously right. Do not use it for training. ``details``, when
    given, receives the per-row ``prior``, ``belief``, ``delta_belief`` and ``weight``.
    """
    cfg = CreditConfig(lam=lam, band=band, gamma=gamma, eps0=eps0, eps=eps, variant=variant)
    _check_turn_rows(seq_advantages, evidence, traj_ids, turn_ids, success_rate)
    adv_rows = seq_advantages.tolist()
    e_rows = evidence.tolist()
    rate_rows = success_rate.tolist()
    rows_of_traj: dict[int, list[tuple[int, int]]] = {}
    for row, (traj, turn) in enumerate(zip(traj_ids.tolist(), turn_ids.tolist(), strict=True)):
        rows_of_traj.setdefault(traj, []).append((turn, row))

    out = [0.0] * len(adv_rows)
    trace: dict[str, list[float]] = {k: [0.0] * len(adv_rows) for k in _AGENTOPSD_DETAILS}
    for traj, turn_rows in rows_of_traj.items():
        turn_rows.sort()
        turns = [turn for turn, _ in turn_rows]
        if len(set(turns)) != len(turns):
            raise ValueError(f"duplicate (traj_id, turn_id) rows in trajectory {traj}.")
        rows = [row for _, row in turn_rows]
        a = adv_rows[rows[0]]
        sign_a = (a > 0) - (a < 0)

        b0 = 0.5 if cfg.variant == "no_prior" else min(max(rate_rows[rows[0]], cfg.eps0), 1.0 - cfg.eps0)
        b0 = min(max(b0, cfg.eps), 1.0 - cfg.eps)
        logit_b0 = math.log(b0) - math.log(1.0 - b0)
        # ΔB_1 against B_0 as the belief's own arithmetic rounds it: zero evidence is then exactly ΔB = 0
        start = min(max(1.0 / (1.0 + math.exp(-logit_b0)), cfg.eps), 1.0 - cfg.eps)
        c, b_prev, q = 0.0, start, []
        for row in rows:
            e = e_rows[row]
            c = cfg.gamma * c + e
            b = 1.0 / (1.0 + math.exp(-(logit_b0 + c)))
            b = min(max(b, cfg.eps), 1.0 - cfg.eps)
            delta_b = b - b_prev
            b_prev = b
            trace["prior"][row], trace["belief"][row], trace["delta_belief"][row] = b0, b, delta_b
            if cfg.variant == "raw_gap":
                q.append(sign_a * e)
            elif cfg.variant == "unsigned":
                q.append(abs(delta_b))
            else:
                q.append(sign_a * delta_b)

        mean_q = sum(q) / len(q)
        std_q = math.sqrt(sum((x - mean_q) ** 2 for x in q) / len(q))  # population std
        for row, q_k in zip(rows, q, strict=True):
            z = (q_k - mean_q) / (std_q + cfg.eps)
            w = min(max(1.0 + cfg.band * z, 1.0 - cfg.band), 1.0 + cfg.band)
            out[row] = a * ((1.0 - cfg.lam) + cfg.lam * w)
            trace["weight"][row] = w
    like = dict(dtype=seq_advantages.dtype, device=seq_advantages.device)
    if details is not None:
        details.update({k: torch.tensor(v, **like) for k, v in trace.items()})
    return torch.tensor(out, **like)


def reference_gigpo_step_advantages(
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
) -> Tensor:
    """SLOW reference of :func:`gigpo_step_advantages`: dictionaries and Python loops, float64 math. For
    tests and the benchmark only."""
    trajs, turns = traj_ids.tolist(), turn_ids.tolist()
    groups, keys = group_ids.tolist(), anchor_keys.tolist()
    rewards = turn_rewards.tolist()
    penalties = turn_penalties.tolist() if turn_penalties is not None else [0.0] * len(rewards)
    rows_of_traj: dict[int, list[tuple[int, int]]] = {}
    for row, (traj, turn) in enumerate(zip(trajs, turns, strict=True)):
        rows_of_traj.setdefault(traj, []).append((turn, row))
    returns = [0.0] * len(rewards)
    for turn_rows in rows_of_traj.values():
        running = 0.0
        for _, row in sorted(turn_rows, reverse=True):  # last turn first
            running = rewards[row] + step_gamma * running
            returns[row] = running - penalties[row]
    members: dict[tuple[int, int], list[int]] = {}
    for row, key in enumerate(zip(groups, keys, strict=True)):
        members.setdefault(key, []).append(row)
    out = [0.0] * len(rewards)
    for rows in members.values():
        values = [returns[r] for r in rows]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        for r, v in zip(rows, values, strict=True):
            out[r] = v - mean if step_norm == "mean_norm" else (v - mean) / (std + eps)
    return torch.tensor(out, dtype=turn_rewards.dtype, device=turn_rewards.device)
