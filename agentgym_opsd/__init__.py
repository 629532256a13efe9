"""agentgym-opsd: multi-turn text environments behind one turn API, and an AgentOPSD RL trainer.

Importing the package registers the built-in environments with gymnasium (lazily: nothing heavy is
imported until an environment is made), so `gymnasium.make("agentgym_opsd/ALFWorld-v0")` works.
"""

from agentgym_opsd.core import TextEnv
from agentgym_opsd.env_checker import EnvCheckError, check_env
from agentgym_opsd.envpool import EnvPool, StepResult, TaskSpec
from agentgym_opsd.parsers import ActionParser, ParsedAction, TagParser, WebShopParser, make_parser
from agentgym_opsd.policies import OraclePolicy, Policy, PolicyOutput, PolicyRequest, RandomPolicy
from agentgym_opsd.prompts import HistoryItem, PromptRenderer
from agentgym_opsd.records import Trajectory, Turn, load_jsonl, save_jsonl
from agentgym_opsd.registry import (
    EnvProfile,
    discover_plugins,
    env_profile,
    load_skill_library,
    make,
    register_env,
    register_skill_library,
    registered_envs,
    registered_skill_libraries,
)

__version__ = "0.1.0"

__all__ = [
    "ActionParser",
    "EnvCheckError",
    "EnvPool",
    "EnvProfile",
    "HistoryItem",
    "OraclePolicy",
    "ParsedAction",
    "Policy",
    "PolicyOutput",
    "PolicyRequest",
    "PromptRenderer",
    "RandomPolicy",
    "StepResult",
    "TagParser",
    "TaskSpec",
    "TextEnv",
    "Trajectory",
    "Turn",
    "WebShopParser",
    "check_env",
    "discover_plugins",
    "env_profile",
    "load_jsonl",
    "load_skill_library",
    "make",
    "make_parser",
    "register_env",
    "register_skill_library",
    "registered_envs",
    "registered_skill_libraries",
    "save_jsonl",
]

discover_plugins()
