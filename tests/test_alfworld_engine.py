"""The fast engine against TextWorld's own: the cached grammar parses to the same rules, and `AlfredEngine`
plays every state (random walks, not only the expert's path) with the same text, commands and plans as
TextWorld's `PddlEnv` given ALFWorld's names."""

from __future__ import annotations

import concurrent.futures as cf
import glob
import json
import random
from pathlib import Path

import pytest

pytest.importorskip("textworld")
pytest.importorskip("alfworld")

from agentgym_opsd.environments.alfworld.assets import GOAL_PLACEHOLDER, domain_text, grammar_text  # noqa: E402
from agentgym_opsd.environments.alfworld.engine import AlfredEngine  # noqa: E402
from agentgym_opsd.environments.alfworld.grammar import game_logic, goal_of  # noqa: E402
from agentgym_opsd.environments.alfworld.names import display_names  # noqa: E402
from agentgym_opsd.environments.alfworld.splits import BUILTIN_SPLITS, GeneratedSplit  # noqa: E402

FIXTURE_GAMES = sorted(glob.glob(str(Path(__file__).parent / "data" / "alfworld" / "json_2.1.1/*/*/*/game.tw-pddl")))


pytestmark = pytest.mark.usefixtures("fresh_cache_dir")  # generated games go to a private, empty cache


def generated_games(*picks: tuple[str, int]) -> list[str]:
    """`game.tw-pddl` paths of (split, task index) picks (index i has task type TASK_TYPES[i % 6])."""
    return [str(GeneratedSplit(BUILTIN_SPLITS[split]).get(index).game_path) for split, index in picks]


THREE_GAMES = (("easy", 0), ("valid_seen", 1), ("valid_unseen", 2))


def textworld_env(path: str):
    """TextWorld's PddlEnv with ALFWorld's names: the reference AlfredEngine must match."""
    import textworld
    from textworld.envs.pddl.pddl import PddlEnv

    env = PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True))
    env.load(path)
    for pddl_id, name in display_names(env._entity_infos).items():
        env._entity_infos[pddl_id].name = name
    return env


def rules(logic) -> dict[str, str]:
    return {name: repr(rules) for name, rules in logic.grammar._rules.items()}


def actions(logic) -> dict[str, dict]:
    return {name: vars(action) for name, action in logic.actions.items()}


@pytest.mark.parametrize("goal", ["put a clean mug in coffeemachine", "look at #mug# {under} [the] lamp | twice",
                                  'say \\"hi\\" to the mug', "a tab\\there"])
def test_game_logic_parses_like_textworld(goal):
    from textworld.envs.pddl.logic import GameLogic

    grammar = grammar_text().replace(GOAL_PLACEHOLDER, goal)
    fast, reference = game_logic(domain_text(), grammar), GameLogic(domain=domain_text(), grammar=grammar)
    assert rules(fast) == rules(reference) and actions(fast) == actions(reference)
    assert fast.domain == reference.domain
    assert (goal_of(grammar) == goal) == ("\\" not in goal)  # escapes change the text: TextWorld's full parse


def test_foreign_grammar_is_parsed_in_full():
    from textworld.envs.pddl.logic import GameLogic

    grammar = grammar_text().replace(GOAL_PLACEHOLDER, "heat some egg").replace("You arrive at", "You reach")
    assert goal_of(grammar) is None
    assert rules(game_logic(domain_text(), grammar)) == rules(GameLogic(domain=domain_text(), grammar=grammar))


def same(theirs, ours) -> bool:
    return (theirs.feedback, theirs.admissible_commands, bool(theirs.won)) == (
        ours.observation, ours.admissible_commands, ours.won)


def random_walk_matches(path: str, num_steps: int, seed: int, episodes: int = 2) -> None:
    """Both engines take the same random commands (admissible ones, the plan's next step, nonsense); every
    observation, command list, `won` and replanned plan must be equal. A second episode checks that reset
    restores the initial state exactly."""
    rng = random.Random(seed)
    reference, engine = textworld_env(path), AlfredEngine()
    engine.load(path)
    for _ in range(episodes):
        theirs, ours = reference.reset(), engine.reset()
        assert same(theirs, ours), path
        for turn in range(num_steps):
            if turn % 3 == 0:
                plan = engine.plan()
                assert plan == reference._pddl_state.replan(reference._entity_infos), (path, turn)
            command = rng.choice([*ours.admissible_commands, *plan[:1], "jump around", " look "])
            theirs, _, _ = reference.step(command)
            ours = engine.step(command)
            assert same(theirs, ours), (path, command)
    engine.close()


@pytest.mark.skipif(not FIXTURE_GAMES, reason="ALFWorld fixture games not present")
@pytest.mark.parametrize("game", FIXTURE_GAMES, ids=lambda g: Path(g).parts[-3])
def test_engine_plays_fixtures_like_textworld(game):
    random_walk_matches(game, num_steps=8, seed=0)


@pytest.mark.parametrize("index", range(3))
def test_engine_plays_generated_games_like_textworld(index):
    random_walk_matches(generated_games(THREE_GAMES[index])[0], num_steps=8, seed=index)


@pytest.mark.slow
def test_engine_plays_many_generated_games_like_textworld():
    picks = [("valid_seen", i) for i in range(6)] + [("valid_unseen", i) for i in range(3, 6)]
    for seed, path in enumerate(generated_games(*picks)):
        random_walk_matches(path, num_steps=20, seed=seed, episodes=1)


def test_walkthrough_is_the_planners_plan():
    """ALFWorld-v0 takes a generated game's walkthrough as the oracle's plan at reset instead of replanning."""
    engine = AlfredEngine()
    for path in generated_games(*THREE_GAMES):
        engine.load(path)
        engine.reset()
        assert list(engine.walkthrough) == engine.plan() == json.load(open(path))["walkthrough"]


def test_engines_in_threads_play_like_one():
    paths = generated_games(*THREE_GAMES)

    def play(path: str) -> list:
        engine = AlfredEngine()
        engine.load(path)
        states = [engine.reset()]
        states += [engine.step(command) for command in [*engine.plan(), "look"]]
        return states

    alone = [play(path) for path in paths]
    with cf.ThreadPoolExecutor(max_workers=6) as pool:
        together = list(pool.map(play, paths * 2))
    assert together == alone * 2


def test_engine_misuse_raises():
    engine = AlfredEngine()
    with pytest.raises(RuntimeError, match="load"):
        engine.reset()
    engine.load(generated_games(THREE_GAMES[0])[0])
    with pytest.raises(RuntimeError, match="reset"):
        engine.step("look")
    with pytest.raises(ValueError, match="not a game.tw-pddl"):
        engine.load({"pddl_domain": domain_text()})
