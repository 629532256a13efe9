"""The warm start's SFT in float32 against under bf16 autocast: the policies each leaves, on held-out episodes.

On a bf16 model whose top blocks train in float32 (`model.trainable_dtype=auto` where `model.dtype=auto` picks
bf16), `warm_start.autocast=true` computes the SFT's matmuls in bf16 (1.6x faster on an AMD EPYC with
AVX512-BF16) and reaches the same held-out action exact match. Exact match scores 52 greedy turns; this plays
each warm start's policy on many held-out episodes at the validation temperature, with the RL phases' numerics
(`model.autocast=on` for both), and pairs the episodes (same seeds) against the float32 SFT.

Each variant is a `cpu-small` run with `trainer.total_steps=0` (the warm start, cached as usual, then the start
evaluation only), one after the other with every core; a variant whose run folder has its metrics is not run
again. `--runs NAME=DIR` reads finished run folders instead (the same layout; e.g. ones whose warm start came
from a cache entry of an older commit).

    python benchmarks/bench_warm_start_autocast.py                     # -> results/warm_start_autocast.json
    python benchmarks/bench_warm_start_autocast.py --episodes 48 --out /tmp/w.json --runs-dir /tmp/w
    python benchmarks/bench_warm_start_autocast.py --runs float32=RUN_A autocast=RUN_B   # report only
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from experiments import read_metrics, start_training_run  # noqa: E402
from harness import cpu_model, write_machine_record  # noqa: E402

from agentgym_opsd.evaluation.paired import paired_episodes  # noqa: E402
from agentgym_opsd.trainer.validation import read_episode_outcomes, validation_file  # noqa: E402

RESULTS = Path(__file__).parent / "results"
VARIANTS = {"float32": (), "autocast": ("warm_start.autocast=true",)}  # the first is the baseline
"""The SFT's precision, as overrides of the preset."""


def run_variant(run_dir: Path, config: str, overrides: list[str], episodes: int) -> None:
    """The warm start and a start evaluation of `episodes` held-out episodes into `run_dir` (all cores)."""
    proc = start_training_run(run_dir, config, ["trainer.total_steps=0", "trainer.eval_at_start=true",
                                                f"trainer.eval_episodes={episodes}", "trainer.eval_pool_rollouts=0",
                                                "model.autocast=on", *overrides], threads=0)
    if proc.wait() != 0:
        raise SystemExit(f"{run_dir}: the run failed (see {run_dir}.log)")


def read_run(run_dir: Path) -> dict[str, Any]:
    """A finished variant's figures: held-out success and invalid-action rate, the warm start's exact match and
    SFT seconds, and its episodes (for the pairing)."""
    (metrics,) = [m for m in read_metrics(run_dir) if "val/success_rate" in m] or [None]
    if metrics is None:
        raise SystemExit(f"{run_dir}: no start evaluation in metrics.jsonl")
    summary = json.loads((run_dir / "warm_start" / "summary.json").read_text(encoding="utf-8"))
    episodes = read_episode_outcomes(validation_file(run_dir, 0))
    return {"success": metrics["val/success_rate"], "invalid_action_rate": metrics["val/invalid_action_rate"],
            "episodes": len(episodes), "exact_match": summary.get("warm_start/heldout_action_exact_match"),
            "sft_seconds": summary.get("warm_start/seconds_sft"), "episode_records": episodes}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--episodes", type=int, default=144, help="held-out episodes per variant")
    ap.add_argument("--runs-dir", type=Path, default=Path("runs/warm_start_autocast"))
    ap.add_argument("--runs", nargs="+", metavar="NAME=DIR", help="report finished run folders instead")
    ap.add_argument("--note", default="", help="how the runs were made, kept in the record")
    ap.add_argument("--out", type=Path, default=RESULTS / "warm_start_autocast.json")
    args = ap.parse_args(argv)
    if args.runs:
        folders = {name: Path(folder) for name, _, folder in (r.partition("=") for r in args.runs)}
    else:
        folders = {name: args.runs_dir / name for name in VARIANTS}
        for name, overrides in VARIANTS.items():
            if not read_metrics(folders[name]):
                run_variant(folders[name], args.config, list(overrides), args.episodes)
    runs = {name: read_run(folder) for name, folder in folders.items()}
    baseline = next(iter(runs))
    for name, run in runs.items():
        paired = paired_episodes(runs[baseline]["episode_records"], run["episode_records"])
        run["vs_" + baseline] = paired.to_json() if paired is not None and name != baseline else None
    cpu = cpu_model()
    record = {"config": args.config, "cpu": cpu, "note": args.note, "baseline": baseline,
              "variants": {name: {k: v for k, v in run.items() if k != "episode_records"} for name, run in runs.items()}}
    write_machine_record(args.out, cpu, record)

    table = Table(title=f"warm start SFT precision, {args.config}, {cpu}")
    for col in ("SFT", "SFT s", "exact match", "held-out success", "invalid actions",
                f"episodes gained / lost vs {baseline} (McNemar p)"):
        table.add_column(col, justify="right")
    for name, run in record["variants"].items():
        paired = run["vs_" + baseline]
        vs = f"{paired['second_only']} / {paired['first_only']} ({paired['mcnemar_p']:.2f})" if paired else "-"
        table.add_row(name, f"{run['sft_seconds']:.0f}", f"{run['exact_match']:.1%}",
                      f"{run['success']:.1%} of {run['episodes']}", f"{run['invalid_action_rate']:.1%}", vs)
    Console().print(table)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
