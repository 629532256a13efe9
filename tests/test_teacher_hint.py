"""The teacher's privileged hint (`teacher.context`): every environment offers its levels on reset, the rollout
records the chosen one on the trajectory, only the teacher's prompt ever contains it, and the inspector
shows it (escaped)."""

from __future__ import annotations

import pytest
from search_qa_helpers import tiny_search_qa_kwargs
from test_webshop_helpers import SMALL

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.policies import OraclePolicy
from agentgym_opsd.prompts import HINT_HEADER, SKILL_HEADER
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer.config import ConfigError, load_config

CASES = {  # env spec, levels it must offer, the level to record, words the goal hint must contain
    "alfworld": ("agentgym_opsd/ALFWorld-v0:easy", {"goal", "plan"}, "goal", ("in/on",)),
    "webshop": ("agentgym_opsd/WebShop-v0:test", {"goal"}, "goal", ("product to buy", "ASIN")),
    "search_qa": ("agentgym_opsd/SearchQA-v0:test", {"goal", "answer"}, "answer", ("titled", "answer is")),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def played(request, tmp_path_factory):
    name = request.param
    spec, levels, level, words = CASES[name]
    if name == "alfworld":
        pytest.importorskip("textworld")
    kwargs = {"alfworld": {"max_turns": 6}, "webshop": {"num_products": SMALL},
              "search_qa": tiny_search_qa_kwargs(tmp_path_factory.mktemp("sqa")) if name == "search_qa" else {}}[name]
    runner = RolloutRunner(spec, num_envs=2, env_kwargs=kwargs, hint_level=level)
    try:
        hints = runner.pool.reset([TaskSpec(0, {"task_index": 1})], 1)[0].info["privileged_hints"]
        trajs = runner.run(OraclePolicy(), [TaskSpec(0, {"task_index": 1})], group_size=2)
        yield name, runner, hints, levels, level, words, trajs
    finally:
        runner.close()


def test_every_environment_offers_its_documented_levels(played) -> None:
    _, _, hints, levels, _, words, _ = played
    assert set(hints) == levels
    assert all(isinstance(text, str) and text for text in hints.values())
    assert all(word in hints[CASES[played[0]][2]] for word in words)


def test_the_hint_is_recorded_on_the_trajectory_and_survives_jsonl(played, tmp_path) -> None:
    from agentgym_opsd.records import load_jsonl, save_jsonl

    _, _, hints, _, level, _, trajs = played
    assert all(t.privileged_hint == hints[level] for t in trajs)
    assert [t.privileged_hint for t in load_jsonl(save_jsonl(trajs, tmp_path / "t.jsonl"))] == [hints[level]] * 2


def test_only_the_teacher_prompt_sees_the_hint(played) -> None:
    _, runner, hints, _, level, _, trajs = played
    hint = hints[level]
    for traj in trajs:
        assert traj.turns
        for turn in traj.turns:
            student = "\n".join(m["content"] for m in turn.prompt)
            assert hint not in student and HINT_HEADER not in student
            with_hint = runner.teacher_messages(traj, turn, context="hint")
            assert hint in with_hint[0]["content"] and SKILL_HEADER not in with_hint[0]["content"]
            assert with_hint[1:] == turn.prompt[1:]  # only the system message differs
            skills = runner.teacher_messages(traj, turn, context="skills")[0]["content"]
            assert hint not in skills and SKILL_HEADER in skills
            both = runner.teacher_messages(traj, turn, context="skills+hint")[0]["content"]
            assert hint in both and SKILL_HEADER in both


def test_an_unknown_level_is_a_clear_error(played) -> None:
    name, runner, *_ = played
    runner.hint_level = "the-future"
    with pytest.raises(ValueError, match="offers the privileged hint levels"):
        runner.run(OraclePolicy(), [TaskSpec(0, {"task_index": 1})])
    runner.hint_level = CASES[name][2]


def test_config_names_the_bad_teacher_key() -> None:
    with pytest.raises(ConfigError, match="teacher.context"):
        load_config("cpu-tiny", ["teacher.context=oracle"])
    with pytest.raises(ConfigError, match="teacher.hint_level"):
        load_config("cpu-tiny", ["teacher.context=hint", "teacher.hint_level="])
    assert load_config("cpu-tiny", []).teacher.context == "skills"  # the paper's default


def test_the_trainer_teacher_rows_carry_the_hint_and_the_student_rows_never(tmp_path, toy_env_ids) -> None:
    from agentgym_opsd.trainer.loop import Trainer

    cfg = load_config("cpu-tiny", ["env.id=ALFWorld-v0:easy", "env.max_turns=2", f"trainer.output_dir={tmp_path}",
                                   "trainer.backend=torch", "trainer.tensorboard=false", "teacher.context=hint"])
    trainer = Trainer(cfg)
    try:
        trajs = trainer.collect()
        batch = trainer.score(trajs)
        tok = trainer.session.trained.tokenizer
        for row, teacher_ids in zip(batch.rows, trainer.session.evidence_maker.row_prompts(batch, trajs), strict=True):
            traj = next(t for t in trajs if t.traj_id == row.traj_id)
            assert traj.privileged_hint
            assert teacher_ids is not None
            assert traj.privileged_hint in tok.decode(teacher_ids)
            assert traj.privileged_hint not in tok.decode(row.prompt_ids)
    finally:
        trainer.close()


def test_the_inspector_shows_the_hint_escaped(tmp_path) -> None:
    from test_inspector import make_run

    from agentgym_opsd.inspector import load_step, render_html

    make_run(tmp_path / "run")
    data = load_step(tmp_path / "run")
    data.trajectories[0].privileged_hint = "<b>Apple 1 is in/on countertop 1.</b>"
    page = render_html(data)
    assert "teacher hint:</b> &lt;b&gt;Apple 1 is in/on countertop 1.&lt;/b&gt;" in page
