"""The main job's validation with its episodes' turns generated in one batch, against chunks of `rollout.batch_size`,
side by side in one process.

Validation plays `trainer.eval_batch_episodes` episodes side by side. The HF sampler used to generate their turns
in chunks of `rollout.batch_size` (16 on `cpu-learn`), so a decode step streamed the model's weights once per chunk;
`Session.sampler_at` now gives validation a sampler whose chunk is the whole batch. Modes:

- `one-batch`: as it ships, with `eval_batch_episodes` = `--batch` (64 on `cpu-learn`: the 48 held-out episodes,
  and the pool's 16 games x 4 copies, each in one call);
- `chunked`: what ran before, `eval_batch_episodes` = 32 and chunks of `rollout.batch_size`.

A `cpu-small` trainer (float32, HF sampler; `--set model.name_or_path=` a warm start's folder, whose episodes are as
long as the main job's) runs one validation point (held-out episodes, then the pool check) per round, the modes
alternating (new, baseline, baseline, new, ...), after a short warm-up. The samples differ between the modes (a
chunk's rows draw from one stream), so the episodes last other numbers of turns: each mode's turns (rows generated)
and milliseconds per turn are reported beside its seconds and success. The JSON keeps one record per CPU.

    python benchmarks/bench_validation_batch.py --set model.name_or_path=RUN/warm_start/model
    python benchmarks/bench_validation_batch.py --config cpu-tiny --episodes 4 --pool-rollouts 2 --rounds 1 --out /tmp/v.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from bench_hf_sampler import order, portable  # noqa: E402
from bench_rollout_backends import RESULTS  # noqa: E402
from harness import cpu_model, make_trainer, write_machine_record  # noqa: E402

from agentgym_opsd.trainer.validation import Validation  # noqa: E402

BEFORE_BATCH = 32
"""`trainer.eval_batch_episodes` before validation generated in one batch (the config's default)."""


def validation_round(trainer: Any, base: Any, mode: str, batch: int, *, warm_up: bool = False,
                     ) -> tuple[float, dict[str, float], list[int]]:
    """One validation point of config `base` in `mode`: its seconds, metrics, and the rows of every generate chunk
    it ran. `warm_up`: two held-out episodes and no pool check (allocator, lazy initialisation)."""
    session = trainer.session
    settings: dict[str, int] = {"eval_batch_episodes": batch if mode == "one-batch" else BEFORE_BATCH}
    if warm_up:
        settings.update(eval_episodes=min(2, base.trainer.eval_episodes), eval_pool_rollouts=0)
    cfg = dataclasses.replace(base, trainer=dataclasses.replace(base.trainer, **settings))
    if mode == "one-batch":
        session.cfg = cfg
        sampler_at: Callable[[float, int], Any] = session.sampler_at
    else:
        def sampler_at(temperature: float, seed: int) -> Any:
            return session.policy.with_sampling(temperature=temperature, seed=seed)  # chunks of rollout.batch_size
    # a validation of its own (its held-out runners sized by this mode's batch) over the session's training runners
    validation = Validation(cfg, session.validation.train_runners, session.make_runner, session.generating)
    chunks: list[int] = []
    generate_chunk = type(session.policy)._generate_chunk

    def counting(self: Any, prompts: list[Any]) -> Any:
        chunks.append(len(prompts))
        return generate_chunk(self, prompts)

    try:
        with mock.patch.object(type(session.policy), "_generate_chunk", counting):
            t0 = time.perf_counter()
            metrics = validation.run(sampler_at)
            seconds = time.perf_counter() - t0
    finally:
        validation.close()
    return seconds, metrics, chunks


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--batch", type=int, default=64, help="eval_batch_episodes of the one-batch mode")
    ap.add_argument("--episodes", type=int, default=48, help="held-out episodes (trainer.eval_episodes)")
    ap.add_argument("--pool-rollouts", type=int, default=4, help="trainer.eval_pool_rollouts (0 = no pool check)")
    ap.add_argument("--rounds", type=int, default=1, help="pairs of rounds (one per mode each)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a setting after the bench's own")
    ap.add_argument("--out", type=Path, default=RESULTS / "validation_batch.json")
    args = ap.parse_args(argv)
    modes = ("one-batch", "chunked")
    overrides = ["model.dtype=float32", "rollout.backend=hf", "warm_start.epochs=0", "warm_start.steps=0",
                 f"trainer.eval_episodes={args.episodes}", f"trainer.eval_pool_rollouts={args.pool_rollouts}",
                 *args.set]
    load_before = os.getloadavg()[0]
    rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="bench_validation_batch_") as tmp:
        trainer = make_trainer(args.config, overrides, tmp)
        try:
            base = trainer.session.cfg
            rollout_batch = base.rollout.batch_size
            validation_round(trainer, base, modes[0], args.batch, warm_up=True)
            for mode in order(modes, args.rounds):
                seconds, metrics, chunks = validation_round(trainer, base, mode, args.batch)
                rounds[mode].append({
                    "seconds": seconds, "held_out_seconds": metrics["seconds_validation"],
                    "pool_seconds": metrics.get("seconds_pool"), "held_out_success": metrics["val/success_rate"],
                    "pool_success": metrics.get("pool/success_rate"), "chunks": len(chunks),
                    "largest_chunk": max(chunks, default=0), "turns": sum(chunks),
                    "ms_per_turn": 1000 * seconds / max(sum(chunks), 1)})
                print(f"{mode}: {seconds:.1f} s, {sum(chunks)} turns in {len(chunks)} chunks of up to "
                      f"{max(chunks, default=0)} rows, held-out {metrics['val/success_rate']:.3f}", file=sys.stderr)
        finally:
            trainer.close()
    summary = {mode: {"median_s": statistics.median(r["seconds"] for r in rs),
                      "median_ms_per_turn": statistics.median(r["ms_per_turn"] for r in rs), "rounds": rs}
               for mode, rs in rounds.items()}
    new, baseline = modes
    cpu = cpu_model()
    record = {"config": args.config, "settings": [portable(s) for s in args.set], "episodes": args.episodes,
              "pool_rollouts": args.pool_rollouts, "batch": args.batch, "before_batch": BEFORE_BATCH,
              "rollout_batch_size": rollout_batch, "rounds": args.rounds, "threads": torch.get_num_threads(),
              "load_avg_before_after": [load_before, os.getloadavg()[0]], "cpu": cpu, "modes": summary,
              "speedup": summary[baseline]["median_s"] / summary[new]["median_s"],
              "speedup_per_turn": summary[baseline]["median_ms_per_turn"] / summary[new]["median_ms_per_turn"]}
    write_machine_record(args.out, cpu, record)

    table = Table(title=f"validation, {args.episodes} held-out + pool x {args.pool_rollouts}, {cpu}")
    for col in ("mode", "median s", "ms per turn", "turns", "chunks", "largest chunk", "held-out success",
                "pool success"):
        table.add_column(col, justify="right")
    for mode, s in summary.items():
        last = s["rounds"][-1]
        pool = "-" if last["pool_success"] is None else f"{last['pool_success']:.3f}"
        table.add_row(mode, f"{s['median_s']:.1f}", f"{s['median_ms_per_turn']:.0f}", str(last["turns"]),
                      str(last["chunks"]), str(last["largest_chunk"]),
                      f"{last['held_out_success']:.3f}", pool)
    Console().print(table)
    print(f"validation in one batch: {record['speedup']:.2f}x the chunked speed, {record['speedup_per_turn']:.2f}x per "
          f"turn; wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
