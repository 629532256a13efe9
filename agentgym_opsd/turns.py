"""The per-turn rule: what one reply and the environment's answer to it make of a `Turn`.

Every path that plays an episode (our rollout, the OpenEnv session; the TRL adapter plays through the rollout)
records its turns with `record_turn`, feeds the prompt history with `history_item` and charges the
invalid-action penalty by `is_penalised`, so an episode played through any of them is the episode the trainer
would have recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentgym_opsd import core
from agentgym_opsd.parsers import ParsedAction
from agentgym_opsd.prompts import HistoryItem
from agentgym_opsd.records import INVALID_KINDS, ChatMessage, Turn, classify_invalid

__all__ = ["ORACLE_AFTER", "ORACLE_BEFORE", "PENALISED_KINDS", "PROGRESS", "REFUSED", "WASTED", "check_penalize",
           "history_item", "is_penalised", "num_penalised", "oracle_progress", "record_turn", "turn_progress"]

ORACLE_BEFORE, ORACLE_AFTER = "oracle_distance_before", "oracle_distance_after"
"""The `Turn.info` keys of the oracle's distance to the goal before and after the turn's action."""
PROGRESS, WASTED = "progress", "wasted"
"""`turn_progress`'s labels."""
REFUSED = "the environment refused the action"
"""The `invalid_reason` of a parsed action the environment did not accept."""
PENALISED_KINDS = {"any": frozenset(INVALID_KINDS), "format": frozenset({"no_tag", "truncated"})}
"""Which invalid turns the penalty applies to (`algorithm.penalize`): every kind, or only replies without a
parsable action (the released code lets a well-formed but inadmissible action waste its turn unpunished)."""
HISTORY_REPLY_CHARS = 200
"""How much of a reply without an action the history shows in the action's place."""


def record_turn(
    *,
    index: int,
    prompt: list[ChatMessage],
    text: str,
    parsed: ParsedAction,
    observation: str,
    reward: float,
    info: dict[str, Any],
    error: str | None = None,
    finish_reason: str | None = None,
    token_ids: Sequence[int] = (),
    logprobs: Sequence[float] = (),
    admissible_actions: Sequence[str] | None = None,
    distance_before: int | None = None,
) -> Turn:
    """The turn of reply `text` (parsed to `parsed`) given `prompt`, answered by the environment with
    `observation`, `reward` and `info` (`error`: the step failed). It is valid when the reply parsed, the
    environment accepted the action and the step did not fail; `admissible_actions` are the choices the turn
    had, `distance_before` the oracle's distance before it (recorded when the environment reports one after)."""
    accepted = bool(info.get(core.ACTION_VALID, True)) and error is None
    reason = error or (parsed.reason if not parsed.valid else (None if accepted else REFUSED))
    turn = Turn(index=index, prompt=prompt, response_text=text, action=parsed.action,
                action_valid=parsed.valid and accepted, observation=observation, reward=reward,
                response_token_ids=list(token_ids), response_logprobs=[float(x) for x in logprobs],
                invalid_reason=reason, info={k: info[k] for k in (core.SCORE, core.WON) if k in info})
    if finish_reason is not None:
        turn.info["finish_reason"] = finish_reason
    kind = classify_invalid(parsed=parsed.valid, accepted=accepted, finish_reason=finish_reason)
    if kind is not None:
        turn.info["invalid_kind"] = kind
    if admissible_actions is not None:  # the choices this turn had (the choice-level teacher scores them)
        turn.info[core.ADMISSIBLE_ACTIONS] = list(admissible_actions)
    if core.ORACLE_DISTANCE in info:
        turn.info[ORACLE_BEFORE] = distance_before
        turn.info[ORACLE_AFTER] = info[core.ORACLE_DISTANCE]
    return turn


def history_item(turn: Turn, seen: str) -> HistoryItem:
    """The history entry of `turn`: the observation `seen` before it, paired with the action taken there (or
    the start of the reply when it had none). The observation the action produced is the next prompt's
    current observation, shown once, not twice."""
    return HistoryItem(turn.action or turn.response_text[:HISTORY_REPLY_CHARS], seen)


def check_penalize(penalize: Any, name: str = "penalize") -> str:
    """`penalize` when it is a `PENALISED_KINDS` key, else a ValueError naming `name` (the setting)."""
    if penalize not in PENALISED_KINDS:
        raise ValueError(f"{name} must be one of {sorted(PENALISED_KINDS)}, got {penalize!r}")
    return str(penalize)


def is_penalised(turn: Turn, penalize: str = "any") -> bool:
    """Whether the invalid-action penalty applies to this turn (`penalize`: a `PENALISED_KINDS` key)."""
    kind = turn.invalid_kind
    return kind is not None and kind in PENALISED_KINDS[check_penalize(penalize)]


def num_penalised(turns: Sequence[Turn], penalize: str = "any") -> int:
    """How many of `turns` the invalid-action penalty applies to: an episode's penalty is this many times the
    profile's, wherever it is charged (the trainer's reward, the OpenEnv session, the TRL adapters)."""
    return sum(is_penalised(turn, penalize) for turn in turns)


def oracle_progress(turn: Turn) -> float | None:
    """The oracle distance `turn` closed (d_before − d_after: positive towards the goal, 0 for a wasted turn,
    negative away from it), None when the environment reported no distance before or after it."""
    before, after = turn.info.get(ORACLE_BEFORE), turn.info.get(ORACLE_AFTER)
    return None if before is None or after is None else float(before - after)


def turn_progress(turn: Turn) -> str | None:
    """Whether a turn made progress: PROGRESS when it was a valid action after which the oracle's recorded
    distance dropped, WASTED otherwise (invalid, no drop, or no distance after it), None when the environment
    reported no distance before it. The inspector and the credit-quality measurement both use it."""
    if turn.info.get(ORACLE_BEFORE) is None:
        return None
    before, after = turn.info[ORACLE_BEFORE], turn.info.get(ORACLE_AFTER)
    return PROGRESS if turn.action_valid and after is not None and after < before else WASTED
