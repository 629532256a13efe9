"""`agentgym-opsd COMMAND` (or `python -m agentgym_opsd COMMAND`): one command group for every entry point.

    agentgym-opsd list                                      # registered environments and skill libraries
    agentgym-opsd train --config cpu-small ...              # = python -m agentgym_opsd.train
    agentgym-opsd eval --policy oracle --env ALFWorld-v0 ...  # = python -m agentgym_opsd.evaluate
    agentgym-opsd serve-policy MODEL --port P ...           # a local model behind an OpenAI-compatible API
    agentgym-opsd inspect RUN_DIR [--step N] [--out F]      # the credit inspector's page of a training step

Each command's code lives in the layer it wires (the trainer's command line in `trainer/cli.py`, the
evaluation's in `evaluation/cli.py`, the policy server in `models/`); this module names them and imports one
only when it is run, so `list` needs neither a model nor flask, and the core imports nothing above it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from agentgym_opsd.registry import (
    env_profile,
    load_skill_library,
    registered_envs,
    registered_skill_libraries,
)

__all__ = ["SAMPLING_COMMANDS", "main", "run_as_command"]

# Commands handed on whole to another module's `main(argv)` (imported only when named, so `list` needs
# neither flask nor a model): command -> (module, help).
FORWARDED: dict[str, tuple[str, str]] = {
    "train": ("agentgym_opsd.trainer.cli", "train a policy with AgentOPSD / GRPO (see train --help)"),
    "eval": ("agentgym_opsd.evaluation.cli", "evaluate a policy on environments, compare runs (see eval --help)"),
    "serve-policy": ("agentgym_opsd.models.policy_server",
                     "serve a local model behind an OpenAI-compatible API (see serve-policy --help)"),
    "inspect": ("agentgym_opsd.inspector.page",
                "write the credit inspector's HTML page of a training step (see inspect --help)"),
    "serve-openenv": ("agentgym_opsd.integrations.openenv_server",
                      "serve an environment with OpenEnv's server (see serve-openenv --help)"),
    "openenv-package": ("agentgym_opsd.integrations.openenv_package",
                        "write an environment's OpenEnv folder: openenv.yaml, server/app.py (see openenv-package --help)"),
}


SAMPLING_COMMANDS = ("train", "eval")
"""Commands that may sample with vLLM's CPU build: run as a command, they start again with the runtime it asks
for preloaded (`agentgym_opsd/cpu_runtime.py`)."""


def run_as_command(argv: Sequence[str]) -> int:
    """`main(argv)` for a process started as a command (console script, `python -m`), never for a function call:
    a sampling command first starts again with vLLM's CPU runtime preloaded, where that applies."""
    if argv and argv[0] in SAMPLING_COMMANDS:
        from agentgym_opsd.cpu_runtime import reexec_preloaded

        reexec_preloaded()
    return main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the console script
        return run_as_command(sys.argv[1:])
    argv = list(argv)
    if argv and argv[0] in FORWARDED:
        module = importlib.import_module(FORWARDED[argv[0]][0])
        return int(module.main(argv[1:]))
    parser = argparse.ArgumentParser(prog="python -m agentgym_opsd", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="print registered environments and skill libraries")
    for name, (_, help_text) in FORWARDED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    args = parser.parse_args(argv)
    if args.command == "list":
        print("Environments:")
        for env_id in registered_envs():
            p = env_profile(env_id)
            splits = f" splits={','.join(p.splits)}" if p.splits else ""
            skills = f" skills={p.skill_library}" if p.skill_library else ""
            print(f"  {env_id}  max_turns={p.max_turns}{splits}{skills}  {p.description}")
        print("Skill libraries:")
        for name in registered_skill_libraries():
            lib = load_skill_library(name)
            kinds = ", ".join(lib.task_types) or "general only"
            print(f"  {name}  ({kinds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_as_command(sys.argv[1:]))
