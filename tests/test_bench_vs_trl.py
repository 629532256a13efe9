"""benchmarks/bench_vs_trl.py without TRL: the verdict and the merge of separate runs. (Its TRL side is the public
adapter, `agentgym_opsd.integrations.trl`, tested in tests/test_integrations_trl.py.)"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

bvt = load_benchmark("bench_vs_trl")


def _step(side: str, seconds: float) -> dict:
    return {"seed": 1, "step": 1, "side": side, "seconds_step": seconds, "seconds_rollout": seconds / 4,
            "seconds_update": 3 * seconds / 4, "peak_rss_gb": 3.0, "success": 0.5, "episodes": 8, "rows": 40,
            "gen_tokens": 500, "train_tokens": 10_000, "padded_tokens": 12_000, "turns": 40}


def _eval(won: int, episodes: int = 32) -> dict:
    return {"success": won / episodes, "won": won, "episodes": episodes, "ci": [0.0, 1.0]}


def test_verdict_gives_the_success_difference_with_its_interval() -> None:
    """3.6x faster, one pool episode behind: the goal is not met on the point estimates, and the report says
    that one episode of 32 is within the noise rather than leaving a bare NOT MET."""
    run = bvt.SeedRun(rows=[_step("ours", 100.0), _step("trl", 360.0)], setup={},
                      after={"ours": _eval(17), "trl": _eval(18)})
    summary = bvt.summarize([run], _eval(18))
    low, high = summary["success_difference"]["ci"]
    assert summary["speedup_step"] == 3.6 and summary["goal_met"] is False
    assert low < summary["success_difference"]["ours_minus_trl"] < 0 < high
    text = bvt.verdict(summary)
    assert "NOT MET" in text and "-3.1 points" in text and "within the noise" in text
    run.after["ours"] = _eval(30)
    assert "a real difference" in bvt.verdict(bvt.summarize([run], _eval(18)))


def _report(tmp_path: Path, seed: int, *, steps: int = 2, before_won: int = 18) -> Path:
    rows = [_step("ours", 100.0) | {"seed": seed, "optimizer_steps": 3, "weights_moved": 1e-4},
            _step("trl", 360.0) | {"seed": seed, "optimizer_steps": 1, "weights_moved": 1e-4}]
    report = {"settings": {"steps": steps, "threads": 1, "pool_rollouts": 2, "model": "m", "seeds": [seed]},
              "versions": {"trl": "1.16.0"}, "setup": {"ours": {}, "trl": {}}, "steps": rows,
              "pool": {"before": _eval(before_won) | {"seconds": 200.0 + seed}, "after": {str(seed): {"ours": _eval(17), "trl": _eval(18)}}}}
    path = tmp_path / f"seed{seed}.json"
    path.write_text(json.dumps(report))
    return path


def test_merge_pools_the_seeds_of_separate_runs_and_refuses_other_settings(tmp_path: Path) -> None:
    runs, before, settings, _ = bvt.load_reports([_report(tmp_path, 1), _report(tmp_path, 2)])
    assert settings["seeds"] == [1, 2] and before["won"] == 18  # the wall times differ, the episodes do not
    report = bvt.write_report(runs, before, settings, {}, tmp_path / "merged", bvt.Console(file=io.StringIO()))
    assert report["summary"]["ours"]["pool_after"]["episodes"] == 64  # 32 per seed, two seeds
    assert (tmp_path / "merged.json").is_file() and (tmp_path / "merged.png").is_file()
    with pytest.raises(SystemExit, match="steps"):
        bvt.load_reports([_report(tmp_path, 1), _report(tmp_path, 3, steps=1)])
    with pytest.raises(SystemExit, match="pool.before"):
        bvt.load_reports([_report(tmp_path, 1), _report(tmp_path, 4, before_won=10)])
    with pytest.raises(SystemExit, match="seed 1"):
        bvt.load_reports([_report(tmp_path, 1), _report(tmp_path, 1)])
