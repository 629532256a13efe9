"""The values one RL step's phases hand each other, each made once by its phase and never changed.

    collect  -> list[Trajectory]
    score    -> TurnBatch          (turn_batch.py: the rows, rewards and group success rates)
    logprobs -> PolicyLogProbs     (π_old of every response token; the KL reference's)
    teacher  -> TeacherEvidence    (the same responses under the privileged prompt; gaps; e_k per row)
    credit   -> BatchAdvantages    (`batch_advantages` below: A_seq, the penalty bookkeeping of `penalty_mode`, the
                                   registered estimator, the per-token advantages the update reads)
    update   -> metrics
    the step's files and metrics read a StepRecord of all four.

A phase takes the values it reads as arguments, so running one before the phase it needs is a type error
where it is written, not an assert at run time. The credit phase is pure tensor math on a `TurnBatch` (no model),
so the trainer and the property tests (`tests/test_never_reward_failure.py`) run the very same composition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from agentgym_opsd.credit.config import CreditConfig
from agentgym_opsd.credit.grpo import (
    grpo_advantages,
    grpo_turn_penalty_advantages,
    outcome_penalty_advantages,
)
from agentgym_opsd.credit.registry import CreditInputs, CreditResult, estimate, pad_ragged
from agentgym_opsd.trainer.frozen_trunk import TrunkCache
from agentgym_opsd.trainer.turn_batch import TurnBatch

__all__ = ["BatchAdvantages", "PolicyLogProbs", "StepRecord", "TeacherEvidence", "batch_advantages"]


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
