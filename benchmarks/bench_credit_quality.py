"""Benchmark: does a credit estimator give more to the turns that made progress?

Real rollouts on ALFWorld `easy` (the 16-game pool of `cpu-learn`), G rollouts per task, each turn labelled
by the environment's oracle distance (`Turn.info["oracle_distance_before"/"after"]`): **progress** when the
distance dropped, **wasted** otherwise (invalid actions included). Every estimator of the registry gets the
same rows; its per-turn multiplier is m_k = Ã_k / A_seq (the token variant: the mean over the turn's tokens),
on trajectories with A_seq ≠ 0. Reported:

- AUC in won trajectories: P(m_progress > m_wasted) (ties ½) — progress should get more of the credit;
- AUC in lost trajectories: P(m_wasted > m_progress) — wasted turns should get more of the blame;
- the same by horizon (trajectory length buckets). GRPO is 0.5 by construction.

Two policies: the warm-started SmolLM2 of `cpu-learn` (from the warm-start cache, found as the trainer finds
it, or `--model PATH`) and a cheap control, the oracle with noise (the expert's action with probability p,
else a random admissible action), scored by the same model. The evidence e_k comes from the trainer's own
teacher pass (`Trainer.score`, `EvidenceMaker.teacher_logprobs`, forward only; no update).

    python benchmarks/bench_credit_quality.py                      # both policies, ~10 min on 2 cores
    python benchmarks/bench_credit_quality.py --policies noisy-oracle --control-tasks 16
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import harness  # benchmarks/ is on sys.path when a script runs from it
import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from agentgym_opsd import credit
from agentgym_opsd.evaluation.credit_quality import (
    DEFAULT_HORIZON_EDGES,
    TurnScore,
    summarise,
    turn_label,
)
from agentgym_opsd.policies import PolicyOutput, PolicyRequest
from agentgym_opsd.records import Trajectory, summarize
from agentgym_opsd.trainer.turn_batch import batch_advantages
from agentgym_opsd.turns import PROGRESS

RESULTS = Path(__file__).parent / "results"
ESTIMATORS = ("grpo", "agentopsd", "agentopsd-raw_gap", "agentopsd-unsigned", "agentopsd-no_prior",
              "agentopsd-token", "gigpo", "agentopsd+gigpo")


# ---- rollouts and credit ---------------------------------------------------------------------------------------
class NoisyOraclePolicy:
    """The expert's action with probability `p`, else a uniformly random admissible action; its text is
    tokenised so the trainer can score it like a sampled reply."""

    def __init__(self, p: float, tokenizer: Any, seed: int = 0) -> None:
        from agentgym_opsd.models.hf_policy import text_ids

        self.p, self.rng, self._ids = p, np.random.default_rng(seed), lambda text: text_ids(tokenizer, text)

    def act(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        outputs = []
        for req in requests:
            assert req.oracle is not None, "run through agentgym_opsd.rollout"
            choices = req.admissible_actions or []
            expert = self.rng.random() < self.p or not choices
            action = req.oracle() if expert else choices[int(self.rng.integers(len(choices)))]
            text = req.format_action(action)
            outputs.append(PolicyOutput(text, token_ids=self._ids(text)))
        return outputs


def make_trainer(preset: str, overrides: Sequence[str], output_dir: str, *, chunk_tasks: int = 4,
                 group_size: int = 4) -> Any:
    """A measuring trainer of `preset` (`harness.make_trainer`) whose env pool plays `chunk_tasks` × `group_size`
    episodes at once; neither setting enters the warm-start key."""
    return harness.make_trainer(preset, [f"rollout.tasks_per_step={chunk_tasks}", f"rollout.group_size={group_size}",
                                         *overrides], output_dir)


def load_warm_start(trainer: Any) -> Path:
    """The cached warm start of this config (the trainer's own cache key); never trains one here."""
    cached = trainer.session.warm_starter.cache_dir()  # the trainer's cache path: the same key, the same weights
    if cached is None or not (cached / "summary.json").is_file():
        raise SystemExit(f"no cached warm start at {cached}: run "
                         "python -m agentgym_opsd.train --config cpu-learn once, or pass --model PATH")
    trainer.warm_start()
    return cached


def collect(trainer: Any, policy: Any, *, num_tasks: int, group_size: int, first_task: int = 0,
            chunk_tasks: int = 4, desc: str = "rollouts") -> list[Trajectory]:
    """num_tasks × group_size episodes on the trainer's task stream (its RL pool), a few tasks at a time."""
    from agentgym_opsd.trainer.task_stream import train_task_specs

    trajs: list[Trajectory] = []
    trainer.session.trained.model.eval()
    for start in tqdm(range(first_task, first_task + num_tasks, chunk_tasks), desc=desc, unit="chunk"):
        count = min(chunk_tasks, first_task + num_tasks - start)
        tasks = train_task_specs(start, count, num_tasks=trainer.session.envs[0].num_tasks, seed=trainer.session.cfg.trainer.seed)
        trajs += trainer.session.envs[0].runner.run(policy, tasks, group_size=group_size, first_group_id=start,
                                    first_traj_id=start * group_size)
    return trajs


def credit_scores(trainer: Any, trajs: list[Trajectory], estimators: Sequence[str] = ESTIMATORS) -> list[TurnScore]:
    """Every estimator's per-turn multiplier Ã_k / A_seq on the same rows (teacher pass: forward only)."""
    a = trainer.session.cfg.algorithm
    batch = trainer.score(trajs)
    rows = batch.rows
    if all(len(r.sample_logprobs) == len(r.response_ids) for r in rows):
        student = [torch.tensor(r.sample_logprobs, dtype=torch.float32) for r in rows]  # π_old as the trainer
    else:  # scripted replies carry no log-probs: a student pass (prompts share the system message: cache it)
        student = trainer.session.trained.logprobs([r.prompt_ids for r in rows], [r.response_ids for r in rows],
                                           shared_prefix=True)
    maker = trainer.session.evidence_maker
    teacher = maker.teacher_logprobs(batch, maker.row_prompts(batch, trajs), student)
    gaps = [t - s for t, s in zip(teacher, student, strict=True)]
    evidence = torch.tensor([float(g.sum()) for g in gaps], dtype=torch.float64)
    _, mask = credit.pad_ragged(gaps, torch.float64)
    per_turn, row_seq = {}, None
    for name in estimators:  # the trainer's own composition (A_seq, penalty bookkeeping, estimator)
        out = batch_advantages(batch, evidence, gaps, estimator=name, config=a.credit_config(),
                               cross_steps=a.grpo_cross_steps, normalize_std=a.normalize_std,
                               penalised_turns_gain=a.penalised_turns_gain)
        assert out.result is not None
        per_turn[name] = _per_turn(out.result, mask)  # the estimator's Ã_k, the penalty term left out
        row_seq = out.seq[batch.traj_index]
    by_id = {t.traj_id: t for t in trajs}
    scores = []
    for i, row in enumerate(rows):
        traj = by_id[row.traj_id]
        turn = traj.turns[row.turn_id]
        seq = float(row_seq[i])
        mult = {name: float(v[i]) / seq for name, v in per_turn.items()} if seq != 0.0 else {}
        scores.append(TurnScore(traj.won, traj.num_turns, turn_label(turn), turn.action_valid, seq, mult))
    return scores


def _per_turn(result: credit.CreditResult, mask: Tensor) -> Tensor:
    """(rows,) Ã_k: the turn value itself, or a token-level estimator's mean over the turn's tokens."""
    if result.granularity == "turn":
        return result.advantages
    m = mask.to(result.advantages.dtype)
    return (result.advantages * m).sum(1) / m.sum(1).clamp_min(1.0)


# ---- the run ---------------------------------------------------------------------------------------------------
@dataclass
class PolicyRun:
    """One policy's rollouts and what they cost."""

    policy: str
    tasks: int
    group_size: int
    episodes: int = 0
    success_rate: float = 0.0
    turns: int = 0
    labelled_turns: int = 0
    progress_turns: int = 0
    turns_with_signal: int = 0
    seconds_rollout: float = 0.0
    seconds_credit: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)  # the first teacher context's
    by_context: dict[str, dict[str, Any]] = field(default_factory=dict)  # teacher.context -> summary


def run_policy(trainer: Any, name: str, policy: Any, *, num_tasks: int, group_size: int,
               horizon_edges: Sequence[int] = DEFAULT_HORIZON_EDGES, chunk_tasks: int = 4,
               contexts: Sequence[str] = ("skills",)) -> tuple[PolicyRun, list[TurnScore]]:
    """Rollouts once, then every teacher context scores the same rows (a paired comparison of teachers)."""
    t0 = time.perf_counter()
    trajs = collect(trainer, policy, num_tasks=num_tasks, group_size=group_size, chunk_tasks=chunk_tasks, desc=name)
    t1 = time.perf_counter()
    by_context: dict[str, dict[str, Any]] = {}
    scores: list[TurnScore] = []
    for context in tqdm(contexts, desc=f"{name}: teacher contexts", unit="context"):  # a teacher pass each
        trainer.session.cfg.teacher.context = context
        context_scores = credit_scores(trainer, trajs)
        by_context[context] = summarise(context_scores, ESTIMATORS, horizon_edges=horizon_edges)
        scores = scores or context_scores
    t2 = time.perf_counter()
    run = PolicyRun(name, num_tasks, group_size, episodes=len(trajs),
                    success_rate=summarize(trajs).success_rate,
                    turns=len(scores), labelled_turns=sum(s.label is not None for s in scores),
                    progress_turns=sum(s.label == PROGRESS for s in scores),
                    turns_with_signal=sum(bool(s.multiplier) for s in scores),
                    seconds_rollout=t1 - t0, seconds_credit=t2 - t1,
                    summary=by_context[contexts[0]], by_context=by_context)
    return run, scores


def format_table(run: PolicyRun) -> str:
    s = run.summary
    head = (f"{run.policy}: {run.episodes} episodes ({run.tasks} tasks × {run.group_size}), success "
            f"{run.success_rate:.1%}, {run.turns} turns ({run.progress_turns} progress), {run.turns_with_signal} "
            f"with A_seq ≠ 0; rollout {run.seconds_rollout:.0f} s, credit {run.seconds_credit:.0f} s")
    buckets = s["buckets"]
    cols = ["estimator", "AUC success", "AUC failure", "success (valid)", "failure (valid)"]
    cols += [f"succ {b}" for b in buckets] + [f"fail {b}" for b in buckets]
    lines = [head, "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, e in s["estimators"].items():
        cells = [name, _f(e["success"]["auc"]), _f(e["failure"]["auc"]), _f(e["success"]["auc_valid_only"]),
                 _f(e["failure"]["auc_valid_only"])]
        cells += [_f(e["success_by_horizon"][b]["auc"]) for b in buckets]
        cells += [_f(e["failure_by_horizon"][b]["auc"]) for b in buckets]
        lines.append("| " + " | ".join(cells) + " |")
    first = next(iter(s["estimators"].values()))
    counts = ", ".join(f"{o} {b}: {first[f'{o}_by_horizon'][b]['progress']}/{first[f'{o}_by_horizon'][b]['wasted']}"
                       for o in ("success", "failure") for b in buckets)
    lines.append(f"(progress/wasted turns with A_seq ≠ 0 — success: {first['success']['progress']}/"
                 f"{first['success']['wasted']}, failure: {first['failure']['progress']}/{first['failure']['wasted']}; "
                 f"{counts})")
    if len(run.by_context) > 1:  # the teachers compared on the same rows
        lines.append("teacher context → AgentOPSD AUC success / failure: " + "; ".join(
            f"{ctx} {_f(c['estimators']['agentopsd']['success']['auc'])} / "
            f"{_f(c['estimators']['agentopsd']['failure']['auc'])}"
            for ctx, c in run.by_context.items() if "agentopsd" in c["estimators"]))
    return "\n".join(lines)


def _f(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def plot(runs: Sequence[PolicyRun], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 3.6 * len(runs)), squeeze=False)
    for r, run in enumerate(runs):
        s = run.summary
        names = list(s["estimators"])
        for c, outcome in enumerate(("success", "failure")):
            ax = axes[r][c]
            groups = ["all", *s["buckets"]]
            width = 0.8 / len(names)
            for k, name in enumerate(names):
                e = s["estimators"][name]
                vals = [e[outcome]["auc"], *(e[f"{outcome}_by_horizon"][b]["auc"] for b in s["buckets"])]
                ax.bar(np.arange(len(groups)) + k * width, [v if v == v else 0 for v in vals], width, label=name)
            ax.axhline(0.5, color="black", lw=0.8, ls="--")
            ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, [f"{g} turns" if g != "all" else g for g in groups])
            ax.set_ylim(0.2, 1.0)
            want = "P(m_progress > m_wasted)" if outcome == "success" else "P(m_wasted > m_progress)"
            ax.set_title(f"{run.policy}: {'won' if outcome == 'success' else 'lost'} trajectories, {want}", fontsize=9)
            ax.set_ylabel("AUC")
        axes[r][1].legend(fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu-learn")
    p.add_argument("--model", default=None, help="score and sample with this model instead of the cached warm start")
    p.add_argument("--policies", default="smollm2,noisy-oracle", help="comma list of smollm2, noisy-oracle")
    p.add_argument("--tasks", type=int, default=16, help="tasks of the model policy")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--control-tasks", type=int, default=16, help="tasks of the noisy-oracle control")
    p.add_argument("--control-group-size", type=int, default=4)
    p.add_argument("--p", type=float, default=0.5, help="noisy oracle: probability of the expert's action")
    p.add_argument("--chunk-tasks", type=int, default=4, help="tasks played at once (×G environments)")
    p.add_argument("--horizon-edges", default=",".join(map(str, DEFAULT_HORIZON_EDGES)))
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", default=str(RESULTS / "credit_quality"), help="writes OUT.json and OUT.png")
    p.add_argument("--contexts", default="skills", help="comma list of teacher contexts to score the same rollouts "
                                                         "with: skills, hint, skills+hint")
    p.add_argument("--hint-level", default="goal", help="the environment's privileged hint level for hint contexts")
    p.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = p.parse_args(argv)
    contexts = tuple(x.strip() for x in args.contexts.split(",") if x.strip())
    if args.threads:
        torch.set_num_threads(args.threads)
    edges = tuple(int(x) for x in args.horizon_edges.split(",") if x)
    overrides = list(args.overrides)
    if args.model:
        overrides += [f"model.name_or_path={args.model}", "warm_start.epochs=0", "warm_start.steps=0"]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(args.preset, overrides, tmp, chunk_tasks=args.chunk_tasks,
                               group_size=max(args.group_size, args.control_group_size))
        model_from = args.model or str(load_warm_start(trainer) / "model")
        if any(c != "skills" for c in contexts):  # record the hint on every rollout (the student never sees it)
            trainer.session.envs[0].runner.hint_level = args.hint_level
        runs = []
        for name in [x.strip() for x in args.policies.split(",") if x.strip()]:
            if name == "smollm2":
                run, _ = run_policy(trainer, "smollm2", trainer.session.policy, num_tasks=args.tasks,
                                    group_size=args.group_size, horizon_edges=edges, chunk_tasks=args.chunk_tasks,
                                    contexts=contexts)
            elif name == "noisy-oracle":
                policy = NoisyOraclePolicy(args.p, trainer.session.trained.tokenizer, seed=trainer.session.cfg.trainer.seed)
                run, _ = run_policy(trainer, f"noisy-oracle p={args.p}", policy, num_tasks=args.control_tasks,
                                    group_size=args.control_group_size, horizon_edges=edges,
                                    chunk_tasks=args.chunk_tasks, contexts=contexts)
            else:
                raise SystemExit(f"unknown policy {name!r}")
            runs.append(run)
            print(format_table(run), flush=True)
        trainer.close()
    seconds = time.perf_counter() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"preset": args.preset, "model": model_from, "overrides": overrides, "horizon_edges": list(edges),
              "contexts": list(contexts), "hint_level": args.hint_level,
              "credit_config": asdict(trainer.session.cfg.algorithm.credit_config()), "seconds_total": seconds,
              "torch_threads": torch.get_num_threads(), "runs": [asdict(r) for r in runs]}
    out.with_suffix(".json").write_text(json.dumps(record, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    plot(runs, out.with_suffix(".png"))
    print(f"total {seconds / 60:.1f} min; wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
