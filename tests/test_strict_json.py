"""Every JSON file the project writes is strict JSON (RFC 8259): a NaN or an infinity is written as null, never as
the bare `NaN` / `Infinity` Python's `json` writes and other parsers (JavaScript, jq, Go) refuse. Each kind of
file is read back with a parser that refuses those constants."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agentgym_opsd.files import to_json
from agentgym_opsd.records import Trajectory, Turn, append_jsonl, load_jsonl, save_jsonl


def _refuse(constant: str) -> None:
    raise ValueError(f"not JSON: {constant}")


def strict_loads(text: str):
    return json.loads(text, parse_constant=_refuse)


def strict_read(path: Path) -> list:
    """Every value of a .json file or every line of a .jsonl file, parsed strictly."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [strict_loads(line) for line in text.splitlines() if line.strip()]
    return [strict_loads(text)]


def test_to_json_writes_non_finite_numbers_as_null() -> None:
    value = {"a": math.nan, "b": [1.5, math.inf, (-math.inf, 2)], "c": {"d": math.nan, "e": "NaN"}, "f": 3}
    assert strict_loads(to_json(value)) == {"a": None, "b": [1.5, None, [None, 2]], "c": {"d": None, "e": "NaN"},
                                            "f": 3}
    assert to_json({"x": 0.1, "y": [1, 2]}, indent=1) == json.dumps({"x": 0.1, "y": [1, 2]}, indent=1)
    with pytest.raises(ValueError, match="not JSON"):
        strict_loads(json.dumps(math.nan))  # the parser below does refuse what it should


def test_trajectory_records_are_strict_and_read_back(tmp_path) -> None:
    turn = Turn(0, [{"role": "user", "content": "go"}], "x", "go", True, "ok", math.nan,
                response_token_ids=[1, 2], response_logprobs=[-0.5, -math.inf])
    traj = Trajectory("e", "t", "k", 0, 0, 1, turns=[turn], score=math.inf, total_reward=math.nan)
    save_jsonl([traj], tmp_path / "saved.jsonl")
    append_jsonl([traj], tmp_path / "appended.jsonl")
    for name in ("saved.jsonl", "appended.jsonl"):
        (line,) = strict_read(tmp_path / name)
        assert line["total_reward"] is None and line["turns"][0]["response_logprobs"] == [-0.5, None]
        (back,) = load_jsonl(tmp_path / name)  # null reads back as NaN
        assert math.isnan(back.total_reward) and math.isnan(back.turns[0].reward)
        assert math.isnan(back.score) and math.isnan(back.turns[0].response_logprobs[1])


def test_metrics_and_credit_lines_are_strict(tmp_path) -> None:
    from agentgym_opsd.trainer.credit_file import write_jsonl_atomic
    from agentgym_opsd.trainer.metrics import MetricsLog

    log = MetricsLog(tmp_path, lambda step, logged_through: [])
    log.write({"loss": 0.5, "grad_norm": math.nan, "sample_logprob_gap": math.inf}, step=1)
    assert strict_read(log.path) == [{"step": 1, "loss": 0.5, "grad_norm": None, "sample_logprob_gap": None}]
    write_jsonl_atomic([{"traj_id": 0, "seq_advantage": math.nan}], tmp_path / "credit.jsonl")
    assert strict_read(tmp_path / "credit.jsonl") == [{"traj_id": 0, "seq_advantage": None}]


def test_every_json_file_of_a_run_and_an_evaluation_is_strict(tmp_path, toy_env_ids, monkeypatch) -> None:
    """A training run with a warm start (no held-out demonstrations: its exact-match number is NaN) and an
    evaluation: each .json / .jsonl file they write, and the warm-start cache's, parses strictly."""
    from agentgym_opsd.evaluation.cli import main as evaluate
    from agentgym_opsd.trainer.cli import main as train

    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    assert train(["--config", "cpu-tiny", "env.id=ToyCounter-v0", f"trainer.output_dir={run}", "trainer.total_steps=1",
                  "trainer.backend=torch", "trainer.report_to=none", "warm_start.steps=2", "warm_start.episodes=2",
                  "warm_start.heldout_episodes=0"]) == 0
    assert evaluate(["--policy", "oracle", "--env", "ToyCounter-v0:test", "--episodes", "2",
                     "--out", str(tmp_path / "eval")]) == 0
    summary = strict_read(run / "warm_start" / "summary.json")[0]
    assert summary["warm_start/heldout_action_exact_match"] is None  # was a bare NaN
    written = [p for p in tmp_path.rglob("*") if p.is_file() and (p.suffix in (".json", ".jsonl") or p.name == "COMPLETE")
               and "model" not in p.parent.name]  # the model folders hold the tokenizer's and HF's own files
    kinds = {f"{p.parent.name}/*" if p.parent.name in ("trajectories", "credit") else p.name for p in written}
    assert {"summary.json", "MANIFEST.json", "COMPLETE", "metrics.jsonl", "trajectories/*", "credit/*",
            "results.json", "episodes.jsonl"} <= kinds, kinds
    for path in written:
        if path.name == "COMPLETE":
            strict_loads(path.read_text())
        else:
            strict_read(path)
