"""The HF sampler with and without prefilling a chunk's shared prompt prefix once, side by side in one process.

`HFPolicy` prefills the prefix that every prompt of a chunk starts with (the system message) once and copies its
cache rows (`models/hf_policy.py`, `MIN_SHARED_PREFIX`). This measures what that buys on the rollout phase: a
`cpu-small` trainer (SmolLM2-135M-Instruct, float32, no warm start, dynamic sampling off) plays the same ALFWorld
episodes with the same sampler seed in alternating rounds (shared, whole, whole, shared, ...) after one warm-up
round, so a drift of the machine falls on both. Both must sample the same tokens (float32 rounding aside): the
table reports whether every round generated the same tokens. Reported per mode: the median seconds, generated
tokens/s, and the prompt tokens prefilled. The JSON keeps one record per CPU (`harness.cpu_model`).

    python benchmarks/bench_hf_shared_prefix.py            # -> benchmarks/results/hf_shared_prefix.json
    python benchmarks/bench_hf_shared_prefix.py --episodes 4 --rounds 1 --config cpu-tiny --out /tmp/h.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from bench_rollout_backends import GROUP_SIZE, RESULTS  # noqa: E402
from harness import cpu_model, make_trainer, write_machine_record  # noqa: E402

from agentgym_opsd.models import hf_policy  # noqa: E402

MODES = ("shared", "whole")


def order(rounds: int) -> list[str]:
    """shared, whole, whole, shared, ...: each mode first in half of the pairs."""
    return [mode for i in range(rounds) for mode in (MODES if i % 2 == 0 else MODES[::-1])]


def counting_prefill(model: torch.nn.Module) -> tuple[list[int], Any]:
    """Counts the tokens every forward call feeds the model (its embedding's input), prefill and decode."""
    fed: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda mod, args, out: fed.append(args[0].numel()))
    return fed, hook


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--episodes", type=int, default=32, help="a multiple of 4 (G = 4)")
    ap.add_argument("--rounds", type=int, default=2, help="pairs of rounds (one per mode each)")
    ap.add_argument("--out", type=Path, default=RESULTS / "hf_shared_prefix.json")
    args = ap.parse_args(argv)
    if args.episodes % GROUP_SIZE:
        raise SystemExit(f"--episodes must be a multiple of {GROUP_SIZE}")
    tasks = args.episodes // GROUP_SIZE
    overrides = ["model.dtype=float32", "rollout.backend=hf", "warm_start.epochs=0", "warm_start.steps=0",
                 "rollout.dynamic_sampling=false", f"rollout.tasks_per_step={tasks}", f"rollout.group_size={GROUP_SIZE}"]
    load_before = os.getloadavg()[0]
    rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    samples: dict[str, list[tuple[int, ...]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_hf_shared_prefix_") as tmp:
        trainer = make_trainer(args.config, overrides, tmp)
        try:
            cfg = trainer.session.cfg
            fed, hook = counting_prefill(trainer.session.trained.model)

            def play(n_tasks: int, mode: str) -> tuple[float, list[Any]]:
                trainer.session.cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, tasks_per_step=n_tasks))
                trainer.session.tasks_per_rank, trainer.task_cursor = n_tasks, 0  # the same tasks and sampler seed
                trainer.session.policy = trainer.session.policy.with_sampling(temperature=cfg.rollout.temperature,
                                                                              seed=cfg.trainer.seed)
                least = hf_policy.MIN_SHARED_PREFIX if mode == "shared" else 10**9
                with mock.patch.object(hf_policy, "MIN_SHARED_PREFIX", least):
                    t0 = time.perf_counter()
                    trajs = trainer.collect()
                    return time.perf_counter() - t0, trajs

            play(1, "shared")  # warm-up: allocator, caches
            for mode in order(args.rounds):
                fed.clear()
                seconds, trajs = play(tasks, mode)
                tokens = [tuple(t.response_token_ids) for traj in trajs for t in traj.turns]
                samples.setdefault(mode, tokens)
                rounds[mode].append({"seconds": seconds, "generated_tokens": sum(map(len, tokens)),
                                     "fed_tokens": sum(fed), "same_samples": tokens == samples[mode]})
                print(f"{mode}: {seconds:.1f} s, {sum(map(len, tokens))} tokens generated, {sum(fed)} fed",
                      file=sys.stderr)
        finally:
            hook.remove()
            trainer.close()
    summary = {mode: {"median_s": statistics.median(r["seconds"] for r in rs),
                      "tokens_per_s": statistics.median(r["generated_tokens"] / r["seconds"] for r in rs),
                      "fed_tokens": rs[0]["fed_tokens"], "rounds": rs} for mode, rs in rounds.items()}
    same = samples["shared"] == samples["whole"] and all(r["same_samples"] for rs in rounds.values() for r in rs)
    cpu = cpu_model()
    record = {"config": args.config, "episodes": args.episodes, "group_size": GROUP_SIZE, "rounds": args.rounds,
              "threads": torch.get_num_threads(), "min_shared_prefix": hf_policy.MIN_SHARED_PREFIX,
              "load_avg_before_after": [load_before, os.getloadavg()[0]], "cpu": cpu, "modes": summary,
              "same_samples": same, "speedup": summary["whole"]["median_s"] / summary["shared"]["median_s"]}
    write_machine_record(args.out, cpu, record)

    table = Table(title=f"HF sampler, {args.episodes} episodes, {cpu}")
    for col in ("prefill", "median s", "tokens/s", "tokens fed", "rounds"):
        table.add_column(col, justify="right")
    for mode, s in summary.items():
        table.add_row(mode, f"{s['median_s']:.1f}", f"{s['tokens_per_s']:.1f}", str(s["fed_tokens"]), str(len(s["rounds"])))
    Console().print(table)
    print(f"shared prefix: {record['speedup']:.2f}x; same samples: {same}; wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
