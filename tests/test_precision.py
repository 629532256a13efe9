"""bf16 on the CPU: `model.dtype: auto` resolves per machine, bf16 training keeps float32 master weights, and a
bf16 step gives the float32 step's log-probs (within bf16 rounding) and its advantages' signs."""

from __future__ import annotations

import math

import pytest
import torch

from agentgym_opsd.models import precision
from agentgym_opsd.models.precision import resolve_dtype
from agentgym_opsd.trainer.config import ConfigError, OptimConfig, load_config
from agentgym_opsd.trainer.engine import TorchEngine
from agentgym_opsd.trainer.loop import Trainer
from agentgym_opsd.trainer.losses import START_RATIO_BOUND, StartDrift
from agentgym_opsd.trainer.phases import PolicyLogProbs


def test_explicit_dtypes_pass_through_and_bad_names_are_refused() -> None:
    for name in ("float32", "bfloat16", "float16"):
        assert resolve_dtype(name, "cpu") == name
    with pytest.raises(ValueError, match="model.dtype"):
        resolve_dtype("bf16", "cpu")
    with pytest.raises(ConfigError, match="model.dtype"):
        load_config("cpu-tiny", ["model.dtype=half"])


@pytest.mark.parametrize(("flags", "expected"), [("fpu avx512f avx512_bf16 avx512_vnni", "float32"),
                                                  ("fpu avx512_bf16 amx_bf16 amx_tile", "bfloat16"),
                                                  ("fpu sse4_2 avx2 avx512f", "float32"),
                                                  ("", "float32")])
def test_auto_follows_the_cpu_flags(monkeypatch, flags, expected) -> None:
    monkeypatch.setattr(precision, "_cpu_flags", lambda: set(flags.split()))
    precision.cpu_bf16_support.cache_clear()
    try:
        assert resolve_dtype("auto", "cpu") == expected
        ok, why = precision.cpu_bf16_support()
        assert ok == (expected == "bfloat16") and why
    finally:
        precision.cpu_bf16_support.cache_clear()


def test_cpu_flags_are_read_from_cpuinfo(tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx512_bf16 amx_bf16\n\n")
    assert precision._cpu_flags(cpuinfo) == {"fpu", "avx512_bf16", "amx_bf16"}
    assert precision._cpu_flags(tmp_path / "missing") == set()


def _tiny_linear(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(16, 1, bias=False).to(dtype)


def test_bf16_training_keeps_float32_master_weights() -> None:
    """Updates far below bf16's resolution add up in the masters and reach the bf16 weights; AdamW straight
    on bf16 weights would round every one of them away."""
    cfg = OptimConfig(lr=1e-5, grad_clip=0.0, weight_decay=0.0)
    model = _tiny_linear(torch.bfloat16)
    engine = TorchEngine(model, cfg)
    assert engine.master_weights
    start = model.weight.detach().float().clone()
    x = torch.ones(4, 16, dtype=torch.bfloat16)
    for _ in range(200):  # AdamW moves each weight by ~lr per step: 2e-3 in all, vs bf16 spacing ~4e-3 near 0.2
        for k in range(2):  # two micro-batches: the gradient accumulates in float32
            engine.backward(model(x).float().sum(), is_last=k == 1)
        engine.step()
    master = engine._pairs[0][1]
    assert master.dtype == torch.float32
    moved = (start - master.detach()).abs()
    assert float(moved.min()) == pytest.approx(200 * 1e-5, rel=0.05)
    assert torch.equal(model.weight.detach(), master.detach().to(torch.bfloat16))  # rounded from the masters

    naive = _tiny_linear(torch.bfloat16)
    opt = torch.optim.AdamW(naive.parameters(), lr=1e-5, weight_decay=0.0)
    for _ in range(20):
        naive(x).float().sum().backward()
        opt.step()
        opt.zero_grad()
    large = start.abs() > 0.03  # bf16's spacing there is >= 1.2e-4, twelve times an update
    assert torch.equal(naive.weight.detach().float()[large], start[large])  # every such update rounded away


def test_master_weights_survive_a_checkpoint_round_trip() -> None:
    cfg = OptimConfig(lr=1e-3, grad_clip=1.0)
    model = _tiny_linear(torch.bfloat16)
    engine = TorchEngine(model, cfg)
    x = torch.randn(4, 16).to(torch.bfloat16)
    engine.backward(model(x).float().pow(2).sum(), is_last=True)
    engine.step()
    state = engine.state_dict()
    resumed_model = _tiny_linear(torch.bfloat16)
    resumed = TorchEngine(resumed_model, cfg)
    resumed.load_state_dict(state)
    assert torch.equal(resumed._pairs[0][1], engine._pairs[0][1])  # float32 bits, not the bf16 rounding
    assert torch.equal(resumed_model.weight, model.weight)


def test_float32_models_keep_the_plain_optimiser() -> None:
    engine = TorchEngine(_tiny_linear(torch.float32), OptimConfig())
    assert not engine.master_weights and "master_weights" not in engine.state_dict()


def test_start_drift_metrics() -> None:
    drift = StartDrift()
    assert drift.metrics()["logprob_gap/max"] == 0.0
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    drift.add(logp, logp + torch.tensor([[0.01, -0.03, 5.0]]), torch.tensor([[True, True, False]]))
    m = drift.metrics()
    assert m["logprob_gap/mean"] == pytest.approx(0.02) and m["logprob_gap/max"] == pytest.approx(0.03)
    assert m["ppo/start_ratio_max_dev"] == pytest.approx(math.expm1(0.03))


def _trainer(tmp_path, dtype: str, backend: str = "torch", *extra: str) -> Trainer:
    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", f"trainer.output_dir={tmp_path / dtype / backend}",
                                   f"trainer.backend={backend}", "trainer.tensorboard=false",
                                   f"model.dtype={dtype}", *extra])
    return Trainer(cfg)


@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
def test_bf16_step_matches_float32_logprobs_and_advantage_signs(tmp_path, toy_env_ids, backend) -> None:
    """The same trajectories scored by a float32 and a bf16 trainer of the same weights: log-probs within bf16
    rounding, the same sign of every advantage, and a bf16 update whose ratio starts at 1 within the bound."""
    fp32 = _trainer(tmp_path, "float32", backend)
    bf16 = _trainer(tmp_path, "bfloat16", backend)
    try:
        assert next(bf16.session.trained.model.parameters()).dtype == torch.bfloat16
        trajs = fp32.collect()
        out = {}
        for name, trainer in (("fp32", fp32), ("bf16", bf16)):
            batch = trainer.score(trajs)
            logprobs = PolicyLogProbs(trainer.session.trained.logprobs(batch.prompt_ids, batch.response_ids))
            out[name] = logprobs, trainer.credit(batch, trainer.teacher(batch, logprobs))
        (old_a, a), (old_b, b) = out["fp32"], out["bf16"]
        gaps = torch.cat([(x - y).abs() for x, y in zip(old_a.old, old_b.old, strict=True)])
        # a random tiny model's log-probs are ~ -10.8 (uniform over 49k tokens): bf16 keeps 3 significant digits
        assert float(gaps.mean()) < 0.05 and float(gaps.max()) < 0.25, (float(gaps.mean()), float(gaps.max()))
        sign_a, sign_b = torch.sign(a.seq), torch.sign(b.seq)
        assert torch.equal(sign_a, sign_b)
        tok_a, tok_b = a.token_values, b.token_values
        clear = tok_a.abs() > 1e-3  # tokens whose advantage is not a rounding-level reshaping around 0
        assert torch.equal(torch.sign(tok_a[clear]), torch.sign(tok_b[clear].to(tok_a.dtype)))

        metrics, _ = bf16.step_on(trajs)
        assert metrics["ppo/start_ratio_max_dev"] <= START_RATIO_BOUND
        assert metrics["logprob_gap/mean"] <= metrics["logprob_gap/max"]
        assert all(torch.isfinite(p).all() for p in bf16.session.trained.model.parameters())
    finally:
        fp32.close()
        bf16.close()
