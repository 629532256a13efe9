"""Build a Search-QA index folder (passage store + embeddings + FAISS index) from the command line.

    python -m agentgym_opsd.environments.search_qa.build_index --generate small --out idx/      # generated
    python -m agentgym_opsd.environments.search_qa.build_index --corpus wiki.jsonl --out idx/  # Search-R1
    ... --kind hnsw --hnsw-m 32

Generated worlds also get `train.jsonl` / `test.jsonl` (Search-R1 QA form) in the folder. Point the
environment at the folder with `index_dir=` (and the QA files with `questions_path=`), or serve it with
`python -m agentgym_opsd.environments.search_qa.serve --index idx/`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from agentgym_opsd.environments.search_qa.data import SPLITS
from agentgym_opsd.environments.search_qa.formats import read_corpus, write_questions
from agentgym_opsd.environments.search_qa.generator import SIZE_PRESETS, generate_dataset
from agentgym_opsd.environments.search_qa.index import INDEX_KINDS, IndexConfig, write_index_folder

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agentgym_opsd.environments.search_qa.build_index",
                                description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--generate", choices=sorted(SIZE_PRESETS), help="generate a world of this size")
    source.add_argument("--corpus", help="a Search-R1 corpus jsonl ({id, contents} per line)")
    p.add_argument("--out", required=True, help="index folder to write (replaced atomically)")
    p.add_argument("--kind", choices=INDEX_KINDS, default="auto", help="FAISS index kind")
    p.add_argument("--hnsw-m", type=int, default=32, help="HNSW graph degree")
    p.add_argument("--hnsw-ef-search", type=int, default=64, help="HNSW search breadth")
    p.add_argument("--batch-size", type=int, default=256, help="passages per embedding batch")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    p.add_argument("--device", default="cpu", help="torch device for the encoder (cpu, cuda)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from agentgym_opsd.environments.search_qa.embedding import MiniLMEncoder

    cfg = IndexConfig(kind=args.kind, hnsw_m=args.hnsw_m, hnsw_ef_search=args.hnsw_ef_search)
    questions = None
    if args.generate:
        dataset = generate_dataset(args.generate)
        passages, questions = dataset.passages, dataset.questions
    else:
        passages = read_corpus(args.corpus)
    encoder = MiniLMEncoder(num_threads=args.threads or None, device=args.device)
    folder = write_index_folder(args.out, passages, encoder.encode, cfg, batch_size=args.batch_size,
                                progress=True, overwrite=True,
                                extra_meta={"source": f"generated:{args.generate}" if args.generate else args.corpus})
    if questions is not None:
        for split in SPLITS:
            write_questions(folder / f"{split}.jsonl", questions[split])
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    print(f"wrote {folder}: {meta['num_passages']} passages, {meta['kind']} index, "
          f"embed {meta['seconds_embed']:.1f}s, index {meta['seconds_index']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
