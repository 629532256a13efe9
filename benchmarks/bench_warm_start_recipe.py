"""What a cheaper warm start costs: the main job's warm start (`cpu-small`, seed 0) under recipe changes, each arm
trained alone (`trainer.total_steps=0`, no evaluation), scored by its held-out action exact match (greedy answers to
the 8 held-out oracle episodes' prompts that parse to exactly the expert's action) beside its SFT seconds.

The warm start is the largest phase of a cold main job on a CPU where float32 is the fast dtype (13.7 of 43.5
minutes on an AMD EPYC without bf16 instructions; its second epoch, over the frozen trunk's kept outputs, is 5.2
of them). An arm that saves minutes but answers fewer held-out turns as the expert does starts RL from a worse
policy; the issue's bar for a warm start that must match another is 2 points of exact match.

    python benchmarks/bench_warm_start_recipe.py --arm one-epoch warm_start.epochs=1 \
        --arm one-epoch-batch4 warm_start.epochs=1 warm_start.batch_rows=4
    python benchmarks/bench_warm_start_recipe.py --arm base --out runs/ws --threads 1   # the preset itself

Each arm's run folder is `OUT/NAME` (its cache `OUT/NAME/cache`, with the generated games and the model linked from
`--base-cache` when given, so arms do not regenerate them); an arm whose folder already holds a warm-start summary
is read, not run again, so a stopped benchmark resumes and arms run by hand with the same command join the table.
Writes `benchmarks/results/warm_start_recipe.json` (one record per CPU: the seconds are the machine's).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness import (
    cpu_model,
    last_time_line,
    read_machines,
    run_training,
    time_line_threads,
    train_command,
    training_env,
    write_machine_record,
)
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WARM_START_ONLY = ("trainer.total_steps=0", "trainer.eval_at_start=false")
SHARED_CACHE_ENTRIES = ("models", "alfworld")


def arm_command(python: str, run_dir: Path, overrides: list[str]) -> list[str]:
    """The CLI call that trains `cpu-small`'s warm start with `overrides` into `run_dir` and stops there."""
    return train_command(python, "cpu-small", run_dir, [*WARM_START_ONLY, *overrides])


def run_arm(python: str, run_dir: Path, overrides: list[str], *, threads: int, base_cache: Path | None) -> None:
    """Train one arm (its log beside its folder, `NAME.log`); raises with the log's tail if it fails."""
    cache = run_dir / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    for entry in SHARED_CACHE_ENTRIES if base_cache else ():
        if (base_cache / entry).exists() and not (cache / entry).exists():
            (cache / entry).symlink_to((base_cache / entry).resolve())
    run_training(arm_command(python, run_dir / "run", overrides), training_env(threads, cache),
                 run_dir.with_suffix(".log"), what=f"arm {run_dir.name}", cwd=ROOT)


def arm_record(run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """An arm's figures from its own run folder: the warm start's summary and the threads its time line names."""
    summary = json.loads((run_dir / "run" / "warm_start" / "summary.json").read_text(encoding="utf-8"))
    return {"overrides": overrides, "threads": time_line_threads(last_time_line(run_dir.with_suffix(".log"))),
            "heldout_action_exact_match": summary["warm_start/heldout_action_exact_match"],
            "sft_steps": summary["warm_start/sft_steps"], "epochs": summary["warm_start/epochs"],
            "loss_last": summary["warm_start/loss_last"], "seconds_sft": summary["warm_start/seconds_sft"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", nargs="+", action="append", required=True, metavar=("NAME", "KEY=VALUE"),
                    help="an arm: its name, then the settings it changes (none: the preset's own warm start)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter to train with")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "warm-start-recipe", help="the arms' run folders")
    ap.add_argument("--base-cache", type=Path, help="a cache whose generated games and model the arms link to")
    ap.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS per arm (0: torch's default)")
    ap.add_argument("--results", type=Path, default=RESULTS / "warm_start_recipe.json")
    args = ap.parse_args(argv)
    cpu = cpu_model()
    record = read_machines(args.results).get(cpu, {"arms": {}})
    for name, *overrides in args.arm:
        if any("=" not in o for o in overrides):
            raise SystemExit(f"arm {name}: settings are KEY=VALUE, got {overrides}")
        run_dir = args.out / name
        if not (run_dir / "run" / "warm_start" / "summary.json").is_file():
            print(f"{name}: training the warm start with {overrides or 'the preset'} ({cpu})", file=sys.stderr)
            run_arm(args.python, run_dir, overrides, threads=args.threads, base_cache=args.base_cache)
        record["arms"][name] = arm_record(run_dir, overrides)
        write_machine_record(args.results, cpu, record)
    table = Table(title=f"cpu-small's warm start, seed 0 ({cpu})")
    for col in ("arm", "settings", "SFT steps", "last loss", "held-out exact match", "SFT s", "threads"):
        table.add_column(col, justify="right")
    for name, arm in record["arms"].items():
        table.add_row(name, " ".join(arm["overrides"]) or "(preset)", f"{arm['sft_steps']:.0f}", f"{arm['loss_last']:.3f}",
                      f"{100 * arm['heldout_action_exact_match']:.1f}%", f"{arm['seconds_sft']:.0f}", str(arm["threads"] or "–"))
    Console().print(table)
    print(f"wrote {args.results}", file=sys.stderr)


if __name__ == "__main__":
    main()
