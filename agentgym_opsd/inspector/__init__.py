"""The credit inspector: one static HTML page of a training step's credit numbers.

    python -m agentgym_opsd.inspector RUN_DIR [--step N] [--out FILE.html]    (or: agentgym-opsd inspect RUN_DIR)

`page` reads a step's trajectories and credit files and builds the page; see its docstring.
"""

from __future__ import annotations

from agentgym_opsd.inspector.page import StepData, load_step, main, render_html

__all__ = ["StepData", "load_step", "render_html", "main"]
