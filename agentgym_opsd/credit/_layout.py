"""Ranking turn rows (any order) by (trajectory, turn) onto a padded (trajectories, max_turns) grid, once and
without a Python loop: a counting sort over the id range when ids are dense, else a comparison sort."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# Rows are ranked by a counting sort over the (traj id, turn id) range when that range has at most
# FACTOR·rows + SLACK cells, else by torch.sort (see _layout_turn_rows).
_COUNTING_SORT_FACTOR = 8
_COUNTING_SORT_SLACK = 4096


@dataclass(frozen=True)
class _TurnLayout:
    """Where each turn row sits on the padded (trajectories, max_turns) grid."""

    traj_index: Tensor  # (rows,) dense trajectory index 0..n−1, trajectories in increasing id order
    turn_pos: Tensor  # (rows,) 0-based position of the row's turn within its trajectory
    num_turns: Tensor  # (n,) turns of each trajectory
    max_turns: int


def _layout_turn_rows(traj_ids: Tensor, turn_ids: Tensor) -> _TurnLayout:
    """Rank rows by (traj, turn) without a Python loop; ValueError on a duplicated (traj, turn) pair.

    Ids are usually dense (rollout.py numbers trajectories ``first_traj_id + i`` and turns 0..K−1): then a
    counting sort over the id range is O(rows + range) and much cheaper than a comparison sort. Sparse ids
    are first made dense with torch.unique (one sort), then counted the same way.
    """
    traj_lo, traj_hi, turn_lo, turn_hi = torch.stack(
        [*torch.aminmax(traj_ids), *torch.aminmax(turn_ids)]
    ).tolist()
    traj_span, turn_span = traj_hi - traj_lo + 1, turn_hi - turn_lo + 1
    cells_max = _COUNTING_SORT_FACTOR * traj_ids.numel() + _COUNTING_SORT_SLACK
    if traj_span * turn_span <= cells_max:
        return _layout_by_counting(
            traj_ids - traj_lo, turn_ids - turn_lo, traj_span, turn_span, traj_ids, turn_ids
        )
    traj_key = torch.unique(traj_ids, return_inverse=True)[1]  # (rows,) dense 0..n−1, order kept
    traj_span = int(traj_key.max()) + 1
    if traj_span * turn_span <= cells_max:
        return _layout_by_counting(traj_key, turn_ids - turn_lo, traj_span, turn_span, traj_ids, turn_ids)
    turn_key = torch.unique(turn_ids, return_inverse=True)[1]  # both keys < rows: their product fits int64
    return _layout_by_sorting(traj_key, turn_key, int(turn_key.max()) + 1, traj_ids, turn_ids)


def _layout_by_counting(
    traj_key: Tensor, turn_key: Tensor, traj_span: int, turn_span: int, traj_ids: Tensor, turn_ids: Tensor
) -> _TurnLayout:
    """Counting sort; ``traj_key`` in [0, traj_span) and ``turn_key`` in [0, turn_span) keep the id order."""
    key = torch.add(turn_key, traj_key, alpha=turn_span)  # (rows,) cell of the (traj_span, turn_span) table
    table = torch.bincount(key, minlength=traj_span * turn_span).view(traj_span, turn_span)
    num_turns = table.sum(1)  # (traj_span,) 0 for a key in the range that no row uses
    present = num_turns > 0
    most_per_cell, max_turns, num_traj = torch.stack([table.max(), num_turns.max(), present.sum()]).tolist()
    if most_per_cell > 1:
        _raise_duplicate(traj_ids, turn_ids)
    rank = table.cumsum(1).sub_(1)  # (traj_span, turn_span) turn key -> position within its trajectory
    turn_pos = rank.take(key)
    if num_traj == traj_span:  # no unused keys: the key is the grid row
        return _TurnLayout(traj_key, turn_pos, num_turns, max_turns)
    dense = present.cumsum(0).sub_(1)  # (traj_span,) key -> grid row, skipping unused keys
    return _TurnLayout(dense.take(traj_key), turn_pos, num_turns[present], max_turns)


def _layout_by_sorting(
    traj_key: Tensor, turn_key: Tensor, turn_span: int, traj_ids: Tensor, turn_ids: Tensor
) -> _TurnLayout:
    """Comparison sort on one int64 key; for many trajectories that each use different turn ids."""
    key = torch.add(turn_key, traj_key, alpha=turn_span)
    sorted_key, order = torch.sort(key)  # non-stable is fine: keys are unique unless duplicated
    if bool((sorted_key[1:] == sorted_key[:-1]).any()):
        _raise_duplicate(traj_ids, turn_ids)
    traj_sorted = traj_key[order]
    starts = torch.ones_like(traj_sorted, dtype=torch.bool)  # (rows,) True at each trajectory's first row
    starts[1:] = traj_sorted[1:] != traj_sorted[:-1]
    seg = starts.long().cumsum(0) - 1  # (rows,) dense trajectory index of each sorted row
    pos = torch.arange(order.numel(), device=order.device) - starts.nonzero().squeeze(1)[seg]
    num_turns = torch.bincount(seg)
    unsort = torch.empty_like(order)
    return _TurnLayout(
        unsort.scatter(0, order, seg), unsort.scatter(0, order, pos), num_turns, int(num_turns.max())
    )


def _raise_duplicate(traj_ids: Tensor, turn_ids: Tensor) -> None:
    """Error path only: name one duplicated (traj, turn) pair."""
    seen: set[tuple[int, int]] = set()
    for pair in zip(traj_ids.tolist(), turn_ids.tolist(), strict=True):
        if pair in seen:
            break
        seen.add(pair)
    raise ValueError(
        f"duplicate (traj_id, turn_id) = {pair} in the turn rows: each turn must appear once "
        "(drop padding rows before credit assignment)."
    )
