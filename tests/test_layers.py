"""Imports run one way: environments know nothing of models, training or evaluation; the model layer knows
nothing of training or evaluation; evaluation knows nothing of training; the core knows none of them, nor
the serving (the HTTP kit) and inspector sub-packages, which stand on the core alone (environments use the
HTTP kit; the policy server, in the model layer, serves a model with it); the integrations (OpenEnv, TRL)
stand on the core and the environments. Each entry point lives in the layer it wires, and the command group
(`agentgym_opsd/__main__.py`) names them without importing them, so no file is exempt. Imports
(function-level ones included) form no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER_OF_FOLDER = {"environments": "environments", "skills": "skills", "models": "models",
                   "evaluation": "evaluation", "trainer": "trainer"}
# sub-packages of agentgym_opsd/ that are layers of their own (the rest of agentgym_opsd/ is the core)
LAYER_OF_SUBPACKAGE = {"serving": "serving", "inspector": "inspector", "integrations": "integrations"}
FORBIDDEN = {
    # the core may name the built-in environments (the registry registers them on first use), nothing above
    "core": {"models", "evaluation", "trainer", "serving", "inspector", "integrations"},
    "serving": {"environments", "skills", "models", "evaluation", "trainer", "inspector", "integrations"},
    "inspector": {"environments", "skills", "models", "evaluation", "trainer", "serving", "integrations"},
    "environments": {"models", "evaluation", "trainer", "inspector", "integrations"},
    "skills": {"models", "evaluation", "trainer", "serving", "inspector", "integrations"},
    "integrations": {"models", "evaluation", "trainer", "inspector"},
    "models": {"evaluation", "trainer", "integrations"},
    "evaluation": {"trainer", "integrations"},
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


def _module_of_path(path: Path) -> str:
    """The dotted name a source file is installed as (the top-level folders live under `agentgym_opsd.`)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] != "agentgym_opsd":
        parts.insert(0, "agentgym_opsd")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_imports_form_no_cycle() -> None:
    """No module imports one that imports it back, even from inside a function: a cycle (as the env workers'
    and the Ray actors' modules once were) makes the import order matter and the modules one unit in
    disguise."""
    graph = {_module_of_path(p): p for _, p in _source_files()}
    edges = {name: sorted(m for m in _imported_modules(path) if m in graph and m != name)
             for name, path in graph.items()}
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    cycles: list[str] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for nxt in edges[name]:
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)


def test_every_command_lives_in_the_layer_it_wires() -> None:
    """The command group names each command's module; it exists, and `main(argv)` is its entry."""
    from agentgym_opsd.__main__ import FORWARDED

    for command, (module, _) in FORWARDED.items():
        parts = module.split(".")
        candidates = [ROOT.joinpath(*parts[1:]).with_suffix(".py"), ROOT.joinpath("agentgym_opsd", *parts[1:]).with_suffix(".py")]
        path = next((c for c in candidates if c.is_file()), None)
        assert path is not None, f"{command}: {module} not found"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), f"{command}: {module} has no main()"
