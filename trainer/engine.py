"""Optimiser backends behind one small interface: DeepSpeed (default) and plain torch.

`make_engine(model, optim, ds, backend=...)` returns an `Engine`: `backward(loss, is_last=...)` per micro-batch,
`step()` per update, `state_dict()` / `load_state_dict()` for checkpoints, and `module` (the model to call).
Micro-batch losses come already divided by the step's token count, so neither backend rescales by the number of
micro-batches. Torch's AdamW is passed to DeepSpeed, so it never compiles its fused Adam ops. `init_distributed`
fills in single-process launcher variables when none are set and picks nccl on CUDA, gloo on the CPU. Data
parallel: each rank holds its own engine and DeepSpeed averages the gradients; the collective helpers (`rank`,
`barrier`, `all_reduce`, ...) are no-ops in one process, so callers use them unconditionally. `checkpoint_ranks()`
reports a save on the rendezvous store, so a rank that fails mid-save is named on every rank instead of hanging
them at a barrier. Under ZeRO-3, `full_weights()` gathers the parameters for passes whose length differs by rank.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch

from agentgym_opsd.models.precision import is_low_precision, rounding_cell
from agentgym_opsd.trainer import checkpoint as ckpt
from agentgym_opsd.trainer.config import DeepSpeedConfig, OptimConfig
from agentgym_opsd.trainer.finite import require_finite

__all__ = ["Engine", "TorchEngine", "DeepSpeedEngineAdapter", "make_engine", "ensure_dist_env", "deepspeed_config",
           "init_distributed", "rank", "world_size", "is_main", "barrier", "all_reduce", "all_gather_objects",
           "broadcast_object", "checkpoint_ranks", "StoreBoard", "innermost_optimizer", "skip_cpu_shm_op",
           "remove_stale_build_lock", "extension_build_dir"]

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

    def reset_optimizer_state(self) -> None:
        """Forget the optimiser's moments (RL after the warm start starts from fresh AdamW statistics)."""
        ...

    def full_weights(self) -> contextlib.AbstractContextManager[None]: ...

    def low_precision_stats(self) -> dict[str, float]:
        """What the optimiser steps since the last call did to a bf16 / fp16 model's weights ({} otherwise)."""
        ...

    def refresh_masters(self) -> None:
        """The module's weights were written from outside: float32 master copies start from them."""
        ...

    def full_state_dict(self) -> dict[str, torch.Tensor] | None: ...

    def load_full_state_dict(self, state: dict[str, torch.Tensor], *, strict_keys: bool = True) -> Any: ...


def innermost_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimiser inside DeepSpeed's wrappers (ZeRO-1/2/3 and the bf16 optimiser keep it in
    `.optimizer`); the moments live there."""
    seen = 0
    while optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer) and seen < 8:
        optimizer = getattr(optimizer, "optimizer", None)
        seen += 1
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


def _adamw(model: torch.nn.Module, cfg: OptimConfig, lr: float | None = None) -> torch.optim.AdamW:
    return _adamw_over([p for p in model.parameters() if p.requires_grad], cfg, lr)


def _adamw_over(params: list[torch.nn.Parameter], cfg: OptimConfig, lr: float | None = None) -> torch.optim.AdamW:
    if not params:
        raise ValueError("the model has no trainable parameters")
    return torch.optim.AdamW(params, lr=lr if lr is not None else cfg.lr, betas=tuple(cfg.betas),
                             weight_decay=cfg.weight_decay)


DITHER_SEED = 0
"""The masters' dither is seeded (the same on every rank: ZeRO-0 ranks hold identical masters)."""


@torch.no_grad()
def dither_masters(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], *, seed: int = DITHER_SEED) -> None:
    """Move each float32 master to a uniform random point of its low-precision weight's rounding cell.

    Masters copied from low-precision weights (at the start, or after loading a bf16 warm start) sit exactly on
    the rounding grid, in the middle of their cells: an update must then exceed half a cell before the model's
    weight moves at all, so the small RL updates of the first steps never reach the model, and those that do
    are the weights with the smallest cells (on a bf16 WebShop run, 8 steps at lr 2e-5 moved 17% of the weights
    and carried 0.36 of the masters' update, `docs/training.md`). From a uniform point of the cell, an update
    δ moves the weight by one cell with probability |δ| / cell: the model follows the masters in expectation.
    The rounded model is unchanged by the dither itself."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for low, master in pairs:
        w = low.detach()
        down, up = rounding_cell(w)
        u = (torch.rand(w.shape, generator=gen) - 0.5).to(w.device) * 0.999  # never the cell's edge (a tie)
        master.copy_(w.float() + torch.where(u >= 0, u * up, u * down))


TALLY_SAMPLE = 1 << 16
"""At most about this many elements of each weight enter `precision/weights_changed` where the tally needs a copy
of the weights from before the step (DeepSpeed): a strided sample, so the metric is an estimate there."""


def tally_sample(weight: torch.Tensor) -> torch.Tensor:
    """A strided view of about `TALLY_SAMPLE` elements of `weight` (all of it when smaller), spread over its rows."""
    flat = weight.detach().reshape(-1)
    return flat[:: max(1, flat.numel() // TALLY_SAMPLE)]


class RoundingTally:
    """How many low-precision weights the optimiser steps moved, out of how many rounded (both engines count)."""

    def __init__(self) -> None:
        self.changed = self.rounded = 0

    def add(self, before: torch.Tensor, after: torch.Tensor) -> None:
        self.changed += int((before != after).sum())
        self.rounded += before.numel()

    def take(self) -> dict[str, float]:
        """`precision/weights_changed`: the share of the low-precision trainable weights that optimiser steps
        since the last call moved (counted per step); {} for a float32 model or before any step."""
        if not self.rounded:
            return {}
        out = {"precision/weights_changed": self.changed / self.rounded}
        self.changed = self.rounded = 0
        return out


class TorchEngine:
    """Single-process torch: accumulate gradients, clip, AdamW step.

    A bf16 / fp16 model trains against float32 master weights (as DeepSpeed's bf16 optimiser does): each
    micro-batch's gradient is added into the masters' float32 `.grad`, AdamW steps the masters, and the
    model's low-precision weights are rounded from them. Without the masters, lr 2e-5 updates vanish below
    bf16's resolution; masters copied from the model are dithered (`dither_masters`)."""

    def __init__(self, model: torch.nn.Module, cfg: OptimConfig, lr: float | None = None) -> None:
        self.module = model
        self.cfg = cfg
        trainable = [p for p in model.parameters() if p.requires_grad]
        self._pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []
        self._tally = RoundingTally()
        if any(is_low_precision(p.dtype) for p in trainable):
            self._pairs = [(p, torch.nn.Parameter(p.detach().float().clone())) for p in trainable]
            self.optimizer = _adamw_over([m for _, m in self._pairs], cfg, lr)
            dither_masters(self._pairs)
        else:
            self.optimizer = _adamw(model, cfg, lr)

    @property
    def master_weights(self) -> bool:
        return bool(self._pairs)

    def backward(self, loss: torch.Tensor, *, is_last: bool) -> None:
        loss.backward()
        for param, master in self._pairs:  # accumulate in float32, not in the bf16 .grad
            if param.grad is not None:
                grad = param.grad.float()
                master.grad = grad if master.grad is None else master.grad.add_(grad)
                param.grad = None

    def _optimised(self) -> list[torch.nn.Parameter]:
        return [m for _, m in self._pairs] or [p for p in self.module.parameters() if p.requires_grad]

    def step(self) -> float:
        params = self._optimised()
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        require_finite(float(norm), "the gradient norm")  # before AdamW writes it into the weights
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._round_to_model()
        return float(norm)

    @torch.no_grad()
    def _round_to_model(self) -> None:
        for param, master in self._pairs:
            rounded = master.to(param.dtype)
            self._tally.add(param, rounded)
            param.copy_(rounded)

    def low_precision_stats(self) -> dict[str, float]:
        return self._tally.take()

    @torch.no_grad()
    def refresh_masters(self) -> None:
        """The model's weights were loaded from outside: the masters start from them (dithered)."""
        for param, master in self._pairs:
            master.copy_(param.float())
        if self._pairs:
            dither_masters(self._pairs)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"optimizer": self.optimizer.state_dict()}
        if self._pairs:  # the float32 weights: the saved bf16 model alone would lose their low bits
            state["master_weights"] = [m.detach().clone() for _, m in self._pairs]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        masters = state.get("master_weights")
        if self._pairs and masters is not None:
            if len(masters) != len(self._pairs):
                raise ckpt.CheckpointError(f"checkpoint holds {len(masters)} master weights, the model trains "
                                           f"{len(self._pairs)} tensors: resume with the same model settings")
            with torch.no_grad():
                for (_, master), saved in zip(self._pairs, masters, strict=True):
                    master.copy_(saved)
            self._round_to_model()
        elif self._pairs:
            self.refresh_masters()

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def reset_optimizer_state(self) -> None:
        self.optimizer.state.clear()

    def full_weights(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        return None  # the module's own state_dict is complete

    def load_full_state_dict(self, state: dict[str, torch.Tensor], *, strict_keys: bool = True) -> Any:
        result = self.module.load_state_dict(state, strict=False)
        self.refresh_masters()
        return result


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


def init_distributed(device: torch.device | str = "cpu") -> None:
    """Join the process group (once): nccl when training on CUDA, gloo on the CPU. A launcher (torchrun,
    `deepspeed`) sets the rendezvous variables; a plain `python -m` run gets single-process ones."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    ensure_dist_env()
    cuda = torch.device(device).type == "cuda"
    if cuda:  # one GPU per rank: LOCAL_RANK picks it (the launchers set it)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    import deepspeed

    if not cuda:
        if world_size() == 1:
            skip_cpu_shm_op()
        else:
            remove_stale_build_lock(SHM_OP_NAME)
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")


SHM_OP_NAME = "deepspeed_shm_comm"
STALE_BUILD_S = 30 * 60.0
"""A build that wrote nothing for this long is dead (a build on a loaded machine takes minutes, and every compile
step writes its object file into the build folder)."""


def skip_cpu_shm_op() -> None:
    """One CPU process has no peer to share memory with: tell DeepSpeed its CPU shared-memory all-reduce op
    is unavailable, so its first init does not JIT-compile it (minutes under load) and no killed
    run can leave that build's lock behind for every later run to wait on."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[SHM_OP_NAME] = False


def extension_build_dir(name: str) -> Path:
    """The folder torch's JIT extension builder uses for `name` (`TORCH_EXTENSIONS_DIR` or its default)."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    tag = f"py{sys.version_info.major}{sys.version_info.minor}_" + (
        f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu")
    return Path(root) / tag / name


def remove_stale_build_lock(name: str, *, stale_after_s: float = STALE_BUILD_S) -> bool:
    """torch's extension builder marks a build with a `lock` file and makes every other process wait (forever)
    until it is gone; a build killed midway leaves it behind. Remove it when nothing in the build folder changed
    for `stale_after_s`; returns whether a lock was removed."""
    folder = extension_build_dir(name)
    lock = folder / "lock"
    try:
        newest = max(f.stat().st_mtime for f in folder.iterdir())
    except (FileNotFoundError, ValueError):
        return False
    if not lock.exists() or time.time() - newest < stale_after_s:
        return False
    log.warning("%s: removing the lock of a build that stopped %.0f min ago (a killed run's)", lock,
                (time.time() - newest) / 60)
    lock.unlink(missing_ok=True)
    return True


def _dist() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    """This process's rank (from the launcher's RANK before the process group exists)."""
    return torch.distributed.get_rank() if _dist() else int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return torch.distributed.get_world_size() if _dist() else int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if _dist() and world_size() > 1:
        torch.distributed.barrier()


def _comm_device() -> torch.device:
    # nccl only moves CUDA tensors; gloo only CPU ones
    if _dist() and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Element-wise sum or max of `values` over the ranks (float64), returned on every rank."""
    if not (_dist() and world_size() > 1) or not values:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM)
    return t.cpu().tolist()


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj` in rank order (pickled in memory between our own processes, never read from disk)."""
    if not (_dist() and world_size() > 1):
        return [obj]
    out: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank."""
    if not (_dist() and world_size() > 1):
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=src)
    return box[0]


class StoreBoard:
    """`checkpoint.StatusBoard` on the process group's rendezvous store (the key-value server every rank
    already talks to). Its messages are not collectives: a rank's report never pairs up with a collective
    another rank waits in."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def post(self, key: str, value: str) -> None:
        self._store.set(key, value)

    def read(self, keys: Sequence[str], timeout_s: float) -> list[str | None]:
        try:
            self._store.wait(list(keys), timedelta(seconds=timeout_s))
        except torch.distributed.DistStoreError:  # not all posted in time: read those that are
            pass
        return [self._store.get(k).decode() if self._store.check([k]) else None for k in keys]


def checkpoint_ranks(timeout_s: float = ckpt.SAVE_TIMEOUT_S) -> ckpt.Ranks:
    """How `checkpoint.save_checkpoint` reaches the other ranks: this process's rank, rank 0's broadcast and
    reports on the rendezvous store (a single process: none)."""
    if not (_dist() and world_size() > 1):
        return ckpt.Ranks()
    # The store the group was built on; torch exposes it only under this name (there since torch 1.8).
    from torch.distributed.distributed_c10d import _get_default_store

    return ckpt.Ranks(rank(), world_size(), broadcast_object, board=StoreBoard(_get_default_store()),
                      timeout_s=timeout_s)


def deepspeed_config(ds: DeepSpeedConfig, optim: OptimConfig, *, bf16: bool = False) -> dict[str, Any]:
    """The DeepSpeed config dict. Micro-batch size 1 / accumulation 1 are nominal: the trainer owns the
    micro-batching and marks the accumulation boundary itself. `bf16`: the model is bf16 (DeepSpeed's bf16 mode:
    float32 master weights and moments)."""
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": optim.grad_clip,
        "zero_optimization": {"stage": ds.zero_stage},
        "bf16": {"enabled": bf16},
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

        init_distributed(next(model.parameters()).device)
        # A bf16 model trains through DeepSpeed's bf16 optimiser (float32 master weights and moments); torch
        # AdamW straight on bf16 weights would round small updates away.
        bf16_model = any(p.dtype == torch.bfloat16 for p in model.parameters() if p.requires_grad)
        self.config = deepspeed_config(ds, optim, bf16=bf16_model)
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=_adamw(model, optim, lr),
                                                       config=self.config)
        self.engine = engine
        self.optimizer = optimizer
        self.module = engine.module
        self.zero_stage = ds.zero_stage
        self._tally = RoundingTally()
        self._dither_masters()

    def low_precision_stats(self) -> dict[str, float]:
        return self._tally.take()

    def backward(self, loss: torch.Tensor, *, is_last: bool) -> None:
        # DeepSpeed's own forward() opens each micro-step (ZeRO counts them to accumulate rather than overwrite
        # the previous micro-batch's gradient); we call the module directly, so open it here, before backward.
        from deepspeed.runtime.base_optimizer import ZeROOptimizer

        if isinstance(self.engine.optimizer, ZeROOptimizer):
            self.engine.optimizer.clear_backward_seen_flag()
        # The boundary tells DeepSpeed when to reduce gradients across ranks (only on the last micro-batch).
        self.engine.set_gradient_accumulation_boundary(is_last)
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        self.engine.set_gradient_accumulation_boundary(True)
        # ZeRO-0 with a client optimiser does not report the norm; the full gradients are local there.
        local = _grad_norm(self.module) if self.zero_stage == 0 else None
        lows = [low for low, _ in self.master_pairs()]
        # a strided sample of each weight, not a copy of the model: a 7B model's copy would be 14 GB per step
        before = [tally_sample(low).clone() for low in lows]
        self.engine.step()
        for low, old in zip(lows, before, strict=True):
            self._tally.add(old, tally_sample(low))
        norm = self.engine.get_global_grad_norm()
        self.engine.zero_grad()
        if norm is None:
            norm = local
        if norm is not None and not self.engine.fp16_enabled():  # fp16's loss scaler skips overflowing steps itself
            require_finite(float(norm), "the gradient norm")  # global: every rank stops alike
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

    def reset_optimizer_state(self) -> None:
        inner = innermost_optimizer(self.optimizer)
        if inner is None:
            raise RuntimeError(f"cannot find the torch optimiser inside {type(self.optimizer).__name__} to reset")
        inner.state.clear()

    def full_weights(self) -> contextlib.AbstractContextManager[None]:
        """ZeRO-3: all parameters gathered on every rank and the partitioning hooks lifted for the duration,
        so forward passes are local (their number may differ by rank); collective to enter. Otherwise a no-op."""
        if self.zero_stage < 3:
            return contextlib.nullcontext()
        return self._unwrapped()

    @contextlib.contextmanager
    def _unwrapped(self) -> Iterator[None]:
        from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation

        with torch.no_grad(), unwrap_model_for_generation(self.engine):
            yield

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """ZeRO-3: the consolidated weights on rank 0 (None elsewhere), gathered one layer at a time;
        every rank must call it. Below ZeRO-3: None (the module's state_dict is already complete)."""
        if self.zero_stage < 3:
            return None
        return self.engine._zero3_consolidated_16bit_state_dict()

    def load_full_state_dict(self, state: dict[str, torch.Tensor], *, strict_keys: bool = True) -> Any:
        """Write full weights into the live module (in place, so the optimiser keeps its parameters), then
        refresh the optimiser's fp32 master copy (ZeRO-1/2/3, bf16) or the next step would undo the load."""
        if self.zero_stage == 3:
            import deepspeed

            named = dict(self.module.named_parameters())
            buffers = dict(self.module.named_buffers())
            result = _LoadResult([k for k in named if k not in state],
                                 [k for k in state if k not in named and k not in buffers])
            for name, param in named.items():
                if name not in state:
                    continue
                with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                    if rank() == 0:
                        param.data.copy_(state[name].to(param.dtype))
        else:
            result = self.module.load_state_dict(state, strict=False)
        self.refresh_masters()
        return result

    def refresh_masters(self) -> None:
        """The module's weights were written from outside: the optimiser's fp32 master copy (ZeRO-1/2/3, bf16)
        starts from them (dithered), or the next step would undo the load."""
        refresh = getattr(self.optimizer, "refresh_fp32_params", None)
        if callable(refresh):
            refresh()
            self._dither_masters()

    def master_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(low-precision weight, float32 master) of DeepSpeed's unpartitioned mixed-precision optimiser (ZeRO-0:
        `fp16_groups` / `fp32_groups`, bf16 included); [] where the masters are flat partitions (ZeRO >= 1)."""
        lows, highs = getattr(self.optimizer, "fp16_groups", None), getattr(self.optimizer, "fp32_groups", None)
        if not lows or not highs:
            return []
        return [(low, high) for low_group, high_group in zip(lows, highs, strict=True)
                for low, high in zip(low_group, high_group, strict=True) if is_low_precision(low.dtype)]

    def _dither_masters(self) -> None:
        pairs = self.master_pairs()
        if pairs:
            dither_masters(pairs)
        elif any(is_low_precision(p.dtype) for p in self.module.parameters() if p.requires_grad):
            log.info("master weights are not dithered: DeepSpeed keeps this run's master weights in flat partitions "
                       "(ZeRO >= 1); they stay where DeepSpeed copied them")


class _LoadResult:
    """The two lists `nn.Module.load_state_dict` reports, for the ZeRO-3 path."""

    def __init__(self, missing_keys: list[str], unexpected_keys: list[str]) -> None:
        self.missing_keys = missing_keys
        self.unexpected_keys = unexpected_keys


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
