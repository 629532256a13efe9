"""Rollout policy backends by name: `make_policy_backend("hf" | "vllm", ...)`.

The factory lives apart from both policies so that neither imports the other's module for it (vLLM's policy
reuses the HF chat encoding; the HF policy knows nothing of vLLM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentgym_opsd.models.hf_policy import HFPolicy
from agentgym_opsd.policies import Policy

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["BACKENDS", "make_policy_backend"]

BACKENDS = ("hf", "vllm")


def make_policy_backend(
    name: str,
    *,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    model_path: str | None = None,
    **options: Any,
) -> Policy:
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
