"""One decode step of the HF sampler's model with the KV cache that decodes in place (`models/kv_cache.py`) and with
transformers' `DynamicCache`, which concatenates the whole cache again per token, at the shapes our environments
decode: ALFWorld's (16 rows after a ~210-token prompt) and the long contexts of WebShop and Search-QA pages.

A step of a small model on a CPU streams its weights (540 MB for SmolLM2-135M in float32) and, with the
concatenating cache, every cached key and value of every layer (about 46 KB per token of context per row, read and
written again). The reserved cache writes one token's keys and values instead. Per shape: random prompt tokens are
prefilled, then `--steps` greedy steps are timed; the modes alternate (reserved, concatenated, concatenated,
reserved, ...) after a warm-up in one process, so a drift of the machine falls on both. The JSON keeps one record per CPU.

    python benchmarks/bench_kv_cache.py                        # -> benchmarks/results/kv_cache.json
    python benchmarks/bench_kv_cache.py --model tiny-random --shape 2x32 --steps 4 --rounds 1 --out /tmp/k.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from bench_hf_sampler import COMPARISONS, order  # noqa: E402
from bench_rollout_backends import RESULTS  # noqa: E402
from harness import cpu_model, write_machine_record  # noqa: E402

from agentgym_opsd.models import kv_cache  # noqa: E402
from agentgym_opsd.models.hf_policy import cache_kwarg  # noqa: E402
from agentgym_opsd.models.loading import load_policy_model  # noqa: E402

SHAPES = ("16x210", "8x1500", "8x3000")
"""rows x context tokens: ALFWorld's generate chunk, and a WebShop / Search-QA page history."""


def decode_ms(model: Any, rows: int, context: int, steps: int, *, seed: int = 0) -> tuple[float, str]:
    """Milliseconds per greedy decode step of `rows` rows after a `context`-token random prompt, with the cache
    `kv_cache.reserved_cache` gives (the mode's patch decides which) and room reserved as the sampler reserves it,
    and the class of that cache's layers."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, model.config.vocab_size - 1, (rows, context), generator=g)
    mask = torch.ones_like(ids)
    cache = {cache_kwarg(model): kv_cache.reserved_cache(model)}
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, **cache, logits_to_keep=1)
        kv_cache.reserve(*cache.values(), context + steps)
        tokens, positions = out.logits[:, -1].argmax(-1), torch.full((rows, 1), context)
        start = time.perf_counter()
        for _ in range(steps):
            mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=1)
            out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions, use_cache=True,
                        **cache, logits_to_keep=1)
            tokens, positions = out.logits[:, -1].argmax(-1), positions + 1
        seconds = time.perf_counter() - start
    (made,) = cache.values()
    return 1000 * seconds / steps, type(made.layers[0]).__name__


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--shape", action="append", help=f"ROWSxCONTEXT (default: {', '.join(SHAPES)})")
    ap.add_argument("--steps", type=int, default=48, help="decode steps timed per round")
    ap.add_argument("--rounds", type=int, default=2, help="pairs of rounds (one per mode each)")
    ap.add_argument("--out", type=Path, default=RESULTS / "kv_cache.json")
    args = ap.parse_args(argv)
    model, _ = load_policy_model(args.model, trainable=False)
    model.eval()
    switches = COMPARISONS["kv-cache"]
    modes = tuple(switches)
    load_before = os.getloadavg()[0]
    shapes: dict[str, dict[str, Any]] = {}
    for shape in args.shape or SHAPES:
        rows, context = (int(x) for x in shape.split("x"))
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        layers: dict[str, str] = {}
        with switches[modes[0]](model):
            decode_ms(model, rows, context, 2)  # warm-up: allocator, caches
        for mode in order(modes, args.rounds):
            with switches[mode](model):
                ms, layers[mode] = decode_ms(model, rows, context, args.steps)
                times[mode].append(ms)
        medians = {mode: statistics.median(ts) for mode, ts in times.items()}
        shapes[shape] = {"rows": rows, "context": context, "ms_per_step": medians, "rounds": times, "cache_layers": layers,
                         "speedup": medians["concatenated"] / medians["reserved"]}
        print(f"{shape}: {medians}", file=sys.stderr)
    cpu = cpu_model()
    record = {"model": args.model, "steps": args.steps, "rounds": args.rounds, "threads": torch.get_num_threads(),
              "load_avg_before_after": [load_before, os.getloadavg()[0]], "cpu": cpu, "shapes": shapes}
    write_machine_record(args.out, cpu, record)
    table = Table(title=f"one decode step, {args.model}, float32, {record['threads']} threads, {cpu}")
    for col in ("rows x context", "concatenated ms", "reserved ms", "reserved speed-up"):
        table.add_column(col, justify="right")
    for shape, s in shapes.items():
        table.add_row(shape, f"{s['ms_per_step']['concatenated']:.1f}", f"{s['ms_per_step']['reserved']:.1f}",
                      f"{s['speedup']:.2f}x")
    Console().print(table)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
