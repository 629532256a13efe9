"""bf16 on the CPU: `model.dtype: auto` resolves per machine, bf16 training keeps float32 master weights, and a
bf16 step gives the float32 step's log-probs (within bf16 rounding) and its advantages' signs."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_opsd.models import precision
from agentgym_opsd.models.backends import VLLM_CPU_MIN_EPISODES, choose_rollout_backend
from agentgym_opsd.models.precision import resolve_dtype
from agentgym_opsd.trainer.config import ConfigError, OptimConfig, load_config
from agentgym_opsd.trainer.engine import TorchEngine, dither_masters
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


def _stub_probe(f32: float, bf16: float, calls: list[int]):
    def probe(device, dims):
        calls.append(1)
        return precision.ProbeResult(f32, bf16)
    return probe


@pytest.mark.parametrize(("f32", "bf16", "expected"), [(198.0, 883.0, "bfloat16"),   # AMD EPYC family 26
                                                       (309.0, 145.0, "float32"),    # the Intel part
                                                       (100.0, 125.0, "float32")])   # below the 1.3x bar
def test_auto_follows_the_measured_speed_not_the_flags(monkeypatch, tmp_path, f32, bf16, expected) -> None:
    calls: list[int] = []
    monkeypatch.setattr(precision, "probe_matmuls", _stub_probe(f32, bf16, calls))
    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path))
    assert resolve_dtype("auto", "cpu") == expected
    assert resolve_dtype("auto", "cpu") == expected
    assert len(calls) == 1  # the second call read the cache
    entries = json.loads((tmp_path / precision.PROBE_FILE).read_text())
    (key, entry), = entries.items()
    assert key == precision.machine_key("cpu") and entry == {"float32_gflops": f32, "bfloat16_gflops": bf16}


@pytest.mark.parametrize(("f32", "bf16", "expected"), [(198.0, 883.0, "on"), (309.0, 145.0, "off")])
def test_autocast_auto_follows_the_same_measurement(monkeypatch, tmp_path, f32, bf16, expected) -> None:
    """`model.autocast: auto` is on where bf16 measures faster and the trainable blocks are float32 over a bf16
    model, so a bf16 forced on a CPU slow at it keeps its blocks' matmuls in float32; on / off are kept."""
    calls: list[int] = []
    monkeypatch.setattr(precision, "probe_matmuls", _stub_probe(f32, bf16, calls))
    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path))
    top = ["model.trainable_layers=1", "model.trainable_dtype=float32"]
    forced = load_config("cpu-tiny", ["model.dtype=bfloat16", *top]).model
    assert forced.autocast == "auto" and not forced.trainable_autocast  # unresolved: off
    assert forced.resolved("cpu").autocast == expected
    assert forced.resolved("cpu").trainable_autocast == (expected == "on")
    auto = load_config("cpu-tiny", ["model.dtype=auto", *top]).model.resolved("cpu")
    assert (auto.dtype, auto.autocast) == (("bfloat16", "on") if expected == "on" else ("float32", "off"))
    assert len(calls) == 1  # one probe for both, cached
    for value, kept in (("true", "on"), ("false", "off"), ("on", "on"), ("off", "off")):
        assert load_config("cpu-tiny", [f"model.autocast={value}", *top]).model.resolved("cpu").autocast == kept
    assert load_config("cpu-tiny", ["model.dtype=float32", *top]).model.resolved("cpu").autocast == "off"
    # float16's autocast would want a loss scaler: auto leaves it off
    assert load_config("cpu-tiny", ["model.dtype=float16", *top]).model.resolved("cpu").autocast == "off"
    with pytest.raises(ConfigError, match="model.autocast"):
        load_config("cpu-tiny", ["model.autocast=bf16"])


def test_probe_cache_is_per_machine_and_survives_damage(monkeypatch, tmp_path) -> None:
    cache = tmp_path / "probe.json"
    calls: list[int] = []
    probe = _stub_probe(100.0, 300.0, calls)
    assert precision.probe_bf16("cpu", probe=probe, cache=cache).bf16_pays
    monkeypatch.setattr(precision, "_cpu_info", lambda: ("Another CPU", "fpu avx2"))
    assert precision.probe_bf16("cpu", probe=_stub_probe(300.0, 100.0, calls), cache=cache).speedup < 1
    assert len(json.loads(cache.read_text())) == 2 and len(calls) == 2  # both machines' figures side by side
    cache.write_text("{not json")
    assert precision.probe_bf16("cpu", probe=probe, cache=cache).speedup == 3.0 and len(calls) == 3


def test_the_real_probe_measures_both_formats() -> None:
    result = precision.probe_matmuls("cpu", (64, 128), tokens=64, seconds=0.05)
    assert result.float32_gflops > 0 and result.bfloat16_gflops > 0 and "GFLOP/s" in result.describe()


@pytest.mark.parametrize(("bf16_s", "rounds"), [(0.005, 3), (0.03, 3), (1.1, 1)])
def test_the_probe_stops_at_one_round_where_bf16_cannot_pay(bf16_s, rounds) -> None:
    """An AVX2 CPU without bf16 instructions (bf16 1.1 s a round against float32's 0.01 s) is settled by one
    round; anywhere bf16 could still reach the bar the probe takes its rounds."""
    seconds = {torch.float32: 0.01, torch.bfloat16: bf16_s}
    times = precision.timed_rounds(lambda dt: seconds[dt], seconds=0.0)
    assert len(times[torch.float32]) == len(times[torch.bfloat16]) == rounds


def test_cpu_info_is_read_from_cpuinfo(tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx512_bf16\n\nprocessor\t: 1\n")
    assert precision._cpu_info(cpuinfo) == ("AMD EPYC", "avx512_bf16 fpu")
    assert precision._cpu_info(tmp_path / "missing") == ("", "")


def test_float32_head_gives_float32_logits_and_trains_the_tied_weight() -> None:
    from agentgym_opsd.models.loading import load_policy_model

    model, _ = load_policy_model("tiny-random", dtype="bfloat16")
    head = model.get_output_embeddings()
    assert precision.has_float32_lm_head(model) and head.weight.dtype == torch.bfloat16
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        hidden = model.model(input_ids=ids).last_hidden_state
    assert logits.dtype == torch.float32
    expected = hidden.float() @ head.weight.detach().float().t()
    assert torch.allclose(logits, expected, atol=1e-5)
    assert not torch.equal(logits, (hidden @ head.weight.detach().t()).float())  # the bf16 head rounds
    model(input_ids=ids).logits.sum().backward()
    assert head.weight.grad is not None and head.weight.grad.dtype == torch.bfloat16
    fp32, _ = load_policy_model("tiny-random", dtype="float32")
    assert not precision.has_float32_lm_head(fp32)  # nothing to gain there


def test_tis_weights_for_a_known_gap() -> None:
    from agentgym_opsd.trainer.tis import SamplerCorrection

    old = [torch.tensor([math.log(0.3), math.log(0.6), math.log(0.9)]), torch.tensor([-1.0])]
    sampled = [[math.log(0.2), math.log(0.6), math.log(0.3)], []]  # row 2: the sampler's numbers are missing
    c = SamplerCorrection.compute(old, sampled, cap=2.0, enabled=True)
    assert torch.allclose(c.weights[0], torch.tensor([1.5, 1.0, 2.0]))  # 0.9 / 0.3 = 3 is cut at the cap
    assert torch.equal(c.weights[1], torch.ones(1))
    m = c.metrics()
    ratios = torch.tensor([1.5, 1.0, 3.0])
    assert m["tis/mismatch_k3"] == pytest.approx(float((ratios - 1 - ratios.log()).mean()))
    assert m["tis/weight_mean"] == pytest.approx(4.5 / 3) and m["tis/weight_max"] == pytest.approx(3.0)
    assert m["tis/clipped_fraction"] == pytest.approx(1 / 3) and m["tis/on"] == 1.0
    off = SamplerCorrection.compute(old, sampled, cap=2.0, enabled=False)
    assert all(torch.equal(w, torch.ones_like(w)) for w in off.weights) and off.metrics()["tis/on"] == 0.0
    with pytest.raises(ValueError, match="tis_cap"):
        SamplerCorrection.compute(old, sampled, cap=1.0, enabled=True)


def test_tis_is_on_where_the_sampler_differs() -> None:
    from agentgym_opsd.trainer.tis import tis_enabled

    assert not tis_enabled("auto", backend="hf", low_precision=False, reuses_sampler=False)
    assert tis_enabled("auto", backend="hf", low_precision=True, reuses_sampler=False)
    assert tis_enabled("auto", backend="vllm", low_precision=False, reuses_sampler=False)
    assert not tis_enabled("on", backend="vllm", low_precision=True, reuses_sampler=True)  # weights would be 1
    assert tis_enabled("on", backend="hf", low_precision=False, reuses_sampler=False)
    assert not tis_enabled("off", backend="vllm", low_precision=True, reuses_sampler=False)
    with pytest.raises(ConfigError, match="algorithm.tis_cap"):
        load_config("cpu-tiny", ["algorithm.tis_cap=0.5"])
    with pytest.raises(ConfigError, match="algorithm.tis"):
        load_config("cpu-tiny", ["algorithm.tis=maybe"])


def test_tis_weights_scale_each_tokens_policy_term() -> None:
    from agentgym_opsd.trainer.losses import clipped_policy_loss

    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    weights = torch.tensor([[2.0, 0.5]])
    plain, _ = clipped_policy_loss(logp, logp.detach(), adv, mask, clip_low=0.2, clip_high=0.2)
    weighted, _ = clipped_policy_loss(logp, logp.detach(), adv, mask, clip_low=0.2, clip_high=0.2,
                                      tis_weights=weights)
    assert float(plain.detach()) == pytest.approx(0.0) and float(weighted.detach()) == pytest.approx(-2.0 + 0.5)
    (grad,) = torch.autograd.grad(weighted, logp)
    assert torch.allclose(grad, -adv * weights)  # d(-r A w)/dlogp at r = 1


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
    start = engine._pairs[0][1].detach().clone()  # the masters' start (dithered within the weights' cells)
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
    bf16_start = _tiny_linear(torch.bfloat16).weight.detach().float()
    large = bf16_start.abs() > 0.03  # bf16's spacing there is >= 1.2e-4, twelve times an update
    assert torch.equal(naive.weight.detach().float()[large], bf16_start[large])  # every such update rounded away


def _bf16_weights(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, generator=g) * 0.05
    w[:4] = torch.tensor([0.0, -0.0, 1e-40, -3.0e38])  # zero, a subnormal, near the largest finite bf16
    return w.to(torch.bfloat16)


@given(st.integers(0, 2**31 - 1))
@settings(max_examples=25, deadline=None)
def test_dithered_masters_round_back_to_the_model(seed) -> None:
    low = _bf16_weights(4096, seed)
    master = torch.empty(low.shape)
    dither_masters([(low, master)], seed=seed)
    assert torch.equal(master.to(torch.bfloat16), low)  # the rounded model is unchanged
    assert torch.isfinite(master).all() and float((master != low.float()).float().mean()) > 0.9


def test_dithered_masters_pass_small_updates_on_in_expectation() -> None:
    """An update of a tenth of a cell: from masters on the grid no weight moves; from dithered masters a tenth
    of them move by one cell, so the model's mean change is the update (within sampling error)."""
    low = torch.full((200_000,), 0.1).to(torch.bfloat16)  # one cell size for all: 2^-4 * 2^-7 near 0.1
    cell = float(torch.nextafter(low[:1], torch.tensor([1.0], dtype=torch.bfloat16)).float() - low[:1].float())
    delta = 0.1 * cell
    on_grid = low.float() + delta
    assert torch.equal(on_grid.to(torch.bfloat16), low)  # the dead zone: nothing reaches the model
    master = torch.empty(low.shape)
    dither_masters([(low, master)])
    moved = (master + delta).to(torch.bfloat16).float() - low.float()
    assert float(moved.mean()) == pytest.approx(delta, rel=0.05)
    assert float((moved != 0).float().mean()) == pytest.approx(0.1, abs=0.005)


def test_the_engines_dither_their_masters_only_when_asked() -> None:
    on = TorchEngine(_tiny_linear(torch.bfloat16), OptimConfig())
    off = TorchEngine(_tiny_linear(torch.bfloat16), OptimConfig(dither_masters=False))
    (w_on, m_on), (w_off, m_off) = on._pairs[0], off._pairs[0]
    assert torch.equal(m_off.detach(), w_off.detach().float())
    assert not torch.equal(m_on.detach(), w_on.detach().float()) and torch.equal(m_on.detach().to(torch.bfloat16), w_on)
    on.module.weight.data.copy_(torch.ones_like(w_on))  # weights loaded from outside: masters follow, dithered
    on.refresh_masters()
    assert torch.equal(m_on.detach().to(torch.bfloat16), on.module.weight.detach())
    assert on.low_precision_stats() == {}  # no step yet


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
        # π_old in the update's packed layout: the update's first forward rounds exactly alike
        assert metrics["ppo/start_ratio_max_dev"] <= START_RATIO_BOUND
        assert metrics["tis/on"] == 1.0 and math.isfinite(metrics["tis/mismatch_k3"])
        assert metrics["logprob_gap/mean"] <= metrics["logprob_gap/max"]
        assert all(torch.isfinite(p).all() for p in bf16.session.trained.model.parameters())
        assert 0.0 < metrics["precision/weights_changed"] <= 1.0  # the bf16 weights the update's steps moved
        if backend == "deepspeed":  # DeepSpeed's own fp32 masters, dithered like the torch engine's
            pairs = bf16.session.trained.engine.master_pairs()
            assert pairs and all(torch.equal(m.detach().to(low.dtype), low.detach()) for low, m in pairs)
        assert "precision/weights_changed" not in fp32.step_on(trajs)[0]
    finally:
        fp32.close()
        bf16.close()


@pytest.mark.parametrize(("requested", "device", "episodes", "installed", "expected"), [
    ("hf", "cpu", 10_000, True, "hf"),             # asked for: kept, even where vLLM would pay
    ("vllm", "cpu", 1, False, "vllm"),             # asked for: building it says what is missing
    ("auto", "cpu", 10_000, False, "hf"),          # not installed
    ("auto", "cuda", 1, True, "vllm"),             # a GPU: the start pays for any run
    ("auto", "cpu", VLLM_CPU_MIN_EPISODES, True, "vllm"),
    ("auto", "cpu", VLLM_CPU_MIN_EPISODES - 1, True, "hf"),  # too few episodes to pay for the engine's start
    ("auto", "mps", 10_000, True, "hf"),           # no vLLM build for it
])
def test_auto_rollout_backend_is_vllm_where_installed_and_its_start_pays(requested, device, episodes, installed,
                                                                          expected) -> None:
    choice = choose_rollout_backend(requested, device_type=device, planned_episodes=episodes, vllm_installed=installed)
    assert choice.name == expected and choice.reason
    with pytest.raises(ValueError, match="unknown generation backend 'vlm'"):
        choose_rollout_backend("vlm", device_type="cpu", planned_episodes=1)


def test_planned_episodes_count_rollouts_and_validations() -> None:
    # cpu-small: 6 steps x 2 tasks x 4 rollouts, validated before and after on 48 held-out episodes and the
    # 16-game pool x 4: what vLLM's engine start is weighed against
    cfg = load_config("cpu-small")
    t = cfg.trainer
    assert (t.total_steps, t.eval_every, t.eval_at_start) == (6, 6, True)
    pool = cfg.env.num_train_tasks * t.eval_pool_rollouts
    assert cfg.planned_episodes() == 6 * 2 * 4 + 2 * (t.eval_episodes + pool) == 48 + 2 * (48 + 64)
    assert load_config("cpu-small", ["trainer.total_steps=0", "trainer.eval_at_start=false"]).planned_episodes() == 0
    assert load_config("cpu-small").rollout.backend == "auto"


def test_tally_sample_is_a_bounded_strided_view_that_sees_in_place_steps():
    from trainer.engine import TALLY_SAMPLE, RoundingTally, tally_sample

    small, big = torch.zeros(10, dtype=torch.bfloat16), torch.zeros(1000, 577, dtype=torch.bfloat16)
    assert tally_sample(small).numel() == 10
    assert TALLY_SAMPLE <= tally_sample(big).numel() < 2 * TALLY_SAMPLE
    before = tally_sample(big).clone()
    big[::2] += 1  # an optimiser step writes the weights in place: every other row moves
    tally = RoundingTally()
    tally.add(before, tally_sample(big))
    assert tally.take()["precision/weights_changed"] == pytest.approx(0.5, abs=0.01)


def _share_changed(before: list[torch.Tensor], after: list[torch.Tensor]) -> float:
    """The share of the weights in `before` whose value differs in `after`."""
    return sum(int((a != b).sum()) for a, b in zip(after, before, strict=True)) / sum(b.numel() for b in before)


def test_trainable_layers_in_float32_take_the_whole_update_and_come_back_from_a_checkpoint(tmp_path) -> None:
    """`model.trainable_dtype=float32`: the top block computes in float32 over bf16 frozen blocks; an update far
    below bf16's resolution reaches every trainable weight (bf16 masters on the grid would move none), and a
    checkpoint loaded in bf16 gets the float32 weights back exactly."""
    from agentgym_opsd.models.loading import (
        freeze_lower_layers,
        keep_trainable_in_float32,
        load_policy_model,
        restore_float32_weights,
    )

    model, tok = load_policy_model("tiny-random", dtype="bfloat16", trainable=True)
    freeze_lower_layers(model, 1)
    assert keep_trainable_in_float32(model) > 0
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    assert dtypes == {torch.float32} and any(p.dtype == torch.bfloat16 for p in model.parameters())
    ids = tok(["go to the desk", "open drawer 1 now"], return_tensors="pt", padding=True)
    logits = model(**ids).logits
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    assert model.generate(**ids, max_new_tokens=3, do_sample=False).shape[1] == ids["input_ids"].shape[1] + 3

    engine = TorchEngine(model, OptimConfig(lr=1e-6, grad_clip=0.0))
    assert not engine.master_weights  # the model's own weights are the float32 ones the optimiser steps
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    engine.backward(model(**ids).logits.float().logsumexp(-1).mean(), is_last=True)
    engine.step()
    after = [p.detach() for p in model.parameters() if p.requires_grad]
    moved = _share_changed(before, after)
    assert moved > 0.9  # AdamW's first step moves every weight with a gradient by ~lr, 1e-6

    model.save_pretrained(str(tmp_path / "ckpt"), safe_serialization=True)
    tok.save_pretrained(str(tmp_path / "ckpt"))
    again, _ = load_policy_model(str(tmp_path / "ckpt"), dtype="bfloat16", trainable=True)
    freeze_lower_layers(again, 1)
    keep_trainable_in_float32(again)
    assert restore_float32_weights(again, tmp_path / "ckpt") == len(after)
    trained = dict(model.named_parameters())
    assert all(torch.equal(p, trained[n]) for n, p in again.named_parameters())


def test_trainable_dtype_is_checked_and_left_out_of_cache_keys_at_its_default(tmp_path) -> None:
    from agentgym_opsd.trainer.validation import start_evaluation_key

    with pytest.raises(ConfigError, match="model.trainable_dtype"):
        load_config("cpu-tiny", ["model.trainable_dtype=float16"])
    with pytest.raises(ConfigError, match="LoRA adapters are float32 already"):
        load_config("cpu-tiny", ["model.trainable_dtype=float32", "model.lora=true"])
    same = load_config("cpu-tiny", ["model.dtype=bfloat16"])
    f32 = load_config("cpu-tiny", ["model.dtype=bfloat16", "model.trainable_dtype=float32"])
    no_op = load_config("cpu-tiny", ["model.dtype=float32", "model.trainable_dtype=float32"])
    assert f32.model.float32_trainable and not same.model.float32_trainable and not no_op.model.float32_trainable
    for cfg in (same, no_op):  # where it changes nothing, the keys are those from before the field existed
        assert "trainable_dtype" not in json.dumps(_warm_start_settings(cfg, tmp_path))
    assert start_evaluation_key(same, threads=1, world_size=1) != start_evaluation_key(f32, threads=1, world_size=1)
    assert _warm_start_settings(same, tmp_path) != _warm_start_settings(f32, tmp_path)


def test_an_autocast_warm_start_of_float32_trainable_layers_computes_in_bf16_and_updates_in_float32(tmp_path) -> None:
    """`warm_start.autocast`: the forward in the model's bf16 (the LM head still float32), the weights and their
    updates float32, and the warm-start key says so (the entry differs from one computed in float32)."""
    from agentgym_opsd.models.loading import freeze_lower_layers, keep_trainable_in_float32, load_policy_model
    from agentgym_opsd.models.precision import float32_lm_head
    from agentgym_opsd.trainer.warm_start import Demonstration, sft_step

    model, tok = load_policy_model("tiny-random", dtype="bfloat16", trainable=True)
    freeze_lower_layers(model, 1)
    keep_trainable_in_float32(model)
    float32_lm_head(model)
    computed: list[torch.dtype] = []
    layer = model.model.layers[-1].mlp.down_proj  # a float32 weight: under autocast its matmul runs in bf16
    layer.register_forward_hook(lambda module, args, out: computed.append(out.dtype))
    engine = TorchEngine(model, OptimConfig(lr=1e-6, grad_clip=0.0))
    rows = [Demonstration(tok.encode("go to the desk"), tok.encode(" open drawer 1")) for _ in range(2)]
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    losses = [sft_step(engine, rows, [0, 1], pad_id=tok.pad_token_id, max_tokens=4096, max_rows=8, device="cpu",
                       autocast_dtype=torch.bfloat16, packed=packed) for packed in (False, True)]
    after = [p.detach() for p in model.parameters() if p.requires_grad]
    assert all(math.isfinite(loss) for loss in losses) and computed == [torch.bfloat16] * 2  # padded and packed
    assert all(p.dtype == torch.float32 for p in after)
    moved = _share_changed(before, after)
    assert moved > 0.9  # an update of ~1e-6 reaches the float32 weights whole

    top = ["model.dtype=bfloat16", "model.trainable_layers=1"]
    on = _warm_start_settings(load_config("cpu-tiny", [*top, "warm_start.autocast=true"]), tmp_path)
    assert on["sft_autocast"] == "torch.bfloat16" and "autocast" not in on["warm_start"]
    assert "sft_autocast" not in _warm_start_settings(load_config("cpu-tiny", top), tmp_path)  # off by default
    float32 = load_config("cpu-tiny", ["model.trainable_layers=1", "warm_start.autocast=true"])
    assert "sft_autocast" not in _warm_start_settings(float32, tmp_path)  # nothing to autocast


def test_trainable_dtype_auto_is_float32_where_only_the_top_layers_train_in_bf16(tmp_path) -> None:
    """The default, `auto`: float32 trainable layers over a bf16 model whose top `trainable_layers` train (the
    frozen ones keep bf16's speed); masters where every layer trains, and LoRA's own float32 adapters. It shares
    the cache entries of an explicit `float32`, and changes nothing in float32."""
    top = ["model.dtype=bfloat16", "model.trainable_layers=2"]
    auto = load_config("cpu-tiny", top)
    assert auto.model.trainable_dtype == "auto" and auto.model.float32_trainable
    assert not load_config("cpu-tiny", [*top, "model.trainable_dtype=same"]).model.float32_trainable
    assert not load_config("cpu-tiny", [*top, "model.lora=true"]).model.float32_trainable
    assert not load_config("cpu-tiny", ["model.dtype=bfloat16"]).model.float32_trainable  # every layer trains
    assert not load_config("cpu-tiny", ["model.dtype=float32", "model.trainable_layers=2"]).model.float32_trainable
    explicit = load_config("cpu-tiny", [*top, "model.trainable_dtype=float32"])
    assert _warm_start_settings(auto, tmp_path) == _warm_start_settings(explicit, tmp_path)


def test_model_autocast_runs_the_float32_blocks_matmuls_in_bf16_in_every_phase(tmp_path, toy_env_ids) -> None:
    """`model.autocast`: the float32 trainable blocks compute their matmuls in bf16 under autocast wherever the
    model runs (sampler, pi_old, update), so the PPO ratio still starts at 1; their weights and updates stay
    float32, a copy of the model (the KL reference) autocasts too, and the cache keys name it only where it
    applies."""
    top = ("model.trainable_layers=1", "model.trainable_dtype=float32", "model.autocast=true", "trainer.total_steps=1")
    trainer = _trainer(tmp_path, "bfloat16", "torch", *top)
    try:
        model = trainer.session.trained.model
        block = model.model.layers[-1]
        assert type(block).__name__.startswith("Autocast") and not type(model.model.layers[0]).__name__.startswith(
            "Autocast")
        computed: list[torch.dtype] = []
        block.mlp.down_proj.register_forward_hook(lambda module, args, out: computed.append(out.dtype))
        trajs = trainer.collect()
        before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
        metrics, _ = trainer.step_on(trajs)
        after = [p.detach() for p in model.parameters() if p.requires_grad]
        assert computed and set(computed) == {torch.bfloat16}
        assert metrics["ppo/start_ratio_max_dev"] <= START_RATIO_BOUND
        assert all(p.dtype == torch.float32 for p in after) and _share_changed(before, after) > 0.5
        trainer.session.reference.setup()
        assert type(trainer.session.reference.frozen_copy.model.layers[-1]).__name__.startswith("Autocast")
    finally:
        trainer.close()

    on = load_config("cpu-tiny", ["model.dtype=bfloat16", *top])
    off = load_config("cpu-tiny", ["model.dtype=bfloat16", *top[:2], "model.autocast=off"])
    float32 = load_config("cpu-tiny", ["model.dtype=float32", *top])
    assert on.model.trainable_autocast and not float32.model.trainable_autocast
    assert on.model.cache_key_settings()["autocast"] is True
    assert "autocast" not in off.model.cache_key_settings() and "autocast" not in float32.model.cache_key_settings()
    assert _warm_start_settings(on, tmp_path) == _warm_start_settings(off, tmp_path)  # the SFT computes in float32


def test_a_resumed_run_keeps_the_autocast_it_started_with_where_auto(tmp_path, toy_env_ids, monkeypatch) -> None:
    """A run checkpointed with the blocks in float32 (autocast off, or from before the field) and resumed with
    `model.autocast: auto` on a machine where auto means on keeps computing them in float32: the numerics do not
    change halfway through a run. `on` / `off` given by hand still win."""
    monkeypatch.setattr(precision, "probe_matmuls", _stub_probe(100.0, 400.0, []))
    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path / "cache"))
    top = ("model.trainable_layers=1", "model.trainable_dtype=float32", "trainer.save_every=1")
    first = _trainer(tmp_path, "bfloat16", "torch", *top, "model.autocast=off", "trainer.total_steps=1")
    try:
        first.train()
    finally:
        first.close()
    cfg = first.session.cfg
    for asked, expected in (("auto", "off"), ("on", "on")):
        resumed = Trainer(dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, autocast=asked),
            trainer=dataclasses.replace(cfg.trainer, total_steps=2)), resume="auto")
        try:
            assert resumed.session.state is not None and resumed.session.cfg.model.autocast == expected
            assert type(resumed.session.trained.model.model.layers[-1]).__name__.startswith("Autocast") == (
                expected == "on")
        finally:
            resumed.close()


def test_blocks_autocast_off_computes_the_autocast_blocks_in_float32_and_restores_them() -> None:
    """The warm start's switch (`blocks_autocast(model, enabled=False)`): inside it the autocast blocks' matmuls
    run in float32, after it in bf16 again, even when the block raised."""
    from agentgym_opsd.models.loading import (
        autocast_trainable_blocks,
        blocks_autocast,
        freeze_lower_layers,
        keep_trainable_in_float32,
        load_policy_model,
    )

    model, tok = load_policy_model("tiny-random", dtype="bfloat16", trainable=True)
    freeze_lower_layers(model, 1)
    keep_trainable_in_float32(model)
    assert autocast_trainable_blocks(model, torch.bfloat16) == 1
    with pytest.raises(ValueError, match="already"):
        autocast_trainable_blocks(model, torch.bfloat16)
    computed: list[torch.dtype] = []
    model.model.layers[-1].mlp.down_proj.register_forward_hook(lambda module, args, out: computed.append(out.dtype))
    ids = torch.as_tensor([tok.encode("go to the desk")])
    with torch.no_grad():
        model(input_ids=ids)
        with blocks_autocast(model, enabled=False):
            model(input_ids=ids)
        with pytest.raises(RuntimeError), blocks_autocast(model, enabled=False):
            raise RuntimeError("the SFT failed")
        model(input_ids=ids)
    assert computed == [torch.bfloat16, torch.float32, torch.bfloat16]


def _warm_start_settings(cfg, tmp_path) -> dict:
    from agentgym_opsd.trainer.warm_start import WarmStart

    return WarmStart(cfg, run_dir=tmp_path, system_prompt="", env_num_tasks=None).settings()


@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
def test_bf16_trainer_with_float32_trainable_layers_steps_and_resumes(tmp_path, toy_env_ids, backend) -> None:
    extra = ("model.trainable_layers=1", "model.trainable_dtype=float32", "trainer.total_steps=1",
             "trainer.save_every=1", f"trainer.backend={backend}")
    trainer = _trainer(tmp_path, "bfloat16", backend, *extra)
    try:
        trajs = trainer.collect()
        reference, trained = trainer.session.reference, trainer.session.trained
        reference.setup()  # the KL reference (kl_coef > 0): float32 where the policy is, so it starts equal
        float32 = {n for n, p in trained.model.named_parameters() if p.dtype == torch.float32}
        assert float32 and float32 == {n for n, p in reference.frozen_copy.named_parameters()
                                       if p.dtype == torch.float32}
        batch = trainer.score(trajs)
        ours = trained.logprobs(batch.prompt_ids, batch.response_ids)
        theirs = reference.logprobs(batch.prompt_ids, batch.response_ids)
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
        metrics, _ = trainer.step_on(trajs)
        assert metrics["ppo/start_ratio_max_dev"] <= START_RATIO_BOUND
        assert "precision/weights_changed" not in metrics  # no rounding between the optimiser and the model
        trainer.save()
        saved = {n: p.detach().clone() for n, p in trainer.session.trained.model.named_parameters()}
    finally:
        trainer.close()
    resumed = Trainer(load_config("cpu-tiny", ["env.id=ToyCounter-v0", "trainer.tensorboard=false",
                                               f"trainer.output_dir={tmp_path / 'bfloat16' / backend}",
                                               "model.dtype=bfloat16", *extra]), resume="auto")
    try:
        params = dict(resumed.session.trained.model.named_parameters())
        assert all(torch.equal(params[n], p) for n, p in saved.items())  # float32 layers exact, not rounded
    finally:
        resumed.close()


def test_start_evaluations_of_vllm_are_keyed_apart_from_before_one_seed_per_request() -> None:
    """A vLLM start evaluation cached before each request got its own seed repeated one sample per prompt: its key
    changed, so it is played again; an HF one keeps the key it had (nothing changed there)."""
    import hashlib

    from agentgym_opsd.trainer.validation import start_evaluation_key, start_key_config

    def key_before_the_change(cfg) -> str:
        blob = json.dumps({"config": start_key_config(cfg), "threads": 1, "world_size": 1}, sort_keys=True,
                          default=str)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]

    hf = load_config("cpu-tiny", ["rollout.backend=hf"])
    vllm = load_config("cpu-tiny", ["rollout.backend=vllm"])
    assert start_evaluation_key(hf, threads=1, world_size=1) == key_before_the_change(hf)
    assert start_evaluation_key(vllm, threads=1, world_size=1) != key_before_the_change(vllm)
