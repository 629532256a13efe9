"""benchmarks/bench_kv_cache.py: a real (tiny) run times both caches at every shape asked and keeps the rounds."""

from __future__ import annotations

import json

from benchmark_scripts import load_benchmark

bench = load_benchmark("bench_kv_cache")


def test_a_tiny_run_times_both_caches_at_each_shape(tmp_path) -> None:
    out = tmp_path / "k.json"
    bench.main(["--model", "tiny-random", "--shape", "2x32", "--shape", "1x64", "--steps", "3", "--rounds", "1",
                "--out", str(out)])
    (record,) = json.loads(out.read_text())["machines"].values()
    assert list(record["shapes"]) == ["2x32", "1x64"]
    for shape in record["shapes"].values():
        assert set(shape["ms_per_step"]) == {"reserved", "concatenated"}
        assert all(len(times) == 1 and times[0] > 0 for times in shape["rounds"].values())
        assert shape["speedup"] > 0
        assert shape["cache_layers"] == {"reserved": "ReservedLayer", "concatenated": "DynamicLayer"}
