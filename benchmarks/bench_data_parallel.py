"""Data parallel on the CPU: rollout episodes/s and step time with 2 ranks vs 1, the same total tasks.

    python benchmarks/bench_data_parallel.py                      # toy counter env, tiny random model
    python benchmarks/bench_data_parallel.py --tasks 8 --group 4 --steps 3 --zero 2

One process runs B tasks x G rollouts per step; `torchrun --nproc-per-node 2` runs the same B (B/2 per rank).
Per step it times the rollout (`collect`, until the slower rank is done) and the whole step (rollout, log-prob
and teacher passes, update, the collectives that reduce the metrics and gather the trajectories). On a
2-core machine two ranks share the cores, so expect little: the point is the mechanism and what it costs.
The worker side of this script is what each rank runs (`--worker`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from toy_envs import register_toy_envs

    from agentgym_opsd.registry import register_skill_library
    from agentgym_opsd.trainer import engine as dist
    from agentgym_opsd.trainer.config import load_config
    from agentgym_opsd.trainer.loop import Trainer

    register_toy_envs()
    register_skill_library("toy", ROOT / "tests" / "data" / "skills_small", override=True)
    cfg = load_config("cpu-tiny", [
        f"env.id={args.env}", f"rollout.tasks_per_step={args.tasks}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}", f"deepspeed.zero_stage={args.zero}",
        "trainer.tensorboard=false", "trainer.save_trajectories=true", f"trainer.output_dir={args.out}"])
    trainer = Trainer(cfg)
    trainer.step()  # warm-up: first-call costs (allocator, env resets) stay out of the numbers
    rollout, step = [], []
    for _ in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        trainer.collect()
        dist.barrier()
        rollout.append(time.perf_counter() - t0)
        trainer.task_cursor -= cfg.rollout.tasks_per_step  # the timed step replays the same tasks
        dist.barrier()
        t0 = time.perf_counter()
        trainer.step()
        dist.barrier()
        step.append(time.perf_counter() - t0)
    trainer.close()
    if dist.is_main():
        episodes = args.tasks * args.group
        print("RESULT " + json.dumps({
            "ranks": dist.world_size(), "episodes_per_step": episodes,
            "rollout_s": statistics.median(rollout), "episodes_per_s": episodes / statistics.median(rollout),
            "step_s": statistics.median(step)}))


def launch(args: argparse.Namespace, ranks: int) -> dict:
    out = tempfile.mkdtemp(prefix=f"bench_dp{ranks}_")
    passed = ["--worker", "--env", args.env, "--tasks", str(args.tasks), "--group", str(args.group), "--steps",
              str(args.steps), "--zero", str(args.zero), "--max-new-tokens", str(args.max_new_tokens), "--out", out]
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update({"DS_ACCELERATOR": env.get("DS_ACCELERATOR", "cpu"), "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": str(args.threads or max((os.cpu_count() or 2) // ranks, 1))})
    if ranks == 1:
        cmd = [sys.executable, __file__, *passed]
    else:
        cmd = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node", str(ranks),
               __file__, *passed]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"{ranks}-rank run failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="ToyCounter-v0")
    ap.add_argument("--tasks", type=int, default=4, help="B: tasks per step, all ranks together")
    ap.add_argument("--group", type=int, default=4, help="G: rollouts per task")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    ap.add_argument("--zero", type=int, default=0, help="deepspeed.zero_stage")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads per process (0 = the cores split over the ranks: 1 rank gets them all)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    rows = [launch(args, 1), launch(args, 2)]
    threads = args.threads or "cores/ranks"
    print(f"B={args.tasks} x G={args.group} episodes per step, ZeRO-{args.zero}, {args.env}, "
          f"{os.cpu_count()} CPU cores, {threads} threads per process, median of {args.steps} steps")
    print(f"{'ranks':>5} {'rollout s':>10} {'episodes/s':>11} {'step s':>8}")
    for r in rows:
        print(f"{r['ranks']:>5} {r['rollout_s']:>10.2f} {r['episodes_per_s']:>11.1f} {r['step_s']:>8.2f}")
    print(f"2 ranks vs 1: rollout {rows[0]['rollout_s'] / rows[1]['rollout_s']:.2f}x, "
          f"step {rows[0]['step_s'] / rows[1]['step_s']:.2f}x")


if __name__ == "__main__":
    main()
