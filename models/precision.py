"""The precision room: `model.precision` (auto | fp32 | bf16-mixed) and everything it decides.

`bf16-mixed` is one recipe (`Precision`): the frozen trunk's weights in bf16; the trainable blocks, their
float32 master weights and the LM head's arithmetic in float32; those blocks' matmuls under bf16 autocast in the
RL phases (the SFT of the warm start computes in float32); float32 masters dithered where they are copied from
bf16 weights; truncated importance sampling (TIS) wherever the sampler is not the trainer's own pass. `fp32` is
float32 throughout, reusing the HF sampler's own log-probs as π_old. `auto` is decided by measurement, never by
CPU flags (two machines with the same flags ran bf16 at half and at several times float32's speed):
`probe_bf16` times the model's own matmul shapes in both formats and caches the answer per machine.

bf16 on the logits: a logit near 20 has a bf16 resolution of 0.125, so `float32_lm_head` makes the output
projection compute and return float32 from the bf16 hidden state (MiniMax-M1's fix for its training/inference
mismatch). An AdamW update of lr 2e-5 is far below bf16's 8-bit mantissa, hence the float32 masters.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import statistics
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentgym_opsd.files import atomic_write_text, cache_dir

__all__ = ["BF16_MIN_SPEEDUP", "DTYPE_CHOICES", "PRECISIONS", "Precision", "ProbeResult", "first_cpu",
           "float32_lm_head", "has_float32_lm_head", "is_low_precision", "machine_key", "precision_summary",
           "probe_bf16", "probe_matmuls", "resolve_device", "resolve_dtype", "resolve_precision", "rounding_cell",
           "timed_rounds"]

log = logging.getLogger(__name__)

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")  # a policy's weights (`evaluate --policy hf:..?dtype=`)
PRECISIONS = ("auto", "fp32", "bf16-mixed")  # model.precision, as Lightning names them
_DTYPE_OF = {"auto": "auto", "fp32": "float32", "bf16-mixed": "bfloat16"}
BF16_MIN_SPEEDUP = 1.3
"""bf16 is `auto`'s choice where the probe's matmuls run at least this much faster than in float32: below it
the gain does not pay for the extra rounding (and timing noise alone is ~10%)."""
DEFAULT_DIMS = (576, 1536)
"""(hidden, intermediate) of SmolLM2-135M, the embedded model: the probe's shapes when the caller gives none."""
PROBE_FILE = "precision_probe.json"


@dataclass(frozen=True)
class ProbeResult:
    """GFLOP/s of the probe's matmuls in each format on this machine."""

    float32_gflops: float
    bfloat16_gflops: float
    key: str = ""

    @property
    def speedup(self) -> float:
        return self.bfloat16_gflops / self.float32_gflops if self.float32_gflops > 0 else 0.0

    @property
    def bf16_pays(self) -> bool:
        return self.speedup >= BF16_MIN_SPEEDUP

    def describe(self) -> str:
        return (f"bf16 {self.bfloat16_gflops:.0f} vs float32 {self.float32_gflops:.0f} GFLOP/s on the model's "
                f"matmul shapes ({self.speedup:.2f}x; bf16 where >= {BF16_MIN_SPEEDUP}x)")


def first_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The fields of the first processor in /proc/cpuinfo (`model name`, `cpu family`, `flags`, ...); empty
    where unreadable."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, str]:
    """(model name, sorted flags) of the first CPU ('' where unreadable)."""
    fields = first_cpu(cpuinfo)
    return fields.get("model name", ""), " ".join(sorted(fields.get("flags", "").split()))


def machine_key(device: torch.device | str = "cpu", dims: Sequence[int] = DEFAULT_DIMS) -> str:
    """What the probe's answer depends on: the processor (model name and flags, or the GPU's name and
    capability), torch's version and the shapes. Not the thread count: the ratio is the processor's, and one
    answer per machine keeps runs at different thread counts (a study's parallel runs) on one dtype."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        hardware = f"{torch.cuda.get_device_name(index)} sm{''.join(map(str, torch.cuda.get_device_capability(index)))}"
    else:
        name, flags = _cpu_info()
        hardware = f"{name or 'unknown CPU'} flags:{hashlib.sha1(flags.encode()).hexdigest()[:12]}"
    return f"{device.type}|{hardware}|torch {torch.__version__}|dims {list(dims)}"


def probe_matmuls(device: torch.device | str = "cpu", dims: Sequence[int] = DEFAULT_DIMS, *, tokens: int = 512,
                  seconds: float = 0.6) -> ProbeResult:
    """Time the decoder's matmul shapes (tokens x hidden by hidden x hidden / intermediate, and back) in
    float32 and bf16, interleaved so that a load change hits both alike; the median of each format's rounds."""
    device = torch.device(device)
    hidden, intermediate = dims
    shapes = [(tokens, hidden, hidden), (tokens, hidden, intermediate), (tokens, intermediate, hidden)]
    flops = sum(2 * m * k * n for m, k, n in shapes)
    gen = torch.Generator().manual_seed(0)
    operands = {dt: [(torch.randn(m, k, generator=gen).to(device, dt), torch.randn(k, n, generator=gen).to(device, dt))
                     for m, k, n in shapes] for dt in (torch.float32, torch.bfloat16)}

    def run(dt: torch.dtype) -> float:
        t0 = time.perf_counter()
        for a, b in operands[dt]:
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    for dt in operands:  # warm-up: first calls pick kernels and fault pages in
        run(dt)
    times = timed_rounds(run, seconds=seconds)
    return ProbeResult(flops / statistics.median(times[torch.float32]) / 1e9,
                       flops / statistics.median(times[torch.bfloat16]) / 1e9, machine_key(device, dims))


HOPELESS_SLOWDOWN = 4.0
"""A bf16 round this many times slower than every float32 round settles the probe: timing noise (~10%) cannot
make it `BF16_MIN_SPEEDUP` times faster. An AVX2 CPU without bf16 instructions runs bf16 matmuls many times
slower than float32."""


def timed_rounds(run: Callable[[torch.dtype], float], *, seconds: float,
                 min_rounds: int = 3) -> dict[torch.dtype, list[float]]:
    """Seconds of interleaved rounds of `run(float32)` and `run(bfloat16)` for `seconds` and at least `min_rounds`
    rounds, or fewer when bf16 is hopeless (`HOPELESS_SLOWDOWN`): there each bf16 round costs seconds, and one
    round answers."""
    times: dict[torch.dtype, list[float]] = {torch.float32: [], torch.bfloat16: []}
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times[torch.float32]) < min_rounds:
        for dt in times:
            times[dt].append(run(dt))
        if min(times[torch.bfloat16]) > HOPELESS_SLOWDOWN * max(times[torch.float32]):
            break
    return times


def probe_bf16(device: torch.device | str = "cpu", dims: Sequence[int] = DEFAULT_DIMS, *,
               probe: Callable[..., ProbeResult] | None = None, cache: Path | None = None) -> ProbeResult:
    """This machine's `ProbeResult`, measured once and then read from the cache file (one entry per key)."""
    key = machine_key(device, dims)
    path = cache if cache is not None else cache_dir(PROBE_FILE)
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        entries = {}
    if not isinstance(entries, dict):
        entries = {}
    hit = entries.get(key)
    if isinstance(hit, dict):
        try:
            return ProbeResult(float(hit["float32_gflops"]), float(hit["bfloat16_gflops"]), key)
        except (KeyError, TypeError, ValueError):
            pass  # a damaged entry is measured again
    result = (probe or probe_matmuls)(device, dims)
    result = ProbeResult(result.float32_gflops, result.bfloat16_gflops, key)
    entries[key] = {k: v for k, v in asdict(result).items() if k != "key"}
    try:
        atomic_write_text(path, json.dumps(entries, indent=1, sort_keys=True) + "\n")
    except OSError as exc:  # a read-only cache costs a probe per run, nothing else
        log.warning("cannot cache the precision probe in %s: %s", path, exc)
    return result


def resolve_device(device: str) -> torch.device:
    """`trainer.device` as a torch device: `auto` is the GPU when one is visible, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device | str = "cpu", dims: Sequence[int] = DEFAULT_DIMS) -> str:
    """The concrete dtype name for `dtype` (a policy's weights; `model.precision` resolves through it) on `device`: `auto` is bfloat16 where the probe measures it at least
    `BF16_MIN_SPEEDUP` times faster than float32, else float32 (logged once, with both figures); any other
    name is returned unchanged."""
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {dtype!r}")
    if dtype != "auto":
        return dtype
    device = torch.device(device)
    if device.type == "cuda" and not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        _note("precision auto -> float32: the GPU does not support bf16")
        return "float32"
    result = probe_bf16(device, tuple(dims))
    chosen = "bfloat16" if result.bf16_pays else "float32"
    _note(f"precision auto -> {chosen}: {result.describe()}")
    return chosen


def resolve_precision(precision: str, device: torch.device | str = "cpu", dims: Sequence[int] = DEFAULT_DIMS) -> str:
    """`model.precision` as this machine runs it: `auto` is `bf16-mixed` where bf16 matmuls pay (`resolve_dtype`:
    a GPU with bf16, or the probe's >= `BF16_MIN_SPEEDUP`), else `fp32`; the others are returned unchanged."""
    if precision not in PRECISIONS:
        raise ValueError(f"model.precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "auto":
        return precision
    return "bf16-mixed" if resolve_dtype("auto", device, dims) == "bfloat16" else "fp32"


@dataclass(frozen=True)
class Precision:
    """What a (resolved) `model.precision` means for a model trained as `trainable_layers` / `lora` say: every
    precision decision of the trainer is a property here."""

    name: str
    trainable_layers: int = 0
    lora: bool = False

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS:
            raise ValueError(f"model.precision must be one of {PRECISIONS}, got {self.name!r}")

    @property
    def dtype(self) -> str:
        """The weights' dtype name as loaded ("auto" until resolved): the frozen trunk's, the sampler's."""
        return _DTYPE_OF[self.name]

    @property
    def low_precision(self) -> bool:
        return self.name == "bf16-mixed"

    @property
    def float32_trainable(self) -> bool:
        """The trained top blocks keep float32 weights over the bf16 trunk (`loading.keep_trainable_in_float32`):
        the update reaches them exactly. With every layer trained the weights stay bf16 under float32 masters
        instead (the engine's), and LoRA's adapters are float32 already."""
        return self.low_precision and self.trainable_layers > 0 and not self.lora

    @property
    def rl_autocast(self) -> bool:
        """The float32 trainable blocks compute their matmuls in bf16 under autocast in every RL phase (sampler,
        evaluation, π_old, teacher, update alike, so the PPO ratio starts at 1); the SFT stays float32."""
        return self.float32_trainable

    def sampler_is_trainer(self, backend: str) -> bool:
        """Whether the sampler's log-probs are the trainer's own numbers: the HF sampler in float32. There π_old
        is the sampler's (no extra pass) and TIS has nothing to correct; elsewhere π_old is recomputed and TIS on."""
        return backend == "hf" and not self.low_precision

    def cache_key(self) -> dict[str, Any]:
        """The precision's part of the warm-start and start-evaluation cache keys, as the keys of the fields it
        replaced hashed it (`model.dtype`, and `trainable_dtype` / `autocast` only where they changed the model),
        so entries cached before it still match."""
        key: dict[str, Any] = {"dtype": self.dtype}
        if self.float32_trainable:
            key["trainable_dtype"] = "float32"
        if self.rl_autocast:
            key["autocast"] = True
        return key


@functools.cache
def _note(message: str) -> None:
    log.info(message)


def is_low_precision(dtype: str | torch.dtype) -> bool:
    """True for bfloat16 / float16 (the optimiser then needs float32 master weights)."""
    if isinstance(dtype, str):
        return dtype in ("bfloat16", "float16")
    return dtype in (torch.bfloat16, torch.float16)


def rounding_cell(weights: Tensor) -> tuple[Tensor, Tensor]:
    """The float32 distances from each low-precision weight down and up to its neighbouring representable
    values (round-to-nearest sends everything within half of each to the weight); 0 on the side of the largest
    finite values, whose neighbour is infinite."""
    up = torch.nextafter(weights, torch.full_like(weights, float("inf"))).float() - weights.float()
    down = weights.float() - torch.nextafter(weights, torch.full_like(weights, float("-inf"))).float()
    return torch.nan_to_num(down, posinf=0.0), torch.nan_to_num(up, posinf=0.0)


# ---- the float32 LM head ---------------------------------------------------------------------------------
def _float32_head_forward(self: torch.nn.Linear, hidden: Tensor) -> Tensor:
    """`Linear.forward` computed and returned in float32. Without gradients (sampling, π_old, teacher) the
    float32 copy of the weight is kept until the weight changes (`_version` counts in-place updates), so a
    decode step does not convert 28M weights again; with gradients the conversion is part of the graph."""
    weight, bias = self.weight, self.bias
    if torch.is_grad_enabled() and weight.requires_grad:
        w32 = weight.float()
    else:
        stamp = (weight.data_ptr(), weight._version, weight.device)
        cached = getattr(self, "_float32_weight", None)
        if cached is None or cached[0] != stamp:
            cached = (stamp, weight.detach().float())
            self._float32_weight = cached
        w32 = cached[1]
    with torch.autocast(hidden.device.type, enabled=False):  # float32 under an autocast too (the warm start's)
        return torch.nn.functional.linear(hidden.float(), w32, bias.float() if bias is not None else None)


def float32_lm_head(model: torch.nn.Module) -> bool:
    """Make `model`'s output projection return float32 logits from float32 arithmetic (its weight stays where
    it is, tied or not, so checkpoints, PEFT and ZeRO see the same module). True when a head was found; a
    float32 model is left alone (nothing to gain)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, torch.nn.Linear) or not is_low_precision(head.weight.dtype):
        return False
    head.forward = types.MethodType(_float32_head_forward, head)  # type: ignore[method-assign]
    head._float32_head = True  # type: ignore[attr-defined]
    return True


def has_float32_lm_head(model: torch.nn.Module) -> bool:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return bool(getattr(head, "_float32_head", False))


def precision_summary(model: Any) -> dict[str, Any]:
    """The model's compute dtype and whether its head is float32 (for logs and result files)."""
    param = next(model.parameters())
    return {"dtype": str(param.dtype).removeprefix("torch."), "float32_lm_head": has_float32_lm_head(model)}
