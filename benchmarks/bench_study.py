"""When does AgentOPSD help? The study: environments × arms × seeds, resumable, tables from whatever finished.

    python benchmarks/bench_study.py --plan                     # list every run and whether it finished
    python benchmarks/bench_study.py --only alfworld --parallel 2
    python benchmarks/bench_study.py --report-only              # rebuild study.json and the figures
    python benchmarks/bench_study.py --only webshop --arms grpo agentopsd-hint --seeds 0 1 2 --steps 10 \
        --eval-episodes 96                                      # arms `grpo-eval96`, `agentopsd-hint-eval96`

Every run is `python -m agentgym_opsd.train` from its environment's cached warm start (one "before" run per
environment: warm start + before-evaluations, shared by all its arms and seeds; `warm_start.seed=0`), with
`trainer.seed=SEED`. Runs write `benchmarks/results/study/<env>/<arm>/seed<S>.json`; re-running skips them
(`benchmarks/experiments.py`). ALFWorld runs the main job's recipe and names, so the runs of
`bench_main_job.py` are this study's `grpo` and `agentopsd` ALFWorld arms.

Arms — ALFWorld (`cpu-small` recipe, held-out `easy_valid` 48 episodes at T=0.4, the 16-game pool × 4):
`grpo`, `agentopsd` (teacher context `skills`, the paper), `agentopsd-hint` (teacher sees the task's
privileged `goal` hint), `agentopsd-choice` (the skills teacher judging the chosen action among the admissible
ones, `teacher.evidence=choice`), `gigpo`, λ ∈ {0.25, 1.0} beside the default 0.5, and the learning rate 5e-5 beside the
recipe's 2e-5 for GRPO and AgentOPSD; WebShop and Search-QA
(`cpu-small-webshop`, `cpu-small-searchqa`): `grpo` and `agentopsd-hint` (WebShop also `agentopsd-choice`).
`agentopsd-oracle` (issue 69) feeds the belief the oracle's distance instead of a teacher's
evidence: the bound a perfect teacher would reach. `--tag T` runs arms as `<arm>@T` from their own before run, so
a batch on another CPU or precision pairs only with itself (`--only alfworld --arms grpo agentopsd-oracle --tag
epyc-f26`). `--eval-episodes N` (default 48) evaluates on N held-out episodes instead: its runs are the arms `<arm>-evalN`
from their own before run (`<config>-evalN`), so they never mix with, or overwrite, the 48-episode results; the
first 48 of the N episodes are today's 48 (same tasks, same reset seeds).
Report per arm: pool and held-out success after (mean over seeds; 95% interval from the pooled episodes and a
t-interval over seeds), the paired difference to its GRPO baseline (`baseline_arm`: same seed, same before run)
per seed and its 95% interval with what a ±3-point answer would need (`agentgym_opsd.evaluation.paired`),
invalid actions, RL minutes, and the share of lost-rollout rows with a positive advantage (must be 0). Writes
`benchmarks/results/study.json`, `study_forest.png` (`study_forest.py`: the paired differences) and
`study_curves.png` (per environment: training-batch success and entropy per step, the band the range over
seeds; λ sensitivity; horizon: held-out gain per task type against the type's mean expert plan length).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from pathlib import Path

from experiments import (
    BeforeSpec,
    ExperimentRunner,
    RunSpec,
    final_validation,
    load_results,
    read_metrics,
    task_type_success,
)
from render_results import render_pages  # benchmarks/ is on sys.path when a script runs from it
from rich.console import Console
from rich.table import Table
from study_forest import draw_forest

from agentgym_opsd.core import TASK_TYPE
from agentgym_opsd.credit import estimator_spec
from agentgym_opsd.evaluation.credit_quality import run_credit_auc
from agentgym_opsd.evaluation.metrics import wilson_interval
from agentgym_opsd.evaluation.paired import SeedPair, paired_difference, paired_episodes, t_quantile_975
from agentgym_opsd.files import atomic_write_text
from agentgym_opsd.registry import make

RESULTS = Path(__file__).parent / "results"
STUDY = RESULTS / "study"
EVAL_EPISODES = 48
EVAL = (f"trainer.eval_episodes={EVAL_EPISODES}", "trainer.eval_pool_rollouts=4", "warm_start.seed=0")
HINT = ("teacher.context=hint", "teacher.hint_level=goal")
ARMS: dict[str, dict[str, tuple[str, ...]]] = {
    "alfworld": {
        "grpo": ("algorithm.estimator=grpo",),
        "agentopsd": ("algorithm.estimator=agentopsd",),
        "agentopsd-hint": ("algorithm.estimator=agentopsd", *HINT),
        # issue 38: the self-teacher judges the chosen action among the admissible ones (teacher.evidence)
        "agentopsd-choice": ("algorithm.estimator=agentopsd", "teacher.evidence=choice"),
        "gigpo": ("algorithm.estimator=gigpo",),
        "agentopsd-lam0.25": ("algorithm.estimator=agentopsd", "algorithm.lam=0.25"),
        "agentopsd-lam1.0": ("algorithm.estimator=agentopsd", "algorithm.lam=1.0"),
        # the learning-rate sweep of the recipe (cpu-learn / cpu-small: 2e-5)
        "grpo-lr5e-5": ("algorithm.estimator=grpo", "optim.lr=5e-5"),
        "agentopsd-lr5e-5": ("algorithm.estimator=agentopsd", "optim.lr=5e-5"),
        # issue 69: the belief driven by the oracle's distance instead of a teacher (the bound a teacher could reach)
        "agentopsd-oracle": ("algorithm.estimator=agentopsd-oracle",),
    },
    "webshop": {"grpo": ("algorithm.estimator=grpo",), "agentopsd-hint": ("algorithm.estimator=agentopsd", *HINT),
                "agentopsd-choice": ("algorithm.estimator=agentopsd", "teacher.evidence=choice")},
    "searchqa": {"grpo": ("algorithm.estimator=grpo",), "agentopsd-hint": ("algorithm.estimator=agentopsd", *HINT)},
}
CONFIGS = {"alfworld": "cpu-small", "webshop": "cpu-small-webshop", "searchqa": "cpu-small-searchqa"}
SEEDS = {"alfworld": (0, 1, 2), "webshop": (0,), "searchqa": (0,)}
ALFWORLD_HELD_OUT = "ALFWorld-v0:easy_valid"
# The arm an arm's paired difference is taken against where it is not `grpo`: runs from another warm start pair
# with the GRPO run of that warm start (`--eval-episodes` arms keep their `-evalN` tag on both sides).
BASELINES = {"agentopsd-hint-no-action-history": "grpo-no-action-history"}
# An arm's tags, after its name: `-evalN` (`--eval-episodes`) and `@TAG` (`--tag`, e.g. the machine a batch ran on)
ARM_TAGS = re.compile(r"(-eval\d+)?(@[\w.-]+)?$")
TARGET_HALF_WIDTH = 0.03  # "a ±3-point answer": what the study reports it would need


def eval_tag(eval_episodes: int) -> str:
    """The arm and before-run suffix of an evaluation on `eval_episodes` held-out episodes ("" for the default)."""
    if eval_episodes < 1:
        raise ValueError(f"--eval-episodes: expected >= 1, got {eval_episodes}")
    return "" if eval_episodes == EVAL_EPISODES else f"-eval{eval_episodes}"


def baseline_arm(arm: str) -> str:
    """The arm whose run of the same seed and the same before run `arm`'s paired difference is taken against."""
    match = ARM_TAGS.search(arm)
    tags = match.group(0) if match else ""
    return BASELINES.get(arm.removesuffix(tags) if tags else arm, "grpo") + tags


def study_specs(envs: list[str], seeds: dict[str, tuple[int, ...]], steps: int, eval_episodes: int = EVAL_EPISODES,
                arms: list[str] | None = None, batch: str = "") -> list[RunSpec]:
    """The runs of `envs` × `ARMS` (only `arms` when given, by their names without tags) × seeds; `batch` tags
    the arms and their before run `@batch`, so they pair only with each other (e.g. a rerun on another CPU)."""
    out = []
    steps_kv = (f"trainer.total_steps={steps}", f"trainer.eval_every={steps}") if steps else ()
    if batch and not re.fullmatch(r"[\w.-]+", batch):
        raise ValueError(f"--tag: letters, digits, '.', '_' and '-' only, got {batch!r}")
    tag = eval_tag(eval_episodes) + (f"@{batch}" if batch else "")
    evaluation = (f"trainer.eval_episodes={eval_episodes}", *EVAL[1:])
    for env in envs:
        before = BeforeSpec(CONFIGS[env] + tag, CONFIGS[env], evaluation)
        for seed in seeds[env]:
            for arm, overrides in ARMS[env].items():
                if arms and arm not in arms:
                    continue
                labels = {"env": env, "arm": arm + tag, "seed": seed,
                          **({"eval_episodes": eval_episodes} if eval_episodes != EVAL_EPISODES else {}),
                          **({"batch": batch} if batch else {})}
                out.append(RunSpec(f"{env}/{arm}{tag}/seed{seed}", before,
                                   (*overrides, f"trainer.seed={seed}", *steps_kv), labels))
    return out


def _pooled(rows: list[dict], when: str, key: str) -> dict:
    """Mean over seeds; Wilson interval of the pooled episodes; t-interval (95%) of the seed means."""
    values = [r[when][key]["success"] for r in rows]
    wins = sum(round(r[when][key]["success"] * r[when][key]["episodes"]) for r in rows)
    episodes = sum(r[when][key]["episodes"] for r in rows)
    mean = sum(values) / len(values)
    half = (_t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))) if len(values) > 1 else math.nan
    return {"mean": mean, "per_seed": values, "episodes_ci": list(wilson_interval(wins, episodes)),
            "seeds_ci": [mean - half, mean + half]}


def _t95(dof: int) -> float:
    return t_quantile_975(dof)


def summarize(results: list[dict]) -> dict:
    by_arm: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        by_arm.setdefault((r["labels"]["env"], r["labels"]["arm"]), []).append(r)
    table: dict[str, dict] = {}
    for (env, arm), rows in sorted(by_arm.items()):
        rows.sort(key=lambda r: r["labels"]["seed"])
        # paired only with the GRPO run of the same seed *and the same before run* (warm start)
        base = baseline_arm(arm)
        grpo = {(r["labels"]["seed"], r["before_run"]): r for r in by_arm.get((env, base), [])}
        pairs = [(r, g) for r in rows if (g := grpo.get((r["labels"]["seed"], r["before_run"])))]
        paired = {key: [r["after"][key]["success"] - g["after"][key]["success"] for r, g in pairs]
                  for key in ("valid", "pool")}
        table[f"{env}/{arm}"] = {
            "env": env, "arm": arm, "seeds": [r["labels"]["seed"] for r in rows],
            "pool_before": rows[0]["before"]["pool"]["success"], "valid_before": rows[0]["before"]["valid"]["success"],
            "pool_after": _pooled(rows, "after", "pool"), "valid_after": _pooled(rows, "after", "valid"),
            "paired_diff_to_grpo": paired,
            "baseline": f"{env}/{base}" if pairs and base != arm else None,
            "paired": _paired_intervals(pairs, by_arm[(env, base)]) if pairs and base != arm else None,
            "valid_score": {when: _mean_score(rows, when) for when in ("before", "after")},
            "invalid_after": sum(r["after"]["valid"]["invalid_action_rate"] for r in rows) / len(rows),
            "rl_minutes": sum(r["rl_minutes"] for r in rows) / len(rows),
            "lost_rows_positive": sum(r["failed_rows_positive"] for r in rows),
            "lost_rows": sum(r["failed_rows"] for r in rows),
            "credit_auc": _mean_auc(rows),
            "evidence_auc": _mean_auc(rows, "evidence"),
            "teacher": _reads_teacher(rows),
            "valid_by_task_type": {"before": _by_task_type(rows, "before"), "after": _by_task_type(rows, "after")},
            # where the runs computed (recorded since the precision work; older runs are float32)
            "dtype": sorted({r["dtype"] for r in rows if r.get("dtype")}),
            "cpu": sorted({r["cpu"] for r in rows if r.get("cpu")}),
        }
    return table


def _paired_intervals(pairs: list[tuple[dict, dict]], baseline_rows: list[dict]) -> dict[str, dict]:
    """Held-out and pool: the paired difference to the baseline with its 95% interval and what a ±3-point
    answer would need; the baseline's seeds on the same before run give the spread when one seed is paired."""
    before_run = pairs[0][0]["before_run"]
    out = {}
    for key in ("valid", "pool"):
        seed_pairs = [SeedPair(r["labels"]["seed"], _wins(r["after"][key]), r["after"][key]["episodes"],
                               _wins(g["after"][key]), g["after"][key]["episodes"],
                               _shared_counts(r, g) if key == "valid" else None) for r, g in pairs]
        base_rates = [g["after"][key]["success"] for g in baseline_rows if g["before_run"] == before_run]
        out[key] = paired_difference(seed_pairs, target=TARGET_HALF_WIDTH, baseline_rates=base_rates).to_json()
    return out


def _shared_counts(arm: dict, base: dict) -> tuple[int, int, int, int] | None:
    """The held-out episodes both runs played (`valid_episodes`, matched by env spec and reset seed): won by both,
    by the arm only, by the baseline only, by neither; None when either run did not keep them."""
    if not arm.get("valid_episodes") or not base.get("valid_episodes"):
        return None
    first = [{"env_spec": e, "seed": s, "won": w} for e, s, w in base["valid_episodes"]]
    second = [{"env_spec": e, "seed": s, "won": w} for e, s, w in arm["valid_episodes"]]
    shared = paired_episodes(first, second)
    return None if shared is None else (shared.won_both, shared.second_only, shared.first_only, shared.neither)


def _reads_teacher(rows: list[dict]) -> bool:
    """Whether the arm's estimator (its runs' `algorithm.estimator` override) reads the self-teacher's evidence."""
    names = {o.partition("=")[2] for r in rows for o in r["overrides"] if o.startswith("algorithm.estimator=")}
    return any(estimator_spec(name).needs_teacher for name in names)


def _wins(rate: dict) -> int:
    """Episodes won in a result's `{"success", "episodes"}` record."""
    return round(rate["success"] * rate["episodes"])


def _mean_score(rows: list[dict], when: str) -> float | None:
    """Mean held-out score (partial credit, e.g. WebShop's R) over the seeds that recorded it."""
    values = [r[when]["valid"]["score"] for r in rows if r[when]["valid"].get("score") is not None]
    return sum(values) / len(values) if values else None


def _mean_auc(rows: list[dict], part: str | None = None) -> dict[str, float | None]:
    """The credit-quality AUC of the arm's own rollouts (valid turns), mean over the seeds that have one;
    `part="evidence"`: the AUC of the self-teacher's raw e_k on the same turns."""
    out: dict[str, float | None] = {}
    for outcome in ("success", "failure"):
        records = [r.get("credit_auc") or {} for r in rows]
        if part is not None:
            records = [record.get(part) or {} for record in records]
        values = [record[outcome]["auc"] for record in records
                  if outcome in record and record[outcome]["auc"] is not None]
        out[outcome] = sum(values) / len(values) if values else None
    return out


def backfill(runs_dir: Path) -> None:
    """Result files written before a field existed get it from their run's records, when still there: the
    credit-quality AUC, held-out success per task type and the held-out score, before and after. Only from the
    run the result was made from: a run folder whose last validation differs from the result's (the folder
    was reused by a later run of that name) gives nothing."""
    for path in STUDY.rglob("*.json"):
        result = json.loads(path.read_text(encoding="utf-8"))
        run_dir = runs_dir / result["name"]
        last = final_validation(read_metrics(run_dir))
        if last is None or last.get("val/success_rate") != result["after"]["valid"]["success"] \
                or last.get("pool/success_rate") != result["after"]["pool"]["success"]:
            continue
        changed = False
        if ("credit_auc" not in result or (result["credit_auc"] and "evidence" not in result["credit_auc"])) \
                and (run_dir / "credit").is_dir():
            result["credit_auc"] = run_credit_auc(run_dir)
            changed = True
        for when in ("before", "after"):
            valid = result[when]["valid"]
            if when == "before":
                lines = read_metrics(runs_dir / "before" / result["before_run"])
                line = lines[0] if lines else None
            else:
                line = last
            if line is None:
                continue
            by_type = task_type_success(line, "val")
            if by_type and "by_task_type" not in valid:
                valid["by_task_type"] = by_type
                changed = True
            if "score" not in valid and line.get("val/score") is not None:
                valid["score"] = line["val/score"]
                changed = True
        if changed:
            atomic_write_text(path, json.dumps(result, indent=2) + "\n")


def task_horizons(env_id: str) -> dict[str, float]:
    """Mean length of the expert's shortest plan per task type over the games of `env_id`: the horizon axis of
    the horizon-sensitivity figure (held-out ALFWorld: 8 games per type, 3.6 to 8 steps)."""
    env = make(env_id)
    lengths: dict[str, list[int]] = {}
    try:
        for index in range(env.get_wrapper_attr("num_tasks")):
            _, info = env.reset(options={"task_index": index})
            lengths.setdefault(info[TASK_TYPE], []).append(info["optimal_plan_length"])
    finally:
        env.close()
    return {task_type: sum(v) / len(v) for task_type, v in sorted(lengths.items())}


def _by_task_type(rows: list[dict], when: str) -> dict[str, float]:
    """Held-out success per task type, mean over the seeds that recorded it."""
    per_seed = [r[when]["valid"]["by_task_type"] for r in rows if r[when]["valid"].get("by_task_type")]
    types = sorted({t for d in per_seed for t in d})
    return {t: sum(d[t] for d in per_seed if t in d) / sum(t in d for d in per_seed) for t in types}


def report(table: dict, results: list[dict]) -> None:
    t = Table(title="The study: success after RL (mean over seeds; \\[pooled-episode 95% CI])")
    for col in ("env / arm", "seeds", "pool before -> after", "held-out before -> after", "paired vs GRPO (held-out)",
                "held-out score", "invalid after", "credit AUC won / lost", "teacher e_k AUC won / lost", "RL min"):
        t.add_column(col, justify="right")
    for name, a in table.items():
        p, v = a["pool_after"], a["valid_after"]
        t.add_row(name, str(len(a["seeds"])),
                  f"{100 * a['pool_before']:.1f} -> {100 * p['mean']:.1f} [{100 * p['episodes_ci'][0]:.0f}, "
                  f"{100 * p['episodes_ci'][1]:.0f}]",
                  f"{100 * a['valid_before']:.1f} -> {100 * v['mean']:.1f} [{100 * v['episodes_ci'][0]:.0f}, "
                  f"{100 * v['episodes_ci'][1]:.0f}]",
                  _paired_text(a) if a["paired"] else "-",
                  " -> ".join(_f2(a.get("valid_score", {}).get(w)) for w in ("before", "after")),
                  f"{100 * a['invalid_after']:.1f}%", " / ".join(_f2(a["credit_auc"][k]) for k in ("success", "failure")),
                  " / ".join(_f2(a["evidence_auc"][k]) for k in ("success", "failure")),
                  f"{a['rl_minutes']:.0f}")
    Console(width=200).print(t)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "study.json").write_text(json.dumps(table, indent=2) + "\n")
    render_pages()  # the docs' and README's tables follow the new JSON
    draw_forest(table)
    if results:
        plot(table, results)


def _paired_text(arm: dict) -> str:
    """Per-seed held-out differences, then their mean and 95% interval, in points."""
    held_out = arm["paired"]["valid"]
    per_seed = " ".join(f"{100 * d:+.0f}" for d in held_out["per_seed"])
    return f"{per_seed} = {100 * held_out['mean']:+.1f} [{100 * held_out['low']:+.0f}, {100 * held_out['high']:+.0f}]"


def _f2(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def plot(table: dict, results: list[dict]) -> None:
    """`study_curves.png`: per environment, training-batch success and entropy per step (mean over seeds, the
    band their range); below, ALFWorld's λ sensitivity and horizon panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = [env for env in ENV_TITLES if any(r["labels"]["env"] == env for r in results)]
    arms = sorted({r["labels"]["arm"] for r in results} - set(SWEEP_ARMS))
    colors = {arm: f"C{i % 10}" for i, arm in enumerate(arms)}  # an arm keeps its colour in every panel
    fig, axes = plt.subplots(3, max(len(envs), 2), figsize=(5.2 * max(len(envs), 2), 11), squeeze=False)
    for col, env in enumerate(envs):
        runs_by_arm: dict[str, list[dict]] = {}
        for r in results:
            if r["labels"]["env"] == env and r["labels"]["arm"] not in SWEEP_ARMS:
                runs_by_arm.setdefault(r["labels"]["arm"], []).append(r)
        for arm, runs in sorted(runs_by_arm.items()):
            label = f"{arm} ({seeds_text(sorted(r['labels']['seed'] for r in runs))})"
            for ax, key in ((axes[0][col], "success_rate"), (axes[1][col], "entropy")):
                _plot_band(ax, runs, key, color=colors[arm], label=label)
        axes[0][col].set_title(f"{ENV_TITLES[env]}: training-batch success per step", fontsize=9)
        axes[1][col].set_title(f"{ENV_TITLES[env]}: entropy (nats/token)", fontsize=9)
        axes[1][col].set_xlabel("RL step")
        axes[0][col].legend(fontsize=6)
    for ax in [*axes[0][len(envs):], *axes[1][len(envs):], *axes[2][2:]]:
        ax.set_axis_off()
    _plot_lambda(axes[2][0], results)
    _plot_horizon(axes[2][1], table)
    fig.suptitle("The study's runs: line = mean over seeds, band = range over seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(RESULTS / "study_curves.png", dpi=110)
    plt.close(fig)


def _plot_band(ax, runs: list[dict], key: str, *, color: str, label: str) -> None:
    """The mean over `runs` of `per_step[key]` per step, with the range over the runs shaded (one run: no band)."""
    steps = min(len(r["per_step"]) for r in runs)
    xs = range(1, steps + 1)
    per_step = [[r["per_step"][k].get(key) for r in runs] for k in range(steps)]
    per_step = [[v for v in values if v is not None] or [math.nan] for values in per_step]
    ax.plot(xs, [statistics.fmean(v) for v in per_step], color=color, label=label, lw=1.2)
    if len(runs) > 1:
        ax.fill_between(xs, [min(v) for v in per_step], [max(v) for v in per_step], color=color, alpha=0.15, lw=0)


def seeds_text(seeds: list[int]) -> str:
    """"seed 0", "seeds 0 and 1", "seeds 0, 1 and 2"."""
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    return f"seeds {', '.join(map(str, seeds[:-1]))} and {seeds[-1]}"


ENV_TITLES = {"alfworld": "ALFWorld", "searchqa": "Search-QA", "webshop": "WebShop"}
SWEEP_ARMS = ("agentopsd-lam0.25", "agentopsd-lam1.0", "grpo-lr5e-5", "agentopsd-lr5e-5")
"""Hyper-parameter arms: in the λ panel and the tables, not among the curves (nine arms in one panel hide each other)."""
LAMBDA_ARMS = ((0.25, "agentopsd-lam0.25"), (0.5, "agentopsd"), (1.0, "agentopsd-lam1.0"))


def _plot_lambda(ax, results: list[dict]) -> None:
    """ALFWorld success after training against λ, on the seeds that every λ arm ran: a one-seed λ arm next to
    the three-seed mean of λ 0.5 would put seed noise into the curve. GRPO on the same seeds is the dashed line."""
    by_arm: dict[str, dict[int, dict]] = {}
    for r in results:
        if r["labels"]["env"] == "alfworld":
            by_arm.setdefault(r["labels"]["arm"], {})[r["labels"]["seed"]] = r
    present = [(lam, arm) for lam, arm in LAMBDA_ARMS if arm in by_arm]
    seeds = sorted(set.intersection(*(set(by_arm[arm]) for _, arm in present))) if len(present) > 1 else []
    if not seeds:
        return
    grpo = by_arm.get("grpo", {})
    for i, (key, label) in enumerate((("pool", "pool"), ("valid", "held-out"))):
        ys = [100 * statistics.fmean(by_arm[arm][s]["after"][key]["success"] for s in seeds) for _, arm in present]
        ax.plot([lam for lam, _ in present], ys, marker="o", color=f"C{i}", label=label)
        if all(s in grpo for s in seeds):
            ax.axhline(100 * statistics.fmean(grpo[s]["after"][key]["success"] for s in seeds), ls="--",
                       color=f"C{i}", lw=0.8, label=f"GRPO {label}")
    ax.set_title(f"λ sensitivity: ALFWorld success after (%), {seeds_text(seeds)}", fontsize=9)
    ax.set_xlabel("λ")
    ax.legend(fontsize=7)


HORIZON_ARMS = ("grpo", "agentopsd", "agentopsd-hint", "gigpo")


def _plot_horizon(ax, table: dict) -> None:
    """Held-out gain per ALFWorld task type against the type's mean expert plan length (mean over seeds)."""
    arms = [a for a in HORIZON_ARMS if table.get(f"alfworld/{a}", {}).get("valid_by_task_type", {}).get("after")]
    if not arms:
        return
    horizons = task_horizons(ALFWORLD_HELD_OUT)
    for i, arm in enumerate(arms):
        by_type = table[f"alfworld/{arm}"]["valid_by_task_type"]
        types = sorted((t for t in by_type["after"] if t in by_type["before"] and t in horizons), key=lambda t: horizons[t])
        ax.plot([horizons[t] for t in types], [100 * (by_type["after"][t] - by_type["before"][t]) for t in types],
                marker="o", color=f"C{i}", label=arm)
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_title("horizon: held-out gain per task type (points)", fontsize=9)
    ax.set_xlabel("expert plan length of the task type (steps)")
    ax.legend(fontsize=7)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(ARMS), default=sorted(ARMS))
    ap.add_argument("--arms", nargs="+", default=None, help="only these arms (names without the -evalN tag)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="override the seeds of every environment")
    ap.add_argument("--steps", type=int, default=0, help="RL steps per run (0 = the preset's total_steps)")
    ap.add_argument("--out", default="runs/study")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--cores", type=int, default=None,
                    help="torch threads shared by this runner's processes (default: all; 1 beside another run)")
    ap.add_argument("--eval-episodes", type=int, default=EVAL_EPISODES,
                    help=f"held-out episodes per evaluation; other than {EVAL_EPISODES}, the runs are the arms "
                         "<arm>-evalN from their own before run, beside the 48-episode ones")
    ap.add_argument("--tag", default="", help="run the arms as <arm>@TAG from their own before run, paired only "
                                              "with each other (a batch on another machine or precision)")
    ap.add_argument("--plan", action="store_true", help="list the runs and whether each finished")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    seeds = {env: tuple(args.seeds) if args.seeds else s for env, s in SEEDS.items()}
    specs = study_specs(args.only, seeds, args.steps, args.eval_episodes, args.arms, args.tag)
    runner = ExperimentRunner(Path(args.out), STUDY, parallel=args.parallel, cores=args.cores)
    if args.plan:
        pending = {s.name for s in runner.pending(specs)}
        for s in specs:
            print(f"{'todo' if s.name in pending else 'done'}  {s.name}")
        return
    if not args.report_only:
        failed = runner.run(specs)
        if failed:
            print(f"failed: {failed}; re-run to retry them")
    backfill(Path(args.out))
    results = load_results(STUDY)
    report(summarize(results), results)


if __name__ == "__main__":
    main()
