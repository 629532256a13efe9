"""Evidence variants compared on identical rollouts: the credit AUC each form of e_k gives AgentOPSD.

The credit-quality benchmark (`--evidence paper,choice,mean,args`) scores one set of rollouts per
environment with every evidence form (`agentgym_opsd.credit.evidence`) and the paper's AgentOPSD estimator,
turns them into `TurnScore`s (the multiplier m_k = Ã_k / A_seq, keyed by variant), and this module makes the
record: per variant the credit AUC on *valid* turns in won trajectories (progress should get more of the
credit) and in lost ones (wasted turns more of the blame), the progress : wasted counts behind each, the same
over all turns, and how many rows each variant judged in its own form (the rest fell back to the paper's
sum). Every environment's record goes into one file (`evidence_variants.json`), shaped
`{env: {variant: {...}, "run": {...}}}`, merged under a lock so the three environments can run at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym_opsd.evaluation.credit_quality import EVIDENCE, TurnScore, evidence_auc, split_auc
from agentgym_opsd.files import atomic_write_lines

__all__ = ["ENV_ORDER", "env_key", "evidence_key", "merge_env_record", "plot_evidence_variants", "variant_summary"]

ENV_ORDER = ("alfworld", "webshop", "searchqa")
"""The environments in reading order (the keys of the record)."""


def env_key(env_id: str) -> str:
    """`ALFWorld-v0:easy` -> `alfworld`: the record's key of an environment spec."""
    return env_id.split(":", 1)[0].split("-v", 1)[0].lower()


def _num(x: float) -> float | None:
    return None if isinstance(x, float) and math.isnan(x) else x


def evidence_key(variant: str) -> str:
    """Where a variant's raw e_k sits in `TurnScore.multiplier`, beside its AgentOPSD multiplier."""
    return f"{variant}/{EVIDENCE}"


def variant_summary(scores: Sequence[TurnScore], variant: str, forms: Sequence[str]) -> dict[str, Any]:
    """One variant's numbers: valid-turn AUC won / lost with their progress and wasted counts, the all-turn
    AUCs, `evidence_auc_won` / `evidence_auc_lost` (the raw e_k's valid-turn AUC before the estimator, every
    row including A_seq = 0 groups: `credit_quality.evidence_auc`), and `rows_own_form` /
    `rows_paper_fallback` (rows judged in the variant's form / by the paper's sum; one entry per row)."""
    valid = [s for s in scores if s.valid]
    won, won_p, won_w = split_auc(valid, variant, won=True)
    lost, lost_p, lost_w = split_auc(valid, variant, won=False)
    own = sum(f != "paper" for f in forms) if variant.split("-")[0] != "paper" else len(forms)
    e_won, e_won_p, e_won_w = evidence_auc(valid, won=True, key=evidence_key(variant))
    e_lost, e_lost_p, e_lost_w = evidence_auc(valid, won=False, key=evidence_key(variant))
    return {
        "auc_won": _num(won), "auc_lost": _num(lost),
        "won_progress": won_p, "won_wasted": won_w, "lost_progress": lost_p, "lost_wasted": lost_w,
        "auc_won_all_turns": _num(split_auc(scores, variant, won=True)[0]),
        "auc_lost_all_turns": _num(split_auc(scores, variant, won=False)[0]),
        "evidence_auc_won": _num(e_won), "evidence_auc_lost": _num(e_lost),
        "evidence_counts": {"won_progress": e_won_p, "won_wasted": e_won_w,
                            "lost_progress": e_lost_p, "lost_wasted": e_lost_w},
        "rows_own_form": own, "rows_paper_fallback": len(forms) - own,
    }


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside the record (in the temp folder, so no lock file lands in the results)."""
    lock = Path(tempfile.gettempdir()) / f"{path.name}.lock"
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def merge_env_record(path: Path, env: str, record: Mapping[str, Any], *, control: str | None = None,
                     ) -> dict[str, Any]:
    """Put one environment's record into the file at `path` (others kept), atomically and under a lock; with
    `control`, under that name in the environment's `controls` (its main record kept). Returns the whole
    record, environments in `ENV_ORDER`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        if control is None:
            data[env] = {**dict(record), **({"controls": data[env]["controls"]} if "controls" in data.get(env, {})
                                            and "controls" not in record else {})}
        else:
            if env not in data:
                raise ValueError(f"{path}: no main record of {env} to add the control {control!r} to")
            data[env].setdefault("controls", {})[control] = dict(record)
        ordered = {k: data[k] for k in sorted(data, key=lambda k: (ENV_ORDER + (k,)).index(k))}
        atomic_write_lines(path, [json.dumps(ordered, indent=1) + "\n"])
    return ordered


def plot_evidence_variants(data: Mapping[str, Any], variants: Sequence[str], path: Path,
                           targets: Mapping[str, tuple[float, float]] | None = None) -> None:
    """One panel per environment: valid-turn AUC won and lost per variant, chance at 0.5 and the
    environment's targets (won, lost) as dotted lines where given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = [e for e in data if any(v in data[e] for v in variants)]
    # one panel per environment's main record, then one per control policy (a second row)
    rows = [[(env, data[env]) for env in envs]]
    controls = [(env, rec) for env in envs for rec in data[env].get("controls", {}).values()]
    if controls:
        rows.append(controls)
    width = max(len(r) for r in rows)
    fig, axes = plt.subplots(len(rows), max(width, 1), figsize=(4.6 * max(width, 1), 3.6 * len(rows)),
                             squeeze=False)
    for r, panels in enumerate(rows):
        for ax in axes[r][len(panels):]:
            ax.axis("off")
        for ax, (env, record) in zip(axes[r], panels, strict=False):
            _panel(ax, env, record, variants, targets)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=2)  # below the panels: bars stay visible
    fig.tight_layout(rect=(0, 0.08 / len(rows), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _panel(ax: Any, env: str, record: Mapping[str, Any], variants: Sequence[str],
           targets: Mapping[str, tuple[float, float]] | None) -> None:
    """One record's bars: valid-turn AUC won and lost per variant."""
    shown = [v for v in variants if v in record]
    for k, (side, label) in enumerate((("auc_won", "won: P(m_progress > m_wasted)"),
                                      ("auc_lost", "lost: P(m_wasted > m_progress)"))):
        values = [record[v][side] for v in shown]
        ax.bar([i + 0.4 * k for i in range(len(shown))], [v if v is not None else 0.0 for v in values], 0.4,
               label=label)
    ax.axhline(0.5, color="black", lw=0.8, ls="--")
    if targets and env in targets:
        for value, colour in zip(targets[env], ("C0", "C1"), strict=True):
            ax.axhline(value, color=colour, lw=0.8, ls=":")
    ax.set_xticks([i + 0.2 for i in range(len(shown))], shown, fontsize=8)
    ax.set_ylim(0.0, 1.0)
    run = record.get("run", {})
    ax.set_title(f"{env}, {run.get('policy', '?')} ({run.get('episodes', '?')} episodes, "
                 f"{100 * run.get('success_rate', 0):.0f}% won)", fontsize=9)
    ax.set_ylabel("credit AUC, valid turns")
