"""Optimiser backends behind one small interface: DeepSpeed (default) and plain torch.

`make_engine(model, optim_cfg, ds_cfg, backend=...)` returns an `Engine` with `backward(loss, is_last)` per
micro-batch, `step()` once per update, `state_dict()` / `load_state_dict()` for checkpoints, and `module`
(the model to call). The trainer sums micro-batch losses that are already divided by the step's token
count, so neither backend rescales by the number of micro-batches.

DeepSpeed on a CPU-only machine: a single process works with the gloo backend once the usual launcher
variables exist, so we set MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE/LOCAL_RANK when they are absent (the
`deepspeed` launcher and torchrun set them for multi-process runs). Torch's AdamW is passed in as the
optimiser so DeepSpeed never compiles its fused CPU/GPU Adam ops (ZeRO supports torch Adam/AdamW).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, Protocol

import torch

from agentgym_opsd.trainer.config import DeepSpeedConfig, OptimConfig

__all__ = ["Engine", "TorchEngine", "DeepSpeedEngineAdapter", "make_engine", "ensure_dist_env", "deepspeed_config"]

log = logging.getLogger(__name__)


class Engine(Protocol):
    module: torch.nn.Module

    def backward(self, loss: torch.Tensor, *, is_last: bool) -> None: ...

    def step(self) -> float:
        """Apply the accumulated gradients; returns the gradient norm before clipping (nan if unknown)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def set_lr(self, lr: float) -> None: ...


def _adamw(model: torch.nn.Module, cfg: OptimConfig, lr: float | None = None) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    return torch.optim.AdamW(params, lr=lr if lr is not None else cfg.lr, betas=tuple(cfg.betas),
                             weight_decay=cfg.weight_decay)


class TorchEngine:
    """Single-process torch: accumulate gradients, clip, AdamW step."""

    def __init__(self, model: torch.nn.Module, cfg: OptimConfig, lr: float | None = None) -> None:
        self.module = model
        self.cfg = cfg
        self.optimizer = _adamw(model, cfg, lr)

    def backward(self, loss: torch.Tensor, *, is_last: bool) -> None:
        loss.backward()

    def step(self) -> float:
        params = [p for p in self.module.parameters() if p.requires_grad]
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr


def _grad_norm(model: torch.nn.Module) -> float:
    grads = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0


def ensure_dist_env() -> None:
    """Fill in single-process launcher variables when no launcher set them (gloo needs an address/port)."""
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:  # a free port, so parallel runs on one machine do not collide
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)


def deepspeed_config(ds: DeepSpeedConfig, optim: OptimConfig) -> dict[str, Any]:
    """The DeepSpeed config dict. Micro-batch size 1 / accumulation 1 are nominal: the trainer owns the
    micro-batching and marks the accumulation boundary itself."""
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": optim.grad_clip,
        "zero_optimization": {"stage": ds.zero_stage},
        "bf16": {"enabled": ds.bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }
    if ds.offload_optimizer and ds.zero_stage > 0:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        cfg["zero_force_ds_cpu_optimizer"] = False  # keep torch AdamW (no DeepSpeed op compilation)
    cfg.update(ds.extra)
    return cfg


class DeepSpeedEngineAdapter:
    """`deepspeed.initialize` with torch AdamW; gradient accumulation boundary set by the trainer."""

    def __init__(self, model: torch.nn.Module, optim: OptimConfig, ds: DeepSpeedConfig,
                 lr: float | None = None) -> None:
        import deepspeed

        ensure_dist_env()
        if not torch.distributed.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            deepspeed.init_distributed(dist_backend=backend)
        self.config = deepspeed_config(ds, optim)
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=_adamw(model, optim, lr),
                                                       config=self.config)
        self.engine = engine
        self.optimizer = optimizer
        self.module = engine.module
        self.zero_stage = ds.zero_stage

    def backward(self, loss: torch.Tensor, *, is_last: bool) -> None:
        # The boundary tells DeepSpeed when to reduce gradients across ranks (only on the last micro-batch).
        self.engine.set_gradient_accumulation_boundary(is_last)
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        self.engine.set_gradient_accumulation_boundary(True)
        # ZeRO-0 with a client optimiser does not report the norm; the full gradients are local there.
        local = _grad_norm(self.module) if self.zero_stage == 0 else None
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        self.engine.zero_grad()
        if norm is None:
            norm = local
        return float(norm) if norm is not None else float("nan")

    def state_dict(self) -> dict[str, Any]:
        if self.zero_stage > 0:
            raise NotImplementedError("ZeRO > 0 checkpoints go through save_deepspeed_checkpoint")
        return {"optimizer": self.optimizer.state_dict(), "global_steps": self.engine.global_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.engine.global_steps = int(state.get("global_steps", 0))

    def save_deepspeed_checkpoint(self, folder: str) -> None:
        self.engine.save_checkpoint(folder, tag="ds", save_latest=False)

    def load_deepspeed_checkpoint(self, folder: str) -> None:
        path, _ = self.engine.load_checkpoint(folder, tag="ds")
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint in {folder}")

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr


def make_engine(model: torch.nn.Module, optim: OptimConfig, ds: DeepSpeedConfig, *, backend: str = "deepspeed",
                lr: float | None = None) -> TorchEngine | DeepSpeedEngineAdapter:
    """`backend="deepspeed"` (falls back to torch with a warning when deepspeed cannot be imported) or "torch"."""
    if backend == "torch":
        return TorchEngine(model, optim, lr)
    if backend != "deepspeed":
        raise ValueError(f"unknown trainer backend {backend!r}; expected deepspeed or torch")
    try:
        import deepspeed  # noqa: F401
    except ImportError as exc:
        log.warning("deepspeed is not importable (%s); using the plain torch backend", exc)
        return TorchEngine(model, optim, lr)
    return DeepSpeedEngineAdapter(model, optim, ds, lr)
