"""What the benchmark scripts share: a trainer built for measuring, a median timer, the process's peak memory.

Scripts run from `benchmarks/` (`python benchmarks/bench_X.py`), where this folder is on `sys.path`, and import
it as `harness`; tests that load a script put the folder on `sys.path` first.
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["MEASURING", "make_trainer", "peak_rss_mb", "timed"]

T = TypeVar("T")

MEASURING = ("trainer.backend=torch", "trainer.device=cpu", "trainer.progress=false", "trainer.tensorboard=false",
             "trainer.save_trajectories=false")
"""The overrides of a trainer built to be measured: plain torch on the CPU, no progress bars, no files kept."""


def make_trainer(config: str, overrides: Sequence[str], output_dir: str) -> Any:
    """A `Trainer` of preset (or YAML) `config` writing to `output_dir`, with `MEASURING` and then `overrides`."""
    from agentgym_opsd.trainer.config import load_config
    from agentgym_opsd.trainer.loop import Trainer

    return Trainer(load_config(config, [f"trainer.output_dir={output_dir}", *MEASURING, *overrides]))


def timed(fn: Callable[[], T], repeats: int, *, warm_up: bool = True) -> tuple[float, T]:
    """The median seconds of `repeats` calls of `fn` (after one unmeasured call with `warm_up`: allocator, lazy
    initialisation) and the last call's result."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warm_up:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports `ru_maxrss` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_model() -> str:
    """`lscpu`'s model name (what `/proc/cpuinfo` calls it) with the CPU family, model number and the widest bf16
    instructions it has: results say which CPU they came from, since the same kind of machine has come as
    different processors, and one name can hide two (an AMD EPYC of family 25 came with AVX-512 BF16, where bf16
    matmuls ran 2x float32, and as model 1 with AVX2 alone, where they ran at 0.02x)."""
    from agentgym_opsd.models.precision import first_cpu

    info = first_cpu()
    name = info.get("model name", "unknown CPU")
    if "cpu family" not in info:
        return name
    return f"{name} (family {info['cpu family']} model {info.get('model', '?')}, {bf16_isa(info.get('flags', ''))})"


def bf16_isa(flags: str) -> str:
    """The instructions a CPU's bf16 matmuls can use, from its /proc/cpuinfo flags."""
    have = set(flags.split())
    if "amx_bf16" in have:
        return "AMX-BF16"
    if "avx512_bf16" in have:
        return "AVX512-BF16"
    if "avx512f" in have:
        return "AVX-512, no bf16 instructions"
    return "AVX2, no bf16 instructions" if "avx2" in have else "no AVX2"


def read_machines(path: Path) -> dict[str, Any]:
    """The per-CPU records already in `path` (`{"machines": {cpu: record}}`; an older single-machine file becomes
    its CPU's record): results that depend on the processor keep one record per CPU, side by side."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    if "machines" in data:
        return dict(data["machines"])
    return {data.get("cpu", "Intel Xeon (avx512_bf16 + avx512_fp16, no AMX; the record of the first bench)"): data}


def write_machine_record(path: Path, cpu: str, record: dict[str, Any]) -> None:
    """`record` as `cpu`'s entry of `path` (`read_machines`' layout), beside the other machines' entries."""
    machines = read_machines(path)
    machines[cpu] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machines": machines}, indent=2, allow_nan=False) + "\n")
