"""Files the whole package writes the same way: atomic writes and the cache folder.

`atomic_write_text` / `atomic_write_lines` write to a temporary file beside the target, named by the writer's
pid and a random id (two writers never share a temporary file), then rename it over the target: a reader sees
the old file or the new one, never half of one, and a crash leaves only a `.NAME.PID.ID.tmp` behind.
`cache_dir(*parts)` is `$AGENTGYM_OPSD_CACHE/...` (default `~/.cache/agentgym_opsd/...`): generated games,
indexes, converted models and warm starts all live under it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from pathlib import Path

__all__ = ["CACHE_ENV_VAR", "atomic_write_lines", "atomic_write_text", "cache_dir"]

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
