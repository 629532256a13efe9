"""`python -m agentgym_opsd.train ...` = `agentgym-opsd train ...`: training, `agentgym_opsd.trainer.cli.main`.

A module of its own because launchers run modules (`torchrun -m agentgym_opsd.train`); the trainer is imported by
name, so the core imports nothing above it.
"""

from __future__ import annotations

import importlib
import sys

if __name__ == "__main__":
    from agentgym_opsd.cpu_runtime import reexec_preloaded

    reexec_preloaded()  # a sampling command starts again with vLLM's CPU runtime preloaded, where that applies
    raise SystemExit(importlib.import_module("agentgym_opsd.trainer.cli").main(sys.argv[1:]))
