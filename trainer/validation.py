"""Validation during training: held-out episodes through the evaluation suite, and sampled success on the
fixed training pool.

Held-out episodes use reset seeds from 10_000 on (never a training seed) at the validation temperature; the
pool check plays every pool game `eval_pool_rollouts` times at the rollout temperature with seeds above
the training range, so no training episode repeats. Every rank plays the same episodes with the same seeds
(same numbers on every rank).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.records import Trajectory
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
    every generation phase runs in (the vLLM engine woken and synced). The held-out runner is built on first
    use, with `make_runner(env_spec, num_envs)`."""

    def __init__(self, cfg: Config, profile: EnvProfile, train_runner: RolloutRunner,
                 make_runner: Callable[[str, int], RolloutRunner], generating: Generating) -> None:
        self.cfg = cfg
        self.profile = profile
        self.train_runner = train_runner
        self.make_runner = make_runner
        self.generating = generating
        self._runner: RolloutRunner | None = None

    def env_spec(self) -> str:
        """`env.val_id`, else the unseen split of the training environment when it has one."""
        if self.cfg.env.val_id:
            return self.cfg.env.val_id
        base, split = parse_env_spec(self.cfg.env.id)
        if "valid_seen" in self.profile.splits and split not in (None, "valid_seen"):
            return f"{base.partition('/')[2]}:valid_seen"
        return self.cfg.env.id

    def run(self, sampler_at: Callable[[float, int], Any], step: int) -> dict[str, float]:
        out = self.held_out(sampler_at(self.cfg.trainer.eval_temperature, TRAIN_SEED_LIMIT + step))
        if self.cfg.trainer.eval_pool_rollouts and self.cfg.env.num_train_tasks:
            out.update(self.pool(sampler_at(self.cfg.rollout.temperature, 2 * TRAIN_SEED_LIMIT + step)))
        return out

    def held_out(self, policy: Any) -> dict[str, float]:
        """Held-out episodes (seeds >= 10_000) through the evaluation suite."""
        from agentgym_opsd.evaluation.runner import evaluate_policy

        t = self.cfg.trainer
        spec = self.env_spec()
        num_envs = min(t.eval_episodes, self.train_runner.pool.num_envs)
        if self._runner is None:
            self._runner = self.make_runner(spec, num_envs)
        t0 = time.perf_counter()
        with self.generating():
            summary = evaluate_policy(policy, spec, episodes=t.eval_episodes, num_envs=num_envs, runner=self._runner)
        out = {"val/success_rate": summary.success_rate, "val/episodes": float(summary.episodes),
               "val/score": summary.score_mean,
               "val/turns_mean": summary.turns_mean, "val/invalid_action_rate": summary.invalid_action_rate,
               "seconds_validation": time.perf_counter() - t0}
        out.update(summary.metrics("val"))
        return out

    def pool(self, policy: Any) -> dict[str, float]:
        """Sampled success on the fixed training pool (`env.num_train_tasks` games, `eval_pool_rollouts`
        copies each): the direct check that the optimiser improves the policy on the games it trains on."""
        copies = self.cfg.trainer.eval_pool_rollouts
        runner = self.train_runner
        per_call = max(runner.pool.num_envs // copies, 1)
        t0 = time.perf_counter()
        trajs: list[Trajectory] = []
        tasks = [TaskSpec(TRAIN_SEED_LIMIT + i, {"task_index": i}) for i in range(self.cfg.env.num_train_tasks)]
        with self.generating():
            for start in range(0, len(tasks), per_call):  # group ids unique over the calls (group_diversity)
                trajs += runner.run(policy, tasks[start:start + per_call], group_size=copies,
                                    first_group_id=start, first_traj_id=start * copies)
        turns = max(sum(x.num_turns for x in trajs), 1)
        return {"pool/success_rate": sum(x.won for x in trajs) / max(len(trajs), 1),
                "pool/invalid_action_rate": sum(x.num_invalid_actions for x in trajs) / turns,
                **group_diversity(trajs, prefix="pool/"),
                "pool/episodes": float(len(trajs)), "seconds_pool": time.perf_counter() - t0}

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
