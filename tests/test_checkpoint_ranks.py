"""A checkpoint save over 2 CPU processes (gloo) where one rank fails (issue 22): every rank raises the same
CheckpointSaveError naming the failing rank, within a bounded time, and the last complete checkpoint is
still the one `--resume auto` picks.

The ranks are launched as plain processes (no torchrun, which would kill the healthy rank as soon as the
failing one exits, and so hide whether the healthy one gets out on its own): each saves step 1, then
step 2 with a failure planted on one rank, and writes what it raised to a file. With `linger`, the failing
rank then stays alive until the test has seen the other one exit (a failed rank that hangs on its way out).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_distributed import _child_env

from agentgym_opsd.trainer import checkpoint as ckpt

CHILD = """
import json, os, sys, time
from datetime import timedelta
from pathlib import Path
import torch.distributed
from agentgym_opsd.trainer import checkpoint as ckpt, engine

torch.distributed.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ["GROUP_TIMEOUT_S"])))
groups = [torch.distributed.group.WORLD]  # held, as DeepSpeed holds its groups
rank, mode, out = engine.rank(), os.environ["FAIL_MODE"], Path(sys.argv[1])
failing = 0 if mode == "commit" else 1
ranks = engine.checkpoint_ranks(timeout_s=float(os.environ["SAVE_TIMEOUT_S"]))


def save(step, save_model, save_extra=None):
    state = ckpt.TrainerState(step=step, task_cursor=step, warm_start_done=True, engine={}, rng={}, extra={},
                              world_size=2)
    return ckpt.save_checkpoint(out / "checkpoints", state, save_model=save_model, save_extra=save_extra,
                                config_yaml="x: 1\\n", ranks=ranks)


def weights(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{rank}.bin").write_bytes(b"w" * 64)


def planted(folder):  # step 2, mode "part" / "silent": rank 1 fails (or hangs) while writing its part
    weights(folder)
    if rank == failing and mode == "part":
        raise OSError(5, "planted write failure")
    if rank == failing and mode == "silent":
        time.sleep(8)


def shards(folder):  # mode "collective": as DeepSpeed's save_checkpoint, a barrier after the shards
    (folder / f"shard{rank}.pt").write_bytes(b"s" * 64)
    if rank == failing:
        raise RuntimeError("planted failure before the barrier")
    torch.distributed.barrier()  # rank 0 waits here for rank 1, which never comes


first = save(1, weights)
if mode == "commit" and rank == 0:
    def refuse(*args):
        raise OSError(28, "No space left on device")
    ckpt.write_manifest = refuse
t0 = time.monotonic()
try:
    save(2, planted, shards if mode == "collective" else None)
    outcome = {"raised": None}
except Exception as exc:
    outcome = {"raised": type(exc).__name__, "message": str(exc), "failed": getattr(exc, "failed", None)}
outcome.update(seconds=time.monotonic() - t0, first=first.name)
(out / f"rank{rank}.json").write_text(json.dumps(outcome))
if rank == failing and os.environ["LINGER"] == "1":  # stay alive, as a failed rank that hangs on its way out
    release = out / "release"
    while not release.exists() and time.monotonic() - t0 < 120:
        time.sleep(0.05)
os._exit(0 if outcome["raised"] is None else 1)  # no teardown: what the test checks is done
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp_path: Path, mode: str, *, linger: bool, timeout_s: float,
            group_timeout_s: float) -> dict[int, subprocess.Popen]:
    script = tmp_path / "child.py"
    script.write_text(CHILD, encoding="utf-8")
    env = _child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2", FAIL_MODE=mode,
                     SAVE_TIMEOUT_S=str(timeout_s), GROUP_TIMEOUT_S=str(group_timeout_s), LINGER=str(int(linger)))
    return {rank: subprocess.Popen([sys.executable, str(script), str(tmp_path)], env={**env, "RANK": str(rank)},
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for rank in (0, 1)}


def _wait(proc: subprocess.Popen, seconds: float, what: str) -> int:
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{what} did not exit within {seconds:g} s:\n{proc.communicate()[0][-3000:]}")
    return proc.returncode


PART = "rank 1 failed first (OSError: [Errno 5] planted write failure)"
BARRIER = "rank 1 failed first (RuntimeError: planted failure before the barrier); then rank 0 (RuntimeError: "
COMMIT = "rank 0 failed first (could not put the checkpoint in place: OSError: [Errno 28] No space left on device)"
SILENT = "rank 1 failed first (did not report within 3 s (hung, or killed))"


@pytest.mark.parametrize("mode, failing, linger, timeout_s, group_timeout_s, cause, within_s", [
    ("part", 1, True, 1800, 1800, PART, 30),
    ("collective", 1, False, 1800, 1800, BARRIER, 30),
    ("collective", 1, True, 1800, 15, BARRIER, 15 + 30),
    ("commit", 0, True, 1800, 1800, COMMIT, 30),
    ("silent", 1, True, 3, 1800, SILENT, 3 + 30),
], ids=["part", "collective-exits", "collective-lingers", "commit", "silent"])
def test_a_rank_failing_mid_save_stops_every_rank_with_its_name(tmp_path: Path, mode: str, failing: int,
                                                                linger: bool, timeout_s: float,
                                                                group_timeout_s: float, cause: str,
                                                                within_s: float) -> None:
    """part: rank 1 raises while writing its files, and stays alive: rank 0 learns it from the board at once.
    collective: rank 1 raises before a barrier that rank 0 already waits in (as inside DeepSpeed's
    save_checkpoint): rank 0 is released when rank 1's process exits, or, when it lingers, at the process
    group's timeout (15 s here), then names rank 1. commit: rank 0 runs out of space writing the manifest.
    silent: rank 1 hangs past the save timeout (3 s). Both ranks name the same rank first; step 1 stays the
    latest checkpoint."""
    procs = _launch(tmp_path, mode, linger=linger, timeout_s=timeout_s, group_timeout_s=group_timeout_s)
    healthy = 1 - failing
    try:
        assert _wait(procs[healthy], 120, f"the healthy rank {healthy}") == 1, procs[healthy].communicate()[0]
        if linger:
            assert procs[failing].poll() is None, "the failing rank exited before the test released it"
            (tmp_path / "release").touch()
        assert _wait(procs[failing], 60, f"the failing rank {failing}") == 1
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)}
    for rank, result in results.items():
        assert result["first"] == "step_000001"
        assert result["raised"] == "CheckpointSaveError", result
        # the failing rank does not wait for a rank blocked in a collective with it; a late (silent) rank may
        # find the board gone with rank 0, which hosts it, and says why it is late
        said = ("rank 1 failed first (took" if mode == "silent" and rank == failing
                else cause.split("; then")[0] if rank == failing else cause)
        assert result["message"].startswith(f"checkpoint step_000002 was not saved: {said}"), result["message"]
        assert result["message"].endswith("Nothing was put in place; the latest complete checkpoint is still "
                                          "step_000001")
        assert next(iter(result["failed"])) == str(failing)
    assert results[healthy]["seconds"] < within_s, results[healthy]
    if mode == "collective" and linger:  # held until the group's timeout, not released earlier
        assert results[healthy]["seconds"] >= group_timeout_s - 1
    root = tmp_path / "checkpoints"
    assert ckpt.latest_checkpoint(root) == root / "step_000001"
    assert not (root / "step_000002").exists()
    assert ckpt.load_trainer_state(root / "step_000001").step == 1
    assert ckpt.verify_manifest(root / "step_000001")["world_size"] == 2
    if mode != "silent":  # a silent rank may write after rank 0 gave up; the next run's save removes that
        assert not list(root.glob(".*"))  # no temporary folder, nor a step folder moved aside


def test_ranks_refuse_settings_that_cannot_work() -> None:
    with pytest.raises(ValueError, match="needs a board"):
        ckpt.Ranks(rank=1, world_size=2)
    with pytest.raises(ValueError, match="rank 2 is not one of 0..1"):
        ckpt.Ranks(rank=2, world_size=2, board=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s"):
        ckpt.Ranks(timeout_s=0)


def test_the_training_command_reports_a_failed_save_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """`agentgym_opsd.train` on a rank whose save failed: exit status 2 and the error's one line, no traceback;
    when the failing rank ran out of space, the disk-full line (status 3), as in a single process."""
    from agentgym_opsd.trainer import cli as train
    from agentgym_opsd.trainer import loop

    raised: list[Exception] = []

    class FailingSave:
        is_main = True

        def __init__(self, cfg, resume=None, force=False) -> None:
            pass

        def train(self):
            raise raised[0]

        def close(self) -> None:
            pass

    monkeypatch.setattr(loop, "Trainer", FailingSave)
    argv = ["--config", "cpu-tiny", f"trainer.output_dir={tmp_path / 'run'}"]
    raised.append(ckpt.CheckpointSaveError("checkpoint step_000002 was not saved: rank 1 failed first (OSError: "
                                           "[Errno 5] planted)", {1: "OSError: [Errno 5] planted"}))
    assert train.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"checkpoint error: {raised[0]}"
    raised[0] = ckpt.CheckpointSaveError("checkpoint step_000002 was not saved: rank 1 failed first (OSError: "
                                         "[Errno 28] No space left on device while writing checkpoint "
                                         "step_000002)", {1: "OSError: [Errno 28] No space left on device"})
    assert train.main(argv) == 3
    assert capsys.readouterr().err.startswith("error: no space left on device in ")
