"""The AgentOPSD training loop: collect → score → log-probs → teacher → credit → update → log.

`Trainer(cfg).train()` runs the job: an optional supervised warm start on oracle demonstrations, then
`trainer.total_steps` RL steps. One RL step (`Trainer.step`) is one call per phase in that order, each handing
the next a frozen value (`trainer/turn_batch.py`), so the order is checked by the types. Everything of the run but
the step (ranks, resume, the model, environments, rollout backend, validation, metrics, checkpoints) is its
`RunSession` (`trainer/session.py`), reached as `trainer.session`; the Trainer owns only the run's progress.

Data parallel: each rank collects whole groups (all G copies of a task), so GRPO groups and the credit, which
are per group and per trajectory, equal what one process would compute on the union; metrics are reduced
across ranks. With several environments each round of B tasks is split between them by weight
(`mixed_task_specs`, a function of the seed and the cursor, so a resume continues the same sequence).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from agentgym_opsd.records import Trajectory
from agentgym_opsd.trainer import engine as dist
from agentgym_opsd.trainer.config import Config
from agentgym_opsd.trainer.dynamic_sampling import collect_informative, group_diversity
from agentgym_opsd.trainer.frozen_trunk import TrunkCache
from agentgym_opsd.trainer.metrics import env_metrics, reduce_step_metrics, step_metrics
from agentgym_opsd.trainer.session import RunSession
from agentgym_opsd.trainer.task_stream import mixed_task_specs
from agentgym_opsd.trainer.turn_batch import (
    BatchAdvantages,
    PolicyLogProbs,
    StepRecord,
    TeacherEvidence,
    TurnBatch,
    batch_advantages,
    build_turn_batch,
)
from agentgym_opsd.trainer.update import PPOUpdate
from agentgym_opsd.trainer.validation import (
    StartEvaluationCache,
    start_evaluation_key,
    validation_file,
    write_episode_outcomes,
)

__all__ = ["PHASES", "Trainer"]

PHASES = ("setup", "warm start", "evaluation", "rollout", "logprobs", "teacher", "update", "checkpoints")
"""The parts of a run's wall time that `Trainer.time_report` names (the rest is 'other')."""

log = logging.getLogger(__name__)


class Trainer:
    """The step loop of one run over its `RunSession` (set-up, checkpoints) and its `PPOUpdate`; it owns the
    run's progress: steps done, the task cursor, whether the warm start is done."""

    def __init__(self, cfg: Config, *, resume: str | None = None, force: bool = False) -> None:
        self.started = time.perf_counter()
        self.phase_seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)  # this session's wall time per phase
        s = self.session = RunSession(cfg, resume=resume, force=force)
        m = s.trained
        self.updater = PPOUpdate(s.cfg, m.model, m.engine, m.tokenizer, m.device, rank=s.rank, world=s.world,
                                 packed=s.packed_update)
        self.step_done = s.state.step if s.state else 0
        self.task_cursor = s.state.task_cursor if s.state else 0
        self.warm_start_done = s.state.warm_start_done if s.state else not s.cfg.warm_start.enabled

    # ---- the job ----------------------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """Warm start (once), then RL steps up to `total_steps`; returns this session's metric lines."""
        cfg = self.session.cfg.trainer
        if not self.warm_start_done:
            with self._timed("warm start"):
                self.warm_start()
        self.session.reference.setup()
        self.phase_seconds["setup"] = time.perf_counter() - self.started - self.phase_seconds["warm start"]
        if cfg.eval_at_start and self.step_done == 0:
            with self._timed("evaluation"):
                self.session.log(self.validate_at_start(), step=0)
        lines = []
        bar = tqdm(total=cfg.total_steps, initial=self.step_done, desc="train", unit="step",
                   disable=not cfg.progress)
        try:
            while self.step_done < cfg.total_steps:
                metrics = self.step()
                for phase in ("rollout", "logprobs", "teacher", "update"):
                    self.phase_seconds[phase] += metrics[f"seconds_{phase}"]
                if cfg.eval_every and self.step_done % cfg.eval_every == 0:
                    with self._timed("evaluation"):
                        metrics.update(self.validate())
                self.session.log(metrics, step=self.step_done)
                lines.append(metrics)
                if (cfg.save_every and self.step_done % cfg.save_every == 0) or self.step_done == cfg.total_steps:
                    with self._timed("checkpoints"):
                        self.save()
                bar.update(1)
                bar.set_postfix(success=f"{metrics['success_rate']:.2f}", loss=f"{metrics['loss']:.4f}")
        finally:
            bar.close()
            if self.session.metrics_log is not None:
                self.session.metrics_log.flush()
        if self.session.metrics_log is not None and lines:
            self.session.metrics_log.finish(step=self.step_done)
        return lines

    @contextlib.contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phase_seconds[phase] += time.perf_counter() - t0

    def time_report(self) -> str:
        """One line: this session's wall time, in all and per phase (what the main job prints at its end)."""
        total = time.perf_counter() - self.started
        parts = [f"{name} {seconds / 60:.1f}" for name, seconds in self.phase_seconds.items() if seconds >= 0.05]
        other = total - sum(self.phase_seconds.values())
        return (f"time: {total / 60:.1f} min in all ({self.session.cfg.model.precision}, {torch.get_num_threads()} threads): "
                + ", ".join(parts + [f"other {max(other, 0.0) / 60:.1f}"]) + " min")

    def warm_start(self) -> dict[str, Any]:
        """The supervised stage (`WarmStart`): trained, or reused from the cache."""
        summary = self.session.warm_starter.run(self.session.trained, self.session.envs[0].runner)
        self.warm_start_done = True
        self.session.weights_dirty = True  # the rollout engine must sample from the warm-started weights
        return summary

    # ---- one RL step: collect -> score -> old / reference / teacher log-probs -> credit -> update -> log ----
    def step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        trajs, sampling = self.collect_step()
        seconds_rollout = time.perf_counter() - t0
        metrics, record = self.step_on(trajs)
        metrics.update(sampling)
        metrics["seconds_rollout"] = seconds_rollout
        self.step_done += 1
        metrics["step"] = self.step_done
        if self.session.cfg.trainer.save_trajectories:
            self.session.save_step_files(trajs, record, step=self.step_done)
        self.session.weights_dirty = True  # vLLM gets the updated weights before it next generates
        return metrics

    def step_on(self, trajs: list[Trajectory]) -> tuple[dict[str, Any], StepRecord]:
        """Score, log-probs, teacher, credit and one update on given trajectories (`step` on what it collected;
        benchmarks and tests on their own): the step's metrics and what it computed on its rows (its credit
        file is written from it)."""
        batch = self.score(trajs)
        t0 = time.perf_counter()
        with self.session.trained.engine.full_weights():  # ZeRO-3: these passes differ in length by rank
            logprobs = self.logprobs(batch)
            seconds_logprobs = time.perf_counter() - t0
            t0 = time.perf_counter()
            evidence = self.teacher(batch, logprobs, trajs)
            seconds_teacher = time.perf_counter() - t0
        advantages = self.credit(batch, evidence)
        t0 = time.perf_counter()
        update = self.update(batch, logprobs, advantages)
        seconds_update = time.perf_counter() - t0
        record = StepRecord(batch, logprobs, evidence, advantages)
        metrics = step_metrics(record, update, lam=self.current_lam())
        metrics.update(seconds_teacher=seconds_teacher, seconds_logprobs=seconds_logprobs,
                       seconds_update=seconds_update)
        s = self.session
        if s.world > 1:
            metrics = reduce_step_metrics(metrics, trajs, record, s.world)
        metrics.update(env_metrics(trajs, [env.spec for env in s.envs], lambda t: s.env_of(t).spec, metrics, s.world))
        return metrics, record

    def collect_step(self) -> tuple[list[Trajectory], dict[str, float]]:
        """This rank's trajectories of one step and the sampling metrics. Without dynamic sampling: B / ranks
        whole groups, numbered as in a one-process run. With it: rounds of B tasks until this rank holds
        B / ranks groups with mixed outcomes or `rollout.max_sampling_rounds` rounds were played (every rank
        plays the same number of rounds)."""
        r, outcome = self.session.cfg.rollout, self.session.cfg.env.outcome
        if not r.dynamic_sampling:
            trajs = self.collect()
            return trajs, {f"rollout/{k}": v for k, v in group_diversity(trajs, outcome=outcome).items()}
        seen: list[Trajectory] = []

        def play(_: int) -> list[Trajectory]:
            seen.extend(trajs := self.collect())
            return trajs

        def keep_going(kept: int) -> bool:  # collective: ZeRO-3 generation gathers weights on every rank
            return any(k < self.session.tasks_per_rank for k in dist.all_gather_objects(kept))

        trajs, report = collect_informative(play, want_groups=self.session.tasks_per_rank,
                                            max_rounds=r.max_sampling_rounds, keep_going=keep_going, outcome=outcome)
        return trajs, {**report.metrics(),
                       **{f"rollout/{k}": v for k, v in group_diversity(seen, outcome=outcome).items()}}

    def collect(self) -> list[Trajectory]:
        """One round: the next B tasks of the training stream (this rank's B / ranks whole groups, numbered
        as in a one-process run), G rollouts each."""
        s = self.session
        r = s.cfg.rollout
        first = self.task_cursor + s.rank * s.tasks_per_rank
        slots = mixed_task_specs(first, s.tasks_per_rank, weights=[env.weight for env in s.envs],
                                 num_tasks=[env.num_tasks for env in s.envs], seed=s.cfg.trainer.seed,
                                 block=r.tasks_per_step)
        s.trained.model.eval()
        trajs: list[Trajectory] = []
        with s.generating():
            for index, env in enumerate(s.envs):  # one environment after the other, each in one batch
                mine = [(slot, task) for slot, (e, task) in enumerate(slots, start=first) if e == index]
                if mine:
                    trajs += env.play(s.policy, mine, r.group_size)
        trajs.sort(key=lambda t: t.traj_id)  # stream order, whatever the environment
        for traj in trajs:
            traj.metadata["rank"] = s.rank
        self.task_cursor += r.tasks_per_step
        return trajs

    def score(self, trajs: list[Trajectory]) -> TurnBatch:
        s = self.session
        a = s.cfg.algorithm
        penalty = ([s.env_of(t).invalid_penalty for t in trajs] if len(s.envs) > 1  # each row its env's
                   else s.envs[0].invalid_penalty)
        return build_turn_batch(trajs, encode_prompt=s.trained.encode, reward_scale=s.cfg.env.reward_scale,
                                invalid_penalty=penalty, success_source=a.success_source, penalty_mode=a.penalty_mode,
                                penalize=a.penalize, outcome=s.cfg.env.outcome)

    def logprobs(self, batch: TurnBatch) -> PolicyLogProbs:
        """The log-prob phase: π_old of every response token and the KL reference's."""
        old, from_sampler, trunk = self.old_logprobs(batch)
        return PolicyLogProbs(old, self.session.reference.logprobs(batch.prompt_ids, batch.response_ids), from_sampler,
                              trunk)

    def old_logprobs(self, batch: TurnBatch) -> tuple[list[Tensor], bool, TrunkCache | None]:
        """π_old of every response token, whether it is the sampler's own numbers, and the frozen-trunk outputs
        the pass kept for the update. The sampler's numbers where they are the trainer's numbers too
        (`Precision.sampler_is_trainer`: the HF sampler in fp32), else a teacher-forced pass of the trainer model
        in the update's layout (under bf16-mixed the update's first forward then rounds exactly alike, and TIS
        corrects for the sampler), which keeps each row's frozen-trunk output (`trainer/frozen_trunk.py`)."""
        cfg = self.session.cfg
        reuse = (cfg.model.numerics.sampler_is_trainer(cfg.rollout.backend)
                 and all(len(r.sample_logprobs) == len(r.response_ids) for r in batch.rows))
        if reuse:
            return [torch.tensor(r.sample_logprobs, dtype=torch.float32) for r in batch.rows], True, None
        trunk = TrunkCache.within(self.session.trunk_depth, cfg.optim.trunk_cache_mb)
        return self.session.trained.logprobs(batch.prompt_ids, batch.response_ids, packed=self.session.packed_update,
                                             trunk_cache=trunk), False, trunk

    def teacher(self, batch: TurnBatch, logprobs: PolicyLogProbs, trajs: list[Trajectory]) -> TeacherEvidence:
        """The teacher phase (`RunSession.evidence_maker`, `trainer/teacher_evidence.py`): each turn's privileged
        prompt, the same responses under it and the evidence they give, in the form `teacher.evidence`. GRPO
        reads no evidence: its teacher is the student itself, so every e_k is exactly 0."""
        if not self.session.cfg.algorithm.needs_teacher:
            return TeacherEvidence.none(logprobs.old)
        return self.session.evidence_maker(batch, trajs, logprobs.old)

    def current_lam(self) -> float:
        """λ of this step: constant, or decaying linearly to 0 over the last `lam_warmdown_steps` steps."""
        a, total = self.session.cfg.algorithm, self.session.cfg.trainer.total_steps
        if not a.lam_warmdown_steps:
            return a.lam
        start = max(total - a.lam_warmdown_steps, 0)
        done = min(max(self.step_done - start + 1, 0), a.lam_warmdown_steps)
        return a.lam * (1.0 - done / a.lam_warmdown_steps)

    def credit(self, batch: TurnBatch, evidence: TeacherEvidence) -> BatchAdvantages:
        """The credit phase: per-row token advantages and the per-trajectory A_seq (`phases.batch_advantages`:
        the penalty mode's bookkeeping, the estimator, the row penalty term)."""
        a = self.session.cfg.algorithm
        return batch_advantages(batch, evidence.evidence, evidence.gaps, estimator=a.estimator,
                                config=a.credit_config(self.current_lam()), cross_steps=a.grpo_cross_steps,
                                normalize_std=a.normalize_std, penalised_turns_gain=a.penalised_turns_gain,
                                return_details=self.session.cfg.trainer.save_trajectories)

    def update(self, batch: TurnBatch, logprobs: PolicyLogProbs, advantages: BatchAdvantages) -> dict[str, float]:
        """The update phase: PPO on the step batch (`PPOUpdate`); the update's metrics."""
        return self.updater(batch, logprobs, advantages, step=self.step_done)

    # ---- validation, checkpoints ------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Held-out episodes at the validation temperature, and the pool check (`Validation`); the held-out
        episodes' outcomes go to `validation/step_<step>.jsonl` (`Validation.episodes`)."""
        self.session.trained.model.eval()
        metrics = self.session.validation.run(self.session.sampler_at)
        self._keep_episodes(self.session.validation.episodes)
        return metrics

    def validate_at_start(self) -> dict[str, float]:
        """The validation before the first RL step; from a cached warm start, computed once per evaluation
        setting and kept beside it (`StartEvaluationCache`), since every such run would play the same episodes
        with the same weights."""
        entry = self.session.warm_starter.cache_dir() if self.session.cfg.warm_start.enabled else None
        cache = StartEvaluationCache(entry, start_evaluation_key(self.session.cfg, threads=torch.get_num_threads(),
                                                                 world_size=self.session.world))
        hit = dist.broadcast_object(cache.load() if self.session.is_main else None)
        if hit is not None:
            log.info("validation before RL: reused %s", cache.path)
            self._keep_episodes(cache.load_episodes())
            return hit
        metrics = self.validate()
        if self.session.is_main:
            cache.store(metrics, self.session.validation.episodes)
        return metrics

    def _keep_episodes(self, episodes: list[dict[str, Any]]) -> None:
        if self.session.is_main and episodes:
            write_episode_outcomes(validation_file(self.session.out, self.step_done), episodes)

    def save(self) -> Path:
        """A checkpoint of the run at this step (`RunSession.save`)."""
        return self.session.save(step=self.step_done, task_cursor=self.task_cursor,
                                 warm_start_done=self.warm_start_done)

    def close(self) -> None:
        self.session.close()
