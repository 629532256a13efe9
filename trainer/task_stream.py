"""The training stream of tasks: which task (and reset seed) the k-th group of the run plays.

Training reset seeds stay below `TRAIN_SEED_LIMIT` (= the evaluation suite's first seed), so no training
episode is ever an evaluation episode.
"""

from __future__ import annotations

import numpy as np

from agentgym_opsd.envpool import EVAL_SEED, TaskSpec

__all__ = ["TRAIN_SEED_LIMIT", "train_task_specs"]

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
