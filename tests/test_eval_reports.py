"""The suite CLI end to end on the toy env: result files, report tables, plots (valid PNGs), resume,
compare and training curves."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest

from agentgym_opsd.evaluation.cli import main
from agentgym_opsd.evaluation.compare import compare_runs, write_curves
from agentgym_opsd.evaluation.plots import find_curve_keys
from agentgym_opsd.evaluation.runner import load_episode_records
from agentgym_opsd.evaluation.suite import rebuild_reports

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_png(path: Path) -> None:
    assert path.is_file() and path.read_bytes()[:8] == PNG_MAGIC
    image = matplotlib.image.imread(path)  # decodes: not just a header
    assert image.shape[0] > 100 and image.shape[1] > 100


def _run(out: Path, policy: str, episodes: int = 6) -> int:
    return main(["--policy", policy, "--env", "ToyCounter-v0:test", "--env", "ToyCounter-v0:train",
                 "--episodes", str(episodes), "--out", str(out), "--num-envs", "3", "--no-progress"])


def test_suite_writes_results_report_and_plots_and_resumes(toy_env_ids, tmp_path, capsys):
    out = tmp_path / "oracle"
    assert _run(out, "oracle") == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"ToyCounter-v0:test", "ToyCounter-v0:train"}
    test = results["ToyCounter-v0:test"]
    assert test["success_rate"] == 1.0 and test["episodes"] == 6 and set(test["by_task_type"]) == {"up", "even"}
    assert test["by_task_type"]["up"]["ci_low"] < 1.0 == test["by_task_type"]["up"]["ci_high"]
    assert test["horizon"]["slope_points_per_turn"] == 0.0
    report = (out / "report.md").read_text()
    assert "| ToyCounter-v0:test | 6 | 100.0 [" in report and "| up |" in report and "invalid actions %" in report
    assert "![horizon sensitivity](horizon.png)" in report
    for png in ("success_by_task_type.png", "horizon.png"):
        _assert_png(out / png)
    assert "ToyCounter-v0:test" in capsys.readouterr().out

    # rerunning the same command plays nothing new; asking for more plays only the difference
    assert _run(out, "oracle") == 0
    assert len(load_episode_records(out / "episodes.jsonl")) == 12
    assert _run(out, "oracle", episodes=8) == 0
    assert len(load_episode_records(out / "episodes.jsonl")) == 16
    assert json.loads((out / "results.json").read_text())["ToyCounter-v0:test"]["episodes"] == 8

    # reports can be rebuilt from the episodes alone
    (out / "results.json").unlink()
    summaries = rebuild_reports(out)
    assert {s.env_spec for s in summaries} == set(results) and (out / "results.json").is_file()


def test_random_is_worse_and_compare_puts_runs_side_by_side(toy_env_ids, tmp_path, capsys):
    _run(tmp_path / "oracle", "oracle")
    _run(tmp_path / "random", "random")
    random = json.loads((tmp_path / "random" / "results.json").read_text())
    assert random["ToyCounter-v0:test"]["success_rate"] < 1.0
    assert main(["compare", str(tmp_path / "oracle"), str(tmp_path / "random"), "--out", str(tmp_path / "cmp")]) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| environment | oracle | random |" in table and "| ToyCounter-v0:test | 100.0 [" in table
    _assert_png(tmp_path / "cmp" / "compare.png")


def _write_metrics(folder: Path, slope: float) -> Path:
    folder.mkdir(parents=True)
    rows = []
    for step in range(1, 11):
        row = {"step": step, "loss/policy": 0.1, "actor/entropy": 2.0 - 0.1 * step, "loss/kl": 0.001 * step,
               "credit/evidence_mean": 0.05 * step, "optim/entropy_coef": 0.001}
        if step % 5 == 0:
            row["val/success_rate"] = row["val/ToyCounter-v0:test/success_rate"] = min(1.0, slope * step)
            row["val/ToyCounter-v0:test/up/success_rate"] = 1.0
        row["train/ToyCounter-v0/success_rate"] = 0.5
        rows.append(json.dumps(row))
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n{broken\n")
    return folder


def test_training_curves_and_compare_of_training_runs(tmp_path):
    grpo, opsd = _write_metrics(tmp_path / "grpo", 0.05), _write_metrics(tmp_path / "agentopsd", 0.08)
    png = write_curves(grpo)
    assert png == grpo / "training_curves.png"
    _assert_png(png)
    written = compare_runs([grpo, opsd], tmp_path / "cmp")
    _assert_png(written["curves"])
    table = written["table"].read_text()
    assert "| agentopsd | val/success_rate | 80.0 | 80.0 | 2 |" in table and "/up/" not in table
    rows = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines()[:10]]
    panels = find_curve_keys(rows)
    assert panels["entropy"] == ["actor/entropy"] and panels["KL to reference"] == ["loss/kl"]
    assert panels["evidence"] == ["credit/evidence_mean"]
    assert panels["success (%)"] == ["train/ToyCounter-v0/success_rate", "val/success_rate"]


def test_cli_errors_list_what_exists(toy_env_ids, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--policy", "oracle", "--env", "Nope-v0", "--out", str(tmp_path)])
    assert "registered:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--policy", "gpt4", "--env", "ToyCounter-v0", "--out", str(tmp_path)])
    assert "random, oracle" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compare", str(tmp_path / "missing")])
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "file:///etc/passwd", "127.0.0.1:8000"])
def test_cli_refuses_endpoints_that_are_not_http_as_usage_errors(toy_env_ids, tmp_path, capsys, url):
    with pytest.raises(SystemExit) as exit_:
        main(["--policy", f"openai:{url}", "--model", "m", "--env", "ToyCounter-v0", "--out", str(tmp_path)])
    assert exit_.value.code == 2 and "http" in capsys.readouterr().err


def test_cli_exits_non_zero_when_episodes_could_not_run(toy_env_ids, tmp_path, capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on: the policy endpoint is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(["--policy", f"openai:http://127.0.0.1:{port}", "--model", "m", "--env", "ToyCounter-v0:test",
                 "--episodes", "2", "--max-retries", "0", "--out", str(tmp_path), "--no-progress",
                 "--policy-option", "timeout_s=0.5", "--policy-option", "max_retries=0"])
    assert code == 3
    err = capsys.readouterr().err
    assert "2 episode(s) did not run" in err and "cannot connect" in err
    assert not (tmp_path / "episodes.jsonl").exists() or not (tmp_path / "episodes.jsonl").read_text().strip()


def test_a_trained_runs_prompts_are_used_for_its_evaluation(toy_env_ids, tmp_path, capsys):
    """A run trained with other prompt settings than the profile's (here no past turns, only the earlier
    actions) is evaluated with its own prompts: named with --prompts-from, found by 'auto' from its weights."""
    import yaml

    from agentgym_opsd.evaluation.cli import training_run_config
    from agentgym_opsd.trainer.config import load_config

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002" / "model").mkdir(parents=True)
    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", "env.history_turns=0", "env.action_history=true"])
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    for inside in (run, run / "checkpoints" / "step_000002", run / "checkpoints" / "step_000002" / "model"):
        assert training_run_config(inside) == run / "config.yaml"
    assert training_run_config(tmp_path) is None and training_run_config("embedded:smollm2-135m-instruct") is None

    def prompts(*extra: str) -> list[str]:
        out = tmp_path / f"eval{len(extra)}"
        assert main(["--policy", "oracle", "--env", "ToyCounter-v0:test", "--episodes", "2", "--out", str(out),
                     "--no-progress", "--keep-prompts", *extra]) == 0
        return [t.prompt[-1]["content"] for r in load_episode_records(out / "episodes.jsonl")
                for t in r.trajectory.turns[1:]]

    own = prompts("--prompts-from", str(run))
    assert own and all("Earlier actions" in p and "Recent turns" not in p for p in own)
    assert "prompts rendered as in" in capsys.readouterr().out
    profile = prompts()  # the oracle is not a training run's: each profile's prompts
    assert all("Earlier actions" not in p and "Recent turns" in p for p in profile)
    with pytest.raises(SystemExit):
        main(["--policy", "oracle", "--env", "ToyCounter-v0", "--out", str(tmp_path / "x"),
              "--prompts-from", str(tmp_path / "nowhere")])
