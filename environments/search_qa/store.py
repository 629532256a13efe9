"""The passage store: the Search-R1 corpus file plus an offsets table, both memory-mapped.

`corpus.jsonl` is the corpus in Search-R1 form (so an index folder is also a valid corpus) and
`offsets.npy` holds the byte offset of each line (n + 1 values). Reading passage i touches only its line,
so a 1M-passage store opens instantly and costs no resident memory until used.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from agentgym_opsd.environments.search_qa.data import Passage
from agentgym_opsd.files import to_json

__all__ = ["PassageStore", "write_store", "CORPUS_FILE", "OFFSETS_FILE"]

CORPUS_FILE = "corpus.jsonl"
OFFSETS_FILE = "offsets.npy"


def write_store(folder: str | os.PathLike[str], passages: Iterable[Passage]) -> int:
    """Write `corpus.jsonl` and `offsets.npy` into `folder` (a fresh folder, made atomic by the caller);
    returns the number of passages."""
    root = Path(folder)
    offsets = [0]
    with open(root / CORPUS_FILE, "wb") as f:
        for p in passages:
            line = (to_json({"id": p.id, "contents": p.contents}) + "\n").encode("utf-8")
            f.write(line)
            offsets.append(offsets[-1] + len(line))
    np.save(root / OFFSETS_FILE, np.asarray(offsets, dtype=np.int64))
    return len(offsets) - 1


class PassageStore:
    """Random access to the passages of a store folder by row."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        root = Path(folder)
        self.offsets = np.load(root / OFFSETS_FILE, mmap_mode="r")
        size = int(self.offsets[-1])
        # np.memmap refuses empty files; an empty corpus is legal (and useless)
        self._data = np.memmap(root / CORPUS_FILE, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> Passage:
        if not 0 <= row < len(self):
            raise IndexError(f"passage row {row} outside [0, {len(self)})")
        raw = bytes(self._data[int(self.offsets[row]):int(self.offsets[row + 1])])
        record = json.loads(raw)
        return Passage.from_contents(record["id"], record["contents"])
