"""The trainer's public face: `Trainer`, `Config`, `load_config` and `ConfigError` (docs/api.md).

    from agentgym_opsd.trainer import Trainer, load_config
    trainer = Trainer(load_config("cpu-small", ["trainer.total_steps=4"]))
    try:
        metrics = trainer.train()
    finally:
        trainer.close()

The names are imported on first use: `agentgym_opsd.trainer.config` alone needs no torch model code.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Config", "ConfigError", "Trainer", "load_config"]

_WHERE = {"Config": "config", "ConfigError": "config", "load_config": "config", "Trainer": "loop"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
