"""Render the results tables of the README and the docs from `benchmarks/results/*.json`: one source.

A page asks for a table with a pair of marker comments; everything between them is this script's output:

    <!-- results:study -->
    (generated, do not edit)
    <!-- /results:study -->

    python benchmarks/render_results.py           # rewrite every block in README.md and docs/
    python benchmarks/render_results.py --check   # exit 1 and name each block that disagrees with its JSON

A benchmark that writes one of these JSON files calls `render_pages()` after writing, and CI runs `--check`
(`tests/test_docs.py`), so a number on a page cannot drift from the file it was measured into.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["RENDERERS", "paired_rows", "render_pages", "render_text", "main"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MINUS = "\u2212"
BLOCK = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.DOTALL)


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _signed(x: float, digits: int = 0) -> str:
    """A signed number with a real minus sign; zero has no sign."""
    text = f"{abs(x):.{digits}f}"
    if float(text) == 0:
        return text
    return ("+" if x > 0 else MINUS) + text


def _ci(interval: list[float]) -> str:
    low, high = interval
    return f"[{100 * low:.0f}, {100 * high:.0f}]"


def _auc(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


# The study's arms in reading order: (key in study.json, label). Each arm's paired difference is taken against
# the arm `study.json` names as its `baseline` (`bench_study.baseline_arm`: GRPO of the same seed and before run).
STUDY_ARMS: list[tuple[str, str]] = [
    ("alfworld/grpo", "ALFWorld / GRPO"),
    ("alfworld/agentopsd", "ALFWorld / AgentOPSD (`skills`)"),
    ("alfworld/agentopsd-hint", "ALFWorld / AgentOPSD (`hint`)"),
    ("alfworld/agentopsd-choice", "ALFWorld / AgentOPSD (`skills`, `teacher.evidence=choice`)"),
    ("alfworld/gigpo", "ALFWorld / GiGPO"),
    ("alfworld/agentopsd-lam0.25", "ALFWorld / AgentOPSD λ 0.25"),
    ("alfworld/agentopsd-lam1.0", "ALFWorld / AgentOPSD λ 1.0"),
    ("alfworld/grpo-lr5e-5", "ALFWorld / GRPO, lr 5e-5"),
    ("alfworld/agentopsd-lr5e-5", "ALFWorld / AgentOPSD, lr 5e-5"),
    ("alfworld/grpo@epyc-f26", "ALFWorld / GRPO, rerun beside the oracle (AMD EPYC family 26, bf16-mixed)"),
    ("alfworld/agentopsd-oracle@epyc-f26", "ALFWorld / AgentOPSD on oracle evidence (diagnostic bound; the same CPU)"),
    ("searchqa/grpo", "Search-QA / GRPO"),
    ("searchqa/agentopsd-hint", "Search-QA / AgentOPSD (`hint`)"),
    ("webshop/grpo", "WebShop / GRPO (`outcome=score`), action history, title-aware expert (10 steps)"),
    ("webshop/agentopsd-hint", "WebShop / AgentOPSD (`hint`, `outcome=score`), the same (10 steps)"),
    ("webshop/grpo-eval96", "WebShop / GRPO, the same, 96 held-out episodes"),
    ("webshop/agentopsd-hint-eval96", "WebShop / AgentOPSD (`hint`), the same, 96 held-out episodes"),
    ("webshop/grpo-no-action-history", "WebShop / GRPO (`outcome=score`), no action history, target-only expert"),
    ("webshop/agentopsd-hint-no-action-history", "WebShop / AgentOPSD (`hint`, `outcome=score`), the same"),
    ("webshop/grpo-title-expert", "WebShop / GRPO, title-searching warm start (8 steps)"),
]
ENV_NAMES = {"alfworld": "ALFWorld", "searchqa": "Search-QA", "webshop": "WebShop"}


def study_arms(study: dict) -> list[tuple[str, str]]:
    """`STUDY_ARMS` present in `study`, then any other arm under its key (never dropped silently)."""
    known = dict(STUDY_ARMS)
    return [(key, label) for key, label in STUDY_ARMS if key in study] + [(k, k) for k in study if k not in known]


def paired_rows(study: dict) -> list[tuple[str, dict]]:
    """The rows of the forest plot and the resolution table: (`env / arm` label, arm) for every arm with a paired
    difference to its baseline, in reading order."""
    return [(f"{ENV_NAMES.get(study[key]['env'], study[key]['env'])} / {study[key]['arm']}", study[key])
            for key, _ in study_arms(study) if study[key].get("paired")]


def _paired(arm: dict) -> str:
    """Held-out success of the arm minus its baseline's, per shared RL seed, in points."""
    if not arm.get("paired"):
        return "–"
    return ", ".join(_signed(100 * d) for d in arm["paired"]["valid"]["per_seed"]) or "–"


def render_study() -> str:
    study = _load("study.json")
    lines = ["| env / arm | seeds | held-out before → after | pool before → after | paired held-out Δ vs GRPO "
             "per seed | invalid (held-out, after) | credit AUC won / lost | teacher e_k AUC won / lost | RL min |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, label in study_arms(study):
        arm = study[key]
        valid, pool = arm["valid_after"], arm["pool_after"]
        held_out = f"{_pct(arm['valid_before'])} → **{_pct(valid['mean'])}** {_ci(valid['episodes_ci'])}"
        if arm["env"] == "webshop":
            held_out += f" (score {arm['valid_score']['before']:.2f} → {arm['valid_score']['after']:.2f})"
        auc = f"{_auc(arm['credit_auc']['success'])} / {_auc(arm['credit_auc']['failure'])}"
        teacher = arm.get("evidence_auc") or {}
        auc += f" | {_auc(teacher.get('success'))} / {_auc(teacher.get('failure'))}"
        if arm.get("dtype"):
            label += f" ({', '.join(arm['dtype'])})"
        lines.append(
            f"| {label} | {len(arm['seeds'])} | {held_out} "
            f"| {_pct(arm['pool_before'])} → **{_pct(pool['mean'])}** {_ci(pool['episodes_ci'])} "
            f"| {_paired(arm)} | {100 * arm['invalid_after']:.1f}% | {auc} "
            f"| {arm['rl_minutes']:.0f} |")
    return "\n".join(lines)


def _points(x: float, digits: int = 1) -> str:
    return _signed(100 * x, digits)


def _diff_ci(record: dict) -> str:
    """"+10.4 [−8, +28]": a paired difference and its 95% interval, in points."""
    return f"{_points(record['mean'])} [{_points(record['low'], 0)}, {_points(record['high'], 0)}]"


def _seeds(n: int) -> str:
    return "one seed" if n == 1 else f"{n} seeds"


def _teacher_auc(arm: dict) -> str:
    """The raw e_k AUC won / lost (the self-teacher's, or the oracle's where its distance is the evidence);
    "no teacher" for an estimator that records none."""
    auc = arm.get("evidence_auc") or {}
    if not arm.get("teacher"):
        return "no teacher" if auc.get("success") is None else f"oracle {_auc(auc['success'])} / {_auc(auc.get('failure'))}"
    return "not recorded" if auc.get("success") is None else f"{_auc(auc['success'])} / {_auc(auc.get('failure'))}"


def _needs(record: dict) -> str:
    """Seeds a ±3-point answer needs at the episodes used, with the spread it was computed from."""
    if record["seeds_for_target"] is None:
        return "unknown (no spread measured)"
    return (f"{record['seeds_for_target']} (s = {100 * record['spread']:.1f} points, "
            f"{record['spread_source']})")


def render_study_answer() -> str:
    """The study section's opening paragraph: what the paired differences to GRPO say, from `study.json`."""
    rows = paired_rows(_load("study.json"))
    held = [(label, arm["paired"]["valid"], arm) for label, arm in rows]
    helps = [label for label, r, _ in held if r["verdict"] == "helps"]
    hurts = [label for label, r, _ in held if r["verdict"] == "hurts"]
    undecided = len(held) - len(helps) - len(hurts)
    told = []
    if helps:
        told.append(f"{', '.join(helps)} {'helps' if len(helps) == 1 else 'help'}")
    if hurts:
        told.append(f"{', '.join(hurts)} {'hurts' if len(hurts) == 1 else 'hurt'}")
    verdict = (f"{'; '.join(told)}; the other {undecided} cannot be told apart from GRPO at 95%" if told else
               f"none of the {len(held)} can be told apart from GRPO at 95%")
    best = max(held, key=lambda row: row[1]["mean"])
    worst = min(held, key=lambda row: row[1]["mean"])
    widths = sorted(held, key=lambda row: row[1]["half_width"])
    teacher = [(label, r, arm) for label, r, arm in held if (arm.get("evidence_auc") or {}).get("success") is not None]
    auc_text = "; ".join(f"{label}: {_teacher_auc(arm)}, paired {_diff_ci(r)} ({_seeds(len(r['seeds']))})"
                         for label, r, arm in teacher)
    seeds_needed = [r["seeds_for_target"] for _, r, _ in held if r["seeds_for_target"] is not None]
    episodes_needed = [r["episodes_for_target"] for _, r, _ in held]
    return (
        f"**The answer so far.** Paired with GRPO on the same RL seeds and the same held-out episodes, "
        f"{len(held)} rows (environment × arm): {verdict} (helps / hurts needs a t interval over at least three "
        f"seeds that excludes 0). The largest held-out difference is {best[0]}, {_diff_ci(best[1])} points on "
        f"{_seeds(len(best[1]['seeds']))} of {best[1]['episodes']} episodes; the lowest {worst[0]}, "
        f"{_diff_ci(worst[1])} on {_seeds(len(worst[1]['seeds']))}. "
        + (f"Where the raw e_k AUC (won / lost) is recorded: {auc_text}. " if teacher else "")
        + f"The intervals run from ±{100 * widths[0][1]['half_width']:.1f} points ({widths[0][0]}) to "
        f"±{100 * widths[-1][1]['half_width']:.1f} ({widths[-1][0]}); a ±3-point answer needs "
        f"{min(seeds_needed)}–{max(seeds_needed)} seeds per arm at the episodes used where a spread is measured, "
        f"or, the spread between seeds ignored, {min(episodes_needed):,}–{max(episodes_needed):,} held-out "
        f"episodes per arm (the table below).")


def render_study_resolve() -> str:
    """Per paired row: the held-out and pool differences with 95% intervals, how wide they are, what a ±3-point
    answer needs and the conclusion the row supports."""
    rows = paired_rows(_load("study.json"))
    lines = ["| env / arm | held-out Δ, points [95%] | ± | interval | seeds × episodes | teacher e_k AUC won / lost "
             "| seeds for ±3 | episodes per arm for ±3 | conclusion | pool Δ [95%] |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, arm in rows:
        held, pool = arm["paired"]["valid"], arm["paired"]["pool"]
        lines.append(
            f"| {label} | {_diff_ci(held)} | {100 * held['half_width']:.1f} | {held['method']} "
            f"| {len(held['seeds'])} × {held['episodes']} | {_teacher_auc(arm)} | {_needs(held)} "
            f"| {held['episodes_for_target']:,} | **{held['verdict']}** | {_diff_ci(pool)} ({pool['verdict']}) |")
    return "\n".join(lines)


def render_main_job(name: str = "cpu_small_seeds.json") -> str:
    seeds = _load(name)
    runs = [(label, run) for arm, label in (("agentopsd", "**AgentOPSD** (`cpu-small`)"), ("grpo", "**GRPO**"))
            for run in seeds.get(arm, [])]
    # runs whose before and after kept their held-out episodes get the paired column (`evaluation.paired`)
    paired = bool(runs) and all("valid_paired" in run for _, run in runs)
    header = "| arm | seed | held-out before → after | pool before → after |"
    lines = [header + (" held-out episodes gained / lost (McNemar p) |" if paired else ""),
             "|---|---|---|---|" + ("---|" if paired else "")]
    for label, run in runs:
        pair = run.get("valid_paired") or {}
        lines.append(
            f"| {label} | {run['seed']} "
            f"| {_pct(run['valid_before'])} → **{_pct(run['valid_after'])}** "
            f"({_signed(100 * (run['valid_after'] - run['valid_before']), 1)}) "
            f"| {_pct(run['pool_before'])} → **{_pct(run['pool_after'])}** "
            f"({_signed(100 * (run['pool_after'] - run['pool_before']), 1)}) |"
            + (f" +{pair['second_only']} / −{pair['first_only']} (p {pair['mcnemar_p']:.2f}) |" if paired else ""))
    lines.append("")
    summary = seeds["summary"]
    means = "; ".join(
        f"{label} **{_signed(100 * summary[arm]['mean_valid_gain'], 1)}** held out and "
        f"**{_signed(100 * summary[arm]['mean_pool_gain'], 1)}** on the pool"
        + (" (held-out success fell in no seed)" if summary[arm]["valid_never_worse"] else "")
        for arm, label in (("agentopsd", "AgentOPSD"), ("grpo", "GRPO")) if arm in summary)
    seeds_run = max(s["seeds"] for s in summary.values())
    machine = f" ({seeds['dtype']}, {seeds['cpu']})" if "cpu" in seeds else ""
    lines.append(f"Mean gain over the {seeds_run} RL seeds{machine}, in points: {means}.")
    return "\n".join(lines)


def render_report_runs(name: str) -> str:
    """A `report_runs.py` file: one row per run (warm-start seed and RL seed, held-out and pool before → after,
    the held-out episodes gained and lost, held-out invalid actions; where the runs have it, the range over their
    steps of `experiments.push_balance`), then the runs pooled."""
    data = _load(name)
    push = any(run.get("push_down_over_up") for run in data["runs"].values())
    lines = ["| run | warm start (exact match) | RL seed | held-out before → after | gained / lost (McNemar p) "
             "| held-out invalid actions | pool before → after |" + (" push down / up per step |" if push else ""),
             "|---|---|---:|---|---|---|---|" + ("---|" if push else "")]
    for label, run in data["runs"].items():
        ratios = run.get("push_down_over_up") or []
        push_cell = (f" {min(ratios):.2f}–{max(ratios):.2f} |" if ratios else " – |") if push else ""
        before, after, pair = run["before"], run["after"], run["valid_paired"] or {}
        exact = run.get("warm_start_exact_match")
        p_value = f" ({pair['mcnemar_p']:.2f})" if pair else ""
        lines.append(
            f"| {label} | {run.get('warm_start_seed', '–')}"
            f"{'' if exact is None else f' ({100 * exact:.1f}%)'} | {run['trainer_seed']} "
            f"| {_pct(before['valid']['success'])} → **{_pct(after['valid']['success'])}** "
            f"| +{pair.get('second_only', '–')} / −{pair.get('first_only', '–')}"
            f"{p_value} "
            f"| {_pct(before['valid']['invalid_action_rate'])} → {_pct(after['valid']['invalid_action_rate'])} "
            f"| {_pct(before['pool']['success'])} → **{_pct(after['pool']['success'])}** |{push_cell}")
    pooled = data["pooled"]
    lines += ["", f"Pooled over the {pooled['paired_runs']} runs: held-out episodes +{pooled['second_only']} / "
              f"−{pooled['first_only']} (McNemar p {pooled['mcnemar_p']:.2f}), mean change "
              f"{_signed(100 * pooled['valid_change_mean'], 1)} points held out and "
              f"{_signed(100 * pooled['pool_change_mean'], 1)} on the pool; held-out success fell in "
              f"{pooled['valid_fell']} of {pooled['runs']} runs."]
    return "\n".join(lines)


def render_replays(name: str) -> str:
    """A `report_runs.py --replay` file: per pair, held-out success of the two weights on the same episodes (each
    game several draws), the change episode by episode and game by game, and what two draws of the first
    weights alone turn around (the sampler's share of a 48-episode comparison)."""
    data = _load(name)
    lines = ["| weights compared | episodes (games × draws) | held-out before → after | gained / lost (McNemar p) "
             "| games better / worse | two draws of the before weights: gained / lost |",
             "|---|---|---|---|---|---|"]
    for label, r in data["replays"].items():
        pair = r["valid_paired"]
        flips = ", ".join(f"+{f['gained']} / −{f['lost']}" for f in r["before_draw_flips"])
        lines.append(f"| {label} | {pair['episodes']} ({r['games']} × {r['draws']}) "
                     f"| {_pct(r['before_success'])} → **{_pct(r['after_success'])}** "
                     f"| +{pair['second_only']} / −{pair['first_only']} ({pair['mcnemar_p']:.2f}) "
                     f"| {r['games_better']} / {r['games_worse']} | {flips} |")
    pooled = data.get("pooled")
    if pooled:
        pairs = f"{pooled['pairs']} pair{'s' if pooled['pairs'] != 1 else ''}"
        lines += ["", f"Pooled over the {pairs}: held-out episodes +{pooled['gained']} / "
                  f"−{pooled['lost']} (McNemar p {pooled['mcnemar_p']:.3f}), mean change "
                  f"{_signed(100 * pooled['change_mean'], 1)} points; success fell in {pooled['fell']} of "
                  f"{pooled['pairs']}. Two draws of the same weights turned around {pooled['draw_flips_mean']:.1f} "
                  f"of 48 episodes on average."]
    cpus = "; ".join(sorted({r["cpu"] for r in data["replays"].values()})) + "."
    lines += ["", f"_{' '.join(filter(None, [cpus, data.get('note', '')]))}_"]
    return "\n".join(lines)


def peaks_at(by_threads: dict[str, float], peak: dict[str, dict[str, float]]) -> str:
    """A dtype's matmul peaks in GFLOP/s at the thread counts float32 was measured at (`1 / 2` on two cores), the
    columns the line names; a count this dtype lacks shows as `–`."""
    return " / ".join(f"{by_threads[t]:.0f}" if t in by_threads else "–" for t in peak["float32"])


def render_precision() -> str:
    """One table per CPU model in `precision.json` (each machine's record of `bench_precision.py`): a column per
    dtype it measured (float32 alone where the probe ruled bf16 out, with the reason)."""
    lines: list[str] = []
    for cpu, data in _load("precision.json")["machines"].items():
        probe = data.get("probe")
        picks = (f"`model.dtype=auto` picks **{probe['auto_picks']}** (probe: bf16 {probe['bfloat16_gflops']:.0f} vs "
                 f"float32 {probe['float32_gflops']:.0f} GFLOP/s, {probe['speedup']:.2f}×)" if probe else
                 "recorded before the probe: `model.dtype=auto` picks **float32** here")
        bf16 = "bf16_skipped" not in data
        note = (" The bf16 column trains its top layers in float32 (`model.precision=bf16-mixed`)."
                if data.get("bf16_float32_trainable") else "") if bf16 else f" bfloat16 {data['bf16_skipped']}."
        lines += [f"**{cpu}**: {picks}.{note}", "",
                  "| phase | float32 s | bfloat16 s | bf16 speed vs fp32 |" if bf16 else "| phase | float32 s |",
                  "|---|---:|---:|---:|" if bf16 else "|---|---:|"]
        for phase, row in dict(data["phases"], **{"RL step": data["rl_step"]}).items():
            lines.append(f"| {phase} | {row['fp32_s']:.1f} | {row['bf16_s']:.1f} | {row['speedup']:.2f}× |" if bf16
                         else f"| {phase} | {row['fp32_s']:.1f} |")
        peak, gap, start = data["matmul_peak_gflops"], data["sampler_vs_pass"], data["update_start"]
        tis = data.get("tis", {}).get("bf16")
        lines += [
            "",
            f"Matmul peak at {' / '.join(peak['float32'])} threads: float32 {peaks_at(peak['float32'], peak)} GFLOP/s"
            + (f", bfloat16 {peaks_at(peak['bfloat16'], peak)}" if bf16 else "")
            + ". Sampler vs log-prob pass gap (nats per token, mean / max): "
            f"float32 {gap['fp32']['mean']:.1e} / {gap['fp32']['max']:.1e}"
            + (f", bfloat16 {gap['bf16']['mean']:.3f} / {gap['bf16']['max']:.2f}" if bf16 else "")
            + f". PPO start ratio's deviation from 1: float32 {start['fp32']['ppo/start_ratio_max_dev']:.0e}"
            + (f", bfloat16 {start['bf16']['ppo/start_ratio_max_dev']:.2f}" if bf16 else "")
            + f" (bound {start['bound']})."
            + (f" TIS in bf16: mismatch k3 {tis['tis/mismatch_k3']:.4f}, weight mean {tis['tis/weight_mean']:.3f} / "
               f"max {tis['tis/weight_max']:.2f}, {100 * tis['tis/clipped_fraction']:.2f}% of tokens at the cap."
               if tis else "")
            + f" {data['threads']} threads, {data['repeats']} repeat{'s' if data['repeats'] != 1 else ''}.",
            "",
        ]
    return "\n".join(lines).rstrip()


def render_credit_quality() -> str:
    data = _load("credit_quality.json")
    runs = data["runs"]
    header = " | ".join(f"{run['policy']}, {kind}" for run in runs for kind in ("won", "lost"))
    lines = [f"| estimator | {header} |", "|---|" + "---|" * (2 * len(runs))]
    for name in runs[0]["summary"]["estimators"]:
        cells = []
        for run in runs:
            est = run["summary"]["estimators"][name]
            won = f"{est['success']['auc']:.3f}"
            if run["policy"] == runs[0]["policy"] and name != "grpo":
                won += f" (valid turns only {est['success']['auc_valid_only']:.3f})"
            cells += [won, f"{est['failure']['auc']:.3f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    counts = "; ".join(
        f"{run['policy']} won {run['summary']['estimators']['grpo']['success']['progress']} / "
        f"{run['summary']['estimators']['grpo']['success']['wasted']}, lost "
        f"{run['summary']['estimators']['grpo']['failure']['progress']} / "
        f"{run['summary']['estimators']['grpo']['failure']['wasted']} ({run['episodes']} episodes, "
        f"{_pct(run['success_rate'])}% won)" for run in runs)
    lines += ["", f"Turns behind the AUCs (progress / wasted): {counts}."]
    return "\n".join(lines)


EVIDENCE_ENVS = (("alfworld", "ALFWorld"), ("webshop", "WebShop"), ("searchqa", "Search-QA"))


def render_headline() -> str:
    study = _load("study.json")

    def move(key: str, split: str) -> str:
        arm = study[key]
        return f"{_pct(arm[f'{split}_before'])} → {_pct(arm[f'{split}_after']['mean'])}%"

    alf, alf_grpo = study["alfworld/agentopsd"], study["alfworld/grpo"]

    def seeds(key: str) -> str:
        n = len(study[key]["seeds"])
        return "one seed" if n == 1 else f"{n} seeds"
    return (
        f"On ALFWorld (`cpu-small`: SmolLM2-135M, {len(alf['seeds'])} RL seeds of 6 steps from one cached warm "
        f"start) AgentOPSD took held-out success {move('alfworld/agentopsd', 'valid')} and pool success "
        f"{move('alfworld/agentopsd', 'pool')}; GRPO {move('alfworld/grpo', 'valid')} and "
        f"{move('alfworld/grpo', 'pool')} (95% intervals "
        f"{_ci(alf['valid_after']['episodes_ci'])} and {_ci(alf_grpo['valid_after']['episodes_ci'])} held out). "
        f"GRPO on Search-QA ({seeds('searchqa/grpo')}, 12 steps): pool "
        f"{move('searchqa/grpo', 'pool')}; on WebShop ({seeds('webshop/grpo')}, 10 steps): pool "
        f"{move('webshop/grpo', 'pool')}. "
        f"No row of a lost rollout got a positive advantage in any run "
        f"({sum(arm['lost_rows_positive'] for arm in study.values()):,} of "
        f"{sum(arm['lost_rows'] for arm in study.values()):,} rows).")


def render_main_job_time() -> str:
    """One table per CPU model in `main_job_time.json` (`bench_main_job_time.py`: README's main job, cold and warm,
    per interpreter), minutes per phase from each run's own time line."""
    lines: list[str] = []
    phases = ("warm start", "evaluation", "rollout", "logprobs", "teacher", "update")
    for cpu, data in _load("main_job_time.json")["machines"].items():
        lines += [f"**{cpu}**:", "", "| environment | cache | precision | sampler | warm-start weights | minutes in all | "
                  + " | ".join(phases) + " | held-out success | held-out episodes gained / lost | pool success |",
                  "|---|---|---|---|---|---:|" + "---:|" * len(phases) + "---|---|---|"]
        for run in data["runs"]:
            moved, pool = (run["success"].get(f"{which} success", "").split(", 95%")[0] or "–"
                           for which in ("held-out", "training-pool"))
            one_by_one = re.match(r"(\d+) won that were lost, (\d+) lost that were won",
                                  run["success"].get("held-out episodes", ""))
            gained_lost = f"+{one_by_one[1]} / −{one_by_one[2]}" if one_by_one else "–"
            ws = run.get("warm_start", {})
            exact = ws.get("heldout_action_exact_match")
            trained = ("cached" if ws.get("cache_hit") else
                       f"trained{', autocast' if ws.get('autocast') else ''}"
                       + (f", {100 * exact:.1f}% exact" if exact is not None else ""))
            cells = [f"{run['phases_min'].get(p, 0.0):.1f}" for p in phases]
            said = [f"`{o}`" for o in run.get("overrides", [])] + ([run["note"]] if run.get("note") else [])
            cache = run["pass"] + (f" ({'; '.join(said)})" if said else "")
            lines.append(f"| `{run['python']}` | {cache} | {run.get('precision') or run['dtype']} | {run['rollout_backend']} | {trained} | "
                         f"**{run['wall_min']:.1f}** | " + " | ".join(cells) + f" | {moved} | {gained_lost} | {pool} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def _sft_precision_row(label: str, seeds: str, run: dict, baseline: str) -> str:
    """A row of `render_warm_start_autocast`: one SFT, or one precision's mean over its seeds."""
    paired = run[f"vs_{baseline}"]
    vs = f"{paired['second_only']} / {paired['first_only']} ({paired['mcnemar_p']:.2f})" if paired else "–"
    seconds = f"{run['sft_seconds']:.0f}" if run.get("sft_seconds") is not None else "–"
    exact = f"{_pct(run['exact_match'])}%" if run.get("exact_match") is not None else "–"
    won, lost = (f"{_pct(run[k])}%" if run.get(k) is not None else "–"
                 for k in ("invalid_rate_won", "invalid_rate_lost"))
    return (f"| {label} | {seeds} | {seconds} | {exact} | {_pct(run['success'])}% of {run['episodes']} | "
            f"{_pct(run['invalid_action_rate'])}% | {won} / {lost} | {vs} |")


def render_warm_start_autocast() -> str:
    """One table per CPU model in `warm_start_autocast.json` (`bench_warm_start_autocast.py`: the warm start's SFT
    in float32 or under autocast, each SFT's policy on the same held-out episodes): a row per SFT, then a row per
    precision averaged over its seeds, the episodes of every seed paired with the float32 SFT of that seed; the
    inadmissible actions also within the won and within the lost episodes."""
    lines: list[str] = []
    for cpu, data in _load("warm_start_autocast.json")["machines"].items():
        baseline = data["baseline"]
        lines += [f"**{cpu}**:", "", "| SFT | seed | SFT s | exact match | held-out success | inadmissible actions | "
                  "of the turns of won / lost episodes | "
                  f"vs the {baseline} SFT: gained / lost (McNemar p) |", "|---|---|---:|---:|---:|---:|---:|---|"]
        for run in sorted(data["runs"].values(), key=lambda run: (run["seed"], run["variant"] != baseline)):
            lines.append(_sft_precision_row(run["variant"], str(run["seed"]), run, baseline))
        for name, variant in data["variants"].items():
            if len(variant.get("seeds", [0])) > 1:  # a precision trained from several seeds: its mean
                lines.append(_sft_precision_row(f"**{name}**, mean", " ".join(map(str, variant["seeds"])), variant,
                                                baseline))
        lines += ["", f"_{data['note']}_" if data.get("note") else "", ""]
    return "\n".join(lines).rstrip()


def render_sft_fit() -> str:
    """One table per CPU model in `sft_fit.json` (`bench_sft_fit.py`): each warm start's teacher-forced fit of its
    seed's held-out and training demonstrations, measured with its trained blocks in float32 / under autocast."""
    lines: list[str] = []
    for cpu, data in _load("sft_fit.json")["machines"].items():
        lines += [f"**{cpu}**:", "", "| SFT | seed | held-out token NLL | held-out actions at p < 0.9 | "
                  "training token NLL | training actions at p < 0.9 |", "|---|---|---:|---:|---:|---:|"]
        for run in sorted(data["runs"].values(), key=lambda run: (run["seed"], run["variant"] != "float32")):
            cells = []
            for split in ("heldout", "train"):
                f32, auto = run["float32"].get(split), run["autocast"].get(split)
                cells += [f"{f32['token_nll']:.4f} / {auto['token_nll']:.4f}" if f32 and auto else "–",
                          f"{_pct(f32['responses_p_under_0.9'])}% / {_pct(auto['responses_p_under_0.9'])}%"
                          if f32 and auto else "–"]
            lines.append(f"| {run['variant']} | {run['seed']} | " + " | ".join(cells) + " |")
        legend = " ".join(filter(None, ["Each cell: measured in float32 / under autocast.", data.get("note")]))
        lines += ["", f"_{legend}_", ""]
    return "\n".join(lines).rstrip()


def render_sft_gradients() -> str:
    """One table per CPU model in `sft_gradients.json` (the retired `bench_sft_gradients.py`): at each set of
    weights, how far the SFT's gradient under autocast (and from bf16-rounded weights alone) is from float32's, over
    all trained tensors and in the kind of tensor where it is farthest."""
    whole = "all trained tensors"  # the record's figures over every trained tensor, beside each kind's
    lines: list[str] = []
    for cpu, data in _load("sft_gradients.json")["machines"].items():
        lines += [f"**{cpu}**:", "", "| weights | computed | batches | error / gradient | error / batch spread | "
                  "error kept by averaging | cosine | signs flipped | farthest tensor (error / gradient) |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---|"]
        for label, run in data["runs"].items():
            for numerics, by_kind in run["vs_float32"].items():
                every = by_kind[whole]
                kind, worst = max(((k, f) for k, f in by_kind.items() if k != whole),
                                  key=lambda item: item[1]["error_vs_gradient"])
                lines.append(f"| {label} | {numerics} | {run['batches']} | {every['error_vs_gradient']:.4f} | "
                             f"{every['error_vs_batch_spread']:.4f} | {every['error_kept_by_averaging']:.2f} "
                             f"(noise: {run['batches'] ** -0.5:.2f}) | {every['cosine']:.5f} | "
                             f"{100 * every['sign_flips']:.2f}% | {kind} ({worst['error_vs_gradient']:.4f}) |")
        notes = "; ".join(f"{label}: {run['note']}" for label, run in data["runs"].items() if run.get("note"))
        first = next(iter(data["runs"].values()))  # every run of a CPU read the same preset's batches of one seed
        legend = " ".join(filter(None, [f"{cpu}, {first['config']}, seed {first['seed']}'s SFT batches.", notes]))
        lines += ["", f"_{legend}_", ""]
    return "\n".join(lines).rstrip()


RENDERERS: dict[str, Callable[[], str]] = {
    "headline": render_headline,
    "study": render_study,
    "study_answer": render_study_answer,
    "study_resolve": render_study_resolve,
    "main_job": render_main_job,
    "main_job_bf16": lambda: render_main_job("cpu_small_seeds_bf16.json"),
    "main_job_bf16_dither": lambda: render_main_job("cpu_small_seeds_bf16_dither.json"),
    "main_job_bf16_float32_trainable": lambda: render_main_job("cpu_small_seeds_bf16_float32_trainable.json"),
    "main_job_bf16_autocast": lambda: render_main_job("cpu_small_seeds_bf16_autocast.json"),
    "precision": render_precision,
    "main_job_time": render_main_job_time,
    "warm_start_autocast": render_warm_start_autocast,
    "sft_fit": render_sft_fit,
    "sft_gradients": render_sft_gradients,
    "credit_quality": render_credit_quality,
    "main_job_grid": lambda: render_report_runs("main_job_grid.json"),
    "main_job_seeds_amx": lambda: render_report_runs("main_job_seeds_amx.json"),
    "heldout_replays": lambda: render_replays("heldout_replays.json"),
    "heldout_replays_penalty": lambda: render_replays("heldout_replays_penalty.json"),
    "heldout_replays_amx": lambda: render_replays("heldout_replays_amx.json"),
    "loss_agg_runs": lambda: "\n\n".join(f"**{mode}**:\n\n" + render_report_runs(f"loss_agg_{name}.json")
                                         for mode, name in (("token-mean", "token_mean"),
                                                            ("seq-mean-token-mean", "seq_mean"))),
    "loss_agg_replays": lambda: "\n\n".join(f"**{title}**:\n\n" + render_replays(f"loss_agg_replays_{name}.json")
                                            for title, name in (("token-mean", "token_mean"),
                                                                ("seq-mean-token-mean", "seq_mean"),
                                                                ("seq-mean-token-mean against token-mean", "modes"))),
}


def render_text(text: str, page: str = "<text>") -> str:
    """`text` with every results block replaced by its freshly rendered table."""
    def fill(match: re.Match) -> str:
        name = match.group("name")
        if name not in RENDERERS:
            raise KeyError(f"{page}: unknown results block {name!r}; known: {', '.join(sorted(RENDERERS))}")
        return f"{match.group(1)}{RENDERERS[name]()}\n{match.group(4)}"
    return BLOCK.sub(fill, text)


def pages() -> list[Path]:
    """The pages that may hold results blocks: the README and every Markdown file under docs/."""
    docs = ROOT / "docs"
    return [ROOT / "README.md", *sorted(p for p in docs.rglob("*.md") if "results_data" not in p.parts)]


def render_pages(check: bool = False) -> list[Path]:
    """Rewrite every page whose blocks differ from the JSON (or, with `check`, only list them)."""
    stale = []
    for path in pages():
        text = path.read_text(encoding="utf-8")
        fresh = render_text(text, page=str(path.relative_to(ROOT)))
        if fresh != text:
            stale.append(path)
            if not check:
                path.write_text(fresh, encoding="utf-8")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a page's results block disagrees with its JSON")
    args = parser.parse_args(argv)
    stale = render_pages(check=args.check)
    for path in stale:
        verb = "disagrees with benchmarks/results (run benchmarks/render_results.py)" if args.check else "rendered"
        print(f"{path.relative_to(ROOT)}: {verb}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
