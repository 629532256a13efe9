"""Every preset trains one step: its environment, credit estimator and update settings run as written, with
only the sizes shrunk and the model swapped for the tiny random one (the GPU presets' backends swapped for
the CPU ones). A preset that names a bad key, an unknown environment or an impossible combination fails here."""

from __future__ import annotations

import json
import math

import pytest

from agentgym_opsd.trainer.cli import main
from agentgym_opsd.trainer.config import available_presets, load_config

SHRINK = [
    "model.name_or_path=tiny-random", "model.precision=fp32", "model.trainable_layers=0",
    "model.gradient_checkpointing=false", "rollout.backend=hf", "rollout.tasks_per_step=1", "rollout.group_size=2",
    "rollout.max_new_tokens=8", "rollout.batch_size=2", "env.max_turns=2", "algorithm.ppo_mini_batch_rows=0",
    "optim.micro_batch_tokens=8192", "deepspeed.zero_stage=0", "trainer.backend=torch",
    "trainer.device=cpu", "trainer.total_steps=1", "trainer.eval_every=0", "trainer.eval_at_start=false",
    "trainer.eval_pool_rollouts=0", "trainer.tensorboard=false", "trainer.progress=false", "trainer.save_every=1",
    "warm_start.steps=0", "warm_start.epochs=0",
]


@pytest.mark.parametrize("preset", [p for p in available_presets() if p != "cpu-tiny"])  # cpu-tiny: everywhere else
def test_preset_trains_one_step(preset, tmp_path):
    cfg = load_config(preset)
    out = tmp_path / preset
    assert main(["--config", preset, *SHRINK, f"trainer.output_dir={out}"]) == 0
    (line,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert line["step"] == 1 and math.isfinite(line["loss"]) and line["num_rows"] > 0
    resolved = load_config(str(out / "config.yaml"))
    # what the preset is about survived the shrinking: environment and credit settings
    assert (resolved.env.id, resolved.algorithm.estimator, resolved.algorithm.gamma, resolved.algorithm.success_source,
            resolved.env.invalid_action_penalty) == (cfg.env.id, cfg.algorithm.estimator, cfg.algorithm.gamma,
                                                     cfg.algorithm.success_source, cfg.env.invalid_action_penalty)
