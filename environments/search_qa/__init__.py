"""Search-QA (Search-R1 style): search a corpus with `<search>`, answer with `<answer>`.

Importing this package is light (no FAISS, torch or data); `register()` adds `SearchQA-v0` with a lazy
entry point. Modules: `data` (passages, questions, hop chains), `generator` (the offline closed world),
`formats` (Search-R1 files), `normalize` (exact match), `embedding` (MiniLM, the only torch user), `store`
and `index` (FAISS folders), `retriever` (in-process or HTTP), `resources` (first-use cache), `env`,
`build_index` and `serve` (command lines).
"""

from __future__ import annotations

from agentgym_opsd.registry import EnvProfile, register_env

__all__ = ["register", "SYSTEM_PROMPT", "PROFILE"]

SYSTEM_PROMPT = (
    "You answer questions by looking facts up in a search engine. Think step by step about what you still "
    "need to know. To look something up, write <search>your query</search>; the top results come back "
    "inside <information> ... </information>. Search as often as you need, one query per turn, and use "
    "what earlier searches found to write the next query. When you know the answer, write "
    "<answer>the answer</answer> with only the answer itself, a few words at most. Each turn must contain "
    "exactly one <search> or one <answer> tag."
)

PROFILE = EnvProfile(
    parser="tag:search,answer",
    system_prompt=SYSTEM_PROMPT,
    history_turns=4,
    skill_library="search_qa",
    invalid_action_penalty=0.01,
    max_turns=4,
    splits=("train", "test"),
    description="Search-R1 style question answering over a generated (or real) corpus with dense retrieval",
)


def register() -> None:
    register_env("SearchQA-v0", "agentgym_opsd.environments.search_qa.env:SearchQAEnv", profile=PROFILE,
                 override=True)
