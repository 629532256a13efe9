"""The data every part of Search-QA shares: passages, questions and their hop chains."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Passage", "Hop", "Question", "QADataset", "QUESTION_KINDS", "SPLITS"]

QUESTION_KINDS = ("single_hop", "multi_hop", "comparison")
"""single_hop: one lookup answers it; multi_hop: 2-3 chained lookups, each needing the previous answer;
comparison: two lookups whose values are compared."""

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Passage:
    """One retrievable passage. `id` is its row in the corpus (a decimal string, as in Search-R1)."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Search-R1 corpus form: the quoted title, a newline, the text."""
        return f'"{self.title}"\n{self.text}'

    @classmethod
    def from_contents(cls, passage_id: str, contents: str) -> Passage:
        title, _, text = contents.partition("\n")
        return cls(id=str(passage_id), title=title.strip().strip('"'), text=text.strip())


@dataclass(frozen=True)
class Hop:
    """One retrieval step of a question's reasoning chain.

    `entity` is what the step looks up, `relation` the attribute read there, `query` a search query that
    retrieves `passage_id` (the passage that states it), `value` what the step learns.
    """

    entity: str
    relation: str
    query: str
    passage_id: str
    value: str

    def to_dict(self) -> dict[str, str]:
        return {"entity": self.entity, "relation": self.relation, "query": self.query,
                "passage_id": self.passage_id, "value": self.value}


@dataclass(frozen=True)
class Question:
    """A question with its gold answers. `hops` is empty for questions loaded from real QA files."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    kind: str
    hops: tuple[Hop, ...] = ()
    data_source: str = "synthetic"

    @property
    def num_hops(self) -> int:
        """Retrievals an expert needs (1 when the chain is unknown)."""
        return max(1, len(self.hops))

    def to_dict(self) -> dict[str, Any]:
        """Search-R1 QA record fields plus ours (`kind`, `hops`)."""
        return {"id": self.id, "question": self.question, "golden_answers": list(self.golden_answers),
                "data_source": self.data_source, "kind": self.kind, "hops": [h.to_dict() for h in self.hops]}

    @classmethod
    def from_dict(cls, record: dict[str, Any], *, default_id: str = "") -> Question:
        answers = record.get("golden_answers")
        if answers is None and "answer" in record:
            answers = [record["answer"]]
        # parquet gives numpy arrays; a bare string is one answer
        answers = [answers] if isinstance(answers, str) else list(answers or ())
        if not record.get("question") or not answers:
            raise ValueError(f"QA record needs 'question' and 'golden_answers', got keys {sorted(record)}")
        hops = tuple(Hop(**h) for h in record.get("hops") or ())
        kind = str(record.get("kind") or ("multi_hop" if len(hops) > 1 else "single_hop"))
        return cls(id=str(record.get("id", default_id)), question=str(record["question"]).strip(),
                   golden_answers=tuple(str(a) for a in answers), kind=kind, hops=hops,
                   data_source=str(record.get("data_source", "unknown")))


@dataclass
class QADataset:
    """A corpus and its questions by split."""

    passages: list[Passage]
    questions: dict[str, list[Question]] = field(default_factory=dict)
