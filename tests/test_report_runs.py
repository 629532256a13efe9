"""benchmarks/report_runs.py: a finished run's before (its own step-0 validation) and after, episode by episode,
its credit checks and its penalty settings, from its folder; a run that has not finished is refused."""

from __future__ import annotations

import json

import pytest
from benchmark_scripts import load_benchmark

from agentgym_opsd.records import Trajectory, Turn

rr = load_benchmark("report_runs")


def _won_with_an_invalid_turn() -> Trajectory:
    turns = [Turn(index=i, prompt=[{"role": "user", "content": "look"}], response_text="x", action="go",
                  action_valid=ok, observation="room", reward=float(i == 1), response_token_ids=[5],
                  response_logprobs=[-1.0]) for i, ok in enumerate((True, False))]
    return Trajectory(env_id="toy", task_id="t0", task_type="", group_id=0, traj_id=1, seed=0, won=True, turns=turns)


def _run(folder, *, finished: bool = True) -> None:
    folder.mkdir()
    lines = [{"step": 0, "val/success_rate": 0.5, "val/episodes": 2.0, "val/invalid_action_rate": 0.1}]
    if finished:
        lines += [{"step": 1, "seconds_update": 1.0, "seconds_rollout": 2.0, "success_rate": 0.5},
                  {"step": 1, "val/success_rate": 0.5, "val/episodes": 2.0, "val/invalid_action_rate": 0.3}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "validation").mkdir()
    for step, wins in ((0, (True, False)), (1, (False, True))):
        (folder / "validation" / f"step_{step:06d}.jsonl").write_text("".join(
            json.dumps({"env_spec": "toy", "seed": 10_000 + i, "task_id": f"t{i}", "task_type": "", "won": won,
                        "score": float(won), "turns": 3, "invalid_actions": 0, "error": None}) + "\n"
            for i, won in enumerate(wins)))
    (folder / "config.yaml").write_text("trainer: {seed: 3}\nalgorithm: {penalty_mode: outcome, kl_coef: 0.0}\n")
    for name, line in (("credit", {"traj_id": 1, "won": True, "group_id": 0, "reward": 1.0,
                                    "seq_advantage": 0.5,
                                    "turns": [{"turn": 0, "advantage": 0.5}, {"turn": 1, "advantage": 0.4}]}),
                       ("trajectories", _won_with_an_invalid_turn().to_dict())):
        (folder / name).mkdir()
        (folder / name / "step_000001.jsonl").write_text(json.dumps(line) + "\n")


def test_a_finished_run_is_reported_against_its_own_start(tmp_path) -> None:
    _run(tmp_path / "a")
    rr.main(["--run", "seed 3", str(tmp_path / "a"), "--results", str(tmp_path / "out.json")])
    run = json.loads((tmp_path / "out.json").read_text())["runs"]["seed 3"]
    assert run["trainer_seed"] == 3 and run["penalty_mode"] == "outcome"
    assert run["penalised_turns_gain"] is True  # a config from before the option: invalid turns could gain
    assert run["before"]["valid"]["invalid_action_rate"] == 0.1 and run["after"]["valid"]["invalid_action_rate"] == 0.3
    assert (run["valid_paired"]["first_only"], run["valid_paired"]["second_only"]) == (1, 1)
    assert (run["invalid_rows"], run["invalid_rows_positive"]) == (1, 1)


def test_a_run_without_an_after_validation_is_refused(tmp_path) -> None:
    _run(tmp_path / "b", finished=False)
    with pytest.raises(SystemExit, match="not finished"):
        rr.main(["--run", "b", str(tmp_path / "b"), "--results", str(tmp_path / "out.json")])


def test_runs_are_pooled_episode_by_episode(tmp_path) -> None:
    """Two runs, each 1 held-out episode lost and 1 gained: pooled 2 and 2 (McNemar p 1), no mean change, no fall."""
    _run(tmp_path / "a")
    _run(tmp_path / "b")
    rr.main(["--run", "a", str(tmp_path / "a"), "--run", "b", str(tmp_path / "b"),
             "--results", str(tmp_path / "out.json")])
    pooled = json.loads((tmp_path / "out.json").read_text())["pooled"]
    assert (pooled["runs"], pooled["paired_runs"], pooled["episodes"]) == (2, 2, 4)
    assert (pooled["first_only"], pooled["second_only"], pooled["mcnemar_p"]) == (2, 2, 1.0)
    assert pooled["valid_change_mean"] == 0.0 and pooled["valid_fell"] == 0


def _evaluation(folder, wins_by_draw) -> None:
    """An evaluation-only run: the games t0, t1, ... played once per draw, in the same order each draw."""
    (folder / "validation").mkdir(parents=True)
    lines = [{"env_spec": "toy", "seed": 10_000 + k * len(wins) + i, "task_id": f"t{i}", "task_type": "",
              "won": won, "score": float(won), "turns": 3, "invalid_actions": 0, "error": None}
             for k, wins in enumerate(wins_by_draw) for i, won in enumerate(wins)]
    (folder / "validation" / "step_000000.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_replay_pairs_two_evaluations_per_episode_and_per_game(tmp_path) -> None:
    """Three games, two draws each. Before: t0 won twice, t1 once (draw 0), t2 never; after: t0 once, t1 twice,
    t2 once. Draw 1 of BEFORE turned t1 from won to lost: the flip the sampler alone gives."""
    _evaluation(tmp_path / "before", [(True, True, False), (True, False, False)])
    _evaluation(tmp_path / "after", [(False, True, False), (True, True, True)])
    rr.main(["--replay", "seed 0", str(tmp_path / "before"), str(tmp_path / "after"),
             "--results", str(tmp_path / "out.json")])
    r = json.loads((tmp_path / "out.json").read_text())["replays"]["seed 0"]
    assert (r["games"], r["draws"]) == (3, 2)
    assert (r["before_success"], r["after_success"]) == (pytest.approx(3 / 6), pytest.approx(4 / 6))
    assert (r["valid_paired"]["second_only"], r["valid_paired"]["first_only"]) == (2, 1)  # per reset seed
    assert (r["games_better"], r["games_worse"]) == (2, 1)
    assert r["before_draw_flips"] == [{"draws": [0, 1], "games": 3, "gained": 0, "lost": 1}]
    pooled = json.loads((tmp_path / "out.json").read_text())["pooled"]
    assert (pooled["pairs"], pooled["gained"], pooled["lost"], pooled["fell"]) == (1, 2, 1, 0)
    assert pooled["change_mean"] == pytest.approx(1 / 6) and pooled["draw_flips_mean"] == 1


def test_runs_and_replays_are_not_mixed(tmp_path) -> None:
    with pytest.raises(SystemExit):
        rr.main(["--results", str(tmp_path / "out.json")])


@pytest.mark.parametrize(("mode", "ratio"), [("token-mean", 2.0), ("seq-mean-token-mean", 1.0)])
def test_push_balance_weighs_the_tokens_as_the_runs_loss_did(tmp_path, mode, ratio) -> None:
    # A won rollout of 2 turns and a lost one of 4, 5 tokens a turn, advantages +1 and -1: token-mean pushes the
    # lost rollout's 20 tokens down against the won one's 10 up; seq-mean-token-mean weighs the two alike.
    experiments = load_benchmark("experiments")
    run = tmp_path / "run"
    for name in ("credit", "trajectories"):
        (run / name).mkdir(parents=True)
    (run / "config.yaml").write_text(f"algorithm: {{loss_agg_mode: {mode}}}\n")
    credit, saved = [], []
    for traj_id, (won, turns) in enumerate(((True, 2), (False, 4))):
        credit.append({"traj_id": traj_id, "won": won, "group_id": 0,
                       "turns": [{"turn": i, "advantage": 1.0 if won else -1.0} for i in range(turns)]})
        saved.append({"traj_id": traj_id, "turns": [{"response_token_ids": [7] * 5} for _ in range(turns)]})
    for name, lines in (("credit", credit), ("trajectories", saved)):
        (run / name / "step_000001.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert experiments.push_balance(run) == {"push_down_over_up": [ratio]}
