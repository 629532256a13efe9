"""benchmarks/bench_hf_sampler.py: the alternating round order, and real (tiny) runs whose records say both modes
sampled the same tokens: the shared prefix fed the model fewer prompt tokens, the reserved KV cache the same ones."""

from __future__ import annotations

import json

from benchmark_scripts import load_benchmark

bench = load_benchmark("bench_hf_sampler")


def test_the_rounds_alternate_so_each_mode_goes_first_in_half_the_pairs() -> None:
    assert bench.order(("shared", "whole"), 1) == ["shared", "whole"]
    assert bench.order(("shared", "whole"), 2) == ["shared", "whole", "whole", "shared"]


def test_a_tiny_run_samples_alike_in_both_modes_and_feeds_fewer_tokens_shared(tmp_path) -> None:
    out = tmp_path / "h.json"
    bench.main(["--config", "cpu-tiny", "--episodes", "4", "--rounds", "1", "--out", str(out)])
    (record,) = json.loads(out.read_text())["machines"].values()
    assert record["same_samples"] is True
    shared, whole = record["modes"]["shared"], record["modes"]["whole"]
    assert 0 < shared["fed_tokens"] < whole["fed_tokens"]
    assert whole["rounds"][0]["min_shared_prefix"] > shared["rounds"][0]["min_shared_prefix"]
    assert shared["rounds"][0]["generated_tokens"] == whole["rounds"][0]["generated_tokens"] > 0


def test_a_tiny_run_samples_alike_with_the_reserved_and_the_concatenating_cache(tmp_path) -> None:
    out = tmp_path / "k.json"
    bench.main(["--compare", "kv-cache", "--config", "cpu-tiny", "--episodes", "4", "--rounds", "1",
                "--set", "rollout.max_new_tokens=12", "--out", str(out)])
    (record,) = json.loads(out.read_text())["machines"].values()
    assert record["compare"] == "kv-cache" and record["settings"] == ["rollout.max_new_tokens=12"]
    assert record["same_samples"] is True
    reserved, concatenated = record["modes"]["reserved"], record["modes"]["concatenated"]
    assert reserved["fed_tokens"] == concatenated["fed_tokens"] > 0
    assert reserved["rounds"][0]["cache_layers"] == ["ReservedLayer"]  # the switch was in effect
    assert concatenated["rounds"][0]["cache_layers"] == ["DynamicLayer"]


def test_a_tiny_run_samples_alike_with_the_packed_and_the_padded_prefill(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(bench.hf_policy, "PACKED_PREFILL_MIN_PADDING", 0.0)  # the tiny prompts pad little
    out = tmp_path / "p.json"
    bench.main(["--compare", "packed-prefill", "--config", "cpu-tiny", "--episodes", "8", "--rounds", "1",
                "--set", "rollout.max_new_tokens=12", "--out", str(out)])
    (record,) = json.loads(out.read_text())["machines"].values()
    assert record["compare"] == "packed-prefill" and record["same_samples"] is True
    packed, padded = record["modes"]["packed"], record["modes"]["padded"]
    assert 0 < packed["fed_tokens"] < padded["fed_tokens"]  # the switch was in effect: no padding fed


def test_a_tiny_run_times_the_blocks_under_autocast_and_in_float32(tmp_path) -> None:
    out = tmp_path / "a.json"
    bench.main(["--compare", "autocast", "--config", "cpu-tiny", "--episodes", "4", "--rounds", "1",
                "--set", "model.trainable_layers=1", "--set", "model.trainable_dtype=float32",
                "--set", "rollout.max_new_tokens=8", "--out", str(out)])
    (record,) = json.loads(out.read_text())["machines"].values()
    autocast, float32 = record["modes"]["autocast"], record["modes"]["float32-blocks"]
    assert autocast["rounds"][0]["autocasting_blocks"] == 1 and float32["rounds"][0]["autocasting_blocks"] == 0
    assert autocast["rounds"][0]["generated_tokens"] > 0 and float32["rounds"][0]["generated_tokens"] > 0


def test_a_setting_with_an_absolute_path_keeps_only_its_last_folders() -> None:
    assert bench.portable("model.name_or_path=/home/me/cache/warm_start/eb82/model") == (
        "model.name_or_path=…/warm_start/eb82/model")
    assert bench.portable("rollout.max_new_tokens=12") == "rollout.max_new_tokens=12"
