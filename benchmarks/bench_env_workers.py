"""Environment workers: ALFWorld (or WebShop) stepped in threads (the trainer's process), worker processes or Ray
actors (`rollout.env_workers`), at 16, 64 and 128 environments; prints a rich table, writes JSON.

    python benchmarks/bench_env_workers.py                                   # 16 64 128 envs, every backend
    python benchmarks/bench_env_workers.py --envs 16 64 --turns 8 --note "shared with a training run"
    python benchmarks/bench_env_workers.py --env WebShop-v0:train --json benchmarks/results/env_workers_webshop.json

Each configuration plays `--rollouts` rollouts of `--env` (ALFWorld `easy` by default) through `RolloutRunner` (num_envs / G
tasks x G copies, G = `--group-size`, at most `--turns` turns) with a seeded random policy over the
admissible actions (no LLM: what is measured is the environments and the transport). Every rollout plays
new games, as every training step does (so each one compiles its games); the first is "cold" (each process
also starts its engine), the others are "warm" and give steps/s (resets included). A step is one environment
answering one action.

CPU seconds are counted per process (this one: `time.process_time`; workers: utime + stime of
/proc/PID/stat), which a loaded machine inflates far less than wall time. They give the prediction for a
machine with K free cores: threads run every step in one process (the GIL, and ALFWorld's engine lock), so
steps / CPU seconds is their rate on any machine; processes / ray with K workers on K cores take about
steps / (parent CPU + workers' CPU / K) — the parent's share (pickling, pipes, the policy's bookkeeping) is
the serial part that bounds the scaling. Memory per worker is its resident set (VmRSS) after the rollouts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agentgym_opsd.envpool import ENV_WORKERS, TaskSpec, default_num_workers
from agentgym_opsd.policies import RandomPolicy
from agentgym_opsd.rollout import RolloutRunner

PREDICT_CORES = (16, 64)


@dataclass
class Result:
    backend: str
    num_envs: int
    num_workers: int
    tasks: int
    group_size: int
    seconds_start: float
    seconds_rollout_cold: float
    seconds_rollout_warm: float
    steps_warm: int
    steps_per_s: float
    cpu_s_parent: float
    cpu_s_workers: float
    rss_mb_parent: float
    rss_mb_per_worker: float | None
    rss_mb_per_worker_max: float | None
    failed_episodes: int
    predicted_steps_per_s: dict[str, float] = field(default_factory=dict)


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    # /proc/PID/stat: fields 14 and 15 (utime, stime) in clock ticks, after the ")" that ends the name.
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(backend: str, num_envs: int, args: argparse.Namespace) -> Result:
    group = min(args.group_size, num_envs)
    tasks = num_envs // group
    t0 = time.perf_counter()
    runner = RolloutRunner(args.env, num_envs=num_envs, env_kwargs={"max_turns": args.turns}, use_skills=False,
                           env_workers=backend, num_env_workers=args.workers)
    seconds_start = time.perf_counter() - t0
    pool = runner.pool
    num_tasks = pool.num_tasks or 1
    pids = pool.worker_pids() if hasattr(pool, "worker_pids") else []
    try:
        seconds, steps, failed, cpu_parent, cpu_workers = [], [], 0, 0.0, 0.0
        for r in range(args.rollouts):
            # New games every rollout, as every training step has: warm rollouts pay for compiling them too.
            specs = [TaskSpec(1000 * r + t, {"task_index": (tasks * r + t) % num_tasks}) for t in range(tasks)]
            c_parent, c_workers = time.process_time(), sum(cpu_s(p) for p in pids)
            t0 = time.perf_counter()
            trajs = runner.run(RandomPolicy(seed=r), specs, group_size=group)
            seconds.append(time.perf_counter() - t0)
            steps.append(sum(t.num_turns for t in trajs))
            failed += sum(t.error is not None for t in trajs)
            if r > 0:  # warm rollouts only
                cpu_parent += time.process_time() - c_parent
                cpu_workers += sum(cpu_s(p) for p in pids) - c_workers
        worker_rss = [rss_mb(p) for p in pids]
    finally:
        runner.close()
    warm_s, warm_steps = sum(seconds[1:]), sum(steps[1:])
    result = Result(
        backend=backend, num_envs=num_envs, num_workers=len(pids), tasks=tasks, group_size=group,
        seconds_start=seconds_start, seconds_rollout_cold=seconds[0],
        seconds_rollout_warm=warm_s / max(len(seconds) - 1, 1), steps_warm=warm_steps,
        steps_per_s=warm_steps / warm_s, cpu_s_parent=cpu_parent, cpu_s_workers=cpu_workers,
        rss_mb_parent=rss_mb(), rss_mb_per_worker=statistics.mean(worker_rss) if worker_rss else None,
        rss_mb_per_worker_max=max(worker_rss) if worker_rss else None, failed_episodes=failed,
    )
    for cores in PREDICT_CORES:
        if not pids:  # threads: one process does all the work, whatever the machine
            rate = warm_steps / cpu_parent
        else:  # K workers on K cores; the workers' CPU seconds shrink by K, the parent's do not
            rate = warm_steps / (cpu_parent + cpu_workers / min(cores, num_envs))
        result.predicted_steps_per_s[str(cores)] = rate
    return result


def table(results: list[Result], args: argparse.Namespace) -> Table:
    t = Table(title=f"environment workers: {args.env}, random policy, <= {args.turns} turns, G = {args.group_size}, "
                    f"{args.rollouts - 1} warm rollout(s) after a cold one; {os.cpu_count()} CPUs here")
    cols = ("backend", "envs", "workers", "start s", "cold rollout s", "warm rollout s", "steps/s",
            "warm CPU s parent", "warm CPU s workers", "RSS MiB / worker", "RSS MiB parent", "failed",
            *(f"pred. steps/s {k} cores" for k in PREDICT_CORES))
    for col in cols:
        t.add_column(col, justify="left" if col == "backend" else "right")
    for r in results:
        t.add_row(r.backend, str(r.num_envs), str(r.num_workers or "-"), f"{r.seconds_start:.1f}",
                  f"{r.seconds_rollout_cold:.1f}", f"{r.seconds_rollout_warm:.1f}", f"{r.steps_per_s:.0f}",
                  f"{r.cpu_s_parent:.1f}", f"{r.cpu_s_workers:.1f}",
                  "-" if r.rss_mb_per_worker is None else f"{r.rss_mb_per_worker:.0f} (max {r.rss_mb_per_worker_max:.0f})",
                  f"{r.rss_mb_parent:.0f}", str(r.failed_episodes),
                  *(f"{r.predicted_steps_per_s[str(k)]:.0f}" for k in PREDICT_CORES))
    return t


def prediction(results: list[Result]) -> str:
    """One line: what the measured CPU seconds predict on a machine with many free cores."""
    lines = []
    for n in sorted({r.num_envs for r in results}):
        by = {r.backend: r for r in results if r.num_envs == n}
        if "threads" in by and "processes" in by:
            k = PREDICT_CORES[-1]
            lines.append(f"{n} envs: threads ~{by['threads'].predicted_steps_per_s[str(k)]:.0f} steps/s on any "
                         f"machine, processes ~{by['processes'].predicted_steps_per_s[str(k)]:.0f} steps/s with "
                         f"{min(k, n)} workers on {min(k, n)} free cores")
    return "; ".join(lines)


def available_backends() -> list[str]:
    backends = ["threads", "processes"]
    try:
        import ray  # noqa: F401 - only asking whether the extra is installed
    except ImportError:
        return backends
    return [*backends, "ray"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="ALFWorld-v0:easy", help="environment spec (default ALFWorld-v0:easy)")
    p.add_argument("--envs", type=int, nargs="+", default=[16, 64, 128], help="pool sizes (default 16 64 128)")
    p.add_argument("--backends", nargs="+", choices=tuple(ENV_WORKERS), default=None,
                   help="default: threads, processes and ray when Ray is installed")
    p.add_argument("--workers", type=int, default=None,
                   help=f"worker processes / actors (default one per core: {default_num_workers()} here)")
    p.add_argument("--turns", type=int, default=10, help="turn limit per episode (default 10)")
    p.add_argument("--group-size", type=int, default=8, help="copies per task, G (default 8)")
    p.add_argument("--rollouts", type=int, default=3, help="rollouts per configuration, the first cold (default 3)")
    p.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "env_workers.json")
    p.add_argument("--note", action="append", default=[], help="a line for the JSON's notes (repeatable)")
    args = p.parse_args(argv)
    if args.rollouts < 2 or args.turns < 1 or min(args.envs) < 1:
        p.error("--rollouts must be >= 2 (one cold, one warm); --turns and --envs >= 1")
    backends = args.backends or available_backends()

    console = Console(width=220)
    load_before = os.getloadavg()
    if "ray" in backends:  # one local Ray for every ray configuration (a pool would start and stop its own)
        import ray

        ray.init(num_cpus=args.workers or default_num_workers(), include_dashboard=False, configure_logging=False)
    results = []
    try:
        for n in args.envs:
            for backend in backends:
                results.append(measure(backend, n, args))
                r = results[-1]
                console.print(f"{backend:9} {n:4} envs: {r.steps_per_s:.0f} steps/s warm, "
                              f"cold rollout {r.seconds_rollout_cold:.1f}s, start {r.seconds_start:.1f}s")
    finally:
        if "ray" in backends:
            ray.shutdown()
    console.print(table(results, args))
    predicted = prediction(results)
    console.print(f"many-core prediction: {predicted}")
    notes = [*args.note,
             f"{os.cpu_count()} CPUs; load average (1, 5, 15 min) {' '.join(f'{x:.2f}' for x in load_before)} before, "
             f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} after",
             "steps/s: warm rollouts (new games each, resets included); a step is one environment answering one action",
             "prediction (pred. steps/s K cores): threads = steps / parent CPU s (one process: GIL + ALFWorld's "
             "engine lock); processes / ray = steps / (parent CPU s + workers' CPU s / K) with K workers on K "
             "free cores",
             "the prediction is optimistic once K > envs / G: a task's G copies then sit on different workers, "
             "which each compile its game and plan its states (within one worker they share both)",
             "RSS MiB parent: this benchmark's process after the configuration, with what earlier configurations "
             "left in it (the threads runs' engine and compiled games)",
             f"many-core prediction: {predicted}"]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("note", "json")} | {"backends": backends}
    args.json.write_text(json.dumps({"settings": settings, "notes": notes, "results": [asdict(r) for r in results]},
                                    indent=1) + "\n", encoding="utf-8")
    console.print(f"wrote {args.json}")
    return 0 if all(r.failed_episodes == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
