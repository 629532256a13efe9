"""Evaluation throughput: episodes per minute of the oracle and of the embedded SmolLM2 policy on ALFWorld
`valid_unseen`, with 1 vs 8 environments in parallel (one batched policy call per turn for all of them).

    python benchmarks/bench_eval.py                      # defaults: small, a few minutes on 2 CPU cores
    python benchmarks/bench_eval.py --episodes 16 --model-episodes 8 --model-max-turns 6

Kept small on purpose: the model rows play few episodes with a short turn limit and short answers
(`--model-max-turns`, `--max-new-tokens`), so their episodes/min is for that short horizon, not for the
50-turn limit of the paper. Model loading and the first generation of each game (cached afterwards) are
excluded: the oracle at 1 env runs first and fills the game cache for every episode measured.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from agentgym_opsd.evaluation import evaluate_policy, make_policy

ENV_SPEC = "ALFWorld-v0:valid_unseen"


@dataclass
class Row:
    policy: str
    num_envs: int
    episodes: int
    max_turns: int
    turns: int
    seconds: float
    success_rate: float
    failed: int

    @property
    def episodes_per_minute(self) -> float:
        return 60.0 * self.episodes / self.seconds if self.seconds else 0.0

    @property
    def turns_per_second(self) -> float:
        return self.turns / self.seconds if self.seconds else 0.0


def measure(spec: str, policy: object, num_envs: int, episodes: int, max_turns: int) -> Row:
    t0 = time.perf_counter()
    summary = evaluate_policy(policy, ENV_SPEC, episodes=episodes, num_envs=num_envs, max_turns=max_turns)
    seconds = time.perf_counter() - t0  # includes making the environments: part of what a user waits for
    turns = sum(t.num_turns for t in summary.trajectories)
    return Row(spec, num_envs, summary.episodes, max_turns, turns, seconds, summary.success_rate,
               summary.failed_episodes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=16, help="oracle episodes per row")
    p.add_argument("--max-turns", type=int, default=50, help="turn limit of the oracle rows")
    p.add_argument("--model", default="hf:embedded:smollm2-135m-instruct", help="model policy spec ('' = skip)")
    p.add_argument("--model-episodes", type=int, default=8, help="model episodes per row")
    p.add_argument("--model-max-turns", type=int, default=2, help="turn limit of the model rows")
    p.add_argument("--max-new-tokens", type=int, default=24, help="answer length limit of the model")
    p.add_argument("--parallel", type=int, nargs="+", default=[1, 8], help="parallel environment counts")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    rows = [measure("oracle", make_policy("oracle"), n, args.episodes, args.max_turns) for n in args.parallel]
    if args.model:
        policy = make_policy(args.model, temperature=0.4, max_new_tokens=args.max_new_tokens, seed=0)
        rows += [measure(args.model, policy, n, args.model_episodes, args.model_max_turns) for n in args.parallel]

    table = Table(title=f"Evaluation throughput on {ENV_SPEC} ({os.cpu_count()} CPU cores)")
    for col in ("policy", "parallel envs", "episodes", "max turns", "turns", "seconds", "episodes/min",
                "turns/s", "success %", "failed"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        table.add_row(r.policy, str(r.num_envs), str(r.episodes), str(r.max_turns), str(r.turns), f"{r.seconds:.1f}",
                      f"{r.episodes_per_minute:.1f}", f"{r.turns_per_second:.2f}", f"{100 * r.success_rate:.0f}",
                      str(r.failed))
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
