"""Registries of environments and skill libraries.

Environments are registered with `gymnasium.register` under the namespace `agentgym_opsd` (so
`gymnasium.make("agentgym_opsd/ALFWorld-v0")` works after `import agentgym_opsd`), with a lazy
`"module:Class"` entry point so that listing the registry imports nothing heavy. Beside the gymnasium spec we
keep an `EnvProfile`: how an agent talks to the environment (parser, system prompt, history length, skill
library, invalid-action penalty).

Other installed packages add their own through the entry-point groups `agentgym_opsd.environments` (an
object that is called with no arguments and registers environments) and `agentgym_opsd.skills` (the entry
point's name is the library name; it loads to a folder path or a `SkillLibrary`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import gymnasium as gym

from agentgym_opsd.prompts import PromptRenderer
from agentgym_opsd.skills import SkillLibrary, builtin_library_folders

__all__ = [
    "NAMESPACE",
    "EnvProfile",
    "register_env",
    "make",
    "env_profile",
    "prompt_renderer_for",
    "registered_envs",
    "full_env_id",
    "parse_env_spec",
    "register_skill_library",
    "load_skill_library",
    "registered_skill_libraries",
    "discover_plugins",
    "import_user_module",
    "RegistryError",
]

NAMESPACE = "agentgym_opsd"
ENV_ENTRY_POINT_GROUP = "agentgym_opsd.environments"
SKILL_ENTRY_POINT_GROUP = "agentgym_opsd.skills"


class RegistryError(KeyError):
    """Unknown or duplicate ids. (A KeyError subclass whose message is readable.)"""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class EnvProfile:
    """How an agent talks to one environment."""

    parser: str = "tag:action"
    """Action parser spec for `agentgym_opsd.parsers.make_parser`."""
    system_prompt: str = ""
    """Instructions shown to the policy before the task."""
    history_turns: int = 2
    """How many past (action, observation) turns the prompt shows."""
    skill_library: str | None = None
    """Name of the registered skill library that gives `c+` for this environment's tasks."""
    invalid_action_penalty: float = 0.1
    """Subtracted from the trajectory reward per invalid action (SPEC: 0.1 ALFWorld/WebShop, 0.01 Search)."""
    max_turns: int = 50
    splits: tuple[str, ...] = ()
    """Task splits the environment offers (`split=` keyword), first one the default."""
    description: str = ""
    demonstrator: str = ""
    """A version tag of the expert whose episodes the warm start imitates (`oracle_action`): a new tag makes
    cached warm starts of this environment stale (it enters their key; empty: not part of the key)."""

    def __post_init__(self) -> None:
        if self.history_turns < 0:
            raise ValueError(f"EnvProfile.history_turns must be >= 0, got {self.history_turns}")
        if self.max_turns < 1:
            raise ValueError(f"EnvProfile.max_turns must be >= 1, got {self.max_turns}")


@dataclass
class _Registry:
    profiles: dict[str, EnvProfile] = field(default_factory=dict)
    skill_sources: dict[str, Callable[[], SkillLibrary]] = field(default_factory=dict)
    skill_cache: dict[str, SkillLibrary] = field(default_factory=dict)
    plugins_loaded: bool = False


_REGISTRY = _Registry()


def full_env_id(env_id: str) -> str:
    """`ALFWorld-v0` or `agentgym_opsd/ALFWorld-v0` -> `agentgym_opsd/ALFWorld-v0`."""
    return env_id if "/" in env_id else f"{NAMESPACE}/{env_id}"


def parse_env_spec(spec: str) -> tuple[str, str | None]:
    """`ALFWorld-v0:valid_unseen` -> (`agentgym_opsd/ALFWorld-v0`, `valid_unseen`)."""
    env_id, _, split = spec.partition(":")
    return full_env_id(env_id), (split or None)


def register_env(
    name: str,
    entry_point: str | Callable[..., gym.Env],
    *,
    profile: EnvProfile | None = None,
    kwargs: dict[str, Any] | None = None,
    override: bool = False,
) -> str:
    """Register an environment; returns its full id. `name` is versioned (`MyEnv-v0`)."""
    env_id = full_env_id(name)
    ns, _, short = env_id.partition("/")
    if not short.rpartition("-v")[2].isdigit():
        raise ValueError(f"environment ids are versioned like 'MyEnv-v0', got {name!r}")
    if env_id in gym.registry and not override:
        raise RegistryError(f"environment {env_id!r} is already registered (pass override=True to replace it)")
    if env_id in gym.registry:
        del gym.registry[env_id]
    profile = profile or EnvProfile()
    # max_episode_steps is left unset: TextEnv counts turns itself and reports truncation in the same step.
    gym.register(id=env_id, entry_point=entry_point, kwargs={"max_turns": profile.max_turns, **(kwargs or {})},
                 disable_env_checker=True)
    _REGISTRY.profiles[env_id] = profile
    return env_id


def discover_plugins() -> None:
    """Load built-in environments and skill libraries, then those of installed plugins (once)."""
    if _REGISTRY.plugins_loaded:
        return
    _REGISTRY.plugins_loaded = True
    from agentgym_opsd.environments import register_builtin_envs

    register_builtin_envs()
    for name, folder in builtin_library_folders().items():
        if name not in _REGISTRY.skill_sources:
            register_skill_library(name, folder)
    for ep in metadata.entry_points(group=ENV_ENTRY_POINT_GROUP):
        if ep.value.startswith("agentgym_opsd.environments:"):
            continue  # already registered above
        _load_plugin(ep)()
    for ep in metadata.entry_points(group=SKILL_ENTRY_POINT_GROUP):
        if ep.name not in _REGISTRY.skill_sources:
            register_skill_library(ep.name, _load_plugin(ep))


def import_user_module(spec: str) -> Any:
    """Import a module that registers environments or skill libraries when imported, without packaging it:
    `spec` is a path to a `.py` file or a dotted module name (found from the current folder too). This is
    what the CLIs' `--import` does; a module that cannot be imported is a RegistryError saying why."""
    import importlib
    import importlib.util
    import sys

    path = Path(spec)
    try:
        if spec.endswith(".py"):
            if not path.is_file():
                raise RegistryError(f"--import {spec}: no such file")
            name = f"agentgym_user_{path.stem}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            if module_spec is None or module_spec.loader is None:
                raise RegistryError(f"--import {spec}: not a Python module")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module  # registered "module:Class" entry points must find it again
            module_spec.loader.exec_module(module)
            return module
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        return importlib.import_module(spec)
    except RegistryError:
        raise
    except Exception as exc:  # a syntax error or a failing import inside the user's module
        raise RegistryError(f"--import {spec}: {type(exc).__name__}: {exc}") from exc


def _load_plugin(ep: metadata.EntryPoint) -> Any:
    try:
        return ep.load()
    except (ImportError, AttributeError) as exc:
        raise RegistryError(f"plugin {ep.name!r} = {ep.value!r} (entry-point group {ep.group}) cannot be loaded: "
                            f"{exc}") from exc


def registered_envs() -> list[str]:
    discover_plugins()
    return sorted(_REGISTRY.profiles)


def env_profile(env_id: str) -> EnvProfile:
    discover_plugins()
    full = full_env_id(env_id)
    if full not in _REGISTRY.profiles:
        raise RegistryError(f"unknown environment {env_id!r}; registered: {', '.join(registered_envs()) or 'none'}")
    return _REGISTRY.profiles[full]


def prompt_renderer_for(env_spec: str, *, history_turns: int = -1, max_prompt_chars: int = 0,
                        action_history: bool = False, prompt_template: str = "") -> PromptRenderer:
    """How a run's prompt settings (the `env` section of a training config) render the prompts of `env_spec`:
    its profile's system prompt, with the history length (the profile's when `history_turns` < 0), the bound
    (`max_prompt_chars`, 0 = none), the action history and the user's template file ('' = ours); the defaults
    are the profile's own prompts. The
    trainer, the evaluation of a trained run and the benchmarks all build their prompts here, so they agree."""
    profile = env_profile(parse_env_spec(env_spec)[0])
    template = Path(prompt_template).read_text(encoding="utf-8") if prompt_template else None
    history = history_turns if history_turns >= 0 else profile.history_turns
    return PromptRenderer(profile.system_prompt, history_turns=history, max_chars=max_prompt_chars,
                          action_history=action_history, user_template=template)


def make(env_spec: str, **kwargs: Any) -> gym.Env:
    """Create an environment by id; `Env-v0:split` selects a split. Unknown ids list what exists."""
    env_id, split = parse_env_spec(env_spec)
    profile = env_profile(env_id)
    if split is not None:
        if profile.splits and split not in profile.splits:
            raise RegistryError(f"{env_id} has no split {split!r}; splits: {', '.join(profile.splits)}")
        kwargs["split"] = split
    return gym.make(env_id, disable_env_checker=True, **kwargs)


def register_skill_library(
    name: str, source: str | os.PathLike[str] | SkillLibrary | Callable[[], SkillLibrary], *, override: bool = False
) -> None:
    """Register a skill library by name: a folder, a loaded library, or a factory (loaded on first use)."""
    if name in _REGISTRY.skill_sources and not override:
        raise RegistryError(f"skill library {name!r} is already registered (pass override=True to replace it)")
    if isinstance(source, SkillLibrary):
        library = source
        factory: Callable[[], SkillLibrary] = lambda: library  # noqa: E731
    elif isinstance(source, (str, os.PathLike)):
        folder = Path(source)
        factory = lambda: SkillLibrary.from_folder(folder)  # noqa: E731
    elif callable(source):
        factory = source
    else:
        raise TypeError(f"skill library source must be a folder, a SkillLibrary or a factory, got {type(source)}")
    _REGISTRY.skill_sources[name] = factory
    _REGISTRY.skill_cache.pop(name, None)


def registered_skill_libraries() -> list[str]:
    discover_plugins()
    return sorted(_REGISTRY.skill_sources)


def load_skill_library(name: str) -> SkillLibrary:
    discover_plugins()
    if name not in _REGISTRY.skill_sources:
        raise RegistryError(f"unknown skill library {name!r}; registered: {', '.join(registered_skill_libraries())}")
    if name not in _REGISTRY.skill_cache:
        _REGISTRY.skill_cache[name] = _REGISTRY.skill_sources[name]()
    return _REGISTRY.skill_cache[name]
