from __future__ import annotations

from pathlib import Path

import pytest

from agentgym_opsd.registry import load_skill_library, register_skill_library

SMALL_SKILLS = Path(__file__).parent / "data" / "skills_small"


@pytest.fixture(scope="session")
def toy_env_ids() -> tuple[str, str]:
    from toy_envs import register_toy_envs

    register_toy_envs()
    register_skill_library("toy", SMALL_SKILLS, override=True)
    load_skill_library("toy")
    return "agentgym_opsd/ToyCounter-v0", "agentgym_opsd/ToyFlaky-v0"


@pytest.fixture(scope="module")
def fresh_cache_dir(tmp_path_factory):
    """A private, empty `$AGENTGYM_OPSD_CACHE` for one test module (generated games, indexes, models)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield
