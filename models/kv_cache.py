"""A KV cache that decodes in place: room for the tokens still to come is reserved once, and each new token's keys
and values are written into it, where transformers' `DynamicLayer` concatenates the whole cache again per token.

Why: a decode step of a small model on a CPU is bound by memory traffic, not arithmetic. `torch.cat` copies every
cached key and value of every layer at every step: for SmolLM2-135M (30 layers, 3 KV heads of 64) that is about
46 KB per cached token per step, 10 MB per row of an ALFWorld prompt (~220 tokens), read and written again for a
one-token step whose weights are 540 MB. A row's cost then grows with its prompt, and so does the whole batch's.
`ReservedLayer` keeps its keys and values in buffers with `reserve(cache, length)` room; `keys` / `values` are
views of the filled part, which the attention reads as it read the concatenated tensors (`sdpa` takes strided keys).
It pays where the context is long against the weights (page histories), and barely where the weights dominate
(short ALFWorld prompts): docs/benchmarks.md has the measurements. The sampler reserves room for a whole reply (`max_new_tokens`) at once: the memory a row that writes it all would
take in `DynamicCache` too, without the transient second copy `torch.cat` makes.

The numbers are the same as `DynamicLayer`'s: the same key and value tensors at the same positions, only stored
in a larger buffer (tests/test_kv_cache.py; greedy replies identical, log-probs equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

__all__ = ["ReservedLayer", "reserve", "reserved_cache", "unpack_rows"]


class ReservedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of buffers `(batch, kv_heads, capacity, head_dim)`; an
    update writes into the reserved room and grows the buffers only when a step runs past it."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._length = 0

    @property
    def capacity(self) -> int:
        """Tokens the buffers hold before they must grow."""
        return 0 if not self.is_initialized or self._key_buffer is None else self._key_buffer.shape[-2]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._key_buffer is not None and key_states.shape[0] != self._key_buffer.shape[0]:
            raise ValueError(f"a batch of {key_states.shape[0]} rows for a cache of {self._key_buffer.shape[0]}")
        end = self._length + key_states.shape[-2]
        if end > self.capacity:
            # A prefill past the room grows the buffers to fit exactly (a suffix after a shared prefix must not
            # double a long prefix's room); a decode step past it doubles them, so a caller that never reserves
            # still copies the cache only now and then.
            decoding = key_states.shape[-2] == 1 and self._key_buffer is not None
            self._grow(max(end, 2 * self.capacity) if decoding else end, like=(key_states, value_states))
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer[..., self._length : end, :] = key_states
        self._value_buffer[..., self._length : end, :] = value_states
        self._length = end
        self._expose()
        return self.keys, self.values

    def reserve(self, capacity: int) -> None:
        """Room for `capacity` tokens in all (those cached included), so updates up to it copy nothing else."""
        if self.is_initialized and self._key_buffer is not None and capacity > self.capacity:
            assert self._value_buffer is not None
            self._grow(capacity, like=(self._key_buffer, self._value_buffer))

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            super().crop(tokens_to_remove)  # raises: the legacy absolute form is not supported
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self._length = max(self._length - abs(tokens_to_remove), 0)
        self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            self._set_buffers(self._key_buffer.repeat_interleave(repeats, dim=0),
                              self._value_buffer.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self._set_buffers(self._key_buffer[indices, ...], self._value_buffer[indices, ...])

    def unpack_rows(self, prefix: int, lengths: Sequence[int], width: int, room: int = 0) -> None:
        """One cached row — `prefix` tokens, then the rows' spans of `lengths` end to end (a packed prefill) — laid
        out as a batch of rows: the prefix, then each row's span right-aligned in `width` columns, zeros where a
        row is shorter (positions its attention mask leaves out); `room` more tokens reserved after them."""
        assert self._key_buffer is not None and self._value_buffer is not None
        if self._key_buffer.shape[0] != 1 or self._length != prefix + sum(lengths):
            raise ValueError(f"a packed cache holds one row of {prefix} + {sum(lengths)} tokens, not "
                             f"{self._key_buffer.shape[0]} of {self._length}")
        end = prefix + width
        unpacked = []
        for packed in (self._key_buffer, self._value_buffer):
            rows = packed.new_empty((len(lengths), *packed.shape[1:-2], end + room, packed.shape[-1]))
            rows[..., :prefix, :] = packed[..., :prefix, :]
            rows[..., prefix:end, :] = 0
            start = prefix
            for r, length in enumerate(lengths):
                rows[r, ..., end - length : end, :] = packed[0, ..., start : start + length, :]
                start += length
            unpacked.append(rows)
        self._length = end
        self._set_buffers(*unpacked)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            self.batch_select_indices(beam_idx.to(self.device))

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        self._length = 0
        super().reset()

    def offload(self) -> None:
        if self.is_initialized and self._key_buffer is not None and self._value_buffer is not None:
            self._set_buffers(self._key_buffer.to("cpu", non_blocking=True),
                              self._value_buffer.to("cpu", non_blocking=True))

    def prefetch(self) -> None:
        if self.is_initialized and self._key_buffer is not None and self._value_buffer is not None \
                and self._key_buffer.device != self.device:
            self._set_buffers(self._key_buffer.to(self.device, non_blocking=True),
                              self._value_buffer.to(self.device, non_blocking=True))

    def _grow(self, capacity: int, *, like: tuple[torch.Tensor, torch.Tensor]) -> None:
        # Keys and values may differ in width (a model that caches latents of two sizes), so each has its shape.
        keys, values = (t.new_empty((*t.shape[:2], capacity, t.shape[-1])) for t in like)
        if self._key_buffer is not None and self._value_buffer is not None and self._length:
            keys[..., : self._length, :] = self._key_buffer[..., : self._length, :]
            values[..., : self._length, :] = self._value_buffer[..., : self._length, :]
        self._set_buffers(keys, values)

    def _set_buffers(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self._key_buffer, self._value_buffer = keys, values
        self._expose()

    def _expose(self) -> None:
        assert self._key_buffer is not None and self._value_buffer is not None
        self.keys = self._key_buffer[..., : self._length, :]
        self.values = self._value_buffer[..., : self._length, :]


def reserved_cache(model: Any) -> DynamicCache:
    """A `DynamicCache` for `model` whose full-attention layers are `ReservedLayer`s (other layer kinds, such as
    sliding-window ones, stay as transformers makes them)."""
    cache = DynamicCache(config=getattr(model, "config", None))
    cache.layers = [ReservedLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    if cache.layer_class_to_replicate is DynamicLayer:  # no config: layers are made as the forward reaches them
        cache.layer_class_to_replicate = ReservedLayer
    return cache


def unpack_rows(cache: DynamicCache, *, prefix: int, lengths: Sequence[int], width: int, room: int = 0) -> None:
    """`ReservedLayer.unpack_rows` on every layer of `cache`, whose layers must all be `ReservedLayer`s."""
    if not all(isinstance(layer, ReservedLayer) for layer in cache.layers):
        raise TypeError("only a cache of ReservedLayers can be unpacked")
    for layer in cache.layers:
        layer.unpack_rows(prefix, lengths, width, room)


def reserve(cache: DynamicCache, length: int) -> None:
    """Room for `length` tokens in every `ReservedLayer` of `cache` (those cached included)."""
    for layer in cache.layers:
        if isinstance(layer, ReservedLayer):
            layer.reserve(length)
