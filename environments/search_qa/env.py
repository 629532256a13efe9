"""`SearchQA-v0`: answer a question by searching a corpus, Search-R1 style.

Each turn the agent sends `<search>query</search>` (observation: the top-k passages inside
`<information>...</information>`) or `<answer>text</answer>` (the episode ends; reward 1 when the answer matches a
gold answer after normalisation, else 0). As in Search-R1, the first complete tag is acted on and an empty tag is
an action; a response without a complete tag is invalid (a fixed message, `action_valid=False`, the episode goes
on). `max_turns` (4) counts search turns as in Search-R1, plus one final turn for the answer, in which a search is
not run. `info["oracle_distance"]`: the gold hops not yet retrieved (a hop is done once its passage was seen or its
query tried; a question without a hop chain needs one search) plus 1 for the answer; 0 after a correct answer,
None after a wrong one. `info["privileged_hints"]` (reset), for the self-teacher only: `goal`, the titles of the
gold supporting passages in hop order; `answer`, those titles and the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from agentgym_opsd.core import (
    ACTION_VALID,
    ADMISSIBLE_ACTIONS,
    ORACLE_DISTANCE,
    PRIVILEGED_HINTS,
    SCORE,
    TASK_ID,
    TASK_TEXT,
    TASK_TYPE,
    WON,
    EpisodeEndedError,
    TextEnv,
)
from agentgym_opsd.environments.search_qa.data import SPLITS, Hop, Question
from agentgym_opsd.environments.search_qa.formats import read_questions
from agentgym_opsd.environments.search_qa.index import IndexConfig
from agentgym_opsd.environments.search_qa.normalize import exact_match
from agentgym_opsd.environments.search_qa.retriever import (
    MAX_TOPK,
    HttpRetriever,
    Retriever,
    SearchHit,
    shared_dense_retriever,
)
from agentgym_opsd.parsers import make_parser

__all__ = ["SearchQAConfig", "SearchQAEnv", "INVALID_ACTION_MESSAGE", "ORACLE_DISTANCE", "format_information"]

INVALID_ACTION_MESSAGE = (
    "Your previous action is invalid. Write exactly one <search>query</search> to search, or "
    "<answer>text</answer> to give your final answer, then try again."
)
_PARSER = make_parser("tag:search,answer")  # Search-R1: the first complete <search> or <answer> is the action


@dataclass(frozen=True)
class SearchQAConfig:
    """Where the questions, corpus and index come from, and how to search."""

    corpus: str = "small"
    """Generated world size (tiny | small | 10k | 100k | 1m) when no real data is given."""
    questions_path: dict[str, str] = field(default_factory=dict)
    """Real QA files by split (Search-R1 jsonl/parquet), e.g. {"train": "nq_train.jsonl"}."""
    corpus_path: str | None = None
    """A Search-R1 corpus jsonl to index (once, into the cache) when `index_dir` is not given."""
    index_dir: str | None = None
    """A ready index folder (from build_index)."""
    retriever_url: str | None = None
    """A running `/retrieve` server; when set, this process loads no index or encoder."""
    index_kind: str = "auto"
    """flat | hnsw | ivf | auto, for indexes built on first use."""
    topk: int = 3
    """Passages returned per search."""
    cache_dir: str | None = None
    """Cache root for built corpora (default $AGENTGYM_OPSD_CACHE/search_qa or ~/.cache/agentgym_opsd/...)."""

    def __post_init__(self) -> None:
        if not 1 <= self.topk <= MAX_TOPK:
            raise ValueError(f"SearchQAConfig.topk must be in [1, {MAX_TOPK}], got {self.topk}")
        IndexConfig(kind=self.index_kind)  # validates the kind
        if self.questions_path and not (self.index_dir or self.corpus_path or self.retriever_url):
            raise ValueError("SearchQAConfig.questions_path (real questions) needs a corpus: set index_dir, "
                             "corpus_path or retriever_url")


def format_information(hits: Sequence[SearchHit]) -> str:
    """Search-R1's result block, as its rollout renders it: the passage's first line (the quoted title of
    the corpus record) and the rest, `Doc i(Title: "t") text` per hit, inside <information> tags with a blank
    line on each side."""
    docs = []
    for i, h in enumerate(hits, 1):
        title, _, text = h.passage.contents.partition("\n")
        docs.append(f"Doc {i}(Title: {title}) {text}")
    return "\n\n<information>" + "\n".join(docs).strip() + "</information>\n\n"


class SearchQAEnv(TextEnv):
    """Search-QA over a generated world (default) or real Search-R1 data.

    Args: `split` (train | test), `max_turns`, `config` (a `SearchQAConfig`) or its fields as keywords,
    `retriever` (any object with `retrieve(queries, topk)`, overriding the config's).
    """

    def __init__(self, *, split: str = "train", max_turns: int = 4, render_mode: str | None = None,
                 config: SearchQAConfig | None = None, retriever: Retriever | None = None,
                 **overrides: Any) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        # Search-R1 counts search turns; the final answer turn comes on top (module docstring)
        super().__init__(max_turns=max_turns + 1, render_mode=render_mode)
        self.search_turns = max_turns
        known = {f.name for f in fields(SearchQAConfig)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"SearchQAEnv got unknown options {unknown}; SearchQAConfig fields: {sorted(known)}")
        if config is not None and overrides:
            raise TypeError("pass either config= or SearchQAConfig fields as keywords, not both")
        self.config = config or SearchQAConfig(**overrides)
        if split not in SPLITS and split not in self.config.questions_path:
            raise ValueError(f"unknown split {split!r}; splits: {sorted(set(SPLITS) | set(self.config.questions_path))}")
        self.split = split
        self.questions, default_index = self._load_questions()
        if not self.questions:
            raise ValueError(f"split {split!r} has no questions")
        self.retriever = retriever or self._make_retriever(default_index)
        self._question: Question | None = None
        self._seen_passages: set[str] = set()
        self._queries: set[str] = set()

    # ---- data ------------------------------------------------------------------------------------------
    def _load_questions(self) -> tuple[list[Question], Path | None]:
        cfg = self.config
        if cfg.questions_path:
            if self.split not in cfg.questions_path:
                raise ValueError(f"no questions file for split {self.split!r}")
            return read_questions(cfg.questions_path[self.split]), None
        from agentgym_opsd.environments.search_qa.resources import prepare_generated

        folder = prepare_generated(cfg.corpus, IndexConfig(kind=cfg.index_kind), cache_dir=cfg.cache_dir)
        return read_questions(folder / f"{self.split}.jsonl"), folder

    def _make_retriever(self, default_index: Path | None) -> Retriever:
        cfg = self.config
        if cfg.retriever_url:
            return HttpRetriever(cfg.retriever_url)
        if cfg.index_dir:
            return shared_dense_retriever(cfg.index_dir)
        if cfg.corpus_path:
            from agentgym_opsd.environments.search_qa.resources import prepare_corpus_index

            return shared_dense_retriever(prepare_corpus_index(cfg.corpus_path, IndexConfig(kind=cfg.index_kind),
                                                               cache_dir=cfg.cache_dir))
        assert default_index is not None  # generated worlds always come with their index
        return shared_dense_retriever(default_index)

    @property
    def num_tasks(self) -> int:
        return len(self.questions)

    @property
    def question(self) -> Question:
        if self._question is None:
            raise RuntimeError("call reset() first")
        return self._question

    # ---- turn API --------------------------------------------------------------------------------------
    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if "task_id" in options:
            matches = [i for i, q in enumerate(self.questions) if q.id == options["task_id"]]
            if not matches:
                raise ValueError(f"no question with task_id {options['task_id']!r} in split {self.split!r}")
            index = matches[0]
        elif "task_index" in options:
            index = int(options["task_index"])
            if not 0 <= index < self.num_tasks:
                raise ValueError(f"task_index {index} outside [0, {self.num_tasks})")
        else:
            index = int(self.np_random.integers(self.num_tasks))
        q = self._question = self.questions[index]
        self._seen_passages = set()
        self._queries = set()
        info = {TASK_ID: q.id, TASK_TYPE: q.kind, TASK_TEXT: q.question, ADMISSIBLE_ACTIONS: None,
                "num_hops": q.num_hops, "data_source": q.data_source, "split": self.split,
                ORACLE_DISTANCE: self._oracle_distance(), PRIVILEGED_HINTS: question_hints(q)}
        return f"Question: {q.question}", info

    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        parsed = _PARSER.parse(action)
        if not parsed.valid:
            return INVALID_ACTION_MESSAGE, 0.0, False, {ACTION_VALID: False, "invalid_reason": parsed.reason,
                                                        ORACLE_DISTANCE: self._oracle_distance()}
        content = parsed.action[len(parsed.kind or "") + 2: -(len(parsed.kind or "") + 3)]
        if parsed.kind == "search" and self.turn >= self.search_turns:  # the final turn is for the answer
            return format_information([]), 0.0, False, {ACTION_VALID: True, ORACLE_DISTANCE: self._oracle_distance()}
        if parsed.kind == "search":
            hits = self.retriever.retrieve([content], self.config.topk)[0]
            self._queries.add(content)
            self._seen_passages.update(h.passage.id for h in hits)
            return format_information(hits), 0.0, False, {ACTION_VALID: True, ORACLE_DISTANCE: self._oracle_distance()}
        won = exact_match(content, self.question.golden_answers)
        verdict = "correct" if won else "not correct"
        return (f"Your answer '{content}' is {verdict}.", 1.0 if won else 0.0, True,
                {ACTION_VALID: True, WON: won, SCORE: 1.0 if won else 0.0, ORACLE_DISTANCE: 0 if won else None})

    def _pending_hops(self) -> list[Hop]:
        """The hops the expert would still search (the order it searches them in)."""
        return [hop for hop in self.question.hops
                if hop.passage_id not in self._seen_passages and hop.query not in self._queries]

    def _oracle_distance(self) -> int:
        """Expert actions still needed while the episode runs: pending searches plus the answer."""
        q = self.question
        searches = len(self._pending_hops()) if q.hops else int(not self._queries)
        return searches + 1

    def oracle_action(self) -> str:
        """Search each hop of the chain whose passage has not been retrieved (or whose query has not been
        tried) yet, then answer the gold answer. Questions without a chain (real data): search the question
        once, then answer."""
        if self.episode_ended:
            raise EpisodeEndedError("the episode has ended")
        q = self.question
        pending = self._pending_hops()
        if pending:
            return f"<search>{pending[0].query}</search>"
        if not q.hops and not self._queries:
            return f"<search>{q.question}</search>"
        return f"<answer>{q.golden_answers[0]}</answer>"


def question_hints(q: Question) -> dict[str, str]:
    """The hint levels of a question (see the module docstring); a passage's title is its entity's name."""
    titles = list(dict.fromkeys(h.entity for h in q.hops))
    goal = ("The passages that answer it are titled: " + "; ".join(f'"{t}"' for t in titles) + ".") if titles else ""
    answer = f"The answer is: {q.golden_answers[0]}." if q.golden_answers else ""
    return {"goal": goal, "answer": " ".join(x for x in (goal, answer) if x)}
