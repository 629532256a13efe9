"""One of our environments as an OpenEnv environment folder: `agentgym-opsd openenv-package ENV[:SPLIT] DIR`.

    agentgym-opsd openenv-package ALFWorld-v0 envs/alfworld --extra alfworld   # one folder
    agentgym-opsd openenv-package --builtin examples/openenv                   # ALFWorld, WebShop, Search-QA

OpenEnv's CLI (`openenv validate`, `build`, `push`; openenv-core 0.3) expects `openenv.yaml`, `pyproject.toml`
(a `server` script, openenv-core among the dependencies), `uv.lock` and `server/app.py` (an ASGI `app` and a
`main()`). This writes them: `server/app.py` serves the environment with `serve-openenv`'s app and limits, with
OpenEnv's web playground. The folder installs agentgym-opsd from `--source` (default: this checkout, when it runs
from one) and is locked with `uv lock` for Linux x86-64 (what OpenEnv's images run on) when `uv` is found; else run
`uv lock` there. `--builtin` writes the folders committed under examples/openenv/, where `uv run server` works.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentgym_opsd.files import atomic_write_text
from agentgym_opsd.outputs import OutputRefused, claim_folder, refuse_non_regular
from agentgym_opsd.registry import RegistryError, env_profile, parse_env_spec

__all__ = ["BUILTIN_PACKAGES", "FolderServer", "Package", "lock", "main", "package_files", "write_package"]

OPENENV_REQUIREMENT = "openenv-core[core]==0.3.0"
CHECKOUT = Path(__file__).resolve().parents[2]
"""The repository root, when agentgym-opsd runs from a checkout (its pyproject.toml is there)."""


@dataclass(frozen=True)
class Package:
    """One environment folder: `name` (the folder's and OpenEnv's name), the environment it serves and the
    agentgym-opsd extras that environment needs."""

    name: str
    env_spec: str
    extras: tuple[str, ...] = ()


BUILTIN_PACKAGES = (
    Package("alfworld", "ALFWorld-v0", ("alfworld",)),
    Package("webshop", "WebShop-v0", ("webshop",)),
    Package("search_qa", "SearchQA-v0", ("search",)),
)


def package_files(package: Package, source: Path | None) -> dict[str, str]:
    """The folder's files (relative path -> text), uv.lock aside. `source`: the agentgym-opsd checkout the folder
    installs from, relative to the folder (None: from the index, which must then have agentgym-opsd)."""
    env_id, split = parse_env_spec(package.env_spec)
    profile = env_profile(env_id)  # an unknown id fails here
    title = env_id.rpartition("/")[2] + (f" (split {split})" if split else "")
    command = f"agentgym-opsd openenv-package {package.env_spec} DIR" + "".join(f" --extra {e}" for e in package.extras)
    requirement = "agentgym-opsd" + (f"[{','.join(package.extras)}]" if package.extras else "")
    uv_source = f'\n[tool.uv.sources]\nagentgym-opsd = {{ path = "{source.as_posix()}", editable = true }}\n' \
        if source is not None else ""
    return {
        "openenv.yaml": f"spec_version: 1\nname: {package.name}\ntype: space\nruntime: fastapi\n"
                        f"app: server.app:app\nport: 8000\n",
        "pyproject.toml": f'''# Written by `{command}`; regenerate rather than edit.
[build-system]
requires = ["setuptools>=77", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "openenv-{package.name.replace("_", "-")}"
version = "0.1.0"
description = "{title} from agentgym-opsd, served over OpenEnv"
requires-python = ">=3.11"
dependencies = ["{OPENENV_REQUIREMENT}", "{requirement}"]

[project.scripts]
server = "server.app:main"

[tool.setuptools]
packages = ["server"]

[tool.uv]
environments = ["sys_platform == 'linux' and platform_machine == 'x86_64'"]
{uv_source}''',
        "server/__init__.py": f'"""The OpenEnv server of {title}."""\n',
        "server/app.py": f'''"""OpenEnv's server for {title} (agentgym-opsd), written by `{command}`.

    uv run server [--port 8000] [--host 0.0.0.0]   # serve-openenv with its limits; the playground at /web/
    uvicorn server.app:app --port 8000             # OpenEnv's Docker command: the app's own checks only
"""

from agentgym_opsd.integrations.openenv_package import FolderServer

_server = FolderServer("{package.env_spec}", __file__)


def main(argv: list[str] | None = None) -> int:  # OpenEnv's `server` script (openenv validate looks for it)
    return _server.main(argv)


def __getattr__(name: str) -> object:
    return _server.attribute(name)  # `app`, built when uvicorn asks for it


if __name__ == "__main__":
    raise SystemExit(main())
''',
        "README.md": f"""# {title} for OpenEnv

{profile.description or env_id}

agentgym-opsd's `{env_id}` as an OpenEnv environment folder, written by `{command}` (regenerate rather than edit).

```bash
uv run server --port 8000         # the server; OpenEnv's web playground at http://127.0.0.1:8000/web/
openenv validate .                # OpenEnv's check of this folder
```

An action is the agent's reply as written (`{{"text": "..."}}`); the server parses it with the environment's own
parser. The observation carries the environment's text, the admissible actions, won / score and the chat prompt
agentgym-opsd's policies see. Its options are `agentgym-opsd serve-openenv --help`'s.
""",
    }


class FolderServer:
    """What an environment folder's `server/app.py` (at `app_file`) runs: `main(argv)` is `serve-openenv ENV
    --web ARGV`; `attribute("app")` the same app for `uvicorn server.app:app`, built on first use so that
    `uv run server`, which builds its own, makes the environment once. OpenEnv's own switches get defaults (a
    value set outside wins): the web playground on, the folder's README.md shown in it."""

    def __init__(self, env_spec: str, app_file: str) -> None:
        self.env_spec = env_spec
        os.environ.setdefault("ENABLE_WEB_INTERFACE", "true")
        os.environ.setdefault("ENV_README_PATH", str(Path(app_file).resolve().parents[1] / "README.md"))
        self._app: object | None = None

    def main(self, argv: Sequence[str] | None = None) -> int:
        from agentgym_opsd.integrations.openenv_server import main as serve_openenv

        return serve_openenv([self.env_spec, "--web", *(sys.argv[1:] if argv is None else argv)])

    def attribute(self, name: str) -> object:
        if name != "app":
            raise AttributeError(name)
        if self._app is None:
            from agentgym_opsd.integrations.openenv_env import SessionSettings
            from agentgym_opsd.integrations.openenv_server import create_app

            self._app = create_app(SessionSettings(self.env_spec))
        return self._app


def lock(folder: Path) -> bool:
    """`uv lock` in `folder` when uv is found (on PATH or beside this Python); False when it is not."""
    uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None:
        return False
    subprocess.run([uv, "lock", "--quiet"], cwd=folder, check=True)
    return True


def write_package(package: Package, folder: Path, *, source: Path | None = CHECKOUT, with_lock: bool = True,
                  force: bool = False) -> Path:
    """Write `package`'s files into `folder` under the output rule (`agentgym_opsd.outputs`): a new or empty
    folder, or one this command wrote; a folder holding other files is refused (OutputRefused, naming them) unless
    `force`, and a non-regular file where a package file goes never is replaced. `source`: the agentgym-opsd
    checkout to install from (None: the index). Returns the folder."""
    output = claim_folder(folder, "openenv-package", force=force)
    relative = Path(os.path.relpath(source.resolve(), folder.resolve())) if source is not None else None
    files = package_files(package, relative)
    for name in files:
        refuse_non_regular(folder / name)
    output.record({name.split("/")[0] for name in files})
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / name, text)
    if with_lock and not lock(folder):
        print(f"uv not found: run `uv lock` in {folder} (openenv validate needs uv.lock)", file=sys.stderr)
    output.record_written()
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="agentgym-opsd openenv-package", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("env", nargs="?", help="a registered environment, optionally with a split (ALFWorld-v0:easy)")
    ap.add_argument("dir", nargs="?", type=Path, help="the folder to write")
    ap.add_argument("--builtin", type=Path, metavar="DIR", help="write ALFWorld, WebShop and Search-QA into DIR/<name>")
    ap.add_argument("--name", help="OpenEnv's name of the environment (default: the folder's name)")
    ap.add_argument("--extra", action="append", default=[], help="an agentgym-opsd extra it needs (repeatable)")
    ap.add_argument("--source", type=Path, default=CHECKOUT if (CHECKOUT / "pyproject.toml").is_file() else None,
                    help="the agentgym-opsd checkout to install from (default: this one, if it is one)")
    ap.add_argument("--no-lock", action="store_true", help="do not run `uv lock`")
    ap.add_argument("--force", action="store_true",
                    help="write into a folder that holds other files (a file with a package file's name is replaced)")
    args = ap.parse_args(argv)
    if (args.builtin is None) == (args.env is None) or (args.env is None) != (args.dir is None):
        ap.error("give ENV DIR, or --builtin DIR")
    packages = [(p, args.builtin / p.name) for p in BUILTIN_PACKAGES] if args.builtin else \
        [(Package(args.name or args.dir.name, args.env, tuple(args.extra)), args.dir)]
    try:
        for package, folder in packages:
            write_package(package, folder, source=args.source, with_lock=not args.no_lock, force=args.force)
            print(f"{package.env_spec}: {folder}")
    except (RegistryError, OutputRefused) as exc:
        ap.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
