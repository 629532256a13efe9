"""Pools of environments stepped together, in this process or out of it.

`base` is what the rollout and evaluation see (`BaseEnvPool`) and the thread backend (`EnvPool`); `workers`
hosts environments in worker processes and `ray_actors` in Ray actors (the same worker protocol); `factory`
picks one by name (`rollout.env_workers = threads | processes | ray`). Imports run base <- workers <-
ray_actors, and factory over them; Ray is imported only when chosen.
"""

from agentgym_opsd.envpool.base import (
    EVAL_SEED,
    BaseEnvPool,
    EnvPool,
    StepResult,
    TaskSpec,
    failed_step,
    num_tasks_of,
    oracle_of,
    raised_reason,
)
from agentgym_opsd.envpool.factory import ENV_WORKERS, make_env_pool
from agentgym_opsd.envpool.workers import (
    EnvFactory,
    EnvWorkerError,
    ProcessEnvPool,
    RemoteEnvPool,
    WorkerDied,
    WorkerEnvs,
    default_num_workers,
)

__all__ = [
    "ENV_WORKERS",
    "EVAL_SEED",
    "BaseEnvPool",
    "EnvFactory",
    "EnvPool",
    "EnvWorkerError",
    "ProcessEnvPool",
    "RemoteEnvPool",
    "StepResult",
    "TaskSpec",
    "WorkerDied",
    "WorkerEnvs",
    "default_num_workers",
    "failed_step",
    "make_env_pool",
    "num_tasks_of",
    "oracle_of",
    "raised_reason",
]
