"""The frozen trunk's output, kept from the π_old pass and reused by the update (and by the warm start's later
epochs): `TrunkCache`, `trunk_depth`, `capturing_trunk`.

With `model.trainable_layers` = n of L decoder blocks, the embeddings and the bottom L − n blocks are frozen, so
the hidden state leaving them depends on a row's tokens alone. The π_old pass computes it anyway; kept per row, it
lets the update run only the n trained blocks, forward and backward, with the numbers the full forward would give.
The warm start's SFT does the same: its first epoch keeps each row's trunk output, later epochs start from it.
Kept only where exact and affordable (`trunk_depth`): a frozen input embedding, no dropout in the trunk (the π_old
pass runs in eval mode, the update in train mode), not under ZeRO-3 (its hooks gather parameters in a traced
order), and up to `optim.trunk_cache_mb` (rows beyond it run the whole model). Outputs are kept in the layout the
pass and the update share: packed (a shared prompt prefix kept once) or left-padded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from agentgym_opsd.models.loading import decoder_layers

__all__ = ["TrunkCache", "capturing_trunk", "frozen_depth", "trunk_depth", "trunk_inputs"]

_DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop")


def frozen_depth(model: torch.nn.Module) -> int:
    """How many bottom decoder blocks, with the input embedding below them, hold no trainable weight (0 when
    the embedding trains, or every block does)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is None or any(p.requires_grad for p in embeddings.parameters()):
        return 0
    layers = decoder_layers(model)
    depth = 0
    for layer in layers:
        if any(p.requires_grad for p in layer.parameters()):
            break
        depth += 1
    return depth if depth < len(layers) else 0


def _trunk_has_dropout(model: torch.nn.Module, depth: int) -> bool:
    config = getattr(model, "config", None)
    if any(float(getattr(config, key, 0.0) or 0.0) > 0 for key in _DROPOUT_KEYS):
        return True
    trunk = list(decoder_layers(model))[:depth]
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for layer in trunk for m in layer.modules())


def trunk_depth(model: torch.nn.Module, *, zero_stage: int, budget_mb: int) -> int:
    """The frozen blocks whose output a later pass may reuse (0 = run the whole model every time)."""
    if zero_stage >= 3 or budget_mb <= 0:
        return 0
    depth = frozen_depth(model)
    return 0 if depth and _trunk_has_dropout(model, depth) else depth


@dataclass
class TrunkCache:
    """Per row, the trunk's output (tokens, hidden) of its prompt + response, up to `budget_bytes` in all. In the
    packed layout with a shared prompt prefix (`logprobs.pack`'s `prefix_len`), a row's output covers its tokens
    after the prefix, and the prefix's output is kept once: a frozen trunk gives the same prefix the same output
    in every micro-batch. One cache serves one prefix length (the rows of one step, or of one warm start)."""

    depth: int
    budget_bytes: int
    rows: dict[int, Tensor] = field(default_factory=dict)
    used_bytes: int = 0
    prefix: Tensor | None = None
    prefix_len: int | None = None  # fixed by the first row kept

    @classmethod
    def within(cls, depth: int, budget_mb: int) -> TrunkCache | None:
        """A cache of `budget_mb` MiB (`optim.trunk_cache_mb`) for a trunk `depth` blocks deep; None at depth 0,
        where there is nothing to keep (`trunk_depth`)."""
        return cls(depth, budget_mb << 20) if depth else None

    def add(self, row: int, hidden: Tensor) -> None:
        """Keep `row`'s output if the budget allows (a row kept already stays as it is)."""
        size = hidden.numel() * hidden.element_size()
        if row not in self.rows and self.used_bytes + size <= self.budget_bytes:
            self.rows[row] = hidden.detach().clone()  # a copy: a view would keep the whole micro-batch alive
            self.used_bytes += size

    def _layout(self, prefix_len: int) -> None:
        if self.prefix_len is None:
            self.prefix_len = prefix_len
        elif prefix_len != self.prefix_len:
            raise ValueError(f"this trunk cache keeps rows after a {self.prefix_len}-token shared prefix, not "
                             f"{prefix_len}")

    def add_packed(self, rows: Sequence[int], hidden: Tensor, cu_seq_lens: Tensor, *, prefix_len: int = 0) -> None:
        """Keep the rows' outputs from a packed pass's (1, T, hidden), row r at `cu_seq_lens[r]:[r + 1]`; after
        a shared prefix (`prefix_len`), that prefix's output at `[0]:[1]` once and row r at `[r + 1]:[r + 2]`."""
        self._layout(prefix_len)
        spans = cu_seq_lens.tolist()
        if prefix_len:
            if self.prefix is None:
                self.prefix = hidden[0, :prefix_len].detach().clone()
                self.used_bytes += self.prefix.numel() * self.prefix.element_size()
            spans = spans[1:]
        for r, row in enumerate(rows):
            self.add(row, hidden[0, spans[r]:spans[r + 1]])

    def add_left_padded(self, rows: Sequence[int], hidden: Tensor, attention_mask: Tensor) -> None:
        """Keep the rows' outputs from a left-padded pass's (rows, width, hidden): each row's last tokens."""
        self._layout(0)
        width = hidden.shape[1]
        for r, (row, length) in enumerate(zip(rows, attention_mask.sum(-1).tolist(), strict=True)):
            self.add(row, hidden[r, width - length:])

    def covers(self, rows: Sequence[int], *, prefix_len: int = 0) -> bool:
        """Whether every row's output is kept, in the layout of a `prefix_len`-token shared prefix."""
        if (self.prefix_len or 0) != prefix_len or (prefix_len and self.prefix is None):
            return False
        return all(r in self.rows for r in rows)

    def release(self) -> None:
        """Free the kept outputs (the update is done with them)."""
        self.rows.clear()
        self.prefix, self.prefix_len = None, None
        self.used_bytes = 0

    def packed(self, rows: Sequence[int], *, prefix_len: int = 0) -> Tensor:
        """(1, tokens, hidden): the rows' outputs end to end, as `logprobs.pack` lays out their tokens (after the
        shared prefix's, with `prefix_len`)."""
        if not self.covers(rows, prefix_len=prefix_len):
            raise KeyError(f"the trunk cache does not hold rows {list(rows)} after a {prefix_len}-token prefix")
        head = [self.prefix] if prefix_len and self.prefix is not None else []
        return torch.cat([*head, *(self.rows[r] for r in rows)]).unsqueeze(0)

    def left_padded(self, rows: Sequence[int], width: int) -> Tensor:
        """(rows, width, hidden): each row's output right-aligned, as `logprobs.collate` lays out its tokens (zeros
        where it pads: masked keys, and queries whose outputs nothing reads)."""
        first = self.rows[rows[0]]
        out = first.new_zeros(len(rows), width, first.shape[-1])
        for r, row in enumerate(rows):
            hidden = self.rows[row]
            out[r, width - hidden.shape[0]:] = hidden
        return out


@contextlib.contextmanager
def capturing_trunk(model: torch.nn.Module, cache: TrunkCache | None) -> Iterator[list[Tensor]]:
    """A list that receives the hidden state leaving the trunk (block `cache.depth - 1`) at every forward call
    inside the block; it stays empty without a cache."""
    captured: list[Tensor] = []
    if cache is None:
        yield captured
        return

    def hook(_module: torch.nn.Module, _args: tuple, output: Tensor | tuple) -> None:
        captured.append(output[0] if isinstance(output, tuple) else output)

    handle = decoder_layers(model)[cache.depth - 1].register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()


@contextlib.contextmanager
def trunk_inputs(model: torch.nn.Module, input_ids: Tensor,
                 trunk: tuple[int, Tensor] | None) -> Iterator[dict[str, Tensor]]:
    """The model's inputs for one forward call inside the block: the token ids, or with a kept trunk
    (depth, hidden) its output as `inputs_embeds` while the decoder stack starts at block `depth`, so the call
    runs the blocks above it, the final norm and the LM head."""
    if trunk is None:
        yield {"input_ids": input_ids}
        return
    depth, hidden = trunk
    layers = decoder_layers(model)
    owner, name = next((module, child) for module in model.modules()
                       for child, sub in module.named_children() if sub is layers)
    setattr(owner, name, layers[depth:])
    try:
        yield {"inputs_embeds": hidden}
    finally:
        setattr(owner, name, layers)
