"""The example plugin package (examples/custom_env, `agentgym-lights`) end to end, installed for real:
discovered through its entry points in a fresh process, evaluated through the CLI, trained for one step
with `cpu-tiny`. The conformance suite (test_env_conformance.py) covers its environment too, because it
runs over every registered environment. And `--import` loads an environment from an uninstalled module."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentgym_opsd.evaluation.cli import main as evaluate_main
from agentgym_opsd.trainer.cli import main as train_main

INSTALLED = importlib.util.find_spec("agentgym_lights") is not None
if not INSTALLED and os.environ.get("AGENTGYM_REQUIRE_EXAMPLE"):  # CI installs it: never a silent skip there
    raise RuntimeError("examples/custom_env is not installed: pip install -e examples/custom_env")
needs_example = pytest.mark.skipif(not INSTALLED, reason="pip install -e examples/custom_env (CI does)")
TINY = ["trainer.total_steps=1", "trainer.backend=torch", "trainer.tensorboard=false", "warm_start.steps=0"]


@needs_example
def test_a_fresh_process_discovers_the_installed_plugin() -> None:
    code = ("from agentgym_opsd.registry import registered_envs, load_skill_library, env_profile; "
            "import json; lib = load_skill_library('lights'); "
            "print(json.dumps([registered_envs(), lib.name, sorted(lib.by_task_type), "
            "env_profile('Lights-v0').skill_library]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    envs, library, task_types, profile_library = json.loads(out)
    assert "agentgym_opsd/Lights-v0" in envs and "agentgym_opsd/ALFWorld-v0" in envs
    assert (library, profile_library) == ("lights", "lights")
    assert task_types == ["mixed", "switch_off", "switch_on"]


@needs_example
def test_the_plugin_evaluates_through_the_cli(tmp_path) -> None:
    assert evaluate_main(["--policy", "oracle", "--env", "Lights-v0:test", "--episodes", "6", "--out",
                          str(tmp_path), "--no-progress"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    (stats,) = results.values() if isinstance(results, dict) else results
    assert stats["success_rate"] == 1.0 and stats["episodes"] == 6


@needs_example
def test_the_plugin_trains_one_step_with_cpu_tiny(tmp_path) -> None:
    out = tmp_path / "run"
    assert train_main(["--config", "cpu-tiny", "env.id=Lights-v0", f"trainer.output_dir={out}", *TINY]) == 0
    (line,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert line["step"] == 1 and math.isfinite(line["loss"]) and 0.0 <= line["success_rate"] <= 1.0
    assert line["teacher_rows"] == line["num_rows"] > 0  # every row had a teacher prompt: the plugin's skills loaded


UNINSTALLED_ENV = '''
    from agentgym_opsd.core import TextEnv
    from agentgym_opsd.registry import EnvProfile, register_env


    class EchoEnv(TextEnv):
        """Say the word you are shown."""

        @property
        def num_tasks(self):
            return 3

        def _reset_task(self, options):
            self.word = ["red", "green", "blue"][int(options.get("task_index", self.np_random.integers(3)))]
            return f"Say {self.word}.", {"task_id": self.word, "task_type": "echo", "task_text": "echo",
                                         "admissible_actions": [self.word]}

        def _step_action(self, action):
            won = action.strip() == self.word
            return ("Right." if won else "Wrong."), float(won), won, {"action_valid": won, "won": won,
                                                                        "score": float(won)}

        def oracle_action(self):
            return self.word


    register_env("Echo-v0", f"{__name__}:EchoEnv", profile=EnvProfile(max_turns=2), override=True)
'''


def test_an_uninstalled_module_is_loaded_with_import(tmp_path, capsys) -> None:
    module = tmp_path / "my_echo_env.py"
    module.write_text(textwrap.dedent(UNINSTALLED_ENV))
    assert evaluate_main(["--import", str(module), "--policy", "oracle", "--env", "Echo-v0", "--episodes", "3",
                          "--out", str(tmp_path / "eval"), "--no-progress"]) == 0
    assert train_main(["--import", str(module), "--config", "cpu-tiny", "env.id=Echo-v0", "env.use_skills=false",
                       f"trainer.output_dir={tmp_path / 'run'}", *TINY]) == 0
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    assert train_main(["--import", str(tmp_path / "missing.py"), "--config", "cpu-tiny"]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = Path(tmp_path / "broken_env.py")
    bad.write_text("import nowhere_to_be_found\n")
    with pytest.raises(SystemExit):
        evaluate_main(["--import", str(bad), "--policy", "oracle", "--env", "Echo-v0", "--out", str(tmp_path)])
    assert "ModuleNotFoundError" in capsys.readouterr().err
