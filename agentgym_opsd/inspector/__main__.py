"""`python -m agentgym_opsd.inspector RUN_DIR [--step N] [--out FILE.html]`: see `agentgym_opsd.inspector.page`."""

from __future__ import annotations

from agentgym_opsd.inspector.page import main

if __name__ == "__main__":
    raise SystemExit(main())
