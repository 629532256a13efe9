from __future__ import annotations

import re

import pytest

from agentgym_opsd.prompts import SKILL_HEADER, HistoryItem, PromptRenderer


def test_render_shows_last_k_history_and_admissible():
    r = PromptRenderer("SYS", history_turns=2)
    hist = [HistoryItem(f"a{i}", f"o{i}") for i in range(5)]
    msgs = r.render(task_text="do it", observation="now", history=hist, admissible_actions=["x", "y"], turn_index=5)
    assert msgs[0] == {"role": "system", "content": "SYS"}
    user = msgs[1]["content"]
    assert "a3" in user and "a4" in user and "a2" not in user
    assert "[Turn 4]" in user and "Admissible actions: x, y" in user and "Task: do it" in user


def test_skill_block_in_system_message_and_never_truncated():
    r = PromptRenderer("SYS", history_turns=4, max_chars=300)
    hist = [HistoryItem("act " * 10, "obs " * 30) for _ in range(4)]
    skill = "RULE " * 200
    msgs = r.render(task_text="task", observation="x" * 1000, history=hist, skill_context=skill)
    assert SKILL_HEADER in msgs[0]["content"] and skill.strip() in msgs[0]["content"]
    assert len(msgs[1]["content"]) <= 300
    assert "Task: task" in msgs[1]["content"] and "[...]" in msgs[1]["content"]


def test_empty_skill_context_gives_student_prompt():
    r = PromptRenderer("SYS")
    assert r.system_message("") == "SYS" and r.system_message("  ") == "SYS"


# ---- user prompt templates (env.prompt_template) -----------------------------------------------------------

PAPER_LIKE = ("You are an expert agent. Your task is: {task}\nPrior to this step, you have taken {past_turns} "
              "step(s); the last {history_length}:\n{history}\nYou are now at step {turn}: {observation}\n"
              "Admissible actions: [{admissible_actions}]. Keep {{braces}} literal.")


def test_a_user_template_renders_every_placeholder():

    r = PromptRenderer("SYS", history_turns=1, user_template=PAPER_LIKE)
    msgs = r.render(task_text="heat an egg", observation="You see a fridge.",
                    history=[HistoryItem("look", "A room."), HistoryItem("go to fridge 1", "You arrive.")],
                    admissible_actions=["open fridge 1", "look"], skill_context="rules", turn_index=2)
    assert msgs[0]["content"].startswith("SYS") and "rules" in msgs[0]["content"]  # system message stays ours
    assert msgs[1]["content"] == (
        "You are an expert agent. Your task is: heat an egg\nPrior to this step, you have taken 2 step(s); the "
        "last 1:\n[Turn 2] Observation: You arrive.\nAction: go to fridge 1\nYou are now at step 3: You see a "
        "fridge.\nAdmissible actions: [open fridge 1, look]. Keep {braces} literal.")


def test_a_user_template_is_still_bounded_by_max_chars():

    r = PromptRenderer("SYS", history_turns=2, max_chars=260, user_template=PAPER_LIKE)
    user = r.render(task_text="t", observation="x" * 500, history=[HistoryItem("a", "b")] * 2)[1]["content"]
    assert len(user) <= 260 and "[...]" in user and "Observation: b" not in user


@pytest.mark.parametrize("template, message", [("{observation} {nope}", "unknown placeholder {nope}"),
                                               ("no observation here {task}", "must contain {observation}"),
                                               ("{observation} {", "literal brace")])
def test_bad_templates_say_why(template, message):

    with pytest.raises(ValueError, match=re.escape(message)):
        PromptRenderer("SYS", user_template=template)


def test_the_trainer_uses_a_template_file_and_refuses_a_bad_one(tmp_path, toy_env_ids):
    from agentgym_opsd.trainer.config import ConfigError, load_config
    from agentgym_opsd.trainer.loop import Trainer

    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("TEMPLATE {task} | {observation}")
    bad.write_text("{obs}")
    with pytest.raises(ConfigError, match="env.prompt_template: .*unknown placeholder"):
        load_config("cpu-tiny", [f"env.prompt_template={bad}"])
    with pytest.raises(ConfigError, match="env.prompt_template: cannot read"):
        load_config("cpu-tiny", [f"env.prompt_template={tmp_path / 'missing.txt'}"])
    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", f"env.prompt_template={good}", "trainer.backend=torch",
                                   f"trainer.output_dir={tmp_path / 'run'}", "trainer.tensorboard=false"])
    trainer = Trainer(cfg)
    try:
        (traj, *_) = trainer.collect()
        assert traj.turns[0].prompt[1]["content"].startswith("TEMPLATE make the counter show")
    finally:
        trainer.close()


# ---- action history (env.action_history) ---------------------------------------------------------------------

def test_action_history_lists_the_actions_of_the_turns_not_shown() -> None:
    hist = [HistoryItem(f"a{i}", f"o{i}") for i in range(4)]
    user = PromptRenderer("SYS", history_turns=1, action_history=True).render(
        task_text="t", observation="now", history=hist, turn_index=4)[1]["content"]
    assert "Earlier actions (turns 1-3): a0; a1; a2" in user
    assert "[Turn 4] Observation: o3\nAction: a3" in user and "o2" not in user
    first = PromptRenderer("SYS", history_turns=0, action_history=True).render(
        task_text="t", observation="now", history=hist[:1], turn_index=1)[1]["content"]
    assert "Earlier actions (turn 1): a0" in first and "o0" not in first


def test_action_history_keeps_the_action_of_a_turn_dropped_for_length() -> None:
    hist = [HistoryItem("click[red]", "page " * 60), HistoryItem("click[large]", "page " * 60)]
    r = PromptRenderer("SYS", history_turns=2, max_chars=500, action_history=True)
    user = r.render(task_text="t", observation="item page " * 20, history=hist, turn_index=2)[1]["content"]
    assert len(user) <= 500 and "Recent turns" not in user
    assert "Earlier actions (turns 1-2): click[red]; click[large]" in user
    without = PromptRenderer("SYS", history_turns=2, max_chars=500).render(
        task_text="t", observation="item page " * 20, history=hist, turn_index=2)[1]["content"]
    assert "click[red]" not in without and "Earlier actions" not in without  # off: the prompt is as before


def test_action_history_is_off_by_default_and_reaches_a_template() -> None:
    hist = [HistoryItem("a0", "o0"), HistoryItem("a1", "o1")]
    plain = PromptRenderer("SYS", history_turns=1).render(task_text="t", observation="now", history=hist)
    assert "Earlier actions" not in plain[1]["content"]
    r = PromptRenderer("SYS", history_turns=1, action_history=True,
                       user_template="Done: {earlier_actions} | {history_length} shown | {observation}")
    assert r.render(task_text="t", observation="now", history=hist)[1]["content"] == "Done: a0 | 1 shown | now"
