"""Imports run one way: environments know nothing of models, training or evaluation; the model layer knows
nothing of training or evaluation; evaluation knows nothing of training; the core knows none of them, nor
the serving and inspector sub-packages, which stand on the core alone (environments use serving's shared
HTTP helpers; the policy server, an entry point, wires a model into serving)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER_OF_FOLDER = {"environments": "environments", "skills": "skills", "models": "models",
                   "evaluation": "evaluation", "trainer": "trainer"}
# sub-packages of agentgym_opsd/ that are layers of their own (the rest of agentgym_opsd/ is the core)
LAYER_OF_SUBPACKAGE = {"serving": "serving", "inspector": "inspector"}
# entry points wire layers (paths under agentgym_opsd/)
CLI_MODULES = {"train.py", "evaluate.py", "__main__.py", "serving/policy_server.py", "inspector/__main__.py"}
FORBIDDEN = {
    # the core may name the built-in environments (the registry registers them on first use), nothing above
    "core": {"models", "evaluation", "trainer", "serving", "inspector"},
    "serving": {"environments", "skills", "models", "evaluation", "trainer", "inspector"},
    "inspector": {"environments", "skills", "models", "evaluation", "trainer", "serving"},
    "environments": {"models", "evaluation", "trainer", "inspector"},
    "skills": {"models", "evaluation", "trainer", "serving", "inspector"},
    "models": {"evaluation", "trainer"},
    "evaluation": {"trainer"},
}


def _layer_of_module(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "agentgym_opsd":
        return None
    if len(parts) == 1:
        return "core"
    return LAYER_OF_FOLDER.get(parts[1]) or LAYER_OF_SUBPACKAGE.get(parts[1], "core")


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _source_files() -> list[tuple[str, Path]]:
    files = [(LAYER_OF_FOLDER[folder], p) for folder in LAYER_OF_FOLDER for p in (ROOT / folder).rglob("*.py")]
    package = ROOT / "agentgym_opsd"
    for p in package.rglob("*.py"):
        rel = p.relative_to(package)
        if rel.as_posix() not in CLI_MODULES:
            files.append((LAYER_OF_SUBPACKAGE.get(rel.parts[0], "core") if len(rel.parts) > 1 else "core", p))
    return files


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_a_layer_above_it(layer: str) -> None:
    offences = []
    for own_layer, path in _source_files():
        if own_layer != layer:
            continue
        for name in _imported_modules(path):
            target = _layer_of_module(name)
            if target in FORBIDDEN[layer]:
                offences.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offences, "\n".join(offences)


def test_the_scan_sees_every_layer() -> None:
    seen = {layer for layer, _ in _source_files()}
    assert seen == set(LAYER_OF_FOLDER.values()) | set(LAYER_OF_SUBPACKAGE.values()) | {"core"}


def test_the_entry_points_exist() -> None:
    """Every exempted entry point exists: a stale name exempts nothing and hides where the entry point went."""
    missing = [rel for rel in CLI_MODULES if not (ROOT / "agentgym_opsd" / rel).is_file()]
    assert not missing, missing
