"""Atomic, resumable checkpoints: `save_checkpoint`, `resume_point`, `verify_manifest`, `prune_checkpoints`.

`checkpoints/step_NNNNNN/` holds `model/` (save_pretrained), `trainer_state.pt` (optimiser and RNG states, step,
task cursor), `deepspeed/` (ZeRO > 0 only), `config.yaml`, `MANIFEST.json` (every other file's size and SHA-256)
and `COMPLETE`, written last. It is written in a hidden temporary folder, fsync'ed and renamed into place, so a
crash leaves the previous checkpoint intact; a full disk is raised as `OSError(ENOSPC)` naming the checkpoint.
With several ranks (one filesystem all of them see) the save is collective: each rank writes its part and reports
on a status board (`Ranks.board`); rank 0 commits only when all succeeded, else every rank raises the same
`CheckpointSaveError` and nothing is put in place. Every resume verifies the manifest before anything is read, as
DeepSpeed's files are pickles that can run code (`trainer_state.pt` is read with `weights_only=True`); the manifest
is no signature. `--resume auto` takes the newest intact checkpoint; pruning keeps the `keep` newest that verify.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import json
import logging
import math
import os
import pickle
import random
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from agentgym_opsd.files import is_disk_full, make_tmp_dir, publish_dir, remove_path, to_json
from agentgym_opsd.outputs import OWNER_FILE, OutputFolder, OutputRefused, claim_folder

log = logging.getLogger(__name__)

__all__ = [
    "CheckpointError",
    "CheckpointSaveError",
    "RUN_CORE",
    "claim_run_folder",
    "is_legacy_run",
    "is_run_entry",
    "RUN_ENTRIES",
    "TrainerState",
    "capture_rng",
    "restore_rng",
    "save_checkpoint",
    "load_trainer_state",
    "latest_checkpoint",
    "list_checkpoints",
    "prune_checkpoints",
    "resume_point",
    "verify_manifest",
    "Ranks",
    "REPORT_GRACE_S",
    "SAVE_TIMEOUT_S",
    "StatusBoard",
    "MANIFEST",
]

COMPLETE = "COMPLETE"
STATE_FILE = "trainer_state.pt"
MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = "agentgym-opsd-checkpoint"
MANIFEST_VERSION = 2
"""Version 2 hashes every file; version 1 hashed only the files that are unpickled on load (trainer_state.pt and
DeepSpeed's), so its weights are checked by size and, once loaded, for non-finite values."""
_PREFIX = "step_"
_V1_HASHED_UNDER = ("deepspeed/",)


SAVE_TIMEOUT_S = 1800.0
"""How long a rank waits for another's report during a save before naming it silent: torch's default
process-group timeout, so a save waits no longer than a collective would."""

REPORT_GRACE_S = 10.0
"""How long a rank that is leaving a failed save waits for the others to read its report (it may host the
board), at most: it must leave soon, since its exit is what releases a rank blocked in a collective with it."""


class StatusBoard(Protocol):
    """Messages between the ranks of a save, outside the sequence of collectives: a rank can report a failure
    while the others wait in a collective it will never join, and reading never pairs up with a collective
    of another rank. The trainer's is `engine.StoreBoard` (the rendezvous store)."""

    def post(self, key: str, value: str) -> None:
        """Publish `value` under `key` to every rank."""
        ...

    def read(self, keys: Sequence[str], timeout_s: float) -> list[str | None]:
        """The values under `keys`, waiting up to `timeout_s` for all of them; None for a key not posted by then."""
        ...


@dataclass(frozen=True)
class Ranks:
    """How a collective save talks to the other processes (a single process needs none of it)."""

    rank: int = 0
    world_size: int = 1
    broadcast: Callable[[Any], Any] = lambda obj: obj
    """Rank 0's value, on every rank (a collective: all ranks call it together, at the start of the save)."""
    board: StatusBoard | None = None
    """Where each rank reports how its part went; required with more than one rank."""
    timeout_s: float = SAVE_TIMEOUT_S
    """Seconds to wait for another rank's report before naming it as silent."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"Ranks: rank {self.rank} is not one of 0..{self.world_size - 1} (world_size "
                             f"{self.world_size})")
        if self.world_size > 1 and self.board is None:
            raise ValueError(f"Ranks: a save over {self.world_size} processes needs a board to report on "
                             "(engine.checkpoint_ranks() gives the trainer's)")
        if not 0 < self.timeout_s < math.inf:
            raise ValueError(f"Ranks.timeout_s must be a finite number of seconds > 0, got {self.timeout_s!r}")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (missing or corrupt files), with the path and the reason."""


class CheckpointSaveError(RuntimeError):
    """A save over several processes that failed on some rank, raised on every rank alike. `failed` maps
    each rank that failed (or stayed silent) to why, the one that failed first first; the message names them
    and the checkpoint that is still the latest. Nothing was put in place."""

    def __init__(self, message: str, failed: dict[int, str]) -> None:
        super().__init__(message)
        self.failed = failed


def saved_precision(checkpoint: Path) -> str | None:
    """The `model.precision` a checkpoint's run computed with (its config.yaml; a run from before the field:
    `bf16-mixed` where its `model.dtype` was bfloat16, else `fp32`), None where the checkpoint has no config.yaml."""
    import yaml

    path = checkpoint / "config.yaml"
    if not path.is_file():
        return None
    model = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("model") or {}
    if "precision" in model:
        return str(model["precision"])
    return "bf16-mixed" if model.get("dtype") == "bfloat16" else "fp32"


RUN_ENTRIES = ("config.yaml", "metrics.jsonl", "metrics.[0-9]*-[0-9]*.jsonl", "training_curves.png", "checkpoints",
               "warm_start", "trajectories", "credit", "validation", "tensorboard", "wandb", "wandb_run_id", "mlruns",
               "mlflow_run_id", "vllm_init_model", OWNER_FILE)
"""Every name a run may write at the top of its folder (glob patterns; `metrics.<time>.jsonl` is an earlier
metrics log set aside). A run records the ones it wrote in its owner record (`agentgym_opsd.outputs`), and
`trainer.overwrite=true` deletes those and nothing else. A writer that adds a name adds it here
(`tests/test_run_folder.py` checks a run's folder against this list)."""

RUN_CORE = ("config.yaml", "metrics.jsonl", "checkpoints")
"""The entries that make a folder hold a run (one of them recorded as the run's)."""


_TMP_NAME = re.compile(r"\.(?P<name>.+)\.\d+\.[0-9a-f]{8}\.tmp")


def is_run_entry(name: str) -> bool:
    """True for a name the run writes (`RUN_ENTRIES`), or the temporary `.NAME.PID.ID.tmp` of one (a writer
    killed mid-write leaves it; `files._tmp_path`)."""
    if tmp := _TMP_NAME.fullmatch(name):
        name = tmp["name"]
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in RUN_ENTRIES)


def is_legacy_run(folder: Path) -> bool:
    """A run written before owner records: its config.yaml beside its checkpoints or its metrics log (a
    config.yaml alone is anybody's)."""
    return (folder / "config.yaml").is_file() and ((folder / "checkpoints").is_dir()
                                                   or (folder / "metrics.jsonl").is_file())


def claim_run_folder(folder: Path, *, resume: bool, overwrite: bool, force: bool = False,
                     writer: bool = True) -> OutputFolder:
    """The output folder of a run, under the output rule (`agentgym_opsd.outputs.claim_folder`): new, empty, or a
    run's (its owner record says `train`; a run from before owner records is recognised by `is_legacy_run`);
    anything else is refused naming what is there, unless `force` (`--force`: the files there are kept, and are
    never taken for the run's). A fresh run (not `resume`) in a folder that holds a run is refused (the message
    names the ways on) unless `overwrite`; then (`writer`: the rank that writes) the old run's recorded entries
    are deleted, and nothing else: what is kept is named in the log. ValueError naming trainer.output_dir."""
    try:
        out = claim_folder(folder, "train", force=force, legacy=is_legacy_run, is_own=is_run_entry,
                           will_write=("config.yaml", "metrics.jsonl"))
    except OutputRefused as exc:
        raise ValueError(f"trainer.output_dir: {exc}") from None
    holds = sorted(set(RUN_CORE) & out.entries)
    if not resume and holds:
        if not overwrite:
            raise ValueError(f"trainer.output_dir: {folder} already holds a training run ({', '.join(holds)}); a new "
                             "run would replace it. Continue it with --resume auto, choose another "
                             "trainer.output_dir, or pass trainer.overwrite=true to delete it and start over")
        if writer:
            for entry in out.path.iterdir():  # writers of the old run killed mid-write
                if _TMP_NAME.fullmatch(entry.name) and is_run_entry(entry.name):
                    remove_path(entry)
            kept = out.clear()
            log.warning("trainer.overwrite: deleted the old run in %s; kept what it did not write: %s", folder,
                        ", ".join(kept) or "nothing")
    if writer:
        out.record(out.entries)  # the owner record, from the first moment on
    return out


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


def write_manifest(folder: Path, step: int, world_size: int, *, marker: str = COMPLETE) -> None:
    """`MANIFEST.json`: every file under `folder` (but itself and `marker`, written after it) with its size and
    SHA-256."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel not in (MANIFEST, marker):
            files[rel] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    (folder / MANIFEST).write_text(to_json({"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "step": step,
                                            "world_size": world_size, "files": files}, indent=1),
                                   encoding="utf-8")


def verify_manifest(folder: str | os.PathLike[str], *, marker: str = COMPLETE) -> dict[str, Any]:
    """Check a checkpoint (or another folder sealed by `write_manifest` and `marker`) against its manifest before
    anything in it is read; returns the manifest.

    A CheckpointError naming the folder and the file when the folder is not complete, the manifest is missing or
    not ours, a file is not listed (or a listed one is missing), or a size or a SHA-256 differs."""
    folder = Path(folder)
    if not (folder / marker).is_file():
        raise CheckpointError(f"{folder} is not a complete checkpoint (no {marker} marker)")
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"checkpoint {folder} is corrupt: it has no {MANIFEST}, so its files cannot be "
                              "checked (deleted, or not written by this trainer)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        listed = manifest["files"]
        version = manifest.get("version")
        ok = manifest.get("format") == MANIFEST_FORMAT and isinstance(listed, dict) and version in (1, 2)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"checkpoint {folder} is corrupt: unreadable {MANIFEST} ({exc})") from exc
    if not ok:
        raise CheckpointError(f"checkpoint {folder} is corrupt: {MANIFEST} is not an agentgym-opsd checkpoint "
                              "manifest")
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {MANIFEST, marker}
    extra = sorted(present - set(listed))
    if extra:
        raise CheckpointError(f"checkpoint {folder} holds files its manifest does not list: {extra[:5]}; refusing "
                              "to load it")
    missing = sorted(set(listed) - present)
    if missing:
        raise CheckpointError(f"checkpoint {folder} is corrupt: files in its manifest are missing: {missing[:5]}")
    for rel, entry in listed.items():
        target = folder / rel
        if not isinstance(entry, dict) or target.stat().st_size != entry.get("bytes"):
            raise CheckpointError(f"checkpoint {folder} is corrupt: {rel} changed after it was written (its size "
                                  "differs from the manifest)")
        hashed = version == 2 or rel == STATE_FILE or rel.startswith(_V1_HASHED_UNDER)
        if hashed and entry.get("sha256") != _sha256(target):
            raise CheckpointError(f"checkpoint {folder} is corrupt: {rel} changed after it was written (its SHA-256 "
                                  "differs from the manifest)")
    if version == 1:
        log.warning("checkpoint %s was written before every file was hashed: its weights are checked by size and "
                    "for non-finite values only", folder)
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
    this (both callbacks run on every rank; rank 0 writes the rest), see the module docstring; a failure on
    any rank is then a `CheckpointSaveError` on every rank.
    """
    ranks = ranks or Ranks()
    main = ranks.rank == 0
    root = Path(checkpoints_dir)
    final = root / f"{_PREFIX}{state.step:06d}"
    tmp = root / _begin(ranks, root, final)

    def write_part() -> None:
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

    def commit() -> None:  # rank 0, once every part is on disk
        write_manifest(tmp, state.step, state.world_size)
        (tmp / COMPLETE).write_text(to_json({"step": state.step}), encoding="utf-8")
        _fsync_tree(tmp)
        publish_dir(tmp, final)  # a re-save of the same step (resume replayed it) replaces the folder
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    try:
        if ranks.world_size == 1:
            _naming_a_full_disk(write_part, tmp, final)
            _naming_a_full_disk(commit, tmp, final)
        else:
            _save_together(ranks, tmp, final, write_part, commit)
    finally:
        if main and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _begin(ranks: Ranks, root: Path, final: Path) -> str:
    """Rank 0 removes what crashed saves left and makes the temporary folder; every rank gets its name, or
    raises (CheckpointSaveError with several ranks) when rank 0 could not make it."""
    made: tuple[str | None, str | None] = (None, None)  # (the folder's name, why there is none)
    error = None
    if ranks.rank == 0:
        try:
            made = (make_tmp_dir(final).name, None)  # first removes what crashed saves left
        except OSError as exc:
            error, made = exc, (None, _describe(exc))
    name, why = ranks.broadcast(made)  # every rank is here: nobody waits in another collective
    if why is None:
        return name
    if error is not None and ranks.world_size == 1:
        raise error
    raise CheckpointSaveError(f"checkpoint {final.name} was not saved: rank 0 could not create its folder in {root} "
                              f"({why})", {0: why}) from error


def _naming_a_full_disk(work: Callable[[], None], tmp: Path, final: Path) -> None:
    """Run `work`; a full disk, however the writing library reported it (safetensors and torch.save wrap or
    lose the errno), is raised as OSError(ENOSPC) naming the checkpoint."""
    try:
        work()
    except Exception as exc:
        plain = isinstance(exc, OSError) and exc.errno == errno.ENOSPC
        if not plain and is_disk_full(exc, tmp if tmp.exists() else tmp.parent):  # before the folder is freed
            detail = " ".join(str(exc).split())[:200]
            raise OSError(errno.ENOSPC, f"No space left on device while writing checkpoint {final.name} "
                          f"({type(exc).__name__}: {detail})", str(final)) from exc
        raise


def _outcome(work: Callable[[], None], tmp: Path, final: Path) -> Exception | None:
    """`work`'s exception (see `_naming_a_full_disk`), or None when it succeeded."""
    try:
        _naming_a_full_disk(work, tmp, final)
    except Exception as exc:  # reported to every rank, then raised on every rank
        return exc
    return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


_Failures = dict[int, tuple[float, str]]
"""rank -> (when it failed, as time.time(); inf for a rank that never reported, why)."""


def _report(why: str | None, at: float, failed: _Failures | None = None) -> str:
    """A rank's report: success (`why` None) or why it failed, and when (to tell which rank failed first);
    `failed`, when the failure is other ranks' (rank 0 did not commit because of them)."""
    return json.dumps({"ok": why is None, "why": why, "at": at, "failed": failed})


def _failures(board: StatusBoard, keys: dict[int, str], timeout_s: float, *, silent_fails: bool = True) -> _Failures:
    """Read the reports under `keys` (rank -> key): the ranks that failed, and (`silent_fails`) those that did
    not report within `timeout_s` or could not be read. Empty: all that reported succeeded."""
    try:
        values = board.read(list(keys.values()), timeout_s)
    except (RuntimeError, OSError) as exc:  # the board itself is gone (the process that hosts it died)
        why = f"its report could not be read, the ranks lost contact ({_describe(exc)})"
        return {r: (math.inf, why) for r in keys} if silent_fails else {}
    failed = {}
    for r, value in zip(keys, values, strict=True):
        if value is None:
            if silent_fails:
                failed[r] = (math.inf, f"did not report within {timeout_s:g} s (hung, or killed)")
        elif (report := json.loads(value))["failed"]:  # the reporter failed because of these ranks
            failed.update({int(k): (float(at), str(why)) for k, (at, why) in report["failed"].items()})
        elif not report["ok"]:
            failed[r] = (float(report["at"]), str(report["why"]))
    return failed


def _post(board: StatusBoard, key: str, value: str) -> None:
    """Post, or log why not: a board that is gone (its host died) is reported by the reads that follow."""
    try:
        board.post(key, value)
    except (RuntimeError, OSError) as exc:
        log.warning("checkpoint: could not post %s (%s)", key, _describe(exc))


def _summary(failed: _Failures) -> str:
    (first, (_, why)), *rest = sorted(failed.items(), key=lambda item: item[1][0])
    return f"rank {first} failed first ({why})" + "".join(f"; then rank {r} ({why})" for r, (_, why) in rest)


def _save_together(ranks: Ranks, tmp: Path, final: Path, write_part: Callable[[], None],
                   commit: Callable[[], None]) -> None:
    """Every rank writes its part and reports it; rank 0 commits only when all succeeded, and reports that;
    a failure anywhere raises CheckpointSaveError on every rank (see the module docstring)."""
    board = ranks.board
    assert board is not None
    key = f"agentgym-opsd/checkpoint/{tmp.name}"  # the temporary folder's name is new for every save
    written = {r: f"{key}/written/{r}" for r in range(ranks.world_size) if r != ranks.rank}
    started = time.time()
    mine = _outcome(write_part, tmp, final)
    at = time.time()
    _post(board, f"{key}/written/{ranks.rank}", _report(None if mine is None else _describe(mine), at))
    if mine is not None:  # leave soon (REPORT_GRACE_S): others' failures are named, the silent are not waited for
        failed = _failures(board, written, min(ranks.timeout_s, REPORT_GRACE_S), silent_fails=False)
        failed[ranks.rank] = (at, _describe(mine))
    else:
        failed = _failures(board, written, ranks.timeout_s)
        if failed and at - started > ranks.timeout_s:  # the others may have stopped waiting for this rank
            failed[ranks.rank] = (started + ranks.timeout_s, f"took {at - started:.0f} s to write its part, past "
                                                             f"the save timeout of {ranks.timeout_s:g} s")
    if ranks.rank == 0:
        if not failed:
            mine = _outcome(commit, tmp, final)
            if mine is not None:
                failed[0] = (time.time(), f"could not put the checkpoint in place: {_describe(mine)}")
        why = None if not failed else failed[0][1] if 0 in failed else f"did not commit: {_summary(failed)}"
        _post(board, f"{key}/committed", _report(why, time.time(), None if 0 in failed else failed))
        # rank 0 may host the board: it stays until the ranks that reported have read the outcome (they wait
        # for nothing else by now)
        with contextlib.suppress(RuntimeError, OSError):  # a board that is gone has no reader left to wait for
            board.read([f"{key}/done/{r}" for r in written if r not in failed], min(ranks.timeout_s, REPORT_GRACE_S))
    else:
        if not failed:
            failed = _failures(board, {0: f"{key}/committed"}, ranks.timeout_s)
        _post(board, f"{key}/done/{ranks.rank}", "")
    if failed:
        first_to_last = {r: why for r, (_, why) in sorted(failed.items(), key=lambda item: item[1][0])}
        latest = latest_checkpoint(final.parent)
        kept = f"the latest complete checkpoint is still {latest.name}" if latest else "there is no complete one yet"
        raise CheckpointSaveError(f"checkpoint {final.name} was not saved: {_summary(failed)}. Nothing was put in "
                                  f"place; {kept}", first_to_last) from mine


def list_checkpoints(checkpoints_dir: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"{_PREFIX}*") if p.is_dir() and (p / COMPLETE).is_file()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(checkpoints_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint, unverified (`resume_point` is the newest intact one)."""
    found = list_checkpoints(checkpoints_dir)
    return found[-1] if found else None


def resume_point(checkpoints_dir: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint that passes `verify_manifest`; each newer one that fails is named in the log and
    skipped. None where there is no complete checkpoint; a CheckpointError naming every one and why where none
    is intact."""
    failed: list[str] = []
    for folder in reversed(list_checkpoints(checkpoints_dir)):
        try:
            verify_manifest(folder)
        except CheckpointError as exc:
            log.warning("--resume auto: skipping %s: %s", folder.name, exc)
            failed.append(f"{folder.name}: {exc}")
            continue
        if failed:
            log.warning("--resume auto: resuming from %s, the newest intact checkpoint (%d newer one(s) skipped)",
                        folder.name, len(failed))
        return folder
    if failed:
        raise CheckpointError(f"no intact checkpoint in {checkpoints_dir} to resume from: " + "; ".join(failed))
    return None


def prune_checkpoints(checkpoints_dir: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete the complete checkpoints older than the `keep` newest that pass `verify_manifest` (newest first,
    so the one just written is checked before anything goes); returns what was deleted. Fewer than `keep`
    intact: nothing is deleted. A checkpoint that fails is named in the log and kept."""
    found = list_checkpoints(checkpoints_dir)
    intact = 0
    for i in range(len(found) - 1, -1, -1):
        try:
            _verified_since(found[i])
        except CheckpointError as exc:
            log.warning("checkpoint %s did not verify and is not counted as one to keep: %s", found[i].name, exc)
            continue
        intact += 1
        if intact == keep:
            for old in found[:i]:
                shutil.rmtree(old, ignore_errors=True)
                _VERIFIED.pop(old, None)
            return found[:i]
    return []


_VERIFIED: dict[Path, tuple[tuple[str, int, int, int], ...]] = {}
"""Checkpoints this process verified, with every file's (name, size, mtime, inode) then: a save prunes against
the checkpoints it verified at the last save without hashing their gigabytes again, unless a file changed."""


def _verified_since(folder: Path) -> None:
    """`verify_manifest(folder)`, skipped where this process verified it and no file of it changed since."""
    def signature() -> tuple[tuple[str, int, int, int], ...]:
        stats = ((p.relative_to(folder).as_posix(), p.stat()) for p in folder.rglob("*") if p.is_file())
        return tuple(sorted((rel, st.st_size, st.st_mtime_ns, st.st_ino) for rel, st in stats))

    before = signature()
    if _VERIFIED.get(folder) == before:
        return
    verify_manifest(folder)
    _VERIFIED[folder] = before


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
