"""Search-R1 file formats: the corpus `jsonl` and the QA files, read and written.

Corpus lines are `{"id": "0", "contents": "\\"Title\\"\\ntext"}`; QA records carry `question`,
`golden_answers` (a list) and `data_source` (`jsonl`, or `parquet` when pyarrow is installed). Questions we
generate add `kind` and `hops`, which other tools ignore.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from agentgym_opsd.environments.search_qa.data import Passage, Question
from agentgym_opsd.files import atomic_write_lines, to_json

__all__ = ["iter_corpus", "read_corpus", "write_corpus", "read_questions", "write_questions"]


def iter_corpus(path: str | os.PathLike[str]) -> Iterator[Passage]:
    """Passages of a Search-R1 corpus file, in file order. A line without `contents` is an error naming it."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                contents = record["contents"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{line_no}: not a corpus record with 'id' and 'contents' ({exc})") from exc
            yield Passage.from_contents(str(record.get("id", line_no - 1)), str(contents))


def read_corpus(path: str | os.PathLike[str]) -> list[Passage]:
    return list(iter_corpus(path))


def write_corpus(path: str | os.PathLike[str], passages: Iterable[Passage]) -> None:
    atomic_write_lines(path, (to_json({"id": p.id, "contents": p.contents}) + "\n" for p in passages))


def _read_records(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(f"reading {path} needs pyarrow (pip install pyarrow), or convert it to jsonl") from exc
        return pq.read_table(path).to_pylist()
    records = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{line_no}: invalid JSON ({exc})") from exc
    return records


def read_questions(path: str | os.PathLike[str]) -> list[Question]:
    """Questions of a Search-R1 QA file (`.jsonl` or `.parquet`). Records in Search-R1's processed form
    (`golden_answers` nested under `reward_model.ground_truth.target`) are read too."""
    questions = []
    for i, record in enumerate(_read_records(Path(path))):
        if "golden_answers" not in record and isinstance(record.get("reward_model"), dict):
            target = (record["reward_model"].get("ground_truth") or {}).get("target")
            record = {**record, "golden_answers": list(target) if target is not None else None}
        if "question" not in record and isinstance(record.get("extra_info"), dict):
            record = {**record, "question": record["extra_info"].get("question")}
        try:
            questions.append(Question.from_dict(record, default_id=str(i)))
        except ValueError as exc:
            raise ValueError(f"{path}: record {i}: {exc}") from exc
    return questions


def write_questions(path: str | os.PathLike[str], questions: Iterable[Question]) -> None:
    atomic_write_lines(path, (to_json(q.to_dict()) + "\n" for q in questions))
