"""OpenEnv's server for SearchQA-v0 (agentgym-opsd), written by `agentgym-opsd openenv-package SearchQA-v0 DIR --extra search`.

    uv run server [--port 8000] [--host 0.0.0.0]   # serve-openenv with its limits; the playground at /web/
    uvicorn server.app:app --port 8000             # OpenEnv's Docker command: the app's own checks only
"""

from agentgym_opsd.integrations.openenv_package import FolderServer

_server = FolderServer("SearchQA-v0", __file__)


def main(argv: list[str] | None = None) -> int:  # OpenEnv's `server` script (openenv validate looks for it)
    return _server.main(argv)


def __getattr__(name: str) -> object:
    return _server.attribute(name)  # `app`, built when uvicorn asks for it


if __name__ == "__main__":
    raise SystemExit(main())
