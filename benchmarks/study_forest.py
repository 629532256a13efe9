"""The study's forest plot, drawn from `benchmarks/results/study.json` alone: `study_forest.png`.

    python benchmarks/study_forest.py          # redraw it (bench_study.py --report-only does too)
    python benchmarks/study_forest.py --check  # exit 1 when the PNG was not drawn from the current study.json

One row per environment × arm with a paired difference (`render_results.paired_rows`, the rows of the docs'
resolution table): the held-out success minus its GRPO baseline's on the same seeds, mean over seeds, with its
95% interval (filled: a t interval over three or more seeds; open: the pooled-episode interval of fewer seeds,
episode noise only; `agentgym_opsd.evaluation.paired`). Beside each row: the self-teacher's raw e_k AUC (won /
lost) where the arm records one (a teacher's, or the oracle's), the seeds × held-out episodes, and the conclusion. The PNG
carries a digest of the numbers it drew (`stamp`), so the docs test can tell a stale figure from its JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from render_results import RESULTS, paired_rows  # benchmarks/ is on sys.path when a script runs from it

__all__ = ["FOREST", "draw_forest", "forest_data", "read_stamp", "stamp"]

FOREST = RESULTS / "study_forest.png"
STAMP_KEY = "study.json digest"


def forest_data(study: dict) -> list[dict]:
    """What the figure draws, row by row (top to bottom), in points."""
    out = []
    for label, arm in paired_rows(study):
        held = arm["paired"]["valid"]
        auc = arm.get("evidence_auc") or {}
        out.append({"label": label, "mean": 100 * held["mean"], "low": 100 * held["low"], "high": 100 * held["high"],
                    "method": held["method"], "seeds": len(held["seeds"]), "episodes": held["episodes"],
                    "verdict": held["verdict"], "teacher": bool(arm.get("teacher")), "auc_won": auc.get("success"),
                    "auc_lost": auc.get("failure"), "target": 100 * held["target"]})
    return out


def stamp(study: dict) -> str:
    """A digest of `forest_data(study)`: equal stamps, the same figure."""
    text = json.dumps(forest_data(study), sort_keys=True, allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def read_stamp(path: Path = FOREST) -> str | None:
    """The stamp a drawn PNG carries (None for a PNG without one)."""
    from PIL import Image

    with Image.open(path) as image:
        return image.info.get(STAMP_KEY)


def _side_text(row: dict) -> str:
    auc = ("" if not row["teacher"] and row["auc_won"] is None else "e_k AUC not recorded · " if row["auc_won"] is None
           else f"e_k AUC {row['auc_won']:.2f} / {row['auc_lost']:.2f} · ")
    seeds = "1 seed" if row["seeds"] == 1 else f"{row['seeds']} seeds"
    return f"{row['mean']:+.1f} [{row['low']:+.0f}, {row['high']:+.0f}] · {auc}{seeds} × {row['episodes']} ep · " \
           f"{row['verdict']}"


def draw_forest(study: dict, path: Path = FOREST) -> Path:
    """Draw the forest plot of `study` (the parsed study.json) into `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = forest_data(study)
    fig, ax = plt.subplots(figsize=(13, 1.2 + 0.42 * max(len(rows), 1)))
    if rows:
        target = rows[0]["target"]
        ax.axvspan(-target, target, color="0.92", lw=0, label=f"±{target:.0f} points")
    ax.axvline(0, color="0.4", lw=0.8)
    for y, row in enumerate(rows):
        t_interval = row["method"] == "t over seeds"
        color = {"helps": "C2", "hurts": "C3"}.get(row["verdict"], "C0")
        ax.errorbar(row["mean"], y, xerr=[[row["mean"] - row["low"]], [row["high"] - row["mean"]]], fmt="o",
                    color=color, mfc=color if t_interval else "white", capsize=3, lw=1.4)
        ax.annotate(_side_text(row), xy=(1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [row["label"] for row in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("held-out success minus GRPO's, paired by seed (points; 95% interval: filled = t over ≥ 3 seeds, "
                  "open = the episodes of < 3 seeds, episode noise only)", fontsize=8)
    ax.set_title("AgentOPSD and the other arms against GRPO, same warm start, seeds and held-out episodes", fontsize=10)
    if rows:
        ax.legend(loc="lower left", fontsize=7)
    fig.subplots_adjust(left=0.2, right=0.66)
    fig.savefig(path, dpi=110, metadata={STAMP_KEY: stamp(study)})
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the PNG is stale")
    args = parser.parse_args(argv)
    study = json.loads((RESULTS / "study.json").read_text(encoding="utf-8"))
    if args.check:
        fresh = FOREST.is_file() and read_stamp() == stamp(study)
        print(f"{FOREST.name}: {'agrees with' if fresh else 'was not drawn from'} study.json")
        return 0 if fresh else 1
    print(draw_forest(study))
    return 0


if __name__ == "__main__":
    sys.exit(main())
