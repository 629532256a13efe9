"""Resumable experiment matrices: many training runs from shared warm starts, one result file per run.

A study (`benchmarks/bench_study.py`, `benchmarks/bench_main_job.py`) is a list of `RunSpec`s. Each names the
"before" run it shares (the warm start and the before-evaluations of one configuration, done once with
`trainer.total_steps=0`), and its own training run. A before run whose saved settings no longer match what it
would run now (`BEFORE_SETTINGS`: the warm start and how it is evaluated) is moved aside and done again, and a
run whose warm start is not its before's gets no result. `ExperimentRunner.run` starts what has no result file yet,
`parallel` at a time with the cores split between them, resumes a killed run from its last checkpoint
(`--resume auto`), and writes `<results>/<name>.json` when a run ends; a finished run is never redone, so a
study can be re-run until it is complete, and its tables are built from whatever files exist (`load_results`).

Every run is `python -m agentgym_opsd.train` in its own process (its own torch threads, a crash stays its
own), started from a `git worktree` or checkout that does not change under it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from agentgym_opsd.evaluation.credit_quality import run_credit_auc
from agentgym_opsd.evaluation.metrics import wilson_interval
from agentgym_opsd.evaluation.paired import paired_episodes
from agentgym_opsd.files import atomic_write_text, to_json
from agentgym_opsd.models.precision import resolve_device
from agentgym_opsd.trainer.config import Config, load_config
from agentgym_opsd.trainer.losses import row_loss_weights
from agentgym_opsd.trainer.validation import read_episode_outcomes, validation_file

__all__ = ["BEFORE_SETTINGS", "BeforeSpec", "ExperimentRunner", "RunSpec", "before_settings", "credit_check",
           "final_validation", "load_results", "read_metrics", "run_result", "same_warm_start", "start_training_run",
           "task_type_success", "warm_start_dir"]

log = logging.getLogger(__name__)

PER_STEP_KEYS = ("step", "success_rate", "score_mean", "entropy", "grad_norm", "approx_kl", "clip_fraction", "invalid_action_rate",
                 "sampling/rounds", "sampling/dropped_groups", "sampling/mixed_group_share",
                 "rollout/sampled_nll_per_token", "seconds_rollout", "seconds_teacher", "seconds_update",
                 # how far a low-precision run's update reached the model, and how far its sampler was off-policy
                 "precision/weights_changed", "ppo/start_ratio_max_dev", "tis/mismatch_k3", "tis/weight_max")


BEFORE_SETTINGS = ("model", "env", "warm_start", "rollout.max_new_tokens", "rollout.temperature", "rollout.top_p",
                   "trainer.eval_episodes", "trainer.eval_pool_rollouts")
"""The config sections and keys that decide a before run's numbers: the warm-started weights and how they are
evaluated. `env.outcome` (which rewards are logged) and `warm_start.cache` (where weights are kept) do not."""
_NOT_BEFORE = ("env.outcome", "warm_start.cache")


def before_settings(cfg: Config) -> dict[str, Any]:
    """`BEFORE_SETTINGS` of `cfg`, flattened to dotted keys; `model.precision: auto` resolved as the trainer
    resolves it (a run's saved config.yaml holds the resolved names, so `auto` would never match)."""
    cfg = replace(cfg, model=cfg.model.resolved(resolve_device(cfg.trainer.device)))
    out: dict[str, Any] = {}
    data = asdict(cfg)
    for path in BEFORE_SETTINGS:
        value: Any = data
        for part in path.split("."):
            value = value[part]
        items = {f"{path}.{k}": v for k, v in value.items()} if isinstance(value, dict) else {path: value}
        out.update({k: v for k, v in items.items() if k not in _NOT_BEFORE})
    return out


def warm_start_dir(run_dir: Path) -> str | None:
    """Where the run's warm-started weights are (its `warm_start/summary.json`), None before it has one."""
    path = run_dir / "warm_start" / "summary.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8")).get("warm_start/model_dir")


def same_warm_start(run_dir: Path, before_dir: Path) -> bool:
    """Whether the run started from its before run's cached warm start (logged when not: the before numbers
    would not be its own). Runs without a warm start, or with `warm_start.cache=off` (each run then trains
    its own copy in its folder), have nothing shared to compare and pass."""
    ours, theirs = warm_start_dir(run_dir), warm_start_dir(before_dir)
    if ours is None or theirs is None or Path(theirs).resolve().is_relative_to(before_dir.resolve()):
        return True
    if Path(ours).resolve() == Path(theirs).resolve():
        return True
    log.error("%s started from the warm start %s, its before run %s from %s: no result written", run_dir, ours,
              before_dir, theirs)
    return False


@dataclass(frozen=True)
class BeforeSpec:
    """A warm start and its before-evaluations, shared by every run that names it."""

    name: str
    config: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunSpec:
    """One training run: `name` (also its result file, e.g. `alfworld/grpo/seed0`), the before it shares,
    its config and overrides (on top of the before's), and labels for the tables (arm, seed, environment)."""

    name: str
    before: BeforeSpec
    overrides: tuple[str, ...] = ()
    labels: dict[str, Any] = field(default_factory=dict)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of `run_dir/metrics.jsonl` (a line cut by a kill is skipped)."""
    path = run_dir / "metrics.jsonl"
    out = []
    if path.is_file():
        for text in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(text))
            except json.JSONDecodeError:
                continue
    return out


def credit_check(run_dir: Path) -> dict[str, int]:
    """Turn rows of lost trajectories in the run's credit files, and how many got a positive advantage. With a
    graded outcome (`env.outcome: score` in the run's config) a trajectory counts as lost when it was not won
    and its reward is below its group's mean that step: one above the mean is rightly pushed up."""
    graded = run_outcome(run_dir) == "score"
    rows = positive = 0
    for path in sorted((run_dir / "credit").glob("step_*.jsonl")):
        trajs = [json.loads(text) for text in path.read_text(encoding="utf-8").splitlines()]
        rewards: dict[int, list[float]] = {}
        for traj in trajs:
            rewards.setdefault(traj["group_id"], []).append(traj["reward"])
        group_mean = {group: sum(values) / len(values) for group, values in rewards.items()}
        for traj in trajs:
            if traj["won"] or (graded and traj["reward"] >= group_mean[traj["group_id"]] - 1e-9):
                continue
            for turn in traj["turns"]:
                rows += 1
                positive += (turn.get("advantage") or 0.0) > 0
    return {"failed_rows": rows, "failed_rows_positive": positive}


def invalid_credit_check(run_dir: Path) -> dict[str, int]:
    """Invalid turns (the environment refused the action, or no action was parsed) in the run's training rollouts
    (`trajectories/`, joined to `credit/` by step and trajectory id), and how many got a positive advantage: with
    `penalty_mode=outcome` none since invalid turns stopped sharing their rollout's win; before, a won rollout
    pushed its invalid turns up. Zero rows where the run kept no trajectories."""
    rows = positive = 0
    for path in sorted((run_dir / "credit").glob("step_*.jsonl")):
        saved = run_dir / "trajectories" / path.name
        if not saved.is_file():
            continue
        valid = {t["traj_id"]: [turn["action_valid"] for turn in t["turns"]]
                 for t in map(json.loads, saved.read_text(encoding="utf-8").splitlines())}
        for traj in map(json.loads, path.read_text(encoding="utf-8").splitlines()):
            for turn, ok in zip(traj["turns"], valid.get(traj["traj_id"], []), strict=False):
                if not ok:
                    rows += 1
                    positive += (turn.get("advantage") or 0.0) > 0
    return {"invalid_rows": rows, "invalid_rows_positive": positive}


def push_balance(run_dir: Path) -> dict[str, list[float]]:
    """Per RL step, how hard the update pushed the sampled tokens of the step's rollouts down against up: the sum
    of |advantage| x response tokens x the token weight the run's `algorithm.loss_agg_mode` gave them, over turns
    with a negative advantage, over the same sum where it was positive (`push_down_over_up`; 1 = balanced). Under
    token-mean a lost rollout that ran to the turn limit weighs by its many tokens. A step that pushed nothing up
    (no group with a win) has no ratio; empty where the run kept no trajectories (their token counts)."""
    path = run_dir / "config.yaml"
    mode = load_config(str(path)).algorithm.loss_agg_mode if path.is_file() else "token-mean"
    ratios = []
    for credit in sorted((run_dir / "credit").glob("step_*.jsonl"), key=lambda p: int(p.stem.split("_")[1])):
        saved = run_dir / "trajectories" / credit.name
        if not saved.is_file():
            continue
        tokens = {t["traj_id"]: [len(turn.get("response_token_ids") or []) for turn in t["turns"]]
                  for t in map(json.loads, saved.read_text(encoding="utf-8").splitlines())}
        rows = [(traj["traj_id"], turn.get("advantage") or 0.0, n)
                for traj in map(json.loads, credit.read_text(encoding="utf-8").splitlines())
                for turn, n in zip(traj["turns"], tokens.get(traj["traj_id"], []), strict=False) if n]
        if not rows:
            continue
        weights = row_loss_weights(mode, [t for t, _, _ in rows], [n for _, _, n in rows])
        down = sum(-a * n * w for (_, a, n), w in zip(rows, weights, strict=True) if a < 0)
        up = sum(a * n * w for (_, a, n), w in zip(rows, weights, strict=True) if a > 0)
        if up > 0:
            ratios.append(round(down / up, 4))
    return {"push_down_over_up": ratios}


def run_outcome(run_dir: Path) -> str:
    """The run's `env.outcome` from its saved config (the default, "won", for a config that predates the
    field; also without a config)."""
    path = run_dir / "config.yaml"
    return load_config(str(path)).env.outcome if path.is_file() else "won"


def _rate(metrics: dict[str, Any], prefix: str) -> dict[str, Any] | None:
    value, episodes = metrics.get(f"{prefix}/success_rate"), metrics.get(f"{prefix}/episodes")
    if value is None:
        return None
    out: dict[str, Any] = {"success": value, "invalid_action_rate": metrics.get(f"{prefix}/invalid_action_rate")}
    if metrics.get(f"{prefix}/score") is not None:  # the mean partial credit (WebShop's R)
        out["score"] = metrics[f"{prefix}/score"]
    if episodes:
        out["episodes"] = int(episodes)
        out["ci"] = list(wilson_interval(round(value * episodes), int(episodes)))
    by_type = task_type_success(metrics, prefix)
    if by_type:
        out["by_task_type"] = by_type
    return out


def task_type_success(metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    """Success per task type from the `<prefix>/<env>/<task type>/success_rate` keys validation logs."""
    out = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == prefix and parts[3] == "success_rate" and value is not None:
            out[parts[2]] = float(value)
    return dict(sorted(out.items()))


def final_validation(lines: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The last metric line of a run that holds a validation after an RL step (the "after" numbers)."""
    return next((m for m in reversed(lines) if "val/success_rate" in m and m.get("step", 0) > 0), None)


def run_result(run_dir: Path, before: dict[str, Any], before_dir: Path | None = None) -> dict[str, Any] | None:
    """Before / after (held-out `val` and `pool`, with Wilson intervals), the held-out change episode by
    episode (`valid_paired`, when the before run in `before_dir` and this run kept their episodes), the
    per-step numbers, the credit check and the credit-quality AUC of the run's own rollouts (`run_credit_auc`)
    of a finished run; None while it has no validation after its last step."""
    lines = read_metrics(run_dir)
    steps = [m for m in lines if "seconds_update" in m]
    after = final_validation(lines)
    if not steps or after is None:
        return None
    after_episodes = read_episode_outcomes(validation_file(run_dir, int(after["step"])))
    paired = None
    if before_dir is not None:
        paired = paired_episodes(read_episode_outcomes(validation_file(before_dir, 0)), after_episodes)
    return {
        "before": {"valid": _rate(before, "val"), "pool": _rate(before, "pool")},
        "after": {"valid": _rate(after, "val"), "pool": _rate(after, "pool")},
        "valid_paired": paired.to_json() if paired else None,
        # [env spec, reset seed, won] per held-out episode after RL: arms of one seed pair on them (bench_study)
        "valid_episodes": [[e["env_spec"], e["seed"], bool(e["won"])] for e in after_episodes] or None,
        "rl_steps": len(steps),
        "rl_minutes": sum(m.get("seconds_rollout", 0) + m.get("seconds_teacher", 0) + m.get("seconds_update", 0)
                          for m in steps) / 60,
        "per_step": [{k: m.get(k) for k in PER_STEP_KEYS} for m in steps],
        **credit_check(run_dir),
        **invalid_credit_check(run_dir),
        **push_balance(run_dir),
        "credit_auc": run_credit_auc(run_dir),
        **machine_record(run_dir),
    }


def machine_record(run_dir: Path) -> dict[str, Any]:
    """Where and how the run computed: the CPU model, the precision `model.precision` and the sampler
    `rollout.backend` resolved to (its config.yaml; a run from before the key: its `model.dtype`), and the run's
    own wall-time line per phase (the last `time:` line of its log)."""
    import yaml
    from harness import cpu_model, last_time_line

    config = run_dir / "config.yaml"
    resolved = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}) if config.is_file() else {}
    model = resolved.get("model", {})
    return {"cpu": cpu_model(), "dtype": model.get("precision") or model.get("dtype"),
            "rollout_backend": resolved.get("rollout", {}).get("backend"), "time_report": last_time_line(run_log(run_dir))}


def run_log(run_dir: Path) -> Path:
    """`<run_dir>.log`, beside the run folder: the output of its training process."""
    return run_dir.with_name(f"{run_dir.name}.log")


def _free_name(path: Path, tag: str) -> Path:
    """`<path>.<tag>-<k>` with the first k not taken."""
    k = 1
    while (aside := path.with_name(f"{path.name}.{tag}-{k}")).exists():
        k += 1
    return aside


def load_results(results: Path) -> list[dict[str, Any]]:
    """Every finished run's result under `results` (recursively), sorted by name."""
    return sorted((json.loads(p.read_text(encoding="utf-8")) for p in results.rglob("*.json")),
                  key=lambda r: r["name"])


def start_training_run(run_dir: Path, config: str, overrides: Sequence[str], threads: int, *, resume: bool = False,
                       append_log: bool = False) -> subprocess.Popen:
    """`python -m agentgym_opsd.train` into `run_dir` in its own process with `threads` torch threads, offline,
    its output in `<run_dir>.log` beside it (appended to with `append_log`); `resume` adds `--resume auto`."""
    from harness import train_command, training_env

    env = {**training_env(threads), "DS_ACCELERATOR": "cpu"}
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_log(run_dir).open("a" if append_log else "w")
    cmd = [*train_command(sys.executable, config, run_dir, overrides), *(["--resume", "auto"] if resume else [])]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


class ExperimentRunner:
    """Runs `RunSpec`s into `runs_dir/<name>` and writes `results_dir/<name>.json` (see the module doc)."""

    def __init__(self, runs_dir: Path, results_dir: Path, *, parallel: int = 2, cores: int | None = None,
                 poll_s: float = 5.0) -> None:
        self.runs_dir, self.results_dir = Path(runs_dir), Path(results_dir)
        self.parallel = max(parallel, 1)
        self.cores = cores or os.cpu_count() or 1
        self.poll_s = poll_s

    def _start(self, run_dir: Path, config: str, overrides: Sequence[str], threads: int, *,
               resume: bool) -> subprocess.Popen:
        return start_training_run(run_dir, config, overrides, threads, resume=resume, append_log=True)

    def before(self, spec: BeforeSpec) -> dict[str, Any]:
        """The shared before-metrics (step 0) of `spec`, running it once with all cores if needed; a finished
        before run whose settings changed since is moved aside (`<name>.stale-<k>`) and done again."""
        run_dir = self.runs_dir / "before" / spec.name
        overrides = ["trainer.total_steps=0", "trainer.eval_at_start=true", *spec.overrides]
        if read_metrics(run_dir):
            changed = self._changed_settings(run_dir, spec.config, overrides)
            if changed:
                aside = _free_name(run_dir, "stale")
                log.warning("the before run %s was made with other %s: moved to %s, running it again", spec.name,
                            ", ".join(changed), aside.name)
                run_dir.rename(aside)
                if run_log(run_dir).is_file():
                    run_log(run_dir).rename(run_log(aside))
        if not read_metrics(run_dir):
            proc = self._start(run_dir, spec.config, overrides, self.cores, resume=False)
            if proc.wait() != 0:
                raise RuntimeError(f"the before run {spec.name} failed, see {run_log(run_dir)}")
        return read_metrics(run_dir)[0]

    @staticmethod
    def _changed_settings(run_dir: Path, config: str, overrides: Sequence[str]) -> list[str]:
        """The `before_settings` keys in which the run's saved config differs from `config` + `overrides` now."""
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            return []
        then, now = before_settings(load_config(str(saved))), before_settings(load_config(config, list(overrides)))
        return sorted(k for k in then.keys() | now.keys() if then.get(k) != now.get(k))

    def result_path(self, spec: RunSpec) -> Path:
        return self.results_dir / f"{spec.name}.json"

    def pending(self, specs: Sequence[RunSpec]) -> list[RunSpec]:
        return [s for s in specs if not self.result_path(s).is_file()]

    def run(self, specs: Sequence[RunSpec]) -> list[str]:
        """Run every spec without a result file; returns the names that failed (their logs say why)."""
        todo = self.pending(specs)
        befores = {s.before.name: self.before(s.before) for s in todo}
        threads = max(self.cores // min(self.parallel, max(len(todo), 1)), 1)
        running: dict[str, tuple[RunSpec, subprocess.Popen, float]] = {}
        failed: list[str] = []
        while todo or running:
            while todo and len(running) < self.parallel:
                spec = todo.pop(0)
                overrides = [*spec.before.overrides, "trainer.eval_at_start=false", *spec.overrides]
                proc = self._start(self.runs_dir / spec.name, spec.before.config, overrides, threads, resume=True)
                running[spec.name] = (spec, proc, time.perf_counter())
            time.sleep(self.poll_s)
            for name, (spec, proc, t0) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                before_dir = self.runs_dir / "before" / spec.before.name
                result = run_result(self.runs_dir / name, befores[spec.before.name], before_dir) \
                    if proc.returncode == 0 else None
                if result is not None and not same_warm_start(self.runs_dir / name, before_dir):
                    result = None
                if result is None:
                    failed.append(name)
                    continue
                result.update({"name": name, "before_run": spec.before.name, "labels": spec.labels,
                               "overrides": list(spec.overrides), "wall_minutes": (time.perf_counter() - t0) / 60,
                               "threads": threads})
                atomic_write_text(self.result_path(spec), to_json(result, indent=2) + "\n")
        return failed
