"""`agentgym-opsd COMMAND`: one command group; each command is handed whole to its layer's `main(argv)`, and
the `python -m agentgym_opsd.train` / `.evaluate` aliases (what launchers run) reach the same code."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentgym_opsd.__main__ import FORWARDED, main


def test_list_names_the_builtin_environments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for env_id in ("ALFWorld-v0", "WebShop-v0", "SearchQA-v0"):
        assert env_id in out


def test_train_is_handed_to_the_trainer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--list-presets"]) == 0
    assert "cpu-small" in capsys.readouterr().out


def test_a_bad_config_key_is_named_through_the_group(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--config", "cpu-tiny", "--print-config", "trainer.no_such_key=1"]) == 2
    assert "trainer.no_such_key" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(FORWARDED))
def test_every_command_answers_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_the_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(command in out for command in FORWARDED)


@pytest.mark.parametrize(("module", "args", "expected"), [
    ("agentgym_opsd.train", ["--list-presets"], "cpu-small"),
    ("agentgym_opsd.evaluate", ["--help"], "--policy"),
    ("agentgym_opsd", ["list"], "ALFWorld-v0"),
])
def test_the_module_aliases_run(module: str, args: list[str], expected: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert expected in done.stdout


def test_the_list_command_imports_no_model_or_trainer() -> None:
    code = ("import sys; from agentgym_opsd.__main__ import main; main(['list']); "
            "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['agentgym_opsd', 'trainer'], "
            "['agentgym_opsd', 'models'], ['agentgym_opsd', 'evaluation']) or m in ('torch', 'flask')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
