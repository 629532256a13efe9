"""The values one RL step's phases hand each other, each made once by its phase and never changed.

    collect  -> list[Trajectory]
    score    -> TurnBatch          (turn_batch.py: the rows, rewards and group success rates)
    logprobs -> PolicyLogProbs     (π_old of every response token; the KL reference's)
    teacher  -> TeacherEvidence    (the same responses under the privileged prompt; gaps; e_k per row)
    credit   -> BatchAdvantages    (advantages.py: per-token advantages, A_seq, the estimator's output)
    update   -> metrics
    the step's files and metrics read a StepRecord of all four.

A phase takes the values it reads as arguments, so running one before the phase it needs is a type error
where it is written, not an assert at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agentgym_opsd.trainer.advantages import BatchAdvantages
from agentgym_opsd.trainer.frozen_trunk import TrunkCache
from agentgym_opsd.trainer.turn_batch import TurnBatch

__all__ = ["PolicyLogProbs", "StepRecord", "TeacherEvidence"]


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
