"""The study's run plan and pairing (`benchmarks/bench_study.py`): `--eval-episodes` makes new arms beside the
48-episode ones (never their names or before run), and every arm pairs with the GRPO arm of its warm start and
evaluation."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study():
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT / "benchmarks"))  # bench_study imports its siblings as a script does
        spec = importlib.util.spec_from_file_location("bench_study", ROOT / "benchmarks" / "bench_study.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def test_the_default_plan_keeps_the_names_of_the_finished_runs(study):
    specs = study.study_specs(["webshop"], {"webshop": (0, 1)}, 10)
    names = {s.name for s in specs}
    assert {"webshop/grpo/seed0", "webshop/agentopsd-hint/seed1"} <= names
    assert {s.before.name for s in specs} == {"cpu-small-webshop"}
    assert all("trainer.eval_episodes=48" in s.before.overrides for s in specs)
    finished = {str(p.relative_to(study.STUDY).with_suffix("")) for p in study.STUDY.rglob("seed*.json")}
    assert {"webshop/grpo/seed0", "webshop/grpo/seed1", "webshop/agentopsd-hint/seed0"} <= finished


def test_eval_episodes_makes_its_own_arms_and_before_run(study):
    specs = study.study_specs(["webshop"], {"webshop": (0, 1, 2)}, 10, eval_episodes=96, arms=["grpo", "agentopsd-hint"])
    assert [s.name for s in specs] == [f"webshop/{arm}-eval96/seed{seed}" for seed in (0, 1, 2)
                                       for arm in ("grpo", "agentopsd-hint")]
    assert {s.before.name for s in specs} == {"cpu-small-webshop-eval96"}
    assert all("trainer.eval_episodes=96" in s.before.overrides for s in specs)
    assert all(s.labels["eval_episodes"] == 96 and s.labels["arm"].endswith("-eval96") for s in specs)
    hint = next(s for s in specs if s.labels["arm"] == "agentopsd-hint-eval96")
    assert "teacher.context=hint" in hint.overrides and "trainer.total_steps=10" in hint.overrides
    with pytest.raises(ValueError, match="--eval-episodes"):
        study.study_specs(["webshop"], {"webshop": (0,)}, 10, eval_episodes=0)


@pytest.mark.parametrize(("arm", "baseline"), [
    ("agentopsd", "grpo"), ("grpo", "grpo"), ("agentopsd-hint-eval96", "grpo-eval96"),
    ("agentopsd-hint-no-action-history", "grpo-no-action-history"), ("grpo-lr5e-5", "grpo"),
    ("agentopsd-oracle@epyc-f26", "grpo@epyc-f26"), ("agentopsd-hint-eval96@bf16", "grpo-eval96@bf16"),
])
def test_each_arm_pairs_with_the_grpo_arm_of_its_evaluation(study, arm, baseline):
    assert study.baseline_arm(arm) == baseline


def test_a_tagged_batch_has_its_own_arms_and_before_run(study):
    specs = study.study_specs(["alfworld"], {"alfworld": (0, 1)}, 0, arms=["grpo", "agentopsd-oracle"], batch="f26")
    assert [s.name for s in specs] == [f"alfworld/{arm}@f26/seed{seed}" for seed in (0, 1)
                                       for arm in ("grpo", "agentopsd-oracle")]
    assert {s.before.name for s in specs} == {"cpu-small@f26"}
    assert all(s.labels["batch"] == "f26" and "eval_episodes" not in s.labels for s in specs)
    assert "algorithm.estimator=agentopsd-oracle" in specs[1].overrides
    with pytest.raises(ValueError, match="--tag"):
        study.study_specs(["alfworld"], {"alfworld": (0,)}, 0, batch="a/b")


def _run(arm: str, seed: int, wins: int, episodes: int, before: str) -> dict:
    rate = {"success": wins / episodes, "episodes": episodes, "invalid_action_rate": 0.0}
    return {"labels": {"env": "webshop", "arm": arm, "seed": seed}, "before_run": before,
            "overrides": [f"algorithm.estimator={'grpo' if arm.startswith('grpo') else 'agentopsd'}"],
            "before": {"valid": rate, "pool": rate}, "after": {"valid": rate, "pool": rate},
            "rl_minutes": 1.0, "failed_rows": 0, "failed_rows_positive": 0, "credit_auc": None}


def test_summary_pairs_only_within_a_before_run(study):
    results = [_run("grpo", s, 15 + s, 48, "cpu-small-webshop") for s in (0, 1)]
    results += [_run("agentopsd-hint", 0, 20, 48, "cpu-small-webshop")]
    results += [_run("grpo-eval96", s, 30 + 2 * s, 96, "cpu-small-webshop-eval96") for s in (0, 1, 2)]
    results += [_run("agentopsd-hint-eval96", s, 40 + s, 96, "cpu-small-webshop-eval96") for s in (0, 1, 2)]
    table = study.summarize(results)
    old, new = table["webshop/agentopsd-hint"], table["webshop/agentopsd-hint-eval96"]
    assert old["baseline"] == "webshop/grpo" and old["paired"]["valid"]["seeds"] == [0]
    assert old["paired"]["valid"]["spread_source"] == "baseline seeds × √2"  # the 48-episode GRPO seeds only
    assert new["baseline"] == "webshop/grpo-eval96" and new["paired"]["valid"]["seeds"] == [0, 1, 2]
    assert new["paired"]["valid"]["episodes"] == 96 and new["paired"]["valid"]["method"] == "t over seeds"
    assert new["paired"]["valid"]["per_seed"] == pytest.approx([(10 - s) / 96 for s in (0, 1, 2)])
    assert new["teacher"] and not table["webshop/grpo-eval96"]["teacher"]
    assert table["webshop/grpo"]["paired"] is None
