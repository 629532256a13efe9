"""benchmarks/harness.py: what the benchmarks that start training runs share, the environment they start them in and
the reading of a run's `time:` line."""

from __future__ import annotations

import sys

import pytest
from benchmark_scripts import load_benchmark

harness = load_benchmark("harness")


def test_a_training_run_starts_offline_with_its_threads_and_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    for unset in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "AGENTGYM_OPSD_CACHE"):
        monkeypatch.delenv(unset, raising=False)
    env = harness.training_env(2, tmp_path / "cache")
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"
    assert env["AGENTGYM_OPSD_CACHE"] == str(tmp_path / "cache")
    default = harness.training_env()
    assert "OMP_NUM_THREADS" not in default and "AGENTGYM_OPSD_CACHE" not in default  # torch's and the project's own


def test_a_resumed_runs_last_time_line_is_read_with_its_threads(tmp_path) -> None:
    log = tmp_path / "run.log"
    log.write_text("2026-12-05 INFO starting\n"
                   "time: 9.0 min in all (float32, 1 threads): setup 0.1, warm start 8.9 min\n"
                   "resuming from step 2\n"
                   "time: 21.5 min in all (float32, 2 threads): setup 0.2, rollout 7.1, other 0.4 min\n")
    line = harness.last_time_line(log)
    assert line is not None and line.startswith("time: 21.5")
    assert harness.time_line_threads(line) == 2
    assert harness.parse_time_report(line) == {"total": 21.5, "setup": 0.2, "rollout": 7.1, "other": 0.4}


def test_a_log_without_a_time_line_reads_as_none(tmp_path) -> None:
    assert harness.last_time_line(tmp_path / "missing.log") is None
    (tmp_path / "killed.log").write_text("2026-12-05 INFO step 1\n")
    assert harness.last_time_line(tmp_path / "killed.log") is None
    assert harness.time_line_threads(None) is None


def test_the_train_command_puts_a_runs_own_settings_last(tmp_path) -> None:
    argv = harness.train_command("py", "cpu-small", tmp_path / "run", ["warm_start.epochs=1"])
    assert argv == ["py", "-m", "agentgym_opsd.train", "--config", "cpu-small", f"trainer.output_dir={tmp_path / 'run'}",
                    "trainer.progress=false", "warm_start.epochs=1"]


def test_a_training_run_that_fails_raises_with_its_logs_tail(tmp_path) -> None:
    ok = harness.run_training([sys.executable, "-c", "print('step 1')"], harness.training_env(), tmp_path / "ok.log",
                              what="run ok")
    assert ok == ["step 1"]
    script = "import sys; print('\\n'.join(f'line {i}' for i in range(30))); sys.exit(3)"
    with pytest.raises(SystemExit, match="run bad exited 3") as failed:
        harness.run_training([sys.executable, "-c", script], harness.training_env(), tmp_path / "bad.log", what="run bad")
    assert "line 29" in str(failed.value) and "line 9\n" not in str(failed.value)  # the last 20 lines only
