"""Where an environment's corpus, index and questions come from, built on first use into a cache.

A generated world (`corpus="small"` etc.) is written once to `<cache>/gen-<size>-<hash>/`: the index folder
(`index.py`) plus `train.jsonl` / `test.jsonl` in Search-R1 QA form. A real Search-R1 corpus file is indexed
once to `<cache>/corpus-<hash>/`. The cache root is `$AGENTGYM_OPSD_CACHE/search_qa`, else
`~/.cache/agentgym_opsd/search_qa`. Every file is written atomically, so a crash never leaves a folder that
looks complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import asdict
from pathlib import Path

from agentgym_opsd import files
from agentgym_opsd.environments.search_qa.data import SPLITS
from agentgym_opsd.environments.search_qa.formats import read_corpus, write_questions
from agentgym_opsd.environments.search_qa.generator import WorldConfig, generate_dataset, preset
from agentgym_opsd.environments.search_qa.index import META_FILE, IndexConfig, write_index_folder

__all__ = ["cache_root", "prepare_generated", "prepare_corpus_index"]

_BUILD_LOCK = threading.Lock()  # EnvPool threads making their first env at once build only once


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    return Path(cache_dir) if cache_dir else files.cache_dir("search_qa")


def _digest(payload: object) -> str:
    return hashlib.sha1(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]


def prepare_generated(size: str | WorldConfig, index_cfg: IndexConfig, *, cache_dir: str | os.PathLike[str] | None = None,
                      progress: bool = False) -> Path:
    """The folder of a generated world's index and questions, building it if missing."""
    world = preset(size) if isinstance(size, str) else size
    name = size if isinstance(size, str) else "custom"
    folder = cache_root(cache_dir) / f"gen-{name}-{_digest([asdict(world), asdict(index_cfg)])}"
    if _complete(folder):
        return folder
    with _BUILD_LOCK:
        if _complete(folder):
            return folder
        dataset = generate_dataset(world)
        from agentgym_opsd.environments.search_qa.embedding import shared_encoder

        write_index_folder(folder, dataset.passages, shared_encoder().encode, index_cfg, progress=progress,
                           extra_meta={"world": asdict(world), "source": f"generated:{name}"})
        for split in SPLITS:  # questions last: their presence marks the folder complete
            write_questions(folder / f"{split}.jsonl", dataset.questions[split])
    return folder


def prepare_corpus_index(corpus_path: str | os.PathLike[str], index_cfg: IndexConfig, *,
                         cache_dir: str | os.PathLike[str] | None = None, progress: bool = True) -> Path:
    """The index folder of a Search-R1 corpus file, building it if missing (keyed by path, size, mtime)."""
    path = Path(corpus_path).resolve()
    stat = path.stat()
    folder = cache_root(cache_dir) / f"corpus-{_digest([str(path), stat.st_size, stat.st_mtime_ns, asdict(index_cfg)])}"
    if (folder / META_FILE).is_file():
        return folder
    with _BUILD_LOCK:
        if not (folder / META_FILE).is_file():
            from agentgym_opsd.environments.search_qa.embedding import shared_encoder

            write_index_folder(folder, read_corpus(path), shared_encoder().encode, index_cfg, progress=progress,
                               extra_meta={"source": str(path)})
    return folder


def _complete(folder: Path) -> bool:
    return (folder / META_FILE).is_file() and all((folder / f"{s}.jsonl").is_file() for s in SPLITS)
