"""benchmarks/bench_cpu_runtime.py: the alternating round order, the record (medians, speed-up, whether both runtimes
played the same samples), and that each round's process gets its own `LD_PRELOAD` while the benchmark's stays."""

from __future__ import annotations

import os
from typing import Any

import pytest
from benchmark_scripts import load_benchmark

bench = load_benchmark("bench_cpu_runtime")


def test_the_rounds_alternate_so_each_runtime_goes_first_in_half_the_pairs() -> None:
    assert bench.order(1) == ["plain", "preloaded"]
    assert bench.order(3) == ["plain", "preloaded", "preloaded", "plain", "plain", "preloaded"]


def _round(runtime: str, seconds: float, tokens: int = 700) -> dict[str, Any]:
    return {"runtime": runtime, "start_s": 100.0, "sync_s": 0.5, "trainer_passes": {"logprobs_s": seconds / 10,
                                                                                  "teacher_s": 2.0, "rows": 80},
            "episodes": {"32": {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}}}


def test_the_record_gives_medians_the_speed_up_and_whether_the_samples_matched(tmp_path, monkeypatch) -> None:
    args = bench.argparse.Namespace(config="cpu-small", dtype="float32", episodes=32)
    rounds = [_round("plain", 140.0), _round("preloaded", 120.0), _round("preloaded", 124.0), _round("plain", 136.0)]
    record = bench.summarize(rounds, ["/a/libtc.so", "/b/libiomp5.so"], args)
    assert record["median"]["plain"]["seconds"] == 138.0 and record["median"]["preloaded"]["seconds"] == 122.0
    assert record["speedup"] == pytest.approx(138.0 / 122.0)
    assert record["median"]["plain"]["logprobs_s"] == pytest.approx(13.8) and record["median"]["plain"]["teacher_s"] == 2
    assert record["same_samples"] and record["order"] == ["plain", "preloaded", "preloaded", "plain"]
    assert not bench.summarize([_round("plain", 1.0), _round("preloaded", 1.0, tokens=701)], [], args)["same_samples"]
    assert "speedup" not in bench.summarize(rounds[:1], [], args)  # one runtime so far: nothing to compare


def test_each_round_runs_with_its_runtimes_preload_and_the_benchmarks_own_is_restored(tmp_path, monkeypatch) -> None:
    seen: list[str] = []

    class Pool:  # the spawned process inherits os.environ as it is when the pool starts
        def __init__(self, processes: int) -> None: ...
        def __enter__(self) -> Pool: return self
        def __exit__(self, *exc: object) -> None: ...
        def apply(self, fn: Any, args: tuple[Any, ...]) -> dict[str, Any]:
            seen.append(os.environ["LD_PRELOAD"])
            return _round("?", 1.0)

    monkeypatch.setattr(bench.multiprocessing, "get_context", lambda method: type("Ctx", (), {"Pool": Pool}))
    monkeypatch.setenv("LD_PRELOAD", "/user/lib.so")
    args = bench.argparse.Namespace(config="cpu-tiny", dtype="float32", episodes=32, kv_cache_gib=1.0)
    assert bench.one_round("preloaded", ["/a/libtc.so", "/b/libiomp5.so"], args)["runtime"] == "preloaded"
    bench.one_round("plain", ["/a/libtc.so", "/b/libiomp5.so"], args)
    assert seen == ["/a/libtc.so:/b/libiomp5.so", ""] and os.environ["LD_PRELOAD"] == "/user/lib.so"


def test_it_refuses_to_run_already_preloaded(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("LD_PRELOAD", "/a/libtc.so")
    with pytest.raises(SystemExit, match="without LD_PRELOAD"):
        bench.main(["--out", str(tmp_path / "c.json")])
    assert not (tmp_path / "c.json").exists()
