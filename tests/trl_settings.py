"""GRPOConfig settings the TRL tests share, spelled for the installed transformers."""

from __future__ import annotations


def checkpointing_off() -> dict[str, bool]:
    """Activation checkpointing off (TRL turns it on by default): transformers 5.20 renamed TrainingArguments'
    `gradient_checkpointing` to `activation_checkpointing`, and vLLM's CPU build keeps `.venv` on 5.19."""
    from trl import GRPOConfig

    fields = GRPOConfig.__dataclass_fields__
    return {"activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing": False}
