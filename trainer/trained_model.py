"""The model under training with what every phase needs of it: its tokenizer, its engine, its device.

One object instead of four attributes passed around: the warm start, the reference policy, the log-prob
passes and checkpoints all go through it. `save` and `load_weights` are collective under ZeRO (every rank
calls them; rank 0 writes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentgym_opsd.records import ChatMessage
from agentgym_opsd.trainer.checkpoint import CheckpointError
from agentgym_opsd.trainer.frozen_trunk import TrunkCache
from agentgym_opsd.trainer.logprobs import (
    batched_response_logprobs,
    packed_batched_response_logprobs,
    prefix_shared_response_logprobs,
)

__all__ = ["TrainedModel"]


@dataclass
class TrainedModel:
    """`model` is the engine's module (the one the optimiser updates); `is_main`: this process writes files."""

    model: torch.nn.Module
    tokenizer: Any
    engine: Any
    device: torch.device
    is_main: bool
    lora: bool
    temperature: float  # the rollout temperature: log-probs are those of the tempered sampling distribution
    micro_batch_tokens: int
    micro_batch_rows: int

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def encode(self, messages: list[ChatMessage]) -> list[int]:
        """Prompt ids exactly as generation renders them (chat template + generation prompt)."""
        from agentgym_opsd.models.hf_policy import chat_prompt_ids

        return chat_prompt_ids(self.tokenizer, messages)

    def logprobs(self, prompts: list[list[int]], responses: list[list[int]],
                 model: torch.nn.Module | None = None, *, shared_prefix: bool = False,
                 packed: bool = False, trunk_cache: TrunkCache | None = None) -> list[Tensor]:
        """Teacher-forced log-probs of each response token (no grad), by `model` (default: the trained one).
        `shared_prefix`: prompts that share a prefix (the teacher's c+ system message) encode it once.
        `packed`: in the update's packed layout (π_old: in bf16 it then rounds as the update's forward does);
        `trunk_cache` then keeps each row's frozen-trunk output for the update (`trainer/frozen_trunk.py`)."""
        model = model if model is not None else self.model
        if packed:
            return packed_batched_response_logprobs(model, prompts, responses, temperature=self.temperature,
                                                    max_tokens=self.micro_batch_tokens,
                                                    max_rows=self.micro_batch_rows, device=self.device,
                                                    trunk_cache=trunk_cache)
        settings: dict[str, Any] = {"pad_id": self.pad_id, "temperature": self.temperature,
                                    "max_tokens": self.micro_batch_tokens, "max_rows": self.micro_batch_rows,
                                    "device": self.device}
        # The teacher's rows stay left-padded after the repeated prefix cache: packed after the one-row cache they
        # ran no faster (docs/benchmarks.md), the per-row attention over the long c+ prefix costing more than the
        # little padding that length-bucketed micro-batches leave.
        score = prefix_shared_response_logprobs if shared_prefix else batched_response_logprobs
        return score(model, prompts, responses, **settings)

    def save(self, folder: Path) -> None:
        """save_pretrained of the full weights (the trained adapter only, with LoRA); collective."""
        state = self.engine.full_state_dict()
        if not self.is_main:
            return
        folder.parent.mkdir(parents=True, exist_ok=True)
        kwargs: dict[str, Any] = {"safe_serialization": True}
        if state is not None:
            kwargs["state_dict"] = state
        if hasattr(self.model, "peft_config"):  # never the frozen reference adapter
            self.model.save_pretrained(str(folder), selected_adapters=["default"], **kwargs)
        else:
            self.model.save_pretrained(str(folder), **kwargs)
        self.tokenizer.save_pretrained(str(folder))

    def load_weights(self, folder: Path) -> None:
        """Load saved weights (a full model or a LoRA adapter folder) into the live model, in place, so the
        engine's optimiser keeps its parameters."""
        from safetensors.torch import load_file

        state: dict[str, Tensor] = {}
        for f in sorted(folder.glob("*.safetensors")):
            state.update(load_file(str(f)))
        if not state:
            raise CheckpointError(f"{folder}: no safetensors weights to load")
        if self.lora:
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.model, state)
            unexpected = list(getattr(result, "unexpected_keys", []) or [])
            self.engine.refresh_masters()  # ZeRO / bf16 keep an fp32 master copy the next step would write back
        else:
            result = self.engine.load_full_state_dict(state)
            tied = {k for k in result.missing_keys if "lm_head" in k}
            missing = [k for k in result.missing_keys if k not in tied]
            if missing:
                raise CheckpointError(f"{folder}: weights missing for {missing[:5]}")
            unexpected = list(result.unexpected_keys)
        if unexpected:
            raise CheckpointError(f"{folder}: unexpected weights {unexpected[:5]}")
