"""The packed update path (`trainer/logprobs.py`: rows end to end, no padding, per-row attention, LM head on
response positions only) gives the padded path's numbers: log-probs, entropies, the loss, every gradient and a
whole `Trainer.update` (tiny random Llama, toy counter env: seconds on a CPU). Equality is to float rounding:
the two layouts add the same terms in a different order."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from agentgym_opsd.models.loading import freeze_lower_layers, load_policy_model
from agentgym_opsd.trainer.advantages import BatchAdvantages
from agentgym_opsd.trainer.config import load_config
from agentgym_opsd.trainer.logprobs import (
    bucket_micro_batches,
    collate,
    pack,
    packed_response_logprobs,
    response_logprobs,
    supports_packing,
)
from agentgym_opsd.trainer.loop import Trainer
from agentgym_opsd.trainer.phases import PolicyLogProbs

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _rows(n: int, seed: int, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(1, 40))] for _ in range(n)]
    responses = [[rng.randrange(3, vocab) for _ in range(rng.randint(0, 9))] for _ in range(n)]
    responses[0] = []  # an empty reply (a row the penalty trains on) has no response tokens
    return prompts, responses


@pytest.fixture(scope="module")
def tiny_model():
    model, tok = load_policy_model("tiny-random")
    freeze_lower_layers(model, 1)  # as the CPU presets: the bottom layer and the embeddings frozen
    model.train()
    return model, tok


def test_pack_lays_rows_end_to_end() -> None:
    pb = pack([1, 0], [[5, 6, 7], [8, 9]], [[10], [11, 12]])
    assert pb.input_ids.tolist() == [[8, 9, 11, 12, 5, 6, 7, 10]]
    assert pb.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert pb.cu_seq_lens.tolist() == [0, 4, 8]
    assert pb.logit_positions.tolist() == [1, 2, 6]  # the token before each response token
    assert pb.response_ids.tolist() == [11, 12, 10]
    assert pb.response_mask.tolist() == [[True, True], [False, True]]  # right-aligned, as `collate`
    with pytest.raises(ValueError, match="empty prompt"):
        pack([0], [[]], [[3]])


def test_packed_budget_counts_real_tokens() -> None:
    lengths = [10, 10, 10, 40]
    assert bucket_micro_batches(lengths, max_tokens=60, max_rows=8) == [[0, 1, 2], [3]]
    assert bucket_micro_batches(lengths, max_tokens=60, max_rows=8, padded=False) == [[0, 1, 2], [3]]
    assert bucket_micro_batches(lengths, max_tokens=70, max_rows=8, padded=False) == [[0, 1, 2, 3]]
    assert bucket_micro_batches(lengths, max_tokens=70, max_rows=8) == [[0, 1, 2], [3]]  # 4 x 40 padded


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_entropy_and_gradients_equal_padded(tiny_model, temperature, attn) -> None:
    model, tok = tiny_model
    model.set_attn_implementation(attn)
    try:
        prompts, responses = _rows(7, seed=3, vocab=len(tok))
        idx = list(range(len(prompts)))

        def run(layout: str):
            model.zero_grad(set_to_none=True)
            if layout == "packed":
                pb = pack(idx, prompts, responses)
                logp, ent = packed_response_logprobs(model, pb, temperature=temperature, with_entropy=True)
                mask = pb.response_mask
            else:
                mb = collate(idx, prompts, responses, tok.pad_token_id)
                logp, ent = response_logprobs(model, mb, temperature=temperature, with_entropy=True)
                mask = mb.response_mask
            weights = torch.linspace(-1.0, 2.0, mask.numel()).view(mask.shape)
            loss = ((logp * weights).sum() - 0.1 * ent.sum()) / mask.sum()
            loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
            return logp.detach(), ent.detach(), mask, loss.detach(), grads

        padded, packed = run("padded"), run("packed")
        assert torch.equal(padded[2], packed[2])
        torch.testing.assert_close(packed[0], padded[0], **TOL)
        torch.testing.assert_close(packed[1], padded[1], **TOL)
        torch.testing.assert_close(packed[3], padded[3], **TOL)
        assert packed[4].keys() == padded[4].keys() and packed[4]
        for name in padded[4]:
            torch.testing.assert_close(packed[4][name], padded[4][name], **TOL, msg=name)
        assert model.config._attn_implementation == attn  # the packed attention is switched off again
    finally:
        model.set_attn_implementation("sdpa")


def test_packing_is_skipped_where_it_would_change_numbers(tiny_model) -> None:
    model, _ = tiny_model
    assert supports_packing(model)
    checkpointed = copy.deepcopy(model)
    checkpointed.gradient_checkpointing_enable()  # backward re-runs the forward after the switch is undone
    assert not supports_packing(checkpointed)


def _trainer(tmp_path) -> Trainer:
    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", f"trainer.output_dir={tmp_path}", "trainer.backend=torch",
                                   "trainer.tensorboard=false", "algorithm.ppo_mini_batch_rows=4",
                                   "optim.micro_batch_tokens=160", "optim.micro_batch_rows=3", "optim.lr=0.01",
                                   "algorithm.kl_coef=0.05", "algorithm.entropy_coef=0.01"])
    return Trainer(cfg)


def test_trainer_update_packed_equals_padded(tmp_path, toy_env_ids) -> None:
    trainer = _trainer(tmp_path)
    try:
        assert trainer.updater.packed  # the default wherever the model supports it
        batch = trainer.score(trainer.collect())
        n = len(batch.rows)
        assert n > 4  # several mini-batches (optimiser steps), several micro-batches each
        logprobs = PolicyLogProbs([torch.tensor(r.sample_logprobs) - 0.05 for r in batch.rows],
                                  [torch.tensor(r.sample_logprobs) + 0.1 for r in batch.rows])
        tokens = [torch.full((len(r.response_ids),), 1.0 if i % 3 else -1.5) for i, r in enumerate(batch.rows)]
        advantages = BatchAdvantages(tokens, torch.zeros(0), torch.zeros(n), None)
        model_state = copy.deepcopy(trainer.session.trained.model.state_dict())
        optim_state = copy.deepcopy(trainer.session.trained.engine.state_dict())
        results = {}
        for packed in (False, True):
            trainer.session.trained.model.load_state_dict(model_state)
            trainer.session.trained.engine.load_state_dict(copy.deepcopy(optim_state))
            trainer.updater.packed = packed
            metrics = trainer.update(batch, logprobs, advantages)
            results[packed] = metrics, {k: v.detach().clone() for k, v in trainer.session.trained.model.state_dict().items()}
        (padded, padded_params), (packed, packed_params) = results[False], results[True]
        assert padded["optimizer_steps"] == packed["optimizer_steps"] > 1
        for key, value in padded.items():
            assert packed[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        changed = [k for k in padded_params if not torch.equal(padded_params[k], model_state[k])]
        assert changed  # the update moved the weights, and both layouts moved them the same way
        for key in padded_params:
            torch.testing.assert_close(packed_params[key], padded_params[key], **TOL, msg=key)
    finally:
        trainer.close()
