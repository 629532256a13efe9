"""benchmarks/bench_sft_fit.py's pure parts: where a warm start's weights are found, and the fit figures."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from benchmark_scripts import load_benchmark

bench = load_benchmark("bench_sft_fit")


def test_a_model_is_found_in_its_folder_a_cache_entry_or_a_run(tmp_path) -> None:
    weights = tmp_path / "entry" / "model"
    weights.mkdir(parents=True)
    (weights / "model.safetensors").write_bytes(b"")
    run = tmp_path / "run"
    (run / "warm_start").mkdir(parents=True)
    (run / "warm_start" / "summary.json").write_text(json.dumps({"warm_start/model_dir": str(weights)}))
    assert bench.parse_model(f"float32@2={weights}") == ("float32", 2, weights)
    assert bench.parse_model(f"float32@0={tmp_path / 'entry'}")[2] == weights
    assert bench.parse_model(f"autocast@1={run}") == ("autocast", 1, weights)
    for bad in (f"float32={weights}", f"@1={weights}", "float32@1=", f"x@1={tmp_path}"):
        with pytest.raises(SystemExit):
            bench.parse_model(bad)


def test_the_fit_figures_count_tokens_and_whole_actions() -> None:
    # two responses: two sure tokens; one sure and one at p = 0.25
    rows = [np.array([0.0, 0.0]), np.array([0.0, math.log(4)])]
    fig = bench.fit_figures(rows)
    assert fig["token_nll"] == pytest.approx(math.log(4) / 4)
    assert fig["tokens_p_under_half"] == 0.25
    assert fig["response_nll"] == pytest.approx(math.log(4) / 2)
    assert fig["responses_p_under_0.9"] == 0.5 and fig["responses"] == 2
