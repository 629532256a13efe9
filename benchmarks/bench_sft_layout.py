"""The warm start's SFT step with left-padded vs packed micro-batches, and packed with the demonstrations' shared
prompt prefix laid once per micro-batch, side by side on the same demonstrations.

    python benchmarks/bench_sft_layout.py                           # cpu-small: SmolLM2-135M, ALFWorld demonstrations
    python benchmarks/bench_sft_layout.py --config cpu-tiny --steps 2 --out /tmp/sft.json   # a smoke check

The rows are the warm start's own: oracle demonstrations of the preset's environment, tokenised as
`WarmStart` does. Each of `--steps` SFT steps (`warm_start.batch_rows` rows, drawn as `sft_schedule` draws an
epoch) runs once per layout from the same weights and fresh optimiser moments, the order alternating step by
step, so machine noise hits both. Reported per layout: CPU seconds per step (the process's, all threads: the
measure on a shared machine), wall seconds per step (the measure on idle cores: a layout that leaves a core idle
costs wall time, not CPU time), the tokens its micro-batches compute (real + padding), and the largest loss
difference to the padded layout. `packed-prefix` is what the warm start runs where `supports_packing`: packed, with
the prompts' shared prefix (ALFWorld's system message, `logprobs.shared_prompt_prefix`) laid once. The
steps run the whole model, as the first epoch does (later epochs start from the kept frozen trunk, where the
padding is a larger share of what is left), on the plain torch engine (`harness.MEASURING`).
Writes benchmarks/results/sft_layout.json, one record per CPU (`harness.cpu_model`).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_roofline import sft_rows
from harness import cpu_model, make_trainer, write_machine_record
from rich.console import Console
from rich.table import Table

from agentgym_opsd.trainer.logprobs import bucket_micro_batches, shared_prompt_prefix
from agentgym_opsd.trainer.warm_start import sft_schedule, sft_step

RESULTS = Path(__file__).parent / "results"
LAYOUTS = ("padded", "packed", "packed-prefix")


def computed_tokens(rows: list[Any], pick: np.ndarray, *, max_tokens: int, max_rows: int, packed: bool,
                    prefix_len: int = 0) -> int:
    """Tokens the step's micro-batches compute: each row's own, plus the padding to its micro-batch's longest; with
    a shared prefix (packed), each row's tokens after it and the prefix once per micro-batch."""
    lengths = [len(rows[i].prompt_ids) - prefix_len + len(rows[i].response_ids) for i in pick]
    batches = bucket_micro_batches(lengths, max_tokens=max_tokens, max_rows=max_rows, padded=not packed)
    return sum(sum(lengths[i] for i in b) + prefix_len if packed else len(b) * max(lengths[i] for i in b)
               for b in batches)


def measure(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    trainer = make_trainer(args.config, args.overrides, tmp)
    session, trained = trainer.session, trainer.session.trained
    cfg = session.cfg
    rows = sft_rows(trainer, args.rows)
    schedule = sft_schedule(len(rows), batch_rows=cfg.warm_start.batch_rows, epochs=1.0,
                            rng=np.random.default_rng(cfg.trainer.seed))[: args.steps]
    state = copy.deepcopy(trained.model.state_dict())
    budget = {"max_tokens": cfg.optim.micro_batch_tokens, "max_rows": cfg.optim.micro_batch_rows}
    shared = shared_prompt_prefix([r.prompt_ids for r in rows])
    prefix_of = {"padded": 0, "packed": 0, "packed-prefix": shared}
    seconds: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    wall: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    losses: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    trained.engine.set_lr(cfg.warm_start.lr)
    for k, pick in enumerate(schedule):
        for layout in LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]:  # each layout first, and last, in turn
            trained.model.load_state_dict(state)
            trained.engine.reset_optimizer_state()
            t0, w0 = time.process_time(), time.perf_counter()
            loss = sft_step(trained.engine, rows, pick, pad_id=trained.pad_id, device=trained.device,
                            autocast_dtype=session.warm_starter.autocast_dtype, packed=layout != "padded",
                            prefix_len=prefix_of[layout], **budget)
            seconds[layout].append(time.process_time() - t0)
            wall[layout].append(time.perf_counter() - w0)
            losses[layout].append(loss)
    tokens = {layout: sum(computed_tokens(rows, pick, packed=layout != "padded", prefix_len=prefix_of[layout],
                                          **budget) for pick in schedule) for layout in LAYOUTS}
    real = sum(len(rows[i].prompt_ids) + len(rows[i].response_ids) for pick in schedule for i in pick)
    return {
        "config": args.config, "steps": len(schedule), "rows_per_step": cfg.warm_start.batch_rows,
        "demonstration_rows": len(rows), "real_tokens": real, "shared_prefix_tokens": shared, "dtype": cfg.model.dtype,
        "layouts": {layout: {"cpu_s_per_step_median": statistics.median(seconds[layout]),
                             "cpu_s_per_step_mean": statistics.fmean(seconds[layout]),
                             "wall_s_per_step_median": statistics.median(wall[layout]),
                             "computed_tokens": tokens[layout],
                             "loss_max_abs_diff_vs_padded": max(abs(a - b) for a, b in
                                                                zip(losses[layout], losses["padded"], strict=True))}
                    for layout in LAYOUTS},
        "packed_speedup_median": statistics.median(seconds["padded"]) / statistics.median(seconds["packed"]),
        "packed_wall_speedup_median": statistics.median(wall["padded"]) / statistics.median(wall["packed"]),
        "prefix_speedup_median": statistics.median(seconds["packed"]) / statistics.median(seconds["packed-prefix"]),
        "prefix_wall_speedup_median": statistics.median(wall["packed"]) / statistics.median(wall["packed-prefix"]),
        "threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--steps", type=int, default=12, help="SFT steps, each run in both layouts")
    ap.add_argument("--rows", type=int, default=96, help="demonstration rows to draw the steps from")
    ap.add_argument("--out", type=Path, default=RESULTS / "sft_layout.json")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = ap.parse_args(argv)
    cpu = cpu_model()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_sft_layout_") as tmp:
        record = {"cpu": cpu, **measure(args, tmp), "load_avg_before_after": [load_before, os.getloadavg()[0]]}
    write_machine_record(args.out, cpu, record)
    table = Table(title=f"SFT step by layout, {args.config} ({record['dtype']}), {record['steps']} steps, {cpu}")
    for col in ("layout", "CPU s / step", "wall s / step", "tokens computed", "loss diff vs padded"):
        table.add_column(col, justify="right")
    for layout, r in record["layouts"].items():
        table.add_row(layout, f"{r['cpu_s_per_step_median']:.2f}", f"{r['wall_s_per_step_median']:.2f}",
                      f"{r['computed_tokens']} ({r['computed_tokens'] / record['real_tokens']:.2f}x real)",
                      f"{r['loss_max_abs_diff_vs_padded']:.1e}")
    Console().print(table)
    print(f"packed / padded: {record['packed_speedup_median']:.2f}x faster per step in CPU seconds, "
          f"{record['packed_wall_speedup_median']:.2f}x in wall seconds; the shared prefix laid once / packed: "
          f"{record['prefix_speedup_median']:.2f}x, {record['prefix_wall_speedup_median']:.2f}x; wrote {args.out}")


if __name__ == "__main__":
    main()
