"""benchmarks/bench_main_job_time.py: the minutes per phase read from a run's `time:` line (as `Trainer.time_report`
writes it) and the success lines the main job prints, and the refusal to call a filled cache cold."""

from __future__ import annotations

import pytest
from benchmark_scripts import load_benchmark

bt = load_benchmark("bench_main_job_time")


def test_the_time_line_becomes_minutes_per_phase() -> None:
    line = ("time: 23.7 min in all (bfloat16, 2 threads): setup 0.3, warm start 8.9, evaluation 7.9, rollout 3.1, "
            "logprobs 0.6, teacher 1.6, update 1.9, checkpoints 0.1, other 0.4 min")
    phases = bt.parse_time_report(line)
    assert phases == {"total": 23.7, "setup": 0.3, "warm start": 8.9, "evaluation": 7.9, "rollout": 3.1,
                      "logprobs": 0.6, "teacher": 1.6, "update": 1.9, "checkpoints": 0.1, "other": 0.4}


def test_the_success_lines_are_found_and_log_lines_are_not() -> None:
    held_out = "held-out success: 54.2% [40, 67] (step 0) -> 60.4% [46, 73] (step 6), 95% intervals over 48 / 48 episodes"
    assert bt.SUCCESS.match(held_out)["label"] == "held-out success"
    assert bt.SUCCESS.match("training-pool success: 51.6% (step 0) -> 57.8% (step 6)")
    assert not bt.SUCCESS.match("2026-12-04 19:00:01,123 INFO agentgym_opsd: held-out success: 0.5")


def test_the_runtime_line_is_read_back_as_the_session_logs_it() -> None:
    from agentgym_opsd.cpu_runtime import LOG_PREFIX, describe_preloads

    line = "2026-12-05 04:00:00,000 INFO agentgym_opsd.trainer.session: " + LOG_PREFIX + describe_preloads(
        {"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4:/v/lib/libiomp5.so"})
    assert bt.PRELOADED.search(line)["what"] == "libtcmalloc_minimal.so.4, libiomp5.so"


def test_a_cold_pass_refuses_a_cache_that_is_not_empty(tmp_path) -> None:
    (tmp_path / "venv" / "cache").mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    with pytest.raises(SystemExit, match="needs an empty cache"):
        bt.main(["--python", str(python), "--passes", "cold", "--out", str(tmp_path),
                 "--results", str(tmp_path / "time.json")])
