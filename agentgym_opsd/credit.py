"""Credit assignment: GRPO group advantages and AgentOPSD turn-level reshaping.

AgentOPSD (SPEC.md) redistributes a trajectory's GRPO advantage ``A_seq`` over its turns. The model, given
privileged skill context, supplies per-turn evidence ``e_k`` (teacher minus student log-prob of the sampled
turn). A recursive log-odds belief of success is anchored at the group success rate:

    B_0 = clip(R̄, ε0, 1 − ε0),   c_k = γ c_(k−1) + e_k,   B_k = σ(logit(B_0) + c_k),   ΔB_k = B_k − B_(k−1)

and each turn's share is a bounded re-weighting of ``A_seq``:

    q_k = sign(A_seq) ΔB_k,   z_k = standardise(q) within the trajectory,
    w_k = clip(1 + b z_k, 1 − b, 1 + b),   Ã_k = A_seq [(1 − λ) + λ w_k].

Everything here is vectorised over turn rows in any order: rows are ranked by (trajectory, turn) once, laid
out on a padded (trajectories, max_turns) grid, and the discounted sum is a blocked matrix scan (stable for
any horizon: no ``γ^-k`` growth). ``reference_agentopsd_advantages`` is the slow, obvious loop the tests and
the benchmark check the fast path against.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import ClassVar

import torch
from torch import Tensor

__all__ = [
    "ESTIMATORS",
    "VARIANTS",
    "CreditConfig",
    "Estimator",
    "agentopsd_advantages",
    "agentopsd_token_advantages",
    "grpo_advantages",
    "grpo_turn_penalty_advantages",
    "reference_agentopsd_advantages",
    "register_estimator",
    "turn_advantages",
]

VARIANTS: tuple[str, ...] = ("paper", "raw_gap", "unsigned", "no_prior")
"""AgentOPSD variants: the paper method and the three ablations it reports (SPEC.md, "Ablations")."""

# Width of one block of the discounted scan. Inside a block the scan is a (L, L) lower-triangular matmul;
# blocks are chained by a (recursive) scan over block ends, so cost is O(n·L) and every weight is γ^j ≤ 1.
_SCAN_BLOCK = 64
# Rows are ranked by a counting sort over the (traj id, turn id) range when that range has at most
# FACTOR·rows + SLACK cells, else by torch.sort (see _layout_turn_rows).
_COUNTING_SORT_FACTOR = 8
_COUNTING_SORT_SLACK = 4096


# --------------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreditConfig:
    """Hyper-parameters of AgentOPSD credit assignment (defaults: the paper)."""

    lam: float = field(default=0.5, metadata={"help": "λ: mix between GRPO (0) and fully reshaped (1)."})
    band: float = field(default=0.2, metadata={"help": "b: per-turn weight is clipped to [1 − b, 1 + b]."})
    gamma: float = field(default=0.95, metadata={"help": "γ: discount of older evidence in the belief."})
    eps0: float = field(default=1e-3, metadata={"help": "ε0: the prior B_0 is clipped to [ε0, 1 − ε0]."})
    eps: float = field(default=1e-6, metadata={"help": "ε: belief clamp and std guard for numerical safety."})
    variant: str = field(default="paper", metadata={"help": f"one of {VARIANTS} (paper or an ablation)."})

    PAPER: ClassVar[CreditConfig]
    """The paper's defaults (λ=0.5, b=0.2, γ=0.95, ε0=1e-3, ε=1e-6)."""
    RELEASE: ClassVar[CreditConfig]
    """What the released code runs: a plain cumulative sum (γ=1) and ε0=1e-4."""

    def __post_init__(self) -> None:
        checks = (
            ("lam", 0.0 <= self.lam <= 1.0, "0 ≤ lam ≤ 1"),
            ("band", 0.0 < self.band < 1.0, "0 < band < 1"),
            ("gamma", 0.0 < self.gamma <= 1.0, "0 < gamma ≤ 1"),
            ("eps0", 0.0 < self.eps0 < 0.5, "0 < eps0 < 0.5"),
            ("eps", 0.0 < self.eps < 0.5, "0 < eps < 0.5"),
        )
        for name, ok, expected in checks:
            if not ok:  # also catches NaN, for which every comparison is False
                raise ValueError(f"CreditConfig.{name}: expected {expected}, got {getattr(self, name)!r}.")
        if self.variant not in VARIANTS:
            raise ValueError(f"CreditConfig.variant: expected one of {VARIANTS}, got {self.variant!r}.")


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
    """AgentOPSD advantage Ã_k of every turn row (SPEC.md), vectorised; rows may come in any order.

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
    _check_turn_rows(seq_advantages, evidence, traj_ids, turn_ids, success_rate)
    dtype = seq_advantages.dtype
    num_rows = seq_advantages.numel()
    if num_rows == 0:
        return seq_advantages.clone()

    layout = _layout_turn_rows(traj_ids, turn_ids)
    num_traj, max_turns = layout.num_turns.numel(), layout.max_turns
    flat = torch.add(layout.turn_pos, layout.traj_index, alpha=max_turns)  # (rows,) cell of the flat grid
    e_grid = seq_advantages.new_zeros(num_traj * max_turns).scatter_(0, flat, evidence.to(dtype))

    # Trajectory-level inputs: one value per trajectory (traj,), and every row must agree with it.
    adv = _per_trajectory("seq_advantages", seq_advantages, layout.traj_index, num_traj)
    rate = _per_trajectory("success_rate", success_rate.to(dtype), layout.traj_index, num_traj)
    out_grid = _reshape_on_grid(e_grid.view(num_traj, max_turns), layout.num_turns, adv, rate, cfg)
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
) -> Tensor:
    """SLOW reference: SPEC.md written out as a plain Python loop per trajectory, in float64 Python math.

    Same contract as :func:`agentopsd_advantages`; it exists only so tests and the benchmark can check
    the vectorised path against something obviously right. Do not use it for training.
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
        c, b_prev, q = 0.0, b0, []
        for row in rows:
            e = e_rows[row]
            c = cfg.gamma * c + e
            b = 1.0 / (1.0 + math.exp(-(logit_b0 + c)))
            b = min(max(b, cfg.eps), 1.0 - cfg.eps)
            delta_b = b - b_prev
            b_prev = b
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
    return torch.tensor(out, dtype=seq_advantages.dtype, device=seq_advantages.device)


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
        return torch.zeros(token_logprob_gaps.shape, dtype=dtype, device=seq_advantages.device)

    # Compact each row's valid tokens to the left, so masked positions neither add evidence nor decay c.
    # Column num_tokens is a dump for masked positions and is dropped.
    compact_col = torch.where(response_mask, response_mask.long().cumsum(1) - 1, num_tokens)  # (rows, tokens)
    gaps = torch.where(response_mask, token_logprob_gaps.to(dtype), 0)
    e_grid = torch.zeros(num_rows, num_tokens + 1, dtype=dtype, device=seq_advantages.device)
    e_grid.scatter_(1, compact_col, gaps)
    num_valid = response_mask.sum(1)  # (rows,)
    out_grid = _reshape_on_grid(e_grid, num_valid, seq_advantages, success_rate.to(dtype), cfg)
    out = out_grid.gather(1, compact_col)
    return torch.where(response_mask, out, 0)


# --------------------------------------------------------------------------------------------------------
# Named estimators (the trainer picks one by name)
# --------------------------------------------------------------------------------------------------------

Estimator = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, CreditConfig], Tensor]
"""(seq_advantages, evidence, traj_ids, turn_ids, success_rate, config) -> per-row advantages."""

_ESTIMATORS: dict[str, Estimator] = {}
ESTIMATORS: Mapping[str, Estimator] = MappingProxyType(_ESTIMATORS)
"""Read-only view of the registered estimators, by name; add to it with :func:`register_estimator`."""


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Decorator registering a turn-level advantage estimator under ``name`` (names are unique)."""

    def decorate(fn: Estimator) -> Estimator:
        if name in _ESTIMATORS:
            raise ValueError(f"estimator {name!r} is already registered ({_ESTIMATORS[name]!r}).")
        _ESTIMATORS[name] = fn
        return fn

    return decorate


def turn_advantages(
    name: str,
    seq_advantages: Tensor,
    evidence: Tensor,
    traj_ids: Tensor,
    turn_ids: Tensor,
    success_rate: Tensor,
    config: CreditConfig = CreditConfig.PAPER,
) -> Tensor:
    """Per-row advantages from the estimator registered as ``name`` (see ``ESTIMATORS``)."""
    try:
        estimator = _ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown estimator {name!r}; known: {sorted(_ESTIMATORS)}.") from None
    return estimator(seq_advantages, evidence, traj_ids, turn_ids, success_rate, config)


@register_estimator("grpo")
def _grpo_estimator(
    seq_advantages: Tensor,
    evidence: Tensor,
    traj_ids: Tensor,
    turn_ids: Tensor,
    success_rate: Tensor,
    config: CreditConfig,
) -> Tensor:
    """GRPO: every turn keeps its trajectory's advantage."""
    _check_turn_rows(seq_advantages, evidence, traj_ids, turn_ids, success_rate)
    return seq_advantages.clone()


@register_estimator("agentopsd")
def _agentopsd_estimator(
    seq_advantages: Tensor,
    evidence: Tensor,
    traj_ids: Tensor,
    turn_ids: Tensor,
    success_rate: Tensor,
    config: CreditConfig,
) -> Tensor:
    """AgentOPSD with ``config.variant`` (the paper form unless the config says otherwise)."""
    return agentopsd_advantages(seq_advantages, evidence, traj_ids, turn_ids, success_rate, **asdict(config))


def _make_ablation(variant: str) -> Estimator:
    def estimator(
        seq_advantages: Tensor,
        evidence: Tensor,
        traj_ids: Tensor,
        turn_ids: Tensor,
        success_rate: Tensor,
        config: CreditConfig,
    ) -> Tensor:
        if config.variant not in ("paper", variant):
            raise ValueError(
                f"estimator 'agentopsd-{variant}' fixes variant={variant!r}, but the config asks for "
                f"variant={config.variant!r}; use estimator 'agentopsd' with the config's variant, or "
                f"leave config.variant at 'paper'."
            )
        kwargs = {**asdict(config), "variant": variant}
        return agentopsd_advantages(seq_advantages, evidence, traj_ids, turn_ids, success_rate, **kwargs)

    estimator.__name__ = f"_agentopsd_{variant}_estimator"
    estimator.__doc__ = f"AgentOPSD ablation {variant!r} (SPEC.md, 'Ablations')."
    return estimator


for _variant in VARIANTS[1:]:
    register_estimator(f"agentopsd-{_variant}")(_make_ablation(_variant))
del _variant


# --------------------------------------------------------------------------------------------------------
# Shared vectorised core
# --------------------------------------------------------------------------------------------------------


def _reshape_on_grid(
    e_grid: Tensor, num_valid: Tensor, adv: Tensor, rate: Tensor, cfg: CreditConfig
) -> Tensor:
    """Reshaped advantages on a padded grid of sequences (turns of a trajectory, or tokens of a turn).

    ``e_grid`` (seqs, L) evidence, each row's ``num_valid`` (seqs,) entries packed left and zeros after;
    ``adv`` and ``rate`` (seqs,). Returns (seqs, L); entries past a row's ``num_valid`` are junk.
    """
    if cfg.variant == "no_prior":
        b0 = torch.full_like(rate, 0.5)
    else:  # clip to [ε0, 1 − ε0], then the same [ε, 1 − ε] clamp as B_k so ΔB_1 compares like with like
        b0 = rate.clamp(max(cfg.eps0, cfg.eps), 1.0 - max(cfg.eps0, cfg.eps))
    c = _discounted_cumsum(e_grid, cfg.gamma)  # (seqs, L) c_k = Σ_{j≤k} γ^(k−j) e_j
    belief = torch.sigmoid(c.add_(torch.logit(b0)[:, None])).clamp_(cfg.eps, 1.0 - cfg.eps)
    delta_b = belief - torch.cat([b0[:, None], belief[:, :-1]], dim=1)  # ΔB_k = B_k − B_(k−1)

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
