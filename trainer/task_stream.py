"""The training stream of tasks: which task (and reset seed) the k-th group of the run plays.

Training reset seeds stay below `TRAIN_SEED_LIMIT` (= the evaluation suite's first seed), so no training
episode is ever an evaluation episode.

Several environments (`env.id` with weights, `mixed_task_specs`): the stream is cut into blocks of B slots (one
round of `rollout.tasks_per_step` tasks) and each block is split between the environments by weight, B·w
slots each rounded up or down at random so that the expected share is exactly w (systematic sampling), in a
shuffled order. The draws come from a stream seeded by the run's seed and the block's index only, so a slot's
environment is a function of (seed, B, slot) and a resumed run (which keeps only the cursor) continues the
same sequence. Each environment walks through its own task cycle: its k-th slot plays the task a
one-environment run of it would give its k-th group. With one environment nothing is drawn and the stream is
`train_task_specs`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentgym_opsd.envpool import EVAL_SEED, TaskSpec

__all__ = ["TRAIN_SEED_LIMIT", "env_draws", "mixed_task_specs", "train_task_specs"]

TRAIN_SEED_LIMIT = EVAL_SEED  # training seeds stay below this; evaluation uses seeds from it on


def train_task_specs(cursor: int, count: int, *, num_tasks: int | None, seed: int) -> list[TaskSpec]:
    """Tasks `cursor .. cursor+count-1` of the training stream: a seeded permutation of the task indices,
    cycled; reset seeds stay below 10_000 (disjoint from evaluation)."""
    specs = []
    order = np.random.default_rng(seed).permutation(num_tasks) if num_tasks else None
    for j in range(cursor, cursor + count):
        options = {"task_index": int(order[j % num_tasks])} if order is not None and num_tasks else {}
        specs.append(TaskSpec(j % TRAIN_SEED_LIMIT, options))
    return specs


_MIX_STREAM = 0x6D6978  # tags the environment draws' random streams apart from every other use of the seed


def env_draws(count: int, weights: Sequence[float], *, seed: int, block: int) -> np.ndarray:
    """(count,) the environment index of slots 0 .. count-1, block by block (see the module docstring);
    `weights` are normalised here. A longer prefix never changes the earlier draws."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    out = []
    for b in range(-(-count // block)):
        rng = np.random.default_rng([seed, _MIX_STREAM, b])
        share = block * w
        quota = np.floor(share).astype(np.int64)
        rest = block - int(quota.sum())
        if rest:  # systematic sampling over the fractional parts: env e gets one more with probability frac_e
            points = rng.random() + np.arange(rest)
            extra = np.searchsorted(np.cumsum(share - quota), points, side="right")
            np.add.at(quota, np.minimum(extra, len(w) - 1), 1)
        out.append(rng.permutation(np.repeat(np.arange(len(w)), quota)))
    return np.concatenate(out)[:count] if out else np.zeros(0, dtype=np.int64)


def mixed_task_specs(cursor: int, count: int, *, weights: Sequence[float], num_tasks: Sequence[int | None],
                     seed: int, block: int) -> list[tuple[int, TaskSpec]]:
    """Slots `cursor .. cursor+count-1` of the training stream over several environments: (environment index,
    the task it plays). `block`: slots per round (B). Environment e's slots take the next tasks of
    `train_task_specs` over its own `num_tasks[e]`; one environment gives exactly `train_task_specs`."""
    if len(weights) != len(num_tasks):
        raise ValueError(f"{len(weights)} weights for {len(num_tasks)} environments")
    if len(weights) == 1:
        return [(0, spec) for spec in train_task_specs(cursor, count, num_tasks=num_tasks[0], seed=seed)]
    draws = env_draws(cursor + count, weights, seed=seed, block=block)
    before = np.bincount(draws[:cursor], minlength=len(weights))  # each environment's tasks handed out so far
    here = draws[cursor:]
    specs = {e: iter(train_task_specs(int(before[e]), int((here == e).sum()), num_tasks=num_tasks[e], seed=seed))
             for e in range(len(weights))}
    return [(int(e), next(specs[int(e)])) for e in here]
