"""benchmarks/bench_warm_start_recipe.py: each arm's settings reach the warm-start-only command, its figures come from
its own run folder, an arm already trained is read rather than run again, and the record is per CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

bw = load_benchmark("bench_warm_start_recipe")

FAKE_TRAIN = """#!/usr/bin/env python3
import json, os, pathlib, sys
out = pathlib.Path(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("trainer.output_dir=")))
epochs = float(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("warm_start.epochs=")), 2))
(out / "warm_start").mkdir(parents=True)
summary = {"warm_start/heldout_action_exact_match": 0.4 + 0.25 * epochs, "warm_start/sft_steps": 71 * epochs,
           "warm_start/epochs": epochs, "warm_start/loss_last": 0.1 / epochs, "warm_start/seconds_sft": 400 * epochs}
(out / "warm_start" / "summary.json").write_text(json.dumps(summary))
print("argv:", " ".join(sys.argv[1:]), "cache:", os.environ["AGENTGYM_OPSD_CACHE"])
print("time: 1.0 min in all (float32, 3 threads): setup 0.1, warm start 0.9 min")
"""


@pytest.fixture
def python(tmp_path: Path) -> Path:
    path = tmp_path / "python"
    path.write_text(FAKE_TRAIN)
    path.chmod(0o755)
    return path


def test_the_command_trains_only_the_warm_start_with_the_arms_settings(tmp_path) -> None:
    argv = bw.arm_command("py", tmp_path / "run", ["warm_start.epochs=1"])
    assert argv[:5] == ["py", "-m", "agentgym_opsd.train", "--config", "cpu-small"]
    assert {"trainer.total_steps=0", "trainer.eval_at_start=false", f"trainer.output_dir={tmp_path / 'run'}"} <= set(argv)
    assert argv[-1] == "warm_start.epochs=1"  # after the bench's own settings, so the arm's win


def test_arms_are_trained_once_and_read_from_their_folders(tmp_path, python) -> None:
    base = tmp_path / "base-cache"
    (base / "models").mkdir(parents=True)
    results, out = tmp_path / "recipe.json", tmp_path / "arms"
    args = ["--python", str(python), "--out", str(out), "--results", str(results), "--base-cache", str(base),
            "--arm", "preset", "--arm", "one-epoch", "warm_start.epochs=1"]
    bw.main(args)
    assert (out / "one-epoch" / "cache" / "models").resolve() == (base / "models").resolve()  # linked, not made
    arms = next(iter(json.loads(results.read_text())["machines"].values()))["arms"]
    assert arms["preset"]["overrides"] == [] and arms["preset"]["heldout_action_exact_match"] == pytest.approx(0.9)
    assert arms["one-epoch"] == {"overrides": ["warm_start.epochs=1"], "threads": 3,
                                 "heldout_action_exact_match": pytest.approx(0.65), "sft_steps": 71, "epochs": 1.0,
                                 "loss_last": pytest.approx(0.1), "seconds_sft": 400}
    python.write_text("#!/bin/sh\nexit 3\n")  # trained arms are not run again
    bw.main(args)
    with pytest.raises(SystemExit, match="arm other exited 3"):
        bw.main([*args[:8], "--arm", "other", "warm_start.lr=1e-3"])


def test_a_setting_without_a_value_is_refused(tmp_path, python) -> None:
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        bw.main(["--python", str(python), "--out", str(tmp_path), "--results", str(tmp_path / "r.json"),
                 "--arm", "bad", "warm_start.epochs"])
