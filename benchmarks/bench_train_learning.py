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
    ap.add_argument("--report-only", action="store_true", help="only rebuild the table and plot from <out>")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = ap.parse_args()
    out = Path(args.out)
    evals = [f"trainer.eval_episodes={args.eval_episodes}"]

    if not args.report_only:
        t0 = time.perf_counter()
        warm = out / "warm"
        if not (warm / "warm_start" / "model").is_dir():
            proc = train(warm, args.config, ["trainer.total_steps=0", "trainer.eval_at_start=false",
                                             *args.overrides], threads=2)
            if proc.wait() != 0:
                raise SystemExit(f"warm start failed, see {out / 'warm.log'}")
        print(f"warm start: {time.perf_counter() - t0:.0f} s")
        t0 = time.perf_counter()
        procs = {est: train(out / est, args.config, [
            f"model.name_or_path={warm / 'warm_start' / 'model'}", "warm_start.steps=0", f"algorithm.estimator={est}",
            f"trainer.total_steps={args.steps}", f"trainer.eval_every={args.steps}", "trainer.eval_at_start=true",
            *evals, *args.overrides], threads=args.threads) for est in ESTIMATORS}
        for est, proc in procs.items():
            if proc.wait() != 0:
                raise SystemExit(f"{est} run failed, see {out / (est + '.log')}")
        print(f"both RL runs (parallel): {time.perf_counter() - t0:.0f} s")
    report(out, args.config)


def _before_after(val: list[dict], key: str) -> str:
    return f"{val[0][key]:.3f} -> {val[-1][key]:.3f}" if val else "-"


def report(out: Path, config: str) -> None:
    """Table and PNG from the runs' metrics.jsonl (validation at step 0 = "before")."""
    runs = {est: metrics(out / est) for est in ESTIMATORS}
    table = Table(title=f"{config}: held-out validation after one warm start, then RL (same weights and seeds)")
    for col in ("estimator", "val success before -> after", "val invalid actions before -> after",
                "train success per step", "evidence mean", "s / step"):
        table.add_column(col, justify="right")
    for est, lines in runs.items():
        val = [m for m in lines if "val/success_rate" in m]
        steps = [m for m in lines if "seconds_update" in m]
        per_step = sum(m["seconds_rollout"] + m["seconds_teacher"] + m["seconds_update"] for m in steps) / max(len(steps), 1)
        table.add_row(est, _before_after(val, "val/success_rate"), _before_after(val, "val/invalid_action_rate"),
                      " ".join(f"{m['success_rate']:.2f}" for m in steps),
                      f"{sum(m['evidence_mean'] for m in steps) / max(len(steps), 1):+.3f}", f"{per_step:.0f}")
    Console().print(table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for est, lines in runs.items():
        val = [m for m in lines if "val/success_rate" in m]
        steps = [m["step"] for m in val]
        axes[0].plot(steps, [100 * m["val/success_rate"] for m in val], marker="o", label=est)
        axes[1].plot(steps, [100 * m["val/invalid_action_rate"] for m in val], marker="o", label=est)
    axes[0].set_ylim(-2, 102)
    axes[0].set_ylabel("validation success (%)")
    axes[1].set_ylim(-2, 102)
    axes[1].set_ylabel("validation invalid actions (%)")
    for ax in axes:
        ax.set_xlabel("RL step (0 = after the warm start)")
        ax.legend()
    fig.suptitle(f"{config}: GRPO vs AgentOPSD")
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=120)
    (out / "learning_curves.json").write_text(json.dumps(runs, indent=2))
    print(f"plot: {out / 'learning_curves.png'}")


if __name__ == "__main__":
    main()
