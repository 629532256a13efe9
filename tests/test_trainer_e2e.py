"""End to end: the 2-step `cpu-tiny` training (DeepSpeed on the CPU), kill -9 then `--resume auto`,
corrupt checkpoints, and the supervised warm start. The toy counter env stands in for ALFWorld so the
tests do not depend on game generation."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from run_metrics import assert_same_metrics, metrics_lines
from safetensors.torch import load_file

from agentgym_opsd.trainer.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_trainer_state,
    write_manifest,
)
from agentgym_opsd.trainer.cli import main
from agentgym_opsd.trainer.metrics import METRIC_KEYS

TESTS = Path(__file__).parent
TOY = ["env.id=ToyCounter-v0"]
# A child process registers the toy env the way a plugin would, then runs the real CLI. Its second step is
# slowed down (a sleep before the rollout), so the kill surely lands inside that step, however fast the toy is.
CHILD = (
    "import sys, time; sys.path.insert(0, {tests!r}); from pathlib import Path; from toy_envs import register_toy_envs; "
    "from agentgym_opsd.registry import register_skill_library; register_toy_envs(); "
    "register_skill_library('toy', Path({skills!r}), override=True); "
    "from agentgym_opsd.trainer.loop import Trainer; collect = Trainer.collect; "
    "Trainer.collect = lambda self: (time.sleep(60) if self.step_done == 1 else None, collect(self))[1]; "
    "from agentgym_opsd.trainer.cli import main; raise SystemExit(main(sys.argv[1:]))"
).format(tests=str(TESTS), skills=str(TESTS / "data" / "skills_small"))


def test_cpu_tiny_two_steps_with_deepspeed(tmp_path, toy_env_ids) -> None:
    out = tmp_path / "run"
    assert main(["--config", "cpu-tiny", *TOY, f"trainer.output_dir={out}", "trainer.total_steps=2"]) == 0
    lines = metrics_lines(out)
    assert [x["step"] for x in lines] == [1, 2]
    for line in lines:
        assert set(METRIC_KEYS) <= set(line)
        assert math.isfinite(line["loss"])  # logged and finite
    assert (out / "config.yaml").is_file() and list((out / "tensorboard").iterdir())
    assert (out / "trajectories" / "step_000002.jsonl").is_file()
    ckpt = latest_checkpoint(out / "checkpoints")
    assert ckpt is not None and ckpt.name == "step_000002"
    state = load_trainer_state(ckpt)
    assert state.step == 2 and state.task_cursor == 4
    # The parameters moved away from the initial tiny random model.
    from agentgym_opsd.models.loading import load_policy_model

    init, _ = load_policy_model("tiny-random")
    trained = load_file(str(ckpt / "model" / "model.safetensors"))
    assert any(not torch.equal(p, trained[n]) for n, p in init.state_dict().items() if n in trained)


def test_kill_during_step_then_resume_is_exact(tmp_path, toy_env_ids) -> None:
    args = ["--config", "cpu-tiny", *TOY, "trainer.total_steps=2", "trainer.save_every=1", "trainer.tensorboard=false"]
    killed = tmp_path / "killed"
    # The child is its own single-process job: it must not inherit this process's rendezvous (its port is taken).
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *args, f"trainer.output_dir={killed}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (killed / "checkpoints" / "step_000001" / "COMPLETE").is_file():
            if proc.poll() is not None:
                pytest.fail(f"the training process ended before its first checkpoint: {proc.stderr.read()[-2000:]}")
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
        time.sleep(1.0)  # step 2 is running now
        assert proc.poll() is None, "the run finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert latest_checkpoint(killed / "checkpoints").name == "step_000001"
    assert main([*args, f"trainer.output_dir={killed}", "--resume", "auto"]) == 0

    straight = tmp_path / "straight"
    assert main([*args, f"trainer.output_dir={straight}"]) == 0
    assert [x["step"] for x in metrics_lines(killed)] == [1, 2]
    assert_same_metrics(killed, straight)
    wa = load_file(str(killed / "checkpoints" / "step_000002" / "model" / "model.safetensors"))
    wb = load_file(str(straight / "checkpoints" / "step_000002" / "model" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    sa = load_trainer_state(killed / "checkpoints" / "step_000002")
    sb = load_trainer_state(straight / "checkpoints" / "step_000002")
    assert (sa.step, sa.task_cursor) == (sb.step, sb.task_cursor) == (2, 4)


def test_corrupt_checkpoint_is_a_clear_error(tmp_path, toy_env_ids, capsys) -> None:
    out = tmp_path / "run"
    assert main(["--config", "cpu-tiny", *TOY, f"trainer.output_dir={out}", "trainer.total_steps=1",
                 "trainer.backend=torch", "trainer.tensorboard=false"]) == 0
    ckpt = latest_checkpoint(out / "checkpoints")
    damaged = tmp_path / "damaged" / ckpt.name  # the same checkpoint with its weights cut in half
    shutil.copytree(ckpt, damaged)
    weights = damaged / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert main(["--config", "cpu-tiny", *TOY, f"trainer.output_dir={out}", "trainer.total_steps=2",
                 "trainer.backend=torch", "--resume", str(damaged)]) == 2
    err = capsys.readouterr().err
    assert "corrupt" in err and "model/model.safetensors" in err  # its manifest names the damaged file
    (ckpt / "trainer_state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_trainer_state(ckpt)
    assert main(["--config", "cpu-tiny", *TOY, f"trainer.output_dir={out}", "trainer.total_steps=2",
                 "trainer.backend=torch", "--resume", "auto"]) == 2
    assert "corrupt" in capsys.readouterr().err
    assert main(["--config", "cpu-tiny", *TOY, f"trainer.output_dir={out}", "--resume", str(tmp_path / "nope")]) == 2


@pytest.mark.slow
def test_warm_start_teaches_the_action_format(tmp_path, toy_env_ids) -> None:
    out = tmp_path / "ws"
    assert main(["--config", "cpu-tiny", *TOY, f"trainer.output_dir={out}", "trainer.total_steps=1",
                 "trainer.backend=torch", "trainer.tensorboard=false", "warm_start.steps=40",
                 "warm_start.episodes=5", "warm_start.lr=3e-3", "warm_start.batch_rows=8", "env.max_turns=3",
                 "warm_start.cache=off"]) == 0
    summary = json.loads((out / "warm_start" / "summary.json").read_text())
    assert summary["warm_start/loss_last"] < 0.25 * summary["warm_start/loss_first"]
    line = metrics_lines(out)[0]
    assert line["invalid_action_rate"] < 1.0  # the random model was invalid on every turn before
    state = load_trainer_state(latest_checkpoint(out / "checkpoints"))
    assert state.warm_start_done


class _Exploit:
    """Unpickling this would run a shell command (what a hostile trainer_state.pt can do)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path, toy_env_ids, capsys) -> None:
    out = tmp_path / "run"
    assert main(["--config", "cpu-tiny", *TOY, f"trainer.output_dir={out}", "trainer.total_steps=1",
                 "trainer.backend=torch", "trainer.tensorboard=false"]) == 0
    ckpt = latest_checkpoint(out / "checkpoints")
    marker = tmp_path / "pwned"
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    state["extra"] = {"payload": _Exploit(str(marker))}
    torch.save(state, ckpt / "trainer_state.pt")
    write_manifest(ckpt, step=1, world_size=1)  # as whoever can write the folder could: past the hashes
    assert main(["--config", "cpu-tiny", *TOY, f"trainer.output_dir={out}", "trainer.total_steps=2",
                 "trainer.backend=torch", "trainer.tensorboard=false", "--resume", "auto"]) == 2
    assert "refusing" in capsys.readouterr().err
    assert not marker.exists()


def test_resume_auto_without_a_checkpoint_starts_the_metrics_over(tmp_path, toy_env_ids) -> None:
    out = tmp_path / "run"
    args = ["--config", "cpu-tiny", *TOY, f"trainer.output_dir={out}", "trainer.total_steps=2", "trainer.save_every=0",
            "trainer.backend=torch", "trainer.tensorboard=false"]
    assert main(args) == 0
    for ckpt in (out / "checkpoints").iterdir():
        (ckpt / "COMPLETE").unlink()  # as if every save had been cut short
    assert main([*args, "--resume", "auto"]) == 0
    assert [x["step"] for x in metrics_lines(out)] == [1, 2]
    kept = list(out.glob("metrics.*.jsonl"))
    assert len(kept) == 1 and [json.loads(x)["step"] for x in kept[0].read_text().splitlines()] == [1, 2]


def test_a_folder_that_is_not_a_run_is_refused_untouched(tmp_path, toy_env_ids, capsys) -> None:
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "config.yml").write_text("someone else's file")
    (out / "notes.txt").write_text("keep me")
    before = sorted(p.name for p in out.iterdir())
    assert main(["--config", "cpu-tiny", *TOY, f"trainer.output_dir={out}", "trainer.backend=torch"]) == 2
    err = capsys.readouterr().err
    assert "not a train output" in err and "notes.txt" in err
    assert sorted(p.name for p in out.iterdir()) == before and (out / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    assert main(["--config", "cpu-tiny", *TOY, f"trainer.output_dir={tmp_path / 'file'}"]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_kill_before_the_first_checkpoint_then_resume_auto_starts_clean(tmp_path, toy_env_ids) -> None:
    args = ["--config", "cpu-tiny", *TOY, "trainer.total_steps=2", "trainer.save_every=1", "trainer.tensorboard=false"]
    killed = tmp_path / "killed"
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    slow_first_step = CHILD.replace("self.step_done == 1", "self.step_done == 0")
    proc = subprocess.Popen([sys.executable, "-c", slow_first_step, *args, f"trainer.output_dir={killed}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (killed / "config.yaml").is_file():  # written at the end of set-up: step 1 is next
            if proc.poll() is not None:
                pytest.fail(f"the training process ended during set-up: {proc.stderr.read()[-2000:]}")
            assert time.monotonic() < deadline, "no run folder within 300 s"
            time.sleep(0.05)
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert latest_checkpoint(killed / "checkpoints") is None
    assert main([*args, f"trainer.output_dir={killed}", "--resume", "auto"]) == 0
    straight = tmp_path / "straight"
    assert main([*args, f"trainer.output_dir={straight}"]) == 0
    assert [x["step"] for x in metrics_lines(killed)] == [1, 2]
    assert_same_metrics(killed, straight)
