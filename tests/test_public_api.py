"""The public API page (docs/api.md) is true: every name it lists imports from where it says, and its examples run
(on the toy environment and the tiny model, so they take seconds)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_every_listed_name_imports_from_where_the_page_says() -> None:
    import importlib

    listed = re.findall(r"`(agentgym_opsd(?:\.\w+)*)\.(\w+)\(?", PAGE.read_text(encoding="utf-8"))
    assert len(listed) >= 6
    for module, name in listed:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"
    import agentgym_opsd

    for name in ("make", "registered_envs", "env_profile", "register_env", "EnvProfile", "TextEnv", "check_env",
                 "register_skill_library", "load_skill_library", "Trajectory", "Turn", "load_jsonl", "save_jsonl",
                 "Policy", "PolicyRequest", "PolicyOutput", "OraclePolicy", "RandomPolicy"):
        assert hasattr(agentgym_opsd, name), name


def test_the_pages_examples_run(tmp_path, toy_env_ids) -> None:
    from agentgym_opsd import make
    from agentgym_opsd.credit import register_estimator
    from agentgym_opsd.evaluation import evaluate_policy, make_policy
    from agentgym_opsd.trainer import Trainer, load_config

    if "late-half" not in __import__("agentgym_opsd.credit", fromlist=["ESTIMATORS"]).ESTIMATORS:
        @register_estimator("late-half", needs_teacher=False)
        def late_half(inputs, config, details):
            """The episode's advantage, halved from the 10th turn on."""
            return inputs.seq_advantages * torch.where(inputs.turn_ids < 10, 1.0, 0.5)

    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", "trainer.total_steps=1", "trainer.tensorboard=false",
                                   "trainer.backend=torch", "algorithm.estimator=late-half",
                                   f"trainer.output_dir={tmp_path / 'run'}"])
    trainer = Trainer(cfg)
    try:
        metrics = trainer.train()
    finally:
        trainer.close()
    assert metrics and metrics[-1]["step"] == 1

    summary = evaluate_policy(make_policy("oracle"), "ToyCounter-v0", episodes=2)
    assert summary.episodes == 2 and summary.success_rate == 1.0

    env = make("ALFWorld-v0:easy")
    try:
        observation, info = env.reset(seed=0)
        observation, reward, terminated, truncated, info = env.step("look")
        assert isinstance(observation, str) and not truncated
    finally:
        env.close()
