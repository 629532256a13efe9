"""benchmarks/bench_precision.py on a CPU whose probe rules bf16 out: the float32 phases are measured, the bf16 ones
are not (they would take hours), and the record and the docs' table say why; results name such a CPU apart from
one of the same family with bf16 instructions."""

from __future__ import annotations

import pytest
import torch
from benchmark_scripts import load_benchmark

from agentgym_opsd.models import precision
from agentgym_opsd.models.precision import ProbeResult

bp = load_benchmark("bench_precision")
harness = load_benchmark("harness")
render = load_benchmark("render_results")


def _fp32_figures() -> dict:
    return {"phases": dict.fromkeys(bp.PHASES, 2.0), "rollout_tokens_per_s": 40.0, "rollout_success": 0.5,
            "sampler_vs_pass": {"mean": 3e-6, "max": 1e-4, "tokens": 100},
            "update_start": {"logprob_gap/mean": 0.0, "logprob_gap/max": 0.0, "ppo/start_ratio_max_dev": 0.0},
            "tis": {}, "trajs": [], "old_logprobs": [torch.tensor([-0.5, -1.0])], "float32_trainable": False,
            "trainable_autocast": False}


@pytest.mark.parametrize(("speedup", "force", "measured"), [(0.02, False, ["float32"]),
                                                            (0.02, True, ["float32", "bfloat16"]),
                                                            (0.5, False, ["float32", "bfloat16"])])
def test_bf16_phases_run_only_where_the_probe_leaves_bf16_a_chance(monkeypatch, tmp_path, speedup, force,
                                                                    measured) -> None:
    measures: list[str] = []
    monkeypatch.setattr(bp, "probe_matmuls", lambda device: ProbeResult(100.0, 100.0 * speedup))
    monkeypatch.setattr(bp, "measure_peak_flops_at", lambda threads, dtype: {"512": 1e11})
    monkeypatch.setattr(bp, "measure", lambda dtype, *a: measures.append(dtype) or _fp32_figures())
    monkeypatch.setattr(bp, "render_pages", lambda: None)
    monkeypatch.setattr(bp, "plot", lambda record, path: None)
    monkeypatch.setattr(bp, "cpu_model", lambda: "Test CPU (family 25 model 1, AVX2, no bf16 instructions)")
    out = tmp_path / "precision.json"
    bp.main(["--out", str(out), *(["--force-bf16"] if force else [])])
    assert measures == measured
    record = harness.read_machines(out)["Test CPU (family 25 model 1, AVX2, no bf16 instructions)"]
    assert ("bf16_skipped" in record) == (measured == ["float32"])
    assert list(record["matmul_peak_gflops"]) == measured
    monkeypatch.setattr(render, "_load", lambda name: {"machines": {"Test CPU": record}})
    text = render.render_precision()
    if "bf16_skipped" in record:
        assert "bfloat16 not run: the probe measured bf16 matmuls at 0.02x float32" in text
        assert "| RL step | 8.0 |" in text and "bfloat16 s" not in text
    else:
        assert "| RL step | 8.0 | 8.0 | 1.00× |" in text and ", bfloat16 " in text


@pytest.mark.parametrize(("flags", "isa"), [("fpu avx2 fma", "AVX2, no bf16 instructions"),
                                            ("avx2 avx512f avx512_bf16", "AVX512-BF16"),
                                            ("avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "AMX-BF16"),
                                            ("avx2 avx512f", "AVX-512, no bf16 instructions")])
def test_results_name_the_cpu_with_its_bf16_instructions(monkeypatch, flags, isa) -> None:
    info = {"model name": "AMD EPYC", "cpu family": "25", "model": "1", "flags": flags}
    monkeypatch.setattr(precision, "first_cpu", lambda: info)
    assert harness.cpu_model() == f"AMD EPYC (family 25 model 1, {isa})"
