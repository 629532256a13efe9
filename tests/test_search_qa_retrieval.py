"""Search-QA retrieval: index kinds agree with brute force, the store reads back, the real encoder finds
gold passages of a tiny corpus."""

from __future__ import annotations

import numpy as np
import pytest

from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
from agentgym_opsd.environments.search_qa.generator import generate_dataset
from agentgym_opsd.environments.search_qa.index import (
    DenseIndex,
    IndexConfig,
    build_faiss_index,
    write_index_folder,
)
from agentgym_opsd.environments.search_qa.retriever import DenseRetriever, clean_query
from agentgym_opsd.environments.search_qa.store import PassageStore


@pytest.fixture(scope="module")
def tiny():
    return generate_dataset("tiny")


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_index_kinds_match_brute_force(kind: str) -> None:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((2_000, 32)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    queries = data[:50] + 0.05 * rng.standard_normal((50, 32)).astype(np.float32)
    index = build_faiss_index(data, IndexConfig(kind=kind, ivf_nprobe=64))
    _, rows = index.search(queries, 5)
    truth = np.argsort(-(queries @ data.T), axis=1)[:, :5]
    overlap = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(rows, truth, strict=True)])
    assert overlap >= (1.0 if kind == "flat" else 0.9)
    assert (rows[:, 0] == np.arange(50)).mean() >= 0.95


def test_auto_kind_and_bad_config() -> None:
    assert IndexConfig().resolved_kind(1_000) == "flat"
    assert IndexConfig().resolved_kind(1_000_000) == "hnsw"
    with pytest.raises(ValueError, match="kind"):
        IndexConfig(kind="lsh")


def test_folder_round_trip_and_memory_mapped_store(tmp_path, tiny) -> None:
    folder = write_index_folder(tmp_path / "idx", tiny.passages, HashingEncoder().encode, IndexConfig(kind="flat"),
                                progress=False)
    store = PassageStore(folder)
    assert len(store) == len(tiny.passages)
    assert [store[i] for i in (0, 57, len(store) - 1)] == [tiny.passages[i] for i in (0, 57, len(store) - 1)]
    with pytest.raises(IndexError):
        store[len(store)]
    retriever = DenseRetriever(folder, encoder=HashingEncoder().encode)
    target = tiny.passages[40]
    hits = retriever.retrieve([target.contents], 3)[0]
    assert hits[0].passage == target and hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert len(retriever.retrieve(["anything"], 100)[0]) == 100
    with pytest.raises(ValueError, match="topk"):
        retriever.retrieve(["x"], 0)
    # a second build into an existing complete folder keeps it (another process won the race)
    assert write_index_folder(folder, tiny.passages[:3], HashingEncoder().encode, IndexConfig(), progress=False) == folder
    assert len(DenseIndex(folder)) == len(tiny.passages)


def test_clean_query_handles_bad_text() -> None:
    assert clean_query("bad \udcff byte") == "bad ? byte"
    assert len(clean_query("x" * 100_000)) == 2_000
    assert clean_query("  a \n b ") == "a b"


def test_minilm_finds_gold_passages(tmp_path, tiny) -> None:
    from agentgym_opsd.environments.search_qa.embedding import shared_encoder

    encoder = shared_encoder()
    vectors = encoder.encode(["hello world", "hello world", "\udcff"])
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(vectors[0], vectors[1], atol=1e-6)
    folder = write_index_folder(tmp_path / "idx", tiny.passages, encoder.encode, IndexConfig(kind="flat"), progress=False)
    retriever = DenseRetriever(folder, encoder=encoder.encode)
    hops = [h for qs in tiny.questions.values() for q in qs for h in q.hops]
    results = retriever.retrieve([h.query for h in hops], 3)
    found = np.mean([h.passage_id in {x.passage.id for x in hits} for h, hits in zip(hops, results, strict=True)])
    assert found >= 0.95
