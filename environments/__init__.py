"""Built-in environments. Each sub-package registers itself with a lazy entry point, so importing this
package (and listing the registry) never imports an engine, a model or a browser."""

from __future__ import annotations

import importlib

__all__ = ["register_builtin_envs", "BUILTIN_ENV_PACKAGES"]

BUILTIN_ENV_PACKAGES = ("alfworld", "search_qa", "webshop")


def register_builtin_envs() -> None:
    for name in BUILTIN_ENV_PACKAGES:
        module = importlib.import_module(f"agentgym_opsd.environments.{name}")
        module.register()
