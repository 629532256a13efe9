"""Disk full during training: the real training command with its output folder on a small tmpfs.

Sizes (measured, cpu-tiny with the torch backend): one checkpoint is ~42 MB (model.safetensors 12.9 MB,
tokenizer 3.5 MB, trainer_state.pt 25.8 MB: the AdamW state), the rest of a 2-step run well under 1 MB. A
64 MiB tmpfs holds the step-1 checkpoint but not the step-2 one beside it (the older one is pruned only after
the new one is in place), so the run starts, trains, saves once and then runs out of space mid-save.

Needs `mount -t tmpfs` (root, and a container that allows it); skipped with the reason otherwise.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agentgym_opsd.trainer.checkpoint import COMPLETE, latest_checkpoint, load_trainer_state
from agentgym_opsd.trainer.cli import main

SMALL = "64M"  # > one checkpoint (~42 MB), < two
BIG = "256M"
ARGS = ["--config", "cpu-tiny", "env.id=ToyCounter-v0", "trainer.backend=torch", "trainer.tensorboard=false",
        "trainer.total_steps=2", "trainer.save_every=1"]


def _mount_error(folder: Path, size: str) -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "no mount/umount command"
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if proc.returncode:
        return f"mount -t tmpfs is not permitted here: {proc.stderr.strip() or proc.returncode}"
    return None


@contextmanager
def small_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    reason = _mount_error(folder, size)
    if reason:
        pytest.skip(reason)
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def remount(folder: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True, capture_output=True)


def test_disk_full_is_a_clear_error_and_resume_works(tmp_path, toy_env_ids, capsys) -> None:
    with small_tmpfs(tmp_path / "disk", SMALL) as disk:
        out = disk / "run"
        rc = main([*ARGS, f"trainer.output_dir={out}"])
        err = capsys.readouterr().err
        assert rc != 0, "the run fit on the small disk: checkpoints got smaller, lower SMALL_MB"
        # (1) One clear line naming the folder, not a traceback.
        assert "Traceback" not in err
        message = [x for x in err.splitlines() if "no space left" in x.lower()]
        assert len(message) == 1 and str(out) in message[0], err[-2000:]
        # (2) Nothing half-written that `--resume auto` would trust; no partial temp folder left behind.
        ckpts = out / "checkpoints"
        latest = latest_checkpoint(ckpts)
        assert latest is None or latest.name == "step_000001", latest
        if latest is not None:
            assert "step_000001" in message[0]  # the message says what was kept
            assert load_trainer_state(latest).step == 1
        assert not [p.name for p in ckpts.iterdir() if p.name.startswith(".")]  # no temporary folder
        # (3) The metric lines written before the failure are whole JSON lines.
        text = (out / "metrics.jsonl").read_text(encoding="utf-8")
        assert text.endswith("\n")
        lines = [json.loads(x) for x in text.splitlines()]
        assert [x["step"] for x in lines] in ([1], [1, 2])

        # What a save killed mid-write would leave: a partial temp folder, and a step folder without its
        # marker. Once there is space again, `--resume auto` ignores both and finishes the run.
        killed = subprocess.Popen(["true"])
        killed.wait()
        partial = ckpts / f".step_000002.{killed.pid}.0123abcd.tmp"  # its writer's pid: gone
        (partial / "model").mkdir(parents=True)
        (partial / "model" / "model.safetensors").write_bytes(b"\0" * 1000)
        (ckpts / "step_000003").mkdir()
        (ckpts / "step_000003" / "trainer_state.pt").write_bytes(b"cut")
        assert latest_checkpoint(ckpts) == latest
        remount(disk, BIG)
        assert main([*ARGS, f"trainer.output_dir={out}", "--resume", "auto"]) == 0
        final = latest_checkpoint(ckpts)
        assert final is not None and final.name == "step_000002" and (final / COMPLETE).is_file()
        assert load_trainer_state(final).step == 2
        assert not partial.exists()
        assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_metrics_line_cut_by_a_full_disk_is_removed(tmp_path) -> None:
    from agentgym_opsd.trainer.metrics import MetricsLog

    with small_tmpfs(tmp_path / "disk", "8k") as disk:
        log = MetricsLog(disk, lambda step, logged_through: [])
        written = 0
        with pytest.raises(OSError) as info:
            for step in range(1, 100):
                log.write({"note": "x" * 700}, step=step)
                written += 1
        assert info.value.errno == errno.ENOSPC
        text = log.path.read_text(encoding="utf-8")
        assert text.endswith("\n") and [json.loads(x)["step"] for x in text.splitlines()] == list(range(1, written + 1))


def test_is_disk_full_sees_through_library_wrappers(tmp_path) -> None:
    from agentgym_opsd.files import is_disk_full

    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(Exception("Error while serializing: I/O error: No space left on device (os error 28)"))
    try:  # torch.save to a file object: an opaque RuntimeError whose context is the OSError
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904
    except RuntimeError as exc:
        wrapped = exc
    assert is_disk_full(wrapped)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(RuntimeError("unexpected pos 704 vs 598"), tmp_path)  # plenty of space here
