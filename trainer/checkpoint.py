"""Atomic, resumable checkpoints.

Layout of one checkpoint (`<output_dir>/checkpoints/step_000010/`)::

    model/               save_pretrained: safetensors weights (or the LoRA adapter) + config + tokenizer
    trainer_state.pt     optimiser state, RNG states (python, numpy, torch, sampler), step, task cursor: tensors
                         and plain data only, read with torch.load(weights_only=True)
    deepspeed/           the DeepSpeed engine checkpoint (only with ZeRO stage > 0; every rank writes its shards)
    config.yaml          the resolved run config
    MANIFEST.json        every other file with its size, and the SHA-256 of each file that is unpickled on load
    COMPLETE             written last; a folder without it is not a checkpoint

A checkpoint is written into a hidden temporary folder, every file is fsync'ed, and the folder is renamed
into place: a crash (even kill -9) mid-write leaves the previous checkpoint untouched and at most a stray
temporary folder, which the next save removes. `latest_checkpoint` picks the highest complete step.
A save that runs out of space removes its temporary folder and raises `OSError(ENOSPC)` naming the folder,
whatever the writing library raised (safetensors and torch.save wrap or lose the errno).

Several processes (data parallel): `save_checkpoint` is collective. Rank 0 picks the temporary folder and
tells the others, every rank writes its part (`save_model` gathers ZeRO-3 weights, `save_extra` writes the
DeepSpeed shards), a barrier, then rank 0 alone writes the trainer state (with every rank's RNG state), the
manifest and the marker and renames; a last barrier keeps any rank from moving on before the checkpoint is
in place. The output folder must be one filesystem that all ranks see.

What is trusted on resume: our own `trainer_state.pt` is read with `torch.load(weights_only=True)` (tensors
and plain data; anything else is refused) and the weights are safetensors. DeepSpeed's ZeRO > 0 files
(`deepspeed/`) are full pickles that DeepSpeed loads with `weights_only=False`, i.e. loading one can run
code. So before DeepSpeed reads anything, `verify_manifest` requires our manifest, refuses a file it does
not list, and checks sizes and the SHA-256 of those pickles: a folder that is not one of our checkpoints,
or one changed after it was written, is refused. The manifest is no signature: a checkpoint folder is
trusted exactly as much as whoever can write to it.
"""

from __future__ import annotations

import errno
import hashlib
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

from agentgym_opsd.files import is_disk_full

__all__ = [
    "CheckpointError",
    "RUN_MARKERS",
    "check_run_folder",
    "TrainerState",
    "capture_rng",
    "restore_rng",
    "save_checkpoint",
    "load_trainer_state",
    "latest_checkpoint",
    "list_checkpoints",
    "prune_checkpoints",
    "verify_manifest",
    "Ranks",
    "MANIFEST",
]

COMPLETE = "COMPLETE"
STATE_FILE = "trainer_state.pt"
MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = "agentgym-opsd-checkpoint"
_PREFIX = "step_"
_PICKLED_UNDER = ("deepspeed/",)  # loaded by DeepSpeed with weights_only=False: hashed and checked


@dataclass(frozen=True)
class Ranks:
    """How a collective save talks to the other processes (a single process needs none of it)."""

    rank: int = 0
    barrier: Callable[[], None] = lambda: None
    broadcast: Callable[[Any], Any] = lambda obj: obj  # rank 0's value, on every rank


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (missing or corrupt files), with the path and the reason."""


RUN_MARKERS = ("config.yaml", "metrics.jsonl", "checkpoints", "warm_start")
"""What every run folder holds from its first seconds on (the trainer writes config.yaml before anything else)."""


def check_run_folder(folder: Path) -> None:
    """A run writes into a new or empty folder, or into one of our runs (resume, or a fresh start that sets the
    old metrics aside); a folder holding anything else is refused before a file in it is touched, so a typo
    in `trainer.output_dir` cannot overwrite someone's `config.yaml`. Hidden files (.gitkeep) do not count."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise ValueError(f"trainer.output_dir: {folder} is a file, not a folder")
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    if names and not any(name in RUN_MARKERS for name in names):
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise ValueError(f"trainer.output_dir: {folder} holds files that are not a training run ({shown}); "
                         "choose a new or empty folder, or the folder of an earlier run")


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
    world_size: int = 1
    rank_rng: list[dict[str, Any]] | None = None  # every rank's RNG states, in rank order (data parallel)


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


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _hashed(rel: str) -> bool:
    return rel == STATE_FILE or rel.startswith(_PICKLED_UNDER)


def write_manifest(folder: Path, step: int, world_size: int) -> None:
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel in (MANIFEST, COMPLETE):
            continue
        entry: dict[str, Any] = {"bytes": path.stat().st_size}
        if _hashed(rel):
            entry["sha256"] = _sha256(path)
        files[rel] = entry
    (folder / MANIFEST).write_text(json.dumps({"format": MANIFEST_FORMAT, "version": 1, "step": step,
                                               "world_size": world_size, "files": files}, indent=1),
                                   encoding="utf-8")


def verify_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Check a checkpoint against its manifest before anything in it is unpickled; returns the manifest.

    A CheckpointError when the manifest is missing or not ours, when a file is not listed (or a listed one
    is missing), or when a size or a SHA-256 differs."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"checkpoint {folder} has no {MANIFEST}: not written by this trainer (or by a version "
                              "before manifests); refusing to let DeepSpeed unpickle its files")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        listed = manifest["files"]
        ok = manifest.get("format") == MANIFEST_FORMAT and isinstance(listed, dict)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {folder}: unreadable {MANIFEST} ({exc})") from exc
    if not ok:
        raise CheckpointError(f"checkpoint {folder}: {MANIFEST} is not an agentgym-opsd checkpoint manifest")
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {MANIFEST, COMPLETE}
    extra = sorted(present - set(listed))
    if extra:
        raise CheckpointError(f"checkpoint {folder} holds files its manifest does not list: {extra[:5]}; refusing "
                              "to load it")
    missing = sorted(set(listed) - present)
    if missing:
        raise CheckpointError(f"checkpoint {folder} is corrupt: files in its manifest are missing: {missing[:5]}")
    for rel, entry in listed.items():
        target = folder / rel
        if target.stat().st_size != entry.get("bytes"):
            raise CheckpointError(f"checkpoint {folder}: {rel} changed after it was written (size differs from "
                                  f"the manifest); refusing to load it")
        if _hashed(rel) and entry.get("sha256") != _sha256(target):
            raise CheckpointError(f"checkpoint {folder}: {rel} changed after it was written (SHA-256 differs from "
                                  f"the manifest); refusing to load it")
    return manifest


def save_checkpoint(
    checkpoints_dir: str | os.PathLike[str],
    state: TrainerState,
    *,
    save_model: Callable[[Path], None],
    config_yaml: str,
    save_extra: Callable[[Path], None] | None = None,
    ranks: Ranks | None = None,
) -> Path:
    """Write a checkpoint for `state.step` atomically; returns its folder.

    `save_model(folder)` writes the weights (save_pretrained); `save_extra(folder)` may add files
    (e.g. the DeepSpeed engine checkpoint) before the folder is sealed. With `ranks` every process calls
    this (both callbacks run on every rank; rank 0 writes the rest), see the module docstring.
    """
    ranks = ranks or Ranks()
    main = ranks.rank == 0
    root = Path(checkpoints_dir)
    final = root / f"{_PREFIX}{state.step:06d}"
    tmp_name = None
    if main:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f".tmp-{_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a crash during an earlier save
        tmp_name = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root)).name
    tmp = root / ranks.broadcast(tmp_name)
    try:
        save_model(tmp / "model")
        if save_extra is not None:
            save_extra(tmp)
        if main:
            with (tmp / STATE_FILE).open("wb") as fh:  # a file object: a full disk stays an OSError in the chain
                torch.save({
                    "step": state.step, "task_cursor": state.task_cursor, "warm_start_done": state.warm_start_done,
                    "engine": state.engine, "rng": state.rng, "extra": state.extra, "world_size": state.world_size,
                    "rank_rng": state.rank_rng,
                }, fh)
            (tmp / "config.yaml").write_text(config_yaml, encoding="utf-8")
        ranks.barrier()  # every rank's files are on disk
        if main:
            write_manifest(tmp, state.step, state.world_size)
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
    except Exception as exc:
        plain = isinstance(exc, OSError) and exc.errno == errno.ENOSPC
        if not plain and is_disk_full(exc, tmp if tmp.exists() else root):  # before the temporary folder is freed
            detail = " ".join(str(exc).split())[:200]
            raise OSError(errno.ENOSPC, f"No space left on device while writing checkpoint {final.name} "
                          f"({type(exc).__name__}: {detail})", str(final)) from exc
        raise
    finally:
        if main and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    ranks.barrier()  # nobody moves on (or prunes, or resumes) before the checkpoint is in place
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
                        extra=data.get("extra", {}), world_size=int(data.get("world_size", 1)),
                        rank_rng=data.get("rank_rng"))
