"""Evidence forms: how the self-teacher's judgement of one turn becomes the number e_k the belief reads.

The paper's evidence sums the teacher − student log-prob gap over the exact tokens the student wrote:

    paper   e_k = Σ_t [log π(y_t | c+, s) − log π(y_t | s)]

A teacher that knows more would often have *worded* a good move differently, so the sum also scores
phrasing; on ALFWorld it credited the turns that made progress little better than chance (credit AUC 0.69 in
won / 0.51 in lost trajectories, docs/method.md). The variants here change only what is compared:

    mean    e_k = (1/T) Σ_t gap_t                      the same gap per token: long replies no longer dominate
    args    e_k = Σ_(t ∈ argument) gap_t               only the action's argument tokens (the command, the
                                                       clicked name, the query), no tags or thought
    choice  e_k = log p_T(a | A) − log p_S(a | A)      the chosen action a among the turn's choices A, each
                                                       choice scored as the sequence log-prob ℓ(c) of its
                                                       rendered text under either prompt and normalised over
                                                       the set: p(a | A) = softmax_(c ∈ A) ℓ(c) at a

`choice` judges the decision, not the wording: it asks whether the informed teacher prefers the action the
student chose over the alternatives more than the student did. ``choice_norm`` says what ℓ(c) is: the sum of
the choice's token log-probs (the probability of writing that exact text, so the set's softmax is the model's
own conditional choice distribution) or their mean (a per-token score, blind to the choice's length).

Where a form has nothing to read — no choice set (free-text search queries, environments without an action
list), a chosen action outside the set (invalid turns), no parsable argument — the row falls back to the
paper's sum, and `EvidenceResult.forms` records which form each row got. The model passes that produce the
inputs live in the trainer (`trainer/teacher_evidence.py`); this module is the arithmetic only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

__all__ = ["CHOICE_NORMS", "EVIDENCE_FORMS", "ChoiceScores", "EvidenceForm", "EvidenceInputs", "EvidenceResult",
           "choice_evidence", "choice_log_probs", "compute_evidence", "evidence_form", "form_counts"]

CHOICE_NORMS: tuple[str, ...] = ("sum", "mean")
"""How a choice's token log-probs become its score ℓ(c) before the softmax over the set."""


@dataclass(frozen=True)
class ChoiceScores:
    """One turn's scored choice set: ``teacher`` and ``student`` (choices,) sequence log-probs Σ_t log π of
    each choice's rendered text under the teacher's and the student's prompt, ``lengths`` (choices,) its
    token count, ``chosen`` the index of the action the student took."""

    teacher: Tensor
    student: Tensor
    lengths: Tensor
    chosen: int

    def __post_init__(self) -> None:
        n = self.teacher.numel()
        if self.student.numel() != n or self.lengths.numel() != n:
            raise ValueError(f"teacher, student and lengths need one entry per choice, got "
                             f"{n}, {self.student.numel()}, {self.lengths.numel()}")
        if not 0 <= self.chosen < n:
            raise ValueError(f"chosen={self.chosen} is not the index of one of the {n} choices")
        if bool((self.lengths <= 0).any()):
            raise ValueError("every choice needs at least one token")


def choice_log_probs(scores: Tensor, lengths: Tensor, norm: str = "sum") -> Tensor:
    """(choices,) log p(c | A): the log-softmax over the set of each choice's score — its summed token
    log-prob (``norm="sum"``) or that sum over its token count (``"mean"``)."""
    if norm not in CHOICE_NORMS:
        raise ValueError(f"choice norm: expected one of {CHOICE_NORMS}, got {norm!r}")
    scores = scores.to(torch.float64)
    if norm == "mean":
        scores = scores / lengths.to(torch.float64)
    return torch.log_softmax(scores, dim=0)


def choice_evidence(choice: ChoiceScores, norm: str = "sum") -> float:
    """e_k = log p_teacher(chosen | A) − log p_student(chosen | A) (0 for a set of one: no decision)."""
    teacher = choice_log_probs(choice.teacher, choice.lengths, norm)
    student = choice_log_probs(choice.student, choice.lengths, norm)
    return float(teacher[choice.chosen] - student[choice.chosen])


@dataclass(frozen=True)
class EvidenceInputs:
    """What the forms read, one entry per turn row: ``gaps`` (tokens,) teacher − student log-prob of each
    response token; ``argument_masks`` (tokens,) bool, the tokens of the action's argument (None for a row
    without one); ``choices`` the row's scored choice set (None where it has none)."""

    gaps: Sequence[Tensor]
    argument_masks: Sequence[Tensor | None] | None = None
    choices: Sequence[ChoiceScores | None] | None = None


@dataclass(frozen=True)
class EvidenceResult:
    """``evidence`` (rows,) float64 e_k, and per row the form it was computed with (the requested one, or
    ``"paper"`` where the row fell back)."""

    evidence: Tensor
    forms: tuple[str, ...]


RowEvidence = Callable[[EvidenceInputs, int, str], "float | None"]
"""(inputs, row, choice_norm) -> e_k of that row, or None when the form cannot judge it (paper fallback)."""


@dataclass(frozen=True)
class EvidenceForm:
    """A registered evidence form: its per-row rule and what it needs, so callers compute only that (the
    choice passes cost model time, argument masks a tokenizer)."""

    name: str
    row: RowEvidence
    needs_choices: bool = False
    needs_arguments: bool = False
    summary: str = ""


def _paper(inputs: EvidenceInputs, row: int, norm: str) -> float:
    return float(inputs.gaps[row].sum())


def _mean(inputs: EvidenceInputs, row: int, norm: str) -> float | None:
    gap = inputs.gaps[row]
    return float(gap.double().mean()) if gap.numel() else None


def _args(inputs: EvidenceInputs, row: int, norm: str) -> float | None:
    mask = inputs.argument_masks[row] if inputs.argument_masks is not None else None
    if mask is None or not bool(mask.any()):
        return None
    gap = inputs.gaps[row]
    if mask.shape != gap.shape:
        raise ValueError(f"row {row}: argument mask of shape {tuple(mask.shape)} for {tuple(gap.shape)} gaps")
    return float(gap.double()[mask.bool()].sum())


def _choice(inputs: EvidenceInputs, row: int, norm: str) -> float | None:
    choice = inputs.choices[row] if inputs.choices is not None else None
    return choice_evidence(choice, norm) if choice is not None else None


_FORMS: dict[str, EvidenceForm] = {
    "paper": EvidenceForm("paper", _paper, summary="Σ_t gap_t over the response tokens (the paper)"),
    "choice": EvidenceForm("choice", _choice, needs_choices=True,
                           summary="log p_T(a | A) − log p_S(a | A) over the turn's choice set"),
    "mean": EvidenceForm("mean", _mean, summary="the mean gap per response token"),
    "args": EvidenceForm("args", _args, needs_arguments=True, summary="Σ gap over the action's argument tokens"),
}
EVIDENCE_FORMS_BY_NAME: Mapping[str, EvidenceForm] = MappingProxyType(_FORMS)
EVIDENCE_FORMS: tuple[str, ...] = tuple(_FORMS)
"""The evidence forms, the paper's first (the default)."""


def evidence_form(name: str) -> EvidenceForm:
    """The registered form ``name``; ValueError listing the known forms otherwise."""
    try:
        return _FORMS[name]
    except KeyError:
        raise ValueError(f"unknown evidence form {name!r}; known: {EVIDENCE_FORMS}") from None


def compute_evidence(form: str, inputs: EvidenceInputs, *, choice_norm: str = "sum") -> EvidenceResult:
    """e_k of every row in ``form``; a row the form cannot judge gets the paper's sum (recorded in
    ``forms``)."""
    spec = evidence_form(form)
    if choice_norm not in CHOICE_NORMS:
        raise ValueError(f"choice norm: expected one of {CHOICE_NORMS}, got {choice_norm!r}")
    for name, given, needed in (("choices", inputs.choices, spec.needs_choices),
                                ("argument_masks", inputs.argument_masks, spec.needs_arguments)):
        if needed and given is not None and len(given) != len(inputs.gaps):
            raise ValueError(f"{name}: {len(given)} entries for {len(inputs.gaps)} rows")
    values: list[float] = []
    forms: list[str] = []
    for row in range(len(inputs.gaps)):
        value = spec.row(inputs, row, choice_norm)
        if value is None:
            value, used = _paper(inputs, row, choice_norm), "paper"
        else:
            used = spec.name
        values.append(value)
        forms.append(used)
    return EvidenceResult(torch.tensor(values, dtype=torch.float64), tuple(forms))


def form_counts(forms: Sequence[str] | None) -> dict[str, float]:
    """`teacher/<form>_rows`: how many rows got each evidence form (every form listed, so the keys are the
    same each step; under `choice`, `teacher/paper_rows` counts the rows that fell back). Empty for None."""
    if forms is None:
        return {}
    return {f"teacher/{name}_rows": float(sum(f == name for f in forms)) for name in EVIDENCE_FORMS}
