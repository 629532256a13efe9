"""OpenEnv's package layout: the committed folders under examples/openenv/ are what `agentgym-opsd
openenv-package --builtin` writes, OpenEnv's own `openenv validate` passes on each, and a folder's
`server/app.py` serves its environment (OpenEnv's runtime validation passes on it, the web playground is on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="openenv-core is not installed (pip install -e '.[integrations]')")

from openenv.cli.__main__ import app as openenv_cli  # noqa: E402
from server_targets import ROOT, Target, request, start  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from agentgym_opsd.integrations.openenv_package import BUILTIN_PACKAGES, package_files  # noqa: E402

FOLDERS = ROOT / "examples" / "openenv"


def openenv_validate(*args: str) -> dict:
    """OpenEnv's `openenv validate ARGS` (its typer app, in this process: the CLI takes 7 s to import)."""
    result = CliRunner().invoke(openenv_cli, ["validate", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("package", BUILTIN_PACKAGES, ids=lambda p: p.name)
def test_the_committed_folder_is_what_the_command_writes(package) -> None:
    folder = FOLDERS / package.name
    for name, text in package_files(package, Path("../../..")).items():
        assert (folder / name).read_text(encoding="utf-8") == text, \
            f"{folder / name} is stale: run `agentgym-opsd openenv-package --builtin examples/openenv`"
    lock = (folder / "uv.lock").read_text(encoding="utf-8")
    assert f'name = "openenv-{package.name.replace("_", "-")}"' in lock and 'name = "openenv-core"' in lock


@pytest.mark.parametrize("package", BUILTIN_PACKAGES, ids=lambda p: p.name)
def test_openenv_validate_passes_on_the_folder(package) -> None:
    report = openenv_validate(str(FOLDERS / package.name), "--json")
    assert report["passed"] and report["issues"] == [] and report["environment"] == package.name


def test_the_folder_serves_its_environment_with_the_playground() -> None:
    app = Target("alfworld folder", (str(FOLDERS / "alfworld" / "server" / "app.py"),), "GET /health", None, 1 << 20)
    with start(app) as server:
        report = openenv_validate(server.url)
        assert report["passed"] and report["mode"] == "simulation", report["summary"]
        status, _, metadata = request(server, "GET", "/web/metadata")
        assert status == 200 and metadata["readme_content"].startswith("# ALFWorld-v0 for OpenEnv")
        status, _, observation = request(server, "POST", "/reset", b'{"seed": 0}')
        assert status == 200 and observation["observation"]["task_text"]
