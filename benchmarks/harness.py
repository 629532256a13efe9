"""What the benchmark scripts share: a trainer built for measuring, a median timer, the process's peak memory.

Scripts run from `benchmarks/` (`python benchmarks/bench_X.py`), where this folder is on `sys.path`, and import
it as `harness`; tests that load a script put the folder on `sys.path` first.
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["MEASURING", "last_time_line", "make_trainer", "parse_time_report", "peak_rss_mb", "run_training",
           "time_line_threads", "timed", "train_command", "training_env"]

T = TypeVar("T")

MEASURING = ("trainer.backend=torch", "trainer.device=cpu", "trainer.progress=false", "trainer.tensorboard=false",
             "trainer.save_trajectories=false")
"""The overrides of a trainer built to be measured: plain torch on the CPU, no progress bars, no files kept."""

PHASE = re.compile(r"(?P<name>[a-z][a-z ]*?) (?P<minutes>\d+\.\d)(?:,| min)")
"""One phase of a run's `time:` line: `warm start 8.9,` or `other 0.4 min`."""


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


def training_env(threads: int = 0, cache: Path | None = None) -> dict[str, str]:
    """The environment of a training run a benchmark starts as a subprocess: this one's, offline (nothing may reach
    a hub), with `threads` > 0 torch threads and, where given, `cache` as the project's cache folder."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    if cache is not None:
        env["AGENTGYM_OPSD_CACHE"] = str(cache)
    return env


def train_command(python: str, config: str, run_dir: Path, overrides: Sequence[str] = ()) -> list[str]:
    """The CLI call that trains preset (or YAML) `config` into `run_dir` under `python`, without progress bars (its
    output goes to a log), with `overrides` last so they win."""
    return [python, "-m", "agentgym_opsd.train", "--config", config, f"trainer.output_dir={run_dir}",
            "trainer.progress=false", *overrides]


def run_training(argv: Sequence[str], env: dict[str, str], log: Path, *, what: str, cwd: Path | None = None) -> list[str]:
    """Run the training command `argv` to its end, its output in `log`; the log's lines. A failed run raises
    SystemExit naming `what`, with the log's last 20 lines."""
    with log.open("w", encoding="utf-8") as out:
        code = subprocess.run(list(argv), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    if code != 0:
        raise SystemExit(f"{what} exited {code}; its output: {log}\n" + "\n".join(lines[-20:]))
    return lines


def last_time_line(log: Path) -> str | None:
    """The last `time:` line a training run printed to `log` (its wall time per phase; a resumed run prints one
    per process), or None where the log is missing or has none."""
    if not log.is_file():
        return None
    times = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
             if line.startswith("time: ")]
    return times[-1] if times else None


def parse_time_report(line: str) -> dict[str, float]:
    """`time: 23.7 min in all (bfloat16, 2 threads): setup 0.3, warm start 8.9, ... other 0.4 min` -> minutes
    per phase, with "total"."""
    head, _, parts = line.partition("): ")
    total = float(head.split()[1])
    return {"total": total, **{m["name"].strip(): float(m["minutes"]) for m in PHASE.finditer(parts)}}


def time_line_threads(line: str | None) -> int | None:
    """The torch threads a `time:` line names (`(float32, 2 threads)` -> 2), None without a line."""
    if not line or " threads)" not in line:
        return None
    return int(line.split(" threads)")[0].rsplit(" ", 1)[-1])
