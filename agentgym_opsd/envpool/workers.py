"""Environments out of this process: the worker protocol (`WorkerEnvs`, `RemoteEnvPool`) and the
`processes` backend (`ProcessEnvPool`; `ray_actors` places the same workers as Ray actors).

Worker w holds a contiguous block of the pool's indices, so the G copies of a task (a GRPO group) share a worker
and its caches; it steps its environments one after another while the workers run side by side, so CPU-bound
environments (ALFWorld's engine holds one lock per process) use as many cores as there are workers. An
environment that raises ends its trajectory flagged (`environment raised during step: ...`). A worker that dies or
does not answer within `step_timeout_s` is killed and replaced; its environments end their episodes flagged, the
others go on. Workers start with `spawn` (the trainer's torch, CUDA and threads do not survive a fork), so a
script must make a `processes` pool under `if __name__ == "__main__":`, and environments travel as picklable
`EnvFactory` recipes: one registered from a `.py` file by path (`--import my_env.py`) cannot be made in a worker.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import pickle
import signal
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any, Final

import gymnasium as gym

from agentgym_opsd.envpool.base import (
    BaseEnvPool,
    StepResult,
    TaskSpec,
    failed_step,
    num_tasks_of,
    oracle_of,
    raised_reason,
)
from agentgym_opsd.registry import (
    EnvProfile,
    discover_plugins,
    env_profile,
    make,
    parse_env_spec,
    register_env,
)

__all__ = [
    "EnvFactory",
    "EnvWorkerError",
    "ProcessEnvPool",
    "RemoteEnvPool",
    "WorkerEnvs",
    "WorkerDied",
    "default_num_workers",
]

START_METHOD: Final = "spawn"
"""A fresh interpreter per worker: the trainer's process holds torch, CUDA and threads, none of which survive
a fork safely. (forkserver would start workers faster, but its server is process-wide state.)"""


class EnvWorkerError(RuntimeError):
    """A worker could not start, or an out-of-band call (num_tasks, oracle) lost its worker."""


@dataclass(frozen=True)
class _Registration:
    env_id: str
    entry_point: Any  # "module:Class" (or a class, pickled by reference)
    kwargs: dict[str, Any]
    profile: EnvProfile

    def ensure(self) -> None:
        discover_plugins()  # first, so a built-in id is registered the normal way
        if self.env_id not in gym.registry:
            register_env(self.env_id, self.entry_point, profile=self.profile, kwargs=self.kwargs)


@dataclass(frozen=True)
class EnvFactory:
    """`make(env_spec, **kwargs)` as a picklable object, for environments made in another process.

    A worker starts with only the environments its imports register (built-in ones, installed plugins). An id
    registered at run time in this process (a test's toy environment, an `--import`ed module of an installed
    package) travels in `registration` and is registered again in the worker before `make`."""

    env_spec: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    registration: _Registration | None = None

    @classmethod
    def for_spec(cls, env_spec: str, kwargs: dict[str, Any] | None = None) -> EnvFactory:
        env_id, _ = parse_env_spec(env_spec)
        profile = env_profile(env_id)  # an unknown id fails here, once, not in every worker
        spec = gym.spec(env_id)
        return cls(env_spec, dict(kwargs or {}), _Registration(env_id, spec.entry_point, dict(spec.kwargs), profile))

    def __call__(self) -> gym.Env:
        if self.registration is not None:
            self.registration.ensure()
        return make(self.env_spec, **self.kwargs)


class WorkerEnvs:
    """The environments one worker hosts (this object lives in the worker). `answer(command, payload)` is
    the whole protocol; an environment's own failure is part of its answer, never an exception."""

    def __init__(self, env_fn: Callable[[], gym.Env], indices: Iterable[int]) -> None:
        self.env_fn = env_fn
        self.envs: dict[int, gym.Env | None] = dict.fromkeys(indices)
        self._handlers: dict[str, Callable[[Any], Any]] = {
            "ping": lambda _: os.getpid(), "reset": self.reset, "step": self.step, "oracle": self.oracle,
            "num_tasks": self.num_tasks, "close": lambda _: self.close(),
        }

    def answer(self, command: str, payload: Any) -> tuple[str, Any]:
        """("ok", value), or ("error", why) when the worker itself failed (a bug, not an environment's)."""
        handler = self._handlers.get(command)
        if handler is None:
            return "error", f"unknown command {command!r}"
        try:
            return "ok", handler(payload)
        except Exception as exc:  # noqa: BLE001 - sent back to the pool, which replaces this worker
            return "error", f"{type(exc).__name__}: {exc}"

    def env(self, index: int) -> gym.Env:
        env = self.envs[index]
        if env is None:
            env = self.envs[index] = self.env_fn()
        return env

    def reset(self, calls: dict[int, tuple[int, dict[str, Any]]]) -> dict[int, StepResult]:
        results = {}
        for i, (seed, options) in calls.items():
            try:
                observation, info = self.env(i).reset(seed=seed, options=options)
                results[i] = StepResult(observation, 0.0, False, False, info)
            except Exception as exc:  # noqa: BLE001 - one broken game ends one trajectory, flagged
                results[i] = self._failed(i, raised_reason("reset", exc))
        return results

    def step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        results = {}
        for i, action in actions.items():
            try:
                observation, reward, terminated, truncated, info = self.env(i).step(action)
                results[i] = StepResult(observation, float(reward), terminated, truncated, info)
            except Exception as exc:  # noqa: BLE001 - as in reset
                results[i] = self._failed(i, raised_reason("step", exc))
        return results

    def oracle(self, indices: list[int]) -> dict[int, str | Exception]:
        return {i: _portable(oracle_of(self.env(i))) for i in indices}

    def num_tasks(self, index: int) -> int | None:
        return num_tasks_of(self.env(index))

    def close(self) -> None:
        for env in self.envs.values():
            if env is not None:
                try:
                    env.close()
                except Exception:  # noqa: BLE001 - closing must not hide the real error of a run
                    pass

    def _failed(self, index: int, reason: str) -> StepResult:
        self.envs[index] = None  # in an unknown state: a fresh instance for the next reset
        return failed_step(reason)


def _portable(value: str | Exception) -> str | Exception:
    """An exception that does not pickle (it holds a lock, a socket) travels as a RuntimeError with its text."""
    if isinstance(value, Exception):
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001 - any pickling failure
            return RuntimeError(f"{type(value).__name__}: {value}")
    return value


def default_num_workers() -> int:
    """The cores this process may use (a worker per core: environments are CPU-bound or wait on I/O)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _blocks(num_envs: int, num_workers: int) -> list[list[int]]:
    """Contiguous, near-equal blocks of env indices, one per worker."""
    base, extra = divmod(num_envs, num_workers)
    blocks, start = [], 0
    for w in range(num_workers):
        size = base + (w < extra)
        blocks.append(list(range(start, start + size)))
        start += size
    return blocks


@dataclass(frozen=True)
class WorkerDied:
    """A worker's answer that never came: it was dead or killed (`detail` says how)."""

    detail: str


class RemoteEnvPool(BaseEnvPool):
    """Environments hosted by workers outside this process; subclasses say how a worker is started, sent a
    command, waited on and stopped (`_start`, `_send`, `_receive`, `_stop`)."""

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        num_envs: int,
        *,
        step_timeout_s: float = 60.0,
        num_workers: int | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        super().__init__(num_envs, step_timeout_s=step_timeout_s)
        if num_workers is not None and num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 (or None = one per core), got {num_workers}")
        self.env_fn = env_fn
        self.start_timeout_s = start_timeout_s
        self.hosted = _blocks(num_envs, min(num_workers or default_num_workers(), num_envs))
        self.worker_of = [w for w, block in enumerate(self.hosted) for _ in block]
        self.replacements = 0
        """How many workers were replaced because they died or hung."""
        self._lost: dict[int, str] = {}  # env index -> why its state is gone (its worker was replaced)
        self._num_tasks: tuple[int | None] | None = None
        try:
            for w in range(self.num_workers):
                self._start(w)
            self._await_ready(range(self.num_workers))
        except BaseException:
            self.close()
            raise

    @property
    def num_workers(self) -> int:
        return len(self.hosted)

    @property
    def num_tasks(self) -> int | None:
        if self._num_tasks is None:  # the environment's constant: asked once, of environment 0
            replies, failures = self._exchange("num_tasks", {self.worker_of[0]: 0}, self.step_timeout_s)
            if failures:
                raise EnvWorkerError(f"num_tasks: {next(iter(failures.values()))}")
            self._num_tasks = (next(iter(replies.values())),)
        return self._num_tasks[0]

    def oracle_actions(self, indices: Sequence[int]) -> dict[int, str | Exception]:
        out: dict[int, str | Exception] = {i: EnvWorkerError(self._lost[i]) for i in indices if i in self._lost}
        by_worker = self._by_worker({i: i for i in indices if i not in self._lost})
        replies, failures = self._exchange("oracle", {w: list(b) for w, b in by_worker.items()}, self.step_timeout_s)
        for reply in replies.values():
            out.update(reply)
        for w, reason in failures.items():
            out.update({i: EnvWorkerError(reason) for i in by_worker[w]})
        return out

    def close(self) -> None:
        for w in range(self.num_workers):
            try:
                self._stop(w, graceful=True)
            except Exception:  # noqa: BLE001 - closing must not hide the real error of a run
                pass

    # ---- what a transport implements ---------------------------------------------------------------------
    @abstractmethod
    def _start(self, worker: int) -> None:
        """Start worker `worker` hosting `self.hosted[worker]` (returns at once; `ping` says when it is up)."""

    @abstractmethod
    def _send(self, worker: int, command: str, payload: Any) -> WorkerDied | None:
        """Send one command; a `WorkerDied` when the worker is already gone."""

    @abstractmethod
    def _receive(self, workers: set[int], timeout_s: float) -> dict[int, tuple[str, Any] | WorkerDied]:
        """The answers (or deaths) of those of `workers` that come within `timeout_s` (at least one, unless
        the time runs out)."""

    @abstractmethod
    def _stop(self, worker: int, *, graceful: bool) -> None:
        """Stop the worker: ask it to close its environments (graceful) or kill it at once."""

    # ---- internals -----------------------------------------------------------------------------------------
    def _reset(self, calls: dict[int, TaskSpec]) -> dict[int, StepResult]:
        for i in calls:
            self._lost.pop(i, None)  # a reset starts a new episode, in whichever worker hosts the index now
        return self._run("reset", self._by_worker({i: (t.seed, dict(t.options)) for i, t in calls.items()}))

    def _step(self, actions: dict[int, str]) -> dict[int, StepResult]:
        results = {i: failed_step(self._lost[i]) for i in actions if i in self._lost}
        results.update(self._run("step", self._by_worker({i: a for i, a in actions.items() if i not in self._lost})))
        return results

    def _by_worker(self, items: dict[int, Any]) -> dict[int, dict[int, Any]]:
        out: dict[int, dict[int, Any]] = {}
        for i, value in items.items():
            out.setdefault(self.worker_of[i], {})[i] = value
        return out

    def _run(self, command: str, by_worker: dict[int, dict[int, Any]]) -> dict[int, StepResult]:
        replies, failures = self._exchange(command, by_worker, self.step_timeout_s)
        results: dict[int, StepResult] = {}
        for reply in replies.values():
            results.update(reply)
        for w, reason in failures.items():
            results.update({i: failed_step(reason) for i in by_worker[w]})
        return results

    def _exchange(self, command: str, payloads: dict[int, Any], timeout_s: float) -> tuple[dict[int, Any], dict[int, str]]:
        """Send each worker its payload, wait for every answer until `timeout_s`; the workers that died,
        failed or did not answer in time are replaced. Returns (answers, worker -> failure reason)."""
        failures: dict[int, str] = {}
        pending = set()
        for w, payload in payloads.items():
            died = self._send(w, command, payload)
            if died is None:
                pending.add(w)
            else:
                failures[w] = f"environment worker {w} died before {command} ({died.detail})"
        replies: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while pending and (remaining := deadline - time.monotonic()) > 0:
            for w, outcome in self._receive(pending, remaining).items():
                pending.discard(w)
                if isinstance(outcome, WorkerDied):
                    failures[w] = f"environment worker {w} died during {command} ({outcome.detail})"
                elif outcome[0] == "ok":
                    replies[w] = outcome[1]
                else:
                    failures[w] = f"environment worker {w} failed during {command}: {outcome[1]}"
        for w in pending:
            # Same words as a thread that timed out; the worker is killed (the environment may spin forever).
            failures[w] = f"{command} timed out after {timeout_s:.1f}s"
        for w, reason in failures.items():
            self._replace(w, reason)
        return replies, failures

    def _replace(self, worker: int, reason: str) -> None:
        self._stop(worker, graceful=False)
        self.replacements += 1
        for i in self.hosted[worker]:
            self._lost[i] = reason  # their episodes died with the worker; the next reset starts them afresh
        self._start(worker)
        self._await_ready([worker])

    def _await_ready(self, workers: Iterable[int]) -> None:
        # A round trip, not a sleep: the worker has imported everything and unpickled the env factory.
        failures: dict[int, str] = {}
        pending = set()
        for w in workers:
            died = self._send(w, "ping", None)
            if died is not None:
                failures[w] = died.detail
            else:
                pending.add(w)
        deadline = time.monotonic() + self.start_timeout_s
        while pending and (remaining := deadline - time.monotonic()) > 0:
            for w, outcome in self._receive(pending, remaining).items():
                pending.discard(w)
                if isinstance(outcome, WorkerDied) or outcome[0] != "ok":
                    failures[w] = outcome.detail if isinstance(outcome, WorkerDied) else str(outcome[1])
        failures.update({w: f"no answer within {self.start_timeout_s:.0f}s" for w in pending})
        if failures:
            w, why = next(iter(failures.items()))
            raise EnvWorkerError(f"environment worker {w} did not start: {why}")


def _serve(conn: mp_connection.Connection, env_fn: Callable[[], gym.Env], indices: list[int]) -> None:
    """A worker process: answer commands until told to close or the pool goes away."""
    # Ctrl-C in a terminal reaches the whole process group; the pool decides when its workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    host = WorkerEnvs(env_fn, indices)
    try:
        while True:
            try:
                command, payload = conn.recv()
            except EOFError:
                return  # the pool's process is gone
            if command == "close":
                return
            conn.send(host.answer(command, payload))
    finally:
        host.close()


@dataclass
class _ProcessWorker:
    process: BaseProcess
    conn: mp_connection.Connection


class ProcessEnvPool(RemoteEnvPool):
    """`num_workers` worker processes (default one per core), talking over pipes."""

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        num_envs: int,
        *,
        step_timeout_s: float = 60.0,
        num_workers: int | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        self._ctx = mp.get_context(START_METHOD)
        self._workers: dict[int, _ProcessWorker] = {}
        super().__init__(env_fn, num_envs, step_timeout_s=step_timeout_s, num_workers=num_workers,
                         start_timeout_s=start_timeout_s)

    def worker_pids(self) -> list[int]:
        return [self._workers[w].process.pid or 0 for w in range(self.num_workers)]

    def _start(self, worker: int) -> None:
        ours, theirs = self._ctx.Pipe()
        process = self._ctx.Process(target=_serve, args=(theirs, self.env_fn, self.hosted[worker]),
                                    name=f"envworker-{worker}", daemon=True)
        process.start()
        theirs.close()  # only the worker holds its end: its death then reads as EOF here
        self._workers[worker] = _ProcessWorker(process, ours)

    def _send(self, worker: int, command: str, payload: Any) -> WorkerDied | None:
        handle = self._workers[worker]
        try:
            handle.conn.send((command, payload))
        except (BrokenPipeError, ConnectionResetError, EOFError):
            return WorkerDied(_exit_detail(handle.process))
        return None

    def _receive(self, workers: set[int], timeout_s: float) -> dict[int, tuple[str, Any] | WorkerDied]:
        waitables: dict[Any, int] = {}
        for w in workers:
            waitables[self._workers[w].conn] = w
            waitables[self._workers[w].process.sentinel] = w  # ready when the process exits
        out: dict[int, tuple[str, Any] | WorkerDied] = {}
        for ready in mp_connection.wait(list(waitables), timeout_s):
            w = waitables[ready]
            if w in out:
                continue
            handle = self._workers[w]
            try:
                if handle.conn.poll():  # an answer sent just before exiting still counts
                    out[w] = handle.conn.recv()
                    continue
            except (EOFError, OSError):
                pass
            out[w] = WorkerDied(_exit_detail(handle.process))
        return out

    def _stop(self, worker: int, *, graceful: bool) -> None:
        handle = self._workers.pop(worker, None)
        if handle is None:
            return
        if graceful and handle.process.is_alive():
            try:
                handle.conn.send(("close", None))
            except OSError:
                pass
            handle.process.join(timeout=5.0)
        if handle.process.is_alive():
            handle.process.kill()
        handle.process.join(timeout=5.0)
        handle.conn.close()


def _exit_detail(process: BaseProcess) -> str:
    process.join(timeout=1.0)  # a worker whose pipe broke is exiting: get its exit code
    code = process.exitcode
    if code is None:
        return f"pid {process.pid}, still running"
    if code < 0:
        return f"pid {process.pid}, killed by {signal.Signals(-code).name}"
    return f"pid {process.pid}, exit code {code}"
