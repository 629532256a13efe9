"""One rule for success and invalid rates (`records.summarize`): an episode that ended with an error counts as
a failure, and is reported on its own, the same in a training step, validation, the pool check and evaluation."""

from __future__ import annotations

import contextlib
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentgym_opsd.evaluation import runner as eval_runner
from agentgym_opsd.evaluation.metrics import group_stats
from agentgym_opsd.records import Trajectory, Turn, summarize
from agentgym_opsd.trainer.config import load_config
from agentgym_opsd.trainer.turn_batch import build_turn_batch
from agentgym_opsd.trainer.validation import Validation


def _traj(traj_id: int, *, won: bool, invalid: int = 0, error: str | None = None) -> Trajectory:
    t = Trajectory(env_id="ToyCounter-v0", task_id=f"t{traj_id // 2}", task_type="count", group_id=traj_id // 2,
                   traj_id=traj_id, seed=traj_id, won=won, score=float(won), error=error)
    t.turns = [Turn(index=i, prompt=[], response_text="", action="a", action_valid=i >= invalid, observation="",
                    reward=0.0) for i in range(2)]
    return t


# won, lost, an errored episode whose env still said "won" (it is a failure all the same), lost with 1 invalid
EPISODES = [_traj(0, won=True), _traj(1, won=False), _traj(2, won=True, error="env crashed"),
            _traj(3, won=False, invalid=1)]


def test_summarize_counts_an_errored_episode_as_a_failure_and_reports_it() -> None:
    s = summarize(EPISODES)
    assert (s.episodes, s.successes, s.errors, s.turns, s.invalid_actions) == (4, 1, 1, 8, 1)
    assert s.success_rate == 0.25 and s.score_mean == 0.25 and s.invalid_action_rate == 1 / 8


class _Runner:
    """A training environment's runner that plays EPISODES (the pool check's only use of it)."""

    pool = SimpleNamespace(num_envs=4)

    def run(self, policy, tasks, *, group_size, first_group_id, first_traj_id, progress=False):
        return list(EPISODES)

    def close(self) -> None:
        pass


def test_an_errored_episode_counts_the_same_in_training_validation_pool_and_evaluation(
        toy_env_ids, monkeypatch) -> None:
    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", "env.val_id=ToyCounter-v0:test", "env.num_train_tasks=2",
                                   "trainer.eval_pool_rollouts=2", "trainer.eval_episodes=4"])
    evaluated = eval_runner.summarize("ToyCounter-v0:test", EPISODES)
    monkeypatch.setattr(eval_runner, "evaluate_policy", lambda policy, spec, **_: evaluated)
    validation = Validation(cfg, {"ToyCounter-v0": _Runner()}, lambda spec, n: _Runner(), contextlib.nullcontext)
    val, pool = validation.held_out(policy=None), validation.pool(policy=None)
    step = build_turn_batch(EPISODES, encode_prompt=lambda m: [1], invalid_penalty=0.1).stats
    stats = group_stats(EPISODES)

    for success, errors, invalid in [
        (step["success_rate"], step["env_errors"], step["invalid_action_rate"]),
        (val["val/success_rate"], val["val/env_errors"], val["val/invalid_action_rate"]),
        (pool["pool/success_rate"], pool["pool/env_errors"], pool["pool/invalid_action_rate"]),
        (evaluated.success_rate, evaluated.failed_episodes, evaluated.invalid_action_rate),
        (stats.success_rate, stats.failed_episodes, stats.invalid_action_rate),
    ]:
        assert math.isclose(success, 0.25) and errors == 1 and math.isclose(invalid, 1 / 8)
    assert val["val/episodes"] == pool["pool/episodes"] == evaluated.episodes == 4
    assert val["val/ToyCounter-v0:test/success_rate"] == pytest.approx(0.25)


# ---- no hand-written copy of the rule ------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("agentgym_opsd", "environments", "models", "trainer", "evaluation", "benchmarks", "examples")
HAND_COUNTS = (
    re.compile(r"\b(sum|len|mean|fmean|count_nonzero)\([^\n]*\.won\b"),  # sum(t.won for t in trajs) / ...
    re.compile(r"\.won\b[^\n]*\berror is None"),  # the success rule itself, rewritten
    re.compile(r"\b(for|if) [^\n]*\.won\b[^\n]*\)\s*/"),  # [... if t.won]) / n
)


def hand_written_counts(text: str) -> list[str]:
    """The lines of `text` that count successes by hand instead of through `summarize`."""
    return [line.strip() for line in text.splitlines() if any(p.search(line) for p in HAND_COUNTS)]


@pytest.mark.parametrize("line", ["won = sum(t.won for t in trajs)", "rate = sum(bool(t.won) for t in g) / len(g)",
                                  "ok = bool(t.won) and t.error is None", "len([t for t in trajs if t.won]) / n"])
def test_the_scan_finds_a_hand_written_count(line: str) -> None:
    assert hand_written_counts(line) == [line]


def test_no_success_count_is_written_by_hand_outside_summarize() -> None:
    """Every success count and rate goes through `records.summarize` (or `Trajectory.succeeded` for one
    episode): a copy would disagree the day an errored episode says it won."""
    offences = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "agentgym_opsd" / "records.py" or ".venv" in path.parts:
                continue
            offences += [f"{path.relative_to(ROOT)}: {line}" for line in hand_written_counts(path.read_text("utf-8"))]
    assert not offences, "count successes with records.summarize:\n" + "\n".join(offences)
