"""TRL's `GRPOTrainer` trains on our episodes through `agentgym_opsd.integrations.trl`: two GRPO steps of a tiny
random model on each of our three environments, the episodes played with our prompts and parser, recorded in our JSONL format, and
handed to TRL as rows whose trained tokens are exactly the sampled ones. Without TRL: an episode packed into
TRL's one-row multi-turn layout, the cut of a `generate` row, the tasks read back from TRL's prompt groups."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from trl_settings import checkpointing_off

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.integrations.trl import (
    AgentGymRollout,
    _tasks_of,
    cut_completion,
    episode_won,
    invalid_action_penalty,
    pack_episode,
    task_dataset,
    task_prompts,
)
from agentgym_opsd.records import Trajectory, Turn, load_jsonl
from agentgym_opsd.registry import env_profile


@pytest.mark.parametrize("env_spec", ["ALFWorld-v0:easy", "WebShop-v0:train", "SearchQA-v0:train"])
def test_two_grpo_steps_train_on_our_recorded_episodes(env_spec: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("trl", reason="trl is not installed (pip install -e '.[integrations]')")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL 1.16
    from trl import GRPOConfig, GRPOTrainer

    from agentgym_opsd.models.loading import load_policy_model

    model, tokenizer = load_policy_model("tiny-random")
    # cpu-tiny-sized: one task x 2 rollouts per step, 2 turns of at most 8 tokens.
    args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2,
                      gradient_accumulation_steps=1, num_generations=2, max_completion_length=8,
                      generation_kwargs={"stop_strings": ["</action>"]}, learning_rate=1e-4, use_cpu=True, bf16=False,
                      **checkpointing_off(), report_to="none", logging_steps=1, save_strategy="no",
                      disable_tqdm=True, dataloader_pin_memory=False, shuffle_dataset=False, seed=0)
    record = tmp_path / "episodes.jsonl"
    rollout = AgentGymRollout(env_spec, record_path=record, env_kwargs={"max_turns": 2})
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=task_dataset(range(4)),
                          reward_funcs=[episode_won, invalid_action_penalty], rollout_func=rollout)
    try:
        trainer.train()
    finally:
        rollout.close()

    assert trainer.state.global_step == 2
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 2 and all("rewards/invalid_action_penalty/mean" in h for h in logged)

    episodes = load_jsonl(record)  # our format, read back through its checks
    assert [(t.group_id, t.traj_id, t.metadata["trl_global_step"]) for t in episodes] == \
        [(0, 0, 0), (0, 1, 0), (1, 2, 1), (1, 3, 1)]
    assert [t.task_id for t in episodes[:2]] == [episodes[0].task_id] * 2  # a GRPO group plays one task
    env_id = env_spec.split(":")[0]
    system_prompt = env_profile(env_id).system_prompt
    most_turns = 3 if env_id == "SearchQA-v0" else 2  # Search-R1's rule: max_turns searches, then the answer turn
    for traj in episodes:
        assert traj.env_id == f"agentgym_opsd/{env_id}" and 1 <= traj.num_turns <= most_turns and traj.task_text
        for turn in traj.turns:
            assert turn.prompt[0] == {"role": "system", "content": system_prompt}
            assert f"Task: {traj.task_text}" in turn.prompt[1]["content"]
            assert 1 <= len(turn.response_token_ids) == len(turn.response_logprobs) <= 8
            assert turn.action_valid or turn.invalid_reason  # random text: an invalid action, never a crash

    # What TRL trained on in the last step: the sampled tokens of the recorded episodes, in order, and only them.
    for traj, row, recorded in zip(rollout.last_episodes, rollout.last_rows, episodes[2:], strict=True):
        assert traj == recorded
        trained = [tok for tok, keep in zip(row.completion_ids, row.env_mask, strict=True) if keep]
        assert trained == [tok for turn in traj.turns for tok in turn.response_token_ids]
        assert len(row.logprobs) == len(row.completion_ids)


def _encode(messages: list[dict[str, str]]) -> list[int]:
    """A stand-in tokenizer: one id per character of the user message, offset so ids never look like actions."""
    return [1000 + ord(c) for c in messages[-1]["content"]]


def _turn(k: int, prompt: str, action_ids: list[int]) -> Turn:
    return Turn(index=k, prompt=[{"role": "system", "content": "s"}, {"role": "user", "content": prompt}],
                response_text="", action="go", action_valid=True, observation="", reward=0.0,
                response_token_ids=action_ids, response_logprobs=[-0.5 - i for i in range(len(action_ids))])


def test_pack_episode_trains_actions_in_order_and_masks_prompts() -> None:
    traj = Trajectory(env_id="e", task_id="t", task_type="x", group_id=0, traj_id=0, seed=0,
                      turns=[_turn(0, "ab", [1, 2, 3]), _turn(1, "cde", [4, 5]), _turn(2, "f", [6])])
    row = pack_episode(traj, _encode, filler_id=2)
    assert row.prompt_ids == _encode(traj.turns[0].prompt)
    assert row.completion_ids == [1, 2, 3, *_encode(traj.turns[1].prompt), 4, 5, *_encode(traj.turns[2].prompt), 6]
    assert len(row.env_mask) == len(row.logprobs) == len(row.completion_ids)
    trained = [t for t, m in zip(row.completion_ids, row.env_mask, strict=True) if m]
    assert trained == [1, 2, 3, 4, 5, 6]  # every sampled token, in order, and nothing else
    kept = [lp for lp, m in zip(row.logprobs, row.env_mask, strict=True) if m]
    assert kept == [lp for turn in traj.turns for lp in turn.response_logprobs]
    assert all(lp == 0.0 for lp, m in zip(row.logprobs, row.env_mask, strict=True) if not m)


def test_pack_episode_without_turns_trains_nothing() -> None:
    traj = Trajectory(env_id="e", task_id="t", task_type="x", group_id=0, traj_id=0, seed=0, error="reset failed")
    row = pack_episode(traj, _encode, filler_id=2)
    assert (row.prompt_ids, row.completion_ids, row.env_mask, row.logprobs) == ([2], [2], [0], [0.0])


def test_cut_completion_tells_a_stop_string_from_the_padding_after_it() -> None:
    vocab = {1: "<action>", 3: "go", 4: "</act", 5: "ion>", 6: "x", 2: "<eos>"}

    def decode(ids: list[int]) -> str:
        return "".join(vocab[i] for i in ids)

    stops = ("</action>",)
    # stopped by the closing tag; generate padded the row with pad == eos (2) afterwards
    assert cut_completion([1, 3, 4, 5, 2, 2], {2}, decode, stops) == ([1, 3, 4, 5], "stop")
    # the model ended its turn: the end-of-sequence token is kept (it is a sampled token)
    assert cut_completion([1, 3, 2, 2], {2}, decode, stops) == ([1, 3, 2], "eos")
    # the budget ran out
    assert cut_completion([1, 6, 6], {2}, decode, stops) == ([1, 6, 6], "length")


def test_prompts_must_come_in_groups_of_one_task_wherever_the_processes_cut_them() -> None:
    a, b = task_prompts([TaskSpec(7, {"task_index": 3}), 5])
    ta, tb = TaskSpec(7, {"task_index": 3}), TaskSpec(5, {"task_index": 5})
    assert _tasks_of([a, a, b, b], 2, first=0) == [ta, ta, tb, tb]
    # groups of 3 over two processes of 3 prompts: the second process holds a's last copy and b's group
    assert _tasks_of([a, b, b], 3, first=2) == [ta, tb, tb]
    assert _tasks_of([a], 2, first=1) == [ta]  # a group of 2 straddling two processes of one prompt each
    with pytest.raises(ValueError, match="groups of 2 identical"):
        _tasks_of([a, b], 2, first=0)
    with pytest.raises(ValueError, match="global positions 3, 4"):
        _tasks_of([a, b, a], 3, first=2)
    with pytest.raises(ValueError, match="task as JSON"):
        _tasks_of(["What is the capital of France?"] * 2, 2, first=0)


def test_an_unknown_environment_fails_when_the_adapter_is_made() -> None:
    from agentgym_opsd.registry import RegistryError

    with pytest.raises(RegistryError, match="unknown environment"):
        AgentGymRollout("NoSuchEnv-v0", record_path=os.devnull)


# A GRPO group straddling two processes: num_generations=2 with one prompt per process, the configuration TRL
# accepts (it only asks the global batch to divide) and that once made the adapter raise. Each rank records its
# own episodes; rank 0 also writes TRL's log.
TWO_PROCESS_CHILD = """
import json, os, sys
os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
from trl import GRPOConfig, GRPOTrainer
from agentgym_opsd.integrations.trl import AgentGymRollout, episode_won, task_dataset
from agentgym_opsd.models.loading import load_policy_model

out, rank = sys.argv[1], int(os.environ["RANK"])
model, tokenizer = load_policy_model("tiny-random")
sys.path.insert(0, sys.argv[2])  # tests/, for the settings the other TRL tests use
from trl_settings import checkpointing_off
args = GRPOConfig(output_dir=out, max_steps=2, per_device_train_batch_size=1, gradient_accumulation_steps=1,
                  num_generations=2, max_completion_length=8, generation_kwargs={"stop_strings": ["</action>"]},
                  learning_rate=1e-4, use_cpu=True, bf16=False, **checkpointing_off(), report_to="none",
                  logging_steps=1, save_strategy="no", disable_tqdm=True, dataloader_pin_memory=False,
                  shuffle_dataset=False, seed=0)
rollout = AgentGymRollout("ALFWorld-v0:easy", record_path=f"{out}/episodes-{rank}.jsonl", env_kwargs={"max_turns": 2})
trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=task_dataset(range(4)),
                      reward_funcs=[episode_won], rollout_func=rollout)
trainer.train()
rollout.close()
if rank == 0:
    with open(f"{out}/log.json", "w") as fh:
        json.dump(trainer.state.log_history, fh)
"""


def test_a_group_straddling_two_processes_is_played_by_both(tmp_path: Path) -> None:
    pytest.importorskip("trl", reason="trl is not installed (pip install -e '.[integrations]')")
    import json
    import subprocess
    import sys

    script = tmp_path / "child.py"
    script.write_text(TWO_PROCESS_CHILD, encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(tmp_path), str(Path(__file__).parent)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]

    logged = [h for h in json.loads((tmp_path / "log.json").read_text()) if "loss" in h]
    assert [h["step"] for h in logged] == [1, 2]
    rank0, rank1 = load_jsonl(tmp_path / "episodes-0.jsonl"), load_jsonl(tmp_path / "episodes-1.jsonl")
    # Each step's group of 2 is one copy on each rank: the same task, the same group id, global traj ids.
    assert [(t.group_id, t.traj_id) for t in rank0] == [(0, 0), (1, 2)]
    assert [(t.group_id, t.traj_id) for t in rank1] == [(0, 1), (1, 3)]
    assert [(t.task_id, t.seed) for t in rank0] == [(t.task_id, t.seed) for t in rank1]
    assert rank0[0].task_id != rank0[1].task_id


def test_the_same_seeded_episodes_in_process_and_through_a_server(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`AgentGymRollout(server_url=...)`: one GRPO step through TRL's trainer, from the same weights and seed, plays
    and records the same episodes on a running serve-openenv server as in this process (random replies: invalid
    actions, penalties and the turn limit included). Only `metadata` differs: the info a server never sends."""
    pytest.importorskip("trl", reason="trl is not installed (pip install -e '.[integrations]')")
    import copy
    import dataclasses

    from test_integrations_openenv import running

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    from agentgym_opsd.integrations.openenv_env import SessionSettings
    from agentgym_opsd.models.loading import load_policy_model

    spec = "ALFWorld-v0:easy"
    model, tokenizer = load_policy_model("tiny-random")
    weights = copy.deepcopy(model.state_dict())

    def one_step(name: str, **where: object) -> list[Trajectory]:
        model.load_state_dict(weights)
        args = GRPOConfig(output_dir=str(tmp_path / name), max_steps=1, per_device_train_batch_size=4,
                          gradient_accumulation_steps=1, num_generations=2, max_completion_length=8,
                          generation_kwargs={"stop_strings": ["</action>"]}, use_cpu=True, bf16=False,
                          **checkpointing_off(), report_to="none", save_strategy="no", disable_tqdm=True, dataloader_pin_memory=False,
                          shuffle_dataset=False, seed=0)
        rollout = AgentGymRollout(spec, record_path=tmp_path / f"{name}.jsonl", **where)  # type: ignore[arg-type]
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=task_dataset(range(4)),
                              reward_funcs=[episode_won], rollout_func=rollout)
        try:
            trainer.train()
        finally:
            rollout.close()
        return load_jsonl(tmp_path / f"{name}.jsonl")

    here = one_step("here", env_kwargs={"max_turns": 2})
    with running(SessionSettings(spec, max_turns=2)) as url:
        there = one_step("there", server_url=url)
    assert len(here) == 4 and sum(t.num_invalid_actions for t in here) > 0  # random replies: invalid ones too
    assert [dataclasses.replace(t, metadata={}) for t in here] == [dataclasses.replace(t, metadata={}) for t in there]
    assert [t.metadata["trl_global_step"] for t in there] == [0] * 4
    assert "game_path" in here[0].metadata and "game_path" not in there[0].metadata  # never sent by a server
