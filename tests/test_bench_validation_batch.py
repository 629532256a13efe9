"""benchmarks/bench_validation_batch.py: a real (tiny) run plays validation in both modes and records their chunks."""

from __future__ import annotations

import json

from benchmark_scripts import load_benchmark

bench = load_benchmark("bench_validation_batch")


def test_a_tiny_run_generates_validation_in_one_batch_against_chunks(tmp_path) -> None:
    out = tmp_path / "v.json"
    bench.main(["--config", "cpu-tiny", "--episodes", "4", "--pool-rollouts", "2", "--batch", "8", "--rounds", "1",
                "--set", "rollout.batch_size=2", "--set", "env.num_train_tasks=2", "--out", str(out)])
    (record,) = json.loads(out.read_text())["machines"].values()
    modes = record["modes"]
    assert set(modes) == {"one-batch", "chunked"}
    one, chunked = modes["one-batch"]["rounds"][0], modes["chunked"]["rounds"][0]
    # the switch took effect: 4 held-out episodes (and the pool's 2 games x 2) in one chunk, against chunks of 2
    assert one["largest_chunk"] == 4 and chunked["largest_chunk"] == 2
    assert chunked["chunks"] > one["chunks"]
    assert one["turns"] >= 6 and chunked["turns"] >= 6  # at least one turn of each of the 4 + 2 x 2 episodes
    assert one["pool_success"] is not None and record["speedup"] > 0 and record["speedup_per_turn"] > 0
