"""`benchmarks/bench_warm_start_precision.py` scores a model on its warm start's held-out demonstrations in a given
compute dtype: on cpu-tiny (a random model), the held-out slice is the warm start's own and the score a rate."""

from __future__ import annotations

import math

import pytest
from benchmark_scripts import load_benchmark

bench = load_benchmark("bench_warm_start_precision")


@pytest.mark.timeout(600)
def test_scores_the_warm_starts_held_out_demonstrations() -> None:
    overrides = ["warm_start.heldout_episodes=2", "warm_start.episodes=4", "env.max_turns=12"]
    first = bench.score("cpu-tiny", "tiny-random", "float32", overrides)
    assert first["episodes"] == 2 and first["turns"] > 0
    assert 0.0 <= first["exact_match"] <= 1.0 and not math.isnan(first["exact_match"])
    assert bench.score("cpu-tiny", "tiny-random", "float32", overrides)["turns"] == first["turns"]  # same slice
