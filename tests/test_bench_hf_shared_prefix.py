"""benchmarks/bench_hf_shared_prefix.py: the alternating round order, and a real (tiny) run whose record says both
modes sampled the same tokens while the shared mode fed the model fewer prompt tokens."""

from __future__ import annotations

import json

from benchmark_scripts import load_benchmark

bench = load_benchmark("bench_hf_shared_prefix")


def test_the_rounds_alternate_so_each_mode_goes_first_in_half_the_pairs() -> None:
    assert bench.order(1) == ["shared", "whole"]
    assert bench.order(2) == ["shared", "whole", "whole", "shared"]


def test_a_tiny_run_samples_alike_in_both_modes_and_feeds_fewer_tokens_shared(tmp_path) -> None:
    out = tmp_path / "h.json"
    bench.main(["--config", "cpu-tiny", "--episodes", "4", "--rounds", "1", "--out", str(out)])
    (record,) = json.loads(out.read_text())["machines"].values()
    assert record["same_samples"] is True
    shared, whole = record["modes"]["shared"], record["modes"]["whole"]
    assert 0 < shared["fed_tokens"] < whole["fed_tokens"]
    assert shared["rounds"][0]["generated_tokens"] == whole["rounds"][0]["generated_tokens"] > 0
