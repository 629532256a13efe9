"""Credit assignment: GRPO group advantages, AgentOPSD turn-level reshaping, GiGPO and their combination.

AgentOPSD (docs/method.md) redistributes a trajectory's GRPO advantage ``A_seq`` over its turns. The model, given
privileged skill context, supplies per-turn evidence ``e_k`` (teacher minus student log-prob of the sampled
turn). A recursive log-odds belief of success is anchored at the group success rate:

    B_0 = clip(R̄, ε0, 1 − ε0),   c_k = γ c_(k−1) + e_k,   B_k = σ(logit(B_0) + c_k),   ΔB_k = B_k − B_(k−1)

and each turn's share is a bounded re-weighting of ``A_seq``:

    q_k = sign(A_seq) ΔB_k,   z_k = standardise(q) within the trajectory,
    w_k = clip(1 + b z_k, 1 − b, 1 + b),   Ã_k = A_seq [(1 − λ) + λ w_k].

GiGPO (verl-agent) adds a step-level advantage computed within anchor-state groups (turns of one task group
that acted on the same state): ``Ã_k = A_seq + ω (G_k − mean_anchor G)`` (optionally ``/ std``), with G_k the
discounted return of per-turn rewards; ``agentopsd+gigpo`` adds the same step term to AgentOPSD's Ã_k.

Everything here is vectorised over turn rows in any order: rows are ranked by (trajectory, turn) once, laid
out on a padded (trajectories, max_turns) grid, and the discounted sum is a blocked matrix scan (stable for
any horizon: no ``γ^-k`` growth). ``reference_agentopsd_advantages`` and ``reference_gigpo_step_advantages``
are the slow, obvious loops the tests and the benchmark check the fast paths against. The trainer picks an
estimator by name through :func:`estimate`; each registered :class:`EstimatorSpec` declares what it needs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import ClassVar

import torch
from torch import Tensor

__all__ = [
    "ESTIMATORS",
    "GRANULARITIES",
    "STEP_NORMS",
    "VARIANTS",
    "CreditConfig",
    "CreditConfigError",
    "CreditInputs",
    "CreditResult",
    "EstimatorFn",
    "EstimatorSpec",
    "agentopsd_advantages",
    "agentopsd_gigpo_advantages",
    "agentopsd_token_advantages",
    "anchor_groups",
    "estimate",
    "estimator_spec",
    "gigpo_advantages",
    "gigpo_step_advantages",
    "grpo_advantages",
    "grpo_turn_penalty_advantages",
    "outcome_penalty_advantages",
    "pad_ragged",
    "reference_agentopsd_advantages",
    "reference_gigpo_step_advantages",
    "register_estimator",
    "step_discounted_returns",
    "turn_advantages",
]

VARIANTS: tuple[str, ...] = ("paper", "raw_gap", "unsigned", "no_prior")
"""AgentOPSD variants: the paper method and the three ablations it reports (docs/method.md, "Ablations")."""

# Width of one block of the discounted scan. Inside a block the scan is a (L, L) lower-triangular matmul;
# blocks are chained by a (recursive) scan over block ends, so cost is O(n·L) and every weight is γ^j ≤ 1.
_SCAN_BLOCK = 64
# Rows are ranked by a counting sort over the (traj id, turn id) range when that range has at most
# FACTOR·rows + SLACK cells, else by torch.sort (see _layout_turn_rows).
_COUNTING_SORT_FACTOR = 8
_COUNTING_SORT_SLACK = 4096
_AGENTOPSD_DETAILS = ("prior", "belief", "delta_belief", "weight")


# --------------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------------


STEP_NORMS: tuple[str, ...] = ("mean_norm", "mean_std_norm")
"""How GiGPO normalises a step return within its anchor group: centre only, or centre and divide by the std."""


class CreditConfigError(ValueError):
    """A credit hyper-parameter out of its range; ``field`` names it so a caller can re-key the message
    (the trainer's config says ``algorithm.lam`` where this says ``CreditConfig.lam``)."""

    def __init__(self, field_name: str, expected: str, value: object) -> None:
        self.field = field_name
        self.expected = expected
        self.value = value
        super().__init__(f"CreditConfig.{field_name}: expected {expected}, got {value!r}.")


# The one table of valid ranges: CreditConfig checks itself against it and the trainer's AlgorithmConfig
# validates through CreditConfig, so a range is written down once. Every predicate is written so that NaN fails.
_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "lam": (lambda v: 0.0 <= v <= 1.0, "0 ≤ lam ≤ 1"),
    "band": (lambda v: 0.0 < v < 1.0, "0 < band < 1"),
    "gamma": (lambda v: 0.0 < v <= 1.0, "0 < gamma ≤ 1"),
    "eps0": (lambda v: 0.0 < v < 0.5, "0 < eps0 < 0.5"),
    "eps": (lambda v: 0.0 < v < 0.5, "0 < eps < 0.5"),
    "omega": (lambda v: 0.0 <= v < math.inf, "0 ≤ omega < inf"),
    "step_gamma": (lambda v: 0.0 <= v <= 1.0, "0 ≤ step_gamma ≤ 1"),
}
_CHOICES: dict[str, tuple[str, ...]] = {"variant": VARIANTS, "step_norm": STEP_NORMS}


@dataclass(frozen=True)
class CreditConfig:
    """Hyper-parameters of credit assignment (defaults: the AgentOPSD paper and GiGPO's released recipe)."""

    lam: float = field(default=0.5, metadata={"help": "λ: mix between GRPO (0) and fully reshaped (1)."})
    band: float = field(default=0.2, metadata={"help": "b: per-turn weight is clipped to [1 − b, 1 + b]."})
    gamma: float = field(default=0.95, metadata={"help": "γ: discount of older evidence in the belief (1 = released "
                                                         "code)."})
    eps0: float = field(default=1e-3, metadata={"help": "ε0: the prior B_0 is clipped to [ε0, 1 − ε0]."})
    eps: float = field(default=1e-6, metadata={"help": "ε: belief clamp and std guard for numerical safety."})
    variant: str = field(default="paper", metadata={"help": f"one of {VARIANTS} (paper or an ablation)."})
    omega: float = field(default=1.0, metadata={"help": "ω: weight of GiGPO's step-level advantage."})
    step_gamma: float = field(default=0.95, metadata={"help": "GiGPO: discount of the per-step returns."})
    step_norm: str = field(default="mean_norm", metadata={"help": f"GiGPO anchor-group normalisation {STEP_NORMS}."})

    PAPER: ClassVar[CreditConfig]
    """The paper's defaults (λ=0.5, b=0.2, γ=0.95, ε0=1e-3, ε=1e-6)."""
    RELEASE: ClassVar[CreditConfig]
    """What the released code runs: a plain cumulative sum (γ=1) and ε0=1e-4."""

    def __post_init__(self) -> None:
        for name, (ok, expected) in _RANGES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(float(value)):
                raise CreditConfigError(name, expected, value)
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                raise CreditConfigError(name, f"one of {choices}", getattr(self, name))

    def agentopsd_kwargs(self) -> dict[str, float | str]:
        """The keyword arguments of :func:`agentopsd_advantages` (the GiGPO fields left out)."""
        return {k: getattr(self, k) for k in ("lam", "band", "gamma", "eps0", "eps", "variant")}


CreditConfig.PAPER = CreditConfig()
CreditConfig.RELEASE = CreditConfig(gamma=1.0, eps0=1e-4)


# --------------------------------------------------------------------------------------------------------
# GRPO
# --------------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------------
# AgentOPSD, turn level (the paper)
# --------------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------------
# AgentOPSD, token level (the released code's WebShop / Search-QA variant)
# --------------------------------------------------------------------------------------------------------


def agentopsd_token_advantages(
    seq_advantages: Tensor,
    token_logprob_gaps: Tensor,
    response_mask: Tensor,
    success_rate: Tensor,
    *,
    lam: float = 0.5,
    band: float = 0.2,
    gamma: float = 0.95,
    eps0: float = 1e-3,
    eps: float = 1e-6,
) -> Tensor:
    """Token-granularity AgentOPSD, as in the released code for WebShop and Search-QA.

    Each row (a turn) is its own sequence: the belief restarts at B_0 and runs over the row's response
    tokens, skipping masked-out positions (c_t = γ c_prev + gap_t over valid tokens only); z is taken over
    the valid tokens of that row. Inputs: ``seq_advantages`` (rows,) floating, ``token_logprob_gaps``
    (rows, tokens) teacher − student token log-probs, ``response_mask`` (rows, tokens) bool or 0/1,
    ``success_rate`` (rows,). Returns (rows, tokens) in the dtype of ``seq_advantages``, zero where masked.
    """
    cfg = CreditConfig(lam=lam, band=band, gamma=gamma, eps0=eps0, eps=eps, variant="paper")
    return _agentopsd_token_grid(seq_advantages, token_logprob_gaps, response_mask, success_rate, cfg, None)


def _agentopsd_token_grid(
    seq_advantages: Tensor,
    token_logprob_gaps: Tensor,
    response_mask: Tensor,
    success_rate: Tensor,
    cfg: CreditConfig,
    details: dict[str, Tensor] | None,
) -> Tensor:
    """:func:`agentopsd_token_advantages` with a validated config. ``details`` (when given) gets per-row
    summaries, so a turn reads like a turn-level one: ``prior`` B_0, ``belief`` B after the row's last valid
    token, ``delta_belief`` that minus B_0, ``weight`` the mean w over the valid tokens."""
    _check_1d_same_length(seq_advantages=seq_advantages, success_rate=success_rate)
    _check_floating("seq_advantages", seq_advantages)
    if token_logprob_gaps.dim() != 2 or response_mask.shape != token_logprob_gaps.shape:
        raise ValueError(
            "token_logprob_gaps and response_mask must both be (rows, tokens); got "
            f"{tuple(token_logprob_gaps.shape)} and {tuple(response_mask.shape)}."
        )
    if token_logprob_gaps.shape[0] != seq_advantages.shape[0]:
        raise ValueError(
            f"token_logprob_gaps has {token_logprob_gaps.shape[0]} rows but seq_advantages has "
            f"{seq_advantages.shape[0]}."
        )
    if response_mask.dtype != torch.bool:
        if bool(((response_mask != 0) & (response_mask != 1)).any()):
            raise ValueError("response_mask must be bool or contain only 0 and 1.")
        response_mask = response_mask != 0
    dtype = seq_advantages.dtype
    num_rows, num_tokens = token_logprob_gaps.shape
    if num_rows == 0 or num_tokens == 0:
        if details is not None:
            details.update({k: seq_advantages.new_zeros(num_rows) for k in _AGENTOPSD_DETAILS})
        return torch.zeros(token_logprob_gaps.shape, dtype=dtype, device=seq_advantages.device)

    # Compact each row's valid tokens to the left, so masked positions neither add evidence nor decay c.
    # Column num_tokens is a dump for masked positions and is dropped.
    compact_col = torch.where(response_mask, response_mask.long().cumsum(1) - 1, num_tokens)  # (rows, tokens)
    gaps = torch.where(response_mask, token_logprob_gaps.to(dtype), 0)
    e_grid = torch.zeros(num_rows, num_tokens + 1, dtype=dtype, device=seq_advantages.device)
    e_grid.scatter_(1, compact_col, gaps)
    num_valid = response_mask.sum(1)  # (rows,)
    grid_details: dict[str, Tensor] | None = {} if details is not None else None
    out_grid = _reshape_on_grid(e_grid, num_valid, seq_advantages, success_rate.to(dtype), cfg, grid_details)
    if details is not None and grid_details is not None:
        last = (num_valid - 1).clamp_min(0)[:, None]  # (rows, 1) compact column of the last valid token
        prior = grid_details["prior"]
        belief = torch.where(num_valid > 0, grid_details["belief"].gather(1, last).squeeze(1), prior)
        valid = torch.arange(e_grid.shape[1], device=e_grid.device) < num_valid[:, None]
        weight = torch.where(valid, grid_details["weight"], 0).sum(1) / num_valid.clamp_min(1)
        details.update(prior=prior, belief=belief, delta_belief=belief - prior,
                       weight=torch.where(num_valid > 0, weight, 1.0))
    out = out_grid.gather(1, compact_col)
    return torch.where(response_mask, out, 0)


# --------------------------------------------------------------------------------------------------------
# GiGPO (verl-agent) and its combination with AgentOPSD
# --------------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------------
# Named estimators: a registry the trainer dispatches through (it knows no estimator by name)
# --------------------------------------------------------------------------------------------------------

GRANULARITIES: tuple[str, ...] = ("turn", "token")


@dataclass(frozen=True)
class CreditInputs:
    """Everything a credit estimator may read. 1-D tensors have one entry per turn row (rows in any order).

    Required: ``seq_advantages`` A_seq of the row's trajectory (floating; sets the output dtype),
    ``traj_ids``, ``turn_ids`` (integer), ``success_rate`` R̄ of the row's group. Optional, supplied when an
    estimator declares it needs them (:attr:`EstimatorSpec.required_inputs`): ``evidence`` e_k (summed
    teacher − student log-probs), ``token_gaps`` and ``token_mask`` (rows, tokens) per-token gaps and
    which positions are response tokens (any alignment), ``group_ids`` task group of the row,
    ``anchor_keys`` integer hash of the state the turn acted on, ``turn_rewards`` the turn's own reward,
    ``turn_penalties`` its invalid-action penalty.
    """

    seq_advantages: Tensor
    traj_ids: Tensor
    turn_ids: Tensor
    success_rate: Tensor
    evidence: Tensor | None = None
    token_gaps: Tensor | None = None
    token_mask: Tensor | None = None
    group_ids: Tensor | None = None
    anchor_keys: Tensor | None = None
    turn_rewards: Tensor | None = None
    turn_penalties: Tensor | None = None

    @property
    def num_rows(self) -> int:
        return int(self.seq_advantages.shape[0])


@dataclass(frozen=True)
class CreditResult:
    """What :func:`estimate` returns: ``advantages`` (rows,) for a turn-level estimator or (rows, tokens) on
    the inputs' token grid for a token-level one; ``details`` the intermediate per-row numbers (only with
    ``return_details``: ``prior``, ``belief``, ``delta_belief``, ``weight`` for AgentOPSD; ``step_return``,
    ``step_advantage``, ``anchor_size`` for GiGPO)."""

    advantages: Tensor
    granularity: str
    details: Mapping[str, Tensor] = field(default_factory=dict)

    def token_advantages(
        self, token_mask: Tensor, *, row_offset: Tensor | None = None, dtype: torch.dtype | None = None
    ) -> list[Tensor]:
        """One 1-D tensor per row with an advantage per response token (the mask's True positions, in
        order): a turn-level value repeated, or the token-level grid read under the mask; ``row_offset``
        (rows,) is added to every token of its row (e.g. a per-turn penalty term)."""
        mask = token_mask.bool()
        lengths = mask.sum(1)
        adv = self.advantages
        if self.granularity == "token":
            flat = (adv if row_offset is None else adv + row_offset.to(adv.dtype)[:, None])[mask]
        else:
            flat = (adv if row_offset is None else adv + row_offset.to(adv.dtype)).repeat_interleave(lengths)
        return list(torch.split(flat.to(dtype or flat.dtype), lengths.tolist()))


EstimatorFn = Callable[[CreditInputs, CreditConfig, "dict[str, Tensor] | None"], Tensor]
"""(inputs, config, details) -> advantages; fills ``details`` when it is a dict (else computes no extras)."""


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered estimator and what it needs, so callers dispatch on declarations, never on names."""

    name: str
    fn: EstimatorFn
    granularity: str = "turn"
    needs_teacher: bool = True
    needs_anchors: bool = False
    fixed_variant: str | None = None
    summary: str = ""

    @property
    def required_inputs(self) -> tuple[str, ...]:
        """The optional :class:`CreditInputs` fields this estimator reads."""
        need: list[str] = []
        if self.needs_teacher:
            need += ["token_gaps", "token_mask"] if self.granularity == "token" else ["evidence"]
        if self.needs_anchors:
            need += ["group_ids", "anchor_keys", "turn_rewards"]
        return tuple(need)

    def check_config(self, config: CreditConfig) -> None:
        """ValueError when ``config`` asks for something this estimator cannot honour."""
        if self.fixed_variant is not None and config.variant not in ("paper", self.fixed_variant):
            raise ValueError(
                f"estimator {self.name!r} fixes variant={self.fixed_variant!r}, but the config asks for "
                f"variant={config.variant!r}; use estimator 'agentopsd' with the config's variant, or "
                f"leave config.variant at 'paper'."
            )


_ESTIMATORS: dict[str, EstimatorSpec] = {}
ESTIMATORS: Mapping[str, EstimatorSpec] = MappingProxyType(_ESTIMATORS)
"""Read-only view of the registered estimators, by name; add to it with :func:`register_estimator`."""


def register_estimator(
    name: str,
    *,
    granularity: str = "turn",
    needs_teacher: bool = True,
    needs_anchors: bool = False,
    fixed_variant: str | None = None,
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator registering ``fn(inputs, config, details) -> advantages`` under ``name`` (names are unique)
    with what it needs: the teacher's evidence, anchor states and per-turn rewards, turn or token output."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity: expected one of {GRANULARITIES}, got {granularity!r}.")

    def decorate(fn: EstimatorFn) -> EstimatorFn:
        if name in _ESTIMATORS:
            raise ValueError(f"estimator {name!r} is already registered ({_ESTIMATORS[name].fn!r}).")
        summary = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        _ESTIMATORS[name] = EstimatorSpec(name, fn, granularity, needs_teacher, needs_anchors, fixed_variant, summary)
        return fn

    return decorate


def estimator_spec(name: str) -> EstimatorSpec:
    """The registered spec of ``name``; ValueError listing the known names otherwise."""
    try:
        return _ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown estimator {name!r}; known: {sorted(_ESTIMATORS)}.") from None


def estimate(
    name: str, inputs: CreditInputs, config: CreditConfig = CreditConfig.PAPER, *, return_details: bool = False
) -> CreditResult:
    """Advantages from the estimator registered as ``name``; ``return_details`` also returns its intermediate
    numbers (copies made only then, so the training hot path pays nothing for them)."""
    spec = estimator_spec(name)
    spec.check_config(config)
    missing = [f for f in spec.required_inputs if getattr(inputs, f) is None]
    if missing:
        raise ValueError(f"estimator {name!r} needs {', '.join(missing)} in its CreditInputs.")
    details: dict[str, Tensor] | None = {} if return_details else None
    advantages = spec.fn(inputs, config, details)
    return CreditResult(advantages, spec.granularity, MappingProxyType(details) if details is not None else {})


def turn_advantages(
    name: str,
    seq_advantages: Tensor,
    evidence: Tensor,
    traj_ids: Tensor,
    turn_ids: Tensor,
    success_rate: Tensor,
    config: CreditConfig = CreditConfig.PAPER,
) -> Tensor:
    """Per-row advantages of a turn-level estimator that needs no anchors (shorthand for :func:`estimate`)."""
    inputs = CreditInputs(seq_advantages, traj_ids, turn_ids, success_rate, evidence=evidence)
    return estimate(name, inputs, config).advantages


def pad_ragged(seqs: Sequence[Tensor], dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """(rows, longest) grid of 1-D tensors packed left, zeros after, and its (rows, longest) bool mask."""
    if not seqs:
        return torch.zeros(0, 0, dtype=dtype), torch.zeros(0, 0, dtype=torch.bool)
    lengths = torch.tensor([s.numel() for s in seqs])
    grid = torch.nn.utils.rnn.pad_sequence([s.to(dtype) for s in seqs], batch_first=True)
    width = grid.shape[1] if grid.dim() == 2 else 0
    mask = torch.arange(width) < lengths[:, None]
    return grid.reshape(len(seqs), width), mask


def _evidence(inputs: CreditInputs) -> Tensor:
    assert inputs.evidence is not None  # estimate() checked required_inputs
    return inputs.evidence


def _step_term(inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None) -> Tensor:
    assert inputs.group_ids is not None and inputs.anchor_keys is not None and inputs.turn_rewards is not None
    step = gigpo_step_advantages(
        inputs.traj_ids, inputs.turn_ids, inputs.group_ids, inputs.anchor_keys,
        inputs.turn_rewards.to(inputs.seq_advantages.dtype), turn_penalties=inputs.turn_penalties,
        step_gamma=config.step_gamma, step_norm=config.step_norm, eps=config.eps, details=details,
    )
    if details is not None:
        details["step_advantage"] = step
    return step


@register_estimator("grpo", needs_teacher=False)
def _grpo_estimator(inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None) -> Tensor:
    """GRPO: every turn keeps its trajectory's advantage."""
    _check_1d_same_length(seq_advantages=inputs.seq_advantages, traj_ids=inputs.traj_ids,
                          turn_ids=inputs.turn_ids, success_rate=inputs.success_rate)
    _check_floating("seq_advantages", inputs.seq_advantages)
    return inputs.seq_advantages.clone()


@register_estimator("agentopsd")
def _agentopsd_estimator(inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None) -> Tensor:
    """AgentOPSD with ``config.variant`` (the paper form unless the config says otherwise)."""
    return _agentopsd_rows(inputs.seq_advantages, _evidence(inputs), inputs.traj_ids, inputs.turn_ids,
                           inputs.success_rate, config, details)


def _make_ablation(variant: str) -> EstimatorFn:
    def estimator(inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None) -> Tensor:
        cfg = replace(config, variant=variant)
        return _agentopsd_rows(inputs.seq_advantages, _evidence(inputs), inputs.traj_ids, inputs.turn_ids,
                               inputs.success_rate, cfg, details)

    estimator.__name__ = f"_agentopsd_{variant}_estimator"
    estimator.__doc__ = f"AgentOPSD ablation {variant!r} (docs/method.md, 'Ablations')."
    return estimator


for _variant in VARIANTS[1:]:
    register_estimator(f"agentopsd-{_variant}", fixed_variant=_variant)(_make_ablation(_variant))
del _variant


@register_estimator("agentopsd-token", granularity="token", fixed_variant="paper")
def _agentopsd_token_estimator(
    inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None
) -> Tensor:
    """AgentOPSD over the response tokens of each turn (the released WebShop / Search-QA variant)."""
    assert inputs.token_gaps is not None and inputs.token_mask is not None
    return _agentopsd_token_grid(inputs.seq_advantages, inputs.token_gaps, inputs.token_mask,
                                 inputs.success_rate, config, details)


@register_estimator("gigpo", needs_teacher=False, needs_anchors=True)
def _gigpo_estimator(inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None) -> Tensor:
    """GiGPO: episode advantage plus ω × the anchor-state step advantage (verl-agent)."""
    _check_1d_same_length(seq_advantages=inputs.seq_advantages, traj_ids=inputs.traj_ids)
    _check_floating("seq_advantages", inputs.seq_advantages)
    return torch.add(inputs.seq_advantages, _step_term(inputs, config, details), alpha=config.omega)


@register_estimator("agentopsd+gigpo", needs_anchors=True)
def _agentopsd_gigpo_estimator(
    inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None
) -> Tensor:
    """AgentOPSD-reshaped episode advantage plus ω × GiGPO's step advantage (see agentopsd_gigpo_advantages)."""
    opsd = _agentopsd_rows(inputs.seq_advantages, _evidence(inputs), inputs.traj_ids, inputs.turn_ids,
                           inputs.success_rate, config, details)
    return torch.add(opsd, _step_term(inputs, config, details), alpha=config.omega)


# --------------------------------------------------------------------------------------------------------
# Shared vectorised core
# --------------------------------------------------------------------------------------------------------


def _reshape_on_grid(
    e_grid: Tensor,
    num_valid: Tensor,
    adv: Tensor,
    rate: Tensor,
    cfg: CreditConfig,
    details: dict[str, Tensor] | None = None,
) -> Tensor:
    """Reshaped advantages on a padded grid of sequences (turns of a trajectory, or tokens of a turn).

    ``e_grid`` (seqs, L) evidence, each row's ``num_valid`` (seqs,) entries packed left and zeros after;
    ``adv`` and ``rate`` (seqs,). Returns (seqs, L); entries past a row's ``num_valid`` are junk.
    ``details``, when given, receives ``prior`` (seqs,) and the (seqs, L) ``belief``, ``delta_belief`` and
    ``weight`` grids; without it nothing extra is copied (the in-place hot path is unchanged).
    """
    if cfg.variant == "no_prior":
        b0 = torch.full_like(rate, 0.5)
    else:  # clip to [ε0, 1 − ε0], then the same [ε, 1 − ε] clamp as B_k so ΔB_1 compares like with like
        b0 = rate.clamp(max(cfg.eps0, cfg.eps), 1.0 - max(cfg.eps0, cfg.eps))
    c = _discounted_cumsum(e_grid, cfg.gamma)  # (seqs, L) c_k = Σ_{j≤k} γ^(k−j) e_j
    logit_b0 = torch.logit(b0)
    logits = c.add_(logit_b0[:, None])  # (seqs, L) logit B_k
    belief = torch.sigmoid(logits).clamp_(cfg.eps, 1.0 - cfg.eps)
    start = torch.sigmoid(logit_b0).clamp_(cfg.eps, 1.0 - cfg.eps)  # B_0 as the belief's arithmetic gives it
    prev_logits = torch.cat([logit_b0[:, None], logits[:, :-1]], dim=1)
    # ΔB_k = B_k − B_(k−1), exactly 0 where the logit did not move (zero evidence): σ of equal inputs can round
    # differently in a vectorised kernel, and 1/(std + ε) would amplify that noise into weights (w ≈ 1.03).
    delta_b = torch.where(logits == prev_logits, 0.0, belief - torch.cat([start[:, None], belief[:, :-1]], dim=1))
    if details is not None:  # copies: the lines below overwrite delta_b in place
        details.update(prior=b0, belief=belief, delta_belief=delta_b.clone())

    # (seqs, L) 1.0 on valid entries, 0.0 after; a float mask because multiplying by it is the cheapest op.
    valid = (torch.arange(e_grid.shape[1], device=e_grid.device) < num_valid[:, None]).to(e_grid.dtype)
    # q without its sign(A) factor: z(sign·q) = sign·z(q), so the sign is applied to the per-row scale below.
    if cfg.variant == "raw_gap":
        q = e_grid  # already 0 past the valid entries
    elif cfg.variant == "unsigned":
        q = delta_b.abs_().mul_(valid)
    else:
        q = delta_b.mul_(valid)
    sign = torch.ones_like(adv) if cfg.variant == "unsigned" else torch.sign(adv)

    # z over the valid entries of each sequence: mean and population std.
    count = num_valid.to(q.dtype).clamp_min_(1.0)[:, None]  # (seqs, 1)
    centred = (q - q.sum(1, keepdim=True).div_(count)).mul_(valid)  # exactly 0 for a one-entry sequence
    std = torch.linalg.vector_norm(centred, dim=1, keepdim=True).div_(count.sqrt_())
    scale = std.add_(cfg.eps).reciprocal_().mul_(sign[:, None] * cfg.band)  # (seqs, 1) b·sign(A)/(std + ε)
    # w − 1 = clip(b z, −b, b); Ã = A + λ A (w − 1) equals A [(1 − λ) + λ w] and is exactly A when λ or z is 0.
    w_minus_1 = centred.mul_(scale).clamp_(-cfg.band, cfg.band)
    if details is not None:
        details["weight"] = w_minus_1 + 1.0
    return w_minus_1.mul_((cfg.lam * adv)[:, None]).add_(adv[:, None])  # (in place: addcmul is slower here)


@functools.lru_cache(maxsize=32)
def _decay_matrix(gamma: float, block: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(block, block) read-only constant, [j, k] = γ^(k − j) for k ≥ j else 0; memoised since the same γ and
    block size recur every training step. Built contiguous: a matmul with a transposed view is far slower."""
    lags = torch.arange(block, device=device)
    gamma_t = torch.tensor(gamma, dtype=dtype, device=device)  # powers in the target dtype, not float32
    return (gamma_t ** (lags[None, :] - lags[:, None]).clamp_min_(0)).triu_()


def _discounted_cumsum(x: Tensor, gamma: float) -> Tensor:
    """``out[:, k] = Σ_{j≤k} γ^(k−j) x[:, j]`` along the last dim of (seqs, L), without γ^-k blow-up.

    Blocks of ``_SCAN_BLOCK`` columns are scanned by a (B, B) triangular matmul; the block ends are then
    chained by the same scan with factor γ^B (recursively), so every weight used is in [0, 1] and the
    rounding error is that of a plain weighted sum (no γ^-k rescaling, which overflows for long rows).
    """
    num_seqs, length = x.shape
    block = min(length, _SCAN_BLOCK)
    num_blocks = -(-length // block)
    if num_blocks * block != length:
        x = torch.nn.functional.pad(x, (0, num_blocks * block - length))
    blocks = x.view(num_seqs, num_blocks, block)
    local = blocks @ _decay_matrix(gamma, block, x.dtype, x.device)  # (seqs, blocks, block) restarted scans
    if num_blocks > 1:
        block_end = local[:, :, -1]  # (seqs, blocks)
        carry = _discounted_cumsum(block_end, gamma**block)  # c at the end of each block
        carry_in = torch.nn.functional.pad(carry[:, :-1], (1, 0))  # c entering each block
        gamma_t = torch.tensor(gamma, dtype=x.dtype, device=x.device)  # powers in x's dtype, not float32
        lags = torch.arange(block, device=x.device)
        local = local + carry_in[:, :, None] * gamma_t ** (lags + 1)
    return local.reshape(num_seqs, num_blocks * block)[:, :length]


# --------------------------------------------------------------------------------------------------------
# Sorting and validation helpers
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TurnLayout:
    """Where each turn row sits on the padded (trajectories, max_turns) grid."""

    traj_index: Tensor  # (rows,) dense trajectory index 0..n−1, trajectories in increasing id order
    turn_pos: Tensor  # (rows,) 0-based position of the row's turn within its trajectory
    num_turns: Tensor  # (n,) turns of each trajectory
    max_turns: int


def _layout_turn_rows(traj_ids: Tensor, turn_ids: Tensor) -> _TurnLayout:
    """Rank rows by (traj, turn) without a Python loop; ValueError on a duplicated (traj, turn) pair.

    Ids are usually dense (rollout.py numbers trajectories ``first_traj_id + i`` and turns 0..K−1): then a
    counting sort over the id range is O(rows + range) and much cheaper than a comparison sort. Sparse ids
    are first made dense with torch.unique (one sort), then counted the same way.
    """
    traj_lo, traj_hi, turn_lo, turn_hi = torch.stack(
        [*torch.aminmax(traj_ids), *torch.aminmax(turn_ids)]
    ).tolist()
    traj_span, turn_span = traj_hi - traj_lo + 1, turn_hi - turn_lo + 1
    cells_max = _COUNTING_SORT_FACTOR * traj_ids.numel() + _COUNTING_SORT_SLACK
    if traj_span * turn_span <= cells_max:
        return _layout_by_counting(
            traj_ids - traj_lo, turn_ids - turn_lo, traj_span, turn_span, traj_ids, turn_ids
        )
    traj_key = torch.unique(traj_ids, return_inverse=True)[1]  # (rows,) dense 0..n−1, order kept
    traj_span = int(traj_key.max()) + 1
    if traj_span * turn_span <= cells_max:
        return _layout_by_counting(traj_key, turn_ids - turn_lo, traj_span, turn_span, traj_ids, turn_ids)
    turn_key = torch.unique(turn_ids, return_inverse=True)[1]  # both keys < rows: their product fits int64
    return _layout_by_sorting(traj_key, turn_key, int(turn_key.max()) + 1, traj_ids, turn_ids)


def _layout_by_counting(
    traj_key: Tensor, turn_key: Tensor, traj_span: int, turn_span: int, traj_ids: Tensor, turn_ids: Tensor
) -> _TurnLayout:
    """Counting sort; ``traj_key`` in [0, traj_span) and ``turn_key`` in [0, turn_span) keep the id order."""
    key = torch.add(turn_key, traj_key, alpha=turn_span)  # (rows,) cell of the (traj_span, turn_span) table
    table = torch.bincount(key, minlength=traj_span * turn_span).view(traj_span, turn_span)
    num_turns = table.sum(1)  # (traj_span,) 0 for a key in the range that no row uses
    present = num_turns > 0
    most_per_cell, max_turns, num_traj = torch.stack([table.max(), num_turns.max(), present.sum()]).tolist()
    if most_per_cell > 1:
        _raise_duplicate(traj_ids, turn_ids)
    rank = table.cumsum(1).sub_(1)  # (traj_span, turn_span) turn key -> position within its trajectory
    turn_pos = rank.take(key)
    if num_traj == traj_span:  # no unused keys: the key is the grid row
        return _TurnLayout(traj_key, turn_pos, num_turns, max_turns)
    dense = present.cumsum(0).sub_(1)  # (traj_span,) key -> grid row, skipping unused keys
    return _TurnLayout(dense.take(traj_key), turn_pos, num_turns[present], max_turns)


def _layout_by_sorting(
    traj_key: Tensor, turn_key: Tensor, turn_span: int, traj_ids: Tensor, turn_ids: Tensor
) -> _TurnLayout:
    """Comparison sort on one int64 key; for many trajectories that each use different turn ids."""
    key = torch.add(turn_key, traj_key, alpha=turn_span)
    sorted_key, order = torch.sort(key)  # non-stable is fine: keys are unique unless duplicated
    if bool((sorted_key[1:] == sorted_key[:-1]).any()):
        _raise_duplicate(traj_ids, turn_ids)
    traj_sorted = traj_key[order]
    starts = torch.ones_like(traj_sorted, dtype=torch.bool)  # (rows,) True at each trajectory's first row
    starts[1:] = traj_sorted[1:] != traj_sorted[:-1]
    seg = starts.long().cumsum(0) - 1  # (rows,) dense trajectory index of each sorted row
    pos = torch.arange(order.numel(), device=order.device) - starts.nonzero().squeeze(1)[seg]
    num_turns = torch.bincount(seg)
    unsort = torch.empty_like(order)
    return _TurnLayout(
        unsort.scatter(0, order, seg), unsort.scatter(0, order, pos), num_turns, int(num_turns.max())
    )


def _raise_duplicate(traj_ids: Tensor, turn_ids: Tensor) -> None:
    """Error path only: name one duplicated (traj, turn) pair."""
    seen: set[tuple[int, int]] = set()
    for pair in zip(traj_ids.tolist(), turn_ids.tolist(), strict=True):
        if pair in seen:
            break
        seen.add(pair)
    raise ValueError(
        f"duplicate (traj_id, turn_id) = {pair} in the turn rows: each turn must appear once "
        "(drop padding rows before credit assignment)."
    )


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
