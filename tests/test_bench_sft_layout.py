"""benchmarks/bench_sft_layout.py: the tokens each layout computes, and a run on the tiny preset that keeps one
record per CPU with both layouts' figures."""

from __future__ import annotations

import json

import numpy as np
from benchmark_scripts import load_benchmark

from agentgym_opsd.trainer.warm_start import Demonstration

bench = load_benchmark("bench_sft_layout")


def test_the_padded_layout_computes_its_padding_and_the_packed_one_only_the_rows() -> None:
    rows = [Demonstration([1] * n, [2, 3]) for n in (8, 3, 18)]  # 10, 5 and 20 tokens
    pick = np.array([0, 1, 2])
    # padded: rows x longest <= 30 -> [5, 10] (2 x 10) and [20] (1 x 20); packed: 35 > 30 -> [5, 10] and [20]
    assert bench.computed_tokens(rows, pick, max_tokens=30, max_rows=8, packed=False) == 40
    assert bench.computed_tokens(rows, pick, max_tokens=30, max_rows=8, packed=True) == 35
    # a 2-token shared prefix: the rows' 8, 3 and 18 tokens after it fit one micro-batch (29), plus the prefix once
    assert bench.computed_tokens(rows, pick, max_tokens=30, max_rows=8, packed=True, prefix_len=2) == 31


def test_a_run_records_both_layouts_for_this_cpu(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(bench, "cpu_model", lambda: "Test CPU")
    out = tmp_path / "sft_layout.json"
    out.write_text(json.dumps({"machines": {"Other CPU": {"cpu": "Other CPU"}}}))
    bench.main(["--config", "cpu-tiny", "--steps", "2", "--rows", "8", "--out", str(out)])
    machines = json.loads(out.read_text())["machines"]
    assert set(machines) == {"Other CPU", "Test CPU"}  # another machine's record stays
    record = machines["Test CPU"]
    assert record["steps"] == 2 and set(record["layouts"]) == {"padded", "packed", "packed-prefix"}
    padded, packed = record["layouts"]["padded"], record["layouts"]["packed"]
    prefix = record["layouts"]["packed-prefix"]
    assert packed["computed_tokens"] == record["real_tokens"] <= padded["computed_tokens"]
    assert packed["loss_max_abs_diff_vs_padded"] < 1e-4 and padded["loss_max_abs_diff_vs_padded"] == 0
    assert record["shared_prefix_tokens"] > 0  # the system message every demonstration starts with
    assert prefix["computed_tokens"] < packed["computed_tokens"] and prefix["loss_max_abs_diff_vs_padded"] < 1e-4
