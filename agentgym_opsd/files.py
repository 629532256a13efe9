"""Files the whole package writes the same way: atomic writes, strict JSON and the cache folder.

`atomic_write_text` / `atomic_write_lines` / `atomic_write_bytes` write to a temporary file beside the target,
named by the writer's pid and a random id (two writers never share a temporary file), then rename it over the
target: a reader sees the old file or the new one, never half of one, and a crash leaves only a
`.NAME.PID.ID.tmp` behind; a failed write (a full disk, text that is not valid Unicode) leaves no file at all.
A folder is published the same way: built in `make_tmp_dir(target)` (same temporary name), then
`publish_dir(tmp, target)` renames it into place; leftovers of dead writers, files and folders, are removed by
`remove_dead_tmp_dirs`, which every `make_tmp_dir` runs first.
`to_json` is the one JSON writer: strict RFC 8259 JSON, a NaN or an infinity written as null (Python's own
`json.dumps` writes a bare `NaN`, which other parsers refuse).
`cache_dir(*parts)` is `$AGENTGYM_OPSD_CACHE/...` (default `~/.cache/agentgym_opsd/...`): generated games,
indexes, converted models and warm starts all live under it. `is_disk_full(exc)` tells a full disk (or quota)
from other write errors, also when a library wrapped the OSError (safetensors, torch.save).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

__all__ = ["CACHE_ENV_VAR", "atomic_write_bytes", "atomic_write_lines", "atomic_write_text", "cache_dir",
           "is_disk_full", "make_tmp_dir", "publish_dir", "remove_dead_tmp_dirs", "remove_path", "to_json"]

CACHE_ENV_VAR = "AGENTGYM_OPSD_CACHE"


def cache_dir(*parts: str) -> Path:
    """`$AGENTGYM_OPSD_CACHE/<parts>`, else `~/.cache/agentgym_opsd/<parts>` (not created)."""
    base = os.environ.get(CACHE_ENV_VAR)
    return (Path(base) if base else Path.home() / ".cache" / "agentgym_opsd").joinpath(*parts)


DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_DISK_FULL_TEXT = ("no space left on device", "disk quota exceeded", "os error 28", "os error 122")


def is_disk_full(exc: BaseException, folder: str | os.PathLike[str] | None = None) -> bool:
    """Whether `exc` comes from a full disk or an exceeded quota: an OSError with ENOSPC / EDQUOT anywhere in
    its cause/context chain, or a library's wrapped message ("No space left on device (os error 28)" from
    safetensors). Libraries that lose the errno altogether (torch.save to a path: "unexpected pos ...") count
    when `folder` is given and its filesystem has less than 1 MiB left; call it before freeing anything."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_FULL_ERRNOS:
            return True
        if any(text in str(current).lower() for text in _DISK_FULL_TEXT):
            return True
        current = current.__cause__ or current.__context__
    if folder is not None and isinstance(exc, (OSError, RuntimeError)):
        try:
            return shutil.disk_usage(folder).free < 1 << 20
        except OSError:
            return False
    return False


def _write_atomically(path: str | os.PathLike[str], mode: str, write: Callable[[IO[Any]], object]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(target)
    try:
        with tmp.open(mode, encoding=None if "b" in mode else "utf-8") as fh:
            write(fh)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def atomic_write_lines(path: str | os.PathLike[str], lines: Iterable[str]) -> Path:
    """Write `lines` (each with its own newline, if any) to `path` atomically; returns the path."""
    return _write_atomically(path, "w", lambda fh: fh.writelines(lines))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` atomically; returns the path."""
    return _write_atomically(path, "wb", lambda fh: fh.write(data))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` atomically; returns the path."""
    return atomic_write_lines(path, [text])


def to_json(value: Any, **dumps_kwargs: Any) -> str:
    """`value` as strict JSON text (`json.dumps` options in `dumps_kwargs`: indent, sort_keys, ensure_ascii,
    default...): every float that is NaN or ±inf becomes null, since JSON has no such numbers and a bare `NaN`
    makes the file unreadable to strict parsers (JavaScript, jq, Go, Rust). Numbers are written as they are;
    only a value holding a non-finite float is copied (tuples become lists, as JSON writes them anyway)."""
    try:  # the common case: all numbers finite, one C-speed pass
        return json.dumps(value, allow_nan=False, **dumps_kwargs)
    except ValueError:  # "Out of range float values are not JSON compliant"
        return json.dumps(_finite_or_none(value), allow_nan=False, **dumps_kwargs)


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def _tmp_path(target: Path) -> Path:
    """A fresh `.NAME.PID.ID.tmp` path beside `target`: the one temporary name of the package (files and folders)."""
    return target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


_TMP_NAME = re.compile(r"\..+\.(\d+)\.[0-9a-f]{8}\.tmp")


def make_tmp_dir(target: Path) -> Path:
    """A new private folder `.NAME.PID.ID.tmp` beside `target`, to build `target` in and `publish_dir` into
    place. Leftovers of writers that died (kill -9 mid-build) are removed first: each may be a whole copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_tmp_dirs(target)
    tmp = _tmp_path(target)
    tmp.mkdir()
    return tmp


def publish_dir(tmp: Path, target: Path, *, keep: Callable[[Path], bool] | None = None) -> bool:
    """Put the finished folder `tmp` (from `make_tmp_dir(target)`) at `target` in one rename, so a reader sees
    the old folder or the new one, never half of one. Returns whether `tmp` was put there; `tmp` never
    outlives the call.

    A folder already at `target` is replaced: moved aside (under a temporary name) and deleted only once `tmp`
    is in place; when the rename fails it is moved back, so an error leaves one whole folder at `target` (a
    kill between the two renames leaves it aside, a dead writer's leftover that the next `make_tmp_dir`
    removes). `keep(target)` true: the folder there, found first or put there meanwhile by another writer
    (whose rename won), is as good as ours and stays; `tmp` is then discarded."""
    aside = None
    try:
        if target.exists() or target.is_symlink():
            if keep is not None and keep(target):
                return False
            aside = _tmp_path(target)
            try:
                os.rename(target, aside)
            except FileNotFoundError:  # another writer moved it meanwhile
                aside = None
        try:
            os.rename(tmp, target)
        except OSError:
            if keep is not None and target.exists() and keep(target):  # another writer published first
                return False
            if aside is not None:
                os.rename(aside, target)
                aside = None
            raise
        return True
    finally:
        for folder in (tmp, aside):
            if folder is not None and folder.exists():
                shutil.rmtree(folder, ignore_errors=True)


def remove_dead_tmp_dirs(target: Path) -> list[Path]:
    """Remove the temporary `.NAME.PID.ID.tmp` folders and files in `target`'s folder (of any NAME: a build,
    a folder moved aside, an atomic write) whose writer process is gone; those of live writers (or of
    processes not ours to signal) stay. Returns what was removed."""
    removed = []
    for path in target.parent.glob(".*.tmp"):
        match = _TMP_NAME.fullmatch(path.name)
        if match is None:
            continue
        try:
            os.kill(int(match[1]), 0)
            continue  # alive
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        remove_path(path, ignore_errors=True)
        removed.append(path)
    return removed


def remove_path(path: Path, *, ignore_errors: bool = False) -> None:
    """Delete `path`: a folder with its contents, a file or a link (a link to a folder is removed, not followed)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=ignore_errors)
    elif ignore_errors:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
    else:
        path.unlink()
