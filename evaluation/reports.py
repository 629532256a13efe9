"""Report files of an evaluation run: `results.json` and `report.md`.

`results.json` maps each env spec (e.g. `ALFWorld-v0:valid_unseen`) to its statistics: `success_rate`,
`episodes`, `ci_low`/`ci_high` (Wilson 95%), `score_mean`, `turns_mean`, `invalid_action_rate`,
`failed_episodes`, `by_task_type` (task type -> the same statistics) and `horizon` (success per horizon
and the fitted slope in points per extra turn). `report.md` renders the same as Markdown tables.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym_opsd.evaluation.runner import EvalSummary
from agentgym_opsd.files import atomic_write_text, to_json
from agentgym_opsd.records import INVALID_KINDS

__all__ = [
    "RESULTS_FILE",
    "REPORT_FILE",
    "format_summary_table",
    "load_results",
    "render_report",
    "write_report_md",
    "write_results_json",
]

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"


_atomic_write = atomic_write_text  # one atomic writer for the package (agentgym_opsd.files)


def write_results_json(summaries: Sequence[EvalSummary], path: str | Path) -> Path:
    data = {s.env_spec: s.to_dict() for s in summaries}
    return _atomic_write(Path(path), to_json(data, indent=2, sort_keys=False) + "\n")


def load_results(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """A run's `results.json` (env spec -> stats); a clear error when the folder has none."""
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no {RESULTS_FILE}: is it an evaluation output folder?")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object mapping env spec -> statistics")
    return data


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _ci(stats: Mapping[str, Any]) -> str:
    return f"{_pct(stats['success_rate'])} [{_pct(stats['ci_low'])}, {_pct(stats['ci_high'])}]"


def _invalid_split(stats: Mapping[str, Any]) -> str:
    kinds = stats.get("invalid_by_kind") or {}
    if not kinds:
        return "-"
    return " / ".join(_pct(kinds.get(f"invalid/{k}", 0.0)) for k in INVALID_KINDS)


def _row(name: str, stats: Mapping[str, Any]) -> str:
    return (f"| {name} | {stats['episodes']} | {_ci(stats)} | {stats['score_mean']:.3f} | "
            f"{stats['turns_mean']:.1f} | {_pct(stats['invalid_action_rate'])} | {_invalid_split(stats)} |")


_HEADER = ("| {first} | episodes | success % [95% CI] | score | mean turns | invalid actions % | "
           "no tag / not admissible / cut off % |\n"
           "|---|---:|---|---:|---:|---:|---:|")


def format_summary_table(summaries: Sequence[EvalSummary]) -> str:
    """One Markdown row per env spec."""
    lines = [_HEADER.format(first="environment")]
    lines += [_row(s.env_spec, s.to_dict()) for s in summaries]
    return "\n".join(lines)


def render_report(summaries: Sequence[EvalSummary], *, policy: str, plots: Mapping[str, str] | None = None,
                  notes: Sequence[str] = ()) -> str:
    """The Markdown report: overview table, then per env spec a per-task-type table and the horizon fit."""
    parts = [f"# Evaluation report: `{policy}`", "", format_summary_table(summaries), ""]
    parts += [f"_{note}_" for note in notes]
    for s in summaries:
        parts += [f"## {s.env_spec}", "", _HEADER.format(first="task type")]
        parts += [_row(t, stats) for t, stats in s.by_task_type.items()]
        parts.append(_row("**all**", s.to_dict()))
        parts.append("")
        slope = s.horizon.get("slope_points_per_turn")
        if slope is not None:
            parts.append(f"Horizon sensitivity: {slope:+.2f} success points per extra turn of optimal plan length "
                         f"({s.horizon.get('episodes_with_horizon', 0)} episodes).")
        else:
            parts.append("Horizon sensitivity: not enough distinct horizons to fit a slope.")
        if s.failed_episodes:
            parts.append(f"\n{s.failed_episodes} episode(s) did not run (infrastructure failure after retries; "
                         "counted as failures in the statistics, played again by the next run):")
            parts += [f"- {reason}" for reason in s.failure_reasons]
        parts.append("")
    if plots:
        parts += ["## Plots", ""]
        parts += [f"![{name}]({file})" for name, file in plots.items()]
        parts.append("")
    return "\n".join(parts)


def write_report_md(summaries: Sequence[EvalSummary], path: str | Path, *, policy: str,
                    plots: Mapping[str, str] | None = None, notes: Sequence[str] = ()) -> Path:
    return _atomic_write(Path(path), render_report(summaries, policy=policy, plots=plots, notes=notes))
