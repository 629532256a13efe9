"""Sequence log-probs of a turn's choices: every admissible action scored as a continuation of one prompt.

The choice-level self-teacher (`teacher.evidence=choice`) needs log π(choice | prompt) for every choice of a turn,
per branch (student prompt, teacher prompt): tens of short continuations of one long prompt, so the prompt runs
once. Prompts that share a prefix (`shared_prefix_groups`) run it once into a KV cache; each row runs the rest of
its prompt on it, and its choices are laid end to end on top (`pack_choices`) with a 4-D mask and position ids that
let each choice see exactly the prompt and its own earlier tokens; the cache is cropped back after each chunk. The
numbers equal scoring each full sequence alone. `score_continuations` also takes a row's sampled reply as one more
continuation, so the teacher pass gets the reply's teacher-forced log-probs without running the prompt again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentgym_opsd.models.hf_policy import cache_kwarg
from agentgym_opsd.trainer.logprobs import shared_prefix_groups

__all__ = ["ChoicePass", "choice_logprobs", "pack_choices", "score_continuations"]


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


def _continuation_logprobs(model: torch.nn.Module, cache: Any, context_len: int, first: Tensor,
                           continuations: Sequence[Sequence[int]], *, temperature: float, max_tokens: int,
                           device: torch.device | str) -> list[Tensor]:
    """Per continuation, (tokens,) float32 log π(c_t | context, c_<t); `first` (vocab,) is the log-distribution
    after the context (it scores each continuation's first token); the cache holds `context_len` positions."""
    dtype = next(model.parameters()).dtype
    out: list[Tensor] = [torch.zeros(0) for _ in continuations]
    for chunk in _chunks([len(c) for c in continuations], max_tokens):
        group = [continuations[i] for i in chunk]
        ids, positions, mask = pack_choices(group, context_len, dtype=dtype)
        logits = model(input_ids=ids.to(device), position_ids=positions.to(device), attention_mask=mask.to(device),
                       use_cache=True, **{cache_kwarg(model): cache}).logits[0]  # (T, vocab)
        _truncate(cache, context_len)  # the continuations' keys must not stay in the context of the next chunk
        logp = torch.log_softmax(logits.float() / temperature, dim=-1).cpu()
        start = 0
        for i, c in zip(chunk, group, strict=True):
            n = len(c)
            # token 0 is predicted by the context's last position; token t > 0 by the continuation's t − 1
            inner = logp[start:start + n - 1].gather(-1, torch.tensor(c[1:], dtype=torch.long)[:, None])[:, 0]
            out[i] = torch.cat([first[c[0]].reshape(1), inner])
            start += n
    return out


@dataclass(frozen=True)
class ChoicePass:
    """What one choice pass scored: per prompt, its choices' sequence log-probs ((choices,) float64) and, where
    a reply was given, the reply's per-token log-probs ((tokens,) float32): the sampled response teacher-forced
    on the same KV cache, so the teacher pass need not run that prompt a second time."""

    choices: list[Tensor]
    replies: list[Tensor | None]


@torch.no_grad()
def score_continuations(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    choices: Sequence[Sequence[Sequence[int]]],
    replies: Sequence[Sequence[int] | None] | None = None,
    *,
    temperature: float = 1.0,
    max_tokens: int = 2048,
    device: torch.device | str = "cpu",
) -> ChoicePass:
    """Every prompt once, its choices (and its reply, when `replies[i]` is given) as continuations of its KV
    cache, at `temperature` (no grad). `choices[i]` are the token ids of prompt i's choices (each non-empty);
    at most `max_tokens` continuation tokens run in one forward pass."""
    from transformers import DynamicCache

    replies = list(replies) if replies is not None else [None] * len(prompts)
    if not len(prompts) == len(choices) == len(replies):
        raise ValueError(f"{len(prompts)} prompts, {len(choices)} choice lists and {len(replies)} replies")
    if any(not p for p in prompts):
        raise ValueError("every prompt needs at least one token: its last position scores the first choice token")
    if any(not c for row in choices for c in row) or any(r is not None and not r for r in replies):
        raise ValueError("every choice and reply needs at least one token")
    scores: list[Tensor] = [torch.zeros(0, dtype=torch.float64) for _ in prompts]
    reply_logprobs: list[Tensor | None] = [None] * len(prompts)
    was_training = model.training
    model.eval()
    try:
        for prefix_len, idx in shared_prefix_groups(prompts):
            cache = DynamicCache()
            if prefix_len:
                prefix = torch.tensor([list(prompts[idx[0]][:prefix_len])], dtype=torch.long, device=device)
                model(input_ids=prefix, use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache})
            for i in idx:
                reply = replies[i]
                continuations = [*choices[i], *([reply] if reply is not None else [])]
                if not continuations:
                    continue
                suffix = list(prompts[i][prefix_len:])
                positions = torch.arange(prefix_len, prefix_len + len(suffix), device=device)[None, :]
                logits = model(input_ids=torch.tensor([suffix], dtype=torch.long, device=device),
                               position_ids=positions, use_cache=True, logits_to_keep=1,
                               **{cache_kwarg(model): cache}).logits[0, -1]
                first = torch.log_softmax(logits.float() / temperature, dim=-1).cpu()
                got = _continuation_logprobs(model, cache, len(prompts[i]), first, continuations,
                                             temperature=temperature, max_tokens=max_tokens, device=device)
                n = len(choices[i])
                scores[i] = torch.tensor([float(t.double().sum()) for t in got[:n]], dtype=torch.float64)
                if reply is not None:
                    reply_logprobs[i] = got[n]
                _truncate(cache, prefix_len)  # back to the shared prefix for the group's next row
    finally:
        model.train(was_training)
    return ChoicePass(scores, reply_logprobs)


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
    c_<t) at `temperature` (no grad; `score_continuations` without replies)."""
    return score_continuations(model, prompts, choices, temperature=temperature, max_tokens=max_tokens,
                               device=device).choices
