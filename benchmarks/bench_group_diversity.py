"""How much outcome signal a GRPO group carries after the warm start, per sampling setting.

    python benchmarks/bench_group_diversity.py --temperatures 1.0 1.5 [--top-p 1.0] [key=value ...]

Loads the preset's cached warm start (training it if the cache is cold) and samples the whole RL pool
(`env.num_train_tasks` games × `--rollouts` copies, the trainer's own pool evaluation) at each temperature.
Reports, per setting: pool success, the share of games whose copies disagree (`mixed_group_share`: a GRPO
group with a non-zero advantage), and the sampled tokens' mean negative log-probability (an estimate of the
per-token entropy at that temperature). Writes `benchmarks/results/group_diversity.json`.
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
from agentgym_opsd.trainer.task_stream import TRAIN_SEED_LIMIT

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 1.5])
    ap.add_argument("--top-p", type=float, nargs="+", default=[1.0])
    ap.add_argument("--rollouts", type=int, default=4, help="copies of every pool game")
    ap.add_argument("--out", default="runs/group-diversity")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    cfg = load_config(args.config, ["trainer.total_steps=0", f"trainer.output_dir={args.out}", "trainer.progress=false",
                                    "warm_start.seed=0", f"trainer.eval_pool_rollouts={args.rollouts}",
                                    *args.overrides])
    trainer = Trainer(cfg)
    rows = []
    try:
        trainer.warm_start()
        for top_p in args.top_p:
            for temperature in args.temperatures:
                trainer.session.policy.top_p = top_p  # the sampler's nucleus; with_sampling sets the temperature and seed
                t0 = time.perf_counter()
                m = trainer.session.validation.pool(trainer.session.policy.with_sampling(temperature=temperature,
                                                                         seed=2 * TRAIN_SEED_LIMIT))
                rows.append({"temperature": temperature, "top_p": top_p, "success": m["pool/success_rate"],
                             "mixed_group_share": m["pool/mixed_group_share"],
                             "sampled_nll_per_token": m["pool/sampled_nll_per_token"],
                             "invalid_action_rate": m["pool/invalid_action_rate"], "episodes": m["pool/episodes"],
                             "seconds": time.perf_counter() - t0})
                print(rows[-1], flush=True)
                write(args.config, rows)  # after every setting: a long sweep that is stopped keeps its rows
    finally:
        trainer.close()
    table = Table(title=f"{args.config}: the warm-started policy on the RL pool ({args.rollouts} copies per game)")
    for col in ("temperature", "top_p", "pool success", "groups with mixed outcomes", "sampled NLL (nats/token)",
                "invalid actions"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['temperature']:.2f}", f"{r['top_p']:.2f}", f"{100 * r['success']:.1f}%",
                      f"{100 * r['mixed_group_share']:.0f}%", f"{r['sampled_nll_per_token']:.3f}",
                      f"{100 * r['invalid_action_rate']:.1f}%")
    Console().print(table)
    write(args.config, rows)


def write(config: str, rows: list[dict]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "group_diversity.json").write_text(json.dumps({"config": config, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
