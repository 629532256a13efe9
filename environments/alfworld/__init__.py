"""ALFWorld: household tasks in text (ALFWorld's own engine, text and admissible commands).

`register()` adds `agentgym_opsd/ALFWorld-v0` with a lazy entry point; nothing heavy is imported here. See
`env.py` for the environment, `generator.py` / `generate.py` for offline games, `splits.py` for the
built-in splits.
"""

from __future__ import annotations

from agentgym_opsd.registry import EnvProfile, register_env

__all__ = ["register", "ENV_NAME", "PROFILE", "SYSTEM_PROMPT"]

ENV_NAME = "ALFWorld-v0"

SYSTEM_PROMPT = (
    "You are a household robot in a text world. Each turn you see what happened and the commands you may use. "
    "Think briefly, then reply with exactly one command, copied from the admissible list, inside "
    "<action>...</action>."
)

PROFILE = EnvProfile(
    parser="tag:action",
    system_prompt=SYSTEM_PROMPT,
    history_turns=2,
    skill_library="alfworld",
    invalid_action_penalty=0.1,
    max_turns=50,
    splits=("train", "valid_seen", "valid_unseen", "easy", "easy_valid"),
    description="ALFWorld text games (six household task types); generated offline or real ALFWorld data.",
)


def register() -> None:
    register_env(ENV_NAME, "agentgym_opsd.environments.alfworld.env:ALFWorldEnv", profile=PROFILE, override=True)
