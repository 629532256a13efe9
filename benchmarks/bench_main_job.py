"""The main job's recipe across RL seeds: GRPO and AgentOPSD from one cached warm start, 3 seeds each.

    python benchmarks/bench_main_job.py                         # cpu-small, seeds 0 1 2, both estimators
    python benchmarks/bench_main_job.py --parallel 3 --out runs/main-job
    python benchmarks/bench_main_job.py --report-only           # rebuild the JSON, table and plot

The "before" run (`<out>/before/cpu-small`, all cores; `<out>` = runs/study) is the warm start (or its cache entry:
`warm_start.seed=0` for every run, so all share it) and the before-numbers: held-out success (48 episodes at
the validation temperature 0.4) and sampled success on the RL pool (every game × 4 at the rollout
temperature). Every RL run starts from those weights, with `trainer.seed=SEED` for its task order and
sampling, and is evaluated on the same episodes after its last step (paired). Runs go `--parallel` at a
time (`benchmarks/experiments.py`): a killed run resumes from its checkpoint, a finished one (its file
under `benchmarks/results/study/alfworld/`, shared with `bench_study.py`, whose GRPO and AgentOPSD ALFWorld
arms these runs are) is skipped.

Writes `benchmarks/results/cpu_small_seeds.json`:
`{"grpo": [{"seed", "valid_before", "valid_after", "pool_before", "pool_after"}, ...], "agentopsd": [...],
"summary": {...}}` and `cpu_small_seeds.png`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments import BeforeSpec, ExperimentRunner, RunSpec, load_results
from render_results import render_pages  # benchmarks/ is on sys.path when a script runs from it
from rich.console import Console
from rich.table import Table

ESTIMATORS = ("grpo", "agentopsd")
RESULTS = Path(__file__).parent / "results"
EVAL = ("trainer.eval_episodes=48", "trainer.eval_pool_rollouts=4", "warm_start.seed=0")


def specs(config: str, seeds: list[int], estimators: list[str], steps: int, overrides: list[str]) -> list[RunSpec]:
    """The runs, named as `bench_study.py` names its ALFWorld arms (the default config's runs are the study's)."""
    before = BeforeSpec(config, config, (*EVAL, *overrides))
    env = "alfworld" if config == "cpu-small" and not overrides else config
    steps_kv = (f"trainer.total_steps={steps}", f"trainer.eval_every={steps}") if steps else ()
    return [RunSpec(f"{env}/{est}/seed{seed}", before,
                    (f"algorithm.estimator={est}", f"trainer.seed={seed}", *steps_kv),
                    {"env": env, "arm": est, "estimator": est, "seed": seed})
            for seed in seeds for est in estimators]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--estimators", nargs="+", default=list(ESTIMATORS))
    ap.add_argument("--steps", type=int, default=0, help="RL steps per run (0 = the preset's total_steps)")
    ap.add_argument("--out", default="runs/study", help="run folders (shared with bench_study.py)")
    ap.add_argument("--results", default=str(RESULTS / "study"), help="one JSON per finished run (shared with "
                                                                      "bench_study.py)")
    ap.add_argument("--parallel", type=int, default=2, help="runs at a time (the cores are split between them)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--report-name", default="cpu_small_seeds",
                    help="the report's file name under benchmarks/results (JSON + PNG): e.g. cpu_small_seeds_bf16 for "
                         "the runs forced to model.precision=bf16-mixed")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = ap.parse_args()
    runner = ExperimentRunner(Path(args.out), Path(args.results), parallel=args.parallel)
    wanted = specs(args.config, args.seeds, args.estimators, args.steps, args.overrides)
    if not args.report_only:
        failed = runner.run(wanted)
        if failed:
            print(f"failed: {failed} (see their .log files under {args.out}); re-run to retry them")
    names = {s.name for s in wanted}
    report([r for r in load_results(Path(args.results)) if r["name"] in names], args.config, args.report_name)


def report(results: list[dict], config: str, name: str = "cpu_small_seeds") -> None:
    runs: dict[str, list[dict]] = {}
    for r in results:
        runs.setdefault(r["labels"].get("estimator", r["labels"]["arm"]), []).append(r)
    table = Table(title=f"{config}: RL seeds from one warm start (held-out 48 episodes at T=0.4; pool 16 games x 4)")
    for col in ("estimator", "seed", "held-out before -> after [95% CI]", "episodes gained / lost (McNemar p)",
                "pool before -> after [95% CI]", "invalid (held-out)", "lost-rollout rows > 0", "RL min"):
        table.add_column(col, justify="right")
    payload: dict = {}
    summary: dict = {}
    for est, rows in runs.items():
        rows.sort(key=lambda r: r["labels"]["seed"])
        flat = []
        for r in rows:
            b, a = r["before"], r["after"]
            paired = r.get("valid_paired")  # the held-out episodes before and after, one by one (newer runs)
            flat.append({"seed": r["labels"]["seed"], "valid_before": b["valid"]["success"],
                         "valid_after": a["valid"]["success"], "pool_before": b["pool"]["success"],
                         "pool_after": a["pool"]["success"], **({"valid_paired": paired} if paired else {})})
            table.add_row(est, str(r["labels"]["seed"]),
                          f"{100 * b['valid']['success']:.1f} -> {100 * a['valid']['success']:.1f} "
                          f"[{100 * a['valid']['ci'][0]:.0f}, {100 * a['valid']['ci'][1]:.0f}]",
                          f"+{paired['second_only']} / -{paired['first_only']} (p {paired['mcnemar_p']:.2f})"
                          if paired else "-",
                          f"{100 * b['pool']['success']:.1f} -> {100 * a['pool']['success']:.1f} "
                          f"[{100 * a['pool']['ci'][0]:.0f}, {100 * a['pool']['ci'][1]:.0f}]",
                          f"{100 * b['valid']['invalid_action_rate']:.1f} -> "
                          f"{100 * a['valid']['invalid_action_rate']:.1f}",
                          f"{r['failed_rows_positive']}/{r['failed_rows']}", f"{r['rl_minutes']:.0f}")
        payload[est] = flat
        n = len(flat)
        summary[est] = {"seeds": n,
                        "mean_valid_gain": sum(x["valid_after"] - x["valid_before"] for x in flat) / n,
                        "mean_pool_gain": sum(x["pool_after"] - x["pool_before"] for x in flat) / n,
                        "valid_never_worse": all(x["valid_after"] >= x["valid_before"] for x in flat),
                        # a fall the paired interval of the same episodes tells from the evaluation's noise
                        "valid_clearly_worse_seeds": [x["seed"] for x in flat
                                                      if x.get("valid_paired", {}).get("verdict") == "worse"],
                        "rl_steps": [r["rl_steps"] for r in rows],
                        "rl_minutes_mean": sum(r["rl_minutes"] for r in rows) / n}
    Console().print(table)
    for est, s in summary.items():
        print(f"{est}: mean held-out gain {100 * s['mean_valid_gain']:+.1f} points, mean pool gain "
              f"{100 * s['mean_pool_gain']:+.1f} points over {s['seeds']} seeds; held-out never worse: "
              f"{s['valid_never_worse']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    machine = {k: results[0][k] for k in ("cpu", "dtype") if results and results[0].get(k)}
    (RESULTS / f"{name}.json").write_text(json.dumps({**payload, "summary": summary, "config": config, **machine},
                                                     indent=2) + "\n")
    render_pages()  # the docs' and README's tables follow the new JSON
    if runs:
        plot(runs, RESULTS / f"{name}.png")


def plot(runs: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for i, (key, label) in enumerate((("valid", "held-out success (%)"), ("pool", "pool success (%)"))):
        for j, (est, rows) in enumerate(runs.items()):
            for k, r in enumerate(rows):
                axes[i].plot([0, 1], [100 * r["before"][key]["success"], 100 * r["after"][key]["success"]],
                             marker="o", color=f"C{j}", alpha=0.8, label=est if k == 0 else None)
        axes[i].set_xticks([0, 1], ["before", "after"])
        axes[i].set_title(label)
        axes[i].legend()
    for j, rows in enumerate(runs.values()):
        for r in rows:
            pts = [(m["step"], m["success_rate"]) for m in r["per_step"]]
            axes[2].plot([p[0] for p in pts], [100 * p[1] for p in pts], color=f"C{j}", alpha=0.6, lw=1)
    axes[2].set_title("training-batch success per step (%)")
    axes[2].set_xlabel("RL step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
