"""Build a Search-QA index folder (passage store + embeddings + FAISS index) from the command line.

    python -m agentgym_opsd.environments.search_qa.build_index --generate small --out idx/      # generated
    python -m agentgym_opsd.environments.search_qa.build_index --corpus wiki.jsonl --out idx/  # Search-R1
    ... --kind hnsw --hnsw-m 32

Generated worlds also get `train.jsonl` / `test.jsonl` (Search-R1 QA form) in the folder. Point the
environment at the folder with `index_dir=` (and the QA files with `questions_path=`), or serve it with
`python -m agentgym_opsd.environments.search_qa.serve --index idx/`.

`--out` must be a new or empty folder or an index built by this command, which is then replaced
atomically (the old index stays in place until the new one is complete); any other folder is refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from agentgym_opsd.environments.search_qa.data import SPLITS
from agentgym_opsd.environments.search_qa.formats import read_corpus, write_questions
from agentgym_opsd.environments.search_qa.generator import SIZE_PRESETS, generate_dataset
from agentgym_opsd.environments.search_qa.index import (
    INDEX_KINDS,
    IndexConfig,
    NotAnIndexError,
    check_replaceable,
    write_index_folder,
)
from agentgym_opsd.serving import non_negative_int, positive_int

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agentgym_opsd.environments.search_qa.build_index",
                                description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--generate", choices=sorted(SIZE_PRESETS), help="generate a world of this size")
    source.add_argument("--corpus", help="a Search-R1 corpus jsonl ({id, contents} per line)")
    p.add_argument("--out", required=True,
                   help="index folder to write: new, empty, or an index of ours (replaced atomically)")
    p.add_argument("--kind", choices=INDEX_KINDS, default="auto", help="FAISS index kind")
    p.add_argument("--hnsw-m", type=positive_int, default=32, help="HNSW graph degree")
    p.add_argument("--hnsw-ef-search", type=positive_int, default=64, help="HNSW search breadth")
    p.add_argument("--batch-size", type=positive_int, default=256, help="passages per embedding batch")
    p.add_argument("--threads", type=non_negative_int, default=0, help="torch CPU threads (0 = default)")
    p.add_argument("--device", default="cpu", help="torch device for the encoder (cpu, cuda)")
    return p


def _check_paths(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors before minutes of embedding: a missing corpus, an --out that must not be replaced."""
    if args.corpus and not Path(args.corpus).is_file():
        p.error(f"--corpus {args.corpus}: no such file")
    try:
        check_replaceable(args.out)
    except NotAnIndexError as exc:
        p.error(f"--out {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _check_paths(parser, args)
    from agentgym_opsd.environments.search_qa.embedding import MiniLMEncoder

    cfg = IndexConfig(kind=args.kind, hnsw_m=args.hnsw_m, hnsw_ef_search=args.hnsw_ef_search)
    questions = None
    if args.generate:
        dataset = generate_dataset(args.generate)
        passages, questions = dataset.passages, dataset.questions
    else:
        passages = read_corpus(args.corpus)
    encoder = MiniLMEncoder(num_threads=args.threads or None, device=args.device)

    def add_questions(tmp: Path) -> None:  # inside the new folder before the swap: index and questions match
        if questions is None:
            return
        for split in SPLITS:
            write_questions(tmp / f"{split}.jsonl", questions[split])

    try:
        folder = write_index_folder(args.out, passages, encoder.encode, cfg, batch_size=args.batch_size,
                                    progress=True, overwrite=True, before_swap=add_questions,
                                    extra_meta={"source": f"generated:{args.generate}" if args.generate
                                                else args.corpus})
    except NotAnIndexError as exc:  # something was put there while we were building
        parser.error(f"--out {exc}")
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    print(f"wrote {folder}: {meta['num_passages']} passages, {meta['kind']} index, "
          f"embed {meta['seconds_embed']:.1f}s, index {meta['seconds_index']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
