"""Unit tests of every phase of one training step, on the toy counter env and a tiny random model.

Covers: turn rows (one per turn; the teacher prompt really contains c+), log-probs (teacher forcing matches
the sampling log-probs; micro-batching does not change them), evidence (exactly zero when c+ is empty),
advantages (GRPO vs AgentOPSD), the loss (clipping, k3 KL) and that advantages reach the gradient.
"""

from __future__ import annotations

import copy

import pytest
import torch

from agentgym_opsd.models.hf_policy import chat_prompt_ids
from agentgym_opsd.trainer.config import load_config
from agentgym_opsd.trainer.logprobs import batched_response_logprobs, bucket_micro_batches
from agentgym_opsd.trainer.loop import Trainer
from agentgym_opsd.trainer.losses import clipped_policy_loss, kl_k3, policy_objective
from agentgym_opsd.trainer.metrics import METRIC_KEYS
from agentgym_opsd.trainer.turn_batch import TeacherEvidence

TOY_SKILL_SNIPPET = "Count carefully"  # a line of tests/data/skills_small/general.md


def make_trainer(tmp_path, toy_env_ids, *overrides: str) -> Trainer:
    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", f"trainer.output_dir={tmp_path}", "trainer.backend=torch",
                                   "trainer.tensorboard=false", *overrides])
    return Trainer(cfg)


@pytest.fixture(scope="module")
def trainer_and_trajs(tmp_path_factory, toy_env_ids):
    trainer = make_trainer(tmp_path_factory.mktemp("phases"), toy_env_ids)
    trajs = trainer.collect()
    yield trainer, trajs
    trainer.close()


def test_one_row_per_turn_and_teacher_prompt_contains_skills(trainer_and_trajs) -> None:
    trainer, trajs = trainer_and_trajs
    batch = trainer.score(trajs)
    assert len(batch) == sum(t.num_turns for t in trajs)
    keys = {(r.traj_id, r.turn_id) for r in batch.rows}
    assert len(keys) == len(batch)  # no duplicates
    teacher_ids = trainer.session.evidence_maker.row_prompts(batch, trajs)
    for row, traj, ids in zip(batch.rows, [t for t in trajs for _ in t.turns], teacher_ids, strict=True):
        assert traj.skill_context and TOY_SKILL_SNIPPET in traj.skill_context
        teacher_text = trainer.session.trained.tokenizer.decode(ids)
        student_text = trainer.session.trained.tokenizer.decode(row.prompt_ids)
        assert TOY_SKILL_SNIPPET in teacher_text and TOY_SKILL_SNIPPET not in student_text
        # The c+ block sits in the system message: the task and observation are intact after it.
        assert student_text.split("<|im_start|>user")[1] == teacher_text.split("<|im_start|>user")[1]
        assert row.prompt_ids == chat_prompt_ids(trainer.session.trained.tokenizer, traj.turns[row.turn_id].prompt)


def test_recomputed_logprobs_match_sampling(trainer_and_trajs) -> None:
    trainer, trajs = trainer_and_trajs
    batch = trainer.score(trajs)
    prompts = [r.prompt_ids for r in batch.rows]
    responses = [r.response_ids for r in batch.rows]
    got = batched_response_logprobs(trainer.session.trained.model, prompts, responses, pad_id=trainer.session.trained.tokenizer.pad_token_id)
    for row, lp in zip(batch.rows, got, strict=True):
        assert torch.allclose(lp, torch.tensor(row.sample_logprobs), atol=1e-4)
    one_by_one = batched_response_logprobs(trainer.session.trained.model, prompts, responses, pad_id=trainer.session.trained.tokenizer.pad_token_id,
                                           max_rows=1)
    for a, b in zip(got, one_by_one, strict=True):
        assert torch.allclose(a, b, atol=1e-5)  # padding / bucketing does not change the numbers


def test_bucketing_respects_budget() -> None:
    lengths = [5, 50, 7, 30, 30, 1, 100, 12]
    batches = bucket_micro_batches(lengths, max_tokens=64, max_rows=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= 3
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 64


def test_evidence_is_zero_without_skills(tmp_path, toy_env_ids) -> None:
    trainer = make_trainer(tmp_path, toy_env_ids, "env.use_skills=false")
    try:
        trajs = trainer.collect()
        assert all(t.skill_context == "" for t in trajs)
        batch = trainer.score(trajs)
        assert all(p is None for p in trainer.session.evidence_maker.row_prompts(batch, trajs))
        metrics, _ = trainer.step_on(trajs)
        assert metrics["evidence_mean"] == 0.0 and metrics["evidence_std"] == 0.0 and metrics["teacher_rows"] == 0
    finally:
        trainer.close()


def test_evidence_nonzero_with_skills(trainer_and_trajs) -> None:
    trainer, trajs = trainer_and_trajs
    batch = trainer.score(trajs)
    student = batched_response_logprobs(trainer.session.trained.model, [r.prompt_ids for r in batch.rows],
                                        [r.response_ids for r in batch.rows], pad_id=trainer.session.trained.tokenizer.pad_token_id)
    maker = trainer.session.evidence_maker
    teacher = maker.teacher_logprobs(batch, maker.row_prompts(batch, trajs), student)
    evidence = torch.tensor([float((t - s).sum()) for t, s in zip(teacher, student, strict=True)])
    assert evidence.abs().max() > 0  # the c+ prompt changes the log-probs of the same response


def _with_outcomes(trajs):
    trajs = copy.deepcopy(trajs)
    for i, t in enumerate(trajs):
        t.won = i % 2 == 0  # one success and one failure in each group of two
    return trajs


def test_advantages_grpo_and_agentopsd(trainer_and_trajs) -> None:
    trainer, trajs = trainer_and_trajs
    trajs = _with_outcomes(trajs)
    batch = trainer.score(trajs)
    evidence = torch.linspace(-1, 1, len(batch), dtype=torch.float64)
    gaps = [torch.zeros(len(r.response_ids)) for r in batch.rows]
    teacher = TeacherEvidence(gaps, gaps, evidence)
    opsd = trainer.credit(batch, teacher)
    adv_opsd, seq = opsd.tokens, opsd.seq
    assert set(torch.sign(seq).tolist()) == {-1.0, 1.0}
    trainer.session.cfg.algorithm.estimator = "grpo"
    try:
        adv_grpo = trainer.credit(batch, teacher).tokens
    finally:
        trainer.session.cfg.algorithm.estimator = "agentopsd"
    for a_o, a_g in zip(adv_opsd, adv_grpo, strict=True):
        assert torch.all(torch.sign(a_o) == torch.sign(a_g))  # reshaping keeps the sign of A_seq
        ratio = (a_o / a_g).unique()
        assert ratio.numel() == 1 and 0.9 - 1e-6 <= float(ratio) <= 1.1 + 1e-6  # |Ã| in [(1-λb)|A|, (1+λb)|A|]
    assert any(not torch.allclose(a_o, a_g) for a_o, a_g in zip(adv_opsd, adv_grpo, strict=True))


def test_clipped_loss_and_k3() -> None:
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))  # ratios 1.5, 0.5, 1.0 against old = 0
    old = torch.zeros(1, 3)
    mask = torch.ones(1, 3, dtype=torch.bool)
    pos, clipped = clipped_policy_loss(logp, old, torch.ones(1, 3), mask, clip_low=0.2, clip_high=0.24)
    assert pos.item() == pytest.approx(-(1.24 + 0.5 + 1.0))  # A>0: ratio capped at 1 + clip_high
    assert clipped.item() == 1
    neg, _ = clipped_policy_loss(logp, old, -torch.ones(1, 3), mask, clip_low=0.2, clip_high=0.24)
    assert neg.item() == pytest.approx(1.5 + 0.8 + 1.0)  # A<0: ratio floored at 1 - clip_low
    assert kl_k3(logp, logp, mask).item() == 0.0
    assert kl_k3(logp, torch.zeros(1, 3), mask).item() > 0


def test_advantages_reach_the_gradient() -> None:
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]])
    terms = policy_objective(logp, torch.zeros(2, 3), adv, mask, entropy=None, ref_logp=None, clip_low=0.2,
                             clip_high=0.24, kl_coef=0.0, entropy_coef=0.0, num_tokens=5)
    terms.loss.backward()
    expected = -(adv * mask) / 5  # d/dlogp of −ratio·A at ratio 1, token-mean
    assert torch.allclose(logp.grad, expected)


def test_update_changes_params_only_with_signal(tmp_path, toy_env_ids) -> None:
    trainer = make_trainer(tmp_path, toy_env_ids, "algorithm.kl_coef=0", "algorithm.entropy_coef=0")
    try:
        trajs = trainer.collect()
        before = [p.detach().clone() for p in trainer.session.trained.model.parameters()]
        flat, _ = trainer.step_on(trajs)  # every rollout fails the same way: A = 0, no KL, no entropy
        assert flat["grad_norm"] == 0.0
        metrics, _ = trainer.step_on(_with_outcomes(trajs))
        assert metrics["grad_norm"] > 0 and metrics["advantage_abs_mean"] > 0
        assert any(not torch.equal(a, p) for a, p in zip(before, trainer.session.trained.model.parameters(), strict=True))
        for key in METRIC_KEYS:
            if key not in ("step", "seconds_rollout"):
                assert key in metrics, key
    finally:
        trainer.close()
