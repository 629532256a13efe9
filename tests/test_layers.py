"""Imports run one way: environments know nothing of models, training or evaluation; the model layer knows
nothing of training or evaluation; evaluation knows nothing of training; the core knows none of them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER_OF_FOLDER = {"environments": "environments", "skills": "skills", "models": "models",
                   "evaluation": "evaluation", "trainer": "trainer"}
CLI_MODULES = {"train.py", "evaluate.py", "serve_policy.py", "__main__.py", "inspect.py"}  # entry points wire layers
FORBIDDEN = {
    # the core may name the built-in environments (the registry registers them on first use), nothing above
    "core": {"models", "evaluation", "trainer"},
    "environments": {"models", "evaluation", "trainer"},
    "skills": {"models", "evaluation", "trainer"},
    "models": {"evaluation", "trainer"},
    "evaluation": {"trainer"},
}


def _layer_of_module(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "agentgym_opsd":
        return None
    return LAYER_OF_FOLDER.get(parts[1], "core") if len(parts) > 1 else "core"


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
    files += [("core", p) for p in (ROOT / "agentgym_opsd").glob("*.py") if p.name not in CLI_MODULES]
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
    assert seen == set(LAYER_OF_FOLDER.values()) | {"core"}
