"""The frozen reference policy of the KL term: the policy at RL start (after any warm start).

Without LoRA it is a frozen copy of the model, loaded from the warm start's weights (or the base model). With
LoRA it is a second, frozen adapter on the same base holding the warm-started adapter, or the base model
alone (adapters disabled) when there was no warm start: no second copy of the base weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor

from agentgym_opsd.trainer.logprobs import TrainedModel

__all__ = ["ReferencePolicy"]


class ReferencePolicy:
    """`logprobs(prompts, responses)`: the reference's teacher-forced log-probs, or None when the KL term is
    off. `warm_start_dir` says where the RL start's weights are (None: the base model `base_model`)."""

    def __init__(self, policy: TrainedModel, *, kl_coef: float, base_model: str, dtype: str,
                 warm_start_dir: Callable[[], Path | None]) -> None:
        self.policy = policy
        self.enabled = kl_coef > 0
        self.base_model, self.dtype = base_model, dtype
        self.warm_start_dir = warm_start_dir
        self.frozen_copy: torch.nn.Module | None = None

    def setup(self) -> None:
        """Build the reference from the weights RL starts from (call after the warm start)."""
        if not self.enabled:
            return
        source = self.warm_start_dir()
        model = self.policy.model
        if self.policy.lora:
            if source is not None and "reference" not in model.peft_config:
                with self._keep_requires_grad():
                    model.load_adapter(str(source), adapter_name="reference", is_trainable=False)
                    model.set_adapter("default")
            return
        from agentgym_opsd.models.loading import load_policy_model

        copy, _ = load_policy_model(str(source or self.base_model), dtype=self.dtype, trainable=False)
        self._float32_where_the_policy_is(copy, source)
        self.frozen_copy = copy.to(self.policy.device)

    def _float32_where_the_policy_is(self, copy: torch.nn.Module, source: Path | None) -> None:
        """bf16-mixed: the copy's blocks the policy trains in float32 are float32 too (with the warm start's exact
        values), and under autocast where the policy's are, so the reference
        computes as the policy did where RL started."""
        from agentgym_opsd.models.loading import (
            autocast_dtype,
            autocast_trainable_blocks,
            keep_trainable_in_float32,
            restore_float32_weights,
        )
        from agentgym_opsd.models.precision import is_low_precision

        if not is_low_precision(self.dtype):
            return
        float32 = {name for name, p in self.policy.model.named_parameters()
                   if p.requires_grad and p.dtype == torch.float32}
        if not float32:
            return
        for name, p in copy.named_parameters():
            p.requires_grad_(name in float32)
        keep_trainable_in_float32(copy)
        if (dtype := autocast_dtype(self.policy.model)) is not None:  # as the policy's blocks do
            autocast_trainable_blocks(copy, dtype)
        if source is not None:
            restore_float32_weights(copy, source)
        copy.requires_grad_(False)

    def logprobs(self, prompts: list[list[int]], responses: list[list[int]]) -> list[Tensor] | None:
        if not self.enabled:
            return None
        model = self.policy.model
        if self.policy.lora:
            if "reference" not in model.peft_config:
                self.setup()
            if "reference" in model.peft_config:
                with self._reference_adapter():
                    return self.policy.logprobs(prompts, responses)
            with model.disable_adapter():  # no warm start: the base model is where RL started
                return self.policy.logprobs(prompts, responses)
        if self.frozen_copy is None:
            self.setup()
        assert self.frozen_copy is not None
        return self.policy.logprobs(prompts, responses, model=self.frozen_copy)

    @contextlib.contextmanager
    def _keep_requires_grad(self) -> Iterator[None]:
        """PEFT's set_adapter marks the active adapter trainable everywhere; keep our frozen layers frozen."""
        flags = [(p, p.requires_grad) for p in self.policy.model.parameters()]
        try:
            yield
        finally:
            for p, flag in flags:
                p.requires_grad_(flag)

    @contextlib.contextmanager
    def _reference_adapter(self) -> Iterator[None]:
        with self._keep_requires_grad():
            self.policy.model.set_adapter("reference")
            try:
                yield
            finally:
                self.policy.model.set_adapter("default")
