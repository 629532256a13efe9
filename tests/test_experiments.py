"""The resumable experiment runner (`benchmarks/experiments.py`) on cpu-tiny: one shared before run, one result
file per run, and a second call that redoes nothing that finished."""

from __future__ import annotations

import json

import pytest
from benchmark_scripts import load_benchmark

experiments = load_benchmark("experiments")

TINY = ("env.max_turns=2", "env.num_train_tasks=2", "trainer.eval_episodes=2", "trainer.eval_pool_rollouts=1",
        "trainer.backend=torch", "trainer.tensorboard=false", "trainer.save_every=0")


@pytest.mark.timeout(900)
def test_runs_once_shares_the_before_and_skips_finished_runs(tmp_path, monkeypatch) -> None:
    pytest.importorskip("textworld")
    before = experiments.BeforeSpec("tiny", "cpu-tiny", TINY)
    specs = [experiments.RunSpec(f"{est}/seed0", before, (f"algorithm.estimator={est}", "trainer.total_steps=1",
                                               "trainer.eval_every=1"), {"estimator": est, "seed": 0})
             for est in ("grpo", "agentopsd")]
    runner = experiments.ExperimentRunner(tmp_path / "runs", tmp_path / "results", parallel=2, cores=2, poll_s=0.5)
    started = []
    real_start = runner._start

    def spy(run_dir, *args, **kwargs):
        started.append(run_dir.relative_to(tmp_path / "runs").as_posix())
        return real_start(run_dir, *args, **kwargs)

    monkeypatch.setattr(runner, "_start", spy)
    assert runner.run(specs) == []
    assert sorted(started) == ["agentopsd/seed0", "before/tiny", "grpo/seed0"]
    results = experiments.load_results(tmp_path / "results")
    assert [r["name"] for r in results] == ["agentopsd/seed0", "grpo/seed0"]
    for r in results:
        assert r["rl_steps"] == 1 and r["labels"]["seed"] == 0
        assert r["before"]["valid"]["episodes"] == 2 and len(r["after"]["valid"]["ci"]) == 2
        assert r["before"]["pool"]["success"] is not None and r["after"]["pool"]["success"] is not None
        assert r["failed_rows_positive"] == 0  # the cpu-tiny recipe never rewards a lost rollout either
        # where and how it computed: `auto` settings as the run resolved them (2 episodes never pay for vLLM)
        assert r["dtype"] in ("fp32", "bf16-mixed") and r["rollout_backend"] == "hf" and r["cpu"]
    # a second call finds every result file: nothing starts again, not even the before run
    started.clear()
    assert runner.run(specs) == [] and started == []
    assert runner.pending(specs) == []
    # a lost result file means that run (only) is done again, resuming from the run's own folder
    (tmp_path / "results" / "grpo" / "seed0.json").unlink()
    assert [s.name for s in runner.pending(specs)] == ["grpo/seed0"]


def test_credit_check_counts_positive_rows_of_lost_rollouts(tmp_path) -> None:
    lines = [{"won": False, "group_id": 0, "reward": 0.0,
              "turns": [{"advantage": -0.5}, {"advantage": 0.25}, {"advantage": None}]},
             {"won": True, "group_id": 0, "reward": 1.0, "turns": [{"advantage": 1.0}]}]
    (tmp_path / "credit").mkdir()
    (tmp_path / "credit" / "step_000001.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert experiments.credit_check(tmp_path) == {"failed_rows": 3, "failed_rows_positive": 1}


def test_invalid_credit_check_joins_the_credit_rows_to_the_turns_that_were_invalid(tmp_path) -> None:
    credit = [{"traj_id": 7, "won": True, "turns": [{"advantage": 0.4}, {"advantage": 0.3}, {"advantage": -0.1}]},
              {"traj_id": 8, "won": False, "turns": [{"advantage": -0.6}]}]
    saved = [{"traj_id": 7, "turns": [{"action_valid": True}, {"action_valid": False}, {"action_valid": False}]},
             {"traj_id": 8, "turns": [{"action_valid": False}]}]
    for folder, lines in (("credit", credit), ("trajectories", saved)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "step_000002.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert experiments.invalid_credit_check(tmp_path) == {"invalid_rows": 3, "invalid_rows_positive": 1}
    (tmp_path / "trajectories" / "step_000002.jsonl").unlink()  # no trajectories kept: nothing to join
    assert experiments.invalid_credit_check(tmp_path) == {"invalid_rows": 0, "invalid_rows_positive": 0}


def test_with_a_graded_outcome_only_rollouts_below_their_group_mean_count_as_lost(tmp_path) -> None:
    # a group with scores 0.75, 0.25, 0.5 (none won): only the 0.25 rollout (below the mean 0.5) is lost
    lines = [{"won": False, "group_id": 3, "reward": r, "turns": [{"advantage": a}]}
             for r, a in ((0.75, 0.9), (0.25, 0.1), (0.5, 0.0))]
    (tmp_path / "credit").mkdir()
    (tmp_path / "credit" / "step_000001.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "config.yaml").write_text("env:\n  outcome: score\n")
    assert experiments.credit_check(tmp_path) == {"failed_rows": 1, "failed_rows_positive": 1}
    (tmp_path / "config.yaml").write_text("env:\n  outcome: won\n")  # binary: every rollout not won is lost
    assert experiments.credit_check(tmp_path) == {"failed_rows": 3, "failed_rows_positive": 2}


def test_run_result_keeps_held_out_success_per_task_type(tmp_path) -> None:
    metrics = {"val/success_rate": 0.5, "val/episodes": 4.0, "val/invalid_action_rate": 0.1,
               "val/ALFWorld-v0:easy_valid/pick_two_obj_and_place/success_rate": 0.0,
               "val/ALFWorld-v0:easy_valid/look_at_obj_in_light/success_rate": 1.0,
               "val/ALFWorld-v0:easy_valid/success_rate": 0.5,  # the environment's total, not a task type
               "pool/ALFWorld-v0:easy/x/success_rate": 0.25}  # another prefix
    assert experiments.task_type_success(metrics, "val") == {"look_at_obj_in_light": 1.0, "pick_two_obj_and_place": 0.0}
    run = tmp_path / "run"
    run.mkdir()
    step = {"step": 1, "success_rate": 0.5, "seconds_update": 1.0, **metrics}
    (run / "metrics.jsonl").write_text(json.dumps(step) + "\n")
    result = experiments.run_result(run, before=metrics)
    assert result is not None
    assert result["after"]["valid"]["by_task_type"]["look_at_obj_in_light"] == 1.0
    assert result["before"]["valid"]["by_task_type"]["pick_two_obj_and_place"] == 0.0
    assert result["valid_paired"] is None  # no before run folder given


def test_run_result_pairs_the_held_out_episodes_before_and_after(tmp_path) -> None:
    from agentgym_opsd.trainer.validation import validation_file, write_episode_outcomes

    before_dir, run = tmp_path / "before", tmp_path / "run"
    run.mkdir()
    metrics = {"val/success_rate": 0.5, "val/episodes": 4.0}
    (run / "metrics.jsonl").write_text(json.dumps({"step": 3, "seconds_update": 1.0, **metrics}) + "\n")

    def episodes(wins: list[bool]) -> list[dict]:
        return [{"env_spec": "E", "seed": 10_000 + i, "won": w} for i, w in enumerate(wins)]

    write_episode_outcomes(validation_file(before_dir, 0), episodes([True, True, False, False]))
    write_episode_outcomes(validation_file(run, 3), episodes([True, False, True, True]))
    paired = experiments.run_result(run, before=metrics, before_dir=before_dir)["valid_paired"]
    assert (paired["episodes"], paired["won_both"], paired["first_only"], paired["second_only"], paired["neither"]) \
        == (4, 1, 1, 2, 0)
    assert paired["difference"] == 0.25 and paired["low"] < 0.25 < paired["high"]


class _Done:
    """A finished process, for a stubbed `_start`."""

    returncode = 0

    def wait(self) -> int:
        return 0

    def poll(self) -> int:
        return 0


def _fake_before(run_dir, config: str, overrides) -> None:
    from agentgym_opsd.trainer.config import load_config

    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(load_config(config, list(overrides)).to_yaml(), encoding="utf-8")
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/success_rate": 0.5}) + "\n", encoding="utf-8")


@pytest.mark.parametrize("changed, redone", [("optim.lr=0.5", False), ("rollout.max_new_tokens=7", True),
                                              ("env.max_turns=3", True), ("env.outcome=score", False)])
def test_a_before_run_is_redone_only_when_what_decides_its_numbers_changed(tmp_path, monkeypatch, changed,
                                                                           redone) -> None:
    spec = experiments.BeforeSpec("tiny", "cpu-tiny", TINY)
    runner = experiments.ExperimentRunner(tmp_path / "runs", tmp_path / "results", cores=1)
    old = tmp_path / "runs" / "before" / "tiny"
    _fake_before(old, "cpu-tiny", ["trainer.total_steps=0", "trainer.eval_at_start=true", *TINY, changed])
    started = []

    def fake_start(run_dir, config, overrides, threads, *, resume):
        started.append(run_dir)
        _fake_before(run_dir, config, overrides)
        return _Done()

    monkeypatch.setattr(runner, "_start", fake_start)
    runner.before(spec)
    assert started == ([old] if redone else [])
    aside = old.with_name("tiny.stale-1")
    assert aside.is_dir() == redone  # the old numbers are kept, not deleted
    if redone:
        assert changed.split("=")[0] in experiments.ExperimentRunner._changed_settings(
            aside, "cpu-tiny", ["trainer.total_steps=0", "trainer.eval_at_start=true", *TINY])


def test_a_before_run_saved_with_the_resolved_precision_is_not_stale(tmp_path, monkeypatch) -> None:
    """A run saves `model.precision: auto` resolved (config.yaml says fp32 or bf16-mixed), while the study's spec
    still says auto: the same settings, so the before run is kept, not moved aside and run again."""
    from agentgym_opsd.models.precision import resolve_precision

    spec = experiments.BeforeSpec("tiny", "cpu-tiny", (*TINY, "model.precision=auto"))
    runner = experiments.ExperimentRunner(tmp_path / "runs", tmp_path / "results", cores=1)
    old = tmp_path / "runs" / "before" / "tiny"
    _fake_before(old, "cpu-tiny", ["trainer.total_steps=0", "trainer.eval_at_start=true", *TINY,
                                   f"model.precision={resolve_precision('auto')}"])
    monkeypatch.setattr(runner, "_start", lambda *a, **k: pytest.fail("the before run was started again"))
    assert runner.before(spec)["val/success_rate"] == 0.5
    assert not old.with_name("tiny.stale-1").exists()


def test_a_run_from_another_warm_start_than_its_before_gets_no_result(tmp_path) -> None:
    def folder(name: str, model_dir: str | None):
        d = tmp_path / name
        (d / "warm_start").mkdir(parents=True)
        if model_dir is not None:
            (d / "warm_start" / "summary.json").write_text(json.dumps({"warm_start/model_dir": model_dir}))
        return d

    cache = tmp_path / "cache"
    before = folder("before", str(cache / "aaaa" / "model"))
    assert experiments.same_warm_start(folder("same", str(cache / "aaaa" / "model")), before)
    assert not experiments.same_warm_start(folder("other", str(cache / "bbbb" / "model")), before)
    assert experiments.same_warm_start(folder("none", None), before)  # no warm start (yet): nothing to compare
    # warm_start.cache=off: the before trained its own copy in its folder, so no run can share it
    own = folder("own", None)
    (own / "warm_start" / "summary.json").write_text(json.dumps({"warm_start/model_dir": str(own / "warm_start/model")}))
    assert experiments.same_warm_start(folder("run", str(tmp_path / "run" / "warm_start" / "model")), own)


def test_the_study_pairs_two_arms_of_a_seed_on_their_episodes() -> None:
    study = load_benchmark("bench_study")
    base = {"valid_episodes": [["E", 10_000 + i, i < 4] for i in range(8)]}
    arm = {"valid_episodes": [["E", 10_000 + i, 2 <= i < 7] for i in range(8)]}
    assert study._shared_counts(arm, base) == (2, 3, 2, 1)  # both, arm only, base only, neither
    assert study._shared_counts(arm, {"valid_episodes": None}) is None
