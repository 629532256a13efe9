"""bf16 on the CPU: `model.precision: auto` resolves per machine, the old precision keys are refused by name,
bf16 training keeps float32 master weights, and a
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
from agentgym_opsd.trainer.turn_batch import PolicyLogProbs


def test_explicit_dtypes_pass_through_and_bad_names_are_refused() -> None:
    for name in ("float32", "bfloat16", "float16"):
        assert resolve_dtype(name, "cpu") == name
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("bf16", "cpu")
    with pytest.raises(ConfigError, match="model.precision"):
        load_config("cpu-tiny", ["model.precision=half"])


@pytest.mark.parametrize("override", ["model.dtype=bfloat16", "model.trainable_dtype=float32", "model.autocast=on",
                                      "warm_start.autocast=true", "deepspeed.bf16=true", "optim.dither_masters=false",
                                      "algorithm.tis=on", "algorithm.recompute_old_logprobs=false"])
def test_the_keys_precision_replaced_are_refused_naming_it(override) -> None:
    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=f"^{key} was replaced by model.precision"):
        load_config("cpu-tiny", [override])


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


@pytest.mark.parametrize(("f32", "bf16", "expected"), [(198.0, 883.0, "bf16-mixed"), (309.0, 145.0, "fp32")])
def test_precision_auto_is_one_recipe_chosen_by_the_measurement(monkeypatch, tmp_path, f32, bf16, expected) -> None:
    """`model.precision: auto` is bf16-mixed where bf16 measures faster, else fp32; bf16-mixed is the whole recipe
    (bf16 trunk, float32 trained blocks under autocast in RL, TIS and recomputed π_old), fp32 none of it."""
    calls: list[int] = []
    monkeypatch.setattr(precision, "probe_matmuls", _stub_probe(f32, bf16, calls))
    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path))
    top = ["model.trainable_layers=1"]
    auto = load_config("cpu-tiny", ["model.precision=auto", *top]).model
    assert auto.dtype == "auto" and auto.resolved("cpu").precision == expected
    assert load_config("cpu-tiny", ["model.precision=auto", *top]).model.resolved("cpu").precision == expected
    assert len(calls) == 1  # cached
    mixed = load_config("cpu-tiny", ["model.precision=bf16-mixed", *top]).model
    assert mixed.resolved("cpu") == mixed  # an explicit precision is kept whatever the probe says
    n = mixed.numerics
    assert (n.dtype, n.float32_trainable, n.rl_autocast) == ("bfloat16", True, True)
    assert not n.sampler_is_trainer("hf") and not n.sampler_is_trainer("vllm")
    assert not dataclasses.replace(n, trainable_layers=0).float32_trainable  # all trained: bf16 under masters
    assert not dataclasses.replace(n, lora=True).float32_trainable  # LoRA adapters are float32 already
    f = load_config("cpu-tiny", ["model.precision=fp32", *top]).model.numerics
    assert (f.dtype, f.float32_trainable, f.rl_autocast) == ("float32", False, False)
    assert f.sampler_is_trainer("hf") and not f.sampler_is_trainer("vllm")


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


def test_the_tis_cap_is_the_one_expert_key() -> None:
    with pytest.raises(ConfigError, match="algorithm.tis_cap"):
        load_config("cpu-tiny", ["algorithm.tis_cap=0.5"])
    assert load_config("cpu-tiny", ["algorithm.tis_cap=5"]).algorithm.tis_cap == 5.0


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


def test_the_engine_dithers_masters_copied_from_bf16_weights() -> None:
    on = TorchEngine(_tiny_linear(torch.bfloat16), OptimConfig())
    assert not TorchEngine(_tiny_linear(torch.float32), OptimConfig()).master_weights  # float32: no masters
    (w_on, m_on), = on._pairs
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


PRECISION_OF = {"float32": "fp32", "bfloat16": "bf16-mixed"}


def _trainer(tmp_path, dtype: str, backend: str = "torch", *extra: str) -> Trainer:
    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", f"trainer.output_dir={tmp_path / dtype / backend}",
                                   f"trainer.backend={backend}", "trainer.tensorboard=false",
                                   f"model.precision={PRECISION_OF[dtype]}", *extra])
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
            out[name] = logprobs, trainer.credit(batch, trainer.teacher(batch, logprobs, trajs))
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


def test_cache_keys_of_a_precision_are_those_of_the_keys_it_replaced(tmp_path) -> None:
    """Warm starts and start evaluations cached before `model.precision` are still found: bf16-mixed over the top
    layers hashes as `dtype: bfloat16, trainable_dtype: float32, autocast: true` did, fp32 as `dtype: float32`;
    the SFT's key leaves the RL autocast out (it computes in float32)."""
    from agentgym_opsd.trainer.validation import start_evaluation_key

    top = ["model.trainable_layers=2"]
    mixed = load_config("cpu-tiny", ["model.precision=bf16-mixed", *top])
    fp32 = load_config("cpu-tiny", ["model.precision=fp32", *top])
    every = load_config("cpu-tiny", ["model.precision=bf16-mixed"])  # every layer trained: bf16 under masters
    key = mixed.model.cache_key_settings()
    assert (key["dtype"], key["trainable_dtype"], key["autocast"]) == ("bfloat16", "float32", True)
    assert "precision" not in key
    assert {k: fp32.model.cache_key_settings().get(k) for k in ("dtype", "trainable_dtype", "autocast")} == {
        "dtype": "float32", "trainable_dtype": None, "autocast": None}
    assert "trainable_dtype" not in every.model.cache_key_settings()
    ws = _warm_start_settings(mixed, tmp_path)
    assert "autocast" not in ws["model"] and ws["model"]["trainable_dtype"] == "float32"
    assert start_evaluation_key(mixed, threads=1, world_size=1) != start_evaluation_key(fp32, threads=1, world_size=1)


def test_bf16_mixed_runs_the_float32_blocks_matmuls_in_bf16_in_every_rl_phase(tmp_path, toy_env_ids) -> None:
    """bf16-mixed over the top layers: the float32 trained blocks compute their matmuls in bf16 under autocast
    wherever the model runs in RL (sampler, pi_old, update), so the PPO ratio still starts at 1; their weights and
    updates stay float32, and a copy of the model (the KL reference) autocasts too."""
    trainer = _trainer(tmp_path, "bfloat16", "torch", "model.trainable_layers=1", "trainer.total_steps=1")
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
        assert metrics["ppo/start_ratio_max_dev"] <= START_RATIO_BOUND and metrics["tis/on"] == 1.0
        assert all(p.dtype == torch.float32 for p in after) and _share_changed(before, after) > 0.5
        trainer.session.reference.setup()
        assert type(trainer.session.reference.frozen_copy.model.layers[-1]).__name__.startswith("Autocast")
    finally:
        trainer.close()


def test_a_resumed_run_keeps_the_precision_it_started_with_where_auto(tmp_path, toy_env_ids, monkeypatch) -> None:
    """A run checkpointed in fp32 and resumed with `model.precision: auto` on a machine where auto means bf16-mixed
    keeps computing in fp32: the numerics do not change halfway through a run. A precision given by hand wins; a
    checkpoint from before the key tells its precision by its `model.dtype`."""
    from agentgym_opsd.trainer.checkpoint import saved_precision

    monkeypatch.setattr(precision, "probe_matmuls", _stub_probe(100.0, 400.0, []))
    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path / "cache"))
    top = ("model.trainable_layers=1", "trainer.save_every=1")
    first = _trainer(tmp_path, "float32", "torch", *top, "trainer.total_steps=1")
    try:
        first.train()
    finally:
        first.close()
    cfg = first.session.cfg
    for asked, expected in (("auto", "fp32"), ("bf16-mixed", "bf16-mixed")):
        resumed = Trainer(dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, precision=asked),
            trainer=dataclasses.replace(cfg.trainer, total_steps=2)), resume="auto")
        try:
            assert resumed.session.state is not None and resumed.session.cfg.model.precision == expected
        finally:
            resumed.close()
    old = tmp_path / "old"
    old.mkdir()
    for dtype, expected in (("bfloat16", "bf16-mixed"), ("float32", "fp32")):
        (old / "config.yaml").write_text(f"model:\n  dtype: {dtype}\n")
        assert saved_precision(old) == expected


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
    extra = ("model.trainable_layers=1", "trainer.total_steps=1",
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
                                               "model.precision=bf16-mixed", *extra]), resume="auto")
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
