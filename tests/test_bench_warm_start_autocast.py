"""benchmarks/bench_warm_start_autocast.py's report: finished run folders read back, the episodes paired by seed
against the first (the float32 SFT), one record per CPU."""

from __future__ import annotations

import json

from benchmark_scripts import load_benchmark

bench = load_benchmark("bench_warm_start_autocast")


def _run(folder, wins: list[bool], invalid: float, exact: float, seconds: float) -> None:
    (folder / "warm_start").mkdir(parents=True)
    (folder / "validation").mkdir()
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/success_rate": sum(wins) / len(wins),
                                                      "val/invalid_action_rate": invalid}) + "\n")
    (folder / "warm_start" / "summary.json").write_text(json.dumps({
        "warm_start/heldout_action_exact_match": exact, "warm_start/seconds_sft": seconds}))
    (folder / "validation" / "step_000000.jsonl").write_text("".join(
        json.dumps({"env_spec": "ALFWorld-v0:easy_valid", "seed": 10_000 + i, "won": won, "turns": 10,
                    "invalid_actions": 0 if won else 2}) + "\n" for i, won in enumerate(wins)))


def test_the_report_pairs_each_variant_with_the_float32_sft_by_episode(tmp_path) -> None:
    _run(tmp_path / "a", [True, True, False, True], 0.10, 0.9, 553.0)
    _run(tmp_path / "b", [True, False, False, False], 0.20, 0.9, 339.0)
    out = tmp_path / "w.json"
    bench.main(["--runs", f"float32={tmp_path / 'a'}", f"autocast={tmp_path / 'b'}", "--note", "test", "--out",
                str(out)])
    (record,) = json.loads(out.read_text())["machines"].values()
    assert record["baseline"] == "float32" and record["note"] == "test"
    float32, autocast = record["variants"]["float32"], record["variants"]["autocast"]
    assert float32["vs_float32"] is None and (float32["success"], float32["episodes"]) == (0.75, 4)
    paired = autocast["vs_float32"]
    assert (paired["first_only"], paired["second_only"], paired["won_both"]) == (2, 0, 1)
    assert autocast["sft_seconds"] == 339.0 and autocast["invalid_action_rate"] == 0.20
    assert (autocast["invalid_rate_won"], autocast["invalid_rate_lost"]) == (0.0, 0.2)


def test_several_sft_seeds_pair_each_run_with_its_seeds_float32_and_pool_the_episodes(tmp_path) -> None:
    _run(tmp_path / "a0", [True, True, False, True], 0.10, 0.9, 550.0)
    _run(tmp_path / "b0", [True, False, False, False], 0.20, 0.9, 340.0)
    _run(tmp_path / "a1", [False, True, False, False], 0.30, 0.8, 560.0)
    _run(tmp_path / "b1", [True, True, True, False], 0.10, 1.0, 330.0)
    out = tmp_path / "w.json"
    bench.main(["--runs", f"float32={tmp_path / 'a0'}", f"autocast={tmp_path / 'b0'}",
                f"float32@1={tmp_path / 'a1'}", f"autocast@1={tmp_path / 'b1'}", "--out", str(out)])
    (record,) = json.loads(out.read_text())["machines"].values()
    # each run against the float32 SFT of its own seed
    assert record["runs"]["autocast@1"]["seed"] == 1
    assert (record["runs"]["autocast@1"]["vs_float32"]["first_only"],
            record["runs"]["autocast@1"]["vs_float32"]["second_only"]) == (0, 2)
    autocast = record["variants"]["autocast"]
    assert autocast["seeds"] == [0, 1] and autocast["episodes"] == 8
    assert autocast["success_per_seed"] == [0.25, 0.75] and autocast["success"] == 0.5
    assert abs(autocast["invalid_action_rate"] - 0.15) < 1e-12 and autocast["sft_seconds"] == 335.0
    # the pooled pairing counts both seeds' episodes once each: seed 0 loses 2, seed 1 gains 2
    pooled = autocast["vs_float32"]
    assert (pooled["episodes"], pooled["first_only"], pooled["second_only"]) == (8, 2, 2)
    assert record["variants"]["float32"]["vs_float32"] is None


def test_a_malformed_runs_argument_names_itself(tmp_path) -> None:
    import pytest

    with pytest.raises(SystemExit, match="NAME@SEED=DIR"):
        bench.main(["--runs", "float32@x=/nowhere", "--out", str(tmp_path / "w.json")])


def test_the_runs_are_each_variants_sft_from_each_seed(tmp_path, monkeypatch) -> None:
    """Without --runs: a run per chosen variant and seed, in its own folder, with its precision and seed set."""
    started: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(bench, "read_metrics", lambda folder: [])
    monkeypatch.setattr(bench, "run_variant", lambda folder, config, overrides, episodes:
                        started.append((folder.name, overrides)))
    monkeypatch.setattr(bench, "read_run", lambda folder: {
        "success": 0.5, "invalid_action_rate": 0.1, "invalid_rate_won": 0.0, "invalid_rate_lost": None, "episodes": 1,
        "exact_match": 0.9, "sft_seconds": 1.0, "episode_records": [{"env_spec": "e", "seed": 0, "won": True}]})
    bench.main(["--seeds", "0", "1", "--runs-dir", str(tmp_path), "--out", str(tmp_path / "w.json")])
    assert started == [("float32", ["warm_start.autocast=false", "warm_start.seed=0"]),
                       ("autocast", ["warm_start.autocast=true", "warm_start.seed=0"]),
                       ("float32@1", ["warm_start.autocast=false", "warm_start.seed=1"]),
                       ("autocast@1", ["warm_start.autocast=true", "warm_start.seed=1"])]
    started.clear()
    bench.main(["--seeds", "3", "--variants", "autocast", "--runs-dir", str(tmp_path), "--out", str(tmp_path / "x.json")])
    assert started == [("autocast@3", ["warm_start.autocast=true", "warm_start.seed=3"])]


def test_the_invalid_actions_are_split_by_the_episodes_outcome() -> None:
    episodes = [{"won": True, "turns": 5, "invalid_actions": 0}, {"won": True, "turns": 5, "invalid_actions": 1},
                {"won": False, "turns": 10, "invalid_actions": 4}, {"won": False, "turns": 10, "invalid_actions": 2}]
    assert bench.invalid_by_outcome(episodes) == {"invalid_rate_won": 0.1, "invalid_rate_lost": 0.3}
    # no lost episode, or records without the counts (older files): unknown rather than zero
    assert bench.invalid_by_outcome(episodes[:2])["invalid_rate_lost"] is None
    assert bench.invalid_by_outcome([{"won": False, "turns": 10}]) == {"invalid_rate_won": None, "invalid_rate_lost": None}
    no_turns = [{"won": False, "invalid_actions": 3}, {"won": False, "turns": 5, "invalid_actions": 0}]
    assert bench.invalid_by_outcome(no_turns)["invalid_rate_lost"] is None  # not 3 / 5: no rate at all
