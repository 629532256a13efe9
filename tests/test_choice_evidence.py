"""Evidence forms (issue 38): the choice-level teacher, the per-token mean and the argument-token sum.

Checked against hand computations: the prefix-cached choice scoring equals scoring every full sequence on
its own (tiny random model, to 1e-5), the choice evidence equals a log-softmax written out by hand (and, in
the trainer, the full-sequence scores of each choice under both prompts), rows without a choice fall back to
the paper's sum and say so, `mean` and `args` are the sums they claim; plus config validation.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_opsd.credit.agentopsd import (
    ChoiceScores,
    EvidenceInputs,
    choice_evidence,
    choice_log_probs,
    compute_evidence,
    form_counts,
)
from agentgym_opsd.models.hf_policy import text_ids
from agentgym_opsd.parsers import make_parser
from agentgym_opsd.policies import PolicyOutput
from agentgym_opsd.records import Turn
from agentgym_opsd.trainer.choice_logprobs import choice_logprobs, pack_choices, score_continuations
from agentgym_opsd.trainer.config import ConfigError, load_config
from agentgym_opsd.trainer.logprobs import batched_response_logprobs
from agentgym_opsd.trainer.teacher_evidence import argument_token_mask, turn_choice_set


@pytest.fixture(scope="module")
def tiny():
    from agentgym_opsd.models.loading import load_policy_model

    return load_policy_model("tiny-random")


def _full_sequence_scores(model, tok, prompt, choices, temperature=1.0) -> torch.Tensor:
    """The obvious reference: each (prompt + choice) scored alone, its token log-probs summed."""
    per_token = batched_response_logprobs(model, [prompt] * len(choices), choices, pad_id=tok.pad_token_id,
                                          temperature=temperature, max_rows=1)
    return torch.tensor([float(t.double().sum()) for t in per_token], dtype=torch.float64)


# ---- the choice passes -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("temperature", "max_tokens"), [(1.0, 2048), (0.7, 3)])
def test_prefix_cached_choice_scores_equal_full_sequences(tiny, temperature, max_tokens) -> None:
    model, tok = tiny
    g = torch.Generator().manual_seed(3)
    ids = lambda n: torch.randint(5, 1000, (n,), generator=g).tolist()  # noqa: E731
    system = ids(40)  # shared by the first four prompts: computed once
    prompts = [system + ids(3 + 2 * k) for k in range(4)] + [ids(5)]
    choices = [[ids(1 + (j + k) % 4) for j in range(2 + k)] for k in range(5)]
    got = choice_logprobs(model, prompts, choices, temperature=temperature, max_tokens=max_tokens)
    for prompt, row_choices, scores in zip(prompts, choices, got, strict=True):
        want = _full_sequence_scores(model, tok, prompt, row_choices, temperature)
        torch.testing.assert_close(scores, want, atol=1e-5, rtol=0)


def test_replies_on_the_choice_cache_equal_the_teacher_forced_pass(tiny) -> None:
    model, tok = tiny
    g = torch.Generator().manual_seed(5)
    ids = lambda n: torch.randint(5, 1000, (n,), generator=g).tolist()  # noqa: E731
    system = ids(30)
    prompts = [system + ids(4), system + ids(6), ids(7)]
    choices = [[ids(2), ids(3)], [], [ids(1)]]
    replies = [ids(9), ids(4), None]
    got = score_continuations(model, prompts, choices, replies, temperature=0.8, max_tokens=5)
    want = batched_response_logprobs(model, prompts[:2], replies[:2], pad_id=tok.pad_token_id, temperature=0.8)
    for reply, expected in zip(got.replies[:2], want, strict=True):
        torch.testing.assert_close(reply, expected, atol=1e-5, rtol=0)
    assert got.replies[2] is None and got.choices[1].numel() == 0
    # the reply beside them changes no choice's score
    for with_reply, alone in zip(got.choices, choice_logprobs(model, prompts, choices, temperature=0.8), strict=True):
        torch.testing.assert_close(with_reply, alone, atol=1e-6, rtol=0)


def test_packed_choices_see_the_context_and_only_their_own_earlier_tokens() -> None:
    ids, positions, mask = pack_choices([[7, 8], [9], [4, 5, 6]], context_len=3)
    assert ids.tolist() == [[7, 8, 9, 4, 5, 6]]
    assert positions.tolist() == [[3, 4, 3, 3, 4, 5]]  # every choice starts right after the context
    allowed = (mask[0, 0] == 0).int().tolist()
    assert allowed == [[1, 1, 1, 1, 0, 0, 0, 0, 0],
                       [1, 1, 1, 1, 1, 0, 0, 0, 0],
                       [1, 1, 1, 0, 0, 1, 0, 0, 0],
                       [1, 1, 1, 0, 0, 0, 1, 0, 0],
                       [1, 1, 1, 0, 0, 0, 1, 1, 0],
                       [1, 1, 1, 0, 0, 0, 1, 1, 1]]


def test_choice_scoring_refuses_empty_choices(tiny) -> None:
    model, _ = tiny
    with pytest.raises(ValueError, match="at least one token"):
        choice_logprobs(model, [[5, 6, 7]], [[[8], []]])


# ---- the arithmetic ----------------------------------------------------------------------------------------
def test_choice_evidence_by_hand() -> None:
    teacher, student = torch.tensor([-2.0, -5.0, -9.0]), torch.tensor([-4.0, -3.0, -9.0])
    lengths = torch.tensor([2, 4, 3])
    scores = ChoiceScores(teacher, student, lengths, chosen=0)

    def log_p(values: list[float], k: int) -> float:
        return values[k] - math.log(sum(math.exp(v) for v in values))

    assert choice_evidence(scores, "sum") == pytest.approx(log_p([-2, -5, -9], 0) - log_p([-4, -3, -9], 0))
    mean_t, mean_s = [-1.0, -1.25, -3.0], [-2.0, -0.75, -3.0]  # each score over its length
    assert choice_evidence(scores, "mean") == pytest.approx(log_p(mean_t, 0) - log_p(mean_s, 0))


scores_st = st.lists(st.floats(-30, 0, allow_nan=False), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(teacher=scores_st, shift=st.floats(-20, 20), data=st.data())
def test_choice_evidence_properties(teacher: list[float], shift: float, data: st.DataObject) -> None:
    n = len(teacher)
    student = data.draw(st.lists(st.floats(-30, 0, allow_nan=False), min_size=n, max_size=n))
    lengths = torch.tensor(data.draw(st.lists(st.integers(1, 12), min_size=n, max_size=n)))
    chosen = data.draw(st.integers(0, n - 1))
    t, s = torch.tensor(teacher, dtype=torch.float64), torch.tensor(student, dtype=torch.float64)
    for norm in ("sum", "mean"):
        probs = choice_log_probs(t, lengths, norm).exp()
        assert float(probs.sum()) == pytest.approx(1.0)  # a distribution over the set
        e = choice_evidence(ChoiceScores(t, s, lengths, chosen), norm)
        # the softmax forgets a constant added to every choice's score (sum: to every sequence log-prob)
        if norm == "sum":
            assert choice_evidence(ChoiceScores(t + shift, s, lengths, chosen), norm) == pytest.approx(e, abs=1e-9)
        assert choice_evidence(ChoiceScores(s, s, lengths, chosen), norm) == 0.0  # no gap, no evidence
        if n == 1:
            assert e == 0.0  # one choice: nothing was decided
        # the evidence of the chosen action and the teacher's preference agree in sign
        assert (e > 1e-12) == (float(choice_log_probs(t, lengths, norm)[chosen])
                               > float(choice_log_probs(s, lengths, norm)[chosen]) + 1e-12)


def test_forms_fall_back_to_the_paper_sum_and_say_so() -> None:
    gaps = [torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1.0, 1.0]), torch.tensor([-0.25])]
    masks = [torch.tensor([False, True, True]), None, torch.tensor([True])]
    choices = [ChoiceScores(torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0]), torch.tensor([1, 1]), 0),
               None, None]
    inputs = EvidenceInputs(gaps, masks, choices)
    paper = compute_evidence("paper", inputs)
    assert paper.evidence.tolist() == [1.5, 2.0, -0.25] and paper.forms == ("paper",) * 3
    mean = compute_evidence("mean", inputs)
    assert mean.evidence.tolist() == pytest.approx([0.5, 1.0, -0.25]) and mean.forms == ("mean",) * 3
    args = compute_evidence("args", inputs)
    assert args.evidence.tolist() == [1.0, 2.0, -0.25] and args.forms == ("args", "paper", "args")
    choice = compute_evidence("choice", inputs)
    # log p_T(0) − log p_S(0) = −log(1 + e⁻¹) + log(1 + e) = 1 exactly
    assert float(choice.evidence[0]) == pytest.approx(1.0)
    assert choice.evidence.tolist()[1:] == [2.0, -0.25] and choice.forms == ("choice", "paper", "paper")
    assert form_counts(choice.forms) == {"teacher/paper_rows": 2.0, "teacher/choice_rows": 1.0,
                                         "teacher/mean_rows": 0.0, "teacher/args_rows": 0.0}
    with pytest.raises(ValueError, match="unknown evidence form"):
        compute_evidence("wording", inputs)


# ---- turns -> what the forms read --------------------------------------------------------------------------
def _turn(action: str, admissible: list[str] | None, valid: bool = True) -> Turn:
    info = {"admissible_actions": admissible} if admissible is not None else {}
    return Turn(0, [], "", action, valid, "", 0.0, info=info)


def test_choice_sets_render_actions_as_the_model_writes_them() -> None:
    alf = make_parser("tag:action")
    got = turn_choice_set(_turn("go to desk 1", ["look", "go to desk 1", "look"]), alf)
    assert got is not None and got.texts == ("<action>look</action>", "<action>go to desk 1</action>")
    assert got.chosen == 1
    shop = make_parser("webshop")
    page = ["click[b0123]", "click[next >]", "search[<your query>]"]
    got = turn_choice_set(_turn("click[b0123]", page), shop)
    assert got is not None and got.chosen == 0
    assert got.texts[-1] == "<action>search["  # any query: the probability of writing a search at all


@pytest.mark.parametrize(("turn", "why"), [
    (_turn("search[red shirt]", ["click[b0123]", "search[<your query>]"]), "free-text search"),
    (_turn("go to moon", ["look"], valid=False), "invalid turn"),
    (_turn("go to moon", ["look"]), "not among the choices"),
    (_turn("<search>who</search>", None), "no choice list (Search-QA)"),
])
def test_turns_without_a_choice_to_judge_have_no_choice_set(turn: Turn, why: str) -> None:
    parser = make_parser("webshop" if "[" in turn.action else "tag:search,answer" if "<" in turn.action
                         else "tag:action")
    assert turn_choice_set(turn, parser) is None, why


@pytest.mark.parametrize(("spec", "text", "argument"), [
    ("tag:action", "I see a desk. <action>go to desk 1</action>", "go to desk 1"),
    ("webshop", "<action>click[red shirt]</action>", "red shirt"),
    ("tag:search,answer", "<search>who wrote x</search>", "who wrote x"),
])
def test_argument_mask_marks_the_argument_tokens_only(tiny, spec: str, text: str, argument: str) -> None:
    _, tok = tiny
    ids = text_ids(tok, text)
    mask = argument_token_mask(tok, make_parser(spec), ids)
    assert mask is not None and mask.shape == (len(ids),)
    picked = tok.decode([t for t, m in zip(ids, mask.tolist(), strict=True) if m])
    assert picked.strip() == argument  # no tag, bracket, verb or thought token
    assert argument_token_mask(tok, make_parser(spec), text_ids(tok, "no action here")) is None


# ---- in the trainer: config, records, and the hand computation on the tiny model ---------------------------
def test_config_names_the_bad_key() -> None:
    assert load_config("cpu-tiny").teacher.evidence == "paper"  # the paper's form stays the default
    with pytest.raises(ConfigError, match="teacher.evidence"):
        load_config("cpu-tiny", ["teacher.evidence=wording"])
    with pytest.raises(ConfigError, match="teacher.choice_norm"):
        load_config("cpu-tiny", ["teacher.choice_norm=max"])


class _ScriptedCounter:
    """The toy counter's expert every other turn, else the wrong move, with the reply's token ids (a sampled
    reply would be nonsense from a random model: no choice to judge)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.calls = tokenizer, 0

    def act(self, requests):
        outs = []
        for req in requests:
            self.calls += 1
            action = req.oracle() if self.calls % 2 else ("dec" if req.oracle() == "inc" else "inc")
            text = req.format_action(action)
            outs.append(PolicyOutput(text, token_ids=text_ids(self.tokenizer, text)))
        return outs


def test_trainer_choice_evidence_matches_full_sequence_scores(tmp_path, toy_env_ids) -> None:
    from agentgym_opsd.trainer.credit_file import credit_lines
    from agentgym_opsd.trainer.loop import Trainer
    from agentgym_opsd.trainer.metrics import step_metrics
    from agentgym_opsd.trainer.task_stream import train_task_specs
    from agentgym_opsd.trainer.turn_batch import StepRecord

    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", f"trainer.output_dir={tmp_path}", "trainer.backend=torch",
                                   "trainer.tensorboard=false", "teacher.evidence=choice", "env.max_turns=3"])
    trainer = Trainer(cfg)
    try:
        tasks = train_task_specs(0, 2, num_tasks=trainer.session.envs[0].num_tasks, seed=0)
        trajs = trainer.session.envs[0].runner.run(_ScriptedCounter(trainer.session.trained.tokenizer), tasks, group_size=2)
        # an invalid turn (rebuilt, so it records its kind as every invalid turn does): no choice to judge
        trajs[0].turns[-1] = dataclasses.replace(trajs[0].turns[-1], action_valid=False)
        # the phases up to credit, without the update: the weights that scored must be the ones checked here
        batch = trainer.score(trajs)
        logprobs = trainer.logprobs(batch)
        ev = trainer.teacher(batch, logprobs, trajs)
        record = StepRecord(batch, logprobs, ev, trainer.credit(batch, ev))
        metrics = step_metrics(record, {}, lam=trainer.current_lam())
        assert ev.forms is not None and ev.forms.count("paper") == 1
        assert metrics["teacher/choice_rows"] == len(batch) - 1 and metrics["teacher/paper_rows"] == 1
        maker = trainer.session.evidence_maker
        teacher_ids = maker.row_prompts(batch, trajs)
        texts = ["<action>inc</action>", "<action>dec</action>"]
        choice_ids = [text_ids(trainer.session.trained.tokenizer, t) for t in texts]
        for i, row in enumerate(batch.rows):
            traj = next(t for t in trajs if t.traj_id == row.traj_id)
            turn = traj.turns[row.turn_id]
            if ev.forms[i] == "paper":
                assert not turn.action_valid
                assert float(ev.evidence[i]) == pytest.approx(float(ev.gaps[i].sum()))
                continue
            chosen = ["inc", "dec"].index(turn.action)
            by_side = [torch.log_softmax(_full_sequence_scores(trainer.session.trained.model, trainer.session.trained.tokenizer, list(p), choice_ids,
                                                               trainer.session.trained.temperature), 0)
                       for p in (teacher_ids[i], row.prompt_ids)]
            assert float(ev.evidence[i]) == pytest.approx(float(by_side[0][chosen] - by_side[1][chosen]), abs=1e-5)
        # the judged rows' replies were teacher-forced on the choice pass's cache: the teacher pass's numbers
        for folded, full in zip(ev.teacher, maker.teacher_logprobs(batch, teacher_ids, logprobs.old), strict=True):
            torch.testing.assert_close(folded, full, atol=1e-5, rtol=0)
        lines = credit_lines(trajs, record, estimator=cfg.algorithm.estimator, step=1)
        forms = [turn["evidence_form"] for line in lines for turn in line["turns"]]
        assert sorted(forms) == sorted(ev.forms)
    finally:
        trainer.close()
