"""The main job's recipe across RL seeds: GRPO and AgentOPSD from one cached warm start, 3 seeds each.

    python benchmarks/bench_main_job.py                         # cpu-small, seeds 0 1 2, both estimators
    python benchmarks/bench_main_job.py --steps 12 --parallel 2 --out runs/main-job
    python benchmarks/bench_main_job.py --report-only           # rebuild the JSON, table and plot

Stage 1 (`<out>/before`, all threads): `python -m agentgym_opsd.train` with `trainer.total_steps=0`: the
warm start (or its cache entry, `warm_start.seed=0` for every run) and the "before" numbers — held-out
success (48 episodes at the validation temperature 0.4) and sampled success on the RL pool (every game × 4
at the rollout temperature). Every RL run starts from the same weights, so these are the before numbers of
all of them, and evaluation episodes are the same before and after (paired).
Stage 2: one training run per (estimator, seed) with `trainer.seed=SEED` (task order and sampling), the
runs `--parallel` at a time with the cores split between them. A run that was killed resumes from its last
checkpoint; a finished run (its result file exists) is skipped, so the script can be re-run until done.

Writes `benchmarks/results/main_job/<estimator>_seed<S>.json` per run (before / after with Wilson 95%
intervals, per-step training numbers, and the credit check: rows of failed trajectories with a positive
advantage) and `benchmarks/results/cpu_small_seeds.json`:
`{"grpo": [{"seed", "valid_before", "valid_after", "pool_before", "pool_after", ...}], "agentopsd": [...]}`,
plus `cpu_small_seeds.png`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import yaml
from bench_learning import metrics, train  # run from benchmarks/ (python benchmarks/bench_main_job.py)
from rich.console import Console
from rich.table import Table

from agentgym_opsd.evaluation.metrics import wilson_interval

ESTIMATORS = ("grpo", "agentopsd")
RESULTS = Path(__file__).parent / "results"
PER_RUN = RESULTS / "main_job"
EVAL = ["trainer.eval_episodes=48", "trainer.eval_pool_rollouts=4", "warm_start.seed=0"]


def interval(rate: float, episodes: float) -> list[float]:
    return list(wilson_interval(round(rate * episodes), int(episodes)))


def credit_check(run: Path) -> dict[str, int]:
    """Turn rows of lost trajectories, and how many of them got a positive advantage (must be none)."""
    rows = positive = 0
    for path in sorted((run / "credit").glob("step_*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            traj = json.loads(line)
            if traj["won"]:
                continue
            for turn in traj["turns"]:
                rows += 1
                positive += (turn["advantage"] or 0.0) > 0
    return {"failed_rows": rows, "failed_rows_positive": positive}


def run_result(run: Path, before: dict, estimator: str, seed: int) -> dict | None:
    lines = metrics(run)
    steps = [m for m in lines if "seconds_update" in m]
    after = next((m for m in reversed(lines) if "val/success_rate" in m and m.get("step", 0) > 0), None)
    if not steps or after is None:
        return None
    val_n = float(yaml.safe_load((run / "config.yaml").read_text())["trainer"]["eval_episodes"])
    return {
        "estimator": estimator, "seed": seed,
        "valid_before": before["val/success_rate"], "valid_after": after["val/success_rate"],
        "pool_before": before["pool/success_rate"], "pool_after": after["pool/success_rate"],
        "valid_after_ci": interval(after["val/success_rate"], val_n),
        "pool_after_ci": interval(after["pool/success_rate"], after["pool/episodes"]),
        "valid_invalid_before": before["val/invalid_action_rate"], "valid_invalid_after": after["val/invalid_action_rate"],
        "rl_steps": len(steps),
        "rl_minutes": sum(m["seconds_rollout"] + m["seconds_teacher"] + m["seconds_update"] for m in steps) / 60,
        "per_step": [{k: m.get(k) for k in ("step", "success_rate", "entropy", "grad_norm", "approx_kl",
                                            "sampling/rounds", "sampling/dropped_groups", "sampling/mixed_group_share",
                                            "rollout/sampled_nll_per_token")} for m in steps],
        **credit_check(run),
    }


def before_numbers(out: Path, config: str, overrides: list[str], threads: int) -> dict:
    run = out / "before"
    if not metrics(run):
        proc = train(run, config, ["trainer.total_steps=0", "trainer.eval_at_start=true", *EVAL, *overrides], threads)
        if proc.wait() != 0:
            raise SystemExit(f"the warm start / before evaluation failed, see {out / 'before.log'}")
    return metrics(run)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--estimators", nargs="+", default=list(ESTIMATORS))
    ap.add_argument("--steps", type=int, default=0, help="RL steps per run (0 = the preset's total_steps)")
    ap.add_argument("--out", default="runs/main-job")
    ap.add_argument("--parallel", type=int, default=2, help="runs at a time (the cores are split between them)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = ap.parse_args()
    out = Path(args.out)
    cores = os.cpu_count() or 2
    before = before_numbers(out, args.config, args.overrides, threads=cores) if not args.report_only else \
        metrics(out / "before")[0]
    PER_RUN.mkdir(parents=True, exist_ok=True)
    todo = [(est, seed) for seed in args.seeds for est in args.estimators
            if not (PER_RUN / f"{est}_seed{seed}.json").is_file()]
    steps = [f"trainer.total_steps={args.steps}", f"trainer.eval_every={args.steps}"] if args.steps else []
    running: dict[tuple[str, int], object] = {}
    threads = max(cores // max(args.parallel, 1), 1)
    while todo and not args.report_only or running:
        while todo and len(running) < args.parallel and not args.report_only:
            est, seed = todo.pop(0)
            overrides = [f"algorithm.estimator={est}", f"trainer.seed={seed}", "trainer.eval_at_start=false", *EVAL,
                         *steps, *args.overrides]
            running[(est, seed)] = (train(out / f"{est}_seed{seed}", args.config, [*overrides], threads,
                                          resume=True), time.perf_counter())
        time.sleep(10)
        for key, (proc, t0) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[key]
            est, seed = key
            result = run_result(out / f"{est}_seed{seed}", before, est, seed) if proc.returncode == 0 else None
            if result is None:
                print(f"{est} seed {seed} failed (exit {proc.returncode}), see {out / f'{est}_seed{seed}.log'}")
                continue
            result["wall_minutes"] = (time.perf_counter() - t0) / 60
            (PER_RUN / f"{est}_seed{seed}.json").write_text(json.dumps(result, indent=2) + "\n")
    report(before, args.config)


def report(before: dict, config: str) -> None:
    runs: dict[str, list[dict]] = {est: [] for est in ESTIMATORS}
    for path in sorted(PER_RUN.glob("*_seed*.json")):
        r = json.loads(path.read_text())
        runs.setdefault(r["estimator"], []).append(r)
    summary = {}
    table = Table(title=f"{config}: RL seeds from one warm start (held-out 48 episodes at T=0.4; pool 16 games x 4)")
    for col in ("estimator", "seed", "held-out before -> after [95% CI]", "pool before -> after [95% CI]",
                "invalid (held-out)", "failed rows > 0", "RL min"):
        table.add_column(col, justify="right")
    for est, rows in runs.items():
        rows.sort(key=lambda r: r["seed"])
        for r in rows:
            table.add_row(est, str(r["seed"]),
                          f"{100 * r['valid_before']:.1f} -> {100 * r['valid_after']:.1f} "
                          f"[{100 * r['valid_after_ci'][0]:.0f}, {100 * r['valid_after_ci'][1]:.0f}]",
                          f"{100 * r['pool_before']:.1f} -> {100 * r['pool_after']:.1f} "
                          f"[{100 * r['pool_after_ci'][0]:.0f}, {100 * r['pool_after_ci'][1]:.0f}]",
                          f"{100 * r['valid_invalid_before']:.1f} -> {100 * r['valid_invalid_after']:.1f}",
                          f"{r['failed_rows_positive']}/{r['failed_rows']}", f"{r['rl_minutes']:.0f}")
        if rows:
            n = len(rows)
            summary[est] = {
                "seeds": n,
                "mean_valid_gain": sum(r["valid_after"] - r["valid_before"] for r in rows) / n,
                "mean_pool_gain": sum(r["pool_after"] - r["pool_before"] for r in rows) / n,
                "valid_never_worse": all(r["valid_after"] >= r["valid_before"] for r in rows),
            }
    Console().print(table)
    for est, s in summary.items():
        print(f"{est}: mean held-out gain {100 * s['mean_valid_gain']:+.1f} points, mean pool gain "
              f"{100 * s['mean_pool_gain']:+.1f} points over {s['seeds']} seeds; held-out never worse: "
              f"{s['valid_never_worse']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {est: [{k: r[k] for k in ("seed", "valid_before", "valid_after", "pool_before", "pool_after")}
                     for r in rows] for est, rows in runs.items()}
    payload["summary"] = summary
    payload["config"] = config
    (RESULTS / "cpu_small_seeds.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot(runs, before)


def plot(runs: dict[str, list[dict]], before: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for i, (key, label) in enumerate((("valid", "held-out success (%)"), ("pool", "pool success (%)"))):
        ax = axes[i]
        for j, est in enumerate(runs):
            for r in runs[est]:
                ax.plot([0, 1], [100 * r[f"{key}_before"], 100 * r[f"{key}_after"]], marker="o",
                        color=f"C{j}", alpha=0.8, label=est if r is runs[est][0] else None)
        ax.set_xticks([0, 1], ["before", "after"])
        ax.set_title(label)
        ax.legend()
    ax = axes[2]
    for j, est in enumerate(runs):
        for r in runs[est]:
            pts = [(m["step"], m["success_rate"]) for m in r["per_step"]]
            ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], color=f"C{j}", alpha=0.6, lw=1)
    ax.set_title("training-batch success per step (%)")
    ax.set_xlabel("RL step")
    fig.tight_layout()
    fig.savefig(RESULTS / "cpu_small_seeds.png", dpi=110)


if __name__ == "__main__":
    main()
