"""Every Python package folder is listed in pyproject's explicit package list (the package-dir mapping
installs top-level folders under agentgym_opsd, so setuptools cannot discover them by itself)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"agentgym_opsd": "agentgym_opsd", "environments": "agentgym_opsd.environments",
          "skills": "agentgym_opsd.skills", "trainer": "agentgym_opsd.trainer", "evaluation": "agentgym_opsd.evaluation",
          "models": "agentgym_opsd.models"}


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


def test_the_mapping_covers_every_package_dir():
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert {package: folder for package, folder in dirs.items()} == {v: k for k, v in MAPPED.items() if k != "agentgym_opsd"} | {
        "agentgym_opsd": "agentgym_opsd"}


def test_a_built_wheel_holds_the_skill_files_presets_and_every_package(tmp_path):
    """Build the wheel as pip would and look inside: skill Markdown/YAML, presets and the ALFWorld data are
    package data, and every mapped package is there (an editable install would hide a missing entry)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("agentgym_opsd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for library in ("alfworld", "webshop", "search_qa"):
        assert f"agentgym_opsd/skills/{library}/skills.yaml" in names
        assert f"agentgym_opsd/skills/{library}/general.md" in names
    assert {f"agentgym_opsd/trainer/presets/{p.name}" for p in (ROOT / "trainer" / "presets").glob("*.yaml")} <= names
    for folder, package in MAPPED.items():
        assert f"{package.replace('.', '/')}/__init__.py" in names, folder
    for package in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]:
        assert f"{package.replace('.', '/')}/__init__.py" in names, package  # agentgym_opsd.serving, ...
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/")) for n in names)


def test_nothing_points_outside_the_repository():
    """Docs, docstrings, presets and scripts cite files in this repository only (docs/method.md, ...)."""
    outside = ["SPEC" + ".md", "GPU-" + "FACTS", "ENV-" + "FACTS", "../" + "shared", "/work" + "/"]
    skip = {".venv", ".venv-vllm", "build", "runs", ".cache", ".git", ".hypothesis", "node_modules"}
    offences = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if (path.suffix not in {".py", ".md", ".yaml", ".toml", ".sh", ".txt"} or not path.is_file()
                or skip & set(rel.parts) or any(p.endswith(".egg-info") for p in rel.parts)):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        offences += [f"{rel}: {word}" for word in outside if word in text]
    assert not offences, "\n".join(offences)
