"""Data parallel on the CPU: `torchrun --nproc-per-node 2` (gloo) on `cpu-tiny` with the toy counter env, for
ZeRO stages 0, 2 and 3. One launch per stage serves every check of that stage:

- the ranks rolled out different tasks (from the union trajectory file and each trajectory's rank tag);
- after every step both ranks hold the same weights (a digest of the full weights, gathered under ZeRO-3);
- the step-1 loss, gradient norm and updated weights equal one process's `step_on` on the union of the
  recorded rollouts (the global token-mean normalisation, with uneven rows per rank: rank 1 drops turns, so
  it runs zero-weight padding passes);
- the checkpoint's `model/` (ZeRO-3: gathered from the shards) loads with plain `transformers` and gives
  the trainer model's log-probs;
- ZeRO-3 also runs the warm start (exported through the gathered weights), a validation, and, in two more
  launches, kill -9 of both ranks mid-step 2 then `--resume auto` ends on the same weights and metrics as
  the uninterrupted run.

Plus, without launching: checkpoints without our manifest, with files it does not list, or with a changed
pickle are refused before DeepSpeed reads anything; a checkpoint of 2 ranks does not resume on 1.
"""

from __future__ import annotations

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
from run_metrics import comparable, metrics_lines
from safetensors.torch import load_file

from agentgym_opsd.records import load_jsonl
from agentgym_opsd.trainer import checkpoint as ckpt
from agentgym_opsd.trainer.cli import main
from agentgym_opsd.trainer.config import load_config

TESTS = Path(__file__).parent
TORCHRUN = Path(sys.executable).with_name("torchrun")
PROBE = ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10])
# Small but with real structure: 2 tasks x 2 rollouts per step, 3 turns, 8 new tokens, micro-batches of 2 rows.
ARGS = ["--config", "cpu-tiny", "env.id=ToyCounter-v0", "trainer.total_steps=2", "trainer.save_every=1",
        "trainer.tensorboard=false", "rollout.max_new_tokens=8", "optim.micro_batch_rows=2"]
# ZeRO-3 also runs the warm start and a validation after step 2 (both on every rank, with gathered weights).
WARM = ["warm_start.steps=1", "warm_start.episodes=2", "warm_start.batch_rows=4", "warm_start.cache=off",
        "trainer.eval_every=2", "trainer.eval_episodes=2"]

# The child registers the toy env, then runs the real CLI with hooks that record what the test checks:
# a digest of each rank's full weights after every step, rank 1 keeping one turn of its last trajectory
# (so the ranks have different row counts), the log-probs of a probe sequence at the end, and (for the
# kill test) a long sleep at the start of one step.
CHILD = """
import hashlib, os, sys, time
from pathlib import Path
import torch
sys.path.insert(0, {tests!r})
from toy_envs import register_toy_envs
from agentgym_opsd.registry import register_skill_library
register_toy_envs()
register_skill_library("toy", Path({skills!r}), override=True)
from agentgym_opsd.trainer.loop import Trainer

def digest(trainer):
    h = hashlib.sha256()
    with trainer.session.trained.engine.full_weights():
        for name, p in sorted(trainer.session.trained.model.named_parameters()):
            h.update(name.encode())
            h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()

step, collect, train = Trainer.step, Trainer.collect, Trainer.train

def traced_step(self):
    if self.step_done + 1 == int(os.environ.get("DP_SLEEP_AT_STEP", "0")):
        time.sleep(300)
    out = step(self)
    folder = self.session.out / "probe"
    folder.mkdir(exist_ok=True)
    (folder / f"weights_step{{self.step_done}}_rank{{self.session.rank}}.txt").write_text(digest(self))
    return out

def uneven_collect(self):
    trajs = collect(self)
    if self.session.rank == 1:
        trajs[-1].turns = trajs[-1].turns[:1]
    return trajs

def probed_train(self):
    lines = train(self)
    trained = self.session.trained
    trained.model.eval()
    with trained.engine.full_weights():
        logp = trained.logprobs([{probe_prompt!r}], [{probe_response!r}])[0]
    if self.session.is_main:
        torch.save(logp, self.session.out / "probe" / "logprobs.pt")
    return lines

Trainer.step, Trainer.collect, Trainer.train = traced_step, uneven_collect, probed_train
from agentgym_opsd.trainer.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def _child_env(**extra: str) -> dict[str, str]:
    # The launch gets its own rendezvous: never this process's single-process variables.
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update({"DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1", **extra})
    return env


def _script(tmp: Path) -> Path:
    path = tmp / "dp_child.py"
    if not path.is_file():
        path.write_text(CHILD.format(tests=str(TESTS), skills=str(TESTS / "data" / "skills_small"),
                                     probe_prompt=PROBE[0], probe_response=PROBE[1]), encoding="utf-8")
    return path


def _torchrun(script: Path, args: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(script), *args],
                            env=_child_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)


def _kill_tree(proc: subprocess.Popen) -> int:
    """SIGKILL torchrun and every process under it (its workers run in their own process groups); returns
    how many workers there were."""
    import psutil  # a DeepSpeed dependency

    try:
        workers = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        workers = []
    for p in workers:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    if proc.poll() is None:
        proc.kill()
    return len(workers)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        out, _ = proc.communicate()
        pytest.fail(f"the 2-process run hung:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-4000:]
    return out


def _stage_args(zero: int, out: Path) -> list[str]:
    return [*ARGS, f"deepspeed.zero_stage={zero}", f"trainer.output_dir={out}", *(WARM if zero == 3 else [])]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, tuple[Path, float]]:
    """One uninterrupted 2-rank run per ZeRO stage (launched one after another: 2 cores)."""
    tmp = tmp_path_factory.mktemp("dp")
    script = _script(tmp)
    done = {}
    for zero in (0, 2, 3):
        out = tmp / f"zero{zero}"
        t0 = time.perf_counter()
        _finish(_torchrun(script, _stage_args(zero, out)))
        done[zero] = (out, time.perf_counter() - t0)
    return done


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 2, 3])
def test_two_ranks_split_the_tasks_and_stay_in_step(runs, zero) -> None:
    out, seconds = runs[zero]
    print(f"ZeRO-{zero}: 2-rank launch {seconds:.1f} s")
    lines = metrics_lines(out)
    assert [x["step"] for x in lines] == [1, 2] and all(x["ranks"] == 2.0 for x in lines)
    assert ("val/success_rate" in lines[1]) == (zero == 3)
    assert all(math.isfinite(x["loss"]) and math.isfinite(x["grad_norm"]) for x in lines)
    for step in (1, 2):
        trajs = load_jsonl(out / "trajectories" / f"step_{step:06d}.jsonl")
        by_rank: dict[int, set[int]] = {}
        for t in trajs:
            by_rank.setdefault(t.metadata["rank"], set()).add(t.group_id)
        # B = 2 tasks over 2 ranks: one whole group (both rollouts) each, different tasks, the step's two
        assert set(by_rank) == {0, 1} and by_rank[0].isdisjoint(by_rank[1])
        assert by_rank[0] | by_rank[1] == {2 * (step - 1), 2 * (step - 1) + 1}
        assert len(trajs) == 4 and all(len([t for t in trajs if t.group_id == g]) == 2 for g in by_rank[0] | by_rank[1])
        digests = [(out / "probe" / f"weights_step{step}_rank{r}.txt").read_text() for r in (0, 1)]
        assert digests[0] == digests[1], f"ZeRO-{zero}: the ranks' weights differ after step {step}"
    state = ckpt.load_trainer_state(out / "checkpoints" / "step_000002")
    assert state.world_size == 2 and state.task_cursor == 4 and len(state.rank_rng or []) == 2
    assert (out / "checkpoints" / "step_000002" / "deepspeed").is_dir() == (zero > 0)
    assert not list(out.glob("**/*.tmp")) and not list((out / "checkpoints").glob(".*"))


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 2, 3])
def test_the_loss_is_the_token_mean_over_both_ranks(runs, zero, toy_env_ids, tmp_path) -> None:
    """One process, `step_on` the union of the 2-rank run's step-1 rollouts: the same loss, gradient norm
    and updated weights (the union file holds rank 1's trajectory as trained, with its turns dropped)."""
    out, _ = runs[zero]
    model = str(out / "warm_start" / "model") if zero == 3 else "tiny-random"  # ZeRO-3 ran the warm start
    # plain torch AdamW in one process: what DeepSpeed's data parallel must reproduce
    cfg = load_config("cpu-tiny", [*ARGS[2:], "trainer.backend=torch", f"model.name_or_path={model}",
                                   f"trainer.output_dir={tmp_path / 'single'}"])
    from agentgym_opsd.trainer.loop import Trainer

    trainer = Trainer(cfg)
    try:
        union = load_jsonl(out / "trajectories" / "step_000001.jsonl")
        assert len(union) == 4 and sum(t.metadata["rank"] for t in union) == 2
        single, _ = trainer.step_on(union)
        two = metrics_lines(out)[0]
        for key in ("loss", "policy_loss", "kl", "entropy", "grad_norm", "num_rows", "response_tokens",
                    "success_rate", "invalid_action_rate", "turns_mean"):
            assert two[key] == pytest.approx(single[key], rel=1e-4, abs=1e-7), key
        # differences of two nearly equal log-prob sums: float noise of other padding is absolute, not relative
        for key in ("evidence_mean", "evidence_std", "advantage_mean", "seq_advantage_std"):
            assert two[key] == pytest.approx(single[key], abs=1e-5), key
        saved = load_file(str(out / "checkpoints" / "step_000001" / "model" / "model.safetensors"))
        mine = trainer.session.trained.model.state_dict()
        worst = max(float((mine[k].float() - v.float()).abs().max()) for k, v in saved.items())
        # AdamW's first step moves a weight by lr·g/(|g| + eps): where |g| is near eps (1e-8) a float-rounding
        # difference of a few % in g (another summation order: other micro-batches, two ranks) moves it by ~1e-6
        # (measured 1.0e-6 padded, 1.8e-6 packed, 2.4e-6 across the two layouts). A real error moves weights by
        # ~lr (1e-4); the bound is lr / 20.
        assert worst < 0.05 * cfg.optim.lr, f"ZeRO-{zero}: weights after step 1 differ from one process by {worst}"
    finally:
        trainer.close()


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 2, 3])
def test_the_exported_model_loads_with_transformers_and_gives_the_trainer_logprobs(runs, zero) -> None:
    from transformers import AutoModelForCausalLM

    out, _ = runs[zero]
    model = AutoModelForCausalLM.from_pretrained(str(out / "checkpoints" / "step_000002" / "model"))
    model.eval()
    ids = torch.tensor([PROBE[0] + PROBE[1]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(PROBE[0]) - 1:-1].float()
    exported = torch.log_softmax(logits, -1).gather(-1, torch.tensor(PROBE[1])[:, None])[:, 0]
    trained = torch.load(out / "probe" / "logprobs.pt")
    assert torch.allclose(exported, trained.float(), atol=1e-5), (exported, trained)
    if zero == 3:  # the warm-start export (gathered from the shards) is complete too
        weights = load_file(str(out / "warm_start" / "model" / "model.safetensors"))
        assert sum(v.numel() for v in weights.values()) == sum(p.numel() for p in model.parameters())


@pytest.mark.slow
def test_kill_both_ranks_then_resume_auto_ends_on_the_uninterrupted_weights(runs, tmp_path) -> None:
    straight, _ = runs[3]
    script = _script(tmp_path)
    out = tmp_path / "killed"
    args = _stage_args(3, out)
    t0 = time.perf_counter()
    proc = _torchrun(script, args, DP_SLEEP_AT_STEP="2")
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoints" / "step_000001" / "COMPLETE").is_file():
            if proc.poll() is not None:
                pytest.fail(f"the run ended before its first checkpoint:\n{proc.stdout.read()[-3000:]}")
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.1)
        time.sleep(1.0)  # both ranks are asleep at the start of step 2 now
        assert proc.poll() is None, "the run finished before it could be killed"
    finally:
        killed = _kill_tree(proc)  # both ranks (and torchrun), kill -9
        proc.communicate()
    assert killed >= 2
    assert ckpt.latest_checkpoint(out / "checkpoints").name == "step_000001"
    _finish(_torchrun(script, [*args, "--resume", "auto"]))
    print(f"ZeRO-3 kill + resume: {time.perf_counter() - t0:.1f} s")
    a, b = metrics_lines(out), metrics_lines(straight)
    assert [x["step"] for x in a] == [1, 2]
    assert [comparable(x) for x in a] == [comparable(x) for x in b]
    wa = load_file(str(out / "checkpoints" / "step_000002" / "model" / "model.safetensors"))
    wb = load_file(str(straight / "checkpoints" / "step_000002" / "model" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    for r in (0, 1):
        assert ((out / "probe" / f"weights_step2_rank{r}.txt").read_text()
                == (straight / "probe" / f"weights_step2_rank{r}.txt").read_text())


# ---- what DeepSpeed may unpickle --------------------------------------------------------------------------


class _Exploit:
    """Unpickling this would run a shell command (what a hostile DeepSpeed file can do)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.slow
def test_a_checkpoint_without_our_manifest_or_with_changed_files_is_refused(runs, tmp_path, toy_env_ids,
                                                                           capsys) -> None:
    source = runs[3][0] / "checkpoints" / "step_000002"
    resume = ["--config", "cpu-tiny", "env.id=ToyCounter-v0", "deepspeed.zero_stage=3",
              f"trainer.output_dir={tmp_path / 'out'}", "--resume"]

    intact = _copy(source, tmp_path / "intact")
    assert ckpt.verify_manifest(intact)["world_size"] == 2
    assert main([*resume, str(intact)]) == 2  # one process cannot continue two ranks' state
    assert "written by 2 process(es)" in capsys.readouterr().err

    bare = _copy(source, tmp_path / "bare")
    (bare / ckpt.MANIFEST).unlink()
    assert main([*resume, str(bare)]) == 2
    assert "no MANIFEST.json" in capsys.readouterr().err

    planted = _copy(source, tmp_path / "planted")
    marker = tmp_path / "pwned"
    torch.save({"x": _Exploit(str(marker))}, planted / "deepspeed" / "ds" / "mp_rank_00_model_states.pt")
    with pytest.raises(ckpt.CheckpointError, match="does not list"):
        ckpt.verify_manifest(planted)

    swapped = _copy(source, tmp_path / "swapped")
    target = next((swapped / "deepspeed" / "ds").glob("*optim_states.pt"))
    data = bytearray(target.read_bytes())
    data[-10] ^= 0xFF  # same size, other bytes
    target.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="SHA-256"):
        ckpt.verify_manifest(swapped)
    assert main([*resume, str(swapped)]) == 2
    assert "SHA-256" in capsys.readouterr().err
    assert not marker.exists()
