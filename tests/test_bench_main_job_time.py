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


FAKE_TRAIN = """#!/usr/bin/env python3
import pathlib, sys
out = pathlib.Path(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("trainer.output_dir=")))
out.mkdir(parents=True)
(out / "config.yaml").write_text("model: {precision: fp32}\\nrollout: {backend: hf}\\nwarm_start: {}\\n")
print("argv:", " ".join(sys.argv[1:]))
print("time: 1.0 min in all (float32, 2 threads): setup 0.1, warm start 0.5, evaluation 0.4 min")
"""


def test_a_recipe_change_is_passed_to_the_job_and_kept_as_a_record_of_its_own(tmp_path) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_TRAIN)
    python.chmod(0o755)
    results = tmp_path / "time.json"

    def time_it(out: str, *settings: str) -> None:
        bt.main(["--python", str(python), "--passes", "cold", "--out", str(tmp_path / out), "--results", str(results),
                 *[arg for s in settings for arg in ("--set", s)]])

    time_it("a")
    time_it("b", "warm_start.epochs=1")
    time_it("c", "warm_start.epochs=1")  # the same recipe again replaces its own record only
    runs = next(iter(bt.read_machines(results).values()))["runs"]
    assert [r.get("overrides") for r in runs] == [None, ["warm_start.epochs=1"]]
    assert runs[0]["phases_min"]["warm start"] == 0.5
    log = (tmp_path / "c" / "venv" / "cold.log").read_text()
    assert log.split("\n")[0].endswith("trainer.progress=false warm_start.epochs=1")
