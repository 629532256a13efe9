"""Teacher-forced token log-probs of sampled responses, micro-batched and length-bucketed.

A row is (prompt ids, response ids). Rows are sorted by length and packed into micro-batches under a token
budget (`bucket_micro_batches`), so short turns are not padded to the longest one of the step. Each
micro-batch is left-padded: every response then ends at the last position, and the model only computes
logits for the last `max_response + 1` positions (`logits_to_keep`) — a (rows, response, vocab) tensor
instead of (rows, prompt + response, vocab). Position ids follow the attention mask, exactly as
`generate` does with left padding, so recomputed log-probs match the sampling ones for the HF backend.

Log-probs are taken at a temperature: `log_softmax(logits / T)`, the sampling distribution of the rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentgym_opsd.models.hf_policy import cache_kwarg

__all__ = [
    "MicroBatch",
    "batched_response_logprobs",
    "bucket_micro_batches",
    "collate",
    "prefix_shared_response_logprobs",
    "response_logprobs",
    "shared_prefix_groups",
]


@dataclass
class MicroBatch:
    """Left-padded model inputs for some rows. `response_mask` (rows, R) marks real response tokens;
    `response_ids` (rows, R) holds them right-aligned like the inputs (pad where the mask is False)."""

    indices: list[int]
    input_ids: Tensor  # (rows, L)
    attention_mask: Tensor  # (rows, L)
    position_ids: Tensor  # (rows, L)
    response_ids: Tensor  # (rows, R)
    response_mask: Tensor  # (rows, R) bool

    def to(self, device: torch.device | str) -> MicroBatch:
        return MicroBatch(self.indices, *(t.to(device) for t in (
            self.input_ids, self.attention_mask, self.position_ids, self.response_ids, self.response_mask)))


def bucket_micro_batches(lengths: Sequence[int], *, max_tokens: int, max_rows: int) -> list[list[int]]:
    """Group row indices (sorted by length) so that rows × longest ≤ max_tokens and rows ≤ max_rows.

    A single row longer than the budget still gets its own micro-batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = max([lengths[j] for j in current] + [lengths[i]])
        if current and (len(current) + 1 > max_rows or (len(current) + 1) * longest > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def collate(
    indices: Sequence[int], prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int
) -> MicroBatch:
    """Left-pad prompt+response of the given rows; responses are right-aligned at the end."""
    seqs = [list(prompts[i]) + list(responses[i]) for i in indices]
    width = max(len(s) for s in seqs)
    resp_width = max(max(len(responses[i]) for i in indices), 1)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    resp_ids = torch.full((len(seqs), resp_width), pad_id, dtype=torch.long)
    resp_mask = torch.zeros((len(seqs), resp_width), dtype=torch.bool)
    for r, (i, s) in enumerate(zip(indices, seqs, strict=True)):
        input_ids[r, width - len(s):] = torch.tensor(s, dtype=torch.long)
        attention[r, width - len(s):] = 1
        n = len(responses[i])
        if n:
            resp_ids[r, resp_width - n:] = torch.tensor(list(responses[i]), dtype=torch.long)
            resp_mask[r, resp_width - n:] = True
    position_ids = (attention.cumsum(-1) - 1).clamp_min(0)
    return MicroBatch(list(indices), input_ids, attention, position_ids, resp_ids, resp_mask)


def response_logprobs(
    model: torch.nn.Module,
    mb: MicroBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    prefix_cache: Any = None,
) -> tuple[Tensor, Tensor | None]:
    """(rows, R) log-prob of each response token (0 where masked) and optionally its entropy (rows, R).

    With `prefix_cache` (a KV cache of a prompt prefix that every row shares, repeated over the rows), `mb`
    holds only what follows the prefix: the attention mask is extended over the prefix and positions
    continue after it. Gradients flow when the caller has them enabled (the update pass); log-prob passes
    wrap this in `torch.no_grad()`.
    """
    resp_width = mb.response_ids.shape[1]
    attention_mask, position_ids = mb.attention_mask, mb.position_ids
    if prefix_cache is not None:
        prefix_len = prefix_cache.get_seq_length()
        ones = attention_mask.new_ones(attention_mask.shape[0], prefix_len)
        attention_mask, position_ids = torch.cat([ones, attention_mask], dim=1), position_ids + prefix_len
    out = model(input_ids=mb.input_ids, attention_mask=attention_mask, position_ids=position_ids,
                logits_to_keep=resp_width + 1, use_cache=prefix_cache is not None, **{cache_kwarg(model): prefix_cache})
    # Logits at position p predict token p+1: the last R+1 positions minus the final one predict the R
    # response slots.
    logits = out.logits[:, :-1, :].float() / temperature  # (rows, R, vocab)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, mb.response_ids.unsqueeze(-1)).squeeze(-1)
    logp = torch.where(mb.response_mask, logp, torch.zeros_like(logp))
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        entropy = torch.where(mb.response_mask, entropy, torch.zeros_like(entropy))
    return logp, entropy


@torch.no_grad()
def batched_response_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    pad_id: int,
    temperature: float = 1.0,
    max_tokens: int = 4096,
    max_rows: int = 16,
    device: torch.device | str = "cpu",
) -> list[Tensor]:
    """Per-row 1-D tensors of response-token log-probs (float32, CPU), in the input order (no grad)."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    results: list[Tensor | None] = [None] * len(prompts)
    was_training = model.training
    model.eval()  # no dropout in log-prob passes
    try:
        for idx in bucket_micro_batches(lengths, max_tokens=max_tokens, max_rows=max_rows):
            mb = collate(idx, prompts, responses, pad_id).to(device)
            logp, _ = response_logprobs(model, mb, temperature=temperature)
            _store_rows(results, idx, logp.cpu(), responses)
    finally:
        model.train(was_training)
    return [t if t is not None else torch.zeros(0) for t in results]


def _store_rows(results: list[Tensor | None], rows: Sequence[int], logp: Tensor,
                responses: Sequence[Sequence[int]]) -> None:
    """Un-pad a (rows, R) right-aligned micro-batch result into per-row 1-D tensors at their indices."""
    for r, i in enumerate(rows):
        n = len(responses[i])
        results[i] = logp[r, logp.shape[1] - n:] if n else logp[r, :0]


def shared_prefix_groups(prompts: Sequence[Sequence[int]], *, min_prefix: int = 16) -> list[tuple[int, list[int]]]:
    """Group rows whose prompts start with the same tokens: (prefix length, row indices) per group.

    Rows are grouped by their first `min_prefix` tokens, and a group's prefix is the longest common prefix
    of its prompts, stopping one token short of the shortest prompt so that every row keeps a suffix. Teacher
    prompts of one task kind share the whole system message with its skill block `c+` — the longest part of
    the prompt — so the prefix is worth computing once. Rows shorter than `min_prefix` form groups of their
    own with prefix length 0.
    """
    buckets: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        key = tuple(p[:min_prefix]) if len(p) > min_prefix else ("row", i)  # type: ignore[assignment]
        buckets.setdefault(key, []).append(i)
    groups = []
    for idx in buckets.values():
        first = prompts[idx[0]]
        n = min(len(prompts[i]) for i in idx) - 1
        for i in idx[1:]:
            other = prompts[i]
            k = 0
            while k < n and other[k] == first[k]:
                k += 1
            n = k
        groups.append((max(n, 0), idx))
    return groups


@torch.no_grad()
def prefix_shared_response_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    pad_id: int,
    temperature: float = 1.0,
    max_tokens: int = 4096,
    max_rows: int = 16,
    device: torch.device | str = "cpu",
) -> list[Tensor]:
    """Same numbers as `batched_response_logprobs`, computing each shared prompt prefix once.

    For every group of rows with a common prefix, the prefix runs once (batch 1) into a KV cache; each
    micro-batch then runs only its rows' suffixes (rest of the prompt + response, left-padded as usual)
    against a copy of that cache repeated over the micro-batch. The attention mask spans prefix + suffix and
    position ids continue after the prefix, so each row sees exactly the sequence it would see alone.
    This is what makes the self-teacher pass cheap: its prompts differ from the student's by a long skill
    block that every row of a task kind shares.
    """
    import copy

    from transformers import DynamicCache

    results: list[Tensor | None] = [None] * len(prompts)
    was_training = model.training
    model.eval()
    try:
        for prefix_len, idx in shared_prefix_groups(prompts):
            if prefix_len == 0:
                sub = batched_response_logprobs(model, [prompts[i] for i in idx], [responses[i] for i in idx],
                                                pad_id=pad_id, temperature=temperature, max_tokens=max_tokens,
                                                max_rows=max_rows, device=device)
                for i, t in zip(idx, sub, strict=True):
                    results[i] = t
                continue
            prefix = torch.tensor([list(prompts[idx[0]][:prefix_len])], dtype=torch.long, device=device)
            prefix_cache = DynamicCache()
            model(input_ids=prefix, use_cache=True, logits_to_keep=1, **{cache_kwarg(model): prefix_cache})
            suffixes = [list(prompts[i][prefix_len:]) for i in idx]
            lengths = [len(s) + len(responses[i]) for s, i in zip(suffixes, idx, strict=True)]
            for local in bucket_micro_batches(lengths, max_tokens=max_tokens, max_rows=max_rows):
                mb = collate(local, suffixes, [responses[i] for i in idx], pad_id).to(device)
                cache = copy.deepcopy(prefix_cache)  # the forward appends to it: one fresh copy per micro-batch
                cache.batch_repeat_interleave(len(local))
                logp, _ = response_logprobs(model, mb, temperature=temperature, prefix_cache=cache)
                _store_rows(results, [idx[j] for j in local], logp.cpu(), responses)
    finally:
        model.train(was_training)
    return [t if t is not None else torch.zeros(0) for t in results]
