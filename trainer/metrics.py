"""A step's metrics: assembled from the step batch, reduced across ranks, and written (metrics.jsonl, the trackers).

`MetricsLog` owns the run's `metrics.jsonl`: a run that starts from step 0 beside an old file (`--resume auto`
before any checkpoint finished; a fresh run into a run folder is refused) sets it aside instead of appending to
it; a resumed run drops the lines of steps after its checkpoint (they will be replayed exactly), and its
trackers show each step once too (`trainer/trackers.py`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentgym_opsd.credit.agentopsd import form_counts
from agentgym_opsd.files import atomic_write_lines, to_json
from agentgym_opsd.records import Trajectory, summarize
from agentgym_opsd.trainer import engine as dist
from agentgym_opsd.trainer.trackers import Tracker
from agentgym_opsd.trainer.turn_batch import StepRecord, TurnBatch

__all__ = ["METRIC_KEYS", "MetricsLog", "env_metrics", "reduce_step_metrics", "step_metrics", "sampling_gap"]

METRIC_KEYS = (
    "step", "success_rate", "reward_mean", "turns_mean", "invalid_action_rate", "loss", "kl", "entropy",
    "clip_fraction", "approx_kl", "grad_norm", "optimizer_steps", "invalid/no_tag", "invalid/not_admissible",
    "invalid/truncated", "evidence_mean", "evidence_std", "advantage_mean", "seconds_rollout", "seconds_teacher",
    "seconds_update",
)
"""Plain keys every metrics.jsonl line has (namespaced duplicates and extras come beside them)."""


def sampling_gap(batch: TurnBatch, old: list[Tensor]) -> float:
    """Mean |sampling − recomputed| old log-prob (≈0 for the HF backend; a health check for vLLM)."""
    diffs = [(torch.tensor(r.sample_logprobs) - t).abs().mean()
             for r, t in zip(batch.rows, old, strict=True)
             if len(r.sample_logprobs) == t.numel() and t.numel()]
    return float(torch.stack(diffs).mean()) if diffs else math.nan


def step_metrics(record: StepRecord, update: dict[str, float], *, lam: float) -> dict[str, Any]:
    """This rank's numbers of one scored, credited and applied step batch (timings are added by the loop)."""
    batch, evidence, seq_adv = record.batch, record.evidence.evidence, record.credit.seq
    tok_adv = record.token_advantages
    return {
        **batch.stats,
        **update,
        "evidence_mean": float(evidence.mean()) if len(evidence) else 0.0,
        "evidence_std": float(evidence.std(unbiased=False)) if len(evidence) else 0.0,
        "advantage_mean": float(tok_adv.mean()) if tok_adv.numel() else 0.0,
        "advantage_abs_mean": float(tok_adv.abs().mean()) if tok_adv.numel() else 0.0,
        "seq_advantage_std": float(seq_adv.std(unbiased=False)) if seq_adv.numel() else 0.0,
        "teacher_rows": float(record.evidence.teacher_rows),
        # penalised turns of won rollouts: where penalty_mode=outcome keeps a win from pushing an invalid turn up
        "won_invalid_rows": float(((record.credit.penalty < 0) & (seq_adv[batch.traj_index] > 0)).sum())
        if len(batch.rows) else 0.0,
        **form_counts(record.evidence.forms),  # teacher/<form>_rows: which evidence form each row got
        "lam": lam,
        "response_tokens": float(batch.num_response_tokens),
        "sample_logprob_gap": sampling_gap(batch, record.logprobs.old),
        "memory/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }


def reduce_step_metrics(metrics: dict[str, Any], trajs: list[Trajectory], record: StepRecord,
                        world: int) -> dict[str, Any]:
    """This rank's step metrics -> the whole step's: each mean weighted by what it averages over (episodes,
    turns, rows, tokens), counts summed, stds from sums of squares, timings and memory the maximum;
    the update's numbers (loss, kl, grad_norm, ...) are global already. One all-reduce for the sums, one for
    the maxima."""
    evidence, seq_adv, tok_adv = record.evidence.evidence, record.credit.seq, record.token_advantages
    per = {"traj": float(len(trajs)), "turn": float(sum(t.num_turns for t in trajs)),
           "row": float(len(evidence)), "token": float(tok_adv.numel())}
    by_turn = {"invalid_action_rate"} | {k for k in metrics if k.startswith("invalid/")}
    by_traj = {"success_rate", "reward_mean", "turns_mean", "score_mean"}
    summed = {"env_errors", "num_rows", "teacher_rows", "won_invalid_rows", "response_tokens"} | {k for k in metrics
                                                                             if k.startswith("teacher/")}
    biggest = {k for k in metrics if k.startswith(("seconds_", "memory/"))}
    weighted = [k for k in metrics if k in by_turn | by_traj and isinstance(metrics[k], (int, float))]
    gap = metrics.get("sample_logprob_gap", math.nan)
    gap_rows = per["row"] if math.isfinite(gap) else 0.0
    e, q = evidence.double(), seq_adv.double()
    vector = ([per["traj"], per["turn"], per["row"], per["token"], float(len(q)), gap_rows,
               gap * gap_rows if gap_rows else 0.0, float(e.sum()), float((e * e).sum()),
               float(tok_adv.double().sum()), float(tok_adv.double().abs().sum()), float(q.sum()),
               float((q * q).sum())]
              + [float(metrics[k]) * (per["turn"] if k in by_turn else per["traj"]) for k in weighted]
              + [float(metrics.get(k, 0.0)) for k in sorted(summed)])
    total = dist.all_reduce(vector)
    n_traj, n_turn, n_row, n_tok, n_seq, n_gap, gap_sum, e1, e2, a1, a_abs, q1, q2 = total[:13]
    out = dict(metrics)
    for k, v in zip(weighted, total[13:13 + len(weighted)], strict=True):
        out[k] = v / max(n_turn if k in by_turn else n_traj, 1.0)
    for k, v in zip(sorted(summed), total[13 + len(weighted):], strict=True):
        if k in metrics:
            out[k] = v
    mean_e = e1 / n_row if n_row else 0.0
    out["evidence_mean"] = mean_e
    out["evidence_std"] = math.sqrt(max(e2 / n_row - mean_e ** 2, 0.0)) if n_row else 0.0
    out["advantage_mean"] = a1 / n_tok if n_tok else 0.0
    out["advantage_abs_mean"] = a_abs / n_tok if n_tok else 0.0
    mean_q = q1 / n_seq if n_seq else 0.0
    out["seq_advantage_std"] = math.sqrt(max(q2 / n_seq - mean_q ** 2, 0.0)) if n_seq else 0.0
    out["sample_logprob_gap"] = gap_sum / n_gap if n_gap else math.nan
    keys = sorted(biggest)
    for k, v in zip(keys, dist.all_reduce([float(metrics[k]) for k in keys], op="max"), strict=True):
        out[k] = v
    out["ranks"] = float(world)
    return out


def env_metrics(trajs: list[Trajectory], specs: list[str], spec_of: Callable[[Trajectory], str],
                metrics: dict[str, Any], world: int) -> dict[str, float]:
    """`train/<env spec>/...` (one key style for every phase, as validation writes `val/<spec>/...`): one
    environment, its success rate (the step's); a mix, per environment the episodes it played this step and,
    when it played any, success rate, turns and invalid-action rate (summed over the ranks)."""
    if len(specs) == 1:
        return {f"train/{specs[0]}/success_rate": metrics["success_rate"]}
    sums: list[float] = []
    for spec in specs:
        mine = summarize(t for t in trajs if spec_of(t) == spec)  # errored episodes are failures
        sums += [float(mine.episodes), float(mine.successes), float(mine.turns), float(mine.invalid_actions)]
    sums = dist.all_reduce(sums) if world > 1 else sums
    out: dict[str, float] = {}
    for k, spec in enumerate(specs):
        episodes, won, turns, invalid = sums[4 * k:4 * k + 4]
        out[f"train/{spec}/episodes"] = episodes
        if episodes:
            out.update({f"train/{spec}/success_rate": won / episodes,
                        f"train/{spec}/turns_mean": turns / episodes,
                        f"train/{spec}/invalid_action_rate": invalid / max(turns, 1.0)})
    return out


class MetricsLog:
    """`metrics.jsonl` and the trackers (`trainer/trackers.py`) of one run folder; only rank 0 makes one."""

    def __init__(self, run_dir: Path, trackers: Callable[..., list[Tracker]]) -> None:
        self.path = run_dir / "metrics.jsonl"
        # called with the first step written (TensorBoard drops its events from there on) and `logged_through=`
        self._make_trackers = trackers
        self._trackers: list[Tracker] | None = None
        self.logged_through = -1  # the last step an attempt before this one (killed) logged; -1: none

    def trackers(self, step: int) -> list[Tracker]:
        if self._trackers is None:
            self._trackers = self._make_trackers(step, logged_through=self.logged_through)
        return self._trackers

    def set_aside_old(self) -> None:
        """A run that starts from step 0 (fresh, or `--resume auto` without a finished checkpoint) begins a
        new metrics.jsonl; the old one is kept beside it, not appended to (steps would read 1, 1, 2, ...)."""
        if self.path.is_file() and self.path.stat().st_size:
            os.replace(self.path, self.path.with_name(f"metrics.{time.strftime('%Y%m%d-%H%M%S')}.jsonl"))

    def truncate_after(self, step: int) -> None:
        """Drop metric lines of steps after the checkpoint (they will be replayed exactly)."""
        if not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                logged = int(json.loads(line).get("step", 0))
            except (json.JSONDecodeError, TypeError, ValueError):
                continue  # a line cut by the kill
            self.logged_through = max(self.logged_through, logged)  # the trackers were sent it too
            if logged <= step:
                kept.append(line)
        atomic_write_lines(self.path, (x + "\n" for x in kept))  # a full disk leaves the old file whole

    def write(self, metrics: dict[str, Any], *, step: int) -> None:
        """One metrics line; a validation point's numbers also go to the trackers as a table."""
        line = {"step": step, **{k: v for k, v in metrics.items() if k != "step"}}
        start = self.path.stat().st_size if self.path.is_file() else 0
        try:
            with self.path.open("ab") as fh:
                fh.write((to_json(line) + "\n").encode("utf-8"))
        except OSError:  # a full disk: cut a half-written line off, so every line stays whole JSON
            with contextlib.suppress(OSError):
                os.truncate(self.path, start)
            raise
        validation = [{"metric": k, "value": round(float(v), 6)} for k, v in line.items()
                      if k.startswith(("val/", "pool/")) and isinstance(v, (int, float))]
        for tracker in self.trackers(step):
            tracker.log_metrics(line, step)
            if validation:
                tracker.log_table("validation", validation, step)

    def finish(self, *, step: int) -> Path | None:
        """At the end of training: the learning-curve PNG beside metrics.jsonl, also sent to the trackers."""
        from agentgym_opsd.evaluation.compare import write_curves

        if not self.path.is_file() or not self.path.stat().st_size:
            return None
        png = write_curves(self.path.parent)
        for tracker in self.trackers(step):
            tracker.log_image("training_curves", png, step)
        return png

    def flush(self) -> None:
        for tracker in self._trackers or []:
            tracker.flush()

    def close(self) -> None:
        for tracker in self._trackers or []:
            tracker.close()
        self._trackers = []
