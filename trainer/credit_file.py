"""The saved credit numbers of a step (`RUN/credit/step_N.jsonl`): one line per trajectory, per turn what the
self-teacher and the estimator said, joined with `trajectories/step_N.jsonl` by `traj_id` and `turn` (the
inspector reads them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym_opsd.files import atomic_write_lines, to_json
from agentgym_opsd.records import Trajectory
from agentgym_opsd.trainer.turn_batch import StepRecord

__all__ = ["credit_lines", "write_jsonl_atomic"]


def _num(x: float) -> float | None:
    """6 significant digits (the files stay small); None for NaN / inf, which JSON cannot hold."""
    return float(f"{x:.6g}") if math.isfinite(x) else None


def credit_lines(trajectories: Sequence[Trajectory], record: StepRecord, *, estimator: str, step: int,
                 token_text: list[list[str]] | None = None,
                 env_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One JSON object per trajectory (all of them, in order), keyed by `traj_id` and each turn's `turn` index
    so it joins with `trajectories/step_N.jsonl`; `env_id` says which environment the trajectory's rows
    came from (`env_ids`, one per trajectory: the trainer's env spec, e.g. `ALFWorld-v0:easy`; else the
    trajectory's registered id). Per turn: `evidence` e_k (only where a teacher ran) and `evidence_form`,
    the form it was computed in (`teacher.evidence`, or "paper" where the turn had no choice to judge), the
    estimator's details (`prior` B_0, `belief` B_k, `delta_belief` ΔB_k, `weight` w_k; GiGPO's
    `step_return`, `step_advantage`, `anchor_size`) and `advantage` Ã_k (the mean over the turn's tokens:
    the value itself for a turn-level estimator, penalty term included). A token-level estimator adds
    `token_gaps` and `tokens` per turn."""
    batch = record.batch
    rows_of: dict[int, list[int]] = {}
    for row, ti in enumerate(batch.traj_index.tolist()):
        rows_of.setdefault(ti, []).append(row)
    if record.credit.result is None:  # an empty batch: no rows, every trajectory without turns
        details: dict[str, list[Any]] = {}
    else:
        details = {k: v.tolist() for k, v in record.credit.result.details.items()}
    evidence = record.evidence.evidence.tolist()
    forms = record.evidence.forms
    seq = record.credit.seq.tolist()
    rewards = batch.traj_rewards.tolist()
    rates = batch.success_rate.tolist()
    lines = []
    for ti, traj in enumerate(trajectories):
        turns = []
        for row in rows_of.get(ti, []):
            adv = record.credit.tokens[row]
            entry: dict[str, Any] = {"turn": batch.rows[row].turn_id}
            if record.evidence.judged:  # GRPO's e_k is 0 by construction, not a teacher's judgement
                entry["evidence"] = _num(evidence[row])
            if forms is not None:
                entry["evidence_form"] = forms[row]
            entry.update({k: v[row] if isinstance(v[row], int) else _num(v[row]) for k, v in details.items()})
            entry["advantage"] = _num(float(adv.double().mean())) if adv.numel() else None
            if token_text is not None:
                entry["token_gaps"] = [_num(g) for g in record.evidence.gaps[row].tolist()]
                entry["tokens"] = token_text[row]
            turns.append(entry)
        rows = rows_of.get(ti, [])
        lines.append({"step": step, "estimator": estimator, "traj_id": traj.traj_id, "group_id": traj.group_id,
                      "env_id": env_ids[ti] if env_ids is not None else traj.env_id, "task_id": traj.task_id, "task_type": traj.task_type, "won": traj.won,
                      "reward": _num(rewards[ti]), "seq_advantage": _num(seq[ti]),
                      "success_rate": _num(rates[rows[0]]) if rows else None, "turns": turns})
    return lines


def write_jsonl_atomic(lines: Sequence[dict[str, Any]], path: Path) -> Path:
    """Write JSON lines atomically (`agentgym_opsd.files`), as `records.save_jsonl` does."""
    return atomic_write_lines(path, (to_json(line, ensure_ascii=False) + "\n" for line in lines))
