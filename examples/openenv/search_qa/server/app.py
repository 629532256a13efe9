"""OpenEnv's server for SearchQA-v0 (agentgym-opsd), written by `agentgym-opsd openenv-package SearchQA-v0 DIR --extra search`.

    uv run server [--port 8000] [--host 0.0.0.0]   # serve-openenv with its limits; the playground at /web/
    uvicorn server.app:app --port 8000             # OpenEnv's Docker command: the app's own checks only

The app is `agentgym-opsd serve-openenv SearchQA-v0 --web`'s; `main()` takes serve-openenv's options.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ENV_SPEC = "SearchQA-v0"

# OpenEnv's own switches (a value set outside wins): its web playground on, this folder's README shown in it.
os.environ.setdefault("ENABLE_WEB_INTERFACE", "true")
os.environ.setdefault("ENV_README_PATH", str(Path(__file__).resolve().parents[1] / "README.md"))


def __getattr__(name: str) -> Any:
    # `app` is built when uvicorn asks for it, so `uv run server` (which builds its own) makes the environment once.
    if name != "app":
        raise AttributeError(name)
    from agentgym_opsd.integrations.openenv_env import SessionSettings
    from agentgym_opsd.integrations.openenv_server import create_app

    globals()["app"] = app = create_app(SessionSettings(ENV_SPEC))
    return app


def main(argv: Sequence[str] | None = None) -> int:
    from agentgym_opsd.integrations.openenv_server import main as serve_openenv

    return serve_openenv([ENV_SPEC, "--web", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
