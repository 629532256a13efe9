"""Training-step benchmarks, side by side in one run (prints rich tables).

1. Step time AgentOPSD vs GRPO on the SAME rollouts (teacher overhead), with the phase split:
   old/ref log-probs, teacher pass, update. Target: AgentOPSD ≤ 1.15 × GRPO.
2. Peak memory (max RSS) of a step.

    python benchmarks/bench_train.py --config cpu-small --repeats 2
    python benchmarks/bench_train.py --config cpu-tiny            # fast

Both estimators start from identical weights (each gets a fresh Trainer from the same seed) and train on
one batch of trajectories collected once.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

from harness import peak_rss_mb  # benchmarks/ is on sys.path when a script runs from it
from rich.console import Console
from rich.table import Table

from agentgym_opsd.trainer.config import load_config
from agentgym_opsd.trainer.loop import Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-tiny")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = tempfile.mkdtemp(prefix="bench_train_")
    base = ["trainer.backend=torch", "trainer.tensorboard=false", "warm_start.steps=0", *args.overrides]
    collector = Trainer(load_config(args.config, [*base, f"trainer.output_dir={out}/collect"]))
    t0 = time.perf_counter()
    trajs = collector.collect()
    seconds_rollout = time.perf_counter() - t0
    collector.close()
    rows: dict[str, list[dict]] = {}
    for estimator in ("grpo", "agentopsd"):
        trainer = Trainer(load_config(args.config, [*base, f"algorithm.estimator={estimator}",
                                                    f"trainer.output_dir={out}/{estimator}"]))
        trainer.session.reference.setup()
        trainer.step_on(copy.deepcopy(trajs))  # warm-up (allocator, lazy init)
        rows[estimator] = [trainer.step_on(copy.deepcopy(trajs))[0] for _ in range(args.repeats)]
        trainer.close()

    def med(est: str, key: str) -> float:
        return statistics.median(m[key] for m in rows[est])

    turns = sum(t.num_turns for t in trajs)
    table = Table(title=f"Step time on the same rollouts ({args.config}: {len(trajs)} trajectories, {turns} turns, "
                        f"{rows['grpo'][0]['response_tokens']:.0f} response tokens; median of {args.repeats})")
    for col in ("estimator", "logprobs s", "teacher s", "update s", "train step s", "+ rollout s", "ratio"):
        table.add_column(col, justify="right")
    totals = {e: med(e, "seconds_logprobs") + med(e, "seconds_teacher") + med(e, "seconds_update") for e in rows}
    for est in rows:
        table.add_row(est, f"{med(est, 'seconds_logprobs'):.2f}", f"{med(est, 'seconds_teacher'):.2f}",
                      f"{med(est, 'seconds_update'):.2f}", f"{totals[est]:.2f}",
                      f"{totals[est] + seconds_rollout:.2f}",
                      f"{(totals[est] + seconds_rollout) / (totals['grpo'] + seconds_rollout):.3f}")
    console = Console()
    console.print(table)
    console.print(f"rollout (collected once, shared): {seconds_rollout:.2f} s; training-only ratio "
                  f"agentopsd/grpo = {totals['agentopsd'] / totals['grpo']:.3f}")
    mem = Table(title="Peak memory")
    mem.add_column("what")
    mem.add_column("max RSS MB", justify="right")
    mem.add_row(f"{args.config} rollout + GRPO and AgentOPSD steps (process peak)",
                f"{peak_rss_mb():.0f}")
    console.print(mem)


if __name__ == "__main__":
    main()
