"""EnvPool: B tasks x G copies of one environment, stepped together.

Copies of the same task share a seed (the G rollouts of a GRPO group start from the same state). Only
active environments are stepped. Each reset/step runs in a worker thread with a timeout; an environment that
raises or times out is marked failed, its trajectory ends flagged with the reason, and a fresh instance
replaces it for the next batch — one broken game never crashes a training run.

`BaseEnvPool` is what the rollout and evaluation see; `EnvPool` (threads, in this process) is one backend,
`workers` and `ray_actors` have the out-of-process ones (worker processes, Ray actors), `factory` `make_env_pool`.
Everything a caller needs from an environment beyond reset/step goes through an explicit pool method
(`num_tasks`, `oracle_actions`), so it works the same whether the environment is in this process or not.
"""

from __future__ import annotations

import concurrent.futures as cf
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import gymnasium as gym

__all__ = ["EVAL_SEED", "BaseEnvPool", "EnvPool", "StepResult", "TaskSpec", "failed_step", "num_tasks_of", "oracle_of",
           "raised_reason"]

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


def failed_step(reason: str) -> StepResult:
    """The result of a reset/step that did not happen: the episode ends (truncated) flagged with `reason`."""
    return StepResult("", 0.0, False, True, {"action_valid": False}, error=reason)


def raised_reason(what: str, exc: BaseException) -> str:
    """The failure reason of an environment that raised during `what` (reset, step), every backend's wording."""
    detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return f"environment raised during {what}: {detail}"


def num_tasks_of(env: gym.Env) -> int | None:
    """The environment's task count (`num_tasks` of the unwrapped env), None when it has none."""
    value = getattr(env.unwrapped, "num_tasks", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def oracle_of(env: gym.Env) -> str | Exception:
    """The expert's next action, or the exception asking for it raised (returned: the caller decides)."""
    oracle = getattr(env.unwrapped, "oracle_action", None)
    if oracle is None:
        return TypeError(f"{type(env.unwrapped).__name__} has no oracle_action()")
    try:
        return str(oracle())
    except Exception as exc:  # noqa: BLE001 - handed back to the one request that asked for it
        return exc


class BaseEnvPool(ABC):
    """`num_envs` environment slots, stepped together; the interface every backend offers.

    `reset(tasks, group_size)` assigns task i to environments [i*G, (i+1)*G); `step({index: action})` steps
    those indices only. `active[i]` is whether environment i's episode is still running (the rollout clears
    it for an episode it ends itself). A reset or step that fails comes back as a `StepResult` with `error`
    set (the episode ends flagged); it never raises.
    """

    def __init__(self, num_envs: int, *, step_timeout_s: float) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if step_timeout_s <= 0:
            raise ValueError(f"step_timeout_s must be > 0, got {step_timeout_s}")
        self.step_timeout_s = step_timeout_s
        self.active = [False] * num_envs
        self._num_envs = num_envs

    @property
    def num_envs(self) -> int:
        return self._num_envs

    def reset(self, tasks: Sequence[TaskSpec], group_size: int = 1) -> list[StepResult]:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        needed = len(tasks) * group_size
        if needed > self.num_envs:
            raise ValueError(f"{len(tasks)} tasks x {group_size} copies = {needed} > pool size {self.num_envs}")
        calls = {t * group_size + g: task for t, task in enumerate(tasks) for g in range(group_size)}
        self.active = [i in calls for i in range(self.num_envs)]
        results = self._reset(calls)
        for i, res in results.items():
            self.active[i] = not res.done
        return [results[i] for i in range(needed)]

    def step(self, actions: Mapping[int, str]) -> dict[int, StepResult]:
        inactive = [i for i in actions if not self.active[i]]
        if inactive:
            raise ValueError(f"environments {inactive} are not active (their episodes ended)")
        results = self._step(dict(actions))
        for i, res in results.items():
            self.active[i] = not res.done
        return results

    def oracle_action(self, index: int) -> str:
        """The expert's next action in environment `index` (raises what the environment raised)."""
        outcome = self.oracle_actions([index])[index]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    @abstractmethod
    def oracle_actions(self, indices: Sequence[int]) -> dict[int, str | Exception]:
        """The expert's next action in each of `indices`, or the exception that asking for it raised."""

    @property
    @abstractmethod
    def num_tasks(self) -> int | None:
        """How many distinct tasks the environment's `reset` chooses from (None when it does not say)."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def _reset(self, calls: dict[int, TaskSpec]) -> dict[int, StepResult]: ...

    @abstractmethod
    def _step(self, actions: dict[int, str]) -> dict[int, StepResult]: ...

    def __enter__(self) -> BaseEnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EnvPool(BaseEnvPool):
    """A fixed number of environment instances made by `env_fn`, in this process.

    Each reset/step runs in a thread of a pool. I/O-bound environments (HTTP, browser) overlap; CPU-bound
    ones are no slower than a loop (and no faster: the GIL) — those want `env_workers=processes`.
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        num_envs: int,
        *,
        step_timeout_s: float = 60.0,
        max_workers: int | None = None,
    ) -> None:
        super().__init__(num_envs, step_timeout_s=step_timeout_s)
        self.env_fn = env_fn
        self.envs: list[gym.Env | None] = [None] * num_envs
        self._executor = cf.ThreadPoolExecutor(max_workers=max_workers or min(num_envs, 32),
                                               thread_name_prefix="envpool")

    def env(self, index: int) -> gym.Env:
        env = self.envs[index]
        if env is None:
            env = self.envs[index] = self.env_fn()
        return env

    def unwrapped(self, index: int) -> Any:
        """The environment object itself (this backend only; portable code uses the pool's methods)."""
        return self.env(index).unwrapped

    @property
    def num_tasks(self) -> int | None:
        return num_tasks_of(self.env(0))

    def oracle_actions(self, indices: Sequence[int]) -> dict[int, str | Exception]:
        return {i: oracle_of(self.env(i)) for i in indices}

    def close(self) -> None:
        for env in self.envs:
            if env is not None:
                try:
                    env.close()
                except Exception:  # noqa: BLE001 - closing must not hide the real error of a run
                    pass
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ---- internals -------------------------------------------------------------------------------------
    def _reset(self, calls: dict[int, TaskSpec]) -> dict[int, StepResult]:
        return self._run({i: partial(self._reset_one, i, task) for i, task in calls.items()}, what="reset")

    def _step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        return self._run({i: partial(self._step_one, i, a) for i, a in actions.items()}, what="step")

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
                results[i] = self._failed(i, raised_reason(what, exc))
        for fut in not_done:
            i = futures[fut]
            fut.cancel()
            results[i] = self._failed(i, f"{what} timed out after {self.step_timeout_s:.1f}s")
        return results

    def _failed(self, index: int, reason: str) -> StepResult:
        # The instance may be in any state (or still running in its thread): never reuse it.
        self.envs[index] = None
        return failed_step(reason)
