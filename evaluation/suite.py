"""Suites: one policy on several env specs, with every result file in one output folder.

Output folder layout::

    DIR/episodes.jsonl        one line per finished episode (appended as they finish; the resume log)
    DIR/results.json          env spec -> statistics (see reports.py)
    DIR/report.md             Markdown tables (per env and per task type, Wilson 95% intervals)
    DIR/success_by_task_type.png, DIR/horizon.png
    DIR/run.json              the resolved options of the last run

Env specs are `Env-v0:split` (the `agentgym_opsd/` namespace may be omitted). A spec without a split gets
the environment's default evaluation split (`default_eval_split`). Named suites (`SUITES`) expand to specs;
`default` covers every registered environment.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentgym_opsd.evaluation.plots import plot_horizon, plot_success_by_task_type
from agentgym_opsd.evaluation.reports import REPORT_FILE, RESULTS_FILE, write_report_md, write_results_json
from agentgym_opsd.evaluation.runner import (
    EVAL_SEED,
    EvalSummary,
    evaluate_policy,
    load_episode_records,
    summarize,
)
from agentgym_opsd.files import to_json
from agentgym_opsd.policies import Policy
from agentgym_opsd.prompts import PromptRenderer
from agentgym_opsd.registry import NAMESPACE, RegistryError, env_profile, parse_env_spec, registered_envs

__all__ = [
    "EPISODES_FILE",
    "EVAL_SPLIT_PREFERENCE",
    "SUITES",
    "SuiteOptions",
    "default_eval_split",
    "expand_env_specs",
    "normalize_env_spec",
    "rebuild_reports",
    "run_suite",
    "write_reports",
]

EPISODES_FILE = "episodes.jsonl"
RUN_FILE = "run.json"
log = logging.getLogger(__name__)
TASK_TYPE_PLOT = "success_by_task_type.png"
HORIZON_PLOT = "horizon.png"

EVAL_SPLIT_PREFERENCE: tuple[str, ...] = ("valid_unseen", "test", "valid_seen", "valid", "validation", "dev")
"""Held-out split names, most preferred first; an environment with none of them is evaluated on its first
(default) split."""


def default_eval_split(env_id: str) -> str | None:
    splits = env_profile(env_id).splits
    for name in EVAL_SPLIT_PREFERENCE:
        if name in splits:
            return name
    return splits[0] if splits else None


def normalize_env_spec(spec: str) -> str:
    """Check an env spec against the registry and write it canonically (`ALFWorld-v0:valid_unseen`).

    Unknown environments or splits raise a RegistryError listing what exists.
    """
    env_id, split = parse_env_spec(spec.strip())
    known = registered_envs()
    if env_id not in known:
        listing = ", ".join(_short(e) for e in known) or "none (is the environment's package installed?)"
        raise RegistryError(f"unknown environment {spec!r}; registered: {listing}")
    splits = env_profile(env_id).splits
    if split is None:
        split = default_eval_split(env_id)
    elif splits and split not in splits:
        raise RegistryError(f"{_short(env_id)} has no split {split!r}; splits: {', '.join(splits)}")
    return _short(env_id) + (f":{split}" if split else "")


def _short(env_id: str) -> str:
    return env_id.removeprefix(f"{NAMESPACE}/")


def _default_suite() -> list[str]:
    return [_short(e) for e in registered_envs()]


SUITES: dict[str, Callable[[], list[str]]] = {"default": _default_suite}
"""Suite name -> the env specs it covers (computed when used, so late-registered envs are included)."""


def expand_env_specs(envs: Sequence[str] = (), suite: str | None = None) -> list[str]:
    """Canonical, de-duplicated env specs from explicit specs and/or a named suite."""
    specs = list(envs)
    if suite is not None:
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}; suites: {', '.join(sorted(SUITES))}")
        specs += SUITES[suite]()
    if not specs:
        raise ValueError("no environments to evaluate: pass --env ENV-v0:split (repeatable) or --suite NAME")
    out: list[str] = []
    for spec in specs:
        canonical = normalize_env_spec(spec)
        if canonical not in out:
            out.append(canonical)
    return out


@dataclass
class SuiteOptions:
    """Options of a suite run (saved to run.json)."""

    policy: str
    envs: list[str]
    episodes: int = 20
    seed: int = EVAL_SEED
    num_envs: int = 8
    max_turns: int | None = None
    max_retries: int = 2
    oracle_horizon: bool = True
    keep_prompts: bool = False
    policy_options: dict[str, Any] = field(default_factory=dict)
    env_workers: str = "threads"
    prompts_from: str = ""
    """The training run's config.yaml whose prompt settings rendered the prompts ('' = each profile's)."""


def run_suite(policy: Policy, options: SuiteOptions, out_dir: str | Path, *, progress: bool = True,
              renderer_for: Callable[[str], PromptRenderer] | None = None) -> list[EvalSummary]:
    """Evaluate `policy` on every env spec of `options` (resuming from DIR/episodes.jsonl), then write the
    reports and plots. Returns one summary per env spec. `renderer_for(spec)` renders an environment's
    prompts (default: its profile's; the CLI builds it from `options.prompts_from`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _warn_if_options_changed(out / RUN_FILE, options)
    (out / RUN_FILE).write_text(to_json(asdict(options), indent=2, default=str) + "\n", encoding="utf-8")
    summaries = []
    for spec in options.envs:
        summaries.append(evaluate_policy(
            policy, spec, episodes=options.episodes, seed=options.seed, num_envs=options.num_envs,
            max_turns=options.max_turns, progress=progress, results_path=out / EPISODES_FILE,
            policy_name=options.policy, max_retries=options.max_retries, oracle_horizon=options.oracle_horizon,
            keep_prompts=options.keep_prompts, env_workers=options.env_workers,
            renderer=renderer_for(spec) if renderer_for is not None else None,
        ))
    write_reports(summaries, out, policy=options.policy)
    return summaries


# Options that change what an episode is: resuming under different values would mix two experiments.
_EPISODE_OPTIONS = ("seed", "max_turns", "policy_options", "prompts_from")


def _warn_if_options_changed(run_file: Path, options: SuiteOptions) -> None:
    if not run_file.is_file():
        return
    try:
        before = json.loads(run_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return
    now = json.loads(to_json(asdict(options), default=str))  # as written
    changed = [k for k in _EPISODE_OPTIONS if k in before and before[k] != now[k]]
    if changed and before.get("policy") == options.policy:
        log.warning("%s: resuming with different %s than the episodes already there (%s); use a new --out "
                    "folder to keep the experiments apart", run_file.parent, ", ".join(changed),
                    "; ".join(f"{k}: {before[k]} -> {now[k]}" for k in changed))


def write_reports(summaries: Sequence[EvalSummary], out_dir: str | Path, *, policy: str) -> dict[str, Path]:
    """results.json, report.md and the two PNG plots; returns name -> path."""
    out = Path(out_dir)
    plots = {"success by task type": TASK_TYPE_PLOT, "horizon sensitivity": HORIZON_PLOT}
    paths = {
        "results": write_results_json(summaries, out / RESULTS_FILE),
        "task_types_plot": plot_success_by_task_type(summaries, out / TASK_TYPE_PLOT, title=policy),
        "horizon_plot": plot_horizon(summaries, out / HORIZON_PLOT, title=f"Horizon sensitivity: {policy}"),
    }
    paths["report"] = write_report_md(summaries, out / REPORT_FILE, policy=policy, plots=plots)
    return paths


def rebuild_reports(out_dir: str | Path, *, policy: str | None = None) -> list[EvalSummary]:
    """Recompute every report from DIR/episodes.jsonl alone (no environment, no model)."""
    out = Path(out_dir)
    records = load_episode_records(out / EPISODES_FILE)
    if not records:
        raise FileNotFoundError(f"{out / EPISODES_FILE} has no episodes")
    policy = policy or records[-1].policy
    by_env: dict[str, dict[int, Any]] = {}
    for rec in records:
        if rec.policy == policy:
            by_env.setdefault(rec.env_spec, {})[rec.seed] = rec.trajectory  # the last record of a seed wins
    summaries = [summarize(env, [trajs[s] for s in sorted(trajs)], policy=policy) for env, trajs in by_env.items()]
    write_reports(summaries, out, policy=policy)
    return summaries
