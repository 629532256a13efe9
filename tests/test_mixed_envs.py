"""Mixed-environment training: `env.id` naming two environments with weights (the `cpu-tiny-mixed` preset,
its environments swapped for two toy counters whose profiles differ in system prompt, skill library, penalty
and turn budget). Groups never mix environments, ids are unique across them, each row is penalised by its own
environment, metrics / validation / pool check / credit records are per environment, a kill and
`--resume auto` continue the same task sequence, and a bad spec is an error naming `env.id`."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from run_metrics import assert_same_metrics

from agentgym_opsd.records import load_jsonl
from agentgym_opsd.registry import EnvProfile, env_profile, register_env
from agentgym_opsd.trainer.checkpoint import latest_checkpoint, load_trainer_state
from agentgym_opsd.trainer.cli import main
from agentgym_opsd.trainer.config import ConfigError, load_config, parse_env_mix
from agentgym_opsd.trainer.task_stream import env_draws, mixed_task_specs, train_task_specs
from agentgym_opsd.trainer.turn_batch import build_turn_batch
from agentgym_opsd.turns import is_penalised

TESTS = Path(__file__).parent
COUNTER, STRICT = "ToyCounter-v0:train", "ToyStrict-v0:train"
MIX = f"env.id={COUNTER}=0.5,{STRICT}=0.5"
BUDGET = {COUNTER: 10, STRICT: 4}  # the profiles' turn budgets (env.max_turns=0 keeps them)
PENALTY = {COUNTER: 0.1, STRICT: 0.05}
STRICT_PROMPT = "Strict counter. Reply with exactly one <action>inc</action> or <action>dec</action>."
ARGS = ["--config", "cpu-tiny-mixed", MIX, "env.max_turns=0", "trainer.backend=torch", "trainer.tensorboard=false",
        f"env.val_id={COUNTER.replace(':train', ':test')},{STRICT.replace(':train', ':test')}"]
# As in test_trainer_e2e: a child registers the toy environments, then runs the real CLI; its second step waits
# before the rollout, so the kill lands inside that step.
CHILD = (
    f"import sys, time; sys.path.insert(0, {str(TESTS)!r}); from test_mixed_envs import register_mixed_toys; "
    "register_mixed_toys(); from agentgym_opsd.trainer.loop import Trainer; collect = Trainer.collect; "
    "Trainer.collect = lambda self: (time.sleep(60) if self.step_done == 1 else None, collect(self))[1]; "
    "from agentgym_opsd.trainer.cli import main; raise SystemExit(main(sys.argv[1:]))"
)


def register_mixed_toys() -> None:
    """ToyCounter-v0 (tests/toy_envs.py: skill library `toy`, penalty 0.1, 10 turns) and ToyStrict-v0, the same
    game with another profile: its own system prompt, no skill library, penalty 0.05, 4 turns, history 1."""
    from toy_envs import register_toy_envs

    from agentgym_opsd.registry import load_skill_library, register_skill_library

    register_toy_envs()
    register_skill_library("toy", TESTS / "data" / "skills_small", override=True)
    load_skill_library("toy")
    register_env("ToyStrict-v0", "toy_envs:CounterEnv", override=True,
                 profile=EnvProfile(system_prompt=STRICT_PROMPT, history_turns=1, max_turns=4, skill_library=None,
                                    invalid_action_penalty=0.05, splits=("train", "test")))


@pytest.fixture(scope="module")
def toys() -> None:
    register_mixed_toys()


def lines_of(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# ---- the syntax ---------------------------------------------------------------------------------------------


def test_the_spec_syntax(toys) -> None:
    assert parse_env_mix("ToyCounter-v0") == [("ToyCounter-v0", 1.0)]
    assert parse_env_mix("A-v0:x=3, B-v0=1") == [("A-v0:x", 0.75), ("B-v0", 0.25)]
    assert parse_env_mix("A-v0,B-v0") == [("A-v0", 0.5), ("B-v0", 0.5)]  # no weights: equal shares
    cfg = load_config("cpu-tiny-mixed", [MIX, "env.val_id=ToyCounter-v0:test,ToyStrict-v0:test"])
    assert cfg.env.mix == [(COUNTER, 0.5), (STRICT, 0.5)]
    assert cfg.env.val_specs == ["ToyCounter-v0:test", "ToyStrict-v0:test"]
    assert load_config("cpu-tiny", ["env.id=ToyCounter-v0"]).env.mix == [("ToyCounter-v0", 1.0)]


@pytest.mark.parametrize("spec", [
    f"{COUNTER}=0.5,{STRICT}=abc",  # not a number
    f"{COUNTER}=0,{STRICT}=1",  # zero
    f"{COUNTER}=-1,{STRICT}=1",  # negative
    f"{COUNTER}=nan,{STRICT}=1",
    f"{COUNTER}=inf,{STRICT}=1",
    f"{COUNTER}=0.5,{STRICT}",  # a weight for some, not all
    f"{COUNTER},{COUNTER}",  # twice
    f"{COUNTER},,{STRICT}",  # an empty entry
    f"{COUNTER}=0.5,Nope-v0=0.5",  # not registered
])
def test_a_bad_mix_names_env_id(toys, spec, capsys) -> None:
    with pytest.raises(ConfigError, match=r"^env\.id: "):
        load_config("cpu-tiny-mixed", [f"env.id={spec}"])
    assert main(["--config", "cpu-tiny-mixed", f"env.id={spec}", "--print-config"]) == 2
    assert "config error: env.id: " in capsys.readouterr().err


def test_validation_lists_take_no_weights_and_the_warm_start_wants_one_env(toys) -> None:
    with pytest.raises(ConfigError, match=r"^env\.val_id: .*weight"):
        load_config("cpu-tiny-mixed", [MIX, "env.val_id=ToyCounter-v0:test=1,ToyStrict-v0:test=1"])
    with pytest.raises(ConfigError, match=r"^env\.val_id: .*Nope-v0"):
        load_config("cpu-tiny-mixed", [MIX, "env.val_id=ToyCounter-v0:test,Nope-v0"])
    with pytest.raises(ConfigError, match=r"^env\.id: the warm start plays one environment"):
        load_config("cpu-tiny-mixed", [MIX, "warm_start.steps=2"])


def test_print_config_round_trips_the_mix(toys, capsys, tmp_path) -> None:
    assert main(["--config", "cpu-tiny-mixed", MIX, "--print-config"]) == 0
    (tmp_path / "c.yaml").write_text(capsys.readouterr().out)
    assert load_config(str(tmp_path / "c.yaml")).env.mix == [(COUNTER, 0.5), (STRICT, 0.5)]
    assert load_config("cpu-tiny-mixed").env.id == "ALFWorld-v0:easy=0.5,WebShop-v0:train=0.5"


# ---- the task stream and the per-trajectory penalty -----------------------------------------------------------


def test_the_task_stream_over_environments() -> None:
    one = mixed_task_specs(6, 4, weights=[1.0], num_tasks=[5], seed=3, block=4)
    assert one == [(0, s) for s in train_task_specs(6, 4, num_tasks=5, seed=3)]  # one env: today's stream
    draws = env_draws(64, [0.75, 0.25], seed=1, block=16)
    assert (draws == env_draws(200, [0.75, 0.25], seed=1, block=16)[:64]).all()  # a prefix never changes
    assert [int((draws[i:i + 16] == 1).sum()) for i in range(0, 64, 16)] == [4] * 4  # each round: B·w each
    thirds = env_draws(3000, [1, 1, 1], seed=0, block=4)  # 4/3 each: rounded at random, exact on average
    assert all(abs(float((thirds == e).mean()) - 1 / 3) < 0.02 for e in range(3))
    # each environment walks its own task cycle: its k-th slot gets a one-environment run's k-th task
    stream = mixed_task_specs(0, 40, weights=[0.5, 0.5], num_tasks=[5, 7], seed=2, block=4)
    for e, n in enumerate((5, 7)):
        assert [s for i, s in stream if i == e] == train_task_specs(0, 20, num_tasks=n, seed=2)
    # a later window is the same as the whole stream's slice (what a resume relies on)
    assert mixed_task_specs(12, 8, weights=[0.5, 0.5], num_tasks=[5, 7], seed=2, block=4) == stream[12:20]


def test_each_trajectory_its_own_penalty(toys) -> None:
    from agentgym_opsd.records import Trajectory, Turn

    def traj(group: int, invalid: int) -> Trajectory:
        turns = [Turn(index=i, prompt=[{"role": "user", "content": "x"}], response_text="?",
                      response_token_ids=[5, 6], response_logprobs=[-1.0, -1.0], action="?", action_valid=False,
                      invalid_reason="no tag", observation="", reward=0.0) for i in range(invalid)]
        return Trajectory(env_id="e", task_id="t", task_type="", group_id=group, traj_id=group, seed=0,
                          turns=turns)

    trajs = [traj(0, 2), traj(1, 3)]
    assert all(is_penalised(t) for x in trajs for t in x.turns)
    for mode in ("trajectory", "turn"):
        same = build_turn_batch(trajs, encode_prompt=lambda m: [1], invalid_penalty=0.1,
                                penalty_mode=mode)
        listed = build_turn_batch(trajs, encode_prompt=lambda m: [1],
                                  invalid_penalty=[0.1, 0.1], penalty_mode=mode)
        assert same.traj_rewards.tolist() == listed.traj_rewards.tolist()
        mixed = build_turn_batch(trajs, encode_prompt=lambda m: [1],
                                 invalid_penalty=[0.1, 0.05], penalty_mode=mode)
        assert [r.turn_penalty for r in mixed.rows] == [0.1, 0.1, 0.05, 0.05, 0.05]
    assert mixed.traj_rewards.tolist() == [0.0, 0.0] and [r.penalty for r in mixed.rows][-1] == 0.05
    trajectory_mode = build_turn_batch(trajs, encode_prompt=lambda m: [1],
                                       invalid_penalty=[0.1, 0.05])
    assert trajectory_mode.traj_rewards.tolist() == pytest.approx([-0.2, -0.15])
    with pytest.raises(ValueError, match="2 trajectories"):
        build_turn_batch(trajs, encode_prompt=lambda m: [1], invalid_penalty=[0.1])


# ---- end to end ---------------------------------------------------------------------------------------------------


def test_a_mixed_cpu_tiny_run(toys, tmp_path) -> None:
    out = tmp_path / "run"
    assert main([*ARGS, f"trainer.output_dir={out}", "trainer.total_steps=2", "trainer.eval_every=2",
                 "env.num_train_tasks=2", "trainer.eval_pool_rollouts=1"]) == 0
    lines = lines_of(out / "metrics.jsonl")
    assert [x["step"] for x in lines] == [1, 2] and all(math.isfinite(x["loss"]) for x in lines)
    for line in lines:  # B = 4, weights 0.5 / 0.5: two groups of G = 2 from each environment every step
        assert line[f"train/{COUNTER}/episodes"] == line[f"train/{STRICT}/episodes"] == 4.0
        for spec in (COUNTER, STRICT):
            assert 0.0 <= line[f"train/{spec}/success_rate"] <= 1.0
            assert line[f"train/{spec}/turns_mean"] <= BUDGET[spec]
    val = lines[1]
    for spec in ("ToyCounter-v0:test", "ToyStrict-v0:test"):
        assert f"val/{spec}/success_rate" in val
    assert val["val/episodes"] == 2 * 2 and "val/success_rate" in val
    for spec in (COUNTER, STRICT):
        assert f"pool/{spec}/success_rate" in val
    assert val["pool/episodes"] == 2 * 2  # 2 pool games x 1 copy x 2 environments

    seen_groups: dict[int, str] = {}
    for step in (1, 2):
        trajs = load_jsonl(out / "trajectories" / f"step_{step:06d}.jsonl")
        credit = {x["traj_id"]: x for x in lines_of(out / "credit" / f"step_{step:06d}.jsonl")}
        assert len({t.traj_id for t in trajs}) == len(trajs) == 8 and set(credit) == {t.traj_id for t in trajs}
        groups = defaultdict(set)
        for t in trajs:
            spec = t.metadata["env_spec"]
            groups[t.group_id].add(spec)
            assert t.env_id == "agentgym_opsd/" + spec.split(":")[0]
            assert t.num_turns <= BUDGET[spec]  # each environment its own turn budget
            system = t.turns[0].prompt[0]["content"]
            assert system.startswith(env_profile(t.env_id).system_prompt)  # and its own system prompt
            assert (t.skill_context != "") == (spec == COUNTER)  # and its own skill library
            line = credit[t.traj_id]
            assert line["env_id"] == spec and line["group_id"] == t.group_id
            penalised = sum(is_penalised(turn) for turn in t.turns)
            assert line["reward"] == pytest.approx(float(t.won) - PENALTY[spec] * penalised, abs=1e-5)
        assert all(len(specs) == 1 for specs in groups.values())  # a group never mixes environments
        assert not set(groups) & set(seen_groups)  # group ids unique over the run, across environments
        seen_groups.update({g: next(iter(s)) for g, s in groups.items()})
    assert sorted(seen_groups) == list(range(8))  # the slots of the stream
    assert any(t.num_turns > BUDGET[STRICT] for t in load_jsonl(out / "trajectories" / "step_000001.jsonl")
               if t.metadata["env_spec"] == COUNTER)  # the random model never wins: a counter game runs past 4


def test_kill_then_resume_continues_the_same_task_sequence(toys, tmp_path) -> None:
    args = [*ARGS, "trainer.total_steps=2", "trainer.save_every=1"]
    killed = tmp_path / "killed"
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
        time.sleep(1.0)  # step 2 is running (waiting) now
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

    def sequence(run: Path, step: int) -> list[tuple]:
        return [(t.group_id, t.traj_id, t.metadata["env_spec"], t.task_id, t.seed)
                for t in load_jsonl(run / "trajectories" / f"step_{step:06d}.jsonl")]

    for step in (1, 2):
        assert sequence(killed, step) == sequence(straight, step)
    assert {x[2] for x in sequence(killed, 2)} == {COUNTER, STRICT}
    assert_same_metrics(killed, straight)
    state = load_trainer_state(killed / "checkpoints" / "step_000002")
    assert (state.step, state.task_cursor) == (2, 8)
