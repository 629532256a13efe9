"""Learning experiment: one warm start, then RL with `grpo` and with `agentopsd` from the same weights and
seeds; validation success before and after; a PNG of both validation curves.

    python benchmarks/bench_train_learning.py --config cpu-small --steps 4 --out runs/learning

Stage 1 is a normal training run with `trainer.total_steps=0` (the warm start on oracle demonstrations).
Stage 2 starts one training run per estimator from the warm-started weights (`warm_start.steps=0`; the
validation at step 0 is the "before" number), in parallel processes with one torch thread each, so both see
the same machine load. Each is the `python -m agentgym_opsd.train` code path. Long on a CPU: on 2 cores a
`cpu-small` RL step takes several minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ESTIMATORS = ("grpo", "agentopsd")


def train(out_dir: Path, config: str, overrides: list[str], threads: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu"}
    out_dir.mkdir(parents=True, exist_ok=True)
    log = (out_dir.parent / f"{out_dir.name}.log").open("w")
    cmd = [sys.executable, "-m", "agentgym_opsd.train", "--config", config,
           f"trainer.output_dir={out_dir}", "trainer.progress=false", *overrides]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--steps", type=int, default=4, help="RL steps per estimator")
    ap.add_argument("--eval-episodes", type=int, default=16)
    ap.add_argument("--out", default="runs/learning")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per RL process")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = ap.parse_args()
    out = Path(args.out)
    evals = [f"trainer.eval_episodes={args.eval_episodes}"]

    t0 = time.perf_counter()
    warm = out / "warm"
    if not (warm / "warm_start" / "model").is_dir():
        proc = train(warm, args.config, ["trainer.total_steps=0", "trainer.eval_at_start=true", *evals,
                                         *args.overrides], threads=2)
        if proc.wait() != 0:
            raise SystemExit(f"warm start failed, see {out / 'warm.log'}")
    seconds_warm = time.perf_counter() - t0

    t0 = time.perf_counter()
    procs = {est: train(out / est, args.config, [
        f"model.name_or_path={warm / 'warm_start' / 'model'}", "warm_start.steps=0", f"algorithm.estimator={est}",
        f"trainer.total_steps={args.steps}", f"trainer.eval_every={args.steps}", "trainer.eval_at_start=true",
        *evals, *args.overrides], threads=args.threads) for est in ESTIMATORS}
    for est, proc in procs.items():
        if proc.wait() != 0:
            raise SystemExit(f"{est} run failed, see {out / (est + '.log')}")
    seconds_rl = time.perf_counter() - t0

    table = Table(title=f"{args.config}: validation success (ALFWorld, {args.eval_episodes} episodes), "
                        f"{args.steps} RL steps after one warm start")
    for col in ("estimator", "val before RL", "val after RL", "train success per step", "evidence mean",
                "s / step"):
        table.add_column(col, justify="right")
    curves: dict[str, list[tuple[int, float]]] = {}
    for est in ESTIMATORS:
        lines = metrics(out / est)
        # "before" is the run's own step-0 validation: the warm-started weights, the same validation seeds.
        before = [m["val/success_rate"] for m in lines if m.get("step") == 0 and "val/success_rate" in m]
        steps = [m for m in lines if "success_rate" in m and "seconds_update" in m]
        after = [m["val/success_rate"] for m in lines if "val/success_rate" in m]
        curves[est] = [(m["step"], m["val/success_rate"]) for m in lines if "val/success_rate" in m]
        per_step = sum(m["seconds_rollout"] + m["seconds_teacher"] + m["seconds_update"] for m in steps) / max(len(steps), 1)
        table.add_row(est, f"{before[-1]:.3f}" if before else "-", f"{after[-1]:.3f}" if after else "-",
                      " ".join(f"{m['success_rate']:.2f}" for m in steps),
                      f"{sum(m['evidence_mean'] for m in steps) / max(len(steps), 1):+.3f}", f"{per_step:.0f}")
    Console().print(table)
    print(f"warm start + validation: {seconds_warm:.0f} s; both RL runs (parallel): {seconds_rl:.0f} s")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for est, pts in curves.items():
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", label=est)
    ax.set_xlabel("RL step (0 = after the warm start)")
    ax.set_ylabel("validation success (%)")
    ax.set_title(f"{args.config}: GRPO vs AgentOPSD")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=120)
    (out / "learning_curves.json").write_text(json.dumps(curves, indent=2))
    print(f"plot: {out / 'learning_curves.png'}")


if __name__ == "__main__":
    main()
