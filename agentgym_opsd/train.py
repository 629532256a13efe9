"""`python -m agentgym_opsd.train ...` = `agentgym-opsd train ...`: training (`agentgym_opsd.trainer.cli`).

Kept as a module of its own because launchers run modules (`torchrun -m agentgym_opsd.train`,
`deepspeed -m agentgym_opsd.train`); the command group resolves the trainer by name, so the core imports
nothing above it.
"""

from __future__ import annotations

import sys

from agentgym_opsd.__main__ import main
from agentgym_opsd.cpu_runtime import reexec_preloaded

if __name__ == "__main__":
    reexec_preloaded()  # vLLM's CPU build's allocator and OpenMP runtime, where installed (agentgym_opsd/cpu_runtime.py)
    raise SystemExit(main(["train", *sys.argv[1:]]))
