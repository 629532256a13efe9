"""vLLM's CPU rollouts with and without the runtime it asks for (TCMalloc + Intel OpenMP preloaded), side by side.

`train` and `eval` start again with both libraries in `LD_PRELOAD` where vLLM's CPU build is installed
(`agentgym_opsd/cpu_runtime.py`). This measures what that buys: `bench_rollout_backends.measure` (a `cpu-small`
trainer, no warm start, 32 ALFWorld episodes after a warm-up round of 4, the same tasks and sampler seed) in a
fresh process per round, the rounds alternating (plain, preloaded, preloaded, plain, ...) so a drift of the
machine falls on both. Both play the same samples (the generated token counts must match; the table says so).
Then, in the same process (the engine's threads bound, the runtime as preloaded), the trainer's log-prob and
teacher passes over those episodes' rows. Reported per runtime: the median seconds and tokens/s, engine start,
weight sync, and the passes' seconds. The JSON keeps one record per CPU (`harness.cpu_model`).

    ./.ci/setup.sh --vllm          # .venv-vllm and libtcmalloc-minimal4
    .venv-vllm/bin/python benchmarks/bench_cpu_runtime.py          # -> benchmarks/results/cpu_runtime.json
    .venv-vllm/bin/python benchmarks/bench_cpu_runtime.py --episodes 4 --rounds 1 --config cpu-tiny --out /tmp/c.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).parent))
from bench_rollout_backends import GROUP_SIZE, RESULTS, measure  # noqa: E402  (sets the vLLM process options)
from harness import cpu_model, write_machine_record  # noqa: E402

from agentgym_opsd.cpu_runtime import PRELOAD_ENV, active_preloads, find_preloads  # noqa: E402

RUNTIMES = ("plain", "preloaded")


def order(rounds: int) -> list[str]:
    """plain, preloaded, preloaded, plain, plain, preloaded, ...: each runtime first in half of the pairs."""
    pairs = [RUNTIMES if i % 2 == 0 else RUNTIMES[::-1] for i in range(rounds)]
    return [runtime for pair in pairs for runtime in pair]


def trainer_passes(trainer: Any, trajs: list[Any]) -> dict[str, Any]:
    """The trainer's log-prob and teacher passes over the round's rows, in the process that holds the engine (its
    threads are bound and the runtime is the preloaded one): seconds each, twice (the first warms the passes)."""
    import time

    batch = trainer.score(trajs)
    seconds: dict[str, float] = {}
    for _ in range(2):
        t0 = time.perf_counter()
        logprobs = trainer.logprobs(batch)
        seconds["logprobs_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        trainer.teacher(batch, logprobs, trajs)
        seconds["teacher_s"] = time.perf_counter() - t0
    return {"trainer_passes": {**seconds, "rows": len(batch)}}


def one_round(runtime: str, libraries: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """One fresh process with `LD_PRELOAD` as the runtime has it (spawned children inherit the environment)."""
    with mock.patch.dict(os.environ, {"LD_PRELOAD": ":".join(libraries) if runtime == "preloaded" else ""}), \
            multiprocessing.get_context("spawn").Pool(1) as pool:
        run = pool.apply(measure, ("vllm", args.dtype, args.config, [args.episodes], 1, args.kv_cache_gib,
                                   trainer_passes))
    return {**run, "runtime": runtime}


def summarize(rounds: list[dict[str, Any]], libraries: list[str], args: argparse.Namespace) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {r: [x for x in rounds if x["runtime"] == r] for r in RUNTIMES}
    key = str(args.episodes)
    medians = {r: {"seconds": statistics.median(x["episodes"][key]["seconds"] for x in xs),
                   "tokens_per_s": statistics.median(x["episodes"][key]["tokens_per_s"] for x in xs),
                   "start_s": statistics.median(x["start_s"] for x in xs),
                   "sync_s": statistics.median(x["sync_s"] for x in xs),
                   **{k: statistics.median(x["trainer_passes"][k] for x in xs)
                      for k in ("logprobs_s", "teacher_s") if all("trainer_passes" in x for x in xs)}}
               for r, xs in by.items() if xs}
    tokens = {x["episodes"][key]["tokens"] for x in rounds}
    out: dict[str, Any] = {"config": args.config, "dtype": args.dtype, "episodes": args.episodes,
                           "group_size": GROUP_SIZE,
                           "libraries": [Path(lib).name for lib in libraries], "order": [x["runtime"] for x in rounds],
                           "same_samples": len(tokens) == 1, "rounds": rounds, "median": medians,
                           "load_avg_after": os.getloadavg()[0]}
    if len(medians) == 2:
        out["speedup"] = medians["plain"]["seconds"] / medians["preloaded"]["seconds"]
    return out


def main(argv: list[str] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--episodes", type=int, default=32, help="a multiple of 4 (G = 4)")
    ap.add_argument("--rounds", type=int, default=2, help="pairs of rounds, each runtime once per pair")
    ap.add_argument("--kv-cache-gib", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "cpu_runtime.json")
    args = ap.parse_args(argv)
    if args.episodes % GROUP_SIZE:
        raise SystemExit(f"--episodes must be a multiple of the group size {GROUP_SIZE}")
    if active_preloads() or os.environ.get(PRELOAD_ENV) == "0":
        raise SystemExit("run this without LD_PRELOAD and AGENTGYM_OPSD_PRELOAD: it sets both runtimes itself")
    libraries = find_preloads()
    if not libraries:
        raise SystemExit("vLLM's CPU build, TCMalloc or libiomp5 is missing: ./.ci/setup.sh --vllm, then run this "
                         "with .venv-vllm/bin/python")
    cpu = cpu_model()
    rounds: list[dict[str, Any]] = []
    for runtime in order(args.rounds):
        rounds.append(one_round(runtime, libraries, args))
        print(f"done: {runtime} {rounds[-1]['episodes'][str(args.episodes)]['seconds']:.1f} s", file=sys.stderr)
        record = {"cpu": cpu, **summarize(rounds, libraries, args)}
        write_machine_record(args.out, cpu, record)  # rewritten after each round: a stopped run keeps them

    table = Table(title=f"vLLM CPU rollouts, {args.episodes} episodes, {args.config} {args.dtype}, {cpu}")
    for col in ("runtime", "rounds", "median s", "tokens/s", "engine start s", "sync s", "log-probs s", "teacher s"):
        table.add_column(col, justify="right")
    for runtime, m in record["median"].items():
        table.add_row(runtime, str(record["order"].count(runtime)), f"{m['seconds']:.1f}", f"{m['tokens_per_s']:.1f}",
                      f"{m['start_s']:.1f}", f"{m['sync_s']:.2f}", f"{m.get('logprobs_s', float('nan')):.1f}",
                      f"{m.get('teacher_s', float('nan')):.1f}")
    Console().print(table)
    print(f"preloaded / plain: {record.get('speedup', float('nan')):.2f}x faster; same samples: "
          f"{record['same_samples']}; wrote {args.out}")


if __name__ == "__main__":
    main()
