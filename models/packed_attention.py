"""Attention over rows laid end to end in one sequence, without padding: the packed layout of the update, the
warm start's SFT and the HF sampler's prefill.

A packed forward call gets one sequence (1, T) whose rows span `cu_seq_lens_q[r]:cu_seq_lens_q[r + 1]`, with
position ids that restart at every row. Inside `packed_attention(model)`, attention goes through
`packed_sdpa_attention` (transformers' `AttentionInterface` passes it the row boundaries): causal SDPA on each row's
own span, so no FLOP goes to padding. A cached prefix of P tokens gives P more keys than queries; every row sees
them, then its own span causally. A shared prefix span (`shared_prefix_len`: the trainer's rows share their system
message) is laid once as the first span, and every row attends to it as to its own first tokens: the numbers of
each row laid out whole, with gradients from every row flowing into it. `supports_packing` says which models
qualify (`PACKED_MODEL_TYPES`, no gradient checkpointing); the others keep the padded path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import torch
from torch import Tensor

__all__ = ["PACKED_MODEL_TYPES", "packed_attention", "packed_sdpa_attention", "supports_packing"]

# Model families (tested here) whose attention dispatches through transformers' AttentionInterface with the
# forward's keyword arguments (the row boundaries reach `packed_sdpa_attention`) and whose causal LM accepts
# positions as `logits_to_keep`. Other models keep the padded path.
PACKED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
_PACKED_ATTENTION = "agentgym_opsd_packed_sdpa"


def supports_packing(model: torch.nn.Module) -> bool:
    """Whether the packed layout gives the padded layout's numbers for this model. Gradient checkpointing
    re-runs the forward pass during backward, after the packed attention is switched off again, so it keeps
    the padded path."""
    config = getattr(model, "config", None)
    checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.x's name
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    return getattr(config, "model_type", None) in PACKED_MODEL_TYPES and not checkpointing


def packed_sdpa_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                          attention_mask: Tensor | None, *, cu_seq_lens_q: Tensor | None = None,
                          shared_prefix_len: int = 0, **kwargs: Any) -> tuple[Tensor, None]:
    """transformers attention function for packed rows: q (1, heads, T, head_dim), k/v (1, kv_heads, P + T,
    head_dim), the first P keys a cached prefix every row sees (P = 0 without a cache). With `shared_prefix_len`
    the first span of `cu_seq_lens_q` is a prefix too: it attends causally to itself, and every later span sees it.
    Returns (1, T, heads, head_dim) like `sdpa`."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cu_seq_lens_q is None or attention_mask is not None:
        raise ValueError("the packed attention needs the row boundaries (cu_seq_lens_q) and no attention mask; "
                         "call it inside packed_attention(model) with them")
    kwargs.pop("is_causal", None)
    kwargs.pop("cu_seq_lens_k", None)
    lengths = [e - s for s, e in pairwise(cu_seq_lens_q.tolist())]
    if shared_prefix_len and lengths[0] != shared_prefix_len:
        raise ValueError(f"the first span ({lengths[0]} tokens) is not the shared prefix of {shared_prefix_len}")
    seen = key.shape[2] - query.shape[2]  # keys every span sees: the cached prefix, then the shared span
    # `split` rather than slicing: its backward is one concatenation, not a zero-filled full-size gradient
    # per row and per tensor.
    spans = zip(query.split(lengths, dim=2), key[:, :, seen:].split(lengths, dim=2),
                value[:, :, seen:].split(lengths, dim=2), strict=True)
    parts = []
    for j, (q, k, v) in enumerate(spans):
        if seen:
            k, v = torch.cat([key[:, :, :seen], k], dim=2), torch.cat([value[:, :, :seen], v], dim=2)
            # the whole prefix, then the row's own keys causally: bottom-right aligned (SDPA's `is_causal` aligns
            # top-left when queries and keys differ in number)
            visible = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(seen)
            parts.append(sdpa_attention_forward(module, q, k, v, visible[None, None], is_causal=False, **kwargs)[0])
        else:
            parts.append(sdpa_attention_forward(module, q, k, v, None, is_causal=True, **kwargs)[0])
        if j == 0 and shared_prefix_len:
            seen += shared_prefix_len
    return torch.cat(parts, dim=1), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The mask builder of the packed attention: rows are separated by their spans, not by a mask."""
    return None


@contextlib.contextmanager
def packed_attention(model: torch.nn.Module) -> Iterator[None]:
    """Route the model's attention through `packed_sdpa_attention` for the forward calls inside the block (the
    sampler and the log-prob passes share the model and keep its own implementation otherwise). Registering
    twice is harmless."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(_PACKED_ATTENTION, packed_sdpa_attention)
    AttentionMaskInterface.register(_PACKED_ATTENTION, _no_mask)
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = _PACKED_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before
