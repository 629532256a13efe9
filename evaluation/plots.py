"""PNG plots (matplotlib, Agg backend): success by task type, horizon sensitivity, training curves, and
runs side by side.

Every function takes plain data (summaries, metric rows) and a path, writes one PNG and returns the path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

from agentgym_opsd.evaluation.runner import EvalSummary  # noqa: E402

__all__ = [
    "CURVE_PANELS",
    "VALIDATION_SUCCESS",
    "find_curve_keys",
    "plot_compare",
    "plot_horizon",
    "plot_success_by_task_type",
    "plot_training_curves",
    "validation_keys",
]

_DPI = 110


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI, format="png")
    plt.close(fig)
    return path


def plot_success_by_task_type(summaries: Sequence[EvalSummary], path: str | Path, *, title: str = "") -> Path:
    """One panel per env spec: success rate per task type (bars) with Wilson 95% intervals (error bars)."""
    n = max(len(summaries), 1)
    fig, axes = plt.subplots(1, n, figsize=(max(4.5, 0.9 * _max_types(summaries) + 2.5) * n, 4.2), squeeze=False)
    for ax, summary in zip(axes[0], summaries, strict=False):
        types = list(summary.by_task_type)
        rates = [100 * summary.by_task_type[t]["success_rate"] for t in types]
        # max(0, .): the interval ends can differ from the rate by rounding alone at 0% and 100%.
        low = [max(0.0, r - 100 * summary.by_task_type[t]["ci_low"]) for t, r in zip(types, rates, strict=True)]
        high = [max(0.0, 100 * summary.by_task_type[t]["ci_high"] - r) for t, r in zip(types, rates, strict=True)]
        xs = range(len(types))
        ax.bar(xs, rates, yerr=[low, high], capsize=3, color="tab:blue", alpha=0.85)
        ax.set_xticks(list(xs), [_short(t) for t in types], rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 105)
        ax.set_ylabel("success (%)")
        ax.set_title(f"{summary.env_spec}\n{100 * summary.success_rate:.1f}% overall, n={summary.episodes}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_horizon(summaries: Sequence[EvalSummary], path: str | Path, *, title: str = "") -> Path:
    """Success against horizon (optimal plan length / hops / oracle turns) per env spec, with the
    least-squares line; the legend gives its slope in points per extra turn."""
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    plotted = False
    for summary in summaries:
        by_h = summary.horizon.get("success_by_horizon") or {}
        if not by_h:
            continue
        hs = sorted(int(h) for h in by_h)
        rates = [100 * by_h[str(h)]["success_rate"] for h in hs]
        sizes = [12 + 6 * by_h[str(h)]["episodes"] for h in hs]
        slope = summary.horizon.get("slope_points_per_turn")
        label = summary.env_spec + (f"  (slope {slope:+.2f} pts/turn)" if slope is not None else "")
        points = ax.scatter(hs, rates, s=sizes, alpha=0.7, label=label)
        intercept = summary.horizon.get("intercept_points")
        if slope is not None and intercept is not None:
            xs = [min(hs), max(hs)]
            ax.plot(xs, [intercept + slope * x for x in xs], color=points.get_facecolor()[0], linewidth=1.5)
        plotted = True
    if not plotted:
        ax.text(0.5, 0.5, "no horizon information in these episodes", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("horizon (optimal plan length / hops / oracle turns)")
    ax.set_ylabel("success (%)")
    ax.set_ylim(-5, 105)
    ax.grid(alpha=0.3)
    if plotted:
        ax.legend(fontsize=8)
    ax.set_title(title or "Horizon sensitivity (marker size = episodes)", fontsize=10)
    return _save(fig, path)


VALIDATION_SUCCESS = re.compile(r"^(val|eval|validation)/([^/]+/)?success(_rate)?$", re.IGNORECASE)
"""Validation success keys: `val/success_rate` or `val/<env spec>/success_rate` (not the per-task-type ones)."""

CURVE_PANELS: dict[str, re.Pattern[str]] = {
    # `train/<spec>/...` since the key styles were unified; `env/<id>/...` in older runs' metrics files
    "success (%)": re.compile(VALIDATION_SUCCESS.pattern + r"|^(train|env)/[^/]+/success_rate$", re.IGNORECASE),
    "entropy": re.compile(r"entropy(?!_coef)", re.IGNORECASE),
    "KL to reference": re.compile(r"(^|/|_)(approx_)?kl($|/|_)", re.IGNORECASE),
    "evidence": re.compile(r"evidence", re.IGNORECASE),
}
"""Panel title -> which metric keys go into it. Keys are matched by pattern, so the trainer's names may grow:
`val/<env spec>/success_rate` (validation) and `train/<env spec>/success_rate` (training rollouts), `entropy`,
`kl` / `loss/kl`, `evidence_mean`, ... (spreads and coefficients are left out)."""

_STEP_KEYS = ("step", "global_step", "train/step", "time/step")
_SKIP = re.compile(r"coef|/std$|_std$|/min$|/max$", re.IGNORECASE)


def find_curve_keys(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Panel title -> the numeric metric keys of `rows` that belong in it (sorted)."""
    keys = sorted({k for row in rows for k, v in row.items() if _is_number(v)})
    panels = {panel: [k for k in keys if pat.search(k) and not _SKIP.search(k) and k not in _STEP_KEYS]
              for panel, pat in CURVE_PANELS.items()}
    panels["success (%)"] = _drop_duplicate_validation(panels["success (%)"])
    return panels


def validation_keys(keys: Sequence[str]) -> list[str]:
    """The validation success keys among `keys`, without the generic one's per-env duplicate."""
    return _drop_duplicate_validation([k for k in keys if VALIDATION_SUCCESS.search(k)])


def _drop_duplicate_validation(keys: list[str]) -> list[str]:
    # The trainer logs `val/success_rate` and, for its one validation env, `val/<env>/success_rate` with the
    # same value: draw it once. With several envs, the per-env curves are the information.
    generic = [k for k in keys if VALIDATION_SUCCESS.search(k) and k.count("/") == 1]
    specific = [k for k in keys if VALIDATION_SUCCESS.search(k) and k.count("/") == 2]
    if generic and len(specific) == 1:
        return [k for k in keys if k not in specific]
    return keys


def _step_of(row: Mapping[str, Any], index: int) -> float:
    for key in _STEP_KEYS:
        if _is_number(row.get(key)):
            return float(row[key])
    return float(index)


def plot_training_curves(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path, *, title: str = "") -> Path:
    """Training curves (as in the paper's Figure 1): validation success, entropy, KL and evidence against
    training step. `runs` maps a run label to its metric rows (`metrics.jsonl`); several runs overlay."""
    all_rows = [row for rows in runs.values() for row in rows]
    panels = find_curve_keys(all_rows)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.0 * len(panels), 3.6), squeeze=False)
    for ax, (panel, keys) in zip(axes[0], panels.items(), strict=True):
        drew = False
        for label, rows in runs.items():
            for key in keys:
                pts = [(_step_of(r, i), float(r[key])) for i, r in enumerate(rows) if _is_number(r.get(key))]
                if not pts:
                    continue
                scale = 100.0 if "success" in panel else 1.0
                style = "--" if key.startswith(("train/", "env/")) else "-"  # training rollouts dashed, validation solid
                name = key if len(runs) == 1 else f"{label}: {key}"
                ax.plot([p[0] for p in pts], [scale * p[1] for p in pts], style, marker="o" if len(pts) < 30 else None,
                        markersize=3, linewidth=1.3, label=name)
                drew = True
        if drew:
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_compare(results: Mapping[str, Mapping[str, Mapping[str, Any]]], path: str | Path, *, title: str = "") -> Path:
    """Runs side by side: grouped bars of success per env spec, one bar per run, with 95% intervals.
    `results` maps run label -> its `results.json` content (env spec -> stats)."""
    labels = list(results)
    envs = sorted({env for res in results.values() for env in res})
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(envs) * max(len(labels), 1) / 2 + 3), 4.2))
    width = 0.8 / max(len(labels), 1)
    for j, label in enumerate(labels):
        xs, rates, err_lo, err_hi = [], [], [], []
        for i, env in enumerate(envs):
            stats = results[label].get(env)
            if not stats:
                continue
            rate = 100 * float(stats["success_rate"])
            xs.append(i + (j - (len(labels) - 1) / 2) * width)
            rates.append(rate)
            err_lo.append(max(0.0, rate - 100 * float(stats.get("ci_low", stats["success_rate"]))))
            err_hi.append(max(0.0, 100 * float(stats.get("ci_high", stats["success_rate"])) - rate))
        ax.bar(xs, rates, width=width, yerr=[err_lo, err_hi], capsize=3, label=label)
    ax.set_xticks(list(range(len(envs))), envs, rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("success (%)")
    ax.set_ylim(0, 105)
    ax.grid(axis="y", alpha=0.3)
    if labels:
        ax.legend(fontsize=8)
    ax.set_title(title or "Success by environment", fontsize=10)
    return _save(fig, path)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _max_types(summaries: Sequence[EvalSummary]) -> int:
    return max((len(s.by_task_type) for s in summaries), default=1)


def _short(name: str, limit: int = 30) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"
