"""EnvPool: B tasks x G copies of one environment, stepped together.

Copies of the same task share a seed (the G rollouts of a GRPO group start from the same state). Only
active environments are stepped. Each reset/step runs in a worker thread with a timeout; an environment that
raises or times out is marked failed, its trajectory ends flagged with the reason, and a fresh instance
replaces it for the next batch — one broken game never crashes a training run.
"""

from __future__ import annotations

import concurrent.futures as cf
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

__all__ = ["EVAL_SEED", "EnvPool", "StepResult", "TaskSpec"]

EVAL_SEED = 10_000
"""The train/evaluation seed boundary: training resets use seeds below it, evaluation starts at it."""


@dataclass(frozen=True)
class TaskSpec:
    """Which task to play: `seed` for `reset`, plus reset options (e.g. a split's task index)."""

    seed: int
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated or self.error is not None


class EnvPool:
    """A fixed number of environment instances made by `env_fn`.

    `reset(tasks, group_size)` assigns task i to environments [i*G, (i+1)*G); `step({index: action})` steps
    those indices only, in parallel threads. I/O-bound environments (HTTP, browser) overlap; CPU-bound ones
    are no slower than a loop.
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        num_envs: int,
        *,
        step_timeout_s: float = 60.0,
        max_workers: int | None = None,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if step_timeout_s <= 0:
            raise ValueError(f"step_timeout_s must be > 0, got {step_timeout_s}")
        self.env_fn = env_fn
        self.step_timeout_s = step_timeout_s
        self.envs: list[gym.Env | None] = [None] * num_envs
        self.active = [False] * num_envs
        self._executor = cf.ThreadPoolExecutor(max_workers=max_workers or min(num_envs, 32),
                                               thread_name_prefix="envpool")

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def env(self, index: int) -> gym.Env:
        env = self.envs[index]
        if env is None:
            env = self.envs[index] = self.env_fn()
        return env

    def unwrapped(self, index: int) -> Any:
        return self.env(index).unwrapped

    def reset(self, tasks: Sequence[TaskSpec], group_size: int = 1) -> list[StepResult]:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        needed = len(tasks) * group_size
        if needed > self.num_envs:
            raise ValueError(f"{len(tasks)} tasks x {group_size} copies = {needed} > pool size {self.num_envs}")
        calls = {}
        for t, task in enumerate(tasks):
            for g in range(group_size):
                i = t * group_size + g
                calls[i] = (lambda i=i, task=task: self._reset_one(i, task))
        self.active = [i in calls for i in range(self.num_envs)]
        results = self._run(calls, what="reset")
        for i, res in results.items():
            self.active[i] = not res.done
        return [results[i] for i in range(needed)]

    def step(self, actions: Mapping[int, str]) -> dict[int, StepResult]:
        inactive = [i for i in actions if not self.active[i]]
        if inactive:
            raise ValueError(f"environments {inactive} are not active (their episodes ended)")
        calls = {i: (lambda i=i, a=a: self._step_one(i, a)) for i, a in actions.items()}
        results = self._run(calls, what="step")
        for i, res in results.items():
            self.active[i] = not res.done
        return results

    def close(self) -> None:
        for env in self.envs:
            if env is not None:
                try:
                    env.close()
                except Exception:  # noqa: BLE001 - closing must not hide the real error of a run
                    pass
        self._executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals -------------------------------------------------------------------------------------
    def _reset_one(self, index: int, task: TaskSpec) -> StepResult:
        observation, info = self.env(index).reset(seed=task.seed, options=dict(task.options))
        return StepResult(observation, 0.0, False, False, info)

    def _step_one(self, index: int, action: str) -> StepResult:
        observation, reward, terminated, truncated, info = self.env(index).step(action)
        return StepResult(observation, float(reward), terminated, truncated, info)

    def _run(self, calls: Mapping[int, Callable[[], StepResult]], what: str) -> dict[int, StepResult]:
        futures = {self._executor.submit(fn): i for i, fn in calls.items()}
        done, not_done = cf.wait(futures, timeout=self.step_timeout_s)
        results: dict[int, StepResult] = {}
        for fut in done:
            i = futures[fut]
            exc = fut.exception()
            if exc is None:
                results[i] = fut.result()
            else:
                detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                results[i] = self._failed(i, f"environment raised during {what}: {detail}")
        for fut in not_done:
            i = futures[fut]
            fut.cancel()
            results[i] = self._failed(i, f"{what} timed out after {self.step_timeout_s:.1f}s")
        return results

    def _failed(self, index: int, reason: str) -> StepResult:
        # The instance may be in any state (or still running in its thread): never reuse it.
        self.envs[index] = None
        return StepResult("", 0.0, False, True, {"action_valid": False}, error=reason)
