"""What a logger emits while a block runs, for tests of loggers that do not propagate to pytest's caplog (vLLM's)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def records_of(name: str) -> Iterator[list[logging.LogRecord]]:
    """The records logger `name` emits inside the block (after its own filters), in order."""
    logger = logging.getLogger(name)
    seen: list[logging.LogRecord] = []
    collect = logging.Handler()
    collect.emit = seen.append  # type: ignore[method-assign]
    logger.addHandler(collect)
    try:
        yield seen
    finally:
        logger.removeHandler(collect)
