"""Files the whole package writes the same way: atomic writes and the cache folder.

`atomic_write_text` / `atomic_write_lines` write to a temporary file beside the target, named by the writer's
pid and a random id (two writers never share a temporary file), then rename it over the target: a reader sees
the old file or the new one, never half of one, and a crash leaves only a `.NAME.PID.ID.tmp` behind.
`cache_dir(*parts)` is `$AGENTGYM_OPSD_CACHE/...` (default `~/.cache/agentgym_opsd/...`): generated games,
indexes, converted models and warm starts all live under it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

__all__ = ["CACHE_ENV_VAR", "atomic_write_lines", "atomic_write_text", "cache_dir", "make_tmp_dir",
           "remove_dead_tmp_dirs"]

CACHE_ENV_VAR = "AGENTGYM_OPSD_CACHE"


def cache_dir(*parts: str) -> Path:
    """`$AGENTGYM_OPSD_CACHE/<parts>`, else `~/.cache/agentgym_opsd/<parts>` (not created)."""
    base = os.environ.get(CACHE_ENV_VAR)
    return (Path(base) if base else Path.home() / ".cache" / "agentgym_opsd").joinpath(*parts)


def atomic_write_lines(path: str | os.PathLike[str], lines: Iterable[str]) -> Path:
    """Write `lines` (each with its own newline, if any) to `path` atomically; returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            for line in lines:
                fh.write(line)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` atomically; returns the path."""
    return atomic_write_lines(path, [text])


def make_tmp_dir(target: Path) -> Path:
    """A new private folder `.NAME.PID.ID.tmp` beside `target`, to build `target` in and rename into place.
    Leftovers of writers that died (kill -9 mid-build) are removed first: each would be a whole copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_tmp_dirs(target)
    tmp = target.parent / f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir()
    return tmp


def remove_dead_tmp_dirs(target: Path) -> list[Path]:
    """Remove `.NAME.PID.ID.tmp` folders beside `target` whose writer process is gone; folders of live
    writers (or of processes not ours to signal) stay. Returns the removed folders."""
    removed = []
    for folder in target.parent.glob(f".{target.name}.*.tmp"):
        parts = folder.name[len(target.name) + 2: -len(".tmp")].split(".")
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        try:
            os.kill(int(parts[0]), 0)
            continue  # alive
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed
