"""Atomic, resumable checkpoints.

Layout of one checkpoint (`<output_dir>/checkpoints/step_000010/`)::

    model/               save_pretrained: safetensors weights (or the LoRA adapter) + config + tokenizer
    trainer_state.pt     optimiser state, RNG states (python, numpy, torch, sampler), step, task cursor: tensors
                         and plain data only, read with torch.load(weights_only=True)
    deepspeed/           the DeepSpeed engine checkpoint (only with ZeRO stage > 0)
    config.yaml          the resolved run config
    COMPLETE             written last; a folder without it is not a checkpoint

A checkpoint is written into a hidden temporary folder, every file is fsync'ed, and the folder is renamed
into place: a crash (even kill -9) mid-write leaves the previous checkpoint untouched and at most a stray
temporary folder, which the next save removes. `latest_checkpoint` picks the highest complete step.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "CheckpointError",
    "TrainerState",
    "capture_rng",
    "restore_rng",
    "save_checkpoint",
    "load_trainer_state",
    "latest_checkpoint",
    "list_checkpoints",
    "prune_checkpoints",
]

COMPLETE = "COMPLETE"
STATE_FILE = "trainer_state.pt"
_PREFIX = "step_"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (missing or corrupt files), with the path and the reason."""


@dataclass
class TrainerState:
    """What the loop needs to continue exactly. `task_cursor` counts training tasks handed out so far;
    `warm_start_done` is True once the supervised stage finished (it is then skipped on resume)."""

    step: int
    task_cursor: int
    warm_start_done: bool
    engine: dict[str, Any]
    rng: dict[str, Any]
    extra: dict[str, Any]


def capture_rng(sampler_state: torch.Tensor | None = None) -> dict[str, Any]:
    """Every RNG state as tensors and plain data (what `torch.load(weights_only=True)` reads back)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    numpy_state = {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                   "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if sampler_state is not None:
        state["sampler"] = sampler_state
    return state


def restore_rng(state: dict[str, Any]) -> torch.Tensor | None:
    """Restore global RNGs; returns the sampler's generator state (if saved) for the policy to load."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    return state.get("sampler")


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    checkpoints_dir: str | os.PathLike[str],
    state: TrainerState,
    *,
    save_model: Callable[[Path], None],
    config_yaml: str,
    save_extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write a checkpoint for `state.step` atomically; returns its folder.

    `save_model(folder)` writes the weights (save_pretrained); `save_extra(folder)` may add files
    (e.g. the DeepSpeed engine checkpoint) before the folder is sealed.
    """
    root = Path(checkpoints_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".tmp-{_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)  # left by a crash during an earlier save
    final = root / f"{_PREFIX}{state.step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
    try:
        save_model(tmp / "model")
        torch.save({
            "step": state.step, "task_cursor": state.task_cursor, "warm_start_done": state.warm_start_done,
            "engine": state.engine, "rng": state.rng, "extra": state.extra,
        }, tmp / STATE_FILE)
        (tmp / "config.yaml").write_text(config_yaml, encoding="utf-8")
        if save_extra is not None:
            save_extra(tmp)
        (tmp / COMPLETE).write_text(json.dumps({"step": state.step}), encoding="utf-8")
        _fsync_tree(tmp)
        if final.exists():  # a re-save of the same step (resume replayed it): replace
            shutil.rmtree(final)
        os.rename(tmp, final)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def list_checkpoints(checkpoints_dir: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"{_PREFIX}*") if p.is_dir() and (p / COMPLETE).is_file()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(checkpoints_dir: str | os.PathLike[str]) -> Path | None:
    found = list_checkpoints(checkpoints_dir)
    return found[-1] if found else None


def prune_checkpoints(checkpoints_dir: str | os.PathLike[str], keep: int) -> None:
    for old in list_checkpoints(checkpoints_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_trainer_state(folder: str | os.PathLike[str]) -> TrainerState:
    """Read and check a checkpoint's trainer state; a missing or unreadable file is a CheckpointError."""
    folder = Path(folder)
    if not (folder / COMPLETE).is_file():
        raise CheckpointError(f"{folder} is not a complete checkpoint (no {COMPLETE} marker)")
    if not (folder / "model").is_dir():
        raise CheckpointError(f"checkpoint {folder} is corrupt: the model/ folder is missing")
    try:
        # Tensors and plain data only: a pickle that would construct arbitrary objects (and so run code) is
        # refused before anything in it executes.
        data = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"checkpoint {folder}: {STATE_FILE} holds more than tensors and plain data; refusing "
                              f"to load it (a checkpoint must never run code): {str(exc).splitlines()[0]}") from exc
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {folder} is corrupt: cannot read {STATE_FILE} ({exc})") from exc
    missing = {"step", "task_cursor", "warm_start_done", "engine", "rng"} - set(data if isinstance(data, dict) else ())
    if missing:
        raise CheckpointError(f"checkpoint {folder} is corrupt: {STATE_FILE} lacks {sorted(missing)}")
    return TrainerState(step=int(data["step"]), task_cursor=int(data["task_cursor"]),
                        warm_start_done=bool(data["warm_start_done"]), engine=data["engine"], rng=data["rng"],
                        extra=data.get("extra", {}))
