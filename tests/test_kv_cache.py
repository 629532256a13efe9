"""models/kv_cache.py: a cache layer that decodes in place holds exactly what transformers' concatenating
`DynamicLayer` holds, through every operation the sampler uses, and HFPolicy's replies do not change with it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.cache_utils import DynamicCache, DynamicLayer

from agentgym_opsd.models import kv_cache
from agentgym_opsd.models.hf_policy import HFPolicy
from agentgym_opsd.models.kv_cache import ReservedLayer, reserve, reserved_cache
from agentgym_opsd.models.loading import load_policy_model
from agentgym_opsd.policies import PolicyRequest

# One operation on a layer of batch `rows`: append `n` tokens, reserve room, keep some rows, repeat every row, crop.
OPERATION = st.one_of(
    st.tuples(st.just("update"), st.integers(1, 5)),
    st.tuples(st.just("reserve"), st.integers(0, 40)),
    st.tuples(st.just("select"), st.lists(st.integers(0, 7), min_size=1, max_size=4)),
    st.tuples(st.just("repeat"), st.integers(1, 3)),
    st.tuples(st.just("crop"), st.integers(1, 3)),
)


def _apply(layer: DynamicLayer, op: tuple, rows: int, seed: int) -> int:
    kind, arg = op
    if kind == "update":
        g = torch.Generator().manual_seed(seed)
        # values narrower than keys: some models cache latents of two widths through one layer
        keys, values = torch.randn(rows, 2, arg, 4, generator=g), torch.randn(rows, 2, arg, 3, generator=g)
        out_k, out_v = layer.update(keys, values)
        assert torch.equal(out_k, layer.keys) and torch.equal(out_v, layer.values)
    elif kind == "reserve":
        if isinstance(layer, ReservedLayer):
            layer.reserve(arg)
    elif kind == "select" and layer.get_seq_length() > 0:
        index = torch.tensor([i % rows for i in arg])
        layer.batch_select_indices(index)
        return len(index)
    elif kind == "repeat" and layer.get_seq_length() > 0:
        layer.batch_repeat_interleave(arg)
        return rows * arg
    elif kind == "crop" and layer.get_seq_length() > arg:
        layer.crop(-arg)
    return rows


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.lists(OPERATION, max_size=14))
def test_a_reserved_layer_holds_what_a_concatenating_layer_holds(rows: int, operations: list) -> None:
    plain, reserved = DynamicLayer(), ReservedLayer()
    plain_rows = reserved_rows = rows
    for step, op in enumerate(operations):
        plain_rows = _apply(plain, op, plain_rows, seed=step)
        reserved_rows = _apply(reserved, op, reserved_rows, seed=step)
        assert plain_rows == reserved_rows
        assert plain.get_seq_length() == reserved.get_seq_length()
        if plain.get_seq_length():
            assert torch.equal(plain.keys, reserved.keys) and torch.equal(plain.values, reserved.values)
            assert reserved.capacity >= reserved.get_seq_length()


def test_decoding_within_the_reserved_room_writes_in_place() -> None:
    layer = ReservedLayer()
    layer.update(torch.randn(2, 3, 10, 8), torch.randn(2, 3, 10, 8))
    layer.reserve(14)
    buffer = layer._key_buffer
    for _ in range(4):
        layer.update(torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8))
    assert layer._key_buffer is buffer and layer.get_seq_length() == 14  # no token copied the cache again
    layer.update(torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8))
    assert layer.capacity == 28  # past the room it grows, doubling


def test_a_prefill_after_a_long_shared_prefix_grows_the_room_to_fit_not_double() -> None:
    layer = ReservedLayer()
    layer.update(torch.randn(1, 3, 300, 8), torch.randn(1, 3, 300, 8))  # the shared prefix, once
    layer.batch_repeat_interleave(4)  # copied to every prompt
    layer.update(torch.randn(4, 3, 20, 8), torch.randn(4, 3, 20, 8))  # each prompt's own suffix
    assert layer.capacity == 320


def test_a_batch_that_is_not_the_caches_is_refused() -> None:
    layer = ReservedLayer()
    layer.update(torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4))
    layer.reserve(10)
    with pytest.raises(ValueError, match="a batch of 1 rows for a cache of 3"):
        layer.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))  # would broadcast silently into the room


@given(prefix=st.integers(0, 4), lengths=st.lists(st.integers(1, 5), min_size=1, max_size=4),
       extra=st.integers(0, 3), room=st.integers(0, 6))
@settings(max_examples=40, deadline=None)
def test_a_packed_prefill_unpacks_into_the_rows_left_padded_after_the_prefix(prefix, lengths, extra, room) -> None:
    """Row r of the unpacked cache is the prefix, zeros, then its own span (right-aligned in `width` columns),
    with `room` more tokens reserved; a step decoded after it lands right after every row's span."""
    width = max(lengths) + extra
    g = torch.Generator().manual_seed(len(lengths))
    keys, values = torch.randn(1, 2, prefix + sum(lengths), 4, generator=g), torch.randn(1, 2, prefix + sum(lengths), 3, generator=g)
    layer = ReservedLayer()
    layer.update(keys, values)
    layer.unpack_rows(prefix, lengths, width, room)
    assert layer.keys.shape == (len(lengths), 2, prefix + width, 4) and layer.capacity == prefix + width + room
    start = prefix
    for r, n in enumerate(lengths):
        for packed, rows in ((keys, layer.keys), (values, layer.values)):
            assert torch.equal(rows[r, :, :prefix], packed[0, :, :prefix])
            assert torch.equal(rows[r, :, prefix + width - n:], packed[0, :, start:start + n])
            assert not rows[r, :, prefix:prefix + width - n].any()
        start += n
    buffer = layer._key_buffer
    layer.update(torch.ones(len(lengths), 2, 1, 4), torch.ones(len(lengths), 2, 1, 3))
    assert layer.get_seq_length() == prefix + width + 1 and torch.equal(layer.keys[:, :, -1], torch.ones(len(lengths), 2, 4))
    assert (layer._key_buffer is buffer) == (room > 0)  # decoded in place within the room


def test_only_a_one_row_cache_holding_the_packed_tokens_unpacks() -> None:
    layer = ReservedLayer()
    layer.update(torch.zeros(2, 1, 5, 4), torch.zeros(2, 1, 5, 4))
    with pytest.raises(ValueError, match="one row"):
        layer.unpack_rows(1, [2, 2], 2)
    single = ReservedLayer()
    single.update(torch.zeros(1, 1, 5, 4), torch.zeros(1, 1, 5, 4))
    with pytest.raises(ValueError, match="1 \\+ 3 tokens"):
        single.unpack_rows(1, [1, 2], 2)
    plain = DynamicCache()
    plain.layers = [DynamicLayer()]
    with pytest.raises(TypeError, match="ReservedLayers"):
        kv_cache.unpack_rows(plain, prefix=0, lengths=[1], width=1)


def test_the_cache_of_a_model_is_made_of_reserved_layers_with_or_without_its_config() -> None:
    config = load_policy_model("tiny-random", trainable=False)[0].config

    class WithConfig:
        pass

    model = WithConfig()
    model.config = config
    cache = reserved_cache(model)
    assert cache.layers and all(type(layer) is ReservedLayer for layer in cache.layers)
    lazy = reserved_cache(object())  # no config: transformers makes a layer per index as the forward reaches it
    lazy.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), layer_idx=0)
    reserve(lazy, 9)
    assert type(lazy.layers[0]) is ReservedLayer and lazy.layers[0].capacity == 9


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_hf_policy_replies_are_the_same_as_with_a_concatenating_cache(monkeypatch, temperature) -> None:
    model, tok = load_policy_model("tiny-random", trainable=False)
    requests = [PolicyRequest([{"role": "system", "content": "Reply with <action>...</action>. " * 4},
                               {"role": "user", "content": text}])
                for text in ("Go to the fridge.", "Heat an egg and put it in the garbagecan.", "Look.", "Look.")]

    def act():
        return HFPolicy(model, tok, max_new_tokens=10, temperature=temperature, batch_size=4, seed=5).act(requests)

    made: list[DynamicCache] = []
    monkeypatch.setattr(kv_cache, "reserved_cache", lambda m: made.append(reserved_cache(m)) or made[-1])
    reserved = act()
    assert made and all(layer.capacity > layer.get_seq_length() for layer in made[0].layers)  # room was left
    monkeypatch.setattr(kv_cache, "reserved_cache", lambda m: DynamicCache(config=getattr(m, "config", None)))
    concatenated = act()
    for a, b in zip(reserved, concatenated, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-6)
