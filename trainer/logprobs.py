"""The model under training (`TrainedModel`: model, tokenizer, engine, device) and its teacher-forced token
log-probs of sampled responses, micro-batched and length-bucketed.

A row is (prompt ids, response ids). Rows are sorted by length and packed into micro-batches under a token
budget (`bucket_micro_batches`), so short turns are not padded to the longest one of the step. Each
micro-batch is left-padded: every response then ends at the last position, and the model only computes
logits for the last `max_response + 1` positions (`logits_to_keep`) — a (rows, response, vocab) tensor
instead of (rows, prompt + response, vocab). Position ids follow the attention mask, exactly as
`generate` does with left padding, so recomputed log-probs match the sampling ones for the HF backend.

Log-probs are taken at a temperature: `log_softmax(logits / T)`, the sampling distribution of the rollouts.

The update pass has a second layout without padding (`pack`, `packed_response_logprobs`): a micro-batch's rows
are laid end to end in one sequence, position ids restart at every row, attention runs row by row (causal SDPA
on each row's own span; the HF decoder's packed-sequence interface, `cu_seq_lens_q`), and the LM head runs
only on the positions that predict a response token. Same numbers as the padded path (to float rounding:
`tests/test_update_packed.py`), with no FLOPs spent on pad tokens (in the layers and in attention) or on LM-head
rows of short responses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentgym_opsd.models.hf_policy import MIN_SHARED_PREFIX, cache_kwarg, common_prefix_length
from agentgym_opsd.models.packed_attention import PACKED_MODEL_TYPES, packed_attention, supports_packing
from agentgym_opsd.records import ChatMessage
from agentgym_opsd.trainer.checkpoint import CheckpointError
from agentgym_opsd.trainer.frozen_trunk import TrunkCache, capturing_trunk, trunk_inputs

__all__ = ["MicroBatch", "PACKED_MODEL_TYPES", "PackedBatch", "TrainedModel", "batched_response_logprobs",
           "bucket_micro_batches", "collate", "micro_batch_logprobs", "pack", "packed_batched_response_logprobs",
           "packed_response_logprobs", "prefix_shared_response_logprobs", "response_logprobs",
           "shared_prefix_groups", "shared_prompt_prefix", "supports_packing"]


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


def bucket_micro_batches(lengths: Sequence[int], *, max_tokens: int, max_rows: int,
                         padded: bool = True) -> list[list[int]]:
    """Group row indices (sorted by length) so that rows × longest ≤ max_tokens (`padded`; the sum of the
    lengths for the packed layout, which has no padding) and rows ≤ max_rows.

    A single row longer than the budget still gets its own micro-batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = max([lengths[j] for j in current] + [lengths[i]])
        tokens = (len(current) + 1) * longest if padded else sum(lengths[j] for j in current) + lengths[i]
        if current and (len(current) + 1 > max_rows or tokens > max_tokens):
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
    trunk: tuple[int, Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """(rows, R) log-prob of each response token (0 where masked) and optionally its entropy (rows, R).

    With `prefix_cache` (a KV cache of a prompt prefix that every row shares, repeated over the rows), `mb`
    holds only what follows the prefix: the attention mask is extended over the prefix and positions
    continue after it. Gradients flow when the caller has them enabled (the update pass); log-prob passes
    wrap this in `torch.no_grad()`. `trunk` = (depth, hidden): the frozen blocks' output below `depth` for these
    rows, (rows, L, hidden) laid out as `mb` (`trainer/frozen_trunk.py`); only the blocks above it run.
    """
    resp_width = mb.response_ids.shape[1]
    attention_mask, position_ids = mb.attention_mask, mb.position_ids
    if prefix_cache is not None:
        if trunk is not None:
            raise ValueError("a prefix cache and a kept trunk do not combine: the trunk holds the whole rows")
        prefix_len = prefix_cache.get_seq_length()
        ones = attention_mask.new_ones(attention_mask.shape[0], prefix_len)
        attention_mask, position_ids = torch.cat([ones, attention_mask], dim=1), position_ids + prefix_len
    with trunk_inputs(model, mb.input_ids, trunk) as inputs:
        out = model(**inputs, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=resp_width + 1,
                    use_cache=prefix_cache is not None, **{cache_kwarg(model): prefix_cache})
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


# ---- the packed layout (update pass; the attention: models/packed_attention.py) ---------------------------


@dataclass
class PackedBatch:
    """Some rows laid end to end without padding. Row r spans `cu_seq_lens[r]:cu_seq_lens[r + 1]` of the
    sequence; `logit_positions` are the N positions whose logits predict the N response tokens
    `response_ids`, row after row; `response_mask` (rows, R) is `collate`'s right-aligned mask, where
    `packed_response_logprobs` puts the N values back. With `prefix_len` > 0 the sequence starts with the prompt
    prefix every row shares, once, as its own first span (`cu_seq_lens[0]:[1]`); the rows' spans hold the rest of
    their tokens, at positions continuing after it."""

    indices: list[int]
    input_ids: Tensor  # (1, T), T = sum of the rows' prompt + response lengths (+ the shared prefix once)
    position_ids: Tensor  # (1, T), restarting at 0 in every row (at prefix_len after a shared prefix)
    cu_seq_lens: Tensor  # (rows + 1,) int32, or (rows + 2,) with a shared prefix
    logit_positions: Tensor  # (N,)
    response_ids: Tensor  # (N,)
    response_mask: Tensor  # (rows, R) bool
    prefix_len: int = 0

    def to(self, device: torch.device | str) -> PackedBatch:
        return PackedBatch(self.indices, *(t.to(device) for t in (
            self.input_ids, self.position_ids, self.cu_seq_lens, self.logit_positions, self.response_ids,
            self.response_mask)), prefix_len=self.prefix_len)


def shared_prompt_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens the packed layout lays once for all of `prompts` (`pack`'s `prefix_len`): their
    common prefix (every prompt keeping a token of its own), or 0 below `MIN_SHARED_PREFIX` tokens, where a span of
    its own saves less than it costs."""
    if len(prompts) < 2:
        return 0
    shared = common_prefix_length(prompts)
    return shared if shared >= MIN_SHARED_PREFIX else 0


def pack(indices: Sequence[int], prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
         prefix_len: int = 0, cached_prefix: int = 0) -> PackedBatch:
    """Lay prompt+response of the given rows end to end (each row needs a prompt token before its response); with
    `prefix_len`, the prompts' first `prefix_len` tokens, which they must all share, once at the start. With
    `cached_prefix`, the rows continue a prefix of that many tokens that a KV cache holds (not laid here): their
    positions start after it."""
    if prefix_len and cached_prefix:
        raise ValueError("a shared prefix is either laid in the sequence or held in a cache, not both")
    ids: list[int] = []
    positions: list[int] = []
    bounds = [0]
    prefix: list[int] = []
    if prefix_len:
        prefix = list(prompts[indices[0]][:prefix_len])
        ids, positions = list(prefix), list(range(prefix_len))
        bounds.append(prefix_len)
    logit_positions: list[int] = []
    response_ids: list[int] = []
    resp_width = max(max(len(responses[i]) for i in indices), 1)
    response_mask = torch.zeros((len(indices), resp_width), dtype=torch.bool)
    for r, i in enumerate(indices):
        prompt, response = list(prompts[i]), list(responses[i])
        if prefix_len:
            if len(prompt) <= prefix_len or prompt[:prefix_len] != prefix:
                raise ValueError(f"row {i}'s prompt does not continue the {prefix_len}-token shared prefix with a "
                                 "token of its own")
            prompt = prompt[prefix_len:]
        if not prompt:
            raise ValueError(f"row {i} has an empty prompt: its first response token has no position to predict it")
        start = bounds[-1]
        ids += prompt + response
        first = prefix_len + cached_prefix
        positions += range(first, first + len(prompt) + len(response))
        bounds.append(len(ids))
        logit_positions += range(start + len(prompt) - 1, start + len(prompt) - 1 + len(response))
        response_ids += response
        if response:
            response_mask[r, resp_width - len(response):] = True
    return PackedBatch(list(indices), torch.tensor([ids], dtype=torch.long), torch.tensor([positions], dtype=torch.long),
                       torch.tensor(bounds, dtype=torch.int32), torch.tensor(logit_positions, dtype=torch.long),
                       torch.tensor(response_ids, dtype=torch.long), response_mask, prefix_len=prefix_len)


def packed_response_logprobs(
    model: torch.nn.Module, pb: PackedBatch, *, temperature: float = 1.0, with_entropy: bool = False,
    trunk: tuple[int, Tensor] | None = None, prefix_cache: Any = None,
) -> tuple[Tensor, Tensor | None]:
    """`response_logprobs` on a `PackedBatch`: (rows, R) right-aligned log-probs (0 where masked) and
    optionally entropies, the same numbers to float rounding. Gradients flow when enabled.

    `trunk` = (depth, hidden): the output of the frozen blocks below `depth` for these rows, (1, T, hidden) in
    pack order (`trainer/frozen_trunk.py`); only the blocks above it run. `prefix_cache`: a one-row KV cache of the
    prefix every row continues (`pack(cached_prefix=...)`); the forward appends the rows to it."""
    # The model's own forward (so wrappers — PEFT, DeepSpeed ZeRO-3's module hooks — see the usual call), with
    # `logits_to_keep` as the positions: the LM head runs on those N rows only.
    with packed_attention(model), trunk_inputs(model, pb.input_ids, trunk) as inputs:
        prefix: dict[str, Any] = {"shared_prefix_len": pb.prefix_len} if pb.prefix_len else {}
        if prefix_cache is not None:
            prefix[cache_kwarg(model)] = prefix_cache
        out = model(**inputs, position_ids=pb.position_ids, use_cache=prefix_cache is not None,
                    cu_seq_lens_q=pb.cu_seq_lens, cu_seq_lens_k=pb.cu_seq_lens, logits_to_keep=pb.logit_positions,
                    **prefix)
    logits = out.logits[0].float() / temperature  # (N, vocab)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, pb.response_ids.unsqueeze(-1)).squeeze(-1)  # (N,)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None

    def unpack(flat: Tensor) -> Tensor:  # (N,) -> (rows, R), row-major order = row after row
        return flat.new_zeros(pb.response_mask.shape).masked_scatter(pb.response_mask, flat)

    return unpack(logp), unpack(entropy) if entropy is not None else None


def micro_batch_logprobs(
    model: torch.nn.Module,
    idx: Sequence[int],
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    packed: bool,
    device: torch.device | str,
    pad_id: int | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    trunk: TrunkCache | None = None,
    rows: Sequence[int] | None = None,
    keep: bool = False,
    prefix_len: int = 0,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """One micro-batch of rows `idx`: (rows, R) right-aligned log-probs, entropies (with `with_entropy`) and the
    response mask, packed (no padding) or left-padded (`pad_id`). Gradients flow when enabled. `trunk`, keyed by
    `rows` (default `idx`): where it holds every row, only the trained blocks run from the kept outputs
    (`trainer/frozen_trunk.py`); where it does not and `keep`, the pass leaves the rows' outputs there.
    `prefix_len` (packed only): the prompts' shared first tokens are laid once (`pack`, `shared_prompt_prefix`)."""
    rows = list(idx) if rows is None else list(rows)
    if prefix_len and not packed:
        raise ValueError("a shared prefix is laid once only in the packed layout")
    covered = trunk is not None and trunk.covers(rows, prefix_len=prefix_len)
    with capturing_trunk(model, trunk if keep and not covered else None) as captured:
        if packed:
            pb = pack(idx, prompts, responses, prefix_len=prefix_len).to(device)
            kept = (trunk.depth, trunk.packed(rows, prefix_len=prefix_len).to(device)) \
                if trunk is not None and covered else None
            logp, entropy = packed_response_logprobs(model, pb, temperature=temperature, with_entropy=with_entropy,
                                                     trunk=kept)
        else:
            if pad_id is None:
                raise ValueError("the left-padded layout needs pad_id")
            mb = collate(idx, prompts, responses, pad_id).to(device)
            kept = (trunk.depth, trunk.left_padded(rows, mb.input_ids.shape[1]).to(device)) \
                if trunk is not None and covered else None
            logp, entropy = response_logprobs(model, mb, temperature=temperature, with_entropy=with_entropy,
                                              trunk=kept)
    if captured and trunk is not None:
        if packed:
            trunk.add_packed(rows, captured[0], pb.cu_seq_lens, prefix_len=prefix_len)
        else:
            trunk.add_left_padded(rows, captured[0], mb.attention_mask)
    return logp, entropy, pb.response_mask if packed else mb.response_mask


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


@torch.no_grad()
def packed_batched_response_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    max_tokens: int = 4096,
    max_rows: int = 16,
    device: torch.device | str = "cpu",
    trunk_cache: TrunkCache | None = None,
) -> list[Tensor]:
    """`batched_response_logprobs` in the update's packed layout (no grad): the same kernels and shapes as the
    update's forward pass, so that in bf16 π_old and the update's first forward round alike and the PPO ratio
    starts at 1 (the padded layout's other matmul shapes round differently).
    `trunk_cache`: each row's frozen-trunk output is kept there for the update (`trainer/frozen_trunk.py`). The
    prompts' shared prefix is laid once per micro-batch (`shared_prompt_prefix`), as the update lays it."""
    prefix_len = shared_prompt_prefix(prompts)  # the update lays the same prefix once: it reads the same prompts
    lengths = [len(p) - prefix_len + len(r) for p, r in zip(prompts, responses, strict=True)]
    results: list[Tensor | None] = [None] * len(prompts)
    was_training = model.training
    model.eval()
    try:
        for idx in bucket_micro_batches(lengths, max_tokens=max_tokens, max_rows=max_rows, padded=False):
            logp, _, _ = micro_batch_logprobs(model, idx, prompts, responses, packed=True, device=device,
                                              temperature=temperature, trunk=trunk_cache, keep=True,
                                              prefix_len=prefix_len)
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
    return [(common_prefix_length([prompts[i] for i in idx]), idx) for idx in buckets.values()]


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
    packed: bool = False,
) -> list[Tensor]:
    """Same numbers as `batched_response_logprobs`, computing each shared prompt prefix once.

    For every group of rows with a common prefix, the prefix runs once (batch 1) into a KV cache; each
    micro-batch then runs only its rows' suffixes (rest of the prompt + response) after it, left-padded against a
    copy of the cache repeated over the micro-batch, the attention mask spanning prefix + suffix; or with `packed`
    (a model where `supports_packing`) end to end without padding, each attending to the one-row cache and to
    itself (`models/packed_attention.py`), which the trainer does not use: it was no faster (docs/benchmarks.md),
    since the micro-batches are length-bucketed and a row's attention over the long prefix costs the same. Position ids continue after the prefix, so each row
    sees exactly the sequence it would see alone. This is what makes the self-teacher pass cheap: its prompts
    differ from the student's by a long skill block that every row of a task kind shares.
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
            group_responses = [responses[i] for i in idx]
            for local in bucket_micro_batches(lengths, max_tokens=max_tokens, max_rows=max_rows, padded=not packed):
                cache = copy.deepcopy(prefix_cache)  # the forward appends to it: one fresh copy per micro-batch
                if packed:
                    pb = pack(local, suffixes, group_responses, cached_prefix=prefix_len).to(device)
                    logp, _ = packed_response_logprobs(model, pb, temperature=temperature, prefix_cache=cache)
                else:
                    mb = collate(local, suffixes, group_responses, pad_id).to(device)
                    cache.batch_repeat_interleave(len(local))
                    logp, _ = response_logprobs(model, mb, temperature=temperature, prefix_cache=cache)
                _store_rows(results, [idx[j] for j in local], logp.cpu(), responses)
    finally:
        model.train(was_training)
    return [t if t is not None else torch.zeros(0) for t in results]


# ---- the model under training ------------------------------------------------------------
# What every phase needs of it: its tokenizer, its engine, its device; the warm start, the reference policy, the
# log-prob passes and checkpoints all go through it. `save` and `load_weights` are collective under ZeRO (every
# rank calls them; rank 0 writes).


@dataclass
class TrainedModel:
    """`model` is the engine's module (the one the optimiser updates); `is_main`: this process writes files."""

    model: torch.nn.Module
    tokenizer: Any
    engine: Any
    device: torch.device
    is_main: bool
    lora: bool
    temperature: float  # the rollout temperature: log-probs are those of the tempered sampling distribution
    micro_batch_tokens: int
    micro_batch_rows: int

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def encode(self, messages: list[ChatMessage]) -> list[int]:
        """Prompt ids exactly as generation renders them (chat template + generation prompt)."""
        from agentgym_opsd.models.hf_policy import chat_prompt_ids

        return chat_prompt_ids(self.tokenizer, messages)

    def logprobs(self, prompts: list[list[int]], responses: list[list[int]],
                 model: torch.nn.Module | None = None, *, shared_prefix: bool = False,
                 packed: bool = False, trunk_cache: TrunkCache | None = None) -> list[Tensor]:
        """Teacher-forced log-probs of each response token (no grad), by `model` (default: the trained one).
        `shared_prefix`: prompts that share a prefix (the teacher's c+ system message) encode it once.
        `packed`: in the update's packed layout (π_old: in bf16 it then rounds as the update's forward does);
        `trunk_cache` then keeps each row's frozen-trunk output for the update (`trainer/frozen_trunk.py`)."""
        model = model if model is not None else self.model
        if packed:
            return packed_batched_response_logprobs(model, prompts, responses, temperature=self.temperature,
                                                    max_tokens=self.micro_batch_tokens,
                                                    max_rows=self.micro_batch_rows, device=self.device,
                                                    trunk_cache=trunk_cache)
        settings: dict[str, Any] = {"pad_id": self.pad_id, "temperature": self.temperature,
                                    "max_tokens": self.micro_batch_tokens, "max_rows": self.micro_batch_rows,
                                    "device": self.device}
        # The teacher's rows stay left-padded after the repeated prefix cache: packed after the one-row cache they
        # ran no faster (docs/benchmarks.md), the per-row attention over the long c+ prefix costing more than the
        # little padding that length-bucketed micro-batches leave.
        score = prefix_shared_response_logprobs if shared_prefix else batched_response_logprobs
        return score(model, prompts, responses, **settings)

    def save(self, folder: Path) -> None:
        """save_pretrained of the full weights (the trained adapter only, with LoRA); collective."""
        state = self.engine.full_state_dict()
        if not self.is_main:
            return
        folder.parent.mkdir(parents=True, exist_ok=True)
        kwargs: dict[str, Any] = {"safe_serialization": True}
        if state is not None:
            kwargs["state_dict"] = state
        if hasattr(self.model, "peft_config"):  # never the frozen reference adapter
            self.model.save_pretrained(str(folder), selected_adapters=["default"], **kwargs)
        else:
            self.model.save_pretrained(str(folder), **kwargs)
        self.tokenizer.save_pretrained(str(folder))

    def load_weights(self, folder: Path) -> None:
        """Load saved weights (a full model or a LoRA adapter folder) into the live model, in place, so the
        engine's optimiser keeps its parameters."""
        from safetensors.torch import load_file

        state: dict[str, Tensor] = {}
        for f in sorted(folder.glob("*.safetensors")):
            state.update(load_file(str(f)))
        if not state:
            raise CheckpointError(f"{folder}: no safetensors weights to load")
        if self.lora:
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.model, state)
            unexpected = list(getattr(result, "unexpected_keys", []) or [])
            self.engine.refresh_masters()  # ZeRO / bf16 keep an fp32 master copy the next step would write back
        else:
            result = self.engine.load_full_state_dict(state)
            tied = {k for k in result.missing_keys if "lm_head" in k}
            missing = [k for k in result.missing_keys if k not in tied]
            if missing:
                raise CheckpointError(f"{folder}: weights missing for {missing[:5]}")
            unexpected = list(result.unexpected_keys)
        if unexpected:
            raise CheckpointError(f"{folder}: unexpected weights {unexpected[:5]}")
