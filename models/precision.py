"""Which floating-point format the model computes in: `model.dtype: auto` resolved once per machine.

bfloat16 pays only where the hardware multiplies in it faster than in float32: a CUDA GPU that reports bf16
support, or an x86 CPU with AMX-BF16 (Sapphire Rapids and later, with AMX enabled), whose tile units oneDNN
uses for bf16 matmuls. AVX512-BF16 alone is not enough: its dot-product instruction has the same peak as
float32 FMAs, and on the development machine (avx512_bf16, no AMX) oneDNN's bf16 matmul ran at 80 GFLOP/s
per thread against MKL float32's 150, and every phase of a `cpu-small` step was 1.4-1.7x slower in bf16
(`benchmarks/results/precision.json`). So on the CPU `auto` is bf16 with AMX and float32 otherwise, with one
log line that says why.

Training in bf16 always keeps float32 master weights and optimiser state (DeepSpeed's bf16 optimiser, or
`trainer.engine.TorchEngine`'s master copy): an AdamW update of lr 2e-5 is far below bf16's resolution
(8 bits of mantissa) and would round away on bf16 weights.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

__all__ = ["DTYPE_CHOICES", "cpu_bf16_support", "resolve_device", "resolve_dtype", "is_low_precision"]

log = logging.getLogger(__name__)

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


@functools.cache
def cpu_bf16_support() -> tuple[bool, str]:
    """(faster, reason): whether bf16 matmuls beat float32 on this CPU (AMX-BF16), and the one-line why."""
    flags = _cpu_flags()
    if "amx_bf16" in flags:
        return True, "the CPU has AMX-BF16 (oneDNN's bf16 matmuls run on its tile units)"
    if "avx512_bf16" in flags:
        return False, ("the CPU has avx512_bf16 but no AMX: its bf16 matmuls are no faster than float32 "
                       "(measured 1.4-1.7x slower per phase, benchmarks/results/precision.json)")
    if not flags:
        return False, "cannot read the CPU's flags (/proc/cpuinfo)"
    return False, "the CPU has no native bf16 (neither amx_bf16 nor avx512_bf16: bf16 would be emulated)"


def resolve_device(device: str) -> torch.device:
    """`trainer.device` as a torch device: `auto` is the GPU when one is visible, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device | str = "cpu") -> str:
    """The concrete dtype name for `dtype` on `device`: `auto` is bfloat16 where the hardware computes in it
    natively, else float32 (logged once, with the reason); any other name is returned unchanged."""
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"model.dtype must be one of {DTYPE_CHOICES}, got {dtype!r}")
    if dtype != "auto":
        return dtype
    device = torch.device(device)
    if device.type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        why = "the GPU supports bf16" if ok else "the GPU does not support bf16"
    else:
        ok, why = cpu_bf16_support()
    chosen = "bfloat16" if ok else "float32"
    _note(f"model.dtype=auto -> {chosen}: {why}")
    return chosen


@functools.cache
def _note(message: str) -> None:
    log.info(message)


def is_low_precision(dtype: str | torch.dtype) -> bool:
    """True for bfloat16 / float16 (the optimiser then needs float32 master weights)."""
    if isinstance(dtype, str):
        return dtype in ("bfloat16", "float16")
    return dtype in (torch.bfloat16, torch.float16)
