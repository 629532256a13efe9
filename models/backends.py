"""Rollout policy backends by name: `make_policy_backend("hf" | "vllm", ...)`.

The factory lives apart from both policies so that neither imports the other's module for it (vLLM's policy
reuses the HF chat encoding; the HF policy knows nothing of vLLM).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentgym_opsd.models.hf_policy import HFPolicy
from agentgym_opsd.policies import PolicyOutput, PolicyRequest

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["BACKENDS", "RolloutBackend", "make_policy_backend"]

BACKENDS = ("hf", "vllm")


@runtime_checkable
class RolloutBackend(Protocol):
    """What the trainer asks of a rollout policy besides `act` (both backends implement all of it; the HF
    backend's lifecycle methods are no-ops because it samples from the trainer's own module)."""

    def act(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]: ...

    def with_sampling(self, *, temperature: float, seed: int) -> RolloutBackend:
        """A sampler over the same weights at another temperature, with its own seeded stream."""
        ...

    def wake_up(self) -> None:
        """Before a generation phase: bring back what `sleep` freed."""
        ...

    def sleep(self) -> None:
        """After a generation phase: free generation memory for the trainer's passes."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> int:
        """Take the trainer's current weights; returns how many tensors were pushed."""
        ...

    def get_rng_state(self) -> Any:
        """The sampling stream's state for a checkpoint (None when there is none to keep)."""
        ...

    def set_rng_state(self, state: Any) -> None: ...


def make_policy_backend(
    name: str,
    *,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    model_path: str | None = None,
    **options: Any,
) -> RolloutBackend:
    """Build a rollout policy by backend name.

    `"hf"`: an `HFPolicy` over `model` + `tokenizer` (or over `load_policy_model(model_path)` when no model
    is given). `"vllm"`: a `VLLMPolicy` serving `model_path` (GPU; needs the `gpu` extra, imported only
    here). `options` go to the policy's constructor (max_new_tokens, temperature, top_p, stop_strings,
    seed, and batch_size for HF or engine settings for vLLM).
    """
    if name == "hf":
        if model is None:
            if model_path is None:
                raise ValueError("the hf backend needs a model and tokenizer, or a model_path to load")
            from agentgym_opsd.models.loading import load_policy_model

            model, tokenizer = load_policy_model(model_path, trainable=False)
        if tokenizer is None:
            raise ValueError("the hf backend needs the tokenizer that belongs to the model")
        return HFPolicy(model, tokenizer, **options)
    if name == "vllm":
        if model_path is None:
            raise ValueError("the vllm backend needs model_path (a folder or hub name vLLM can load)")
        from agentgym_opsd.models.vllm_policy import VLLMPolicy, require_vllm

        require_vllm()
        return VLLMPolicy(model_path, tokenizer=tokenizer, **options)
    raise ValueError(f"unknown generation backend {name!r}; choose one of {BACKENDS}")
