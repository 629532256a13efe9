"""`python -m agentgym_opsd.evaluate ...` = `agentgym-opsd eval ...`: evaluation (`agentgym_opsd.evaluation.cli`)."""

from __future__ import annotations

import sys

from agentgym_opsd.__main__ import main
from agentgym_opsd.cpu_runtime import reexec_preloaded

if __name__ == "__main__":
    reexec_preloaded()  # vLLM's CPU build's allocator and OpenMP runtime, where installed (agentgym_opsd/cpu_runtime.py)
    raise SystemExit(main(["eval", *sys.argv[1:]]))
