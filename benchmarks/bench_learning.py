"""The CPU learning experiment: one cached warm start, then GRPO and AgentOPSD from the same weights and seeds.

    python benchmarks/bench_learning.py                      # preset cpu-learn, 12 RL steps per estimator
    python benchmarks/bench_learning.py --steps 20 --out runs/learn
    python benchmarks/bench_learning.py --report-only        # rebuild table, JSON and PNG from <out>

Stage 1 (`<out>/warm`, 2 threads) is `python -m agentgym_opsd.train` with `trainer.total_steps=0`: the
supervised warm start (or its cache entry) and the "before" numbers — held-out `easy_valid` success (48
episodes, temperature 0.4) and sampled success on the fixed pool of 16 training games (4 rollouts each,
temperature 1.0). Stage 2 runs one training process per estimator (`<out>/grpo`, `<out>/agentopsd`), in
parallel with one torch thread each so both see the same machine; each reuses the cached warm start (no SFT
step) and validates once at the end on the same episode seeds ("after", paired with "before").

Writes `benchmarks/results/cpu_learn.json` (warm start minutes and held-out success; per estimator pool and
held-out success before/after with Wilson 95% intervals, RL steps and minutes) and
`benchmarks/results/cpu_learn_curves.png` (pool success per step, held-out success, invalid-action rate,
entropy, approx_kl).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

from experiments import final_validation, read_metrics, start_training_run
from rich.console import Console
from rich.table import Table

from agentgym_opsd.evaluation.metrics import wilson_interval
from agentgym_opsd.trainer.config import load_config

ESTIMATORS = ("grpo", "agentopsd")
RESULTS = Path(__file__).parent / "results"


def train(out_dir: Path, config: str, overrides: list[str], threads: int) -> subprocess.Popen:
    return start_training_run(out_dir, config, overrides, threads)


metrics = read_metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-learn")
    ap.add_argument("--steps", type=int, default=12, help="RL steps per estimator")
    ap.add_argument("--out", default="runs/cpu-learn")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per RL process")
    ap.add_argument("--report-only", action="store_true", help="only rebuild the table, JSON and plot from <out>")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = ap.parse_args()
    out = Path(args.out)
    timing_path = out / "timing.json"
    if not args.report_only:
        timing: dict[str, float] = {}
        t0 = time.perf_counter()
        warm = out / "warm"
        if not metrics(warm):
            proc = train(warm, args.config, ["trainer.total_steps=0", "trainer.eval_at_start=true", *args.overrides],
                         threads=2)
            if proc.wait() != 0:
                raise SystemExit(f"warm start failed, see {out / 'warm.log'}")
        timing["warm_stage_minutes"] = (time.perf_counter() - t0) / 60
        t0 = time.perf_counter()
        procs = {est: train(out / est, args.config, [
            f"algorithm.estimator={est}", f"trainer.total_steps={args.steps}", f"trainer.eval_every={args.steps}",
            "trainer.eval_at_start=false", *args.overrides], threads=args.threads) for est in ESTIMATORS}
        for est, proc in procs.items():
            if proc.wait() != 0:
                raise SystemExit(f"{est} run failed, see {out / (est + '.log')}")
        timing["rl_stage_minutes"] = (time.perf_counter() - t0) / 60
        timing_path.write_text(json.dumps(timing, indent=2))
    report(out, args.config)


def _rate(value: float, episodes: float) -> dict[str, float]:
    wins = round(value * episodes)
    low, high = wilson_interval(wins, int(episodes))
    return {"success": value, "episodes": int(episodes), "ci_low": low, "ci_high": high}


def summarize(out: Path) -> dict:
    warm_lines = metrics(out / "warm")
    if not warm_lines:
        raise SystemExit(f"{out / 'warm'} has no metrics: run the experiment first")
    before = warm_lines[0]
    ws = json.loads((out / "warm" / "warm_start" / "summary.json").read_text())
    # validation logs its episode count; older runs did not, and then their config says it
    val_n = before.get("val/episodes") or load_config(str(out / "warm" / "config.yaml")).trainer.eval_episodes
    pool_n = before["pool/episodes"]
    result: dict = {"warm_start": {
        "minutes": ws.get("warm_start/seconds", float("nan")) / 60,
        "easy_valid_success": before["val/success_rate"],
        "easy_valid": _rate(before["val/success_rate"], val_n),
        "pool": _rate(before["pool/success_rate"], pool_n),
        "heldout_action_exact_match": ws.get("warm_start/heldout_action_exact_match"),
        "sft_steps": ws.get("warm_start/sft_steps"), "rows": ws.get("warm_start/rows"),
        "invalid_action_rate": before["val/invalid_action_rate"],
        "invalid_by_kind": {k: before.get(f"val/invalid/{k}") for k in ("no_tag", "not_admissible", "truncated")},
    }}
    for est in ESTIMATORS:
        lines = metrics(out / est)
        steps = [m for m in lines if "seconds_update" in m]
        after = final_validation(lines)
        if not steps or after is None:
            continue
        seconds = sum(m["seconds_rollout"] + m["seconds_teacher"] + m["seconds_update"] for m in steps)
        ws_run = json.loads((out / est / "warm_start" / "summary.json").read_text())
        result[est] = {
            "pool_success_before": before["pool/success_rate"], "pool_success_after": after["pool/success_rate"],
            "valid_success_before": before["val/success_rate"], "valid_success_after": after["val/success_rate"],
            "pool_after": _rate(after["pool/success_rate"], after["pool/episodes"]),
            "valid_after": _rate(after["val/success_rate"], val_n),
            "valid_invalid_rate_before": before["val/invalid_action_rate"],
            "valid_invalid_rate_after": after["val/invalid_action_rate"],
            "rl_steps": len(steps), "rl_minutes": seconds / 60,
            "validation_minutes": (after.get("seconds_validation", after.get("time/validation", 0.0))
                                   + after.get("seconds_pool", after.get("time/pool", 0.0))) / 60,
            "train_success_per_step": [m["success_rate"] for m in steps],
            "warm_start_cache_hit": bool(ws_run.get("warm_start/cache_hit")),
            "warm_start_sft_steps_this_run": ws_run.get("warm_start/sft_steps_this_run"),
        }
    timing_path = out / "timing.json"
    if timing_path.is_file():
        result["wall_clock"] = json.loads(timing_path.read_text())
    return result


def report(out: Path, config: str) -> None:
    result = summarize(out)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cpu_learn.json").write_text(json.dumps(result, indent=2) + "\n")
    ws = result["warm_start"]
    print(f"warm start: {ws['minutes']:.1f} min, held-out action exact match {ws['heldout_action_exact_match']:.2f}, "
          f"easy_valid success {100 * ws['easy_valid_success']:.1f}% "
          f"[{100 * ws['easy_valid']['ci_low']:.1f}, {100 * ws['easy_valid']['ci_high']:.1f}]")
    table = Table(title=f"{config}: RL from one warm start (same weights and seeds)")
    for col in ("estimator", "pool success before -> after", "easy_valid success before -> after [95% CI]",
                "invalid (valid) before -> after", "RL steps", "RL min"):
        table.add_column(col, justify="right")
    for est in ESTIMATORS:
        if est not in result:
            continue
        r = result[est]
        ci = r["valid_after"]
        table.add_row(est, f"{100 * r['pool_success_before']:.1f}% -> {100 * r['pool_success_after']:.1f}%",
                      f"{100 * r['valid_success_before']:.1f}% -> {100 * r['valid_success_after']:.1f}% "
                      f"[{100 * ci['ci_low']:.1f}, {100 * ci['ci_high']:.1f}]",
                      f"{100 * r['valid_invalid_rate_before']:.1f}% -> {100 * r['valid_invalid_rate_after']:.1f}%",
                      str(r["rl_steps"]), f"{r['rl_minutes']:.1f}")
    Console().print(table)
    plot(out, config)


def plot(out: Path, config: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = metrics(out / "warm")[0]
    panels = (("success_rate", "pool success, sampled (%)", 100), ("val/success_rate", "easy_valid success (%)", 100),
              ("invalid_action_rate", "invalid actions (%)", 100), ("entropy", "entropy (nats/token)", 1),
              ("approx_kl", "approx_kl (pi_old vs pi)", 1))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    for est in ESTIMATORS:
        lines = metrics(out / est)
        for ax, (key, label, scale) in zip(axes, panels, strict=True):
            if key == "val/success_rate":
                points = [(0, before[key])] + [(m["step"], m[key]) for m in lines if key in m]
            elif key == "success_rate":
                # thin: each step's own 8 training episodes (2 pool games); markers: the whole pool evaluated
                steps = [(m["step"], m[key]) for m in lines if "seconds_update" in m]
                evals = [(0, before["pool/success_rate"])] + [(m["step"], m["pool/success_rate"]) for m in lines
                                                              if "pool/success_rate" in m]
                line, = ax.plot([p[0] for p in steps], [scale * p[1] for p in steps], lw=0.8, alpha=0.5)
                ax.plot([p[0] for p in evals], [scale * p[1] for p in evals], marker="s", ms=7, ls="--",
                        color=line.get_color(), label=est)
                ax.set_title("pool success: whole pool (squares), step batch (thin)", fontsize=9)
                ax.set_xlabel("RL step (0 = warm start)")
                continue
            else:
                points = [(m["step"], m[key]) for m in lines if key in m and "seconds_update" in m]
            if points:
                ax.plot([p[0] for p in points], [scale * p[1] for p in points], marker="o", ms=3, label=est)
            ax.set_title(label, fontsize=10)
            ax.set_xlabel("RL step (0 = warm start)")
    axes[0].legend()
    fig.suptitle(f"{config}: GRPO vs AgentOPSD on 2 CPU cores")
    fig.tight_layout()
    path = RESULTS / "cpu_learn_curves.png"
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
