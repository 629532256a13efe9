from __future__ import annotations

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
