"""Prompt rendering: task + last-k turns + current observation -> chat messages.

The same renderer builds the student prompt and the teacher prompt; the teacher's differs only by the skill
block `c+`. The skill block sits in the system message, and when the prompt must be shortened the renderer
drops the oldest history first, then shortens the current observation in its middle — the system prompt, the
skill block and the task are never cut (the released AgentOPSD code prepends the skills and left-truncates,
which removes them first; we do not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentgym_opsd.records import ChatMessage

__all__ = ["HINT_HEADER", "HistoryItem", "PromptRenderer", "SKILL_HEADER", "TEACHER_CONTEXTS", "TEMPLATE_FIELDS", "check_user_template"]

SKILL_HEADER = "Skills that help with this task:"
HINT_HEADER = "Facts about this task (privileged: the player does not see them):"
TEACHER_CONTEXTS: tuple[str, ...] = ("skills", "hint", "skills+hint")
"""What the self-teacher's system message adds: the skill library's c+ (the paper), the task's privileged hint
(`core.PRIVILEGED_HINTS`), or both."""

TEMPLATE_FIELDS = {
    "task": "the task text",
    "observation": "the current observation (shortened in its middle when max_chars demands it)",
    "history": "the shown past turns, one '[Turn n] Observation: ...\\nAction: ...' block each ('' when none)",
    "history_length": "how many past turns are shown",
    "earlier_actions": "with action_history, the actions of the past turns not shown, '; '-separated ('' when none)",
    "past_turns": "how many turns came before this one",
    "turn": "this turn's number, from 1",
    "admissible_actions": "the admissible actions, comma-separated ('' when the environment has no list)",
}
"""Placeholders a user prompt template (`env.prompt_template=PATH`) may use, with what they hold."""


def check_user_template(template: str) -> str:
    """`template` if every placeholder is known and `{observation}` is there, else ValueError saying why."""
    try:
        template.format_map(dict.fromkeys(TEMPLATE_FIELDS, ""))
    except KeyError as exc:
        raise ValueError(f"unknown placeholder {{{exc.args[0]}}}; known: "
                         f"{', '.join('{' + k + '}' for k in TEMPLATE_FIELDS)}") from None
    except (ValueError, IndexError) as exc:
        raise ValueError(f"{exc} (write a literal brace as {{{{ or }}}})") from None
    if "{observation}" not in template:
        raise ValueError("the template must contain {observation}")
    return template


@dataclass(frozen=True)
class HistoryItem:
    """One past turn: the observation the agent saw, and the action it took after seeing it."""

    action: str
    observation: str


@dataclass(frozen=True)
class PromptRenderer:
    """Renders chat messages for one turn.

    `history_turns` is k (last k turns shown); `max_chars` bounds the user message (0 = no bound);
    `action_history` also lists, on one line, the actions of the past turns whose observations are not shown
    (beyond k, or dropped for length), so a short prompt still says what the agent did: on a page that looks
    the same after each click (WebShop's item page) it is the only record of which options are chosen;
    `show_admissible` lists the admissible actions when the environment knows them. `user_template`
    replaces our user message with the user's own text (placeholders in `TEMPLATE_FIELDS`), so a run can use
    exactly the prompt of the paper it is compared with; the system message (and `c+` in it) stays ours.
    """

    system_prompt: str
    history_turns: int = 2
    max_chars: int = 0
    action_history: bool = False
    show_admissible: bool = True
    max_admissible: int = 60
    user_template: str | None = None

    def __post_init__(self) -> None:
        if self.user_template is not None:
            check_user_template(self.user_template)
        if self.history_turns < 0:
            raise ValueError(f"history_turns must be >= 0, got {self.history_turns}")
        if self.max_chars < 0:
            raise ValueError(f"max_chars must be >= 0, got {self.max_chars}")

    def system_message(self, skill_context: str = "", hint: str = "") -> str:
        """The system prompt, then the skill block c+ and the privileged hint when given (teacher only)."""
        blocks = [self.system_prompt]
        if skill_context.strip():
            blocks.append(f"{SKILL_HEADER}\n{skill_context.strip()}")
        if hint.strip():
            blocks.append(f"{HINT_HEADER}\n{hint.strip()}")
        return "\n\n".join(blocks)

    def render(
        self,
        *,
        task_text: str,
        observation: str,
        history: Sequence[HistoryItem] = (),
        admissible_actions: Sequence[str] | None = None,
        skill_context: str = "",
        turn_index: int = 0,
    ) -> list[ChatMessage]:
        shown = list(history)[-self.history_turns :] if self.history_turns else []
        admissible = ""
        if self.show_admissible and admissible_actions:
            listed = list(admissible_actions)[: self.max_admissible]
            more = len(admissible_actions) - len(listed)
            admissible = ", ".join(listed) + (f" (and {more} more)" if more > 0 else "")
        past = list(history)
        while True:
            earlier = self._earlier_actions(past, shown)
            user = self._user_message(task_text, observation, shown, admissible, turn_index, len(past), earlier)
            if not self.max_chars or len(user) <= self.max_chars or not shown:
                break
            shown = shown[1:]  # drop the oldest turn first
        if self.max_chars and len(user) > self.max_chars:
            fixed = len(user) - len(observation)
            observation = _shorten_middle(observation, max(self.max_chars - fixed, 40))
            user = self._user_message(task_text, observation, shown, admissible, turn_index, len(past), earlier)
        return [
            {"role": "system", "content": self.system_message(skill_context)},
            {"role": "user", "content": user},
        ]

    def _earlier_actions(self, past: Sequence[HistoryItem], shown: Sequence[HistoryItem]) -> list[str]:
        """The actions of the past turns before the shown ones (none unless `action_history`)."""
        return [h.action for h in past[: len(past) - len(shown)]] if self.action_history else []

    def _user_message(
        self,
        task_text: str,
        observation: str,
        shown: Sequence[HistoryItem],
        admissible: str,
        turn_index: int,
        num_past: int,
        earlier_actions: Sequence[str] = (),
    ) -> str:
        first = num_past - len(shown) + 1
        history = "\n".join(f"[Turn {first + i}] Observation: {h.observation}\nAction: {h.action}"
                             for i, h in enumerate(shown))
        earlier = "; ".join(earlier_actions)
        if self.user_template is not None:
            return self.user_template.format_map({
                "task": task_text, "observation": observation, "history": history, "history_length": len(shown),
                "earlier_actions": earlier, "past_turns": num_past, "turn": turn_index + 1,
                "admissible_actions": admissible})
        parts = [f"Task: {task_text}"] if task_text else []
        if earlier:
            turns = "turn 1" if first == 2 else f"turns 1-{first - 1}"
            parts.append(f"Earlier actions ({turns}): {earlier}")
        if shown:
            parts.append("Recent turns:\n" + history)
        parts.append(f"[Turn {turn_index + 1}] Current observation: {observation}")
        if admissible:
            parts.append(f"Admissible actions: {admissible}")
        parts.append("Your next action:")
        return "\n\n".join(parts)


def _shorten_middle(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    marker = " [...] "
    keep = max(max_chars - len(marker), 2)
    return text[: keep // 2] + marker + text[-(keep - keep // 2) :]
