"""Supervised warm start on oracle demonstrations (a 135M model cannot play ALFWorld zero-shot).

The environments' experts (`oracle_action()`) play through the same `RolloutRunner` as the policy, so the
demonstration prompts are exactly what the policy will see. The response text is the parser's own format
of the expert action (optionally after a short canned thought), tokenised once; the loss is the mean NLL of
the response tokens only (the prompt is context). Training runs in epochs over shuffled rows
(`sft_schedule`); a held-out slice of demonstration episodes is scored by `action_exact_match`, the
fraction of turns where the greedy reply parses to exactly the expert's action (token NLL hides that the
action tokens are the hard ones). `warm_start_key` names everything that determines the result, so the
trainer can cache it. It runs as the first stage of `python -m agentgym_opsd.train` and is skipped on resume
once done.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.models.hf_policy import text_ids
from agentgym_opsd.policies import OraclePolicy, PolicyOutput, PolicyRequest
from agentgym_opsd.records import Trajectory
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer.logprobs import bucket_micro_batches, collate, response_logprobs

__all__ = ["Demonstration", "ThoughtOracle", "action_exact_match", "collect_demonstrations", "demonstration_rows",
           "sft_schedule", "sft_step", "warm_start_key", "WARM_START_VERSION"]

WARM_START_VERSION = 2
"""Bump when the warm-start procedure changes, so cached warm starts of the old procedure are not reused."""


class ThoughtOracle(OraclePolicy):
    """The oracle, writing `thought` (if any) before the formatted action, like a model would."""

    def __init__(self, thought: str = "") -> None:
        self.thought = thought

    def act(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        outputs = super().act(requests)
        if self.thought:
            for out in outputs:
                out.text = f"{self.thought} {out.text}"
        return outputs


@dataclass
class Demonstration:
    """One supervised row: the prompt ids and the response ids to imitate."""

    prompt_ids: list[int]
    response_ids: list[int]


def collect_demonstrations(
    runner: RolloutRunner, tasks: Sequence[TaskSpec], *, thought: str = "", batch: int = 16
) -> list[Trajectory]:
    """Play `tasks` with the oracle (one copy each), `batch` environments at a time; only won episodes."""
    won: list[Trajectory] = []
    for start in range(0, len(tasks), batch):
        trajs = runner.run(ThoughtOracle(thought), list(tasks[start:start + batch]), group_size=1)
        won.extend(t for t in trajs if t.won and t.error is None)
    return won


def demonstration_rows(trajectories: Sequence[Trajectory], encode_prompt, tokenizer) -> list[Demonstration]:
    """Tokenise every turn of the demonstrations (response text without special tokens)."""
    rows = []
    for traj in trajectories:
        for turn in traj.turns:
            ids = text_ids(tokenizer, turn.response_text)
            if ids:
                rows.append(Demonstration(list(encode_prompt(turn.prompt)), list(ids)))
    return rows


def sft_schedule(num_rows: int, *, batch_rows: int, epochs: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Row indices of every SFT step: each epoch is a fresh permutation cut into `batch_rows` (the last
    batch of an epoch may be smaller); a fractional epoch takes the first part of one more permutation."""
    if num_rows <= 0 or epochs <= 0:
        return []
    batches: list[np.ndarray] = []
    whole, frac = int(epochs), epochs - int(epochs)
    for e in range(whole + (1 if frac > 0 else 0)):
        order = rng.permutation(num_rows)
        if e == whole:
            order = order[: max(1, math.ceil(frac * num_rows))]
        batches += [order[i:i + batch_rows] for i in range(0, len(order), batch_rows)]
    return batches


def sft_step(
    engine,
    rows: Sequence[Demonstration],
    pick: Sequence[int] | np.ndarray,
    *,
    pad_id: int,
    max_tokens: int,
    max_rows: int,
    device: torch.device | str,
) -> float:
    """One optimiser step on the demonstrations `pick`; returns their mean response-token NLL."""
    prompts = [rows[i].prompt_ids for i in pick]
    responses = [rows[i].response_ids for i in pick]
    num_tokens = sum(len(r) for r in responses)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    batches = bucket_micro_batches(lengths, max_tokens=max_tokens, max_rows=max_rows)
    model = engine.module
    model.train()
    total = 0.0
    for k, idx in enumerate(batches):
        mb = collate(idx, prompts, responses, pad_id).to(device)
        logp, _ = response_logprobs(model, mb)
        loss = -(logp * mb.response_mask).sum() / num_tokens
        engine.backward(loss, is_last=k == len(batches) - 1)
        total += float(loss.detach())
    engine.step()
    return total


def action_exact_match(policy, trajectories: Sequence[Trajectory], parser) -> float:
    """Fraction of the demonstrations' turns where `policy` (greedy, e.g. an HFPolicy at temperature 0)
    answers the turn's prompt with text that `parser` reads as exactly the expert's action."""
    turns = [t for traj in trajectories for t in traj.turns]
    if not turns:
        return math.nan
    requests = [PolicyRequest(t.prompt) for t in turns]
    outputs = policy.act(requests)
    hits = 0
    for turn, out in zip(turns, outputs, strict=True):
        parsed = parser.parse(out.text)
        hits += bool(parsed.valid and parsed.action.strip().lower() == turn.action.strip().lower())
    return hits / len(turns)


def warm_start_key(settings: dict[str, Any]) -> str:
    """A short stable hash of everything that determines a warm start (model, environment and prompt
    settings, demonstration and SFT settings, seed, `WARM_START_VERSION`)."""
    blob = json.dumps({"version": WARM_START_VERSION, **settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
