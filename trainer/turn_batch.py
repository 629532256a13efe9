"""Turn rows: the unit the trainer computes log-probs, evidence and advantages on.

Every turn of every trajectory becomes exactly one `TurnRow` (no padding duplicates): the student prompt
token ids (what the policy saw), the teacher prompt token ids (the same prompt with `c+` in the system
message; None when the task has no skill text, so the evidence is exactly zero and the teacher pass skips
the row), the sampled response ids and their sampling log-probs. `build_turn_batch` also scores each
trajectory (reward, group success rate) so that the credit estimator gets everything as flat tensors.

Reward of a trajectory: `reward_scale * outcome`, the outcome being `won` (binary success, paper;
reward_scale 10 reproduces the released code's 0/10 scale) or `score` (the environment's partial credit in
[0, 1]: WebShop's R, which WebShop's own RL baseline trained on; `Trajectory.outcome`). The invalid-action penalty goes either into that reward once per penalised turn
(`penalty_mode="trajectory"`, every turn of the trajectory shares it) or onto the penalised turn's own row
(`penalty_mode="turn"`, the released code, and `penalty_mode="outcome"`, where the trainer keeps it apart
from the outcome advantage; `row_penalties`). `penalize="any"` penalises every invalid turn,
`"format"` only replies without a parsable action (the released code lets a well-formed but inadmissible
action waste its turn unpunished). The penalty is one number, or one per trajectory (a mixed-environment
step: each row is penalised by its own environment's value). The group success rate R̄ (the belief's prior) is the group mean of
the outcome (`success_source="won"`: the fraction won, paper; with `outcome="score"` the mean score), or the
group mean of the raw reward without the penalty (`success_source="reward"`, released code — saturates B_0 when the scale is 10).

For GiGPO each row also carries its turn's own reward (`reward_scale * turn.reward`), its invalid-action
penalty in either penalty mode (`turn_penalty`; GiGPO subtracts it from the turn's step return), and an
`anchor_key`: a 63-bit hash of the state the turn acted on — the previous turn's observation, or for the
first turn its prompt (the task and the initial observation, which every rollout of a task shares). Anchor
groups never cross task groups, so equal observations of different tasks are never compared.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from agentgym_opsd.records import ChatMessage, Trajectory, Turn, invalid_rates, summarize
from agentgym_opsd.turns import check_penalize, is_penalised, num_penalised, oracle_progress

__all__ = ["PENALTY_MODES", "TurnRow", "TurnBatch", "build_turn_batch", "trajectory_rewards", "group_success_rates",
           "anchor_key"]

PromptEncoder = Callable[[list[ChatMessage]], list[int]]
TeacherMessages = Callable[[Trajectory, Turn], list[ChatMessage]]


@dataclass
class TurnRow:
    """One turn: the student's and the teacher's prompt ids, the sampled response ids with their sampling
    log-probs, and the per-turn values the credit estimators read."""

    group_id: int
    traj_id: int
    turn_id: int
    prompt_ids: list[int]
    teacher_prompt_ids: list[int] | None
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
    trajectory-level values (1-D tensors, row order). The later phases' values are their own
    (`trainer/phases.py`); the batch is frozen and its rows never change after `build_turn_batch`, so the
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
    teacher_messages: TeacherMessages | None,
    reward_scale: float = 1.0,
    invalid_penalty: Penalty = 0.0,
    success_source: str = "won",
    penalty_mode: str = "trajectory",
    penalize: str = "any",
    outcome: str = "won",
) -> TurnBatch:
    """One row per turn that produced tokens; trajectories keep their order, turns their index.

    `encode_prompt(messages)` must return the exact prompt ids generation used (the HF policy's
    `prompt_ids`). `teacher_messages(traj, turn)` builds the privileged prompt; with None (or when it equals
    the student's prompt: no skill text, no hint) the row has no teacher prompt and its evidence is zero.
    `invalid_penalty`: one value, or one per trajectory (each row gets its trajectory's).
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
            prompt_ids = list(encode_prompt(turn.prompt))
            teacher_ids: list[int] | None = None
            if teacher_messages is not None:
                t_messages = teacher_messages(traj, turn)
                if t_messages != turn.prompt:
                    teacher_ids = list(encode_prompt(t_messages))
            rows.append(TurnRow(
                group_id=traj.group_id,
                traj_id=traj.traj_id,
                turn_id=turn.index,
                prompt_ids=prompt_ids,
                teacher_prompt_ids=teacher_ids,
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
