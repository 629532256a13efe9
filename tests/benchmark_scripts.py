"""Loading a script of `benchmarks/` in a test, as it runs from there (its folder on `sys.path`, so it finds its
neighbours: `harness`, `render_results`, `experiments`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """`benchmarks/<name>.py` as the module `name` (registered in `sys.modules`, as an import would)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"no benchmark script {name!r} in {BENCHMARKS}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
