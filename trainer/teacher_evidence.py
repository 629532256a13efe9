"""The teacher phase, prompt to e_k: each turn's privileged prompt (its environment's `teacher_messages`, the
student's prompt with `c+`), the same responses under it on the trained model, and the evidence they give in the
configured form (`teacher.evidence`; the arithmetic of each form is `agentgym_opsd.credit.agentopsd`). What the
forms read:

- argument masks (`args`): which response tokens spell the action's argument — the parser's `span` of the
  argument in the decoded response, mapped onto the tokens that overlap it;
- choice sets (`choice`): the actions the turn could have taken (`Turn.info["admissible_actions"]`, recorded
  by the rollout), each rendered as the model writes an action (`parser.format`), and which one was taken;
  then every choice's sequence log-prob under the student's and the teacher's prompt
  (`trainer/choice_logprobs.py`: each prompt once, the choices as continuations of its KV cache).

A choice that is a free-text template (WebShop's `search[<your query>]`) is scored as the text up to its
placeholder, `<action>search[`: the probability of writing *some* search, summed over every query — the
probability of that choice whatever is typed. A turn whose action is free text (a search, Search-QA's
queries and answers) or not among its choices (an invalid turn) has no choice to judge and falls back to
the paper's sum; `TeacherEvidence.forms` records which form each row got.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentgym_opsd.core import ADMISSIBLE_ACTIONS
from agentgym_opsd.credit.agentopsd import (
    ChoiceScores,
    EvidenceInputs,
    compute_evidence,
    evidence_form,
)
from agentgym_opsd.models.hf_policy import text_ids
from agentgym_opsd.parsers import ActionParser
from agentgym_opsd.records import ChatMessage, Trajectory, Turn
from agentgym_opsd.trainer.choice_logprobs import ChoicePass, score_continuations
from agentgym_opsd.trainer.logprobs import TrainedModel
from agentgym_opsd.trainer.turn_batch import TeacherEvidence, TurnBatch

__all__ = ["ChoiceSet", "EvidenceMaker", "argument_token_mask", "row_turns", "turn_choice_set"]

_PLACEHOLDER = re.compile(r"<[a-z][a-z ]*>")
"""A free-text slot in an admissible action (`search[<your query>]`): the agent writes its own text there."""

@dataclass(frozen=True)
class ChoiceSet:
    """A turn's choices as the model would write them (`texts`) and the index of the one it took."""

    texts: tuple[str, ...]
    chosen: int


def _action_key(action: str) -> str:
    return " ".join(action.split()).lower()  # the environments match actions stripped and lower-cased


def _rendered(action: str, parser: ActionParser) -> tuple[str, bool]:
    """(the model's text of `action`, whether it is only the prefix before a free-text placeholder)."""
    text = parser.format(action)
    slot = _PLACEHOLDER.search(action)
    at = text.find(action)
    if slot is None or at < 0:
        return text, False
    return text[:at + slot.start()], True


def turn_choice_set(turn: Turn, parser: ActionParser) -> ChoiceSet | None:
    """The turn's choice set, or None when there is no choice to judge: no recorded admissible actions, an
    invalid turn, or an action that is free text (a search query) or outside the set."""
    admissible = turn.info.get(ADMISSIBLE_ACTIONS)
    if not turn.action_valid or not admissible:
        return None
    chosen_key = _action_key(turn.action)
    texts: list[str] = []
    chosen: int | None = None
    for action in dict.fromkeys(str(a) for a in admissible):  # duplicates would count one choice twice
        text, is_template = _rendered(action, parser)
        if not is_template and chosen is None and _action_key(action) == chosen_key:
            chosen = len(texts)
        texts.append(text)
    return None if chosen is None else ChoiceSet(tuple(texts), chosen)


def _token_ends(tokenizer: Any, ids: Sequence[int]) -> tuple[str, list[int]]:
    """The decoded text of `ids` and, per token, where its text ends in it (decoding growing prefixes: a
    token's characters are what it adds; a split multi-byte character lands on its last token)."""
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    ends, last = [], 0
    for i in range(1, len(ids) + 1):
        last = max(last, min(len(tokenizer.decode(list(ids[:i]), skip_special_tokens=False)), len(text)))
        ends.append(last)
    return text, ends


def argument_token_mask(tokenizer: Any, parser: ActionParser, response_ids: Sequence[int]) -> Tensor | None:
    """(tokens,) bool: the response tokens that overlap the action's argument (tags, verbs, brackets and any
    thought left out); None when the response parses to no action with a span."""
    text, ends = _token_ends(tokenizer, response_ids)
    parsed = parser.parse(text)
    if not parsed.valid or parsed.span is None:
        return None
    start, end = parsed.span
    starts = [0, *ends[:-1]]
    mask = torch.tensor([s < end and e > start for s, e in zip(starts, ends, strict=True)], dtype=torch.bool)
    return mask if bool(mask.any()) else None


def row_turns(batch: TurnBatch, trajectories: Sequence[Trajectory]) -> list[tuple[Trajectory, Turn]]:
    """The trajectory and turn of each row (a row's `turn_id` is its turn's index in the trajectory)."""
    by_id = {t.traj_id: t for t in trajectories}
    out = []
    for row in batch.rows:
        traj = by_id.get(row.traj_id)
        if traj is None or not 0 <= row.turn_id < len(traj.turns):
            raise ValueError(f"row (traj {row.traj_id}, turn {row.turn_id}) has no turn in the trajectories given")
        out.append((traj, traj.turns[row.turn_id]))
    return out


TeacherMessages = Callable[[Trajectory, Turn], list[ChatMessage]]
"""(trajectory, turn) -> the turn's privileged prompt (the environment runner's `teacher_messages`)."""


@dataclass
class EvidenceMaker:
    """The teacher phase of one run: e_k of every row in `form` (`EVIDENCE_FORMS`), by the teacher passes on
    `model` (the trained one; `shared_prefix`: the teacher prompts' common c+ prefix is encoded once).
    `teacher_messages` builds a turn's privileged prompt, `parser_of` is the action parser of a trajectory's
    environment; `choice_norm` how a choice's token log-probs make its score (`CHOICE_NORMS`)."""

    form: str
    model: TrainedModel
    teacher_messages: TeacherMessages
    parser_of: Callable[[Trajectory], ActionParser]
    choice_norm: str = "sum"
    shared_prefix: bool = False

    def __call__(self, batch: TurnBatch, trajectories: Sequence[Trajectory], student: list[Tensor]) -> TeacherEvidence:
        """The rows' evidence in this form. The choice form scores each judged turn's sampled reply on the
        teacher's choice-pass cache too, so the teacher pass runs only the rows the choice pass did not cover."""
        spec = evidence_form(self.form)
        turns = row_turns(batch, trajectories)
        prompts = self.teacher_prompts(turns)
        masks: list[Tensor | None] | None = None
        choices: list[ChoiceScores | None] | None = None
        folded: dict[int, Tensor] = {}
        if spec.needs_arguments:
            masks = [argument_token_mask(self.model.tokenizer, self.parser_of(traj), row.response_ids)
                     for row, (traj, _) in zip(batch.rows, turns, strict=True)]
        if spec.needs_choices:
            choices, folded = self._choice_pass(batch, turns, prompts, fold_replies=True)
        teacher = self.teacher_logprobs(batch, prompts, student, folded)
        gaps = [t - s for t, s in zip(teacher, student, strict=True)]
        result = compute_evidence(self.form, EvidenceInputs(gaps, masks, choices), choice_norm=self.choice_norm)
        return TeacherEvidence(teacher, gaps, result.evidence, result.forms,
                               teacher_rows=sum(p is not None for p in prompts))

    def row_prompts(self, batch: TurnBatch, trajectories: Sequence[Trajectory]) -> list[list[int] | None]:
        """Each row's teacher prompt ids (`teacher_prompts` of the rows' turns)."""
        return self.teacher_prompts(row_turns(batch, trajectories))

    def teacher_prompts(self, turns: Sequence[tuple[Trajectory, Turn]]) -> list[list[int] | None]:
        """Each row's privileged prompt ids, None where it equals the student's prompt (no skill text, no hint):
        that row is its own teacher and its evidence is exactly 0."""
        out: list[list[int] | None] = []
        for traj, turn in turns:
            messages = self.teacher_messages(traj, turn)
            out.append(None if messages == turn.prompt else list(self.model.encode(messages)))
        return out

    def teacher_logprobs(self, batch: TurnBatch, prompts: Sequence[list[int] | None], student: list[Tensor],
                         given: dict[int, Tensor] | None = None) -> list[Tensor]:
        """The paper's teacher pass: every row's response teacher-forced under its c+ prompt `prompts[row]` (no
        grad). Rows without one reuse the student's log-probs (gap 0); rows in `given` (scored by the choice pass
        on its own cache) are not run again."""
        given = given or {}
        idx = [i for i, p in enumerate(prompts) if p is not None and i not in given]
        out = list(student)
        for i, t in given.items():
            out[i] = t
        if idx:
            got = self.model.logprobs([list(prompts[i] or []) for i in idx], [batch.rows[i].response_ids for i in idx],
                                      shared_prefix=self.shared_prefix)
            for i, t in zip(idx, got, strict=True):
                out[i] = t
        return out

    def choice_scores(self, batch: TurnBatch, turns: Sequence[tuple[Trajectory, Turn]]) -> list[ChoiceScores | None]:
        """Per row, its choices scored under the student's and the teacher's prompt (None: no choice set)."""
        return self._choice_pass(batch, turns, self.teacher_prompts(turns), fold_replies=False)[0]

    def _choice_pass(self, batch: TurnBatch, turns: Sequence[tuple[Trajectory, Turn]],
                     prompts: Sequence[list[int] | None], *, fold_replies: bool,
                     ) -> tuple[list[ChoiceScores | None], dict[int, Tensor]]:
        """The rows' choice scores and, with `fold_replies`, the teacher's per-token log-probs of each judged
        row's reply (row -> tensor). One scorer call per side, so each side's prompts share their own prefix
        (the teacher's holds the skill block); a row without a teacher prompt (no c+) is its own teacher:
        evidence 0."""
        sets = [turn_choice_set(turn, self.parser_of(traj)) for traj, turn in turns]
        ids = {i: [text_ids(self.model.tokenizer, text) for text in s.texts] for i, s in enumerate(sets) if s is not None}
        judged = [i for i in ids if prompts[i] is not None]
        replies = [list(batch.rows[i].response_ids) or None for i in judged] if fold_replies else None
        student = self._score([batch.rows[i].prompt_ids for i in ids], [ids[i] for i in ids], None)
        teacher = self._score([prompts[i] or [] for i in judged], [ids[i] for i in judged],
                              replies)
        by_row = dict(zip(ids, student.choices, strict=True))
        teacher_by_row = dict(zip(judged, teacher.choices, strict=True))
        folded = {i: r for i, r in zip(judged, teacher.replies, strict=True) if r is not None}
        out: list[ChoiceScores | None] = []
        for i, choice_set in enumerate(sets):
            if choice_set is None:
                out.append(None)
                continue
            lengths = torch.tensor([len(c) for c in ids[i]], dtype=torch.long)
            out.append(ChoiceScores(teacher_by_row.get(i, by_row[i]), by_row[i], lengths, choice_set.chosen))
        return out, folded

    def _score(self, prompts: list[list[int]], choices: list[list[list[int]]],
               replies: list[list[int] | None] | None) -> ChoicePass:
        if not prompts:
            return ChoicePass([], [])
        m = self.model  # each choice at the rollout temperature, as the teacher pass scores the reply
        return score_continuations(m.model, [list(p) for p in prompts], choices, replies, temperature=m.temperature,
                                   max_tokens=m.micro_batch_tokens, device=m.device)
