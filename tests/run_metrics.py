"""Comparing two runs' `metrics.jsonl`: a resumed run against an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def metrics_lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def comparable(line: dict) -> dict:
    """A metrics line without the wall-clock and memory readings, which no two runs share."""
    return {k: v for k, v in line.items() if not k.startswith(("seconds_", "memory/"))}


def assert_same_metrics(resumed: Path, uninterrupted: Path) -> None:
    """Same steps, same keys, same numbers. Not bit-equal: a step that ran in another process may reduce the
    rollout's sampled log-probs in another order (seen in CI: 1e-9 relative in `sample_logprob_gap`)."""
    a, b = metrics_lines(resumed), metrics_lines(uninterrupted)
    assert [x["step"] for x in a] == [x["step"] for x in b]
    for x, y in zip(a, b, strict=True):
        assert comparable(x) == pytest.approx(comparable(y), rel=1e-6, abs=1e-9)
