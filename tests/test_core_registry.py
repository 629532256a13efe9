from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import pytest

import agentgym_opsd
from agentgym_opsd.registry import (
    RegistryError,
    env_profile,
    load_skill_library,
    make,
    register_env,
    register_skill_library,
    registered_envs,
)


def test_toy_env_via_gymnasium_and_make(toy_env_ids):
    counter, _ = toy_env_ids
    assert counter in registered_envs()
    env = gym.make(counter)
    obs, info = env.reset(seed=3)
    assert obs == "The counter shows 0." and info["admissible_actions"] == ["inc", "dec"]
    env2 = make("ToyCounter-v0:test")
    assert env2.unwrapped.split == "test"


def test_unknown_and_duplicate_ids_are_clear(toy_env_ids):
    with pytest.raises(RegistryError, match="unknown environment 'Nope-v0'.*ToyCounter"):
        env_profile("Nope-v0")
    with pytest.raises(RegistryError, match="already registered"):
        register_env("ToyCounter-v0", "toy_envs:CounterEnv")
    with pytest.raises(RegistryError, match="no split 'bogus'"):
        make("ToyCounter-v0:bogus")
    with pytest.raises(ValueError, match="versioned"):
        register_env("Unversioned", "toy_envs:CounterEnv")
    with pytest.raises(RegistryError, match="unknown skill library"):
        load_skill_library("nope")
    with pytest.raises(RegistryError, match="already registered"):
        register_skill_library("toy", "/tmp")


def test_list_command_runs():
    out = subprocess.run([sys.executable, "-m", "agentgym_opsd", "list"], capture_output=True, text=True, check=True)
    assert "Environments:" in out.stdout and "Skill libraries:" in out.stdout
    envs, skills = out.stdout.split("Skill libraries:")
    for env_id in ("agentgym_opsd/ALFWorld-v0", "agentgym_opsd/WebShop-v0", "agentgym_opsd/SearchQA-v0"):
        assert env_id in envs
    listed = {line.split()[0] for line in skills.strip().splitlines()}
    assert {"alfworld", "webshop", "search_qa"} <= listed


def test_public_api_exports():
    for name in agentgym_opsd.__all__:
        assert hasattr(agentgym_opsd, name)


def test_broken_plugin_is_named(monkeypatch, toy_env_ids):
    from importlib import metadata

    from agentgym_opsd import registry

    broken = [metadata.EntryPoint("broken", "no_such_module:register", "agentgym_opsd.environments")]
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: broken if "environments" in group else [])
    monkeypatch.setattr(registry._REGISTRY, "plugins_loaded", False)
    with pytest.raises(RegistryError, match="plugin 'broken'.*cannot be loaded"):
        registry.discover_plugins()
