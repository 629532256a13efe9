"""Validation during training: held-out episodes through the evaluation suite, and sampled success on the
fixed training pool.

Held-out episodes use reset seeds from 10_000 on (never a training seed) at the validation temperature; the
pool check plays every pool game `eval_pool_rollouts` times at the rollout temperature with seeds above
the training range, so no training episode repeats. Every rank plays the same episodes with the same seeds
(same numbers on every rank).

Several environments (a mixed `env.id`, or `env.val_id` listing several): each validation environment plays
`eval_episodes` episodes and writes its `val/<spec>/...` keys; `val/success_rate` and the other plain keys are
over all episodes. The pool check plays every training environment's pool and adds `pool/<spec>/...` keys.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.records import Trajectory, invalid_rates
from agentgym_opsd.registry import EnvProfile, parse_env_spec
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer.config import Config
from agentgym_opsd.trainer.dynamic_sampling import group_diversity
from agentgym_opsd.trainer.task_stream import TRAIN_SEED_LIMIT

__all__ = ["Validation"]

Generating = Callable[[], contextlib.AbstractContextManager[Any]]


class Validation:
    """`run(sampler_at, step)` -> the `val/...` (and `pool/...`) metrics of one validation point.

    `sampler_at(temperature, seed)` gives a policy over the current weights; `generating()` is the context
    every generation phase runs in (the vLLM engine woken and synced). `train_runners`: the training
    environments' runners by spec (the pool check plays them). The held-out runners are built on first use,
    with `make_runner(env_spec, num_envs)`."""

    def __init__(self, cfg: Config, train_runners: Mapping[str, RolloutRunner],
                 make_runner: Callable[[str, int], RolloutRunner], generating: Generating) -> None:
        self.cfg = cfg
        self.train_runners = dict(train_runners)
        self.make_runner = make_runner
        self.generating = generating
        self._runners: dict[str, RolloutRunner] = {}

    @staticmethod
    def default_spec(train_spec: str, profile: EnvProfile) -> str:
        """The unseen split of a training environment when it has one, else the training spec itself."""
        base, split = parse_env_spec(train_spec)
        if "valid_seen" in profile.splits and split not in (None, "valid_seen"):
            return f"{base.partition('/')[2]}:valid_seen"
        return train_spec

    def env_specs(self) -> list[str]:
        """`env.val_id` (one or several), else each training environment's `default_spec` (once each)."""
        if self.cfg.env.val_id:
            return self.cfg.env.val_specs
        specs = [self.default_spec(spec, runner.profile) for spec, runner in self.train_runners.items()]
        return list(dict.fromkeys(specs))

    def run(self, sampler_at: Callable[[float, int], Any], step: int) -> dict[str, float]:
        out = self.held_out(sampler_at(self.cfg.trainer.eval_temperature, TRAIN_SEED_LIMIT + step))
        if self.cfg.trainer.eval_pool_rollouts and self.cfg.env.num_train_tasks:
            out.update(self.pool(sampler_at(self.cfg.rollout.temperature, 2 * TRAIN_SEED_LIMIT + step)))
        return out

    def held_out(self, policy: Any) -> dict[str, float]:
        """Held-out episodes (seeds >= 10_000) through the evaluation suite, `eval_episodes` per environment."""
        from agentgym_opsd.evaluation.runner import evaluate_policy

        t = self.cfg.trainer
        specs = self.env_specs()
        num_envs = min(t.eval_episodes, next(iter(self.train_runners.values())).pool.num_envs)
        for spec in specs:
            if spec not in self._runners:
                self._runners[spec] = self.make_runner(spec, num_envs)
        t0 = time.perf_counter()
        with self.generating():
            summaries = [evaluate_policy(policy, spec, episodes=t.eval_episodes, num_envs=num_envs,
                                         runner=self._runners[spec]) for spec in specs]
        seconds = time.perf_counter() - t0
        if len(summaries) == 1:
            (summary,) = summaries
            out = {"val/success_rate": summary.success_rate, "val/episodes": float(summary.episodes),
                   "val/score": summary.score_mean,
                   "val/turns_mean": summary.turns_mean, "val/invalid_action_rate": summary.invalid_action_rate,
                   "seconds_validation": seconds}
            out.update(summary.metrics("val"))
            return out
        episodes = sum(s.episodes for s in summaries)
        turns = [s.turns_mean * s.episodes for s in summaries]
        out = {"val/success_rate": sum(s.success_rate * s.episodes for s in summaries) / max(episodes, 1),
               "val/episodes": float(episodes),
               "val/score": sum(s.score_mean * s.episodes for s in summaries) / max(episodes, 1),
               "val/turns_mean": sum(turns) / max(episodes, 1),
               "val/invalid_action_rate": sum(s.invalid_action_rate * n for s, n in zip(summaries, turns, strict=True))
               / max(sum(turns), 1e-12),
               "seconds_validation": seconds}
        for summary in summaries:
            out.update(summary.metrics("val"))
        # the per-kind invalid rates are written without the spec: over all environments' turns
        out.update({f"val/{kind}": rate for kind, rate in
                    invalid_rates([x for s in summaries for x in s.trajectories]).items()})
        return out

    def pool(self, policy: Any) -> dict[str, float]:
        """Sampled success on the fixed training pool (`env.num_train_tasks` games of each training environment,
        `eval_pool_rollouts` copies each): the direct check that the optimiser improves the policy on the games
        it trains on."""
        copies = self.cfg.trainer.eval_pool_rollouts
        t0 = time.perf_counter()
        per_env: dict[str, list[Trajectory]] = {}
        tasks = [TaskSpec(TRAIN_SEED_LIMIT + i, {"task_index": i}) for i in range(self.cfg.env.num_train_tasks)]
        with self.generating():
            for k, (spec, runner) in enumerate(self.train_runners.items()):
                per_call = max(runner.pool.num_envs // copies, 1)
                trajs = per_env.setdefault(spec, [])
                for start in range(0, len(tasks), per_call):  # group ids unique over the calls (group_diversity)
                    first = k * len(tasks) + start
                    trajs += runner.run(policy, tasks[start:start + per_call], group_size=copies,
                                        first_group_id=first, first_traj_id=first * copies)
        everything = [x for trajs in per_env.values() for x in trajs]
        out = {**_pool_rates(everything, "pool/"), **group_diversity(everything, prefix="pool/"),
               "pool/episodes": float(len(everything)), "seconds_pool": time.perf_counter() - t0}
        if len(per_env) > 1:
            for spec, trajs in per_env.items():
                out.update(_pool_rates(trajs, f"pool/{spec}/"))
        return out

    def close(self) -> None:
        for runner in self._runners.values():
            runner.close()


def _pool_rates(trajs: list[Trajectory], prefix: str) -> dict[str, float]:
    turns = max(sum(x.num_turns for x in trajs), 1)
    n = max(len(trajs), 1)
    return {f"{prefix}success_rate": sum(x.won for x in trajs) / n, f"{prefix}score": sum(x.score for x in trajs) / n,
            f"{prefix}invalid_action_rate": sum(x.num_invalid_actions for x in trajs) / turns}
