"""Turn and trajectory records: what the turn API hands to the trainer and the evaluator.

One `Turn` is one exchange: the prompt the policy saw, what it answered (text, token ids, log-probs), the
action parsed from it, and what the environment replied. A `Trajectory` is one episode of turns plus the
task metadata and the privileged skill context `c+` the self-teacher conditions on.

Records serialise to JSON lines (one trajectory per line) and load back equal (`==`), so rollouts can be
stored, inspected and replayed. Reading checks every line (`read_json_lines`, `check_fields`): a bad line is a
ValueError naming the file, the line and the field, never a traceback from deeper down.
"""

from __future__ import annotations

import json
import math
import os
import re
import reprlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from agentgym_opsd.files import atomic_write_lines, to_json
from agentgym_opsd.strict_json import loads_strict

__all__ = ["OUTCOMES", "Turn", "Trajectory", "save_jsonl", "load_jsonl", "append_jsonl", "INVALID_KINDS", "classify_invalid",
           "groups_of", "invalid_rates", "check_fields", "require_fields", "read_json_lines", "NUMBER_OR_NULL", "EpisodeSummary",
           "summarize"]

INVALID_KINDS = ("no_tag", "not_admissible", "truncated")
"""Why a turn was invalid: no parsable action in a reply that ended by itself (`no_tag`), a parsed action
the environment refused or failed on (`not_admissible`), a reply cut at `max_new_tokens` before its action
was complete (`truncated`)."""


def classify_invalid(*, parsed: bool, accepted: bool, finish_reason: str | None) -> str | None:
    """The `INVALID_KINDS` entry of a turn, or None when the action was valid."""
    if parsed and accepted:
        return None
    if parsed:
        return "not_admissible"
    return "truncated" if finish_reason == "length" else "no_tag"

ChatMessage = dict[str, str]


@dataclass
class Turn:
    """One agent turn.

    `prompt` is the chat the policy was given (system / user messages); `response_token_ids` are exactly the
    tokens that were sampled (never re-tokenised text), with their sampling log-probs in `response_logprobs`.
    `action` is what was sent to the environment; `action_valid` is False when the text parsed to no action
    or the environment refused it. `observation` is the environment's answer to the action.
    """

    index: int
    prompt: list[ChatMessage]
    response_text: str
    action: str
    action_valid: bool
    observation: str
    reward: float
    response_token_ids: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    invalid_reason: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Every invalid turn carries its kind: `turns.record_turn` records it; a turn made without one (a record
        # written before kinds were recorded, read once here, or a hand-made turn) gets it from its action and
        # finish reason, the rule record_turn applies.
        if not self.action_valid and self.info.get("invalid_kind") not in INVALID_KINDS:
            self.info = {**self.info, "invalid_kind": self._kind_from_action()}

    def _kind_from_action(self) -> str:
        return str(classify_invalid(parsed=bool(self.action), accepted=False,
                                    finish_reason=self.info.get("finish_reason")))

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_token_ids)

    @property
    def invalid_kind(self) -> str | None:
        """The `INVALID_KINDS` entry of an invalid turn, None for a valid one."""
        return None if self.action_valid else str(self.info["invalid_kind"])  # recorded at construction


OUTCOMES: Final = ("won", "score")
"""What a trajectory's outcome reward is made of (`Trajectory.outcome`, `env.outcome`)."""


@dataclass
class Trajectory:
    """One episode.

    `group_id` ties the G rollouts of the same task (same seed) together for group-relative advantages;
    `traj_id` is unique within a batch. `won` is binary task success, `score` partial credit in [0, 1],
    `total_reward` the sum of environment rewards. `skill_context` is `c+` for this task (may be empty);
    `privileged_hint` the task-specific hint of the chosen level (`core.PRIVILEGED_HINTS`; empty when the
    teacher does not use one). Only the teacher's prompt ever contains either.
    `error` is set when the environment failed (exception or step timeout): the trajectory then ended early
    and consumers decide whether to train on it.
    """

    env_id: str
    task_id: str
    task_type: str
    group_id: int
    traj_id: int
    seed: int
    task_text: str = ""
    skill_context: str = ""
    privileged_hint: str = ""
    turns: list[Turn] = field(default_factory=list)
    won: bool = False
    score: float = 0.0
    total_reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    def outcome(self, kind: str = "won") -> float:
        """The episode's outcome as the trainer rewards it: `won` (1 or 0, the paper) or `score` (the
        environment's partial credit in [0, 1], e.g. WebShop's R, as WebShop's own RL baseline used). An
        episode that ended with an error is a failure (0), as `succeeded` says, whatever `won` or `score` say."""
        if kind not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {kind!r}")
        if self.error is not None:
            return 0.0
        return float(self.won) if kind == "won" else float(self.score)

    @property
    def num_invalid_actions(self) -> int:
        return sum(not t.action_valid for t in self.turns)

    @property
    def succeeded(self) -> bool:
        """Won without an error: the one rule for an episode's success (`summarize` counts these; an episode
        that ended with an error is a failure whatever `won` says)."""
        return bool(self.won) and self.error is None

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated or self.error is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """A trajectory from its JSON form; every field is checked against its declared type (a record is
        data from a file: a string where a number belongs must not reach a report or a page)."""
        if not isinstance(data, dict):
            raise TypeError(f"a trajectory record is a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown trajectory fields {sorted(unknown)}; expected a subset of {sorted(known)}")
        data = dict(data)
        turns = data.get("turns", [])
        if not isinstance(turns, list):
            raise TypeError(f"trajectory field 'turns': expected a list, got {type(turns).__name__}")
        check_fields("trajectory", data, _TRAJECTORY_TYPES)
        checked = []
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise TypeError(f"turn {i}: expected a JSON object, got {type(turn).__name__}")
            unknown = set(turn) - set(_TURN_TYPES)
            if unknown:
                raise ValueError(f"turn {i}: unknown fields {sorted(unknown)}")
            check_fields(f"turn {i}", turn, _TURN_TYPES, _TURN_ITEMS)
            turn = _nan_for_null(turn, ("reward",))
            if None in turn.get("response_logprobs", ()):
                turn["response_logprobs"] = [math.nan if x is None else x for x in turn["response_logprobs"]]
            checked.append(Turn(**turn))
        data["turns"] = checked
        return cls(**_nan_for_null(data, ("score", "total_reward")))


# The JSON types each recorded field may hold (bool is not a number here, and a number is not a string).
# A number field may also hold null: the writers put null where a number was NaN or infinite
# (`files.to_json`: JSON has no such numbers); it reads back as NaN.
NUMBER_OR_NULL: Final = (int, float, type(None))
_TRAJECTORY_TYPES: dict[str, tuple[type, ...]] = {
    "env_id": (str,), "task_id": (str,), "task_type": (str,), "group_id": (int,), "traj_id": (int,), "seed": (int,),
    "task_text": (str,), "skill_context": (str,), "privileged_hint": (str,), "won": (bool,), "score": NUMBER_OR_NULL,
    "total_reward": NUMBER_OR_NULL, "terminated": (bool,), "truncated": (bool,), "error": (str, type(None)),
    "metadata": (dict,),
}
_TURN_TYPES: dict[str, tuple[type, ...]] = {
    "index": (int,), "prompt": (list,), "response_text": (str,), "action": (str,), "action_valid": (bool,),
    "observation": (str,), "reward": NUMBER_OR_NULL, "response_token_ids": (list,), "response_logprobs": (list,),
    "invalid_reason": (str, type(None)), "info": (dict,),
}
_TURN_ITEMS: dict[str, tuple[type, ...]] = {  # what each element of a list field holds
    "prompt": (dict,), "response_token_ids": (int,), "response_logprobs": NUMBER_OR_NULL,
}

_preview = reprlib.Repr()  # a bounded repr: a value in an error message is a short excerpt, whatever its depth
_preview.maxstring, _preview.maxother, _preview.maxlevel = 60, 60, 2


def check_fields(where: str, record: Mapping[str, Any], types: Mapping[str, tuple[type, ...]],
                 items: Mapping[str, tuple[type, ...]] | None = None) -> None:
    """Each field of `record` named in `types` holds one of its types, and each element of a list field named in
    `items` one of those; otherwise a TypeError naming `where`, the field (and the element) and what arrived.
    A bool counts as a bool only, never as a number. Fields not named are not checked."""
    for name, value in record.items():
        allowed = types.get(name)
        if allowed is not None and not _is_one_of(value, allowed):
            raise TypeError(f"{where} field {name!r}: expected {_names(allowed)}, got {type(value).__name__} "
                            f"{_preview.repr(value)}")
        if items and name in items and isinstance(value, list):
            for i, item in enumerate(value):
                if not _is_one_of(item, items[name]):
                    raise TypeError(f"{where} field {name!r}[{i}]: expected {_names(items[name])}, got "
                                    f"{type(item).__name__} {_preview.repr(item)}")


def require_fields(where: str, record: Mapping[str, Any], names: Iterable[str]) -> None:
    """Each of `names` is a field of `record`; otherwise a ValueError naming `where` and the first missing one."""
    missing = [name for name in names if name not in record]
    if missing:
        raise ValueError(f"{where} has no field {missing[0]!r}" + (f" (nor {missing[1:]})" if missing[1:] else ""))


def _is_one_of(value: Any, allowed: tuple[type, ...]) -> bool:
    return isinstance(value, allowed) and (bool in allowed or not isinstance(value, bool))


def _names(allowed: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in allowed)


def _nan_for_null(record: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: math.nan if k in names and v is None else v for k, v in record.items()}


def groups_of(trajectories: Iterable[Trajectory]) -> dict[int, list[Trajectory]]:
    """Trajectories by `group_id` (the G rollouts of one task), groups in order of first appearance."""
    groups: dict[int, list[Trajectory]] = {}
    for traj in trajectories:
        groups.setdefault(traj.group_id, []).append(traj)
    return groups


def invalid_rates(trajectories: Iterable[Trajectory]) -> dict[str, float]:
    """`invalid/<kind>`: the fraction of all turns that were invalid for that reason (they sum to the
    invalid-action rate)."""
    counts = dict.fromkeys(INVALID_KINDS, 0)
    total = 0
    for traj in trajectories:
        for turn in traj.turns:
            total += 1
            kind = turn.invalid_kind
            if kind is not None:
                counts[kind] += 1
    return {f"invalid/{k}": v / total if total else 0.0 for k, v in counts.items()}


@dataclass(frozen=True)
class EpisodeSummary:
    """Counts of a set of episodes, and the rates every report derives from them (training steps, validation,
    the pool check, evaluation): the one rule for an episode that ended with an error (environment crash or
    hang, policy endpoint down): it counts in `episodes` as a failure (not won, score 0), its turns count like
    any other's, and `errors` reports how many there were."""

    episodes: int = 0  # every episode, errored ones included
    successes: int = 0  # episodes won without an error
    score_sum: float = 0.0  # partial credit in [0, 1], summed (0 for an errored episode)
    turns: int = 0
    invalid_actions: int = 0
    errors: int = 0  # episodes that ended with an error

    @property
    def success_rate(self) -> float:
        return self.successes / max(self.episodes, 1)

    @property
    def score_mean(self) -> float:
        return self.score_sum / max(self.episodes, 1)

    @property
    def turns_mean(self) -> float:
        return self.turns / max(self.episodes, 1)

    @property
    def invalid_action_rate(self) -> float:
        """Invalid actions / all turns."""
        return self.invalid_actions / max(self.turns, 1)


def summarize(trajectories: Iterable[Trajectory]) -> EpisodeSummary:
    """The `EpisodeSummary` of these episodes (an errored episode is a failure, and counted in `errors`)."""
    trajs = list(trajectories)
    return EpisodeSummary(
        episodes=len(trajs),
        successes=sum(t.succeeded for t in trajs),
        score_sum=sum(float(t.score) if t.error is None else 0.0 for t in trajs),
        turns=sum(t.num_turns for t in trajs),
        invalid_actions=sum(t.num_invalid_actions for t in trajs),
        errors=sum(t.error is not None for t in trajs),
    )


def save_jsonl(trajectories: Iterable[Trajectory], path: str | os.PathLike[str]) -> Path:
    """Write trajectories, one JSON object per line, atomically (a crash never leaves half a file)."""
    return atomic_write_lines(path, (to_json(t.to_dict(), ensure_ascii=False) + "\n" for t in trajectories))


def append_jsonl(trajectories: Iterable[Trajectory], path: str | os.PathLike[str]) -> None:
    """Append trajectories to a JSONL file (flushed per line, for resumable logs)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        for traj in trajectories:
            fh.write(to_json(traj.to_dict(), ensure_ascii=False) + "\n")
            fh.flush()


def load_jsonl(path: str | os.PathLike[str]) -> list[Trajectory]:
    return list(iter_jsonl(path))


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    for line_no, value in read_json_lines(path, "trajectory record"):
        try:
            yield Trajectory.from_dict(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{line_no}: not a trajectory record ({exc})") from exc


# A JSON escape of a UTF-16 surrogate (\ud800-\udfff): only such an escape can put a lone surrogate into a
# parsed string (the UTF-8 decoder refuses raw ones), so only lines with one are checked for it.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def read_json_lines(path: str | os.PathLike[str], what: str, *,
                    max_string_chars: int | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line of a JSON-lines file. A line that is not UTF-8, not
    JSON, nested deeper than the parser's recursion allows, holding a lone surrogate (text no file or page
    can be written with), a number JSON cannot hold (NaN, Infinity, 1e999, an integer of over 4,300 digits:
    `strict_json.loads_strict`, naming the field) or a string over `max_string_chars` is a ValueError
    `PATH:LINE: not a <what> (why)`."""
    with Path(path).open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
                value = loads_strict(text, max_string_chars=max_string_chars)
                if _SURROGATE_ESCAPE.search(text):
                    json.dumps(value, ensure_ascii=False).encode("utf-8")  # UnicodeEncodeError on a lone one
            except RecursionError:
                raise ValueError(f"{path}:{line_no}: not a {what} (nested deeper than the JSON reader "
                                 "follows)") from None
            except UnicodeEncodeError as exc:
                raise ValueError(f"{path}:{line_no}: not a {what} (a lone surrogate "
                                 f"{exc.object[exc.start:exc.end]!r} in a string: not valid Unicode text)") from None
            except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
                raise ValueError(f"{path}:{line_no}: not a {what} ({exc})") from exc
            yield line_no, value
