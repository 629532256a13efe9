"""Is a bf16 warm start's lower exact match its training or its inference? One cached warm start, scored greedy on
its own held-out demonstrations in each compute dtype, side by side in one run (prints a table, writes JSON).

The warm start reports `warm_start/heldout_action_exact_match`: greedy answers to the held-out demonstrations'
prompts that parse to exactly the expert's action, computed in the dtype it trained in. A bf16 warm start
scored below a float32 one (ALFWorld `cpu-small`: 82.7% against 92.3%). Its weights can be scored in float32
too: if float32 compute recovers the gap, greedy decoding in bf16 (near-ties decided by rounding) costs it, not
the bf16 training; if not, the weights are worse.

    python benchmarks/bench_warm_start_precision.py --model ~/.cache/agentgym_opsd/warm_start/KEY/model
    python benchmarks/bench_warm_start_precision.py --config cpu-tiny --model PATH --out /tmp/w.json  # quick

`--config` must be the warm start's own preset (and overrides): its held-out demonstrations are the tail of the
demonstration tasks that config draws.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from harness import cpu_model, make_trainer  # noqa: E402

from agentgym_opsd.models.backends import make_policy_backend  # noqa: E402
from agentgym_opsd.trainer.warm_start import action_exact_match, collect_demonstrations, split_heldout  # noqa: E402

RESULTS = Path(__file__).parent / "results"
DTYPES = ("float32", "bfloat16")


def score(config: str, model: str, dtype: str, overrides: list[str]) -> dict[str, float]:
    """Exact match of `model`, computed in `dtype`, on the held-out demonstrations of `config`'s warm start."""
    with tempfile.TemporaryDirectory() as out:
        trainer = make_trainer(config, [f"model.name_or_path={model}", f"model.dtype={dtype}", *overrides], out)
        try:
            session, ws = trainer.session, trainer.session.cfg.warm_start
            runner = session.envs[0].runner
            demos = collect_demonstrations(runner, session.warm_starter.demonstration_tasks(), thought=ws.thought,
                                           batch=runner.pool.num_envs)
            _, heldout = split_heldout(demos, ws.heldout_episodes)  # the warm start's own split
            if not heldout:
                raise ValueError(f"warm_start.heldout_episodes={ws.heldout_episodes} of {len(demos)} won "
                                 "demonstrations: no held-out slice to score")
            greedy = make_policy_backend("hf", model=session.trained.model, tokenizer=session.trained.tokenizer,
                                         max_new_tokens=session.cfg.rollout.max_new_tokens, temperature=0.0,
                                         batch_size=session.cfg.rollout.batch_size, seed=0)
            session.trained.model.eval()
            t0 = time.perf_counter()
            exact = action_exact_match(greedy, heldout, runner.parser)
            return {"exact_match": exact, "turns": sum(len(d.turns) for d in heldout),
                    "episodes": len(heldout), "seconds": time.perf_counter() - t0}
        finally:
            trainer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--model", required=True, help="the cached warm start's model folder")
    ap.add_argument("--trained-in", default="bfloat16", help="the dtype the warm start trained in (for the record)")
    ap.add_argument("--out", type=Path, default=RESULTS / "warm_start_precision.json")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    rows = {dtype: score(args.config, args.model, dtype, args.overrides) for dtype in DTYPES}
    table = Table(title=f"warm start trained in {args.trained_in}, scored greedy in each dtype ({cpu_model()}, "
                        f"{torch.get_num_threads()} threads)")
    for col in ("compute dtype", "held-out exact match", "turns", "seconds"):
        table.add_column(col, justify="right")
    for dtype, r in rows.items():
        table.add_row(dtype, f"{100 * r['exact_match']:.1f}%", str(r["turns"]), f"{r['seconds']:.0f}")
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": args.config, "overrides": args.overrides, "model": args.model,
                                    "trained_in": args.trained_in, "cpu": cpu_model(),
                                    "threads": torch.get_num_threads(), "scored_in": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
