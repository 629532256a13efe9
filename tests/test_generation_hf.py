"""HFPolicy: batched generation with left padding and a KV cache, exact token ids and log-probs."""

from __future__ import annotations

import os

import pytest
import torch

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.models import hf_policy
from agentgym_opsd.models.backends import BACKENDS, make_policy_backend
from agentgym_opsd.models.hf_policy import MIN_SHARED_PREFIX, HFPolicy, chat_prompt_ids, common_prefix_length
from agentgym_opsd.models.loading import LoraSettings, load_policy_model
from agentgym_opsd.policies import Policy, PolicyRequest
from agentgym_opsd.rollout import RolloutRunner

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = [
    "Put a clean mug in the coffee machine.",
    "Go.",
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, a "
    "drawer 3, a fridge 1 and a sinkbasin 1. Your task is to: heat some egg and put it in the garbagecan.",
    "Find two pencils and put them in the drawer.",
    "Examine the book with the desklamp.",
]


def _request(text: str) -> PolicyRequest:
    return PolicyRequest([{"role": "system", "content": "Answer with <action>...</action>."},
                          {"role": "user", "content": text}])


@pytest.fixture(scope="module")
def tiny():
    return load_policy_model("tiny-random", trainable=False)


def _teacher_forced(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """Log-probs of `response` after `prompt` from one full forward pass, no cache, no padding."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / scale, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_hf_policy_implements_the_policy_protocol(tiny):
    assert isinstance(HFPolicy(*tiny), Policy)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_token_ids_decode_to_text_and_logprobs_match_teacher_forcing(tiny, temperature):
    model, tok = tiny
    policy = HFPolicy(model, tok, max_new_tokens=12, temperature=temperature, batch_size=8, seed=3)
    requests = [_request(p) for p in PROMPTS]
    outputs = policy.act(requests)
    assert len(outputs) == len(requests)
    for req, out in zip(requests, outputs, strict=True):
        assert 1 <= len(out.token_ids) <= 12 and len(out.logprobs) == len(out.token_ids)
        assert tok.decode(out.token_ids, skip_special_tokens=False) == out.text
        assert tok.pad_token_id not in out.token_ids or tok.pad_token_id not in policy.eos_ids
        expected = _teacher_forced(model, policy.prompt_ids(req.messages), out.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, rtol=0, atol=1e-4)
        assert all(lp <= 0.0 for lp in out.logprobs)


def test_prompt_ids_are_the_chat_template_with_generation_prompt(tiny):
    model, tok = tiny
    policy = HFPolicy(model, tok)
    ids = policy.prompt_ids(_request("hello").messages)
    text = tok.decode(ids, skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n") and "hello" in text
    with pytest.raises(ValueError, match="at least one chat message"):
        policy.prompt_ids([])


def test_left_padding_sorting_and_shared_prefill_do_not_change_results(tiny):
    model, tok = tiny
    requests = [_request(p) for p in PROMPTS + PROMPTS[:2]]  # duplicates share one prefill
    batched = HFPolicy(model, tok, max_new_tokens=10, temperature=0.0, batch_size=8).act(requests)
    single = HFPolicy(model, tok, max_new_tokens=10, temperature=0.0, batch_size=1).act(requests)
    for a, b in zip(batched, single, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-4)


def _prefill_tokens(model) -> tuple[list[int], object]:
    """A hook that records how many tokens each forward call of `model` feeds in (rows x width)."""
    fed: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda mod, args, out: fed.append(args[0].numel()))
    return fed, hook


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_prefix_every_prompt_shares_is_prefilled_once_with_the_same_results(tiny, monkeypatch, temperature,
                                                                                 packed):
    model, tok = tiny
    monkeypatch.setattr(hf_policy, "PACKED_PREFILL_MIN_PADDING", 0.0)  # packed whatever the padding
    system = "You are a household robot. Reply with exactly one command inside <action>...</action>. " * 3
    requests = [PolicyRequest([{"role": "system", "content": system}, {"role": "user", "content": p}])
                for p in PROMPTS]
    prompts = [chat_prompt_ids(tok, r.messages) for r in requests]
    shared = common_prefix_length(prompts)
    assert shared >= MIN_SHARED_PREFIX
    fed, hook = _prefill_tokens(model)
    try:
        together = HFPolicy(model, tok, max_new_tokens=8, temperature=temperature, batch_size=8, seed=4,
                            packed_prefill=packed).act(requests)
        prefill_shared = fed[:2]  # the prefix once (1 x shared), then the suffixes
        fed.clear()
        monkeypatch.setattr(hf_policy, "MIN_SHARED_PREFIX", 10**9)
        apart = HFPolicy(model, tok, max_new_tokens=8, temperature=temperature, batch_size=8, seed=4,
                         packed_prefill=packed).act(requests)
        prefill_whole = fed[0]
    finally:
        hook.remove()
    width = max(len(p) for p in prompts)
    if packed:  # the suffixes end to end: no padding fed
        assert prefill_shared == [shared, sum(len(p) - shared for p in prompts)]
        assert prefill_whole == sum(len(p) for p in prompts)
    else:  # left-padded to the longest
        assert prefill_shared == [shared, len(prompts) * (width - shared)]
        assert prefill_whole == len(prompts) * width
    for a, b, prompt in zip(together, apart, prompts, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)
        expected = _teacher_forced(model, prompt, a.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(a.logprobs), expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_packed_and_left_padded_prefill_sample_the_same_replies(tiny, monkeypatch, temperature):
    """Prompts of other lengths, duplicates among them (prefilled once, cache rows copied), a shared prefix and
    replies that end at different steps: the packed prefill's samples and log-probs are the padded one's."""
    model, tok = tiny
    monkeypatch.setattr(hf_policy, "PACKED_PREFILL_MIN_PADDING", 0.0)
    requests = [_request(p) for p in PROMPTS + PROMPTS[2:4]]
    packed = HFPolicy(model, tok, max_new_tokens=12, temperature=temperature, batch_size=8, seed=7).act(requests)
    padded = HFPolicy(model, tok, max_new_tokens=12, temperature=temperature, batch_size=8, seed=7,
                      packed_prefill=False).act(requests)
    for a, b in zip(packed, padded, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)


def test_only_a_chunk_with_enough_padding_to_save_is_prefilled_packed(tiny, monkeypatch):
    model, tok = tiny
    policy = HFPolicy(model, tok, max_new_tokens=4, temperature=0.0)
    packed: list[bool] = []
    prefill = HFPolicy._prefill_packed
    monkeypatch.setattr(HFPolicy, "_prefill_packed", lambda self, *a: packed.append(True) or prefill(self, *a))
    even = [_request("Go to the fridge 1."), _request("Go to the drawer 1.")]  # the same length: no padding
    uneven = [_request("Go."), _request(PROMPTS[2])]
    policy.act(even)
    assert packed == []
    policy.act(uneven)
    assert packed == [True]
    monkeypatch.setattr(hf_policy, "PACKED_PREFILL_MIN_PADDING", 0.0)
    policy.act(even)
    assert packed == [True, True]
    HFPolicy(model, tok, max_new_tokens=4, temperature=0.0, packed_prefill=False).act(uneven)
    assert packed == [True, True]  # switched off


def test_common_prefix_length_leaves_every_prompt_a_token_of_its_own():
    assert common_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert common_prefix_length([[1, 2, 3], [1, 2, 3, 4]]) == 2  # the shorter keeps its last token
    assert common_prefix_length([[1, 2], [1, 2]]) == 1
    assert common_prefix_length([[7], [8, 9]]) == 0


def test_generation_stops_at_the_closing_tag(tiny):
    model, tok = tiny
    request = _request(PROMPTS[0])
    free = HFPolicy(model, tok, max_new_tokens=12, seed=5, stop_strings=()).act([request])[0]
    assert len(free.token_ids) == 12
    # A string the sampled answer completes at token 5 plays the closing tag (same seed, same samples).
    stop = tok.decode(free.token_ids[3:6], skip_special_tokens=False)
    assert stop
    stopped = HFPolicy(model, tok, max_new_tokens=12, seed=5, stop_strings=(stop,)).act([request])[0]
    assert stop in stopped.text
    assert stop not in tok.decode(stopped.token_ids[:-1], skip_special_tokens=False)
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]
    assert len(stopped.token_ids) <= 6


def test_end_of_sequence_ends_the_answer_is_kept_as_a_token_but_not_in_the_text(tiny):
    model, tok = tiny
    request = _request(PROMPTS[1])
    free = HFPolicy(model, tok, max_new_tokens=6, seed=5).act([request])[0]
    policy = HFPolicy(model, tok, max_new_tokens=6, seed=5)
    assert free.token_ids[2] not in free.token_ids[:2]
    policy.eos_ids = {free.token_ids[2]}  # pretend the third sampled token is end-of-sequence
    out = policy.act([request])[0]
    # the EOS token is a sampled token the trainer must be able to push down, so it stays in the ids
    assert out.token_ids == free.token_ids[:3] and len(out.logprobs) == 3
    assert out.text == tok.decode(free.token_ids[:2], skip_special_tokens=False)
    assert out.finish_reason == "eos" and free.finish_reason == "length"


def test_an_immediately_ended_reply_still_has_its_token(tiny):
    model, tok = tiny
    request = _request(PROMPTS[1])
    first = HFPolicy(model, tok, max_new_tokens=6, seed=5).act([request])[0].token_ids[0]
    policy = HFPolicy(model, tok, max_new_tokens=6, seed=5)
    policy.eos_ids = {first}
    out = policy.act([request])[0]
    assert out.text == "" and out.token_ids == [first] and len(out.logprobs) == 1 and out.finish_reason == "eos"


def test_copies_of_one_prompt_sample_independently(tiny):
    model, tok = tiny
    outputs = HFPolicy(model, tok, max_new_tokens=8, seed=1).act([_request(PROMPTS[0])] * 4)
    assert len({tuple(o.token_ids) for o in outputs}) > 1


def test_sampling_is_reproducible_from_the_seed_and_the_rng_state(tiny):
    model, tok = tiny
    requests = [_request(p) for p in PROMPTS[:3]]
    a = HFPolicy(model, tok, max_new_tokens=8, seed=11)
    b = HFPolicy(model, tok, max_new_tokens=8, seed=11)
    state = a.get_rng_state()
    first = a.act(requests)
    assert [o.token_ids for o in first] == [o.token_ids for o in b.act(requests)]
    a.set_rng_state(state)
    assert [o.token_ids for o in a.act(requests)] == [o.token_ids for o in first]
    other = HFPolicy(model, tok, max_new_tokens=8, seed=12).act(requests)
    assert [o.token_ids for o in other] != [o.token_ids for o in first]
    torch_state = torch.get_rng_state()
    a.act(requests)
    assert torch.equal(torch_state, torch.get_rng_state())  # the global RNG is untouched


def test_with_sampling_views_share_the_model_and_may_generate_in_larger_chunks(tiny, monkeypatch):
    """A view has its own temperature, stream and chunk size; the policy it came from keeps its own."""
    model, tok = tiny
    policy = HFPolicy(model, tok, max_new_tokens=6, temperature=1.0, batch_size=2, seed=0)
    view = policy.with_sampling(temperature=0.0, seed=5, batch_size=8)
    assert view.model is policy.model and (view.temperature, view.batch_size) == (0.0, 8)
    assert (policy.temperature, policy.batch_size) == (1.0, 2)
    assert policy.with_sampling(temperature=0.4, seed=1).batch_size == 2  # None keeps the policy's
    chunks: list[int] = []
    real = HFPolicy._generate_chunk
    monkeypatch.setattr(HFPolicy, "_generate_chunk", lambda self, prompts: (chunks.append(len(prompts)), real(self, prompts))[1])
    requests = [_request(p) for p in PROMPTS]
    wide = view.act(requests)
    assert chunks == [5]
    chunks.clear()
    narrow = policy.with_sampling(temperature=0.0, seed=5).act(requests)
    assert chunks == [2, 2, 1]
    assert [o.token_ids for o in wide] == [o.token_ids for o in narrow]  # greedy: the chunking changes no token
    with pytest.raises(ValueError, match="batch_size"):
        policy.with_sampling(temperature=1.0, seed=0, batch_size=0)


def test_top_p_keeps_sampling_inside_the_nucleus(tiny):
    model, tok = tiny
    policy = HFPolicy(model, tok, max_new_tokens=4, top_p=1e-6, seed=0)
    greedy = HFPolicy(model, tok, max_new_tokens=4, temperature=0.0)
    requests = [_request(p) for p in PROMPTS[:2]]
    # a vanishing nucleus holds only the most likely token: sampling becomes greedy
    assert [o.token_ids for o in policy.act(requests)] == [o.token_ids for o in greedy.act(requests)]


def test_temperature_and_argument_validation(tiny):
    model, tok = tiny
    policy = HFPolicy(model, tok)
    policy.set_temperature(0.4)
    assert policy.temperature == 0.4
    with pytest.raises(ValueError, match="temperature"):
        policy.set_temperature(-1.0)
    for kwargs, match in [({"max_new_tokens": 0}, "max_new_tokens"), ({"top_p": 0.0}, "top_p"),
                          ({"batch_size": 0}, "batch_size"), ({"stop_strings": "</action>"}, "stop_strings")]:
        with pytest.raises(ValueError, match=match):
            HFPolicy(model, tok, **kwargs)


def test_generation_restores_training_mode_and_works_with_lora():
    model, tok = load_policy_model("tiny-random", lora=LoraSettings(r=2, alpha=4, target_modules=("q_proj",)))
    assert model.training
    out = HFPolicy(model, tok, max_new_tokens=3).act([_request("hi")])
    assert len(out[0].token_ids) == 3 and model.training


def test_backend_switch(tiny):
    model, tok = tiny
    assert isinstance(make_policy_backend("hf", model=model, tokenizer=tok, max_new_tokens=4), HFPolicy)
    assert set(BACKENDS) == {"hf", "vllm"}
    with pytest.raises(ValueError, match="unknown generation backend"):
        make_policy_backend("tgi", model=model, tokenizer=tok)
    with pytest.raises(ValueError, match="model_path"):
        make_policy_backend("hf")


def test_rollouts_record_the_sampled_tokens_and_logprobs(tiny, toy_env_ids):
    model, tok = tiny
    counter_id, _ = toy_env_ids
    runner = RolloutRunner(counter_id, num_envs=4)
    policy = HFPolicy(model, tok, max_new_tokens=6, batch_size=4)
    try:
        trajs = runner.run(policy, [TaskSpec(0, {"task_index": 1}), TaskSpec(1, {"task_index": 3})], group_size=2)
    finally:
        runner.close()
    assert [t.group_id for t in trajs] == [0, 0, 1, 1]
    turn = trajs[0].turns[0]
    assert turn.response_token_ids and len(turn.response_logprobs) == len(turn.response_token_ids)
    assert tok.decode(turn.response_token_ids, skip_special_tokens=False) == turn.response_text
    expected = _teacher_forced(model, policy.prompt_ids(turn.prompt), turn.response_token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(turn.response_logprobs), expected, rtol=0, atol=1e-4)
    # random text parses to no action: invalid actions, never a crash
    assert all(t.num_turns == 10 for t in trajs) and trajs[0].num_invalid_actions > 0


@pytest.mark.slow
def test_embedded_smollm2_answers_with_a_closing_tag():
    model, tok = load_policy_model(trainable=False)
    policy = HFPolicy(model, tok, max_new_tokens=48, temperature=0.0)
    request = PolicyRequest([
        {"role": "system", "content": "Reply with exactly one action wrapped as <action>ACTION</action>."},
        {"role": "user", "content": "You see a fridge 1 and a table 1. Your task: open the fridge. "
                                    "Example reply: <action>go to table 1</action>"},
    ])
    out = policy.act([request])[0]
    text_ids = out.token_ids[:-1] if out.finish_reason == "eos" else out.token_ids
    assert tok.decode(text_ids, skip_special_tokens=False) == out.text
    if "</action>" in out.text:  # the 135M model usually closes the tag; when it does, nothing follows
        assert "</action>" not in tok.decode(out.token_ids[:-1], skip_special_tokens=False)
    expected = _teacher_forced(model, policy.prompt_ids(request.messages), out.token_ids, 0.0)
    torch.testing.assert_close(torch.tensor(out.logprobs), expected, rtol=0, atol=1e-4)


def test_inverse_cdf_draw_samples_the_distribution_and_never_a_zero_probability_token():
    from agentgym_opsd.models.hf_policy import _draw

    gen = torch.Generator().manual_seed(0)
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]]).repeat(20_000, 1)
    counts = torch.bincount(_draw(probs, gen), minlength=6).double() / 20_000
    assert counts[[0, 2, 5]].sum() == 0
    torch.testing.assert_close(counts[[1, 3, 4]], torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), atol=0.015, rtol=0)
    unnormalised = torch.tensor([[0.0, 2.0, 0.0, 2.0]])  # top-p leaves rows that do not sum to one
    assert set(_draw(unnormalised.repeat(2000, 1), gen).tolist()) == {1, 3}
