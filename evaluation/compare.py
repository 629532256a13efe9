"""Runs side by side, and training curves of a training run.

A run folder is an evaluation output (it has `results.json`), a training run (it has `metrics.jsonl`,
one JSON object of metrics per line), or both. `compare_runs` writes `compare.md` (success per env spec
per run, and for training runs the final / best validation success) and `compare.png` (grouped bars), plus
`compare_curves.png` when training runs are among them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym_opsd.evaluation.plots import plot_compare, plot_training_curves, validation_keys
from agentgym_opsd.evaluation.reports import RESULTS_FILE, load_results

__all__ = ["METRICS_FILE", "RunData", "compare_runs", "load_metrics", "load_run", "render_compare", "write_curves"]

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


@dataclass
class RunData:
    """What a run folder holds: `results` (env spec -> stats) and/or `metrics` (training metric rows)."""

    label: str
    path: Path
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)


def load_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a `metrics.jsonl` (a folder holding one, or the file); unreadable lines are skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: expected a training run's {METRICS_FILE}")
    rows = []
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                log.warning("%s:%d: skipping unreadable metrics line (%s)", path, line_no, exc)
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def load_run(path: str | Path, label: str | None = None) -> RunData:
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"run folder {p} does not exist")
    run = RunData(label or p.name, p)
    if (p / RESULTS_FILE).is_file():
        run.results = load_results(p)
    if (p / METRICS_FILE).is_file():
        run.metrics = load_metrics(p)
    if not run.results and not run.metrics:
        raise FileNotFoundError(f"{p} holds neither {RESULTS_FILE} (evaluation) nor {METRICS_FILE} (training)")
    return run


def _labels(paths: Sequence[Path]) -> list[str]:
    names = [p.name for p in paths]
    # Two runs named alike (runs/a/eval, runs/b/eval) are told apart by their parent folder.
    return [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in paths]


def _val_summary(rows: list[dict[str, Any]]) -> dict[str, tuple[float, float, int]]:
    """Validation key -> (final value, best value, evaluations)."""
    out = {}
    keys = sorted({k for row in rows for k in row})
    for key in validation_keys(keys):
        values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
        if values:
            out[key] = (values[-1], max(values), len(values))
    return out


def render_compare(runs: Sequence[RunData]) -> str:
    lines = ["# Runs side by side", ""]
    evals = [r for r in runs if r.results]
    if evals:
        envs = sorted({env for r in evals for env in r.results})
        lines.append("| environment | " + " | ".join(r.label for r in evals) + " |")
        lines.append("|---|" + "---|" * len(evals))
        for env in envs:
            cells = []
            for r in evals:
                s = r.results.get(env)
                cells.append("—" if not s else f"{100 * s['success_rate']:.1f} [{100 * s.get('ci_low', 0):.1f}, "
                             f"{100 * s.get('ci_high', 1):.1f}] (n={s['episodes']})")
            lines.append(f"| {env} | " + " | ".join(cells) + " |")
        lines += ["", "Success % with Wilson 95% interval.", ""]
    trains = [r for r in runs if r.metrics]
    if trains:
        lines += ["| training run | metric | final | best | evaluations |", "|---|---|---:|---:|---:|"]
        for r in trains:
            summary = _val_summary(r.metrics)
            if not summary:
                lines.append(f"| {r.label} | (no validation metric logged) | | | |")
            for key, (final, best, n) in summary.items():
                lines.append(f"| {r.label} | {key} | {100 * final:.1f} | {100 * best:.1f} | {n} |")
        lines.append("")
    return "\n".join(lines)


def compare_runs(paths: Sequence[str | Path], out_dir: str | Path) -> dict[str, Path]:
    """Load the runs, write compare.md / compare.png (/ compare_curves.png); returns name -> path."""
    if not paths:
        raise ValueError("compare needs at least one run folder")
    ps = [Path(p) for p in paths]
    runs = [load_run(p, label) for p, label in zip(ps, _labels(ps), strict=True)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    md = render_compare(runs)
    (out / "compare.md").write_text(md, encoding="utf-8")
    written["table"] = out / "compare.md"
    evals = {r.label: r.results for r in runs if r.results}
    if evals:
        written["plot"] = plot_compare(evals, out / "compare.png")
    trains = {r.label: r.metrics for r in runs if r.metrics}
    if trains:
        written["curves"] = plot_training_curves(trains, out / "compare_curves.png", title="Training curves")
    return written


def write_curves(run: str | Path, out_path: str | Path | None = None) -> Path:
    """Training curves of one run (folder with metrics.jsonl, or the file) -> PNG (default: beside it)."""
    src = Path(run)
    rows = load_metrics(src)
    if not rows:
        raise ValueError(f"{src} has no metric rows")
    folder = src if src.is_dir() else src.parent
    target = Path(out_path) if out_path else folder / "training_curves.png"
    return plot_training_curves({folder.name: rows}, target, title=f"Training curves: {folder.name}")
