"""Sampling settings for the small presets, measured on a warm-started model (prints a rich table).

    python benchmarks/bench_sampling.py runs/cpu-learn/warm        # a run folder with a warm start (or a model dir)
    python benchmarks/bench_sampling.py MODEL --settings 1.0:1.0 0.7:1.0 1.0:0.9 --copies 4

Every setting (temperature:top_p) plays the same fixed pool of training games (`--games`, task indices
0..N-1 of `--env`, `--copies` rollouts each, same reset seeds) and reports success and the invalid-action
rate split by kind (no tag / not admissible / cut off). RL needs both: successes to learn from, and few
enough invalid actions that an episode is not wasted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.evaluation.metrics import wilson_interval
from agentgym_opsd.models.backends import make_policy_backend
from agentgym_opsd.models.loading import load_policy_model
from agentgym_opsd.prompts import PromptRenderer
from agentgym_opsd.records import invalid_rates, summarize
from agentgym_opsd.registry import env_profile, parse_env_spec
from agentgym_opsd.rollout import RolloutRunner


def model_dir(path: str) -> str:
    summary = Path(path) / "warm_start" / "summary.json"
    if summary.is_file():
        return json.loads(summary.read_text())["warm_start/model_dir"]
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a run folder with warm_start/summary.json, or a model folder")
    ap.add_argument("--env", default="ALFWorld-v0:easy")
    ap.add_argument("--games", type=int, default=16)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--settings", nargs="+", default=["0.4:1.0", "0.7:1.0", "1.0:1.0", "1.0:0.9"])
    args = ap.parse_args()
    model, tok = load_policy_model(model_dir(args.model), trainable=False)
    profile = env_profile(parse_env_spec(args.env)[0])
    runner = RolloutRunner(args.env, num_envs=16, env_kwargs={"max_turns": args.max_turns},
                           renderer=PromptRenderer(profile.system_prompt, history_turns=profile.history_turns))
    tasks = [TaskSpec(10_000 + i, {"task_index": i}) for i in range(args.games)]
    per_call = max(16 // args.copies, 1)
    table = Table(title=f"{args.env}: {args.games} games x {args.copies} rollouts, {args.max_turns} turns")
    for col in ("temperature", "top_p", "success % [95% CI]", "invalid %", "no tag / not admissible / cut off %"):
        table.add_column(col, justify="right")
    results = {}
    try:
        for setting in args.settings:
            temperature, top_p = (float(x) for x in setting.split(":"))
            policy = make_policy_backend("hf", model=model, tokenizer=tok, max_new_tokens=args.max_new_tokens,
                                         temperature=temperature, top_p=top_p, batch_size=16, seed=0)
            trajs = []
            for start in range(0, len(tasks), per_call):
                trajs += runner.run(policy, tasks[start:start + per_call], group_size=args.copies)
            wins = summarize(trajs).successes
            low, high = wilson_interval(wins, len(trajs))
            turns = max(sum(t.num_turns for t in trajs), 1)
            kinds = invalid_rates(trajs)
            invalid = sum(t.num_invalid_actions for t in trajs) / turns
            results[setting] = {"success": wins / len(trajs), "ci": [low, high], "invalid": invalid, **kinds}
            table.add_row(f"{temperature:g}", f"{top_p:g}", f"{100 * wins / len(trajs):.1f} [{100 * low:.1f}, "
                          f"{100 * high:.1f}]", f"{100 * invalid:.1f}",
                          " / ".join(f"{100 * v:.1f}" for v in kinds.values()))
    finally:
        runner.close()
    Console().print(table)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
