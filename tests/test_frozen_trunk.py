"""The frozen trunk kept from the π_old pass (`trainer/frozen_trunk.py`): the update that runs only the trained
blocks from it gives the full forward's log-probs, entropies and gradients, in float32 and in bf16 with float32
trained blocks; it is kept only where that holds (a frozen embedding, no dropout, no ZeRO-3, the packed layout)
and within its memory budget; a whole `Trainer.update` moves the weights as without it."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from agentgym_opsd.models.loading import (
    freeze_lower_layers,
    keep_trainable_in_float32,
    load_policy_model,
    load_tokenizer,
    tiny_random_model,
)
from agentgym_opsd.models.precision import float32_lm_head
from agentgym_opsd.trainer.config import load_config
from agentgym_opsd.trainer.frozen_trunk import TrunkCache, frozen_depth, trunk_depth
from agentgym_opsd.trainer.logprobs import (
    pack,
    packed_batched_response_logprobs,
    packed_response_logprobs,
    shared_prompt_prefix,
)
from agentgym_opsd.trainer.loop import Trainer
from agentgym_opsd.trainer.turn_batch import PolicyLogProbs


def _model(dtype: str = "float32", *, layers: int = 3, trained: int = 1):
    tok = load_tokenizer("tiny-random")
    model = tiny_random_model(tok, num_layers=layers, dtype=dtype)
    freeze_lower_layers(model, trained)
    if dtype != "float32":
        float32_lm_head(model)  # as load_policy_model gives a bf16 model
        keep_trainable_in_float32(model)
    return model, tok


def _rows(n: int, vocab: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(1, 30))] for _ in range(n)]
    responses = [[rng.randrange(3, vocab) for _ in range(rng.randint(0, 8))] for _ in range(n)]
    return prompts, responses


def test_the_frozen_depth_is_the_blocks_below_the_trained_ones() -> None:
    model, _ = _model(layers=3, trained=1)
    assert frozen_depth(model) == 2
    assert trunk_depth(model, zero_stage=2, budget_mb=1) == 2
    assert trunk_depth(model, zero_stage=3, budget_mb=1) == 0  # ZeRO-3 gathers in a traced order
    assert trunk_depth(model, zero_stage=0, budget_mb=0) == 0  # off
    dropout = copy.deepcopy(model)
    dropout.config.attention_dropout = 0.1  # the π_old pass (eval) would differ from the update (train)
    assert trunk_depth(dropout, zero_stage=0, budget_mb=1) == 0
    every, _ = _model(layers=3, trained=3)
    assert frozen_depth(every) == 0
    model.get_input_embeddings().weight.requires_grad_(True)
    assert frozen_depth(model) == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_trained_blocks_from_the_kept_trunk_give_the_full_forwards_numbers(dtype) -> None:
    model, tok = _model(dtype)
    prompts, responses = _rows(9, len(tok))
    cache = TrunkCache(frozen_depth(model), budget_bytes=1 << 30)
    old = packed_batched_response_logprobs(model, prompts, responses, max_tokens=80, max_rows=3, trunk_cache=cache)
    assert cache.covers(range(len(prompts)))
    model.train()
    idx = [7, 2, 5, 0]  # an update micro-batch: other rows together, in another order, than the π_old pass's

    def run(trunk):
        model.zero_grad(set_to_none=True)
        pb = pack(idx, prompts, responses)
        logp, ent = packed_response_logprobs(model, pb, with_entropy=True, trunk=trunk)
        weights = torch.linspace(-1.0, 2.0, pb.response_mask.numel()).view(pb.response_mask.shape)
        ((logp * weights).sum() - 0.1 * ent.sum()).backward()
        return logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    full, kept = run(None), run((cache.depth, cache.packed(idx)))
    tol = {"rtol": 1e-6, "atol": 1e-6}
    torch.testing.assert_close(kept[0], full[0], **tol)
    torch.testing.assert_close(kept[1], full[1], **tol)
    assert kept[2].keys() == full[2].keys() and kept[2]
    for name, grad in full[2].items():
        torch.testing.assert_close(kept[2][name], grad, **tol, msg=name)
    for r, i in enumerate(idx):  # and π_old is the update's start: ratio 1
        n = len(responses[i])
        torch.testing.assert_close(kept[0][r, kept[0].shape[1] - n:], old[i], **tol)
    assert len(list(model.model.layers)) == 3  # the full stack is back


def test_after_a_shared_prefix_the_trunk_keeps_it_once_and_gives_the_full_forwards_numbers() -> None:
    model, tok = _model()
    prompts, responses = _rows(9, len(tok))
    prefix = list(range(3, 23))  # a 20-token system message every prompt starts with
    prompts = [prefix + p for p in prompts]
    prefix_len = shared_prompt_prefix(prompts)
    cache = TrunkCache(frozen_depth(model), budget_bytes=1 << 30)
    old = packed_batched_response_logprobs(model, prompts, responses, max_tokens=80, max_rows=3, trunk_cache=cache)
    assert cache.prefix_len == prefix_len >= 20 and cache.prefix is not None and cache.prefix.shape[0] == prefix_len
    assert cache.covers(range(len(prompts)), prefix_len=prefix_len) and not cache.covers([0])
    assert all(cache.rows[i].shape[0] == len(p) - prefix_len + len(r)
               for i, (p, r) in enumerate(zip(prompts, responses, strict=True)))
    model.train()
    idx = [7, 2, 5, 0]

    def run(trunk):
        pb = pack(idx, prompts, responses, prefix_len=prefix_len)
        with torch.no_grad():
            return packed_response_logprobs(model, pb, trunk=trunk)[0]

    full, kept = run(None), run((cache.depth, cache.packed(idx, prefix_len=prefix_len)))
    torch.testing.assert_close(kept, full, rtol=1e-6, atol=1e-6)
    for r, i in enumerate(idx):  # π_old is the update's start
        n = len(responses[i])
        torch.testing.assert_close(kept[r, kept.shape[1] - n:], old[i], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="shared prefix"):  # one cache, one layout
        cache.add_packed([20], torch.zeros(1, 3, 8), torch.tensor([0, 3]))
    with pytest.raises(KeyError):
        cache.packed(idx)
    cache.release()
    assert cache.prefix is None and cache.prefix_len is None and cache.used_bytes == 0


def test_the_cache_keeps_rows_within_its_budget() -> None:
    cache = TrunkCache(2, budget_bytes=3 * 4 * 4)  # three float32 rows of 1 token x 4 hidden
    for row in range(5):
        cache.add(row, torch.ones(1, 4))
    assert sorted(cache.rows) == [0, 1, 2] and cache.covers([0, 2]) and not cache.covers([1, 3])
    cache.add(1, torch.zeros(1, 4))  # a micro-batch that ran in full again (it mixed kept and other rows)
    assert cache.used_bytes == 3 * 4 * 4 and torch.equal(cache.rows[1], torch.ones(1, 4))
    assert cache.packed([2, 0]).shape == (1, 2, 4)
    cache.release()
    assert not cache.rows and cache.used_bytes == 0


def test_a_trainer_update_from_the_kept_trunk_moves_the_weights_as_the_full_one(tmp_path, toy_env_ids) -> None:
    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", f"trainer.output_dir={tmp_path}", "trainer.backend=torch",
                                   "trainer.tensorboard=false", "model.trainable_layers=1", "optim.lr=0.01",
                                   "algorithm.ppo_mini_batch_rows=4", "optim.micro_batch_tokens=160",
                                   "optim.micro_batch_rows=3", "algorithm.kl_coef=0.0"])
    trainer = Trainer(cfg)
    try:
        assert trainer.session.trunk_depth == 1
        trajs = trainer.collect()
        batch = trainer.score(trajs)
        model_state = copy.deepcopy(trainer.session.trained.model.state_dict())
        optim_state = copy.deepcopy(trainer.session.trained.engine.state_dict())
        results = {}
        for depth in (0, 1):
            trainer.session.trained.model.load_state_dict(model_state)
            trainer.session.trained.engine.load_state_dict(copy.deepcopy(optim_state))
            trainer.session.trunk_depth = depth
            # the teacher-forced π_old pass (what a bf16-mixed or vLLM run takes; an fp32 HF run reuses the
            # sampler's numbers and keeps no trunk), here in float32 so both depths can be compared exactly
            trunk = TrunkCache.within(depth, cfg.optim.trunk_cache_mb)
            old = trainer.session.trained.logprobs(batch.prompt_ids, batch.response_ids,
                                                   packed=trainer.session.packed_update, trunk_cache=trunk)
            logprobs = PolicyLogProbs(old, None, False, trunk)
            assert (logprobs.trunk is not None) == bool(depth)
            advantages = trainer.credit(batch, trainer.teacher(batch, logprobs, trajs))
            metrics = trainer.update(batch, logprobs, advantages)
            assert logprobs.trunk is None or not logprobs.trunk.rows  # released after the update
            results[depth] = metrics, {k: v.detach().clone() for k, v in trainer.session.trained.model.state_dict().items()}
        (full, full_params), (kept, kept_params) = results[0], results[1]
        assert full["optimizer_steps"] == kept["optimizer_steps"] > 1
        assert kept["ppo/start_ratio_max_dev"] < 1e-5
        for key, value in full.items():
            assert kept[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        assert any(not torch.equal(full_params[k], model_state[k]) for k in full_params)
        for key in full_params:
            torch.testing.assert_close(kept_params[key], full_params[key], rtol=1e-5, atol=1e-6, msg=key)
    finally:
        trainer.close()


def test_the_embedded_model_keeps_its_trunk_where_its_lower_blocks_are_frozen() -> None:
    model, _ = load_policy_model("tiny-random")
    freeze_lower_layers(model, 1)
    assert frozen_depth(model) == 1


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_warm_start_epochs_from_the_kept_trunk_train_as_the_full_ones(dtype, packed) -> None:
    """Two SFT epochs: the first keeps each row's trunk output, the second runs the trained blocks from it; the
    losses and the weights match SFT without the cache, padded or packed. In bf16 a row's trunk rounds a little
    differently in another micro-batch, which the cache does not recompute: within 5% of one AdamW step (lr
    1e-3)."""
    from agentgym_opsd.trainer.config import OptimConfig
    from agentgym_opsd.trainer.engine import TorchEngine
    from agentgym_opsd.trainer.warm_start import Demonstration, sft_step

    model, tok = _model(dtype)
    prompts, responses = _rows(8, len(tok), seed=1)
    rows = [Demonstration(p, r or [5]) for p, r in zip(prompts, responses, strict=True)]
    epochs = [[3, 0, 6, 1], [7, 2, 4, 5], [5, 1, 0, 2], [6, 4, 3, 7]]  # two epochs of two steps
    state = copy.deepcopy(model.state_dict())

    def train(trunk):
        model.load_state_dict(state)
        engine = TorchEngine(model, OptimConfig(lr=1e-3, grad_clip=0.0))
        losses = [sft_step(engine, rows, pick, pad_id=tok.pad_token_id, max_tokens=60, max_rows=3, device="cpu",
                           trunk=trunk, packed=packed) for pick in epochs]
        return losses, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    atol = 1e-6 if dtype == "float32" else 5e-5
    cache = TrunkCache(frozen_depth(model), budget_bytes=1 << 30)
    (full_losses, full_weights), (kept_losses, kept_weights) = train(None), train(cache)
    assert cache.covers(range(len(rows)))  # the first epoch kept every row; the second read them
    assert kept_losses == pytest.approx(full_losses, rel=1e-4)
    for name, weight in full_weights.items():
        torch.testing.assert_close(kept_weights[name], weight, rtol=1e-5, atol=atol, msg=name)


def test_a_packed_sft_step_trains_as_the_padded_one(monkeypatch) -> None:
    """The warm start lays each micro-batch's rows end to end (`sft_step(packed=True)`, no padding computed): each
    step's loss and the gradients it steps with match the left-padded layout's, with micro-batches cut
    differently (the packed budget counts tokens, not rows × longest)."""
    from agentgym_opsd.trainer import logprobs
    from agentgym_opsd.trainer.config import OptimConfig
    from agentgym_opsd.trainer.engine import TorchEngine
    from agentgym_opsd.trainer.warm_start import Demonstration, sft_step

    model, tok = _model(layers=3, trained=2)
    # float64: the two layouts sum in other orders, and float32's rounding of those sums, amplified where a
    # gradient's terms cancel, differs by CPU; in float64 any difference left is the layouts'
    model.double()
    prompts, responses = _rows(8, len(tok), seed=2)
    rows = [Demonstration(p, r or [5]) for p, r in zip(prompts, responses, strict=True)]
    state = copy.deepcopy(model.state_dict())

    def train(packed: bool):
        model.load_state_dict(state)
        engine = TorchEngine(model, OptimConfig(lr=1e-3, grad_clip=0.0))
        grads: list[dict[str, torch.Tensor]] = []
        step = engine.step

        def recording_step() -> float:
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            return step()

        engine.step = recording_step
        losses = [sft_step(engine, rows, pick, pad_id=tok.pad_token_id, max_tokens=50, max_rows=4, device="cpu",
                           packed=packed) for pick in ([3, 0, 6, 1, 7], [2, 4, 5])]
        return losses, grads

    packs = []
    monkeypatch.setattr(logprobs, "pack", lambda idx, *args, **kw: packs.append(list(idx)) or pack(idx, *args, **kw))
    (padded_losses, padded_grads), (packed_losses, packed_grads) = train(False), train(True)
    assert sorted(i for idx in packs for i in idx) == [0, 0, 1, 1, 2, 2, 3, 4]  # every row of both steps packed
    assert packed_losses == pytest.approx(padded_losses, rel=1e-10)
    assert padded_losses[1] != pytest.approx(padded_losses[0], rel=1e-3)  # the steps saw other rows
    for padded, packed in zip(padded_grads, packed_grads, strict=True):
        assert padded.keys() == packed.keys() and padded
        for name, grad in padded.items():
            torch.testing.assert_close(packed[name], grad, rtol=1e-9, atol=1e-9 * float(grad.abs().max()), msg=name)
