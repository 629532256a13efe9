"""Learning experiment: warm start, then RL with `grpo` and with `agentopsd` from the same seeds; validation
success before and after; a PNG of both validation curves.

    python benchmarks/bench_train_learning.py --config cpu-small --steps 5 --eval-every 5 --out runs/learning

Each estimator is a normal training run (`agentgym_opsd.train` code path) in `<out>/<estimator>`; the warm
start is identical for both (same seed, same demonstrations). Long: the steps are configurable.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agentgym_opsd.trainer.config import load_config
from agentgym_opsd.trainer.loop import Trainer


def run(config: str, estimator: str, out: Path, steps: int, eval_every: int, extra: list[str]) -> list[dict]:
    cfg = load_config(config, [f"algorithm.estimator={estimator}", f"trainer.output_dir={out / estimator}",
                               f"trainer.total_steps={steps}", f"trainer.eval_every={eval_every}",
                               "trainer.eval_at_start=true", *extra])
    trainer = Trainer(cfg)
    try:
        trainer.train()
    finally:
        trainer.close()
    return [json.loads(x) for x in (out / estimator / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--out", default="runs/learning")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = Path(args.out)
    curves: dict[str, list[tuple[int, float]]] = {}
    table = Table(title=f"Validation success ({args.config}, {args.steps} RL steps after the warm start)")
    for col in ("estimator", "val before", "val after", "train success (last step)", "wall s"):
        table.add_column(col, justify="right")
    for est in ("grpo", "agentopsd"):
        t0 = time.perf_counter()
        lines = run(args.config, est, out, args.steps, args.eval_every, args.overrides)
        curves[est] = [(x["step"], x["val/success_rate"]) for x in lines if "val/success_rate" in x]
        train = [x for x in lines if "success_rate" in x]
        table.add_row(est, f"{curves[est][0][1]:.3f}" if curves[est] else "-",
                      f"{curves[est][-1][1]:.3f}" if curves[est] else "-",
                      f"{train[-1]['success_rate']:.3f}" if train else "-", f"{time.perf_counter() - t0:.0f}")
    Console().print(table)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for est, pts in curves.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=est)
    ax.set_xlabel("RL step")
    ax.set_ylabel("validation success rate")
    ax.set_title(f"{args.config}: GRPO vs AgentOPSD")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=120)
    (out / "learning_curves.json").write_text(json.dumps(curves, indent=2))
    print(f"plot: {out / 'learning_curves.png'}")


if __name__ == "__main__":
    main()
