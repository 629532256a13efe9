"""Supervised warm start on oracle demonstrations (a 135M model cannot play ALFWorld zero-shot).

The environments' experts (`oracle_action()`) play through the same `RolloutRunner` as the policy, so the
demonstration prompts are exactly what the policy will see. The response text is the parser's own format
of the expert action (optionally after a short canned thought), tokenised once; the loss is the mean NLL of
the response tokens only (the prompt is context). It runs as the first stage of `python -m
agentgym_opsd.train` and is skipped on resume once done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.policies import OraclePolicy, PolicyOutput, PolicyRequest
from agentgym_opsd.records import Trajectory
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer.logprobs import bucket_micro_batches, collate, response_logprobs

__all__ = ["Demonstration", "ThoughtOracle", "collect_demonstrations", "demonstration_rows", "sft_step"]


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
            ids = tokenizer(turn.response_text, add_special_tokens=False)["input_ids"]
            if ids:
                rows.append(Demonstration(list(encode_prompt(turn.prompt)), list(ids)))
    return rows


def sft_step(
    engine,
    rows: Sequence[Demonstration],
    rng: np.random.Generator,
    *,
    batch_rows: int,
    pad_id: int,
    max_tokens: int,
    max_rows: int,
    device: torch.device | str,
) -> float:
    """One optimiser step on `batch_rows` demonstrations drawn with `rng`; returns the mean token NLL."""
    pick = rng.choice(len(rows), size=min(batch_rows, len(rows)), replace=False)
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
