"""Batched generation with an HF causal LM: the default rollout backend (CPU or one GPU).

`HFPolicy` implements `agentgym_opsd.policies.Policy`. One `act` call renders the prompts with the chat template,
sorts them by length into chunks of `batch_size`, prefills each chunk once and decodes token by token on a KV cache
with room reserved for the reply. Identical prompts are prefilled once, a common prefix of at least
`MIN_SHARED_PREFIX` tokens once per chunk, and the suffixes packed without padding where the model family allows
(`packed_attention`). A row stops at a closing tag, an end-of-sequence token or `max_new_tokens`, and then leaves
the batch and the cache. Each `PolicyOutput` holds exactly the sampled tokens (an end-of-sequence token included,
never in the text) and their log-probs under `log_softmax(logits / temperature)` (greedy: `log_softmax(logits)`),
so the trainer rebuilds the prompt with `prompt_ids(messages)` and teacher-forces the same tokens. Sampling draws
from a private seeded `torch.Generator` (reproducible, global RNG untouched) that checkpoints carry.
"""

from __future__ import annotations

import copy
import functools
import itertools
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from agentgym_opsd.policies import Policy, PolicyOutput, PolicyRequest
from agentgym_opsd.records import ChatMessage

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DEFAULT_STOP_STRINGS",
    "MIN_SHARED_PREFIX",
    "PACKED_PREFILL_MIN_PADDING",
    "HFPolicy",
    "cache_kwarg",
    "chat_prompt_ids",
    "common_prefix_length",
    "text_ids",
]

DEFAULT_STOP_STRINGS: tuple[str, ...] = ("</action>", "</search>", "</answer>")

MIN_SHARED_PREFIX = 16
"""A chunk's common prompt prefix is prefilled once (batch 1) when it is at least this many tokens; a shorter one
saves less than the extra forward call costs."""

PACKED_PREFILL_MIN_PADDING = 0.10
"""A chunk's suffixes are prefilled packed when left-padding them would compute at least this share of padding. Packed,
each row's attention runs on its own (one SDPA call per row and layer), which costs about what a tenth of padding
does (the measurements are in docs/benchmarks.md)."""


CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[ChatMessage]) -> list[int]:
    """The prompt token ids for chat `messages`, ending with the assistant header (generation prompt).

    Special tokens come only from the chat template, never from message content: an observation (a web page,
    a retrieved passage) or an API message holding `<|im_end|>\n<|im_start|>system ...` stays plain text
    instead of opening a real system turn. The template is rendered once with a placeholder per message;
    the template's own text is tokenised with its special tokens, each content with
    `split_special_tokens=True`. For content without special-token strings the ids equal tokenising the
    rendered chat in one piece (tested), so nothing trained before this change shifts.
    """
    if not messages:
        raise ValueError("a prompt needs at least one chat message")
    for i, m in enumerate(messages):
        if m["role"] not in CHAT_ROLES:  # the role is rendered as template text, so it must be a known word
            raise ValueError(f"messages[{i}]: role must be one of {sorted(CHAT_ROLES)}, got {m['role'][:40]!r}")
    marks = [f"\x00{secrets.token_hex(8)}:{i}\x00" for i in range(len(messages))]
    scaffold = tokenizer.apply_chat_template([{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)],
                                             add_generation_prompt=True, tokenize=False)
    ids: list[int] = []
    rest = scaffold
    for m, mark in zip(messages, marks, strict=True):
        before, found, rest = rest.partition(mark)
        if not found:  # a template that rewrites content (rare); refuse rather than let content through raw
            raise ValueError("the chat template does not render message content verbatim; cannot keep content "
                             "special tokens as text")
        ids += _ids(tokenizer, before, split_special=False) + _ids(tokenizer, m["content"], split_special=True)
    return ids + _ids(tokenizer, rest, split_special=False)


def _ids(tokenizer: PreTrainedTokenizerBase, text: str, *, split_special: bool) -> list[int]:
    if not text:
        return []
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=split_special)["input_ids"])


def text_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of plain text (a response, a demonstration) with special-token strings kept as text."""
    return _ids(tokenizer, text, split_special=True)


def _eos_ids(model: Any, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def cache_kwarg(model: Any) -> str:
    """The forward argument that takes the KV cache: `cache` in recent transformers, `past_key_values`
    before (recent versions still accept the old name, with a deprecation warning per call; 5.40 removes
    it). Generation and the trainer's log-prob passes both pass their cache through this name."""
    base = model
    if isinstance(getattr(base, "module", None), torch.nn.Module):  # DeepSpeed engine / DDP wrapper
        base = base.module
    if callable(getattr(base, "get_base_model", None)):  # PEFT wrapper (forwards **kwargs)
        base = base.get_base_model()
    return _cache_kwarg_of(type(base))


@functools.cache
def _cache_kwarg_of(model_type: type) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model_type.forward).parameters else "past_key_values"


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all `prompts` share, at most one fewer than the shortest has (every prompt keeps
    a last token of its own to prefill: its logits give the first sampled token)."""
    first = prompts[0]
    n = min(len(p) for p in prompts) - 1
    for other in prompts[1:]:
        k = 0
        while k < n and other[k] == first[k]:
            k += 1
        n = k
    return max(n, 0)


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from (rows, vocab) probabilities (not necessarily normalised), by inverse CDF: a
    uniform draw located in the row's cumulative sum. The same distribution as `torch.multinomial`, ~10x
    faster on a CPU for a 49k vocabulary (multinomial was two thirds of a batched sampling step); a token of
    probability 0 owns an empty interval and is never drawn (`right=True`)."""
    cdf = probs.cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, dtype=cdf.dtype, device=cdf.device)
    tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    return tokens.clamp_(max=probs.shape[-1] - 1)


class HFPolicy(Policy):
    """Samples answers from an HF causal LM (plain, PEFT-wrapped, or the module inside a DeepSpeed engine).

    `max_new_tokens`: answer length limit. `temperature`: sampling temperature (0 = greedy). `top_p`:
    nucleus sampling mass (1.0 = off; reported log-probs stay those of the full tempered distribution).
    `stop_strings`: a row stops once its text contains one of them. `batch_size`: rows generated together
    (requests beyond it are processed in successive chunks of similar prompt length). `seed`: seeds the
    private sampling RNG. `packed_prefill`: a chunk's prompts are prefilled end to end without padding where the
    model family allows it (`packed_attention.supports_packing`); False prefills them left-padded.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_strings: Sequence[str] = DEFAULT_STOP_STRINGS,
        batch_size: int = 16,
        seed: int = 0,
        packed_prefill: bool = True,
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if isinstance(stop_strings, str) or any(not s for s in stop_strings):
            raise ValueError(f"stop_strings must be a list of non-empty strings, got {stop_strings!r}")
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; load it with agentgym_opsd.models.loading.load_policy_model")
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.top_p = top_p
        self.stop_strings = tuple(stop_strings)
        self.batch_size = batch_size
        # prompts prefilled end to end without padding where the model family allows (`_packs`); False: left-padded
        self.packed_prefill = packed_prefill
        self.temperature = 1.0
        self.set_temperature(temperature)
        self.eos_ids = _eos_ids(model, tokenizer)
        # Tokens are at least one character (or a byte fragment), so the last few tokens always cover a
        # stop string that the newest token completed: decoding only that tail keeps the check O(1) per step.
        self._tail_tokens = max(len(s) for s in self.stop_strings) + 2 if self.stop_strings else 0
        self.device = next(model.parameters()).device
        self._cache_kwarg = cache_kwarg(model)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    # -- configuration ------------------------------------------------------------------------------------

    def set_temperature(self, temperature: float) -> None:
        """Set the sampling temperature (0 = greedy), e.g. 1.0 for training rollouts, 0.4 for validation."""
        if not temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.temperature = float(temperature)

    def get_rng_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

    # -- rollout backend (`agentgym_opsd.models.backends.RolloutBackend`) ---------------------------------

    def with_sampling(self, *, temperature: float, seed: int, batch_size: int | None = None) -> HFPolicy:
        """A sampler over the same model (no copy of the weights) at `temperature` with its own seeded stream
        and, given `batch_size`, its own chunk size (validation generates its turns in one batch); this policy's
        settings and stream are untouched."""
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        view = copy.copy(self)
        view.generator = torch.Generator(device=self.device)
        view.generator.manual_seed(seed)
        view.set_temperature(temperature)
        view.batch_size = batch_size or self.batch_size
        return view

    def wake_up(self) -> None:
        """Nothing to wake: generation runs on the trainer's own module."""

    def sleep(self) -> None:
        """Nothing to free: the weights are the trainer's."""

    def sync_weights(self, model: torch.nn.Module) -> int:
        """Nothing to push (the policy samples from the module the trainer updates): 0 tensors."""
        return 0

    def prompt_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The exact prompt token ids generation uses for `messages` (chat template + generation prompt)."""
        return chat_prompt_ids(self.tokenizer, messages)

    # -- Policy protocol ----------------------------------------------------------------------------------

    def act(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        prompts = [self.prompt_ids(r.messages) for r in requests]
        return self.generate_ids(prompts)

    def generate_ids(self, prompts: Sequence[Sequence[int]]) -> list[PolicyOutput]:
        """Generate for already tokenised prompts; outputs come back in the order of `prompts`."""
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        # Length-sorted chunks waste little compute on padding; identical prompts (the G copies of a task
        # at their first turn) sort next to each other, so a chunk can prefill them once.
        keys = [(len(p), tuple(p)) for p in prompts]
        order = sorted(range(len(prompts)), key=keys.__getitem__)
        outputs: list[PolicyOutput | None] = [None] * len(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(order), self.batch_size):
                    chunk = order[start : start + self.batch_size]
                    for i, out in zip(chunk, self._generate_chunk([prompts[i] for i in chunk]), strict=True):
                        outputs[i] = out
        finally:
            self.model.train(was_training)
        return [o for o in outputs if o is not None]

    # -- internals ----------------------------------------------------------------------------------------

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Next tokens and their log-probs for logits of shape (rows, vocab)."""
        logits = logits.float()
        if self.temperature == 0.0:
            tokens = logits.argmax(dim=-1)
            logprobs = torch.log_softmax(logits, dim=-1)
        else:
            logprobs = torch.log_softmax(logits / self.temperature, dim=-1)
            probs = logprobs.exp()
            if self.top_p < 1.0:
                sorted_p, sorted_i = probs.sort(dim=-1, descending=True)
                # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
                drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= self.top_p
                sorted_p = sorted_p.masked_fill(drop, 0.0)
                probs = torch.zeros_like(probs).scatter_(-1, sorted_i, sorted_p)
            tokens = _draw(probs, self.generator)
        return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)

    def _hit_stop(self, ids: list[int]) -> bool:
        if not self.stop_strings:
            return False
        tail = self.tokenizer.decode(ids[-self._tail_tokens :], skip_special_tokens=False)
        return any(s in tail for s in self.stop_strings)

    def _generate_chunk(self, prompts: list[Sequence[int]]) -> list[PolicyOutput]:
        from agentgym_opsd.models.kv_cache import reserve, reserved_cache

        rows = len(prompts)
        # Prefill each distinct prompt once, then copy its cache row to every request that shares it.
        distinct: dict[tuple[int, ...], int] = {}
        row_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        unique = list(distinct)
        cache = reserved_cache(self.model)
        # The prefix every distinct prompt starts with runs once, its cache rows copied to every prompt; the
        # rows then prefill only their suffixes: [prefix][left padding][suffix], the mask spanning all of it
        # and positions continuing after the prefix, so each row sees exactly the sequence it would see alone.
        shared = common_prefix_length(unique) if len(unique) > 1 else 0
        if shared >= MIN_SHARED_PREFIX:
            prefix = torch.as_tensor([unique[0][:shared]], dtype=torch.long, device=self.device)
            self._forward(prefix, torch.ones_like(prefix), torch.arange(shared, device=self.device)[None], cache)
        else:
            shared = 0
        suffixes = [p[shared:] for p in unique]
        lengths = [len(s) for s in suffixes]
        width = max(lengths)
        # The rows' left-padded layout, which decoding extends (every row's last prompt token at column width-1),
        # whichever way the suffixes are prefilled.
        mask = torch.zeros((len(unique), width), dtype=torch.long)
        for r, n in enumerate(lengths):
            mask[r, width - n :] = 1
        mask = mask.to(self.device)
        # Positions count real tokens only, so a padded row sees the same positions as it would alone.
        positions = (mask.cumsum(-1) - 1).clamp(min=0) + shared
        mask = torch.cat([mask.new_ones((len(unique), shared)), mask], dim=1)
        if self._packs(cache, lengths, width):
            logits = self._prefill_packed(suffixes, lengths, shared, width, cache)  # (distinct prompts, vocab)
        else:
            if shared:
                cache.batch_repeat_interleave(len(unique))
            input_ids = torch.full((len(unique), width), int(self.tokenizer.pad_token_id), dtype=torch.long)
            for r, s in enumerate(suffixes):
                input_ids[r, width - len(s) :] = torch.as_tensor(s, dtype=torch.long)
            logits = self._forward(input_ids.to(self.device), mask, positions, cache)
        if len(unique) < rows:
            expand = torch.as_tensor(row_of, device=self.device)
            cache.batch_select_indices(expand)
            logits, mask, positions = logits[expand], mask[expand], positions[expand]
        # Decoding writes each new token's keys and values in place instead of concatenating the cache again.
        reserve(cache, cache.get_seq_length() + self.max_new_tokens)

        token_ids: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        finish = ["length"] * rows  # rows still alive when the budget runs out were cut off
        alive = list(range(rows))  # original row of each row still in the batch tensors
        for step in range(self.max_new_tokens):
            tokens, token_lps = self._sample(logits)
            keep: list[int] = []
            for j, (tok, lp) in enumerate(zip(tokens.tolist(), token_lps.tolist(), strict=True)):
                r = alive[j]
                # The end-of-sequence token is kept as a sampled token (its log-prob is trained like any
                # other: an empty reply is a row the gradient can push down), but never part of the text.
                token_ids[r].append(tok)
                logprobs[r].append(lp)
                if tok in self.eos_ids:
                    finish[r] = "eos"
                elif self._hit_stop(token_ids[r]):
                    finish[r] = "stop"
                else:
                    keep.append(j)
            if not keep or step == self.max_new_tokens - 1:
                break
            if len(keep) < len(alive):
                index = torch.as_tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, positions, tokens = mask[index], positions[index], tokens[index]
                alive = [alive[j] for j in keep]
            mask = torch.cat([mask, mask.new_ones((len(alive), 1))], dim=1)
            positions = positions[:, -1:] + 1
            logits = self._forward(tokens[:, None], mask, positions, cache)

        return [
            PolicyOutput(self.tokenizer.decode(ids[:-1] if why == "eos" else ids, skip_special_tokens=False), ids,
                         lps, finish_reason=why)
            for ids, lps, why in zip(token_ids, logprobs, finish, strict=True)
        ]

    def _packs(self, cache: Any, lengths: Sequence[int], width: int) -> bool:
        """Whether this chunk's suffixes of `lengths` are prefilled packed rather than left-padded to `width`: a
        model family whose attention takes row spans, a cache whose every layer can be unpacked into rows afterwards
        (`ReservedLayer`), and padding worth saving (`PACKED_PREFILL_MIN_PADDING`)."""
        from agentgym_opsd.models.kv_cache import ReservedLayer
        from agentgym_opsd.models.packed_attention import supports_packing

        padding = 1.0 - sum(lengths) / (len(lengths) * width)
        return (self.packed_prefill and padding >= PACKED_PREFILL_MIN_PADDING and supports_packing(self.model)
                and bool(cache.layers) and all(isinstance(layer, ReservedLayer) for layer in cache.layers))

    def _prefill_packed(self, suffixes: list[Sequence[int]], lengths: Sequence[int], shared: int, width: int,
                        cache: Any) -> torch.Tensor:
        """Prefill the distinct prompts' suffixes (of `lengths`) laid end to end after the `shared` prefix already
        in `cache` (one row), each attending to the prefix and to itself (`packed_attention`), so no FLOP goes to
        padding; then lay the cache out as the rows' left-padded batch with room for the replies. Returns the
        logits of every suffix's last position, (rows, vocab): the padded prefill's numbers to float rounding."""
        from agentgym_opsd.models.kv_cache import unpack_rows
        from agentgym_opsd.models.packed_attention import packed_attention

        ids = torch.as_tensor([[t for s in suffixes for t in s]], dtype=torch.long, device=self.device)
        positions = torch.cat([torch.arange(shared, shared + n) for n in lengths])[None].to(self.device)
        bounds = torch.as_tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=self.device)
        with packed_attention(self.model):
            out = self.model(input_ids=ids, position_ids=positions, use_cache=True, **{self._cache_kwarg: cache},
                             cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, logits_to_keep=(bounds[1:] - 1).long())
        unpack_rows(cache, prefix=shared, lengths=lengths, width=width, room=self.max_new_tokens)
        return out.logits[0]

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """Logits of the last position, shape (rows, vocab); extends `cache` with the new tokens."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_kwarg: cache},
            logits_to_keep=1,  # only the last position is needed: skips a (rows, tokens, vocab) tensor
        )
        return out.logits[:, -1, :]
