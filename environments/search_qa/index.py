"""FAISS indexes over passage embeddings: build, save, load memory-mapped, search.

An index folder holds the passage store (`store.py`), `embeddings.npy` (n x 384 float32, kept so another
index kind can be built without re-embedding), `index.faiss` and `meta.json` (written last: a folder
without it is incomplete), and for generated worlds the question files `train.jsonl` / `test.jsonl`.
A folder is replaced by a new build only when it is an index of ours (`check_replaceable`): a folder
holding anything else is refused, never emptied. Kinds, by `IndexConfig.kind`:

- `flat`: exact inner-product search (`IndexFlatIP`); the reference for recall.
- `hnsw`: graph search (`IndexHNSWFlat`, inner product); fast at 1M passages, approximate.
- `ivf`: inverted lists (`IndexIVFFlat`, trained k-means cells); for corpora too large for HNSW's memory.
- `auto`: flat up to 50k passages, hnsw above.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentgym_opsd.environments.search_qa.data import SPLITS, Passage
from agentgym_opsd.environments.search_qa.store import CORPUS_FILE, OFFSETS_FILE, PassageStore, write_store
from agentgym_opsd.files import make_tmp_dir, publish_dir, to_json

__all__ = ["IndexConfig", "DenseIndex", "build_faiss_index", "write_index_folder", "check_replaceable",
           "NotAnIndexError", "META_FILE", "INDEX_KINDS"]

META_FILE = "meta.json"
INDEX_FILE = "index.faiss"
EMBEDDINGS_FILE = "embeddings.npy"
INDEX_KINDS = ("flat", "hnsw", "ivf", "auto")
_AUTO_FLAT_MAX = 50_000
_OUR_FILES = frozenset({META_FILE, INDEX_FILE, EMBEDDINGS_FILE, CORPUS_FILE, OFFSETS_FILE,
                        *(f"{split}.jsonl" for split in SPLITS)})


class NotAnIndexError(FileExistsError):
    """The folder to write holds something that is not a Search-QA index; it is left untouched."""


def check_replaceable(folder: str | os.PathLike[str]) -> None:
    """Raise NotAnIndexError unless a new index may replace `folder`: it does not exist, is an empty folder,
    or is an index of ours (a `meta.json` with our keys and nothing but our files). Anything else would be
    deleted by the swap: `--out .` once emptied the working folder."""
    path = Path(folder)
    if not path.exists() and not path.is_symlink():
        return
    if not path.is_dir():
        raise NotAnIndexError(f"{path} exists and is not a folder; refusing to replace it")
    names = sorted(entry.name for entry in path.iterdir())
    if not names:
        return
    foreign = [n for n in names if n not in _OUR_FILES]
    if META_FILE not in names or foreign or not _is_our_meta(path / META_FILE):
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "") if foreign else f"no valid {META_FILE}"
        raise NotAnIndexError(f"{path} is not empty and not a Search-QA index ({shown}); refusing to replace "
                              f"it: choose a new or empty folder, or remove it yourself")


def _is_our_meta(path: Path) -> bool:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and {"num_passages", "dim", "kind"} <= meta.keys()


@dataclass(frozen=True)
class IndexConfig:
    """Which FAISS index to build and how to search it."""

    kind: str = "auto"
    """flat | hnsw | ivf | auto (flat up to 50k passages, else hnsw)."""
    hnsw_m: int = 32
    """HNSW graph degree: more = better recall, more memory and build time."""
    hnsw_ef_construction: int = 64
    hnsw_ef_search: int = 64
    """HNSW candidate list at search time (recall vs. latency)."""
    ivf_nlist: int = 0
    """IVF cells; 0 = 4 * sqrt(n)."""
    ivf_nprobe: int = 16
    """IVF cells visited per query."""

    def __post_init__(self) -> None:
        if self.kind not in INDEX_KINDS:
            raise ValueError(f"IndexConfig.kind must be one of {INDEX_KINDS}, got {self.kind!r}")
        for name in ("hnsw_m", "hnsw_ef_construction", "hnsw_ef_search", "ivf_nprobe"):
            if getattr(self, name) < 1:
                raise ValueError(f"IndexConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.ivf_nlist < 0:
            raise ValueError(f"IndexConfig.ivf_nlist must be >= 0, got {self.ivf_nlist}")

    def resolved_kind(self, num_vectors: int) -> str:
        if self.kind != "auto":
            return self.kind
        return "flat" if num_vectors <= _AUTO_FLAT_MAX else "hnsw"


def build_faiss_index(vectors: np.ndarray, cfg: IndexConfig) -> Any:
    """A FAISS index over unit `vectors` (n, d) float32, ranking by inner product."""
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    kind = cfg.resolved_kind(n)
    index: Any
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.hnsw_ef_construction
        index.hnsw.efSearch = cfg.hnsw_ef_search
    else:
        nlist = cfg.ivf_nlist or max(1, min(n // 39, int(4 * np.sqrt(n))))  # FAISS wants >= 39 points per cell
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        sample = vectors if n <= 256 * nlist else vectors[np.random.default_rng(0).choice(n, 256 * nlist, replace=False)]
        index.train(sample)
        index.nprobe = min(cfg.ivf_nprobe, nlist)
    # add in chunks so the caller's memory-mapped embeddings are paged in gradually
    for start in range(0, n, 100_000):
        index.add(vectors[start:start + 100_000])
    return index


def write_index_folder(
    folder: str | os.PathLike[str],
    passages: Sequence[Passage],
    embed: Callable[[Sequence[str]], np.ndarray],
    cfg: IndexConfig,
    *,
    batch_size: int = 256,
    progress: bool = True,
    extra_meta: dict[str, Any] | None = None,
    overwrite: bool = False,
    before_swap: Callable[[Path], None] | None = None,
) -> Path:
    """Embed `passages` with `embed` (texts -> unit vectors), build the index and write the folder
    atomically (built in a hidden sibling folder, renamed into place). Returns the folder. Without
    `overwrite`, a complete folder that appeared meanwhile (another process built it) is kept and this
    build discarded; with it, an index of ours is replaced. A folder that is not an index of ours is never
    replaced (NotAnIndexError, checked before the build and again before the swap). `before_swap(tmp)` may
    add files (questions) to the new folder so that they appear together with the index."""
    from tqdm.auto import tqdm

    target = Path(os.path.abspath(folder))  # `.` has no name to build a sibling from
    check_replaceable(target)
    tmp = make_tmp_dir(target)  # removes the leftovers of builds that were killed mid-way (whole indexes)
    try:
        t0 = time.perf_counter()
        num = write_store(tmp, passages)
        vectors = None
        with tqdm(total=num, desc="embedding passages", unit="passage", disable=not progress) as bar:
            for start in range(0, num, batch_size):
                chunk = embed([p.contents for p in passages[start:start + batch_size]])
                if vectors is None:
                    vectors = np.lib.format.open_memmap(tmp / EMBEDDINGS_FILE, mode="w+", dtype=np.float32,
                                                        shape=(num, chunk.shape[1]))
                vectors[start:start + len(chunk)] = chunk
                bar.update(len(chunk))
        seconds_embed = time.perf_counter() - t0
        if vectors is None:
            raise ValueError("cannot build an index over an empty corpus")
        vectors.flush()
        t1 = time.perf_counter()
        index = build_faiss_index(vectors, cfg)
        seconds_index = time.perf_counter() - t1
        import faiss

        faiss.write_index(index, str(tmp / INDEX_FILE))
        meta = {"num_passages": num, "dim": int(vectors.shape[1]), "kind": cfg.resolved_kind(num),
                "config": asdict(cfg), "seconds_embed": seconds_embed, "seconds_index": seconds_index,
                **(extra_meta or {})}
        del vectors
        if before_swap is not None:
            before_swap(tmp)
        (tmp / META_FILE).write_text(to_json(meta, indent=2), encoding="utf-8")
        check_replaceable(target)  # something may have been put there during the build
        # an index already there is deleted only once the new one is in place (`overwrite`), else it stays
        publish_dir(tmp, target, keep=lambda there: not overwrite and (there / META_FILE).is_file())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Path(folder)


class DenseIndex:
    """A loaded index folder: `search(vectors, topk)` -> (scores, rows), `store[row]` -> Passage."""

    def __init__(self, folder: str | os.PathLike[str], *, mmap: bool = True) -> None:
        import faiss

        self.folder = Path(folder)
        meta_path = self.folder / META_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(f"{self.folder}: not a complete index folder (no {META_FILE}); "
                                    f"build it with python -m agentgym_opsd.environments.search_qa.build_index")
        self.meta: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
        path = str(self.folder / INDEX_FILE)
        flags = faiss.IO_FLAG_MMAP if mmap else 0
        try:
            self.index = faiss.read_index(path, flags)
        except RuntimeError:
            self.index = faiss.read_index(path)  # this index type cannot be memory-mapped: read it whole
        cfg = self.meta.get("config", {})
        if hasattr(self.index, "hnsw"):
            self.index.hnsw.efSearch = int(cfg.get("hnsw_ef_search", 64))
        if hasattr(self.index, "nprobe"):
            self.index.nprobe = int(cfg.get("ivf_nprobe", 16))
        self.store = PassageStore(self.folder)
        if len(self.store) != self.index.ntotal:
            raise ValueError(f"{self.folder}: {len(self.store)} passages but {self.index.ntotal} vectors")

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def __len__(self) -> int:
        return len(self.store)

    def search(self, vectors: np.ndarray, topk: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows), each (num_queries, topk); rows are -1 where fewer than topk passages exist."""
        return self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), topk)
