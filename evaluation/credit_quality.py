"""Credit quality: does an estimator give more of the credit to the turns that made progress?

Each turn is labelled by the environment's oracle distance (`agentgym_opsd.turns.turn_progress`: PROGRESS
when a valid action lowered it, WASTED otherwise) and scored by an estimator's multiplier m_k = Ã_k / A_seq
(the penalty term left out). The AUC in won trajectories is P(m_progress > m_wasted), in lost ones
P(m_wasted > m_progress) (more blame on the wasted turns); ties count ½, GRPO is 0.5 by construction.

The credit-quality benchmark scores fresh rollouts with every estimator and teacher context;
`scores_from_run` reads a finished training run's own records (`trajectories/` joined with `credit/` by
trajectory and turn), so every study arm reports the AUC of the rollouts it trained on at no extra cost.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentgym_opsd.records import load_jsonl
from agentgym_opsd.turns import PROGRESS, WASTED, turn_progress

__all__ = ["DEFAULT_HORIZON_EDGES", "EVIDENCE", "TurnScore", "auc", "evidence_auc", "horizon_bucket",
           "run_credit_auc", "scores_from_run", "split_auc", "summarise", "turn_label"]

EVIDENCE = "evidence"
"""The key of a turn's raw self-teacher evidence e_k in `TurnScore.multiplier` (`scores_from_run`)."""

DEFAULT_HORIZON_EDGES = (4, 7)
"""Trajectory-length buckets: ≤ 4 turns, 5–7, ≥ 8 (ALFWorld `easy` plans take 3–8 steps, `cpu-learn` caps
episodes at 10 turns)."""


def auc(positive: Sequence[float], negative: Sequence[float]) -> float:
    """P(a positive scores above a negative) + ½ P(tie): the Mann–Whitney AUC; NaN when a side is empty."""
    if not len(positive) or not len(negative):
        return math.nan
    pos, neg = np.asarray(positive, dtype=np.float64), np.sort(np.asarray(negative, dtype=np.float64))
    below = np.searchsorted(neg, pos, side="left")  # negatives strictly below each positive
    ties = np.searchsorted(neg, pos, side="right") - below
    return float((below.sum() + 0.5 * ties.sum()) / (len(pos) * len(neg)))


turn_label = turn_progress  # the one rule (agentgym_opsd.rollout), shared with the inspector


@dataclass
class TurnScore:
    """One turn row: its trajectory's outcome and length, its label, A_seq and each estimator's multiplier."""

    won: bool
    horizon: int
    label: str | None
    valid: bool
    seq_advantage: float
    multiplier: dict[str, float] = field(default_factory=dict)


def horizon_bucket(horizon: int, edges: Sequence[int]) -> str:
    lo = 1
    for edge in edges:
        if horizon <= edge:
            return f"{lo}-{edge}"
        lo = edge + 1
    return f"{lo}+"


def _progress_and_wasted(scores: Sequence[TurnScore], key: str, *, won: bool) -> tuple[list[float], list[float]]:
    """The `key` scores of the progress and of the wasted turns of won (or lost) trajectories that have one."""
    rows = [s for s in scores if s.won == won and s.label is not None and key in s.multiplier]
    return ([s.multiplier[key] for s in rows if s.label == PROGRESS],
            [s.multiplier[key] for s in rows if s.label == WASTED])


def split_auc(scores: Sequence[TurnScore], estimator: str, *, won: bool) -> tuple[float, int, int]:
    """(AUC, progress turns, wasted turns) in won (progress should score higher) or lost trajectories
    (wasted should score higher: a larger multiplier on a negative A_seq is more blame)."""
    prog, waste = _progress_and_wasted(scores, estimator, won=won)
    value = auc(prog, waste) if won else auc(waste, prog)
    return value, len(prog), len(waste)


def summarise(scores: Sequence[TurnScore], estimators: Sequence[str],
              horizon_edges: Sequence[int] = DEFAULT_HORIZON_EDGES) -> dict[str, Any]:
    """AUCs per estimator: all turns, valid turns only, and by horizon bucket; plus the counts behind them."""
    buckets = sorted({horizon_bucket(s.horizon, horizon_edges) for s in scores}, key=lambda b: int(b.split("-")[0].rstrip("+")))
    out: dict[str, Any] = {"estimators": {}, "buckets": buckets}
    valid = [s for s in scores if s.valid]
    for name in estimators:
        entry: dict[str, Any] = {}
        for outcome, won in (("success", True), ("failure", False)):
            value, n_prog, n_waste = split_auc(scores, name, won=won)
            entry[outcome] = {"auc": value, "progress": n_prog, "wasted": n_waste,
                              "auc_valid_only": split_auc(valid, name, won=won)[0]}
            entry[f"{outcome}_by_horizon"] = {
                b: dict(zip(("auc", "progress", "wasted"),
                            split_auc([s for s in scores if horizon_bucket(s.horizon, horizon_edges) == b], name,
                                      won=won), strict=True))
                for b in buckets}
        out["estimators"][name] = entry
    return out


def scores_from_run(run_dir: str | Path) -> tuple[str | None, list[TurnScore]]:
    """(estimator, one TurnScore per *valid* turn of every trained trajectory) from a run's records.

    The recorded Ã_k includes the invalid-action push on invalid rows, so only valid turns are scored, with
    m_k = Ã_k / A_seq (trajectories with A_seq = 0 carry no credit: no multiplier); the AUCs are then the
    benchmark's `auc_valid_only`. A self-teacher's e_k is kept under `EVIDENCE` on every valid turn, A_seq = 0
    included. Needs `trainer.save_trajectories` (the default)."""
    run_dir = Path(run_dir)
    estimator: str | None = None
    scores: list[TurnScore] = []
    for credit_file in sorted((run_dir / "credit").glob("step_*.jsonl")):
        traj_file = run_dir / "trajectories" / credit_file.name
        if not traj_file.is_file():
            continue
        trajs = {t.traj_id: t for t in load_jsonl(traj_file)}
        for text in credit_file.read_text(encoding="utf-8").splitlines():
            line = json.loads(text)
            estimator = estimator or line.get("estimator")
            traj, seq = trajs.get(line["traj_id"]), line.get("seq_advantage") or 0.0
            if traj is None:
                continue
            for entry in line["turns"]:
                turn = traj.turns[entry["turn"]]
                if not turn.action_valid:
                    continue
                score = TurnScore(traj.won, traj.num_turns, turn_label(turn), True, seq)
                if seq and entry.get("advantage") is not None:
                    score.multiplier[estimator or ""] = entry["advantage"] / seq
                if entry.get("evidence") is not None:  # the teacher judged the turn whatever A_seq is
                    score.multiplier[EVIDENCE] = entry["evidence"]
                if score.multiplier:
                    scores.append(score)
    return estimator, scores


def evidence_auc(scores: Sequence[TurnScore], *, won: bool, key: str = EVIDENCE) -> tuple[float, int, int]:
    """(AUC, progress turns, wasted turns) of the self-teacher's raw evidence e_k, before any estimator turns
    it into credit: P(e_progress > e_wasted) in won *and* in lost trajectories (a teacher that knows the task
    should prefer the turns that made progress whatever the outcome). Beside `split_auc` of the estimator it
    separates what the teacher saw from what the estimator made of it. `key`: where the scores hold e_k."""
    prog, waste = _progress_and_wasted(scores, key, won=won)
    return auc(prog, waste), len(prog), len(waste)


def run_credit_auc(run_dir: str | Path) -> dict[str, Any] | None:
    """{"success": AUC, "failure": AUC, counts} of a run's own rollouts (valid turns), None without records;
    a self-teacher's run adds `evidence`: the same for its raw e_k (`evidence_auc`)."""
    estimator, scores = scores_from_run(run_dir)
    if estimator is None:
        return None
    out: dict[str, Any] = {"estimator": estimator, "turns": len(scores), "scope": "valid turns"}
    teacher: dict[str, Any] = {}
    for outcome, won in (("success", True), ("failure", False)):
        value, n_prog, n_waste = split_auc(scores, estimator, won=won)
        out[outcome] = {"auc": None if math.isnan(value) else value, "progress": n_prog, "wasted": n_waste}
        value, n_prog, n_waste = evidence_auc(scores, won=won)
        if n_prog or n_waste:
            teacher[outcome] = {"auc": None if math.isnan(value) else value, "progress": n_prog, "wasted": n_waste}
    if teacher:
        out["evidence"] = teacher
    return out
