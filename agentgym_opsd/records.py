"""Turn and trajectory records: what the turn API hands to the trainer and the evaluator.

One `Turn` is one exchange: the prompt the policy saw, what it answered (text, token ids, log-probs), the
action parsed from it, and what the environment replied. A `Trajectory` is one episode of turns plus the
task metadata and the privileged skill context `c+` the self-teacher conditions on.

Records serialise to JSON lines (one trajectory per line) and load back equal (`==`), so rollouts can be
stored, inspected and replayed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from agentgym_opsd.files import atomic_write_lines

__all__ = ["OUTCOMES", "Turn", "Trajectory", "save_jsonl", "load_jsonl", "append_jsonl", "INVALID_KINDS", "classify_invalid",
           "groups_of", "invalid_rates"]

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

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_token_ids)

    @property
    def invalid_kind(self) -> str | None:
        """`INVALID_KINDS` entry (recorded by the rollout; older records fall back on the action text)."""
        if self.action_valid:
            return None
        kind = self.info.get("invalid_kind")
        if kind in INVALID_KINDS:
            return str(kind)
        return classify_invalid(parsed=bool(self.action), accepted=False, finish_reason=self.info.get("finish_reason"))


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
        environment's partial credit in [0, 1], e.g. WebShop's R, as WebShop's own RL baseline used)."""
        if kind == "won":
            return float(self.won)
        if kind == "score":
            return float(self.score)
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {kind!r}")

    @property
    def num_invalid_actions(self) -> int:
        return sum(not t.action_valid for t in self.turns)

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
        _check_fields("trajectory", data, _TRAJECTORY_TYPES)
        checked = []
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise TypeError(f"turn {i}: expected a JSON object, got {type(turn).__name__}")
            unknown = set(turn) - set(_TURN_TYPES)
            if unknown:
                raise ValueError(f"turn {i}: unknown fields {sorted(unknown)}")
            _check_fields(f"turn {i}", turn, _TURN_TYPES)
            checked.append(Turn(**turn))
        data["turns"] = checked
        return cls(**data)


# The JSON types each recorded field may hold (bool is not a number here, and a number is not a string).
_NUMBER = (int, float)
_TRAJECTORY_TYPES: dict[str, tuple[type, ...]] = {
    "env_id": (str,), "task_id": (str,), "task_type": (str,), "group_id": (int,), "traj_id": (int,), "seed": (int,),
    "task_text": (str,), "skill_context": (str,), "privileged_hint": (str,), "won": (bool,), "score": _NUMBER,
    "total_reward": _NUMBER, "terminated": (bool,), "truncated": (bool,), "error": (str, type(None)),
    "metadata": (dict,),
}
_TURN_TYPES: dict[str, tuple[type, ...]] = {
    "index": (int,), "prompt": (list,), "response_text": (str,), "action": (str,), "action_valid": (bool,),
    "observation": (str,), "reward": _NUMBER, "response_token_ids": (list,), "response_logprobs": (list,),
    "invalid_reason": (str, type(None)), "info": (dict,),
}


def _check_fields(where: str, record: dict[str, Any], types: dict[str, tuple[type, ...]]) -> None:
    for name, value in record.items():
        allowed = types.get(name)
        if allowed is None:
            continue
        is_bool = isinstance(value, bool)
        if not isinstance(value, allowed) or (is_bool and bool not in allowed):
            raise TypeError(f"{where} field {name!r}: expected {' or '.join(t.__name__ for t in allowed)}, "
                            f"got {type(value).__name__} {str(value)[:60]!r}")


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


def save_jsonl(trajectories: Iterable[Trajectory], path: str | os.PathLike[str]) -> Path:
    """Write trajectories, one JSON object per line, atomically (a crash never leaves half a file)."""
    return atomic_write_lines(path, (json.dumps(t.to_dict(), ensure_ascii=False) + "\n" for t in trajectories))


def append_jsonl(trajectories: Iterable[Trajectory], path: str | os.PathLike[str]) -> None:
    """Append trajectories to a JSONL file (flushed per line, for resumable logs)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        for traj in trajectories:
            fh.write(json.dumps(traj.to_dict(), ensure_ascii=False) + "\n")
            fh.flush()


def load_jsonl(path: str | os.PathLike[str]) -> list[Trajectory]:
    return list(iter_jsonl(path))


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    with Path(path).open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield Trajectory.from_dict(json.loads(line))
            except (json.JSONDecodeError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{line_no}: not a trajectory record ({exc})") from exc
