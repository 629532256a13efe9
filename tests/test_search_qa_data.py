"""Search-QA data: generator determinism and structure, answer normalisation, Search-R1 file formats."""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from agentgym_opsd.environments.search_qa.data import QUESTION_KINDS, Passage, Question
from agentgym_opsd.environments.search_qa.formats import (
    read_corpus,
    read_questions,
    write_corpus,
    write_questions,
)
from agentgym_opsd.environments.search_qa.generator import generate_dataset, preset
from agentgym_opsd.environments.search_qa.normalize import exact_match, normalize_answer


def test_generator_is_deterministic() -> None:
    a, b = generate_dataset("tiny"), generate_dataset("tiny")
    assert a.passages == b.passages
    assert a.questions == b.questions
    other = generate_dataset(replace(preset("tiny"), seed=1))
    assert other.passages != a.passages


def test_every_kind_in_every_split_and_no_leak() -> None:
    data = generate_dataset("tiny")
    for split in ("train", "test"):
        assert {q.kind for q in data.questions[split]} == set(QUESTION_KINDS)
    train = {q.question for q in data.questions["train"]}
    assert not train & {q.question for q in data.questions["test"]}


def test_hop_chains_point_at_passages_that_state_the_fact() -> None:
    data = generate_dataset("tiny")
    by_id = {p.id: p for p in data.passages}
    for questions in data.questions.values():
        for q in questions:
            assert 1 <= len(q.hops) <= 3
            if q.kind == "multi_hop":
                assert len(q.hops) >= 2
                # each hop looks up what the previous hop found: that is what makes it multi-hop
                for prev, nxt in zip(q.hops, q.hops[1:], strict=False):
                    assert nxt.entity == prev.value
                assert q.golden_answers[0] == q.hops[-1].value
            for hop in q.hops:
                passage = by_id[hop.passage_id]
                assert passage.title == hop.entity
                assert hop.value in passage.text
                assert hop.entity in hop.query


def test_twins_have_near_identical_names() -> None:
    data = generate_dataset("small")
    titles = sorted({p.title for p in data.passages})
    near = 0
    for a, b in zip(titles, titles[1:], strict=False):
        if len(a) == len(b) and sum(x != y for x, y in zip(a, b, strict=True)) == 1:
            near += 1
    assert near >= 20


def test_sizes_scale() -> None:
    assert 100 <= len(generate_dataset("tiny").passages) < 200
    assert 1_000 <= len(generate_dataset("small").passages) < 2_000


# ---- exact match -----------------------------------------------------------------------------------------
def test_normalisation_cases() -> None:
    assert normalize_answer("The  Orvane Co.") == "orvane co"
    assert normalize_answer("An apple, a pear!") == "apple pear"
    assert normalize_answer("  Theodore  ") == "theodore"  # "the" inside a word stays
    assert exact_match("the velmora", ["Velmora"])
    assert exact_match("1873", ["1872", "1873"])
    assert not exact_match("Velmor", ["Velmora"])
    assert not exact_match("", ["Velmora"])


@given(st.text(max_size=60))
def test_normalisation_is_idempotent_and_match_is_reflexive(text: str) -> None:
    once = normalize_answer(text)
    assert normalize_answer(once) == once
    assert exact_match(text, [text])
    assert exact_match(text.upper() + "!", [text]) == (normalize_answer(text.upper() + "!") == once)


# ---- Search-R1 formats -----------------------------------------------------------------------------------
def test_corpus_round_trip_in_search_r1_form(tmp_path) -> None:
    passages = generate_dataset("tiny").passages[:5]
    path = tmp_path / "corpus.jsonl"
    write_corpus(path, passages)
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"id", "contents"} and first["contents"].startswith('"')
    assert read_corpus(path) == passages
    assert Passage.from_contents("7", "Plain title\nsome text") == Passage("7", "Plain title", "some text")


def test_questions_round_trip_and_real_records(tmp_path) -> None:
    questions = generate_dataset("tiny").questions["test"]
    path = tmp_path / "test.jsonl"
    write_questions(path, questions)
    assert read_questions(path) == questions
    real = tmp_path / "nq.jsonl"
    real.write_text(json.dumps({"id": "q1", "question": "who wrote x?", "golden_answers": ["A", "B"],
                                "data_source": "nq"}) + "\n"
                    + json.dumps({"question": "y?", "reward_model": {"ground_truth": {"target": ["C"]}},
                                  "data_source": "hotpotqa"}) + "\n")
    loaded = read_questions(real)
    assert loaded[0] == Question("q1", "who wrote x?", ("A", "B"), "single_hop", (), "nq")
    assert loaded[1].golden_answers == ("C",) and loaded[1].num_hops == 1
