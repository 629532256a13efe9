"""`python -m agentgym_opsd.evaluate ...` = `agentgym-opsd eval ...`: evaluation (`agentgym_opsd.evaluation.cli`)."""

from __future__ import annotations

import sys

from agentgym_opsd.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main(["eval", *sys.argv[1:]]))
