"""Credit inspector: one static HTML page of a training step's credit numbers.

    python -m agentgym_opsd.inspector RUN_DIR [--step N] [--out FILE.html]

reads `RUN_DIR/trajectories/step_N.jsonl` and, when the trainer wrote it, `RUN_DIR/credit/step_N.jsonl` (joined by
trajectory id and turn), and writes one self-contained page (default `RUN_DIR/credit/step_N.html`; no server, no
network): task groups, trajectories and turns with state, response (shaded by teacher − student gap), validity,
oracle distance and credit numbers, a belief sparkline per trajectory, filters and sorting. All run text is
HTML-escaped. Both files are checked line by line (`records.check_fields`): a malformed line, a missing field, a
number JSON cannot hold or a string over `MAX_STRING_CHARS` is one error naming file, line and field (exit 2). The
page is written atomically. Unknown keys in a credit line are ignored, so newer trainer output still loads.
"""

from __future__ import annotations

import argparse
import html
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym_opsd.files import atomic_write_text
from agentgym_opsd.outputs import check_output_file
from agentgym_opsd.records import (
    NUMBER_OR_NULL,
    Trajectory,
    Turn,
    check_fields,
    groups_of,
    read_json_lines,
    require_fields,
    summarize,
)
from agentgym_opsd.turns import ORACLE_AFTER, ORACLE_BEFORE, turn_progress

__all__ = ["StepData", "load_step", "render_html", "main"]

# Credit fields shown per turn, in this order: (key in the credit file, column label, tooltip).
CREDIT_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("evidence", "e_k", "evidence: summed teacher − student log-prob of the response"),
    ("belief", "B_k", "belief of success after this turn"),
    ("delta_belief", "ΔB_k", "change of belief this turn"),
    ("weight", "w_k", "AgentOPSD weight of this turn, in [1 − b, 1 + b]"),
    ("step_return", "G_k", "GiGPO: discounted return from this turn"),
    ("step_advantage", "A_step", "GiGPO: step advantage within the anchor-state group"),
    ("anchor_size", "|anchor|", "GiGPO: turns of the group that acted on the same state"),
    ("advantage", "Ã_k", "final advantage of the turn (mean over its tokens)"),
)


# The JSON types of a credit line (`trainer.credit_file.credit_lines` writes them) and of each of its turns; a
# number is null where the estimator gives none or it was not finite.
_LINE_TYPES: dict[str, tuple[type, ...]] = {
    "step": (int,), "estimator": (str,), "traj_id": (int,), "group_id": (int,), "env_id": (str,), "task_id": (str,),
    "task_type": (str,), "won": (bool,), "reward": NUMBER_OR_NULL, "seq_advantage": NUMBER_OR_NULL,
    "success_rate": NUMBER_OR_NULL, "turns": (list,),
}
_TURN_TYPES: dict[str, tuple[type, ...]] = {
    "turn": (int,), "prior": NUMBER_OR_NULL, "token_gaps": (list,), "tokens": (list,),
    **{key: NUMBER_OR_NULL for key, _, _ in CREDIT_COLUMNS},
}
_TURN_ITEMS: dict[str, tuple[type, ...]] = {"token_gaps": NUMBER_OR_NULL, "tokens": (str,)}
# What every credit line and every turn of one holds (`credit_lines` always writes these; `env_id` is newer and
# the page does not need it), and the fields an estimator writes together: a turn with one of a group and not the
# others, or a line whose turns differ in a group, was cut or edited, and its page would show numbers that are
# not the run's.
_LINE_REQUIRED = ("step", "estimator", "traj_id", "group_id", "task_id", "task_type", "won", "reward",
                  "seq_advantage", "success_rate", "turns")
_TURN_REQUIRED = ("turn", "advantage")
_TURN_GROUPS: tuple[tuple[str, ...], ...] = (
    ("prior", "belief", "delta_belief", "weight"),  # AgentOPSD's details
    ("step_return", "step_advantage", "anchor_size"),  # GiGPO's
    ("token_gaps", "tokens"),  # a token-level estimator's
)
# What every trajectory record holds beyond the fields without a default (`Trajectory` itself requires those):
# the page groups, joins and filters on them.
_TRAJECTORY_REQUIRED = ("turns", "won")
MAX_STRING_CHARS = 1_000_000
"""The longest string the inspector reads (a response, an observation, a prompt message): the page carries each
whole, and our longest (a WebShop prompt with its history) is tens of thousands of characters."""
# The oracle's distances a turn's `info` may carry (the page compares them): numbers, or absent.
_ORACLE_TYPES: dict[str, tuple[type, ...]] = {ORACLE_BEFORE: NUMBER_OR_NULL, ORACLE_AFTER: NUMBER_OR_NULL}


class InspectError(ValueError):
    """A run folder or step that cannot be inspected; the message says what is missing."""


@dataclass
class StepData:
    """One step of one run: its trajectories and, per trajectory id, the saved credit line (may be empty)."""

    run_dir: Path
    step: int
    trajectories: list[Trajectory]
    credit: dict[int, dict[str, Any]] = field(default_factory=dict)

    def credit_of_turn(self, traj_id: int, turn_index: int) -> dict[str, Any]:
        line = self.credit.get(traj_id, {})
        return next((t for t in line.get("turns", []) if t.get("turn") == turn_index), {})


def available_steps(run_dir: Path) -> list[int]:
    found = (re.fullmatch(r"step_(\d+)\.jsonl", p.name) for p in (run_dir / "trajectories").glob("step_*.jsonl"))
    return sorted(int(m.group(1)) for m in found if m)


def load_step(run_dir: Path, step: int | None = None) -> StepData:
    """Trajectories and credit lines of `step` (default: the last step with trajectories)."""
    steps = available_steps(run_dir)
    if not steps:
        raise InspectError(f"{run_dir}: no trajectories/step_*.jsonl (was trainer.save_trajectories off?)")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise InspectError(f"{run_dir}: no trajectories for step {step}; steps: {', '.join(map(str, steps))}")
    trajs = _read_trajectories(run_dir / "trajectories" / f"step_{step:06d}.jsonl")
    path = run_dir / "credit" / f"step_{step:06d}.jsonl"
    credit = _read_credit(path) if path.is_file() else {}
    return StepData(run_dir, step, trajs, credit)


def _read_trajectories(path: Path) -> list[Trajectory]:
    """The step's trajectory records, checked as `records.iter_jsonl` checks them, and the oracle distances the
    page compares."""
    trajs = []
    for line_no, value in read_json_lines(path, "trajectory record", max_string_chars=MAX_STRING_CHARS):
        try:
            if isinstance(value, dict):
                require_fields("trajectory record", value, _TRAJECTORY_REQUIRED)
            traj = Trajectory.from_dict(value)
            for turn in traj.turns:
                check_fields(f"turn {turn.index} info", turn.info, _ORACLE_TYPES)
        except (TypeError, ValueError) as exc:
            raise InspectError(f"{path}:{line_no}: not a trajectory record ({exc})") from exc
        trajs.append(traj)
    return trajs


def _read_credit(path: Path) -> dict[int, dict[str, Any]]:
    """Trajectory id -> its credit line, each line and each of its turns checked (`_LINE_TYPES`)."""
    credit: dict[int, dict[str, Any]] = {}
    for line_no, line in read_json_lines(path, "credit line", max_string_chars=MAX_STRING_CHARS):
        try:
            _check_credit_line(line)
        except (TypeError, ValueError) as exc:
            raise InspectError(f"{path}:{line_no}: not a credit line ({exc})") from exc
        credit[line["traj_id"]] = line
    return credit


def _check_credit_line(line: Any) -> None:
    if not isinstance(line, dict):
        raise TypeError(f"expected a JSON object, got {type(line).__name__}")
    if "traj_id" not in line:
        raise ValueError("no 'traj_id' (the trajectory it belongs to)")
    require_fields("credit line", line, _LINE_REQUIRED)
    check_fields("credit line", line, _LINE_TYPES)
    groups: set[tuple[str, ...]] | None = None  # the detail groups of the line's first turn: every turn has them
    for i, turn in enumerate(line["turns"]):
        if not isinstance(turn, dict):
            raise TypeError(f"turns[{i}]: expected a JSON object, got {type(turn).__name__}")
        if "turn" not in turn:
            raise ValueError(f"turns[{i}]: no 'turn' (the turn index it belongs to)")
        require_fields(f"turns[{i}]", turn, _TURN_REQUIRED)
        present = {group for group in _TURN_GROUPS if any(name in turn for name in group)}
        for group in _TURN_GROUPS:
            missing = [name for name in group if name not in turn]
            if group in present and missing:
                has = [name for name in group if name in turn]
                raise ValueError(f"turns[{i}] has {', '.join(map(repr, has))} but no field {missing[0]!r}: an "
                                 f"estimator writes {', '.join(group)} together")
            if groups is not None and group in groups and missing:
                raise ValueError(f"turns[{i}] has no field {missing[0]!r}, which turns[0] of the line has")
        groups = present if groups is None else groups
        check_fields(f"turns[{i}]", turn, _TURN_TYPES, _TURN_ITEMS)


# ---- rendering ----------------------------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _finite(value: Any) -> float | None:
    """`value` as a finite float; None when missing, not finite, or an integer beyond a float's range."""
    try:
        number = float(value)
    except (TypeError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool) or isinstance(value, int):
        return str(int(value))
    return f"{float(value):.4f}"


def _state_text(traj: Trajectory, position: int) -> str:
    """What the turn acted on: the previous observation, or the first prompt's user message."""
    if position > 0:
        return traj.turns[position - 1].observation
    users = [m.get("content", "") for m in traj.turns[0].prompt if m.get("role") == "user"]
    return users[-1] if users else ""


def _gap_style(gap: float, scale: float) -> str:
    """Green where the teacher liked the token more than the student, red where less; alpha ∝ |gap|."""
    alpha = min(abs(gap) / scale, 1.0) * 0.75 if scale > 0 else 0.0
    rgb = "34,160,70" if gap >= 0 else "215,50,50"
    return f"background:rgba({rgb},{alpha:.3f})"


def _response_html(turn: Turn, credit: dict[str, Any]) -> str:
    tokens, gaps = credit.get("tokens"), credit.get("token_gaps")
    if not tokens or not gaps or len(tokens) != len(gaps):
        return f'<pre class="response">{_e(turn.response_text)}</pre>'
    shades = [_finite(g) or 0.0 for g in gaps]
    scale = max((abs(g) for g in shades), default=0.0)
    spans = "".join(
        f'<span class="tok" style="{_gap_style(s, scale)}" title="gap {_fmt(g)}">{_e(t)}</span>'
        for t, g, s in zip(tokens, gaps, shades, strict=True)
    )
    return f'<pre class="response shaded">{spans}</pre>'


def _sparkline(prior: float | None, beliefs: Sequence[float | None]) -> str:
    """Inline SVG of B_0, B_1 … B_K on a fixed [0, 1] axis (a dashed line at the prior); missing or non-finite
    values are left out."""
    values = [f for f in map(_finite, [prior, *beliefs]) if f is not None]
    if len(values) < 2:
        return ""
    width, height, pad = 160.0, 36.0, 3.0
    step = (width - 2 * pad) / (len(values) - 1)
    points = [(pad + i * step, pad + (1.0 - v) * (height - 2 * pad)) for i, v in enumerate(values)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="1.8"/>' for x, y in points)
    prior_y = points[0][1]
    return (f'<svg class="spark" width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
            f'role="img" aria-label="belief trajectory"><title>belief B_0 … B_K: '
            f'{_e(", ".join(f"{v:.3f}" for v in values))}</title>'
            f'<line x1="0" x2="{width:.0f}" y1="{prior_y:.1f}" y2="{prior_y:.1f}" class="prior"/>'
            f'<polyline points="{path}"/>{dots}</svg>')


def _oracle_badge(turn: Turn) -> str:
    """The oracle's distance after the turn (as the rollout records it) and, when the distance before is
    known, whether the turn made progress (the distance dropped) or was wasted."""
    after = turn.info.get(ORACLE_AFTER)
    if after is None:
        return ""
    progress = turn_progress(turn)
    label = "" if progress is None else f" (from {_e(turn.info[ORACLE_BEFORE])}: {progress})"
    return f'<span class="badge oracle" data-key="oracle_distance">oracle distance {_e(after)}{label}</span>'


def _turn_html(data: StepData, traj: Trajectory, position: int, turn: Turn) -> str:
    credit = data.credit_of_turn(traj.traj_id, turn.index)
    cells = "".join(
        f'<td class="num" data-key="{key}" title="{_e(tip)}">{_fmt(credit.get(key))}</td>'
        for key, _, tip in CREDIT_COLUMNS if key in credit
    )
    heads = "".join(f'<th title="{_e(tip)}">{_e(label)}</th>' for key, label, tip in CREDIT_COLUMNS if key in credit)
    numbers = f'<table class="credit"><tr>{heads}</tr><tr>{cells}</tr></table>' if credit else \
        '<p class="muted">no credit numbers saved for this turn</p>'
    validity = "valid" if turn.action_valid else f"invalid: {turn.invalid_reason or turn.invalid_kind or '?'}"
    oracle_html = _oracle_badge(turn)
    return f"""
<div class="turn {'ok' if turn.action_valid else 'bad'}" data-turn="{_e(turn.index)}">
  <div class="turn-head"><b>turn {_e(turn.index)}</b> <span class="badge {'ok' if turn.action_valid else 'bad'}">{_e(validity)}</span>
    <span class="badge">action: <code>{_e(turn.action or '∅')}</code></span> <span class="badge">reward {_e(turn.reward)}</span>
    {oracle_html}</div>
  <details class="state"><summary>state it acted on</summary><pre>{_e(_state_text(traj, position))}</pre></details>
  {_response_html(turn, credit)}
  <details class="obs"><summary>observation after</summary><pre>{_e(turn.observation)}</pre></details>
  {numbers}
</div>"""


def _traj_html(data: StepData, traj: Trajectory) -> str:
    line = data.credit.get(traj.traj_id, {})
    turn_credit = [data.credit_of_turn(traj.traj_id, t.index) for t in traj.turns]
    prior = next((c.get("prior") for c in turn_credit if c.get("prior") is not None), None)
    spark = _sparkline(prior, [c["belief"] for c in turn_credit if "belief" in c])
    estimator = line.get("estimator", "")
    seq_adv = line.get("seq_advantage")
    reward = line.get("reward", traj.total_reward)
    turns = "".join(_turn_html(data, traj, i, t) for i, t in enumerate(traj.turns))
    attrs = (f'data-won="{int(traj.won)}" data-estimator="{_e(estimator)}" data-task-type="{_e(traj.task_type)}" '
             f'data-traj-id="{_e(traj.traj_id)}" data-reward="{_e(reward if reward is not None else 0)}" '
             f'data-seq-adv="{_e(seq_adv if seq_adv is not None else 0)}" data-turns="{_e(traj.num_turns)}"')
    error = f'<span class="badge bad">error: {_e(traj.error)}</span>' if traj.error else ""
    return f"""
<section class="traj {'won' if traj.won else 'lost'}" {attrs}>
  <details open><summary class="traj-head"><b>trajectory {_e(traj.traj_id)}</b>
    <span class="badge {'ok' if traj.won else 'bad'}">{'won' if traj.won else 'lost'}</span>
    <span class="badge">{_e(traj.num_turns)} turns</span> <span class="badge">reward {_e(_fmt(reward))}</span>
    <span class="badge" data-key="seq_advantage">A_seq {_e(_fmt(seq_adv))}</span>
    {f'<span class="badge">{_e(estimator)}</span>' if estimator else ''} {error} {spark}</summary>
  {turns}
  </details>
</section>"""


def _options(values: Sequence[str]) -> str:
    return "".join(f'<option value="{_e(v)}">{_e(v or "(none)")}</option>' for v in sorted(set(values)))


def render_html(data: StepData) -> str:
    """The whole page as one string (self-contained: inline CSS, JS and SVG)."""
    trajs = data.trajectories
    groups = groups_of(trajs)
    won = summarize(trajs).successes
    estimators = sorted({str(line.get("estimator", "")) for line in data.credit.values()} - {""})
    sections = []
    for group_id, members in sorted(groups.items()):
        first = members[0]
        rate = summarize(members).success_rate
        body = "".join(_traj_html(data, t) for t in members)
        # the teacher's privileged hint (teacher.context=hint): what the evidence was conditioned on
        hint = (f'\n  <p class="hint"><b>teacher hint:</b> {_e(first.privileged_hint)}</p>'
                if first.privileged_hint else "")
        sections.append(f"""
<article class="group" data-group-id="{_e(group_id)}">
  <h2>group {_e(group_id)} · {_e(first.task_type or 'task')} · <code>{_e(first.task_id)}</code>
    <span class="badge">success {rate:.2f}</span></h2>
  <p class="task">{_e(first.task_text)}</p>{hint}
  <div class="trajs">{body}</div>
</article>""")
    title = f"credit inspector · {data.run_dir.name} · step {data.step}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{_CSS}</style></head>
<body>
<header><h1>{_e(title)}</h1>
<p id="summary">{len(trajs)} trajectories in {len(groups)} groups · {won} won ·
estimator {_e(', '.join(estimators) or 'unknown (no credit file)')} · run <code>{_e(data.run_dir)}</code></p>
<form id="controls" onsubmit="return false">
  <label>outcome <select id="f-outcome"><option value="">all</option><option value="1">won</option>
    <option value="0">lost</option></select></label>
  <label>estimator <select id="f-estimator"><option value="">all</option>{_options(estimators)}</select></label>
  <label>task type <select id="f-task"><option value="">all</option>{_options([t.task_type for t in trajs])}</select></label>
  <label>sort <select id="sort"><option value="trajId">trajectory id</option>
    <option value="seqAdv">A_seq, high first</option><option value="reward">reward, high first</option>
    <option value="turns">turns, most first</option></select></label>
  <span id="shown"></span>
</form>
<p class="legend">response tokens: <span class="tok" style="{_gap_style(1, 1)}">teacher &gt; student</span>
  <span class="tok" style="{_gap_style(-1, 1)}">teacher &lt; student</span> (when the gaps were saved) ·
  sparkline: belief B_0 … B_K on [0, 1], dashed at B_0</p>
</header>
<main>{''.join(sections)}</main>
<script>{_JS}</script>
</body></html>
"""


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#fff;border-bottom:1px solid #dde;padding:10px 18px;position:sticky;top:0;z-index:2}
h1{font-size:18px;margin:0 0 4px}h2{font-size:15px;margin:0 0 4px}
main{padding:12px 18px}.group{background:#fff;border:1px solid #dde;border-radius:6px;margin:0 0 14px;padding:10px}
.traj{border-left:4px solid #c33;margin:8px 0 8px 6px;padding:2px 8px}.traj.won{border-color:#2a7}
.traj-head{cursor:pointer}.turn{border-top:1px dashed #ccd;padding:6px 0 6px 10px}
.badge{display:inline-block;background:#eef;border-radius:3px;padding:0 5px;margin:0 2px;font-size:12px}
.badge.ok{background:#dfd}.badge.bad{background:#fdd}.badge.oracle{background:#ffe9b3}
pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;font:12px/1.45 ui-monospace,monospace}
.response{background:#fafaff;border:1px solid #e3e3f0;padding:4px}.tok{border-radius:2px}
table.credit{border-collapse:collapse;font:12px ui-monospace,monospace}
table.credit td,table.credit th{border:1px solid #dde;padding:1px 6px;text-align:right}
.spark{vertical-align:middle;margin-left:8px}.spark polyline{fill:none;stroke:#36c;stroke-width:1.5}
.spark circle{fill:#36c}.spark line.prior{stroke:#999;stroke-dasharray:3 3}
.muted{color:#889}.task{color:#445;margin:0 0 4px}label{margin-right:12px}#shown{color:#556}
.hidden{display:none}
"""

_JS = """
(function () {
  'use strict';
  var controls = ['f-outcome', 'f-estimator', 'f-task', 'sort'].map(function (id) { return document.getElementById(id); });
  var keys = {trajId: ['trajId', 1], seqAdv: ['seqAdv', -1], reward: ['reward', -1], turns: ['turns', -1]};
  function apply() {
    var outcome = controls[0].value, estimator = controls[1].value, task = controls[2].value;
    var sortKey = keys[controls[3].value] || keys.trajId, shown = 0, total = 0;
    document.querySelectorAll('.group').forEach(function (group) {
      var box = group.querySelector('.trajs');
      var trajs = Array.prototype.slice.call(box.querySelectorAll('.traj'));
      var visible = 0;
      trajs.forEach(function (t) {
        var ok = (!outcome || t.dataset.won === outcome) && (!estimator || t.dataset.estimator === estimator) &&
                 (!task || t.dataset.taskType === task);
        t.classList.toggle('hidden', !ok);
        total += 1; if (ok) { visible += 1; shown += 1; }
      });
      trajs.sort(function (a, b) {
        var d = (parseFloat(a.dataset[sortKey[0]]) - parseFloat(b.dataset[sortKey[0]])) * sortKey[1];
        return d || (parseFloat(a.dataset.trajId) - parseFloat(b.dataset.trajId));
      }).forEach(function (t) { box.appendChild(t); });
      group.classList.toggle('hidden', visible === 0);
    });
    document.getElementById('shown').textContent = shown + ' of ' + total + ' trajectories shown';
  }
  controls.forEach(function (c) { c.addEventListener('change', apply); });
  apply();
})();
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentgym_opsd.inspector", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a training run's output folder (trainer.output_dir)")
    parser.add_argument("--step", type=int, default=None, help="RL step to show (default: the last saved)")
    parser.add_argument("--out", type=Path, default=None, help="HTML file to write (default RUN_DIR/credit/step_N.html); "
                                                               "its folder must exist, and a file there is refused "
                                                               "unless --force")
    parser.add_argument("--force", action="store_true", help="replace the (regular) file at --out")
    args = parser.parse_args(argv)
    try:
        data = load_step(args.run_dir, args.step)
        own = args.out is None  # the run's own page of that step, written again
        out = check_output_file(args.out or args.run_dir / "credit" / f"step_{data.step:06d}.html",
                                force=args.force, own=own)
        atomic_write_text(out, render_html(data))  # all or nothing: a failed write leaves no (empty) page
    except (InspectError, ValueError, OSError) as exc:  # ValueError: also a text that cannot be encoded, OutputRefused
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({len(data.trajectories)} trajectories, step {data.step})")
    return 0
