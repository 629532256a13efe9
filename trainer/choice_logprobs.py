"""Sequence log-probs of a turn's choices: every admissible action scored as a continuation of one prompt.

The choice-level self-teacher (`agentgym_opsd.credit.evidence`, `teacher.evidence=choice`) needs, per turn
and per branch (student prompt, teacher prompt), log π(choice text | prompt) for every choice the turn had —
tens of short continuations of the same long prompt. Scoring each (prompt, choice) pair alone would run the
prompt once per choice; here the prompt runs once and every choice is scored against its KV cache:

1. prompts that start alike (the system message, with its skill block `c+` on the teacher side) are grouped
   (`shared_prefix_groups`, as in the teacher pass) and the common prefix runs once into a KV cache;
2. per row, the rest of its prompt runs on that cache; the last prompt position's distribution scores each
   choice's first token;
3. the row's choices are laid end to end in one sequence on top of the cache, with a 4-D attention mask:
   a choice token sees the whole prompt and the earlier tokens of its own choice only, and its position id
   continues after the prompt, so each choice sees exactly the sequence it would see alone (one forward
   pass for the whole choice set, no copy of the cache per choice);
4. the cache is cropped back after each step, so the next row (or choice chunk) starts from the prefix.

Same numbers as scoring each full sequence on its own (`tests/test_choice_evidence.py`, to 1e-5), at the
cost of one prompt pass plus the choices' own tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from agentgym_opsd.models.hf_policy import cache_kwarg
from agentgym_opsd.trainer.logprobs import shared_prefix_groups

__all__ = ["choice_logprobs", "pack_choices"]


def pack_choices(choices: Sequence[Sequence[int]], context_len: int, dtype: torch.dtype = torch.float32,
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """(input_ids (1, T), position_ids (1, T), additive attention mask (1, 1, T, context_len + T)) of the
    choices laid end to end after `context_len` cached positions: every token attends to the whole context
    and, causally, to its own choice (0 where allowed, the dtype's minimum elsewhere: eager and SDPA both
    add it to the scores)."""
    lengths = [len(c) for c in choices]
    total = sum(lengths)
    ids = torch.tensor([[t for c in choices for t in c]], dtype=torch.long)
    owner = torch.repeat_interleave(torch.arange(len(choices)), torch.tensor(lengths))  # (T,) choice of each token
    offset = torch.cat([torch.arange(n) for n in lengths]) if total else torch.zeros(0, dtype=torch.long)
    position_ids = (context_len + offset)[None, :]
    index = torch.arange(total)
    allowed = (owner[:, None] == owner[None, :]) & (index[None, :] <= index[:, None])  # (T, T)
    allowed = torch.cat([torch.ones(total, context_len, dtype=torch.bool), allowed], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return ids, position_ids, mask[None, None]


def _truncate(cache: Any, length: int) -> None:
    """Keep the first `length` positions of a KV cache (`crop(-n)` removes n: the form every recent
    transformers accepts)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _chunks(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Consecutive choice indices whose tokens fit under `max_tokens` (a longer choice gets its own chunk)."""
    chunks: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        if current and used + n > max_tokens:
            chunks.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        chunks.append(current)
    return chunks


def _score_choices(model: torch.nn.Module, cache: Any, context_len: int, first: Tensor,
                   choices: Sequence[Sequence[int]], *, temperature: float, max_tokens: int,
                   device: torch.device | str) -> Tensor:
    """(choices,) Σ_t log π(c_t | context, c_<t) of each choice; `first` (vocab,) is the log-distribution
    after the context (it scores each choice's first token); the cache holds `context_len` positions."""
    dtype = next(model.parameters()).dtype
    out = torch.zeros(len(choices), dtype=torch.float64)
    for chunk in _chunks([len(c) for c in choices], max_tokens):
        group = [choices[i] for i in chunk]
        ids, positions, mask = pack_choices(group, context_len, dtype=dtype)
        logits = model(input_ids=ids.to(device), position_ids=positions.to(device), attention_mask=mask.to(device),
                       use_cache=True, **{cache_kwarg(model): cache}).logits[0]  # (T, vocab)
        _truncate(cache, context_len)  # the choices' keys must not stay in the context of the next chunk
        logp = torch.log_softmax(logits.float() / temperature, dim=-1).cpu()
        start = 0
        for i, c in zip(chunk, group, strict=True):
            n = len(c)
            # token 0 is predicted by the context's last position; token t > 0 by the choice's position t − 1
            inner = logp[start:start + n - 1].gather(-1, torch.tensor(c[1:], dtype=torch.long)[:, None]).sum()
            out[i] = float(first[c[0]]) + float(inner)
            start += n
    return out


@torch.no_grad()
def choice_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    choices: Sequence[Sequence[Sequence[int]]],
    *,
    temperature: float = 1.0,
    max_tokens: int = 2048,
    device: torch.device | str = "cpu",
) -> list[Tensor]:
    """Per prompt, a (choices,) float64 tensor of each choice's sequence log-prob Σ_t log π(c_t | prompt,
    c_<t) at `temperature` (no grad). `choices[i]` are the token ids of prompt i's choices (each non-empty);
    at most `max_tokens` choice tokens run in one forward pass."""
    from transformers import DynamicCache

    if len(prompts) != len(choices):
        raise ValueError(f"{len(prompts)} prompts but {len(choices)} choice lists")
    if any(not p for p in prompts):
        raise ValueError("every prompt needs at least one token: its last position scores the first choice token")
    if any(not c for row in choices for c in row):
        raise ValueError("every choice needs at least one token")
    results: list[Tensor] = [torch.zeros(0, dtype=torch.float64) for _ in prompts]
    was_training = model.training
    model.eval()
    try:
        for prefix_len, idx in shared_prefix_groups(prompts):
            cache = DynamicCache()
            if prefix_len:
                prefix = torch.tensor([list(prompts[idx[0]][:prefix_len])], dtype=torch.long, device=device)
                model(input_ids=prefix, use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache})
            for i in idx:
                if not choices[i]:
                    continue
                suffix = list(prompts[i][prefix_len:])
                positions = torch.arange(prefix_len, prefix_len + len(suffix), device=device)[None, :]
                logits = model(input_ids=torch.tensor([suffix], dtype=torch.long, device=device),
                               position_ids=positions, use_cache=True, logits_to_keep=1,
                               **{cache_kwarg(model): cache}).logits[0, -1]
                first = torch.log_softmax(logits.float() / temperature, dim=-1).cpu()
                results[i] = _score_choices(model, cache, len(prompts[i]), first, choices[i],
                                            temperature=temperature, max_tokens=max_tokens, device=device)
                _truncate(cache, prefix_len)  # back to the shared prefix for the group's next row
    finally:
        model.train(was_training)
    return results
