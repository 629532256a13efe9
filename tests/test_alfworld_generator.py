"""The ALFWorld game generator: solvable games of all six types, ALFWorld's layout, ALFWorld's own loader."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("textworld")
pytest.importorskip("alfworld")

from agentgym_opsd.environments.alfworld.generate import main as generate_main  # noqa: E402
from agentgym_opsd.environments.alfworld.generator import GameGenerator, Horizon, layout, write_game  # noqa: E402
from agentgym_opsd.environments.alfworld.names import display_names, position_id, sink_id  # noqa: E402
from agentgym_opsd.environments.alfworld.splits import BUILTIN_SPLITS  # noqa: E402
from agentgym_opsd.environments.alfworld.vocabulary import (  # noqa: E402
    SCENE_NUMBERS_SEEN,
    SCENE_NUMBERS_UNSEEN,
    TASK_TYPES,
)


@pytest.fixture(scope="module")
def generator():
    return GameGenerator()


def test_names_read_like_alfworld():
    ids = [position_id("Cabinet", (0.5, 1.0, -1.46)), position_id("Cabinet", (1.5, 1.0, -1.46)),
           sink_id("SinkBasin", (0.1, 0.9, 0.2)), "loc_bar_1_bar_2_bar_3_bar_30"]
    assert ids[0] == "Cabinet_bar__plus_00_dot_50_bar__plus_01_dot_00_bar__minus_01_dot_46"
    names = display_names(i.lower() for i in ids)
    assert sorted(names.values()) == ["cabinet 1", "cabinet 2", "loc 1", "sinkbasin 1"]


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_each_task_type_is_solvable_and_deterministic(generator, task_type):
    game = generator.generate(task_type, 7, Horizon())
    again = GameGenerator().generate(task_type, 7, Horizon()) if task_type == TASK_TYPES[0] else game
    assert game.problem == again.problem and game.walkthrough == again.walkthrough
    assert game.optimal_plan_length == len(game.walkthrough) >= 3
    spec = game.spec
    assert spec.task_type == task_type and spec.goal_sentence
    assert len({r.location for r in spec.receptacles}) == len(spec.receptacles)  # one receptacle per location
    assert spec.agent_location not in {r.location for r in spec.receptacles}
    data = game.traj_data()
    assert data["task_type"] == task_type and data["turk_annotations"]["anns"][0]["task_desc"]
    assert data["pddl_params"]["object_target"] == spec.object_target


def test_horizon_controls_size(generator):
    small = [generator.generate("pick_and_place_simple", s, Horizon((3, 3), (0, 0))) for s in range(3)]
    large = [generator.generate("pick_and_place_simple", s, Horizon((14, 14), (8, 8))) for s in range(3)]
    assert all(len(g.spec.receptacles) == 3 and g.spec.num_distractors == 0 for g in small)
    assert all(len(g.spec.receptacles) == 14 and g.spec.num_distractors == 8 for g in large)
    capped = generator.generate("pick_two_obj_and_place", 1, Horizon((3, 5), (0, 2), False, 8))
    assert capped.optimal_plan_length <= 8


def test_layouts_depend_on_scene_only():
    assert layout("Kitchen", 9, 8) == layout("Kitchen", 9, 8)
    assert layout("Kitchen", 9, 8) != layout("Kitchen", 10, 8)
    assert not set(SCENE_NUMBERS_SEEN) & set(SCENE_NUMBERS_UNSEEN)
    assert BUILTIN_SPLITS["valid_unseen"].scene_numbers == SCENE_NUMBERS_UNSEEN
    assert BUILTIN_SPLITS["train"].scene_numbers == SCENE_NUMBERS_SEEN


def test_cli_writes_alfworld_layout(tmp_path):
    assert generate_main(["--out", str(tmp_path), "--per-type", "1", "--seed", "5", "--split", "valid_seen"]) == 0
    trials = sorted((tmp_path / "json_2.1.1" / "valid_seen").glob("*/trial_*"))
    assert len(trials) == 6
    assert {t.parent.name.split("-")[0] for t in trials} == set(TASK_TYPES)
    for trial in trials:
        game = json.loads((trial / "game.tw-pddl").read_text())
        assert set(game) >= {"pddl_domain", "grammar", "pddl_problem", "solvable"} and game["solvable"] is True
        assert "UNKNOWN GOAL" not in game["grammar"]
        assert json.loads((trial / "traj_data.json").read_text())["agentgym"]["optimal_plan_length"] > 0


@pytest.mark.parametrize("split", ["../../x", "a/b", "..", "/tmp/evil", ""])
def test_split_names_are_names_not_paths(tmp_path, capsys, split):
    out = tmp_path / "data"
    with pytest.raises(SystemExit) as exit_:
        generate_main(["--out", str(out), "--per-type", "1", "--split", split])
    assert exit_.value.code == 2 and "plain name" in capsys.readouterr().err
    assert list(tmp_path.rglob("*")) == []  # nothing written anywhere
    with pytest.raises(ValueError, match="plain name"):
        write_game(GameGenerator().generate("pick_and_place_simple", "k", Horizon()), out, split)


def _alfworld_config(data_path: str) -> dict:
    return {
        "env": {"goal_desc_human_anns_prob": 0, "task_types": [1, 2, 3, 4, 5, 6], "expert_type": "handcoded",
                "domain_randomization": False},
        "dataset": {"data_path": data_path, "eval_id_data_path": data_path, "eval_ood_data_path": data_path,
                    "num_train_games": -1, "num_eval_games": -1},
        "general": {"training_method": "dqn"},
        "rl": {"training": {"max_nb_steps_per_episode": 50}},
    }


def test_alfworlds_own_loader_plays_generated_games(tmp_path):
    """ALFWorld's AlfredTWEnv collects our folders and its TextWorld env wins them with our walkthroughs."""
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    generate_main(["--out", str(tmp_path), "--per-type", "1", "--seed", "11", "--split", "valid_seen"])
    data_path = str(tmp_path / "json_2.1.1" / "valid_seen")
    alfred = AlfredTWEnv(_alfworld_config(data_path), train_eval="eval_in_distribution")
    assert alfred.num_games == 6
    env = alfred.init_env(batch_size=1)
    try:
        for _ in range(6):
            obs, infos = env.reset()
            game_path = infos["extra.gamefile"][0]
            walkthrough = json.loads(open(game_path).read())["walkthrough"]
            assert obs[0].startswith("-= Welcome to TextWorld, ALFRED! =-")
            for command in walkthrough:
                assert command in infos["admissible_commands"][0]
                obs, _, dones, infos = env.step([command])
            assert infos["won"][0] and dones[0]
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("split", sorted(BUILTIN_SPLITS))
def test_oracle_wins_every_game_of_every_split(split, tmp_path_factory):
    from agentgym_opsd.environments.alfworld.env import ALFWorldEnv

    os.environ.setdefault("AGENTGYM_OPSD_CACHE", str(tmp_path_factory.mktemp("cache")))
    env = ALFWorldEnv(split=split)
    for index in range(env.num_tasks):
        _, info = env.reset(options={"task_index": index})
        if index % 8 == 0:  # the oracle starts from the stored walkthrough: it must be the planner's plan
            assert env.engine.plan() == list(env.engine.walkthrough), (split, index)
        plan_length, turns, done = info["optimal_plan_length"], 0, False
        while not done:
            _, _, terminated, truncated, info = env.step(env.oracle_action())
            turns, done = turns + 1, terminated or truncated
        assert info["won"] and turns == plan_length, (split, index)
        if split == "easy":
            assert plan_length <= 8
