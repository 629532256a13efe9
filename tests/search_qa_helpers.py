"""Shared builder for the Search-QA tests: the tiny generated world with a hashing-encoder index; no tests here."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_search_qa_kwargs(folder: Path) -> dict[str, Any]:
    """`SearchQAEnv` keyword arguments for the `tiny` world indexed under `folder` (split `test`), with a
    hashing encoder: no model, seconds to build."""
    from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
    from agentgym_opsd.environments.search_qa.formats import write_questions
    from agentgym_opsd.environments.search_qa.generator import generate_dataset
    from agentgym_opsd.environments.search_qa.index import IndexConfig, write_index_folder
    from agentgym_opsd.environments.search_qa.retriever import DenseRetriever

    data = generate_dataset("tiny")
    index = write_index_folder(folder / "idx", data.passages, HashingEncoder().encode, IndexConfig(kind="flat"),
                               progress=False)
    qa = folder / "test.jsonl"
    write_questions(qa, data.questions["test"])
    return {"questions_path": {"test": str(qa)}, "index_dir": str(index),
            "retriever": DenseRetriever(index, encoder=HashingEncoder().encode)}
