"""WebShop: an offline shop web site (generated catalogue, BM25 search, the original reward) in text mode
and browser mode. Importing this package is light; `WebShop-v0` loads `env.py` on first make."""

from __future__ import annotations

__all__ = ["register", "ENV_NAME", "SYSTEM_PROMPT"]

ENV_NAME = "WebShop-v0"

SYSTEM_PROMPT = (
    "You are shopping on a web site for the item described in the instruction. Each turn you see the current "
    "page: its visible texts separated by [SEP]. Act with exactly one command: search[keywords] when the page "
    "has a search bar, or click[name] with the name of a clickable shown on the page (a product id, an option "
    "value, 'next >', '< prev', 'back to search', 'description', 'features', 'reviews', 'buy now'). Choose the "
    "options the instruction asks for before clicking 'buy now'; buying ends the episode. "
    "Write the command inside <action>...</action>."
)


def register() -> None:
    from agentgym_opsd.registry import EnvProfile, register_env

    register_env(
        ENV_NAME,
        "agentgym_opsd.environments.webshop.env:WebShopEnv",
        profile=EnvProfile(
            parser="webshop",
            system_prompt=SYSTEM_PROMPT,
            history_turns=2,
            skill_library="webshop",
            invalid_action_penalty=0.1,
            max_turns=15,
            splits=("train", "test"),
            description="WebShop: find and buy the instructed product (text or browser mode).",
            # the expert searches what the agent sees and opens the satisfying result with the best title
            # (oracle.py); a new name gives its warm starts a new cache key
            demonstrator="instruction-search+visible-pick",
        ),
        override=True,
    )
