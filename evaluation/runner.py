"""Run one policy on one environment split for N episodes: the single evaluation code path (`evaluate_policy`).

The suite CLI (`python -m agentgym_opsd.evaluate`) and the trainer's validation both call it. Episode j plays
reset seed `seed + j` on task `permutation(seed)[j mod num_tasks]` (`plan_tasks`), so N >= num_tasks covers the
split and a smaller N is a random subset without repeats; evaluation seeds start at 10_000, training seeds stay
below. With `results_path`, each finished episode is appended to a JSONL file as its batch ends, and episodes
already there (same env spec, seed and policy name) are skipped, so a rerun resumes. An episode that ends with an
error (the environment crashed or hung, a remote policy timed out or sent garbage) is replayed up to `max_retries`
times; one still failing counts as a failure in every statistic (`records.summarize`'s rule), is reported in
`failed_episodes` / `failure_reasons` and is not written, so the next run plays it again; the CLI exits non-zero.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from agentgym_opsd.envpool import EVAL_SEED, TaskSpec
from agentgym_opsd.evaluation.metrics import fit_horizon, group_stats, horizon_of, stats_by_task_type
from agentgym_opsd.files import to_json
from agentgym_opsd.policies import OraclePolicy, Policy
from agentgym_opsd.prompts import PromptRenderer
from agentgym_opsd.records import Trajectory, invalid_rates
from agentgym_opsd.rollout import RolloutRunner

__all__ = [
    "EVAL_SEED",
    "EpisodeRecord",
    "EvalSummary",
    "evaluate_policy",
    "load_episode_records",
    "plan_tasks",
    "summarize",
]

log = logging.getLogger(__name__)

# EVAL_SEED (10_000): the first evaluation seed; training uses the seeds below it (one constant, in envpool)


@dataclass
class EpisodeRecord:
    """One line of `episodes.jsonl`: which episode (env spec, seed, policy name), how many attempts it took,
    and the trajectory."""

    env_spec: str
    policy: str
    seed: int
    task_index: int | None
    attempts: int
    trajectory: Trajectory

    def to_json(self) -> str:
        return to_json({"env_spec": self.env_spec, "policy": self.policy, "seed": self.seed,
                        "task_index": self.task_index, "attempts": self.attempts,
                        "trajectory": self.trajectory.to_dict()}, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> EpisodeRecord:
        data = json.loads(line)
        return cls(env_spec=str(data["env_spec"]), policy=str(data["policy"]), seed=int(data["seed"]),
                   task_index=data.get("task_index"), attempts=int(data.get("attempts", 1)),
                   trajectory=Trajectory.from_dict(data["trajectory"]))


def load_episode_records(path: str | Path) -> list[EpisodeRecord]:
    """All readable records of an episodes file ([] when it does not exist).

    A line that does not parse (a run killed mid-write leaves half a line at the end) is skipped with a
    warning: that episode is simply played again on resume.
    """
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                records.append(EpisodeRecord.from_json(line))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                log.warning("%s:%d: skipping unreadable episode record (%s)", path, line_no, exc)
    return records


@dataclass
class EvalSummary:
    """Results of one policy on one env spec.

    `success_rate` is the fraction of episodes won (Wilson 95% interval in `ci_low`/`ci_high`);
    `score_mean` mean partial credit in [0, 1]; `turns_mean` mean turns per episode; `invalid_action_rate`
    invalid actions / all turns; `by_task_type` maps task type -> the same statistics as a dict;
    `horizon` holds success per horizon and the fitted slope in points per extra turn;
    `failed_episodes` episodes that still had an error after retries; `seconds` wall time of the episodes
    played in this call (resumed ones excluded) and `episodes_per_minute` their throughput.
    """

    env_spec: str
    episodes: int
    success_rate: float
    score_mean: float
    turns_mean: float
    invalid_action_rate: float
    by_task_type: dict[str, dict[str, Any]]
    trajectories: list[Trajectory] = field(repr=False, default_factory=list)
    ci_low: float = 0.0
    ci_high: float = 1.0
    failed_episodes: int = 0
    failure_reasons: list[str] = field(default_factory=list)
    horizon: dict[str, Any] = field(default_factory=dict)
    policy: str = ""
    seconds: float = 0.0
    episodes_played: int = 0
    invalid_by_kind: dict[str, float] = field(default_factory=dict)

    @property
    def episodes_per_minute(self) -> float:
        return 60.0 * self.episodes_played / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary without the trajectories."""
        return {
            "env_spec": self.env_spec,
            "policy": self.policy,
            "episodes": self.episodes,
            "success_rate": self.success_rate,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "score_mean": self.score_mean,
            "turns_mean": self.turns_mean,
            "invalid_action_rate": self.invalid_action_rate,
            "invalid_by_kind": self.invalid_by_kind,
            "failed_episodes": self.failed_episodes,
            "failure_reasons": self.failure_reasons,
            "by_task_type": self.by_task_type,
            "horizon": self.horizon,
        }

    def metrics(self, prefix: str = "val") -> dict[str, float]:
        """Flat, namespaced metric keys for a training log, e.g. `val/ALFWorld-v0:valid_unseen/success_rate`."""
        base = f"{prefix}/{self.env_spec}"
        out = {f"{base}/success_rate": self.success_rate, f"{base}/score": self.score_mean,
               f"{base}/turns": self.turns_mean, f"{base}/invalid_action_rate": self.invalid_action_rate}
        out.update({f"{prefix}/{kind}": rate for kind, rate in self.invalid_by_kind.items()})
        for task_type, stats in self.by_task_type.items():
            out[f"{base}/{task_type}/success_rate"] = float(stats["success_rate"])
        return out


def summarize(env_spec: str, trajectories: Sequence[Trajectory], *, policy: str = "") -> EvalSummary:
    """Aggregate finished trajectories into an EvalSummary (pure; used for reports rebuilt from JSONL)."""
    stats = group_stats(trajectories)
    fit = fit_horizon(trajectories)
    reasons = sorted({t.error for t in trajectories if t.error})
    return EvalSummary(
        env_spec=env_spec,
        episodes=stats.episodes,
        success_rate=stats.success_rate,
        score_mean=stats.score_mean,
        turns_mean=stats.turns_mean,
        invalid_action_rate=stats.invalid_action_rate,
        invalid_by_kind=invalid_rates(trajectories),
        by_task_type={k: v.to_dict() for k, v in stats_by_task_type(trajectories).items()},
        trajectories=list(trajectories),
        ci_low=stats.ci_low,
        ci_high=stats.ci_high,
        failed_episodes=stats.failed_episodes,
        failure_reasons=reasons[:20],
        horizon={
            "slope_points_per_turn": fit.slope_points_per_turn,
            "intercept_points": fit.intercept_points,
            "episodes_with_horizon": fit.episodes_with_horizon,
            "success_by_horizon": {str(h): {"episodes": n, "success_rate": r} for h, (n, r) in fit.points.items()},
        },
        policy=policy,
    )


def plan_tasks(episodes: int, seed: int, num_tasks: int | None) -> list[TaskSpec]:
    """Episode j -> TaskSpec(seed + j, {"task_index": perm[j % num_tasks]}) with perm a permutation drawn from
    `seed`; without a known task count the environment picks the task from the seed alone."""
    if episodes < 0:
        raise ValueError(f"episodes must be >= 0, got {episodes}")
    if not num_tasks:
        return [TaskSpec(seed + j) for j in range(episodes)]
    order = np.random.default_rng(seed).permutation(num_tasks)
    return [TaskSpec(seed + j, {"task_index": int(order[j % num_tasks])}) for j in range(episodes)]


def _chunks(items: Sequence[TaskSpec], size: int) -> Iterator[list[TaskSpec]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _strip(traj: Trajectory) -> Trajectory:
    """Drop prompts and token-level data before storing (reconstructable, and ~100x the size of the rest)."""
    for turn in traj.turns:
        turn.prompt = []
        turn.response_token_ids = []
        turn.response_logprobs = []
    return traj


def evaluate_policy(
    policy: Policy,
    env_spec: str,
    *,
    episodes: int,
    seed: int = EVAL_SEED,
    num_envs: int = 8,
    max_turns: int | None = None,
    progress: bool = False,
    results_path: Path | None = None,
    policy_name: str | None = None,
    max_retries: int = 2,
    oracle_horizon: bool = False,
    keep_prompts: bool = False,
    runner: RolloutRunner | None = None,
    env_kwargs: dict[str, Any] | None = None,
    env_workers: str = "threads",
    renderer: PromptRenderer | None = None,
) -> EvalSummary:
    """Play `episodes` episodes of `env_spec` (e.g. `ALFWorld-v0:valid_unseen`) with `policy`.

    `num_envs` environments run side by side (and the policy answers them in one batch); `max_turns`
    overrides the environment's turn limit. `results_path` makes the run resumable (module docstring);
    `policy_name` is the policy part of the resume key (default: the policy's `spec` attribute or class
    name). `oracle_horizon` plays the oracle on tasks whose trajectories carry no horizon, to fill in
    `metadata["oracle_turns"]` for the horizon plot. `keep_prompts` stores prompts and token ids in the
    results file too. Pass a `runner` to reuse its environments across calls (periodic validation); it must
    be for the same env spec and is left open. `env_workers` says where a new runner's environments run
    (threads | processes | ray, `agentgym_opsd.envpool`; a passed runner keeps its own). `renderer` sets
    how a new runner's prompts are rendered (default: the environment profile's; a trained policy plays best
    with the prompts it was trained on, `EnvConfig.prompt_renderer`).
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    name = policy_name or str(getattr(policy, "spec", "") or type(policy).__name__)
    kwargs = dict(env_kwargs or {})
    if max_turns is not None:
        kwargs["max_turns"] = int(max_turns)
    own_runner = runner is None
    if runner is None:
        runner = RolloutRunner(env_spec, num_envs=num_envs, env_kwargs=kwargs, env_workers=env_workers,
                               renderer=renderer)
    elif runner.env_spec != env_spec:
        raise ValueError(f"runner plays {runner.env_spec!r}, asked to evaluate {env_spec!r}")
    try:
        tasks = plan_tasks(episodes, seed, runner.pool.num_tasks)
        done: dict[int, Trajectory] = {}
        if results_path is not None:
            wanted = {t.seed for t in tasks}
            for rec in load_episode_records(results_path):
                if (rec.env_spec == env_spec and rec.policy == name and rec.seed in wanted
                        and rec.trajectory.error is None):
                    done[rec.seed] = rec.trajectory
        pending = [t for t in tasks if t.seed not in done]
        bar = tqdm(total=len(tasks), initial=len(tasks) - len(pending), desc=f"eval {env_spec}", unit="ep",
                   disable=not progress)
        start = time.perf_counter()
        try:
            for batch in _chunks(pending, runner.pool.num_envs):
                finished = _play_with_retries(runner, policy, batch, max_retries, progress=progress)
                if oracle_horizon:
                    _fill_oracle_horizon(runner, policy, batch, finished)
                for task, (traj, attempts) in zip(batch, finished, strict=True):
                    done[task.seed] = traj
                    if results_path is not None and traj.error is None:
                        record = EpisodeRecord(env_spec, name, task.seed, task.options.get("task_index"),
                                               attempts, traj if keep_prompts else _strip(_copy(traj)))
                        _append_line(results_path, record.to_json())
                bar.update(len(batch))
                so_far = group_stats(list(done.values()))
                bar.set_postfix(success=f"{so_far.success_rate:.2f}", failed=so_far.failed_episodes)
        finally:
            bar.close()
        seconds = time.perf_counter() - start
    finally:
        if own_runner:
            runner.close()
    summary = summarize(env_spec, [done[t.seed] for t in tasks], policy=name)
    summary.seconds, summary.episodes_played = seconds, len(pending)
    return summary


def _copy(traj: Trajectory) -> Trajectory:
    return Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))


def _append_line(path: Path, line: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()


def _play_with_retries(
    runner: RolloutRunner, policy: Policy, batch: list[TaskSpec], max_retries: int, *, progress: bool = False
) -> list[tuple[Trajectory, int]]:
    """Play a batch; replay the episodes that ended with an error, at most `max_retries` more times each.
    `progress`: a bar of the batch's turns (a batch of many episodes runs for minutes before any of them ends)."""
    results: list[tuple[Trajectory, int] | None] = [None] * len(batch)
    todo = list(range(len(batch)))
    for attempt in range(1, max_retries + 2):
        trajs = runner.run(policy, [batch[i] for i in todo], progress=progress)
        retry = []
        for i, traj in zip(todo, trajs, strict=True):
            results[i] = (traj, attempt)
            if traj.error is not None:
                retry.append(i)
                log.warning("episode seed=%d attempt %d failed: %s", batch[i].seed, attempt, traj.error)
        todo = retry
        if not todo:
            break
    for i in todo:  # still failing after every retry: an infrastructure failure, with the attempts in the reason
        traj, attempts = results[i]  # type: ignore[misc]
        traj.error = f"{traj.error} (after {attempts} attempts)"
        traj.won = False
    return [r for r in results if r is not None]


def _fill_oracle_horizon(
    runner: RolloutRunner, policy: Policy, batch: list[TaskSpec], finished: list[tuple[Trajectory, int]]
) -> None:
    """Set metadata["oracle_turns"] (turns the oracle needs) on trajectories whose env gives no horizon."""
    missing = [i for i, (traj, _) in enumerate(finished) if horizon_of(traj) is None]
    if not missing:
        return
    if isinstance(policy, OraclePolicy):
        for i in missing:
            traj = finished[i][0]
            if traj.won:
                traj.metadata["oracle_turns"] = traj.num_turns
        return
    for i, oracle_traj in zip(missing, runner.run(OraclePolicy(), [batch[i] for i in missing]), strict=True):
        if oracle_traj.succeeded:
            finished[i][0].metadata["oracle_turns"] = oracle_traj.num_turns
