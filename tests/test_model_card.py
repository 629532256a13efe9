"""The exported model is ready to share: every checkpoint's `model/` carries a Hub-format card and the
training's sampling settings, and loads in plain transformers (no project code)."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from agentgym_opsd.trainer.checkpoint import latest_checkpoint
from agentgym_opsd.trainer.cli import main
from agentgym_opsd.trainer.model_card import before_after


def test_final_model_has_a_card_a_generation_config_and_loads_without_us(tmp_path, toy_env_ids) -> None:
    out = tmp_path / "run"
    assert main(["--config", "cpu-tiny", "env.id=ToyCounter-v0", f"trainer.output_dir={out}", "trainer.total_steps=1",
                 "trainer.backend=torch", "trainer.tensorboard=false", "trainer.eval_every=1",
                 "trainer.eval_episodes=2", "rollout.temperature=0.7"]) == 0
    model = latest_checkpoint(out / "checkpoints") / "model"
    card = (model / "README.md").read_text()
    head, _, body = card.partition("---\n")[2].partition("---\n")
    meta = yaml.safe_load(head)
    assert meta["library_name"] == "transformers" and "agentopsd" in meta["tags"]
    assert "ToyCounter-v0" in body and "1 RL steps" in body and "held-out success" in body
    assert yaml.safe_load(body.split("```yaml\n")[1].split("```")[0])["algorithm"]["estimator"] == "agentopsd"
    gen = json.loads((model / "generation_config.json").read_text())
    assert gen["do_sample"] is True and gen["temperature"] == 0.7 and gen["max_new_tokens"] == 16
    # a fresh interpreter that never imports agentgym_opsd loads and samples from the folder
    code = ("import sys, transformers as t; m = t.AutoModelForCausalLM.from_pretrained(sys.argv[1]); "
            "tok = t.AutoTokenizer.from_pretrained(sys.argv[1]); "
            "ids = tok('hello', return_tensors='pt').input_ids; "
            "out = m.generate(ids, generation_config=t.GenerationConfig.from_pretrained(sys.argv[1]), max_new_tokens=3); "
            "assert 'agentgym_opsd' not in sys.modules; print(out.shape[1] - ids.shape[1])")
    got = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    assert 1 <= int(got.stdout.strip().splitlines()[-1]) <= 3


def test_before_after_reads_the_first_and_last_logged_value(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "val/success_rate": 0.25}\n{"step": 1}\n{"step": 2, "val/success_rate": 0.5}\n{"cut')
    assert before_after(path, "val/success_rate") == (0.25, 0.5)
    assert before_after(path, "pool/success_rate") is None
    assert before_after(tmp_path / "missing.jsonl", "val/success_rate") is None
