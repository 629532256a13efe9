"""The warm start's SFT in float32 against under bf16 autocast: the policies each leaves, on held-out episodes.

On a bf16 model whose top blocks train in float32 (`model.trainable_dtype=auto` where `model.dtype=auto` picks
bf16), `warm_start.autocast=true` computes the SFT's matmuls in bf16 (1.6x faster on an AMD EPYC with
AVX512-BF16) and reaches about the same held-out action exact match. Exact match scores 52 greedy turns; this plays
each warm start's policy on many held-out episodes at the validation temperature, with the RL phases' numerics
(`model.autocast=on` for both), and pairs the episodes (same seeds) against the float32 SFT.

Each variant is a `cpu-small` run with `trainer.total_steps=0` (the warm start, cached as usual, then the start
evaluation only), one after the other with every core; a variant whose run folder has its metrics is not run
again. `--seeds` trains each variant's SFT from several `warm_start.seed`s (its own demonstration order, held-out
demonstrations and batches; the evaluation episodes stay the same), so a gap between the variants can be told from
the spread between two SFTs of one precision: each run is paired with the float32 SFT of its seed, and the
variants' figures are averaged over the seeds, their episodes pooled for the McNemar test. `--runs
NAME[@SEED]=DIR` reads finished run folders instead (the same layout; e.g. ones whose warm start came from a
cache entry of an older commit).

    python benchmarks/bench_warm_start_autocast.py                     # -> results/warm_start_autocast.json
    python benchmarks/bench_warm_start_autocast.py --seeds 0 1 2       # three SFTs of each precision
    python benchmarks/bench_warm_start_autocast.py --episodes 48 --out /tmp/w.json --runs-dir /tmp/w
    python benchmarks/bench_warm_start_autocast.py --runs float32=RUN_A autocast=RUN_B float32@1=RUN_C   # report only
"""

from __future__ import annotations

import argparse
import json
import statistics
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
VARIANTS = {"float32": ("warm_start.autocast=false",), "autocast": ("warm_start.autocast=true",)}  # the first is the baseline
"""The SFT's precision, as overrides of the preset."""


def run_variant(run_dir: Path, config: str, overrides: list[str], episodes: int) -> None:
    """The warm start and a start evaluation of `episodes` held-out episodes into `run_dir` (all cores)."""
    proc = start_training_run(run_dir, config, ["trainer.total_steps=0", "trainer.eval_at_start=true",
                                                f"trainer.eval_episodes={episodes}", "trainer.eval_pool_rollouts=0",
                                                "model.autocast=on", *overrides], threads=0)
    if proc.wait() != 0:
        raise SystemExit(f"{run_dir}: the run failed (see {run_dir}.log)")


def invalid_by_outcome(episodes: list[dict[str, Any]]) -> dict[str, float | None]:
    """Invalid actions per turn within the won and within the lost episodes (None where there are none, or where
    the records lack the counts): an SFT that loses as often but flails more once lost differs only in the second."""
    out: dict[str, float | None] = {}
    for key, won in (("invalid_rate_won", True), ("invalid_rate_lost", False)):
        mine = [e for e in episodes if bool(e["won"]) == won]
        counted = all("invalid_actions" in e and "turns" in e for e in mine)
        turns = sum(e["turns"] for e in mine) if counted else 0
        out[key] = sum(e["invalid_actions"] for e in mine) / turns if turns else None
    return out


def read_run(run_dir: Path) -> dict[str, Any]:
    """A finished variant's figures: held-out success and invalid-action rate (also within the won and the lost
    episodes), the warm start's exact match and SFT seconds, and its episodes (for the pairing)."""
    (metrics,) = [m for m in read_metrics(run_dir) if "val/success_rate" in m] or [None]
    if metrics is None:
        raise SystemExit(f"{run_dir}: no start evaluation in metrics.jsonl")
    summary = json.loads((run_dir / "warm_start" / "summary.json").read_text(encoding="utf-8"))
    episodes = read_episode_outcomes(validation_file(run_dir, 0))
    return {"success": metrics["val/success_rate"], "invalid_action_rate": metrics["val/invalid_action_rate"],
            "episodes": len(episodes), "exact_match": summary.get("warm_start/heldout_action_exact_match"),
            "sft_seconds": summary.get("warm_start/seconds_sft"), **invalid_by_outcome(episodes),
            "episode_records": episodes}


def run_label(name: str, seed: int) -> str:
    """A run's name in the record and its folder under `--runs-dir`: the variant, with `@seed` past seed 0."""
    return name if seed == 0 else f"{name}@{seed}"


def parse_run(arg: str) -> tuple[str, int, Path]:
    """`NAME[@SEED]=DIR` -> (NAME, SEED, DIR)."""
    label, _, folder = arg.partition("=")
    name, _, seed = label.partition("@")
    if not folder or not name or (seed and not seed.isdigit()):
        raise SystemExit(f"--runs {arg!r}: expected NAME=DIR or NAME@SEED=DIR")
    return name, int(seed or 0), Path(folder)


def seeded(records: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Episode records made distinct per SFT seed, so runs of several seeds pool into one paired test."""
    return [{**r, "env_spec": f"{r['env_spec']}#sft{seed}"} for r in records]


def summarize_variants(runs: dict[tuple[str, int], dict[str, Any]], baseline: str) -> dict[str, dict[str, Any]]:
    """Per variant: its seeds, the mean and per-seed success, invalid-action rates, exact match and SFT seconds,
    and its episodes paired with the baseline's of the same seed, pooled over the seeds both have."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(n for n, _ in runs):
        seeds = sorted(s for n, s in runs if n == name)
        mine = [runs[name, s] for s in seeds]
        entry: dict[str, Any] = {"seeds": seeds}
        for key in ("success", "invalid_action_rate", "invalid_rate_won", "invalid_rate_lost", "exact_match",
                    "sft_seconds"):
            values = [r[key] for r in mine]
            entry[key] = statistics.fmean(values) if None not in values else None
            entry[key + "_per_seed"] = values
        entry["episodes"] = sum(r["episodes"] for r in mine)
        shared = [s for s in seeds if (baseline, s) in runs]
        paired = None
        if name != baseline and shared:
            paired = paired_episodes([e for s in shared for e in seeded(runs[baseline, s]["episode_records"], s)],
                                     [e for s in shared for e in seeded(runs[name, s]["episode_records"], s)])
        entry["vs_" + baseline] = paired.to_json() if paired is not None else None
        out[name] = entry
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--episodes", type=int, default=144, help="held-out episodes per variant")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="warm_start.seed of each variant's SFTs")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                    help="the SFT precisions to run; the first run's (float32 unless left out) is the baseline "
                         "each run is paired with, and the record replaces this CPU's: report older runs with --runs")
    ap.add_argument("--runs-dir", type=Path, default=Path("runs/warm_start_autocast"))
    ap.add_argument("--runs", nargs="+", metavar="NAME[@SEED]=DIR", help="report finished run folders instead")
    ap.add_argument("--note", default="", help="how the runs were made, kept in the record")
    ap.add_argument("--out", type=Path, default=RESULTS / "warm_start_autocast.json")
    args = ap.parse_args(argv)
    if args.runs:
        folders = {(name, seed): folder for name, seed, folder in map(parse_run, args.runs)}
    else:
        names = [name for name in VARIANTS if name in args.variants]
        folders = {(name, seed): args.runs_dir / run_label(name, seed) for seed in args.seeds for name in names}
        for (name, seed), folder in folders.items():
            if not read_metrics(folder):
                run_variant(folder, args.config, [*VARIANTS[name], f"warm_start.seed={seed}"], args.episodes)
    runs = {key: read_run(folder) for key, folder in folders.items()}
    baseline = next(iter(runs))[0]
    for (name, seed), run in runs.items():
        paired = paired_episodes(runs[baseline, seed]["episode_records"], run["episode_records"]) \
            if (baseline, seed) in runs and name != baseline else None
        run["vs_" + baseline] = paired.to_json() if paired is not None else None
    cpu = cpu_model()
    record = {"config": args.config, "cpu": cpu, "note": args.note, "baseline": baseline,
              "runs": {run_label(name, seed): {"variant": name, "seed": seed,
                                               **{k: v for k, v in run.items() if k != "episode_records"}}
                       for (name, seed), run in runs.items()},
              "variants": summarize_variants(runs, baseline)}
    write_machine_record(args.out, cpu, record)

    console = Console()
    for title, rows in ((f"warm start SFT precision, each SFT, {args.config}, {cpu}", record["runs"]),
                        ("averaged over the SFT seeds (episodes pooled for the pairing)", record["variants"])):
        table = Table(title=title)
        for col in ("SFT", "seeds", "SFT s", "exact match", "held-out success", "invalid actions",
                    "in won / lost episodes", f"episodes gained / lost vs {baseline} (McNemar p)"):
            table.add_column(col, justify="right")
        for label, run in rows.items():
            paired = run["vs_" + baseline]
            vs = f"{paired['second_only']} / {paired['first_only']} ({paired['mcnemar_p']:.2f})" if paired else "-"
            seeds = run["seeds"] if "seeds" in run else [run["seed"]]
            seconds = f"{run['sft_seconds']:.0f}" if run["sft_seconds"] is not None else "-"
            exact = f"{run['exact_match']:.1%}" if run["exact_match"] is not None else "-"
            by_outcome = " / ".join(f"{run[k]:.1%}" if run[k] is not None else "-"
                                    for k in ("invalid_rate_won", "invalid_rate_lost"))
            table.add_row(label, " ".join(map(str, seeds)), seconds, exact,
                          f"{run['success']:.1%} of {run['episodes']}", f"{run['invalid_action_rate']:.1%}",
                          by_outcome, vs)
        console.print(table)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
