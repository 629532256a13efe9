"""Roofline of one RL step: how close each phase comes to what this machine's cores can do.

    python benchmarks/bench_roofline.py --threads 1                  # cpu-learn, SmolLM2-135M, one RL step
    python benchmarks/bench_roofline.py --threads 1 rollout.tasks_per_step=1   # key=value overrides (~5 min)
    python benchmarks/bench_roofline.py --quick                      # tiny random model, 1 thread: a smoke check

1. The machine, measured before and after the phases (the better of the two is the limit): peak fp32 matmul
   FLOP/s at `--threads` torch threads (best of 3 square `torch.mm` of each size 512, 1024, 1536, 2048; the
   peak is the best size, since a product that spills the caches can run well below the cores' rate; the
   best n >= 1024 is kept as `peak_large_flops_per_s`) and memory bandwidth (best of a few copies of a 256 MB
   tensor, beyond the last-level cache: bytes read + bytes written per second).
2. One RL step of a real `Trainer` on the preset (plain torch engine, temporary output folder; the preset's
   cached warm start is loaded when there is one, else the base weights: timings do not depend on them):
   `Trainer.collect` (one round of B tasks x G rollouts, no dynamic-sampling re-rounds), then
   `Trainer.step_on` on those trajectories (score, old / reference log-probs, teacher pass, credit, update);
   then one warm-start SFT step (`trainer.warm_start.sft_step` on `warm_start.batch_rows` oracle turn rows).
   Nothing is re-implemented: a forward pre-hook and hook on the policy model (and on the frozen reference
   copy when KL is on) record every forward call (its phase, input shape, attention mask, KV-cache length,
   `logits_to_keep`, whether gradients are on, wall and CPU time), and the trainer's phase methods
   (`old_logprobs`, `reference.logprobs`, `teacher_logprobs`, `update`), the engine's `backward` / `step` and
   `HFPolicy._sample` are wrapped with timers. Rollout forward calls are split by the KV cache they start
   from: an empty cache is a prefill, a filled one a decode step; their seconds are those of the forward
   calls themselves. The rest of the rollout is two rows of its own: sampling from the logits, and the rest
   (environments, prompt rendering, tokenising, stop-string checks).

FLOP convention (model FLOPs in fp32: what the algorithm needs, not what the hardware executes):

- Tokens are the real tokens a forward call feeds the model (attention mask 1 in its new positions);
  padding is not counted (its share is the "pad" column), nor is recomputation. Prefix-cached teacher
  passes count the shared prefix once, as they compute it, and so do the packed passes that lay the system
  message once (the update) or prefill the rows after it in the KV cache (the sampler).
- Forward, per real token: 2 x the linear weights of all L decoder layers (q, k, v, o, gate, up, down);
  attention 4 x L x (heads x head_dim) x context (QK^T and AV; context = the real tokens the position
  attends to, itself and the KV cache included); the LM head 2 x hidden x vocab, only on the positions
  whose logits are computed (`logits_to_keep`; real tokens among them). Embedding lookups, norms, RoPE,
  softmax and activation functions are not counted.
- Backward (a forward call with gradients on; the trainer calls backward once on each): 2 x the forward
  terms of every trainable decoder layer (activation and weight gradients), 1 x the LM-head term for the
  activation gradient, + 1 x more when the LM-head weight itself trains (tied to the frozen embeddings in
  `cpu-learn`: it does not), 0 for the frozen layers below the lowest trainable one (autograd stops there).
- Bytes (the memory side): every forward call reads all weights once (the LM head, tied or not, counts;
  the embedding gather does not) and K and V of every real cached or new token of each row once; an AdamW
  step reads param, grad, m, v and writes param, m, v: 28 bytes per trainable fp32 parameter.
- Limit of a phase = the sum over its forward calls of max(FLOPs / peak, bytes / bandwidth), + AdamW bytes
  / bandwidth: the fastest this machine could run it. "% of limit" = limit / measured seconds, "lost s" =
  measured - limit; for prefill and decode "% of BW bound" = (bytes / bandwidth) / measured seconds.
- The machine may be shared: "CPU busy" is the process's CPU seconds / (wall seconds x threads) in the
  phase, and "% of limit per CPU s" = limit / (CPU seconds / threads), the efficiency while it ran.

Writes OUT.json and OUT.png (`--out`; default `benchmarks/results/roofline`, `--quick`:
`runs/roofline-quick/roofline`); the JSON keeps the load average before and after, both machine
measurements and every phase's counts.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from harness import make_trainer  # benchmarks/ is on sys.path when a script runs from it
from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).parent / "results"
QUICK_OVERRIDES = ("model.name_or_path=tiny-random", "rollout.tasks_per_step=1", "rollout.group_size=2",
                   "rollout.max_new_tokens=6", "warm_start.batch_rows=4",
                   "model.trainable_layers=1")
ADAMW_BYTES_PER_PARAM = 28  # read param, grad, m, v; write param, m, v (fp32)


# ---- the analytic FLOP and byte counts ----------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs of a Llama-architecture config."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = True

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(hidden=int(config.hidden_size), layers=int(config.num_hidden_layers), heads=heads,
                   kv_heads=int(getattr(config, "num_key_value_heads", None) or heads), head_dim=int(head_dim),
                   intermediate=int(config.intermediate_size), vocab=int(config.vocab_size),
                   tied=bool(getattr(config, "tie_word_embeddings", True)))

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def linear_params_per_layer(self) -> int:
        """q, k, v, o projections and the gated MLP (gate, up, down) of one decoder layer."""
        d = self.hidden
        return d * self.q_dim + 2 * d * self.kv_dim + self.q_dim * d + 3 * d * self.intermediate

    @property
    def num_params(self) -> int:
        """All parameters (two RMSNorms per layer and a final one; the LM head once when tied)."""
        d = self.hidden
        head = 0 if self.tied else self.vocab * d
        return self.layers * (self.linear_params_per_layer + 2 * d) + d + self.vocab * d + head

    def weight_bytes(self, dtype_bytes: int = 4) -> int:
        """Weights one forward pass reads: all but the embedding matrix (gathered row by row), unless it is also
        the LM head (tied)."""
        d = self.hidden
        return dtype_bytes * (self.layers * (self.linear_params_per_layer + 2 * d) + d + self.vocab * d)

    def kv_bytes(self, kv_tokens: int, dtype_bytes: int = 4) -> int:
        """K and V of `kv_tokens` (row, position) entries in every layer, read once."""
        return dtype_bytes * 2 * self.layers * self.kv_dim * kv_tokens


def layer_flops(shape: ModelShape, tokens: int, attn_pairs: int) -> int:
    """Forward FLOPs of ONE decoder layer: linear layers on `tokens`, attention over `attn_pairs`
    (query, key) pairs (QK^T and AV, 2 FLOPs per multiply-add each)."""
    return 2 * shape.linear_params_per_layer * tokens + 4 * shape.q_dim * attn_pairs


def head_flops(shape: ModelShape, head_positions: int) -> int:
    return 2 * shape.hidden * shape.vocab * head_positions


def forward_flops(shape: ModelShape, tokens: int, attn_pairs: int, head_positions: int) -> int:
    """Model FLOPs of one forward pass (see the module docstring for what is counted)."""
    return shape.layers * layer_flops(shape, tokens, attn_pairs) + head_flops(shape, head_positions)


def backward_flops(shape: ModelShape, tokens: int, attn_pairs: int, head_positions: int, *,
                   trainable_layers: int, head_trainable: bool) -> int:
    """2x the forward of the trainable (top) layers, 1x the LM head for the activation gradient (2x when its
    weight trains), nothing for the frozen layers below."""
    return (2 * trainable_layers * layer_flops(shape, tokens, attn_pairs)
            + (2 if head_trainable else 1) * head_flops(shape, head_positions))


@dataclass
class CallCounts:
    """What one forward call computes: real new tokens, (query, key) pairs, LM-head positions, K/V entries
    it reads, and the padded size of its input."""

    tokens: int
    attn_pairs: int
    head_positions: int
    kv_tokens: int
    padded_tokens: int


def call_counts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, past: int,
                logits_to_keep: int = 0) -> CallCounts:
    """Counts of a forward call with `input_ids` (rows, new), a mask over (rows, past + new) (None: all real)
    and a KV cache of `past` positions; `logits_to_keep` 0 means every position."""
    rows, new = input_ids.shape
    mask = (torch.ones(rows, past + new, dtype=torch.bool) if attention_mask is None
            else attention_mask.detach().to("cpu").bool())
    fresh = mask[:, -new:]
    context = mask.long().cumsum(-1)[:, -new:]  # real keys visible to each new position (causal)
    keep = new if not logits_to_keep else min(int(logits_to_keep), new)
    return CallCounts(tokens=int(fresh.sum()), attn_pairs=int((context * fresh).sum()),
                      head_positions=int(fresh[:, new - keep:].sum()), kv_tokens=int(mask.sum()),
                      padded_tokens=rows * new)


def packed_call_counts(input_ids: torch.Tensor, cu_seq_lens: torch.Tensor, logit_positions: torch.Tensor, *,
                       past: int = 0, shared_prefix_len: int = 0) -> CallCounts:
    """Counts of a packed forward call (`models/packed_attention.py`): rows laid end to end in `input_ids` (1, T),
    row r spanning `cu_seq_lens[r]:cu_seq_lens[r + 1]`, each attending causally to its own span and to the prefix
    every span sees: `past` tokens in a KV cache (the sampler's prefill), and with `shared_prefix_len` the first span
    (the trainer's shared system message); the LM head on `logit_positions` only. No padding."""
    lengths = (cu_seq_lens[1:] - cu_seq_lens[:-1]).tolist()
    tokens = int(input_ids.numel())
    seen = [past] + [past + shared_prefix_len] * (len(lengths) - 1)
    return CallCounts(tokens=tokens, attn_pairs=sum(n * (n + 1) // 2 + n * p for n, p in zip(lengths, seen, strict=True)),
                      head_positions=int(logit_positions.numel()), kv_tokens=tokens + past, padded_tokens=tokens)


# ---- the machine ----------------------------------------------------------------------------------------------
def measure_peak_flops(sizes: Sequence[int], repeats: int, dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """Best `torch.mm` FLOP/s per size (2 n^3 FLOPs) in `dtype` at the current torch thread count."""
    out = {}
    gen = torch.Generator().manual_seed(0)
    for n in sizes:
        a, b = torch.randn(n, n, generator=gen).to(dtype), torch.randn(n, n, generator=gen).to(dtype)
        c = torch.empty(n, n, dtype=dtype)
        torch.mm(a, b, out=c)  # warm-up
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            best = min(best, time.perf_counter() - t0)
        out[str(n)] = 2 * n**3 / best
    return out


def measure_bandwidth(megabytes: int, repeats: int) -> float:
    """Best bytes/s of `dst.copy_(src)` on a `megabytes` fp32 tensor (read + written bytes)."""
    src = torch.ones(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best


def measure_machine(quick: bool) -> dict[str, Any]:
    sizes, repeats, mb = ((256, 512), 2, 32) if quick else ((512, 1024, 1536, 2048), 3, 256)
    flops = measure_peak_flops(sizes, repeats)
    bf16 = measure_peak_flops(sizes, repeats, torch.bfloat16)
    large = [v for n, v in flops.items() if int(n) >= 1024]
    # The limit is the faster format's: on the development machine (avx512_bf16, no AMX) that is float32
    return {"matmul_flops_per_s": flops, "bf16_matmul_flops_per_s": bf16,
            "peak_dtype": "bfloat16" if max(bf16.values()) > max(flops.values()) else "float32",
            "peak_flops_per_s": max(flops.values()),
            "peak_bf16_flops_per_s": max(bf16.values()),
            "peak_large_flops_per_s": max(large) if large else None,
            "bandwidth_bytes_per_s": measure_bandwidth(mb, repeats + 2), "copy_megabytes": mb}


# ---- recording the trainer's forward calls --------------------------------------------------------------------
def clock() -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process: all its threads)."""
    return time.perf_counter(), time.process_time()


def minus(total: tuple[float, float], *parts: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU) of `total` less `parts`."""
    return total[0] - sum(p[0] for p in parts), total[1] - sum(p[1] for p in parts)


@dataclass
class Call:
    phase: str
    counts: CallCounts
    grad: bool
    seconds: float = 0.0
    cpu_seconds: float = 0.0


@dataclass
class PhaseTotals:
    """Sums over a phase's forward calls (FLOPs, bytes, limit) and its measured seconds."""

    name: str
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    calls: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    flops: float = 0.0
    bytes: float = 0.0
    limit_seconds: float = 0.0
    bandwidth_seconds: float = 0.0
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)


class ForwardMeter:
    """Forward (pre-)hooks on the models: every call's counts under the current phase label."""

    def __init__(self, shape: ModelShape, *, trainable_layers: int, head_trainable: bool, dtype_bytes: int) -> None:
        self.shape, self.trainable_layers, self.head_trainable = shape, trainable_layers, head_trainable
        self.dtype_bytes = dtype_bytes
        self.calls: list[Call] = []
        self.label = "untracked"
        self._started: list[tuple[float, float]] = []
        self._handles: list[Any] = []

    def attach(self, model: torch.nn.Module) -> None:
        self._handles += [model.register_forward_pre_hook(self._before, with_kwargs=True),
                          model.register_forward_hook(self._after, with_kwargs=True)]

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    @contextlib.contextmanager
    def phase(self, label: str) -> Iterator[None]:
        before, self.label = self.label, label
        try:
            yield
        finally:
            self.label = before

    def _before(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:  # hidden states fed in (the update over the frozen trunk's kept outputs): their (rows, tokens)
            ids = kwargs["inputs_embeds"][..., 0]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = int(cache.get_seq_length()) if cache is not None else 0
        keep = kwargs.get("logits_to_keep")
        if kwargs.get("cu_seq_lens_q") is not None:  # the packed layout: rows end to end, head on positions
            counts = packed_call_counts(ids, kwargs["cu_seq_lens_q"], keep, past=past,
                                        shared_prefix_len=int(kwargs.get("shared_prefix_len", 0)))
        else:
            counts = call_counts(ids, kwargs.get("attention_mask"), past, int(keep or 0))
        label = self.label
        if label == "rollout":  # a decode step feeds one token per row; a prefill may follow a cached prefix
            label = "prefill" if past == 0 or ids.shape[1] > 1 else "decode"
        self.calls.append(Call(label, counts, torch.is_grad_enabled()))
        self._started.append(clock())

    def _after(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        (wall, cpu), (wall0, cpu0) = clock(), self._started.pop()
        self.calls[-1].seconds, self.calls[-1].cpu_seconds = wall - wall0, cpu - cpu0

    def flops(self, call: Call) -> tuple[int, int]:
        c, s = call.counts, self.shape
        fwd = forward_flops(s, c.tokens, c.attn_pairs, c.head_positions)
        bwd = backward_flops(s, c.tokens, c.attn_pairs, c.head_positions, trainable_layers=self.trainable_layers,
                             head_trainable=self.head_trainable) if call.grad else 0
        return fwd, bwd

    def totals(self, phase: str, times: tuple[float, float], peak: float, bandwidth: float) -> PhaseTotals:
        t = PhaseTotals(phase, seconds=times[0], cpu_seconds=times[1])
        for call in (c for c in self.calls if c.phase == phase):
            fwd, bwd = self.flops(call)
            nbytes = self.shape.weight_bytes(self.dtype_bytes) + self.shape.kv_bytes(call.counts.kv_tokens,
                                                                                      self.dtype_bytes)
            t.calls += 1
            t.tokens += call.counts.tokens
            t.padded_tokens += call.counts.padded_tokens
            t.flops += fwd + bwd
            t.bytes += nbytes
            t.bandwidth_seconds += nbytes / bandwidth
            t.limit_seconds += max((fwd + bwd) / peak, nbytes / bandwidth)
        return t

    def forward_times(self, phase: str) -> tuple[float, float]:
        """(wall, CPU) seconds of the phase's forward calls."""
        calls = [c for c in self.calls if c.phase == phase]
        return sum(c.seconds for c in calls), sum(c.cpu_seconds for c in calls)


class Timers:
    """(wall, CPU) seconds per label, summed over calls of wrapped functions."""

    def __init__(self) -> None:
        self.times: dict[str, tuple[float, float]] = {}
        self.count: dict[str, int] = {}

    def wrap(self, obj: Any, name: str, label: str, meter: ForwardMeter | None = None) -> None:
        """Replace `obj.name` by a timed version (an instance attribute; the class is untouched)."""
        original: Callable[..., Any] = getattr(obj, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            wall0, cpu0 = clock()
            try:
                with meter.phase(label) if meter is not None else contextlib.nullcontext():
                    return original(*args, **kwargs)
            finally:
                wall, cpu = clock()
                before = self.times.get(label, (0.0, 0.0))
                self.times[label] = (before[0] + wall - wall0, before[1] + cpu - cpu0)
                self.count[label] = self.count.get(label, 0) + 1

        setattr(obj, name, timed)

    def __getitem__(self, label: str) -> tuple[float, float]:
        return self.times.get(label, (0.0, 0.0))


# ---- the run --------------------------------------------------------------------------------------------------
def trainable_layer_count(model: torch.nn.Module) -> tuple[int, bool]:
    """(decoder layers with a trainable parameter, whether the LM-head weight trains)."""
    layers = model.get_decoder().layers
    count = sum(any(p.requires_grad for p in layer.parameters()) for layer in layers)
    return count, bool(model.get_output_embeddings().weight.requires_grad)


def sft_rows(trainer: Any, want: int) -> list[Any]:
    """Oracle demonstration rows of the env (the warm start's own collection and tokenisation)."""
    from agentgym_opsd.trainer.task_stream import train_task_specs
    from agentgym_opsd.trainer.warm_start import collect_demonstrations, demonstration_rows

    rows: list[Any] = []
    start, batch = 0, trainer.session.envs[0].runner.pool.num_envs
    while len(rows) < want and start < 64:
        tasks = train_task_specs(start, batch, num_tasks=trainer.session.envs[0].env_num_tasks, seed=trainer.session.cfg.trainer.seed + 1)
        demos = collect_demonstrations(trainer.session.envs[0].runner, tasks, thought=trainer.session.cfg.warm_start.thought, batch=batch)
        rows += demonstration_rows(demos, trainer.session.trained.encode, trainer.session.trained.tokenizer)
        start += batch
    if len(rows) < want:
        raise SystemExit(f"only {len(rows)} demonstration rows for an SFT step of {want}")
    return rows


def run(args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    import numpy as np

    from agentgym_opsd.trainer.warm_start import sft_schedule, sft_step

    load_before = os.getloadavg()
    machine_before = measure_machine(args.quick)
    with tempfile.TemporaryDirectory(prefix="bench_roofline_") as tmp:
        # the HF sampler's own forward calls are what is metered (prefill, decode), so it samples here
        trainer = make_trainer(args.config, ["rollout.backend=hf", *overrides], tmp)
        try:
            cached = trainer.session.warm_starter.cache_dir()
            warm = cached is not None and (cached / "summary.json").is_file()
            if warm:
                trainer.warm_start()
            trainer.session.reference.setup()
            model = trainer.session.trained.model
            layers, head_trainable = trainable_layer_count(model)
            dtype_bytes = next(model.parameters()).element_size()
            shape = ModelShape.from_config(model.config)
            meter = ForwardMeter(shape, trainable_layers=layers, head_trainable=head_trainable,
                                 dtype_bytes=dtype_bytes)
            # warm-up (allocator, lazy init) before anything is recorded: one tiny forward + backward
            ids = torch.full((1, 16), int(trainer.session.trained.tokenizer.eos_token_id), device=trainer.session.trained.device)
            model(input_ids=ids, logits_to_keep=1).logits.sum().backward()
            model.zero_grad(set_to_none=True)
            for m in (model, trainer.session.reference.frozen_copy):
                if m is not None:
                    meter.attach(m)
            timers = Timers()
            timers.wrap(trainer.session.policy, "_sample", "sampling")
            timers.wrap(trainer, "old_logprobs", "old/ref log-probs", meter)
            timers.wrap(trainer.session.reference, "logprobs", "old/ref log-probs", meter)
            timers.wrap(trainer.session.evidence_maker, "teacher_logprobs", "teacher pass", meter)
            timers.wrap(trainer, "update", "update", meter)
            timers.wrap(trainer.session.trained.engine, "backward", "backward")
            timers.wrap(trainer.session.trained.engine, "step", "optimizer")
            batches: list[Any] = []  # the step's TurnBatch, for its token counts
            score = trainer.score

            def keep_batch(trajs: list[Any]) -> Any:
                batches.append(score(trajs))
                return batches[-1]

            trainer.score = keep_batch

            t0 = clock()
            with meter.phase("rollout"):
                trajs = trainer.collect()
            t1 = clock()
            metrics, _ = trainer.step_on(trajs)
            t2 = clock()
            teacher_prompts_of_last_batch = (trainer.session.evidence_maker.row_prompts(batches[-1], trajs)
                                             if trainer.session.cfg.algorithm.needs_teacher else [])
            rollout_times, train_times = minus(t1, t0), minus(t2, t1)
            rl_optimizer_steps = timers.count.get("optimizer", 0)
            rl_backward, rl_optimizer = timers["backward"], timers["optimizer"]

            ws = trainer.session.cfg.warm_start
            rows = sft_rows(trainer, ws.batch_rows)
            pick = sft_schedule(len(rows), batch_rows=ws.batch_rows, epochs=1, rng=np.random.default_rng(0))[0]
            o = trainer.session.cfg.optim
            t0 = clock()
            with meter.phase("SFT step"):
                sft_step(trainer.session.trained.engine, rows, pick, pad_id=trainer.session.trained.pad_id, max_tokens=o.micro_batch_tokens,
                         max_rows=o.micro_batch_rows, device=trainer.session.trained.device)
            sft_times = minus(clock(), t0)
            sft_backward = minus(timers["backward"], rl_backward)
            sft_optimizer = minus(timers["optimizer"], rl_optimizer)
            trainable_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
            meter.detach()
            cfg = trainer.session.cfg
        finally:
            trainer.close()
    machine_after = measure_machine(args.quick)
    peak = max(machine_before["peak_flops_per_s"], machine_after["peak_flops_per_s"])
    bandwidth = max(machine_before["bandwidth_bytes_per_s"], machine_after["bandwidth_bytes_per_s"])
    batch = batches[-1]

    def phase(name: str, times: tuple[float, float], note: str = "") -> PhaseTotals:
        t = meter.totals(name, times, peak, bandwidth)
        t.note = note
        return t

    phases = [phase("prefill", meter.forward_times("prefill"), "forward calls, cache empty"),
              phase("decode", meter.forward_times("decode"), "forward calls, 1 token/row")]
    sampling = phase("sampling", timers["sampling"], "HFPolicy._sample: softmax + draw over the vocab")
    rest = minus(rollout_times, meter.forward_times("prefill"), meter.forward_times("decode"), timers["sampling"])
    phases += [sampling, phase("rollout other", rest, "envs, prompts, tokenizer, stop checks")]
    a = cfg.algorithm
    reuse = cfg.model.numerics.sampler_is_trainer(cfg.rollout.backend)
    phases.append(phase("old/ref log-probs", timers["old/ref log-probs"],
                        ("old: sampler's log-probs reused" if reuse else "old: recomputed")
                        + ("; ref: KL off" if a.kl_coef <= 0 else "; ref: frozen copy")))
    teacher_prompts = [p for p in teacher_prompts_of_last_batch if p is not None]
    teacher_rows = len(teacher_prompts)
    phases.append(phase("teacher pass", timers["teacher pass"],
                        f"{teacher_rows} rows" + (", prefix cache" if cfg.optim.teacher_prefix_cache else "")))
    update = phase("update", timers["update"], f"fwd+bwd+AdamW, {rl_optimizer_steps} optimiser steps, "
                                                f"top {layers}/{shape.layers} layers train")
    opt_bytes = ADAMW_BYTES_PER_PARAM * trainable_params * rl_optimizer_steps
    update.bytes += opt_bytes
    update.limit_seconds += opt_bytes / bandwidth
    update.extra = {"forward_seconds": meter.forward_times("update")[0], "backward_seconds": rl_backward[0],
                    "optimizer_seconds": rl_optimizer[0], "optimizer_steps": rl_optimizer_steps}
    phases.append(update)
    rest = minus(train_times, *(timers[k] for k in ("old/ref log-probs", "teacher pass", "update")))
    phases.append(phase("score + credit", rest, "TurnBatch, advantages, metrics"))
    sft = phase("SFT step", sft_times, f"{len(pick)} rows, 1 optimiser step (warm start)")
    sft.bytes += ADAMW_BYTES_PER_PARAM * trainable_params
    sft.limit_seconds += ADAMW_BYTES_PER_PARAM * trainable_params / bandwidth
    sft.extra = {"forward_seconds": meter.forward_times("SFT step")[0], "backward_seconds": sft_backward[0],
                 "optimizer_seconds": sft_optimizer[0]}

    # the packed update lays the prompts' shared prefix once per forward call (`logprobs.shared_prompt_prefix`)
    from agentgym_opsd.trainer.logprobs import shared_prompt_prefix

    prefix_len = shared_prompt_prefix(batch.prompt_ids) if trainer.updater.packed else 0
    expected_update_tokens = a.ppo_epochs * sum(len(p) - prefix_len + len(r) for p, r in zip(
        batch.prompt_ids, batch.response_ids, strict=True)) + prefix_len * sum(c.phase == "update" for c in meter.calls)
    load_after = os.getloadavg()
    return {
        "config": args.config, "overrides": overrides, "quick": args.quick, "torch_threads": torch.get_num_threads(),
        "warm_start_loaded": warm, "model": cfg.model.name_or_path, "model_shape": asdict(shape),
        "model_params": shape.num_params, "trainable_params": trainable_params, "trainable_layers": layers,
        "lm_head_trainable": head_trainable, "dtype_bytes": dtype_bytes,
        "weight_bytes_per_forward": shape.weight_bytes(dtype_bytes),
        "machine": {"before": machine_before, "after": machine_after, "peak_flops_per_s": peak,
                    "peak_large_flops_per_s": max((m["peak_large_flops_per_s"] or 0.0)
                                                  for m in (machine_before, machine_after)) or None,
                    "bandwidth_bytes_per_s": bandwidth, "loadavg_before": load_before,
                    "loadavg_after": load_after, "cpu_count": os.cpu_count(),
                    "shared": max(load_before[0], load_after[0]) > torch.get_num_threads() + 0.5},
        "step": {"seconds": rollout_times[0] + train_times[0], "cpu_seconds": rollout_times[1] + train_times[1],
                 "seconds_rollout": rollout_times[0], "seconds_train": train_times[0],
                 "trajectories": len(trajs), "turn_rows": len(batch.rows),
                 "prompt_tokens": sum(len(p) for p in batch.prompt_ids),
                 "response_tokens": sum(len(r) for r in batch.response_ids),
                 "teacher_prompt_tokens": sum(len(p) for p in teacher_prompts),
                 "update_tokens_expected_from_batch": expected_update_tokens,
                 "update_tokens_counted": update.tokens,
                 "trainer_seconds": {k: metrics[k] for k in ("seconds_logprobs", "seconds_teacher", "seconds_update")}},
        "phases": [asdict(p) for p in phases], "sft": asdict(sft),
    }


# ---- output ---------------------------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def derived(p: dict[str, Any], peak: float, step_seconds: float | None, threads: int) -> dict[str, float | None]:
    s, cpu, limit = p["seconds"], p["cpu_seconds"], p["limit_seconds"]
    rate = p["flops"] / s if s > 0 and p["flops"] else None
    return {"share_of_step": s / step_seconds if step_seconds else None, "flops_per_s": rate,
            "share_of_peak": rate / peak if rate else None,
            # the share of the phase's wall time this process's threads were on a core (others share it)
            "cpu_busy": cpu / (s * threads) if s > 0 else None,
            "share_of_limit": limit / s if s > 0 and limit else None,
            # as if the process had had its cores the whole time: limit / (CPU seconds / threads)
            "share_of_limit_cpu": limit * threads / cpu if cpu > 0 and limit else None,
            "share_of_bandwidth_bound": p["bandwidth_seconds"] / s if s > 0 and p["bandwidth_seconds"] else None,
            "lost_seconds": s - p["limit_seconds"],
            "pad_share": 1 - p["tokens"] / p["padded_tokens"] if p["padded_tokens"] else None}


def add_derived(record: dict[str, Any]) -> None:
    peak, step, threads = record["machine"]["peak_flops_per_s"], record["step"]["seconds"], record["torch_threads"]
    for p in record["phases"]:
        p.update(derived(p, peak, step, threads))
    record["sft"].update(derived(record["sft"], peak, None, threads))
    model_phases = [p for p in [*record["phases"], record["sft"]] if p["flops"]]  # phases that run the model
    record["most_seconds_lost"] = max(model_phases, key=lambda p: p["lost_seconds"])["name"]


def format_table(record: dict[str, Any]) -> Table:
    m, st = record["machine"], record["step"]
    table = Table(title=f"Roofline of one RL step ({record['config']}, {record['model']}, {record['torch_threads']} "
                        f"thread(s)): {st['trajectories']} trajectories, {st['turn_rows']} turn rows; peak "
                        f"{m['peak_flops_per_s'] / 1e9:.1f} GFLOP/s fp32 matmul"
                        + (f" (n>=1024: {m['peak_large_flops_per_s'] / 1e9:.1f})" if m["peak_large_flops_per_s"] else "")
                        + f", {m['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s copy")
    for col in ("phase", "s", "% of step", "CPU busy", "tokens", "pad", "GFLOP", "GFLOP/s", "% of peak",
                "% of BW bound", "limit s", "% of limit", "% of limit per CPU s", "lost s", "note"):
        table.add_column(col, justify="left" if col in ("phase", "note") else "right")

    def row(p: dict[str, Any], decode_bw: bool) -> None:
        table.add_row(p["name"], f"{p['seconds']:.2f}", _pct(p["share_of_step"]), _pct(p["cpu_busy"]),
                      str(p["tokens"]) if p["tokens"] else "–", _pct(p["pad_share"]),
                      f"{p['flops'] / 1e9:.1f}" if p["flops"] else "–",
                      f"{p['flops_per_s'] / 1e9:.2f}" if p["flops_per_s"] else "–", _pct(p["share_of_peak"]),
                      _pct(p["share_of_bandwidth_bound"]) if decode_bw else "–",
                      f"{p['limit_seconds']:.2f}" if p["limit_seconds"] else "–", _pct(p["share_of_limit"]),
                      _pct(p["share_of_limit_cpu"]), f"{p['lost_seconds']:.2f}", p["note"])

    for p in record["phases"]:
        row(p, p["name"] in ("prefill", "decode"))
    table.add_section()
    total = {"name": "RL step", "seconds": st["seconds"], "cpu_seconds": st["cpu_seconds"],
             "calls": sum(p["calls"] for p in record["phases"]),
             "tokens": sum(p["tokens"] for p in record["phases"]),
             "padded_tokens": sum(p["padded_tokens"] for p in record["phases"]),
             "flops": sum(p["flops"] for p in record["phases"]), "bandwidth_seconds": 0.0,
             "limit_seconds": sum(p["limit_seconds"] for p in record["phases"]), "note": ""}
    total.update(derived(total, m["peak_flops_per_s"], st["seconds"], record["torch_threads"]))
    row(total, False)
    table.add_section()
    row(record["sft"], False)
    return table


def plot(record: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = [*record["phases"], record["sft"]]
    names = [p["name"] for p in items]
    x = list(range(len(items)))
    fig, ax = plt.subplots(figsize=(12, 5))
    colors = ["tab:blue"] * len(record["phases"]) + ["tab:orange"]
    ax.bar(x, [p["seconds"] for p in items], 0.7, color=colors, label="measured")
    ax.bar(x, [p["limit_seconds"] for p in items], 0.35, color="black", alpha=0.55,
           label="limit: max(FLOPs / peak, bytes / bandwidth)")
    top = max(p["seconds"] for p in items) or 1.0
    for i, p in enumerate(items):
        text = f"{_pct(p['share_of_limit'])} of limit" if p["share_of_limit"] else "no model work"
        if p["name"] == "decode" and p["share_of_bandwidth_bound"]:
            text += f"\n{_pct(p['share_of_bandwidth_bound'])} of BW bound"
        if p["share_of_limit"] and p.get("cpu_busy"):
            text += f"\nCPU busy {_pct(p['cpu_busy'])}"
        ax.text(i, p["seconds"] + 0.01 * top, text, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("seconds")
    m = record["machine"]
    ax.set_title(f"One RL step of {record['config']} ({record['torch_threads']} thread(s); peak "
                 f"{m['peak_flops_per_s'] / 1e9:.1f} GFLOP/s, {m['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s); "
                 f"orange: one warm-start SFT step"
                 + (f"\nshared machine: load average {m['loadavg_before'][0]:.1f} on {m['cpu_count']} cores"
                    if m.get("shared") else ""), fontsize=10)
    ax.set_ylim(0, top * 1.18)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-learn", help="preset name or YAML path")
    ap.add_argument("--threads", type=int, default=None,
                    help=f"torch threads (default: torch's, {torch.get_num_threads()} here; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help="smoke check: tiny random model, 2 rollouts, short turns")
    ap.add_argument("--out", default=None, help="writes OUT.json and OUT.png (default benchmarks/results/roofline)")
    ap.add_argument("--overrides", nargs="*", default=[], help="config overrides, key=value (also positional)")
    ap.add_argument("overrides_positional", nargs="*", metavar="key=value")
    args = ap.parse_args(argv)
    args.threads = args.threads or (1 if args.quick else torch.get_num_threads())
    torch.set_num_threads(args.threads)
    overrides = [*(QUICK_OVERRIDES if args.quick else ()), *args.overrides, *args.overrides_positional]
    out = Path(args.out or ("runs/roofline-quick/roofline" if args.quick else RESULTS / "roofline"))
    t0 = time.perf_counter()
    record = run(args, overrides)
    record["seconds_total"] = time.perf_counter() - t0
    add_derived(record)
    Console(width=220).print(format_table(record))
    st = record["step"]
    if st["update_tokens_counted"] != st["update_tokens_expected_from_batch"]:
        print(f"note: the update fed {st['update_tokens_counted']} tokens, the batch has "
              f"{st['update_tokens_expected_from_batch']} (x ppo_epochs)")
    print(f"model phase losing the most seconds to its limit: {record['most_seconds_lost']}; "
          f"run took {record['seconds_total']:.0f} s")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    plot(record, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
