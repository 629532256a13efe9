"""A run killed while DeepSpeed JIT-compiled its CPU shared-memory op left torch's build `lock` behind, and every
later DeepSpeed run waited on it forever. One process no longer builds the op; several remove a dead build's lock."""

from __future__ import annotations

import importlib
import os
import time

import pytest

from agentgym_opsd.trainer import engine


@pytest.fixture
def build_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = engine.extension_build_dir(engine.SHM_OP_NAME)
    folder.mkdir(parents=True)
    return folder


def _age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_dead_builds_lock_is_removed(build_root) -> None:
    for name in ("lock", "shm.o", "build.ninja"):
        (build_root / name).write_text("")
        _age(build_root / name, engine.STALE_BUILD_S + 60)
    assert engine.remove_stale_build_lock(engine.SHM_OP_NAME)
    assert not (build_root / "lock").exists() and (build_root / "shm.o").exists()


def test_a_live_builds_lock_is_kept(build_root) -> None:
    (build_root / "lock").write_text("")
    _age(build_root / "lock", engine.STALE_BUILD_S + 60)
    (build_root / "shm.o").write_text("")  # the build wrote an object file just now: it is alive
    assert not engine.remove_stale_build_lock(engine.SHM_OP_NAME)
    assert (build_root / "lock").exists()


def test_no_lock_no_folder_nothing_to_do(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "absent"))
    assert not engine.remove_stale_build_lock(engine.SHM_OP_NAME)


def test_one_cpu_process_never_builds_the_shm_op(monkeypatch) -> None:
    deepspeed = pytest.importorskip("deepspeed")
    ds_torch = importlib.import_module("deepspeed.comm.torch")

    def refuse(self, *args, **kwargs):
        raise AssertionError("the shared-memory op was built for a single process")

    builder = deepspeed.accelerator.get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None:
        pytest.skip("this accelerator has no shared-memory op")
    monkeypatch.setattr(type(builder), "load", refuse)
    monkeypatch.setitem(deepspeed.ops.__compatible_ops__, engine.SHM_OP_NAME, True)
    engine.skip_cpu_shm_op()
    assert ds_torch.build_shm_op() is None
