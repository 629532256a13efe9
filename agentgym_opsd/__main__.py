"""`python -m agentgym_opsd list`: what is registered."""

from __future__ import annotations

import argparse

from agentgym_opsd.registry import (
    env_profile,
    load_skill_library,
    registered_envs,
    registered_skill_libraries,
)

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentgym_opsd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="print registered environments and skill libraries")
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
    raise SystemExit(main())
