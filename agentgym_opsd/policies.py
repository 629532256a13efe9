"""Policies: a batch of chat prompts in, response texts (with token ids and log-probs) out.

Model policies (HF transformers, vLLM, OpenAI-compatible HTTP) implement the same protocol in
`agentgym_opsd.trainer` / `agentgym_opsd.evaluation`; the scripted ones live here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from agentgym_opsd.records import ChatMessage

__all__ = ["PolicyRequest", "PolicyOutput", "Policy", "RandomPolicy", "OraclePolicy"]


@dataclass
class PolicyRequest:
    """One prompt of a batch.

    `admissible_actions` is what the environment would accept (None when unknown); `oracle` returns the
    expert's next action (scripted policies only); `format_action` turns an environment action into model
    text that the environment's parser reads back (scripted policies write text like a model would).
    """

    messages: list[ChatMessage]
    admissible_actions: list[str] | None = None
    oracle: Callable[[], str] | None = None
    format_action: Callable[[str], str] = field(default=lambda a: f"<action>{a}</action>")


@dataclass
class PolicyOutput:
    """One answer. `error` is set (and `text` ignored) when the policy could not answer this request at all
    (a remote endpoint that timed out or sent garbage): the rollout then ends that episode flagged with the
    reason instead of sending an action, and the other episodes of the batch go on.

    `finish_reason` says why generation ended: "stop" (a stop string, e.g. the closing tag), "eos" (the model
    ended its turn; the end-of-sequence token is the last of `token_ids` so the trainer can push it down,
    `text` leaves it out) or "length" (cut at `max_new_tokens`); None for policies that do not generate."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    error: str | None = None
    finish_reason: str | None = None


@runtime_checkable
class Policy(Protocol):
    """`act` answers every request of the batch, in order."""

    def act(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]: ...


class RandomPolicy:
    """Uniform over the admissible actions (an empty action when the environment does not list them)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        outputs = []
        for req in requests:
            if req.admissible_actions:
                action = req.admissible_actions[int(self.rng.integers(len(req.admissible_actions)))]
                outputs.append(PolicyOutput(req.format_action(action)))
            else:
                outputs.append(PolicyOutput(""))
        return outputs


class OraclePolicy:
    """The environment's expert (`oracle_action()` of the unwrapped environment)."""

    def act(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        outputs = []
        for req in requests:
            if req.oracle is None:
                raise ValueError("OraclePolicy needs requests with an oracle (run it through agentgym_opsd.rollout)")
            outputs.append(PolicyOutput(req.format_action(req.oracle())))
        return outputs
