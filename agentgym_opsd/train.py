"""`python -m agentgym_opsd.train ...` = `agentgym-opsd train ...`: training (`agentgym_opsd.trainer.cli`).

Kept as a module of its own because launchers run modules (`torchrun -m agentgym_opsd.train`,
`deepspeed -m agentgym_opsd.train`); the command group resolves the trainer by name, so the core imports
nothing above it.
"""

from __future__ import annotations

import sys

from agentgym_opsd.__main__ import run_as_command

if __name__ == "__main__":
    raise SystemExit(run_as_command(["train", *sys.argv[1:]]))
