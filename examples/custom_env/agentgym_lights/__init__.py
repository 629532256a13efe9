"""An agentgym-opsd plugin: the `Lights-v0` environment and the `lights` skill library.

Installing this package (`pip install examples/custom_env`) is all it takes: agentgym-opsd finds both through
the entry points in pyproject.toml, so `python -m agentgym_opsd.train --config cpu-tiny env.id=Lights-v0`
and `python -m agentgym_opsd.evaluate --policy oracle --env Lights-v0:test --out runs/lights` work.
"""

from __future__ import annotations

from pathlib import Path

from agentgym_opsd.registry import EnvProfile, register_env

__all__ = ["SKILLS_FOLDER", "register"]

SKILLS_FOLDER = Path(__file__).parent / "skills"
"""Markdown rules + skills.yaml; loaded through the `agentgym_opsd.skills` entry point named `lights`."""

PROFILE = EnvProfile(
    parser="tag:action",  # the answer is read from <action>...</action>
    system_prompt=("You control the lights of a house. Reply with one action inside <action></action>: "
                   "'toggle <light>' or 'look'."),
    history_turns=2,
    skill_library="lights",  # the teacher's privileged context c+ comes from this library
    invalid_action_penalty=0.1,
    max_turns=6,
    splits=("train", "test"),  # `Lights-v0:test` passes split="test" to the constructor
    description="Switch household lights to a goal state (example plugin)",
)


def register() -> None:
    """Called once by agentgym-opsd's plugin discovery. The entry point is a "module:Class" string, so the
    environment module is imported only when an environment is made."""
    register_env("Lights-v0", "agentgym_lights.env:LightsEnv", profile=PROFILE)
