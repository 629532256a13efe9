"""TRL's `environment_factory` on our environments (`agentgym_opsd.integrations.trl_tools`): two GRPO steps through
TRL's own trainer on each environment, the model calling the `act` tool, every episode recorded in our format.

The model is our tiny random Llama with TRL's own Qwen3 chat template (shipped in `trl/chat_templates`, so no
download; SmolLM2's tokenizer already has its `<|im_start|>`/`<|im_end|>` tokens). A random model writes no tool
call, so transformers' `sequence_bias` (a generation setting TRL passes through) steers it to write
`<tool_call>{"name": "act", ...}</tool_call>` after each assistant header: TRL then parses, calls, masks and
trains as it would for any model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trl_settings import checkpointing_off

from agentgym_opsd.integrations.trl_tools import AgentGymToolEnv, AgentGymToolEnvFactory, tool_task_dataset
from agentgym_opsd.records import load_jsonl
from agentgym_opsd.registry import env_profile

ACTIONS = {"ALFWorld-v0:easy": ("look", "look"), "WebShop-v0:train": ("search[running shoes]", "search[running shoes]"),
           "SearchQA-v0:train": ("<search>who wrote it</search>", "<search>who wrote it</search>")}
"""Per environment: the tool argument the model is steered to write, and the action the environment plays."""
COMPLETION_TOKENS = {"WebShop-v0:train": 2048}
"""TRL drops a tool result that would pass max_completion_length: WebShop's result pages need 2,048 tokens; the
others fit in 512 (a third of the time)."""


def tool_call_bias(tokenizer: object, argument: str) -> list[list[object]]:
    """`sequence_bias` entries that make every assistant turn the call `act(action=argument)`: each next token of
    the call, keyed on the assistant header and the call so far (so nothing else is touched)."""
    call = "<tool_call>\n" + json.dumps({"name": "act", "arguments": {"action": argument}}) + "\n</tool_call><|im_end|>"
    head = tokenizer("<|im_start|>assistant\n", add_special_tokens=False).input_ids  # type: ignore[operator]
    ids = tokenizer(call, add_special_tokens=False).input_ids  # type: ignore[operator]
    return [[head + ids[:k + 1], 100.0] for k in range(len(ids))]


@pytest.mark.parametrize("env_spec", list(ACTIONS))
def test_two_grpo_steps_through_environment_factory(env_spec: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("trl", reason="trl is not installed (pip install -e '.[integrations]')")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is "experimental" in TRL 1.16
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template

    from agentgym_opsd.models.loading import load_policy_model

    model, tokenizer = load_policy_model("tiny-random")
    tokenizer.chat_template = qwen3_chat_template
    argument, action = ACTIONS[env_spec]
    record = tmp_path / "episodes.jsonl"
    factory = AgentGymToolEnvFactory(env_spec, record_path=record, max_turns=2, use_skills=True, group_size=2)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2,
                      gradient_accumulation_steps=1, num_generations=2,
                      max_completion_length=COMPLETION_TOKENS.get(env_spec, 512),
                      max_tool_calling_iterations=2, generation_kwargs={"sequence_bias": tool_call_bias(tokenizer, argument)},
                      learning_rate=1e-4, use_cpu=True, bf16=False, **checkpointing_off(), report_to="none",
                      logging_steps=1, save_strategy="no", disable_tqdm=True, dataloader_pin_memory=False,
                      shuffle_dataset=False, seed=0)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=tool_task_dataset(range(4)),
                          environment_factory=factory)  # no reward_funcs: the environment's get_reward is the reward
    trainer.train()

    assert trainer.state.global_step == 2
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["tools/call_frequency"] for h in logged] == [2.0, 2.0]  # both tool calls of each rollout ran
    assert all(h["tools/failure_frequency"] == 0.0 for h in logged)

    episodes = load_jsonl(record)  # our format, read back through its checks
    assert [(t.group_id, t.traj_id, t.seed) for t in episodes] == [(0, 0, 0), (0, 1, 0), (1, 2, 1), (1, 3, 1)]
    for step, h in enumerate(logged):  # the logged reward is the recorded outcome
        assert h["rewards/AgentGymToolEnv/mean"] == pytest.approx(sum(t.won for t in episodes[2 * step:2 * step + 2]) / 2)
    system_prompt = env_profile(env_spec.split(":")[0]).system_prompt
    for traj in episodes:
        assert traj.task_text and traj.skill_context  # c+ recorded, never shown to the model
        assert [turn.index for turn in traj.turns] == [0, 1]  # turn boundaries: one turn per tool call
        for turn in traj.turns:
            assert (turn.response_text, turn.action, turn.action_valid) == (argument, action, True)
            assert turn.prompt[0] == {"role": "system", "content": system_prompt}
            assert f"Task: {traj.task_text}" in turn.prompt[1]["content"]
        assert traj.total_reward == pytest.approx(sum(turn.reward for turn in traj.turns))


def test_tool_env_takes_a_bare_action_or_a_reply_and_exposes_one_tool(tmp_path: Path) -> None:
    import inspect

    factory = AgentGymToolEnvFactory("ALFWorld-v0:easy", record_path=tmp_path / "e.jsonl")
    env = factory()
    # TRL's rule (GRPOTrainer.__init__): every public function on the class but reset/get_reward is a tool.
    tools = [n for n, _ in inspect.getmembers(AgentGymToolEnv, inspect.isfunction)
             if not n.startswith("_") and n not in ("reset", "get_reward")]
    assert tools == ["act"]
    first = env.reset(task=json.dumps({"seed": 3, "options": {"task_index": 3}}))
    assert "Task: " in first and "Admissible actions: " in first
    assert "Admissible actions: " in env.act("look") and "Admissible actions: " in env.act("<action>look</action>")
    assert env.trajectory is not None
    assert [t.action_valid for t in env.trajectory.turns] == [True, True]
    assert "Invalid action" in env.act("<action></action>")
    assert env.get_reward() == 0.0 and env.get_reward() == 0.0
    assert len(load_jsonl(tmp_path / "e.jsonl")) == 1  # recorded once
    with pytest.raises(ValueError, match="'task' column"):
        env.reset(prompt="hello")
    with pytest.raises(ValueError, match="outcome must be one of"):
        AgentGymToolEnvFactory("ALFWorld-v0:easy", outcome="return")


@pytest.mark.parametrize("env_spec", list(ACTIONS))
def test_the_same_episodes_in_process_and_through_a_server(env_spec: str, tmp_path: Path) -> None:
    """TRL's environment_factory played against a running serve-openenv server records what it records in-process."""
    from test_integrations_openenv import running

    from agentgym_opsd.integrations.openenv_env import SessionSettings

    argument, _ = ACTIONS[env_spec]
    replies = [argument, "", argument]  # an action, an empty one (invalid but in Search-QA), more than the limit

    def play(factory: AgentGymToolEnvFactory) -> list[float]:
        envs = [factory(), factory()]  # as TRL pools them: one instance per rollout of a group
        rewards = []
        for seed in (0, 1):
            for env in envs:
                env.reset(task=json.dumps({"seed": seed, "options": {"task_index": seed}}))
                for reply in replies:
                    env.act(reply)
                rewards.append(env.get_reward())
        return rewards

    here = play(AgentGymToolEnvFactory(env_spec, record_path=tmp_path / "here.jsonl", max_turns=2, use_skills=True))
    with running(SessionSettings(env_spec, max_turns=2, skill_context=True)) as url:
        there = play(AgentGymToolEnvFactory(env_spec, server_url=url, record_path=tmp_path / "there.jsonl"))
    assert here == there
    recorded_here, recorded_there = load_jsonl(tmp_path / "here.jsonl"), load_jsonl(tmp_path / "there.jsonl")
    assert len(recorded_here) == 4 and all(t.num_turns >= 2 for t in recorded_here)  # Search-QA: 3, an answer turn
    assert [t.turns[1].action_valid for t in recorded_here] == [env_spec.startswith("SearchQA")] * 4
    assert recorded_here == recorded_there
