"""`rollout.env_workers = threads | processes | ray`: the backend table and `make_env_pool`.

Ray is an optional extra: `ray_actors` is imported only when `ray` is chosen.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym

from agentgym_opsd.envpool.base import BaseEnvPool, EnvPool
from agentgym_opsd.envpool.workers import ProcessEnvPool

__all__ = ["ENV_WORKERS", "make_env_pool"]


def _thread_pool(env_fn: Callable[[], gym.Env], num_envs: int, *, step_timeout_s: float,
                 num_workers: int | None) -> BaseEnvPool:
    return EnvPool(env_fn, num_envs, step_timeout_s=step_timeout_s, max_workers=num_workers)


def _process_pool(env_fn: Callable[[], gym.Env], num_envs: int, *, step_timeout_s: float,
                  num_workers: int | None) -> BaseEnvPool:
    return ProcessEnvPool(env_fn, num_envs, step_timeout_s=step_timeout_s, num_workers=num_workers)


def _ray_pool(env_fn: Callable[[], gym.Env], num_envs: int, *, step_timeout_s: float,
              num_workers: int | None) -> BaseEnvPool:
    try:  # Ray is an optional extra, imported only when chosen
        from agentgym_opsd.envpool.ray_actors import RayEnvPool
    except ImportError as exc:
        raise ImportError(f"env_workers=ray needs Ray: pip install 'agentgym-opsd[ray]' ({exc})") from exc
    return RayEnvPool(env_fn, num_envs, step_timeout_s=step_timeout_s, num_workers=num_workers)


ENV_WORKERS: dict[str, Callable[..., BaseEnvPool]] = {
    "threads": _thread_pool,
    "processes": _process_pool,
    "ray": _ray_pool,
}
"""`rollout.env_workers` -> pool constructor `(env_fn, num_envs, *, step_timeout_s, num_workers)`."""


def make_env_pool(
    env_workers: str,
    env_fn: Callable[[], gym.Env],
    num_envs: int,
    *,
    step_timeout_s: float = 60.0,
    num_workers: int | None = None,
) -> BaseEnvPool:
    """A pool of `num_envs` environments made by `env_fn` (picklable for processes / ray, e.g. `EnvFactory`)
    on the `env_workers` backend; `num_workers` threads, processes or actors (None = the backend's default)."""
    if env_workers not in ENV_WORKERS:
        raise ValueError(f"env_workers must be one of {', '.join(ENV_WORKERS)}; got {env_workers!r}")
    return ENV_WORKERS[env_workers](env_fn, num_envs, step_timeout_s=step_timeout_s, num_workers=num_workers)
