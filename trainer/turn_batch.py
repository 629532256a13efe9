"""The values one RL step's phases hand each other, each made once by its phase and never changed.

    score    -> TurnBatch          (`build_turn_batch`: one row per turn, rewards, group success rates R̄)
    logprobs -> PolicyLogProbs     (π_old of every response token; the KL reference's)
    teacher  -> TeacherEvidence    (`trainer/teacher_evidence.py`: the teacher's prompts and log-probs, e_k)
    credit   -> BatchAdvantages    (`batch_advantages`: A_seq, the penalty bookkeeping, the registered estimator)
    update   -> metrics, from a StepRecord of all four.

A phase takes the values it reads as arguments, so running one before the phase it needs is a type error where
it is written. Reward of a trajectory: `reward_scale * outcome` (won, or the environment's score) less the
invalid-action penalty, charged on the trajectory or on the penalised turn's own row (`PENALTY_MODES`). The
credit phase is pure tensor math (no model), shared by the trainer and the property tests.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from agentgym_opsd.credit.config import CreditConfig
from agentgym_opsd.credit.grpo import (
    grpo_advantages,
    grpo_turn_penalty_advantages,
    outcome_penalty_advantages,
)
from agentgym_opsd.credit.registry import CreditInputs, CreditResult, estimate, pad_ragged
from agentgym_opsd.records import ChatMessage, Trajectory, invalid_rates, summarize
from agentgym_opsd.trainer.frozen_trunk import TrunkCache
from agentgym_opsd.turns import check_penalize, is_penalised, num_penalised, oracle_progress

__all__ = ["PENALTY_MODES", "BatchAdvantages", "PolicyLogProbs", "StepRecord", "TeacherEvidence", "TurnBatch",
           "TurnRow", "anchor_key", "batch_advantages", "build_turn_batch", "group_success_rates", "trajectory_rewards"]

PromptEncoder = Callable[[list[ChatMessage]], list[int]]


@dataclass
class TurnRow:
    """One turn: the student's prompt ids, the sampled response ids with their sampling log-probs, and the
    per-turn values the credit estimators read (the teacher's prompt is the teacher phase's)."""

    group_id: int
    traj_id: int
    turn_id: int
    prompt_ids: list[int]
    response_ids: list[int]
    sample_logprobs: list[float]
    action_valid: bool
    penalty: float = 0.0  # this row's own invalid-action penalty (penalty_mode "turn" / "outcome"), else 0
    turn_reward: float = 0.0  # reward_scale * the environment's reward for this turn
    turn_penalty: float = 0.0  # the invalid-action penalty of this turn whatever the penalty mode (GiGPO)
    anchor_key: int = 0  # hash of the state the turn acted on (see `anchor_key`)
    oracle_progress: float = math.nan  # the oracle distance the turn closed; NaN where none was reported


@dataclass(frozen=True)
class TurnBatch:
    """One training step's scored batch (the score phase's value): all turn rows plus per-row
    trajectory-level values (1-D tensors, row order). The later phases' values are their own (below);
    the batch is frozen and its rows never change after `build_turn_batch`, so the
    per-row tensors derived from them are built once, on first use (`cached_property` writes the instance's
    `__dict__`, which a frozen dataclass allows)."""

    rows: list[TurnRow]
    success_rate: Tensor  # (rows,) the row's group success rate R̄
    traj_rewards: Tensor  # (trajectories,) reward per trajectory, in trajectory order
    traj_group_ids: Tensor  # (trajectories,)
    traj_index: Tensor  # (rows,) index into the trajectory tensors
    stats: dict[str, float] = field(default_factory=dict)
    penalty_mode: str = "trajectory"

    def __len__(self) -> int:
        return len(self.rows)

    @functools.cached_property
    def prompt_ids(self) -> list[list[int]]:
        return [r.prompt_ids for r in self.rows]

    @functools.cached_property
    def response_ids(self) -> list[list[int]]:
        return [r.response_ids for r in self.rows]

    @functools.cached_property
    def row_penalties(self) -> Tensor:
        """(rows,) each row's own penalty (all zero with penalty_mode="trajectory")."""
        return torch.tensor([r.penalty for r in self.rows], dtype=torch.float64)

    @functools.cached_property
    def group_ids(self) -> Tensor:
        return torch.tensor([r.group_id for r in self.rows], dtype=torch.long)

    @functools.cached_property
    def traj_ids(self) -> Tensor:
        return torch.tensor([r.traj_id for r in self.rows], dtype=torch.long)

    @functools.cached_property
    def turn_ids(self) -> Tensor:
        return torch.tensor([r.turn_id for r in self.rows], dtype=torch.long)

    @functools.cached_property
    def num_response_tokens(self) -> int:
        return sum(len(r.response_ids) for r in self.rows)

    @functools.cached_property
    def turn_rewards(self) -> Tensor:
        """(rows,) each turn's own (scaled) environment reward."""
        return torch.tensor([r.turn_reward for r in self.rows], dtype=torch.float64)

    @functools.cached_property
    def turn_penalties(self) -> Tensor:
        """(rows,) each turn's invalid-action penalty, in either penalty mode."""
        return torch.tensor([r.turn_penalty for r in self.rows], dtype=torch.float64)

    @functools.cached_property
    def anchor_keys(self) -> Tensor:
        """(rows,) int64 hash of the state each turn acted on (GiGPO's anchor state)."""
        return torch.tensor([r.anchor_key for r in self.rows], dtype=torch.long)

    @functools.cached_property
    def oracle_progress(self) -> Tensor:
        """(rows,) the oracle distance each turn closed, NaN where the environment reported none."""
        return torch.tensor([r.oracle_progress for r in self.rows], dtype=torch.float64)


PENALTY_MODES: tuple[str, ...] = ("trajectory", "turn", "outcome")
"""Where the invalid-action penalty goes: the episode reward, the turn's row inside the group statistics
(released code), or the turn's row as a separate push beside an outcome-only advantage (CPU presets)."""

def anchor_key(traj: Trajectory, position: int) -> int:
    """63-bit hash of the state turn `traj.turns[position]` acted on: the observation the previous turn
    produced, or for the first turn the prompt it was given (no history yet: the task and the initial
    observation). Tagged by kind so an observation never equals a first prompt by accident."""
    if position > 0:
        text = "obs\0" + traj.turns[position - 1].observation
    else:
        text = "start\0" + "\0".join(f"{m.get('role', '')}\0{m.get('content', '')}" for m in traj.turns[0].prompt)
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # fits int64


Penalty = float | Sequence[float]
"""The invalid-action penalty: one value for every trajectory, or one per trajectory (in trajectory order)."""


def _per_trajectory(invalid_penalty: Penalty, num_trajectories: int) -> list[float]:
    """The penalty of each trajectory; a per-trajectory sequence must have one value per trajectory."""
    if isinstance(invalid_penalty, (int, float)):
        return [invalid_penalty] * num_trajectories
    values = list(invalid_penalty)
    if len(values) != num_trajectories:
        raise ValueError(f"invalid_penalty: {len(values)} values for {num_trajectories} trajectories")
    return values


def trajectory_rewards(
    trajectories: Sequence[Trajectory], *, reward_scale: float, invalid_penalty: Penalty, penalize: str = "any",
    outcome: str = "won",
) -> Tensor:
    """(trajectories,) `reward_scale * outcome - invalid_penalty * penalised turns` (float64)."""
    penalties = _per_trajectory(invalid_penalty, len(trajectories))
    return torch.tensor(
        [reward_scale * t.outcome(outcome) - p * num_penalised(t.turns, penalize)
         for t, p in zip(trajectories, penalties, strict=True)],
        dtype=torch.float64,
    )


def group_success_rates(
    trajectories: Sequence[Trajectory], *, source: str = "won", reward_scale: float = 1.0, outcome: str = "won"
) -> dict[int, float]:
    """Group id -> R̄: mean outcome (`source="won"`: the fraction won, or the mean score with
    `outcome="score"`) or mean raw reward `reward_scale * outcome` ("reward")."""
    totals: dict[int, list[float]] = {}
    for t in trajectories:
        value = t.outcome(outcome) if source == "won" else reward_scale * t.outcome(outcome)
        totals.setdefault(t.group_id, []).append(value)
    if source not in ("won", "reward"):
        raise ValueError(f"success source must be 'won' or 'reward', got {source!r}")
    return {g: sum(v) / len(v) for g, v in totals.items()}


def build_turn_batch(
    trajectories: Sequence[Trajectory],
    *,
    encode_prompt: PromptEncoder,
    reward_scale: float = 1.0,
    invalid_penalty: Penalty = 0.0,
    success_source: str = "won",
    penalty_mode: str = "trajectory",
    penalize: str = "any",
    outcome: str = "won",
) -> TurnBatch:
    """One row per turn that produced tokens; trajectories keep their order, turns their index.

    `encode_prompt(messages)` must return the exact prompt ids generation used (the HF policy's
    `prompt_ids`). `invalid_penalty`: one value, or one per trajectory (each row gets its trajectory's).
    """
    if penalty_mode not in PENALTY_MODES:
        raise ValueError(f"penalty_mode must be one of {PENALTY_MODES}, got {penalty_mode!r}")
    check_penalize(penalize)
    per_turn = penalty_mode != "trajectory"
    penalties = _per_trajectory(invalid_penalty, len(trajectories))
    rewards = trajectory_rewards(trajectories, reward_scale=reward_scale,
                                 invalid_penalty=0.0 if per_turn else penalties, penalize=penalize, outcome=outcome)
    rates = group_success_rates(trajectories, source=success_source, reward_scale=reward_scale, outcome=outcome)
    rows: list[TurnRow] = []
    row_traj: list[int] = []
    for ti, traj in enumerate(trajectories):
        for position, turn in enumerate(traj.turns):
            if not turn.response_token_ids:
                continue  # nothing was sampled (e.g. a scripted policy or an env failure): nothing to train
            rows.append(TurnRow(
                group_id=traj.group_id,
                traj_id=traj.traj_id,
                turn_id=turn.index,
                prompt_ids=list(encode_prompt(turn.prompt)),
                response_ids=list(turn.response_token_ids),
                sample_logprobs=list(turn.response_logprobs),
                action_valid=turn.action_valid,
                penalty=penalties[ti] if per_turn and is_penalised(turn, penalize) else 0.0,
                turn_reward=reward_scale * float(turn.reward),
                turn_penalty=penalties[ti] if is_penalised(turn, penalize) else 0.0,
                anchor_key=anchor_key(traj, position),
                oracle_progress=math.nan if (progress := oracle_progress(turn)) is None else progress,
            ))
            row_traj.append(ti)
    traj_index = torch.tensor(row_traj, dtype=torch.long)
    n = len(trajectories)
    summary = summarize(trajectories)  # an errored episode counts as a failure, and in env_errors
    stats = {
        "success_rate": summary.success_rate,
        "reward_mean": float(rewards.mean()) if n else 0.0,
        "turns_mean": summary.turns_mean,
        "invalid_action_rate": summary.invalid_action_rate,
        "score_mean": summary.score_mean,
        "env_errors": float(summary.errors),
        "num_rows": float(len(rows)),
        **invalid_rates(trajectories),
    }
    return TurnBatch(
        rows=rows,
        success_rate=torch.tensor([rates[trajectories[i].group_id] for i in row_traj], dtype=torch.float64),
        traj_rewards=rewards,
        traj_group_ids=torch.tensor([t.group_id for t in trajectories], dtype=torch.long),
        traj_index=traj_index,
        stats=stats,
        penalty_mode=penalty_mode,
    )


# ---- the later phases' values, and the credit phase ------------------------------------------------------

@dataclass(frozen=True)
class PolicyLogProbs:
    """Per row, the log-prob of each response token under π_old (the rollout policy) and under the KL
    reference (None when the KL term is off). `from_sampler`: π_old is the sampler's own numbers (no
    recomputation), so there is no sampler/trainer mismatch left to correct (`trainer/tis.py`)."""

    old: list[Tensor]
    reference: list[Tensor] | None = None
    from_sampler: bool = False
    trunk: TrunkCache | None = None  # the π_old pass's frozen-trunk outputs, for the update (`trainer/frozen_trunk.py`)


@dataclass(frozen=True)
class TeacherEvidence:
    """Per row, the teacher's log-prob of each response token (under the prompt with `c+`; the student's own
    where a row has no teacher prompt), the gaps teacher − student, e_k (rows,), and per row the evidence
    form e_k was computed with (`teacher.evidence`, or "paper" where a row fell back; None: all "paper").
    `judged` is False where no teacher ran (`none`): its zeros are not evidence and are not recorded as such."""

    teacher: list[Tensor]
    gaps: list[Tensor]
    evidence: Tensor
    forms: tuple[str, ...] | None = None
    judged: bool = True
    teacher_rows: int = 0  # rows whose teacher prompt differed from the student's (the rest have e_k = 0)

    @classmethod
    def none(cls, student: list[Tensor]) -> TeacherEvidence:
        """No teacher pass (GRPO reads no evidence): the teacher is the student, every gap and e_k exactly 0."""
        return cls(list(student), [torch.zeros_like(s) for s in student],
                   torch.zeros(len(student), dtype=torch.float64), judged=False)


@dataclass(frozen=True)
class StepRecord:
    """Everything one step computed on its turn rows, for its metrics and its saved credit file."""

    batch: TurnBatch
    logprobs: PolicyLogProbs
    evidence: TeacherEvidence
    credit: BatchAdvantages

    @property
    def token_advantages(self) -> Tensor:
        """Every response token's advantage, rows concatenated."""
        return self.credit.token_values


# ---- the credit phase --------------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchAdvantages:
    """The credit phase's value. `tokens`: one 1-D tensor per row, the advantage of each response token
    (penalty term included); `seq`: (trajectories,) A_seq; `penalty`: (rows,) the penalty term added after
    the estimator; `result`: the estimator's output (None for an empty batch)."""

    tokens: list[Tensor]
    seq: Tensor
    penalty: Tensor
    result: CreditResult | None

    @property
    def token_values(self) -> Tensor:
        """Every response token's advantage, rows concatenated (what the update's tokens are weighted by)."""
        return torch.cat([a.flatten() for a in self.tokens]) if self.tokens else torch.zeros(0)


def batch_advantages(
    batch: TurnBatch,
    evidence: Tensor,
    gaps: list[Tensor],
    *,
    estimator: str,
    config: CreditConfig,
    cross_steps: bool = False,
    normalize_std: bool = True,
    penalised_turns_gain: bool = False,
    return_details: bool = False,
) -> BatchAdvantages:
    """Advantages of every row of `batch` (`evidence` (rows,) e_k, `gaps` per-row token gaps).

    `penalty_mode` of the batch: "trajectory" (the penalty is inside each trajectory's reward), "turn" (the
    released code: row score R − p normalised by the group's statistics, split into A_seq and a row term,
    `credit.grpo_turn_penalty_advantages`), "outcome" (A_seq from outcomes alone and −p on the invalid row,
    `credit.outcome_penalty_advantages`). The estimator reshapes A_seq; the row term is added after it.

    In "outcome" mode a penalised turn never gains (unless `penalised_turns_gain`): its row is min(Ã_k, 0) − p.
    An invalid action changes nothing in the environment, so a won rollout's outcome is none of its doing; left
    positive, a win carried its invalid turns up with it (ALFWorld `cpu-small`, seed 0: 21 of 56 invalid turns,
    among them made-up receptacles, were pushed up, and held-out invalid actions rose from 18% to 33%).
    """
    eps = config.eps
    if batch.penalty_mode == "turn":
        seq, penalty = grpo_turn_penalty_advantages(
            batch.traj_rewards, batch.traj_group_ids, batch.traj_index, batch.row_penalties,
            cross_steps=cross_steps, eps=eps, normalize_std=normalize_std)
    elif batch.penalty_mode == "outcome":
        seq, penalty = outcome_penalty_advantages(
            batch.traj_rewards, batch.traj_group_ids, batch.row_penalties, eps=eps, normalize_std=normalize_std)
    else:
        seq = grpo_advantages(batch.traj_rewards, batch.traj_group_ids, eps=eps, normalize_std=normalize_std)
        penalty = torch.zeros(len(batch.rows), dtype=torch.float64)
    if not batch.rows:
        return BatchAdvantages([], seq, penalty, None)
    gap_grid, mask = pad_ragged(gaps, torch.float64)
    inputs = CreditInputs(
        seq[batch.traj_index], batch.traj_ids, batch.turn_ids, batch.success_rate, evidence=evidence,
        token_gaps=gap_grid, token_mask=mask, group_ids=batch.group_ids, anchor_keys=batch.anchor_keys,
        turn_rewards=batch.turn_rewards, oracle_progress=batch.oracle_progress,
        # outcome mode: the penalty is the separate row push only, never part of GiGPO's step returns
        turn_penalties=None if batch.penalty_mode == "outcome" else batch.turn_penalties)
    result = estimate(estimator, inputs, config, return_details=return_details)
    row_max = None
    if batch.penalty_mode == "outcome" and not penalised_turns_gain:
        row_max = torch.where(batch.row_penalties > 0, 0.0, math.inf).to(torch.float64)
    tokens = result.token_advantages(mask, row_offset=penalty, row_max=row_max, dtype=torch.float32)
    return BatchAdvantages(tokens, seq, penalty, result)
