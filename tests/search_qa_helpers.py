"""Shared builders for the Search-QA tests: the tiny generated world with a hashing-encoder index, and a stand-in
encoder for the encoder batcher; no tests here."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def tiny_index(folder: Path) -> tuple[Any, Path]:
    """The `tiny` generated world and its flat index with a hashing encoder, built under `folder`:
    (dataset, index folder). No model, seconds to build."""
    from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
    from agentgym_opsd.environments.search_qa.generator import generate_dataset
    from agentgym_opsd.environments.search_qa.index import IndexConfig, write_index_folder

    data = generate_dataset("tiny")
    return data, write_index_folder(folder / "idx", data.passages, HashingEncoder().encode, IndexConfig(kind="flat"),
                                    progress=False)


def tiny_search_qa_kwargs(folder: Path) -> dict[str, Any]:
    """`SearchQAEnv` keyword arguments for the `tiny` world indexed under `folder` (split `test`), with a
    hashing encoder: no model, seconds to build."""
    from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
    from agentgym_opsd.environments.search_qa.formats import write_questions
    from agentgym_opsd.environments.search_qa.retriever import DenseRetriever

    data, index = tiny_index(folder)
    qa = folder / "test.jsonl"
    write_questions(qa, data.questions["test"])
    return {"questions_path": {"test": str(qa)}, "index_dir": str(index),
            "retriever": DenseRetriever(index, encoder=HashingEncoder().encode)}


def held_first_call_encoder(calls: list[list[str]], release: threading.Event) -> Callable[[Sequence[str]], np.ndarray]:
    """An encoder for `EncodeBatcher` tests: text "7" becomes the row [7.0]; it records each call's texts in
    `calls`, holds the first call until `release` is set (so other callers queue behind it), and refuses a
    call holding the text "fail" with ValueError("cannot encode")."""

    def encode(texts: Sequence[str]) -> np.ndarray:
        calls.append(list(texts))
        if len(calls) == 1:
            release.wait(timeout=30)
        if "fail" in texts:
            raise ValueError("cannot encode")
        return np.array([[float(t)] for t in texts], dtype=np.float32)

    return encode


def ignore_sigint() -> None:
    """`preexec_fn` for a server child: start it with SIGINT ignored, as a process started in the background
    of a non-interactive shell (CI's) inherits it. The server must still stop on SIGINT; it did not, which
    was the "hang under CI load" that these tests saw (the stacks showed the main thread still in select)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


STACKS_ON_SIGUSR1 = "import faulthandler, signal\nfaulthandler.register(signal.SIGUSR1, all_threads=True)\n"
"""Prepended to a server child's `-c` code, so a hung child can be asked for its threads' stacks."""


def wait_or_show_stacks(proc: subprocess.Popen, stderr_path: Path, timeout: float) -> int:
    """`proc`'s exit code; when it has not exited within `timeout`, an AssertionError holding its threads'
    stacks (SIGUSR1 to a child started with `STACKS_ON_SIGUSR1`, its stderr going to `stderr_path`)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(3)
        stacks = stderr_path.read_text(encoding="utf-8", errors="replace")[-8000:]
        raise AssertionError(f"still running {timeout:.0f} s after the stop signal; its stderr and stacks:\n{stacks}") from None


def server_with_encoder(encode_source: str) -> str:
    """The source of a child process running the real retrieval server CLI (`serve.main(sys.argv[1:])`) whose
    dense retriever encodes with `encode(texts)`, defined by `encode_source` (it may use `time`,
    `HashingEncoder` and `shared_encoder`)."""
    return (
        "import sys, time\n"
        "from agentgym_opsd.environments.search_qa import retriever, serve\n"
        "from agentgym_opsd.environments.search_qa.embedding import HashingEncoder, shared_encoder\n\n"
        + encode_source.strip("\n") + "\n\n\n"
        "class PatchedRetriever(retriever.DenseRetriever):\n"
        "    def __init__(self, folder):\n"
        "        super().__init__(folder, encoder=encode)\n\n\n"
        "retriever.DenseRetriever = PatchedRetriever\n"
        "sys.exit(serve.main(sys.argv[1:]))\n"
    )
