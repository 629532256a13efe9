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
from agentgym_opsd.trainer.config import load_config
from agentgym_opsd.trainer.logprobs import (
    bucket_micro_batches,
    collate,
    pack,
    packed_response_logprobs,
    response_logprobs,
    shared_prompt_prefix,
    supports_packing,
)
from agentgym_opsd.trainer.loop import Trainer
from agentgym_opsd.trainer.turn_batch import BatchAdvantages, PolicyLogProbs

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


def _rows_after(prefix_len: int, n: int, seed: int, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """Rows whose prompts start with the same `prefix_len` tokens (a system message) and go on differently."""
    prompts, responses = _rows(n, seed, vocab)
    prefix = [random.Random(seed + 1).randrange(3, vocab) for _ in range(prefix_len)]
    return [prefix + p for p in prompts], responses


def test_pack_lays_a_shared_prefix_once_as_its_own_first_span() -> None:
    pb = pack([1, 0], [[1, 2, 5, 6], [1, 2, 8]], [[10], [11, 12]], prefix_len=2)
    assert pb.input_ids.tolist() == [[1, 2, 8, 11, 12, 5, 6, 10]]
    assert pb.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 4]]  # the rows go on where the prefix ends
    assert pb.cu_seq_lens.tolist() == [0, 2, 5, 8] and pb.prefix_len == 2
    assert pb.logit_positions.tolist() == [2, 3, 6]
    assert pb.response_mask.tolist() == [[True, True], [False, True]]
    with pytest.raises(ValueError, match="does not continue the 2-token shared prefix"):
        pack([0, 1], [[1, 2, 5], [1, 3, 5]], [[4], [4]], prefix_len=2)
    with pytest.raises(ValueError, match="a token of its own"):
        pack([0, 1], [[1, 2, 5], [1, 2]], [[4], [4]], prefix_len=2)


def test_the_shared_prompt_prefix_is_laid_once_only_when_long_enough() -> None:
    assert shared_prompt_prefix([[7] * 15 + [1], [7] * 15 + [2]]) == 0  # below MIN_SHARED_PREFIX (16)
    assert shared_prompt_prefix([[7] * 20 + [1, 1], [7] * 20 + [2]]) == 20
    assert shared_prompt_prefix([[7] * 30, [7] * 30]) == 29  # every prompt keeps a token of its own
    assert shared_prompt_prefix([[7] * 30]) == 0  # one row: nothing to share


@pytest.mark.parametrize("frozen", [True, False])
def test_a_shared_prefix_laid_once_gives_every_row_laid_whole(tiny_model, frozen) -> None:
    """Log-probs, entropies, the loss and every gradient, those of the trained embeddings that the prefix's
    gradient reaches from all rows at once included (`frozen=False`)."""
    model, tok = tiny_model
    model = model if frozen else copy.deepcopy(model).requires_grad_(True)
    prompts, responses = _rows_after(24, 6, seed=5, vocab=len(tok))
    prefix_len = shared_prompt_prefix(prompts)
    assert prefix_len >= 24
    idx = [4, 1, 0, 3, 5, 2]

    def run(shared: int):
        model.zero_grad(set_to_none=True)
        pb = pack(idx, prompts, responses, prefix_len=shared)
        logp, ent = packed_response_logprobs(model, pb, with_entropy=True)
        weights = torch.linspace(-1.0, 2.0, pb.response_mask.numel()).view(pb.response_mask.shape)
        loss = (logp * weights).sum() - 0.1 * ent.sum()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return pb.input_ids.shape[1], logp.detach(), ent.detach(), loss.detach(), grads

    whole, once = run(0), run(prefix_len)
    assert once[0] == whole[0] - (len(idx) - 1) * prefix_len
    for a, b in zip(once[1:4], whole[1:4], strict=True):
        torch.testing.assert_close(a, b, **TOL)
    assert once[4].keys() == whole[4].keys() and once[4]
    for name, grad in whole[4].items():
        torch.testing.assert_close(once[4][name], grad, **TOL, msg=name)


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
        # The packed layout lays the prompts' shared prefix once (its gradient summed inside the attention's backward,
        # not over each row's copy) and fits other rows into a micro-batch: sums in another order, which Adam's
        # per-weight normalisation at lr 0.01 carries to a few 1e-5 in a handful of the 3M embedding weights.
        for key in padded_params:
            torch.testing.assert_close(packed_params[key], padded_params[key], rtol=1e-5, atol=5e-5, msg=key)
    finally:
        trainer.close()
