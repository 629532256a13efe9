"""`python -m agentgym_opsd.evaluate ...` = `agentgym-opsd eval ...`: evaluation (`agentgym_opsd.evaluation.cli`)."""

from __future__ import annotations

import sys

from agentgym_opsd.__main__ import run_as_command

if __name__ == "__main__":
    raise SystemExit(run_as_command(["eval", *sys.argv[1:]]))
