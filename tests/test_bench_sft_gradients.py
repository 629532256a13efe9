"""benchmarks/bench_sft_gradients.py's figures: an error the same in every batch survives averaging, rounding-like
noise shrinks as 1/sqrt(batches); its sizes are read against the gradient and against the batches' own spread; the
rounded-weights numerics round only the matrices and puts them back."""

from __future__ import annotations

import math

import pytest
import torch
from benchmark_scripts import load_benchmark
from hypothesis import given, settings
from hypothesis import strategies as st

bsg = load_benchmark("bench_sft_gradients")
render = load_benchmark("render_results")

NAMES = ("model.layers.29.self_attn.q_proj.weight", "model.layers.29.mlp.down_proj.weight", "model.norm.weight")


def _batches(n: int, seed: int, error) -> tuple[list[dict], list[dict]]:
    gen = torch.Generator().manual_seed(seed)
    mean = {name: torch.randn(4000, generator=gen) for name in NAMES}
    grads32 = [{name: mean[name] + 0.5 * torch.randn(4000, generator=gen) for name in NAMES} for _ in range(n)]
    return grads32, [{name: g[name] + error(name, gen) for name in NAMES} for g in grads32]


def test_the_tensor_kinds_and_the_whole() -> None:
    assert [bsg.kind_of(n) for n in NAMES] == ["q_proj", "down_proj", "other"]
    grads32, grads = _batches(4, 0, lambda name, gen: torch.zeros(4000))
    agreement = bsg.Agreement()
    for a, b in zip(grads32, grads, strict=True):
        agreement.add(a, b)
    figures = agreement.figures()
    assert set(figures) == {"q_proj", "down_proj", "other", bsg.ALL}
    assert figures[bsg.ALL]["numel"] == 3 * 4000 and figures[bsg.ALL]["tensors"] == 3
    assert figures[bsg.ALL]["error_vs_gradient"] == 0 and figures[bsg.ALL]["cosine"] == pytest.approx(1)
    assert figures[bsg.ALL]["sign_flips"] == 0 and figures[bsg.ALL]["error_kept_by_averaging"] == 0


@settings(max_examples=10, deadline=None)
@given(batches=st.integers(4, 16), seed=st.integers(0, 10_000))
def test_a_bias_survives_averaging_and_noise_does_not(batches: int, seed: int) -> None:
    bias = {name: 0.01 * torch.randn(4000, generator=torch.Generator().manual_seed(seed + 1)) for name in NAMES}
    for error, kept in ((lambda name, gen: bias[name], 1.0),
                        (lambda name, gen: 0.01 * torch.randn(4000, generator=gen), batches ** -0.5)):
        grads32, grads = _batches(batches, seed, error)
        agreement = bsg.Agreement()
        for a, b in zip(grads32, grads, strict=True):
            agreement.add(a, b)
        whole = agreement.figures()[bsg.ALL]
        assert whole["error_kept_by_averaging"] == pytest.approx(kept, rel=0.15)
        # the gradient's norm is about sqrt(1.25 * numel), the batches' spread sqrt(0.25 * numel) (less a little:
        # the spread is measured around the batches' own mean), the error's 0.01 * sqrt(numel)
        assert whole["error_vs_gradient"] == pytest.approx(0.01 / math.sqrt(1.25), rel=0.1)
        assert whole["error_vs_batch_spread"] == pytest.approx(0.01 / math.sqrt(0.25 * (1 - 1 / batches)), rel=0.1)
        assert 0 < whole["sign_flips"] < 0.02


def test_rounded_weights_round_the_matrices_only_and_put_them_back() -> None:
    layer = torch.nn.Linear(3, 2)
    params = {"w": layer.weight, "b": layer.bias}
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1 + 2**-12, 1.0, 0.5], [0.25, 3 + 2**-10, 1.0]]))
        layer.bias.copy_(torch.tensor([1 + 2**-12, 0.0]))
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    with bsg.weights_rounded(params):
        assert torch.equal(layer.weight, weight.to(torch.bfloat16).float())
        assert not torch.equal(layer.weight, weight)
        assert torch.equal(layer.bias, bias)  # a vector stays as it is (the norms compute in float32 anyway)
    assert torch.equal(layer.weight, weight) and torch.equal(layer.bias, bias)


def test_the_results_page_renders_each_weights_and_numerics(monkeypatch) -> None:
    by_kind = {"q_proj": {"error_vs_gradient": 0.014, "error_vs_batch_spread": 0.05, "error_kept_by_averaging": 0.6,
                          "cosine": 0.9999, "sign_flips": 0.005},
               "down_proj": {"error_vs_gradient": 0.006, "error_vs_batch_spread": 0.04,
                             "error_kept_by_averaging": 0.6, "cosine": 0.9999, "sign_flips": 0.003}}
    by_kind[bsg.ALL] = {"error_vs_gradient": 0.0096, "error_vs_batch_spread": 0.0414, "error_kept_by_averaging": 0.635,
                        "cosine": 0.99996, "sign_flips": 0.0036}
    data = {"machines": {"Test CPU": {"cpu": "Test CPU", "runs": {"initial": {
        "config": "cpu-small", "seed": 0, "batches": 16, "note": "as loaded",
        "loss": {}, "vs_float32": {"autocast": by_kind}}}}}}
    monkeypatch.setattr(render, "_load", lambda name: data)
    page = render.render_sft_gradients()
    assert "| initial | autocast | 16 | 0.0096 | 0.0414 | 0.64 (noise: 0.25) | 0.99996 | 0.36% | q_proj (0.0140) |" in page
    assert "_Test CPU, cpu-small, seed 0's SFT batches. initial: as loaded_" in page
