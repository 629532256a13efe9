"""Every Python package folder is listed in pyproject's explicit package list (the package-dir mapping
installs top-level folders under agentgym_opsd, so setuptools cannot discover them by itself)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"agentgym_opsd": "agentgym_opsd", "environments": "agentgym_opsd.environments",
          "skills": "agentgym_opsd.skills", "trainer": "agentgym_opsd.trainer", "evaluation": "agentgym_opsd.evaluation"}


def test_all_packages_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for folder, package in MAPPED.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if "__pycache__" in rel.parts or any(p.startswith(".") for p in rel.parts):
                continue
            found.add(".".join([package, *rel.parts]))
    assert found <= listed, f"add to pyproject [tool.setuptools] packages: {sorted(found - listed)}"


def test_skill_files_are_package_data():
    from agentgym_opsd.skills import builtin_library_folders

    for name, folder in builtin_library_folders().items():
        assert (folder / "general.md").is_file(), name
