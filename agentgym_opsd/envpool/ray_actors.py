"""`rollout.env_workers = ray`: the pool's environment workers as Ray actors (the `ray` extra).

The same workers as `processes` (`workers.WorkerEnvs`, the same commands and failure handling), placed
by Ray: on this machine with a local Ray, or across a cluster's CPU nodes when the driver joined one
(`ray.init(address=...)` before the pool is made). Imported only when chosen.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import ray
from ray.exceptions import RayError

from agentgym_opsd.envpool.workers import RemoteEnvPool, WorkerDied, WorkerEnvs

__all__ = ["RayEnvPool"]


class _EnvActor:
    def __init__(self, sys_path: list[str], env_fn: Callable[[], gym.Env], indices: list[int]) -> None:
        # A local Ray worker does not see the driver's sys.path (tests/, a user's folder); environments
        # registered from there must import the same way as in the driver (multiprocessing's spawn does this).
        sys.path.extend(p for p in sys_path if p not in sys.path)
        self.host = WorkerEnvs(env_fn, indices)

    def answer(self, command: str, payload: Any) -> tuple[str, Any]:
        return self.host.answer(command, payload)

    def pid(self) -> int:
        return os.getpid()


class RayEnvPool(RemoteEnvPool):
    """`num_workers` Ray actors of `cpus_per_worker` CPUs (default: one actor per CPU of the cluster).

    Starts a local Ray (no dashboard) when none is running, and shuts it down on `close`."""

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        num_envs: int,
        *,
        step_timeout_s: float = 60.0,
        num_workers: int | None = None,
        start_timeout_s: float = 120.0,
        cpus_per_worker: float | None = None,
    ) -> None:
        if cpus_per_worker is not None and cpus_per_worker <= 0:
            raise ValueError(f"cpus_per_worker must be > 0, got {cpus_per_worker}")
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(include_dashboard=False)
        # More actors than the cluster can schedule would wait forever to start: by default one actor per CPU;
        # asked for more workers than CPUs, they share the CPUs.
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        if cpus_per_worker is None:
            cpus_per_worker = 1.0 if num_workers is None else min(1.0, cpus / num_workers)
        if num_workers is None:
            num_workers = max(1, int(cpus // cpus_per_worker))
        # max_restarts=0: a dead actor is replaced by the pool (with its environments flagged), not by Ray.
        self._actor_cls = ray.remote(_EnvActor).options(num_cpus=cpus_per_worker, max_restarts=0)
        self._actors: dict[int, Any] = {}
        self._refs: dict[int, Any] = {}
        super().__init__(env_fn, num_envs, step_timeout_s=step_timeout_s, num_workers=num_workers,
                         start_timeout_s=start_timeout_s)

    def worker_pids(self) -> list[int]:
        return ray.get([self._actors[w].pid.remote() for w in range(self.num_workers)])

    def close(self) -> None:
        super().close()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    def _start(self, worker: int) -> None:
        self._actors[worker] = self._actor_cls.remote(list(sys.path), self.env_fn, self.hosted[worker])

    def _send(self, worker: int, command: str, payload: Any) -> WorkerDied | None:
        # A dead actor still takes the call; its death shows when the answer is fetched.
        self._refs[worker] = self._actors[worker].answer.remote(command, payload)
        return None

    def _receive(self, workers: set[int], timeout_s: float) -> dict[int, tuple[str, Any] | WorkerDied]:
        refs = {self._refs[w]: w for w in workers}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        out: dict[int, tuple[str, Any] | WorkerDied] = {}
        for ref in ready:
            try:
                out[refs[ref]] = ray.get(ref)
            except RayError as exc:  # the actor died (RayActorError), or could not even run the call
                out[refs[ref]] = WorkerDied(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        return out

    def _stop(self, worker: int, *, graceful: bool) -> None:
        actor = self._actors.pop(worker, None)
        self._refs.pop(worker, None)
        if actor is None:
            return
        if graceful:
            try:
                ray.get(actor.answer.remote("close", None), timeout=5.0)
            except Exception:  # noqa: BLE001 - stopping anyway
                pass
        ray.kill(actor, no_restart=True)
