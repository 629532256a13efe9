"""The rollout phase on the HF backend vs vLLM (its CPU build here), float32 and bfloat16, side by side in one run.

Each (backend, dtype) runs in its own fresh process (so peak memory is its own): a `cpu-small` trainer
(SmolLM2-135M-Instruct, no warm start, dynamic sampling off, the same seed) plays one round of 8 and one of 32
ALFWorld episodes (2 and 8 tasks x G = 4; the same tasks and sampler seed for every backend, so the first
turn's prompts are identical, later ones follow the samples), timed after one warm-up round of 4 episodes. Reported: seconds,
generated tokens/s, the engine's start-up time, peak RSS, and for vLLM the cost of one weight sync (the
trainer's `sync_weights` after an update, here of the same weights). The JSON keeps one record per CPU
(`harness.cpu_model`), as `precision.json` does: a run replaces its own machine's record. Needs vLLM
(`./.ci/setup.sh` puts its CPU build in .venv):

    .venv/bin/python benchmarks/bench_rollout_backends.py   # -> benchmarks/results/rollout_backends.json / .png
    .venv/bin/python benchmarks/bench_rollout_backends.py --episodes 4 --config cpu-tiny --out /tmp/r.json
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
GROUP_SIZE = 4
# The engine runs in the benchmark's process (no engine-core process), as in a one-process training run.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


PRECISION_OF = {"float32": "fp32", "bfloat16": "bf16-mixed"}


def measure(backend: str, dtype: str, config: str, episodes: list[int], repeats: int, kv_gib: float,
            then: Callable[[Any, list[Any]], dict[str, Any]] | None = None) -> dict[str, Any]:
    """One (backend, dtype) in this process: engine start, rollouts per episode count, sync cost, peak RSS;
    `then(trainer, trajectories of the last round)` adds its figures (a module-level function: it is pickled)."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from harness import make_trainer, peak_rss_mb

    from agentgym_opsd.records import summarize

    most = max(episodes) // GROUP_SIZE
    overrides = [f"model.precision={PRECISION_OF[dtype]}", f"rollout.backend={backend}", "warm_start.epochs=0", "warm_start.steps=0",
                 "rollout.dynamic_sampling=false", f"rollout.tasks_per_step={most}", f"rollout.group_size={GROUP_SIZE}",
                 f"rollout.vllm_kv_cache_gib={kv_gib}", "rollout.vllm_max_model_len=4096"]
    with tempfile.TemporaryDirectory(prefix="bench_rollout_backends_") as tmp:
        t0 = time.perf_counter()
        trainer = make_trainer(config, overrides, tmp)
        start_s = time.perf_counter() - t0  # model load (+ for vLLM: saving it, the engine start, its warm-up)
        try:
            out: dict[str, Any] = {"backend": backend, "dtype": dtype, "start_s": start_s, "episodes": {}}
            cfg = trainer.session.cfg

            def play(tasks: int) -> tuple[float, list[Any]]:
                trainer.session.cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, tasks_per_step=tasks))
                trainer.session.tasks_per_rank, trainer.task_cursor = tasks, 0  # the same tasks, the same sampler seed
                trainer.session.policy = trainer.session.policy.with_sampling(temperature=cfg.rollout.temperature, seed=cfg.trainer.seed)
                t1 = time.perf_counter()
                trajs = trainer.collect()
                return time.perf_counter() - t1, trajs

            out["warmup_s"] = play(1)[0]  # caches, allocator, compiled graphs: paid once, before any timing
            for n in episodes:
                rounds = [play(n // GROUP_SIZE) for _ in range(repeats)]
                median = statistics.median(seconds for seconds, _ in rounds)
                trajs = rounds[-1][1]
                tokens = sum(len(t.response_token_ids) for traj in trajs for t in traj.turns)
                out["episodes"][str(n)] = {"seconds": median, "tokens": tokens, "tokens_per_s": tokens / median,
                                           "success": summarize(trajs).success_rate}
            if then is not None:
                out.update(then(trainer, trajs))
            if backend == "vllm":
                sync = []
                for _ in range(3):
                    t1 = time.perf_counter()
                    pushed = trainer.session.policy.sync_weights(trainer.session.trained.model)
                    sync.append(time.perf_counter() - t1)
                out["sync_s"], out["sync_tensors"] = statistics.median(sync), pushed
            out["threads"] = torch.get_num_threads()
        finally:
            trainer.close()
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def plot(record: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = record["runs"]
    sizes = record["episodes"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(runs)
    for i, run in enumerate(runs):
        label = f"{run['backend']} {run['dtype']}"
        values = [run["episodes"][str(n)]["tokens_per_s"] for n in sizes]
        ax.bar([j + i * width for j in range(len(sizes))], values, width, label=label)
    ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(sizes))], [f"{n} episodes" for n in sizes])
    ax.set_ylabel("generated tokens / s")
    ax.set_title(f"rollout phase, {record['config']}, {record['threads']} threads")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summarize(runs: list[dict[str, Any]], args: argparse.Namespace, load_before: float) -> dict[str, Any]:
    """The JSON record of the runs so far, with vLLM : HF tokens/s for each dtype both have finished."""
    by = {(r["backend"], r["dtype"]): r for r in runs}
    ratios = {dtype: {str(n): by[("vllm", dtype)]["episodes"][str(n)]["tokens_per_s"]
                      / by[("hf", dtype)]["episodes"][str(n)]["tokens_per_s"] for n in args.episodes}
              for dtype in args.dtypes if ("vllm", dtype) in by and ("hf", dtype) in by}
    return {"config": args.config, "episodes": args.episodes, "group_size": GROUP_SIZE, "repeats": args.repeats,
            "threads": runs[0]["threads"], "load_avg_before_after": [load_before, os.getloadavg()[0]],
            "runs": runs,
            "tokens_per_s": {f"{r['backend']}_{r['dtype']}": {str(n): r["episodes"][str(n)]["tokens_per_s"]
                                                             for n in args.episodes} for r in runs},
            "vllm_over_hf_tokens_per_s": ratios}


def main(argv: list[str] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from agentgym_opsd.models.vllm_policy import vllm_available

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--episodes", type=int, nargs="+", default=[8, 32], help="multiples of 4 (G = 4)")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=1, help="timed rounds per size (after one warm-up round of 4)")
    ap.add_argument("--kv-cache-gib", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "rollout_backends.json")
    args = ap.parse_args(argv)
    if not vllm_available():
        raise SystemExit("vLLM is not installed in this environment (./.ci/setup.sh puts its CPU build in .venv; "
                         "SKIP_VLLM=1 leaves it out)")
    if any(n % GROUP_SIZE for n in args.episodes):
        raise SystemExit(f"--episodes: each must be a multiple of the group size {GROUP_SIZE}")
    sys.path.insert(0, str(Path(__file__).parent))
    from harness import cpu_model, write_machine_record

    cpu = cpu_model()
    load_before = os.getloadavg()[0]
    runs: list[dict[str, Any]] = []
    spawn = multiprocessing.get_context("spawn")
    # vLLM first in each dtype: the number this benchmark exists for; the record is rewritten after every run,
    # so an interrupted benchmark keeps what finished
    for dtype in args.dtypes:
        for backend in ("vllm", "hf"):
            with spawn.Pool(1) as pool:  # a fresh process per run: its own peak memory, no engine left behind
                runs.append(pool.apply(measure, (backend, dtype, args.config, args.episodes, args.repeats,
                                                 args.kv_cache_gib)))
            print(f"done: {backend} {dtype}", file=sys.stderr)
            record = {"cpu": cpu, **summarize(runs, args, load_before)}
            write_machine_record(args.out, cpu, record)
            plot(record, args.out.with_suffix(".png"))
    ratios = record["vllm_over_hf_tokens_per_s"]

    table = Table(title=f"rollout phase, {args.config}, {record['threads']} threads, G = {GROUP_SIZE}, {cpu}")
    for col in ("backend", "dtype", "start s", *(f"{n} ep s" for n in args.episodes),
                *(f"{n} ep tok/s" for n in args.episodes), "sync s", "peak RSS MB"):
        table.add_column(col, justify="right")
    for r in runs:
        table.add_row(r["backend"], r["dtype"], f"{r['start_s']:.1f}",
                      *(f"{r['episodes'][str(n)]['seconds']:.1f}" for n in args.episodes),
                      *(f"{r['episodes'][str(n)]['tokens_per_s']:.0f}" for n in args.episodes),
                      f"{r['sync_s']:.2f}" if "sync_s" in r else "-", f"{r['peak_rss_mb']:.0f}")
    console = Console()
    console.print(table)
    console.print("vLLM / HF tokens/s: " + "; ".join(f"{d}: " + ", ".join(f"{n} ep {v:.2f}x" for n, v in per.items())
                                                     for d, per in ratios.items()))
    console.print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
