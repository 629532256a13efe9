"""Search-QA retrieval benchmarks, measured side by side in one run.

1. Recall: recall@1/@5 of the gold passage for single-hop questions (question text as the query), real
   MiniLM embeddings of a generated corpus, Flat vs HNSW; embedding passages/s; end-to-end query latency.
2. Speed: queries/s (batches of 256) and single-query p50/p99 latency of Flat vs HNSW at several corpus
   sizes, with build time and index size. The 10k row uses the real MiniLM passage embeddings; larger rows
   use synthetic unit vectors of the same dimension (384) with a low intrinsic dimension like real
   sentence embeddings (`--synthetic-latent-dim`, 32 by default; 384 = unstructured random vectors, a worst
   case for graph indexes), each query a noisy copy of a corpus vector whose gold is that vector
   (embedding 1M passages with MiniLM on 2 CPU cores would take hours).

    python benchmarks/bench_search_qa.py                    # recall at 10k, speed at 10k/100k/1m
    python benchmarks/bench_search_qa.py --speed-sizes 10k  # quick
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass

import faiss
import numpy as np
from rich.console import Console
from rich.table import Table

from agentgym_opsd.environments.search_qa.embedding import MiniLMEncoder
from agentgym_opsd.environments.search_qa.generator import generate_dataset
from agentgym_opsd.environments.search_qa.index import IndexConfig, build_faiss_index

SIZES = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000}


@dataclass
class SpeedRow:
    num_passages: int
    vectors: str
    kind: str
    build_s: float
    size_mb: float
    qps: float
    p50_ms: float
    p99_ms: float
    recall5: float


def _index_size_mb(index) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "i.faiss")
        faiss.write_index(index, path)
        return os.path.getsize(path) / 2**20


def _speed(index, queries: np.ndarray, gold: np.ndarray) -> tuple[float, float, float, float]:
    t0 = time.perf_counter()
    _, rows = index.search(queries, 5)
    qps = len(queries) / (time.perf_counter() - t0)
    recall5 = float(np.mean([g in r for g, r in zip(gold, rows, strict=True)]))
    lat = []
    # one query is too little work to share between threads; OpenMP start-up would dominate the latency
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    for q in queries[:300]:
        t = time.perf_counter()
        index.search(q[None, :], 5)
        lat.append((time.perf_counter() - t) * 1000)
    faiss.omp_set_num_threads(threads)
    return qps, float(np.percentile(lat, 50)), float(np.percentile(lat, 99)), recall5


def _speed_rows(vectors: np.ndarray, queries: np.ndarray, gold: np.ndarray, label: str,
                hnsw: IndexConfig) -> list[SpeedRow]:
    rows = []
    for kind in ("flat", "hnsw"):
        cfg = IndexConfig(kind=kind, hnsw_m=hnsw.hnsw_m, hnsw_ef_construction=hnsw.hnsw_ef_construction,
                          hnsw_ef_search=hnsw.hnsw_ef_search)
        t0 = time.perf_counter()
        index = build_faiss_index(vectors, cfg)
        build_s = time.perf_counter() - t0
        qps, p50, p99, r5 = _speed(index, queries, gold)
        rows.append(SpeedRow(len(vectors), label, kind, build_s, _index_size_mb(index), qps, p50, p99, r5))
        del index
    return rows


def _synthetic(n: int, num_queries: int, seed: int = 0, latent_dim: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unit vectors in 384 dimensions with a `latent_dim`-dimensional structure (a random linear map of
    Gaussian codes), and queries that are a corpus vector's code plus noise.

    Sentence embeddings have a low intrinsic dimension (a few dozen); i.i.d. random 384-d vectors have none,
    which is the one case a graph index cannot navigate (every point is nearly equidistant), so they would
    measure an artefact rather than retrieval. `latent_dim=384` gives that unstructured worst case.
    """
    rng = np.random.default_rng(seed)
    mixing = rng.standard_normal((latent_dim, 384), dtype=np.float32) / np.sqrt(latent_dim)
    codes = np.empty((n, latent_dim), dtype=np.float32)
    vectors = np.empty((n, 384), dtype=np.float32)
    for start in range(0, n, 100_000):  # chunks keep the temporaries small
        chunk = rng.standard_normal((min(100_000, n - start), latent_dim), dtype=np.float32)
        codes[start:start + len(chunk)] = chunk
        mapped = chunk @ mixing
        vectors[start:start + len(chunk)] = mapped / np.linalg.norm(mapped, axis=1, keepdims=True)
    gold = rng.choice(n, num_queries, replace=False)
    noise = rng.standard_normal((num_queries, latent_dim), dtype=np.float32)
    query_codes = codes[gold] + 0.3 * noise * np.linalg.norm(codes[gold], axis=1, keepdims=True) / np.sqrt(latent_dim)
    queries = query_codes @ mixing
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return vectors, queries.astype(np.float32), gold


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recall-corpus", default="10k", help="generated corpus preset for the recall table")
    p.add_argument("--speed-sizes", default="10k,100k,1m", help="comma list of 10k, 100k, 1m")
    p.add_argument("--num-queries", type=int, default=1000)
    p.add_argument("--hnsw-m", type=int, default=32)
    p.add_argument("--hnsw-ef-construction", type=int, default=64)
    p.add_argument("--hnsw-ef-search", type=int, default=64)
    p.add_argument("--synthetic-latent-dim", type=int, default=32,
                   help="intrinsic dimension of the synthetic vectors (384 = unstructured random)")
    args = p.parse_args()
    console = Console()
    hnsw = IndexConfig(kind="hnsw", hnsw_m=args.hnsw_m, hnsw_ef_construction=args.hnsw_ef_construction,
                       hnsw_ef_search=args.hnsw_ef_search)

    # ---- recall with real embeddings ---------------------------------------------------------------------
    data = generate_dataset(args.recall_corpus)
    encoder = MiniLMEncoder(batch_size=128)
    texts = [p.contents for p in data.passages]
    t0 = time.perf_counter()
    passage_vectors = encoder.encode(texts)
    embed_s = time.perf_counter() - t0
    singles = [q for qs in data.questions.values() for q in qs if q.kind == "single_hop"]
    t0 = time.perf_counter()
    question_vectors = encoder.encode([q.question for q in singles])
    encode_query_ms = (time.perf_counter() - t0) * 1000 / len(singles)
    gold = np.array([int(q.hops[0].passage_id) for q in singles])
    recall = Table(title=f"Recall of the gold passage, single-hop questions (MiniLM, {len(texts):,} generated "
                         f"passages, {len(singles)} questions)")
    for col in ("index", "recall@1", "recall@5", "search ms/query (batch)", "encode+search ms/query"):
        recall.add_column(col, justify="right")
    for kind in ("flat", "hnsw"):
        index = build_faiss_index(passage_vectors, IndexConfig(kind=kind, hnsw_m=args.hnsw_m,
                                                               hnsw_ef_search=args.hnsw_ef_search))
        t0 = time.perf_counter()
        _, rows = index.search(question_vectors, 5)
        search_ms = (time.perf_counter() - t0) * 1000 / len(singles)
        r1 = float(np.mean(rows[:, 0] == gold))
        r5 = float(np.mean([g in r for g, r in zip(gold, rows, strict=True)]))
        recall.add_row(kind, f"{r1:.3f}", f"{r5:.3f}", f"{search_ms:.3f}", f"{search_ms + encode_query_ms:.2f}")
    console.print(recall)
    console.print(f"embedding: {len(texts) / embed_s:,.0f} passages/s (MiniLM-L6, CPU, {torch_threads()} threads); "
                  f"queries encoded at {1000 / encode_query_ms:,.0f}/s in batches")

    # ---- speed at several sizes -------------------------------------------------------------------------
    speed = Table(title=f"Flat vs HNSW (M={args.hnsw_m}, efConstruction={args.hnsw_ef_construction}, "
                        f"efSearch={args.hnsw_ef_search}), top-5, {args.num_queries} queries, "
                        f"{faiss.omp_get_max_threads()} FAISS threads")
    for col in ("passages", "vectors", "index", "build s", "size MB", "queries/s (batch 1000)", "p50 ms (1 query, 1 thread)",
                "p99 ms", "recall@5"):
        speed.add_column(col, justify="right")
    rows_out: list[SpeedRow] = []
    for size in [s.strip() for s in args.speed_sizes.split(",") if s.strip()]:
        n = SIZES[size]
        if size == "10k":
            n = min(n, len(passage_vectors))
            sub = passage_vectors[:n]
            keep = gold < n
            rows_out += _speed_rows(sub, question_vectors[keep], gold[keep], "MiniLM (real)", hnsw)
        else:
            vectors, queries, qgold = _synthetic(n, args.num_queries, latent_dim=args.synthetic_latent_dim)
            label = "synthetic random" if args.synthetic_latent_dim >= 384 else f"synthetic, dim {args.synthetic_latent_dim}"
            rows_out += _speed_rows(vectors, queries, qgold, label, hnsw)
            del vectors
        for r in rows_out[-2:]:
            speed.add_row(f"{r.num_passages:,}", r.vectors, r.kind, f"{r.build_s:.1f}", f"{r.size_mb:,.0f}",
                          f"{r.qps:,.0f}", f"{r.p50_ms:.3f}", f"{r.p99_ms:.3f}", f"{r.recall5:.3f}")
            console.print(f"  done: {r.num_passages:,} {r.kind}")
    console.print(speed)


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
