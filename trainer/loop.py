"""The AgentOPSD training loop: collect → score → teacher evidence → advantages → update → log.

`Trainer(cfg).train()` runs the whole job: an optional supervised warm start on oracle demonstrations,
then `trainer.total_steps` RL steps. One RL step (`Trainer.step`) fills one step batch (`TurnBatch`), column
by column, in the order the methods below appear:

1. collect   B tasks × G rollouts through the `EnvPool` with the current weights (batched generation; with
             dynamic sampling, rounds until B groups have mixed outcomes);
2. score     turn rows (`build_turn_batch`): rewards, group success rates, prompt / teacher prompt ids;
3. logprobs  `old_logprobs` (recomputed by the trainer model), `ref_logprobs` (`ReferencePolicy`, when KL is
             on), `teacher_logprobs` of the same responses under the privileged prompt (no grad; rows without
             it are skipped, their evidence is exactly 0) and with them `gaps` and `evidence`;
4. credit    `seq_advantages` (A_seq from the outcomes) and per-token `advantages` (the estimator's reshaping
             plus the penalty term: `trainer/advantages.py`);
5. update    clipped (and dual-clipped) policy loss + k3 KL − entropy bonus, token-mean per PPO mini-batch:
             the rows are shuffled and cut into `ppo_mini_batch_rows`, one optimiser step each, for
             `ppo_epochs` passes, π_old fixed for the whole step; micro-batched inside for memory;
6. log       metrics (`trainer/metrics.py`), trajectories and credit files, periodic validation
             (`trainer/validation.py`) and atomic checkpoints.

The other concerns live beside the loop, each behind a small interface: the warm start (`WarmStart`), the
model with its engine and tokenizer (`TrainedModel`), the reference policy, the rollout backend (the
`RolloutBackend` protocol of `models/backends.py`: sampling views, wake/sleep, weight sync, RNG state).

Data parallel (several processes under torchrun or the `deepspeed` launcher): rank r of W collects tasks
`cursor + r·B/W .. cursor + (r+1)·B/W − 1` of the step's B (all G copies of a task on one rank, so GRPO
groups and the credit, which are per group and per trajectory, are computed locally and equal what one
process would compute on the union), with its own sampling seed. The update's loss is the token mean over
the whole step on all ranks: each rank divides its token sums by the global token count of the mini-batch
and multiplies by W (DeepSpeed averages gradients over the ranks), and all ranks run the same number of
micro-batches (padding with zero-weight ones) so ZeRO's collectives line up. Metrics are reduced across
ranks; rank 0 alone writes metrics, the trackers, trajectories (the union, each trajectory's
`metadata["rank"]` saying who collected it), credit files and the config; checkpoints are collective.
The warm start and validation run identically on every rank (no speed-up, no divergence).

Several environments (`env.id` = `'ALFWorld-v0:easy=0.5,WebShop-v0:train=0.5'`): one `TrainEnv` each, with its
own `RolloutRunner` (prompt format, system prompt, skill library, turn budget) and invalid-action penalty.
Each round of B tasks is split between the environments by weight (`mixed_task_specs`, a function of the seed
and the cursor, so a resume continues the same sequence); a group is G rollouts of one task of one
environment, its id the task's slot in the stream (unique across environments). Each row is penalised by its
own environment's value; metrics (`train/<spec>/...`), validation and credit records are per environment.

Old log-probs: the rollout's sampling log-probs are kept in the trajectories, but the ratio uses the
trainer's recomputation (identical up to float noise for the HF backend; for vLLM the two differ and the
recomputed ones are the consistent reference for the trainer's own forward pass).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from agentgym_opsd.models.backends import RolloutBackend
from agentgym_opsd.models.precision import resolve_dtype
from agentgym_opsd.records import Trajectory, save_jsonl
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer import checkpoint as ckpt
from agentgym_opsd.trainer import engine as dist
from agentgym_opsd.trainer.advantages import batch_advantages
from agentgym_opsd.trainer.config import Config, ConfigError
from agentgym_opsd.trainer.dynamic_sampling import collect_informative, group_diversity
from agentgym_opsd.trainer.engine import DeepSpeedEngineAdapter, make_engine
from agentgym_opsd.trainer.logprobs import (
    bucket_micro_batches,
    collate,
    pack,
    packed_response_logprobs,
    response_logprobs,
    supports_packing,
)
from agentgym_opsd.trainer.losses import StartDrift, policy_objective
from agentgym_opsd.trainer.metrics import METRIC_KEYS, MetricsLog, reduce_step_metrics, step_metrics
from agentgym_opsd.trainer.model_card import write_model_card
from agentgym_opsd.trainer.reference import ReferencePolicy
from agentgym_opsd.trainer.task_stream import mixed_task_specs, train_task_specs
from agentgym_opsd.trainer.trackers import check_trackers, make_trackers
from agentgym_opsd.trainer.trained_model import TrainedModel
from agentgym_opsd.trainer.turn_batch import (
    CreditRecord,
    TurnBatch,
    build_turn_batch,
    credit_lines,
    write_jsonl_atomic,
)
from agentgym_opsd.trainer.validation import StartEvaluationCache, Validation, start_evaluation_key
from agentgym_opsd.trainer.warm_start import WarmStart

__all__ = ["Trainer", "TrainEnv", "seed_everything", "METRIC_KEYS", "train_task_specs", "PHASES"]

PHASES = ("setup", "warm start", "evaluation", "rollout", "logprobs", "teacher", "update", "checkpoints")
"""The parts of a run's wall time that `Trainer.time_report` names (the rest is 'other')."""

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """The one seeding function: python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _pad_left(rows: list[Tensor], width: int) -> Tensor:
    """(rows, width) right-aligned copy of 1-D tensors (zeros on the left), matching `collate`."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for r, t in enumerate(rows):
        if t.numel():
            out[r, width - t.numel():] = t
    return out


@dataclass
class TrainEnv:
    """One training environment of the run (the only one, or one of a mix): its spec as `env.id` names it, its
    share of the tasks, its runner (own prompt format, skill library and turn budget), its invalid-action
    penalty, and the size of its task cycle."""

    spec: str
    weight: float
    runner: RolloutRunner
    invalid_penalty: float
    env_num_tasks: int | None  # the environment's own number of tasks (None: unknown)
    num_tasks: int | None  # the training cycle: env.num_train_tasks, else env_num_tasks


class Trainer:
    """Owns the model, the engine, the rollout runners and the output directory of one run."""

    def __init__(self, cfg: Config, *, resume: str | None = None) -> None:
        self.cfg = cfg
        self.out = Path(cfg.trainer.output_dir)
        self.started = time.perf_counter()
        self.phase_seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)  # this session's wall time per phase
        try:
            check_trackers(cfg.trainer.trackers)  # a tracker that cannot start fails now, before any load or delete
            ckpt.check_run_folder(self.out)
            if not resume:  # the launcher's RANK: the process group is not joined yet; rank 0 alone deletes
                ckpt.refuse_or_clear_run_folder(self.out, overwrite=cfg.trainer.overwrite,
                                                clear=os.environ.get("RANK", "0") == "0")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.out.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir = self.out / "checkpoints"
        self.device = torch.device("cuda" if cfg.trainer.device == "auto" and torch.cuda.is_available()
                                   else ("cpu" if cfg.trainer.device == "auto" else cfg.trainer.device))
        # `model.dtype: auto` becomes what this machine computes fastest in (bf16 where native), once, here: the
        # model, the reference, the rollout engine, the warm-start cache key and config.yaml all see the result.
        resolved = resolve_dtype(cfg.model.dtype, self.device)
        if resolved != cfg.model.dtype:
            cfg = self.cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=resolved))
        self._join_ranks()
        self.state: ckpt.TrainerState | None = None
        # rank 0 decides, so every rank resumes from the same folder
        resume_from = dist.broadcast_object(self._resume_path(resume) if self.is_main else None)
        if resume_from is not None:
            self.state = ckpt.load_trainer_state(resume_from)
            self._check_resumable(resume_from, self.state)
            log.info("resuming from %s (step %d)", resume_from, self.state.step)
        seed_everything(cfg.trainer.seed)
        self.step_done = self.state.step if self.state else 0
        self.task_cursor = self.state.task_cursor if self.state else 0
        self.warm_start_done = self.state.warm_start_done if self.state else not cfg.warm_start.enabled

        model, self.tokenizer = self._load_model(resume_from)
        model.to(self.device)
        self.engine = make_engine(model, cfg.optim, cfg.deepspeed, backend=cfg.trainer.backend)
        self.model = self.engine.module
        # The update's micro-batches without padding (`trainer/logprobs.py`, `benchmarks/bench_update_path.py`):
        # same numbers as the padded layout to float rounding; models it does not support keep the padded one.
        self.packed_update = supports_packing(self.model)
        self.trained = TrainedModel(self.model, self.tokenizer, self.engine, self.device, is_main=self.is_main,
                                    lora=cfg.model.lora, temperature=cfg.rollout.temperature,
                                    micro_batch_tokens=cfg.optim.micro_batch_tokens,
                                    micro_batch_rows=cfg.optim.micro_batch_rows)
        if self.rank:  # ranks share the weights (seeded alike above), not their random streams
            seed_everything(self._rank_seed(cfg.trainer.seed))
        self.envs = [self._make_train_env(spec, weight) for spec, weight in cfg.env.mix]
        self._env_by_spec = {env.spec: env for env in self.envs}
        # the one-environment names (the warm start, benchmarks): the first environment's
        first = self.envs[0]
        self.profile, self.runner, self.invalid_penalty = first.runner.profile, first.runner, first.invalid_penalty
        self.env_num_tasks, self.num_tasks = first.env_num_tasks, first.num_tasks
        self.warm_starter = WarmStart(cfg, run_dir=self.out, system_prompt=self.profile.system_prompt,
                                      env_num_tasks=self.env_num_tasks, demonstrator=self.profile.demonstrator)
        self.reference = ReferencePolicy(self.trained, kl_coef=cfg.algorithm.kl_coef,
                                         base_model=cfg.model.name_or_path, dtype=cfg.model.dtype,
                                         warm_start_dir=self.warm_starter.model_dir)
        self.policy: RolloutBackend = self._make_rollout_backend()
        self._weights_dirty = False  # the trainer's weights changed since the vLLM engine last got them
        self.validation = Validation(cfg, {env.spec: env.runner for env in self.envs}, self._make_runner,
                                     self._generating)
        self.metrics_log = MetricsLog(self.out, functools.partial(
            make_trackers, cfg.trainer.trackers, self.out, name=self.out.name, config=cfg.to_dict(),
            resume=self.state is not None)) if self.is_main else None
        if self.state is not None:
            self._restore(resume_from)
        elif self.metrics_log is not None:
            self.metrics_log.set_aside_old()
        if self.is_main:
            self.out.joinpath("config.yaml").write_text(cfg.to_yaml(), encoding="utf-8")
        dist.barrier()  # nobody starts before rank 0 has set the run folder up

    # ---- ranks ------------------------------------------------------------------------------------------
    def _join_ranks(self) -> None:
        """Join the process group (DeepSpeed backend) and split B over the ranks; a bad split is an error."""
        if self.cfg.trainer.backend == "deepspeed":
            dist.init_distributed(self.device)
        self.rank, self.world = dist.rank(), dist.world_size()
        self.is_main = self.rank == 0
        if self.world > 1 and self.cfg.trainer.backend != "deepspeed":
            raise ConfigError(f"trainer.backend={self.cfg.trainer.backend}: runs in one process; with "
                              f"{self.world} processes use trainer.backend=deepspeed")
        b = self.cfg.rollout.tasks_per_step
        if b % self.world:
            raise ConfigError(f"rollout.tasks_per_step: {b} tasks cannot be split evenly over {self.world} ranks "
                              "(each rank collects B / ranks whole groups)")
        self.tasks_per_rank = b // self.world

    def _rank_seed(self, seed: int) -> int:
        """Rank 0 keeps the run's seed (a one-process run is unchanged); others get distinct streams."""
        return seed + 7_919 * self.rank

    def _check_resumable(self, folder: Path, state: ckpt.TrainerState) -> None:
        """Our manifest first (before DeepSpeed unpickles anything), then the same number of ranks and the
        same ZeRO layout."""
        zero = self.cfg.trainer.backend == "deepspeed" and self.cfg.deepspeed.zero_stage > 0
        if zero or (folder / "deepspeed").is_dir():
            ckpt.verify_manifest(folder)
        if state.world_size != self.world:
            raise ckpt.CheckpointError(f"checkpoint {folder} was written by {state.world_size} process(es); this run "
                                       f"has {self.world}: resume with the same number of processes")
        has_ds = (folder / "deepspeed").is_dir()
        if zero and not has_ds:
            raise ckpt.CheckpointError(f"checkpoint {folder} has no deepspeed/ folder (written without ZeRO); resume "
                                       "with the deepspeed.zero_stage it was written with")
        if not zero and has_ds and not state.engine:
            raise ckpt.CheckpointError(f"checkpoint {folder} holds a ZeRO > 0 DeepSpeed state; resume with the "
                                       "deepspeed.zero_stage it was written with")

    # ---- setup ------------------------------------------------------------------------------------------
    def _resume_path(self, resume: str | None) -> Path | None:
        if not resume:
            return None
        if resume == "auto":
            return ckpt.latest_checkpoint(self.ckpt_dir)
        path = Path(resume)
        if not path.is_dir():
            raise ckpt.CheckpointError(f"--resume {resume}: no such checkpoint folder")
        return path

    def _load_model(self, resume_from: Path | None) -> tuple[Any, Any]:
        from agentgym_opsd.models.loading import LoraSettings, freeze_lower_layers, load_policy_model

        m = self.cfg.model
        if resume_from is not None:
            try:
                model, tok = load_policy_model(str(resume_from / "model"), dtype=m.dtype, trainable=True)
            except Exception as exc:  # a truncated safetensors file, a missing config: the checkpoint is unusable
                raise ckpt.CheckpointError(f"{resume_from / 'model'}: the saved model cannot be loaded "
                                           f"({type(exc).__name__}: {str(exc)[:200]}); resume from an earlier "
                                           "checkpoint or start over") from exc
        else:
            lora = LoraSettings(r=m.lora_r, alpha=m.lora_alpha, dropout=m.lora_dropout,
                                target_modules=tuple(m.lora_target_modules)) if m.lora else None
            model, tok = load_policy_model(m.name_or_path, dtype=m.dtype, lora=lora, trainable=True)
        if m.trainable_layers:
            trainable = freeze_lower_layers(model, m.trainable_layers)
            log.info("training the top %d layers: %.1fM trainable parameters", m.trainable_layers, trainable / 1e6)
        if m.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        return model, tok

    def _make_train_env(self, spec: str, weight: float) -> TrainEnv:
        """A training environment: its runner sized for this rank's B / ranks tasks (any step may draw them all
        from it), its penalty (`env.invalid_action_penalty`, else its profile's) and its task cycle."""
        e = self.cfg.env
        runner = self._make_runner(spec, self.tasks_per_rank * self.cfg.rollout.group_size)
        penalty = e.invalid_action_penalty if e.invalid_action_penalty >= 0 else runner.profile.invalid_action_penalty
        env_num_tasks = self._num_tasks(runner)
        return TrainEnv(spec, weight, runner, penalty, env_num_tasks, e.num_train_tasks or env_num_tasks)

    def _make_runner(self, env_spec: str, num_envs: int) -> RolloutRunner:
        """A runner for `env_spec` with its own profile's system prompt and history length (unless the config
        overrides them)."""
        cfg = self.cfg.env
        renderer = cfg.prompt_renderer(env_spec)
        kwargs = dict(cfg.kwargs)
        if cfg.max_turns > 0:
            kwargs["max_turns"] = cfg.max_turns
        teacher = self.cfg.teacher
        return RolloutRunner(env_spec, num_envs=num_envs, env_kwargs=kwargs, renderer=renderer,
                             use_skills=cfg.use_skills, step_timeout_s=cfg.step_timeout_s,
                             hint_level=teacher.hint_level if teacher.uses_hint else "",
                             env_workers=self.cfg.rollout.env_workers)

    @staticmethod
    def _num_tasks(runner: RolloutRunner) -> int | None:
        return runner.pool.num_tasks

    def _make_rollout_backend(self) -> RolloutBackend:
        """The rollout policy at the rollout temperature with this rank's seed. Other samplers (validation)
        are `policy.with_sampling(...)` views of it: for vLLM the one engine, never a second one. vLLM runs
        in sleep mode: it frees its KV cache and weights while the trainer runs its passes."""
        from agentgym_opsd.models.backends import make_policy_backend

        r = self.cfg.rollout
        seed = self._rank_seed(self.cfg.trainer.seed)
        if r.backend == "hf":
            return make_policy_backend("hf", model=self.model, tokenizer=self.tokenizer,
                                       max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                                       batch_size=r.batch_size, seed=seed)
        folder = self.out / "vllm_init_model"
        self.trained.save(folder)
        dist.barrier()  # every rank's engine reads rank 0's files
        return make_policy_backend(
            "vllm", model_path=str(folder), tokenizer=self.tokenizer, max_new_tokens=r.max_new_tokens,
            temperature=r.temperature, top_p=r.top_p, seed=seed, dtype=self.cfg.model.dtype,
            gpu_memory_utilization=r.vllm_gpu_memory_utilization, max_model_len=r.vllm_max_model_len,
            kv_cache_gib=r.vllm_kv_cache_gib, enable_sleep_mode=True,
            llm_kwargs={"enforce_eager": True} if r.vllm_enforce_eager else None)

    def _sampler_at(self, temperature: float, seed: int) -> RolloutBackend:
        return self.policy.with_sampling(temperature=temperature, seed=seed)

    @contextlib.contextmanager
    def _generating(self) -> Iterator[None]:
        """Around every generation phase: the rollout backend woken and, when the trainer's weights changed
        since it last saw them, synced (every rank, in step: gathering ZeRO-3 shards is collective), put back
        to sleep afterwards; the HF backend generates with the trainer model, under ZeRO-3 with its weights
        gathered for the phase."""
        self.policy.wake_up()
        if self._weights_dirty:
            self.policy.sync_weights(self.model)
        self._weights_dirty = False
        hf = self.cfg.rollout.backend == "hf"
        with self.engine.full_weights() if hf else contextlib.nullcontext():
            try:
                yield
            finally:
                self.policy.sleep()

    def _restore(self, folder: Path | None) -> None:
        assert self.state is not None and folder is not None
        if isinstance(self.engine, DeepSpeedEngineAdapter) and self.engine.zero_stage > 0:
            self.engine.load_deepspeed_checkpoint(str(folder / "deepspeed"))
        else:
            self.engine.load_state_dict(self.state.engine)
        rng = self.state.rank_rng[self.rank] if self.state.rank_rng else self.state.rng
        sampler = ckpt.restore_rng(rng)
        if sampler is not None:
            self.policy.set_rng_state(sampler)
        self._weights_dirty = True  # a vLLM engine was built before DeepSpeed loaded its state
        if self.metrics_log is not None:
            self.metrics_log.truncate_after(self.state.step)

    # ---- the job ----------------------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """Warm start (once), then RL steps up to `total_steps`; returns this session's metric lines."""
        cfg = self.cfg.trainer
        if not self.warm_start_done:
            with self._timed("warm start"):
                self.warm_start()
        self.reference.setup()
        self.phase_seconds["setup"] = time.perf_counter() - self.started - self.phase_seconds["warm start"]
        if cfg.eval_at_start and self.step_done == 0:
            with self._timed("evaluation"):
                self._log(self.validate_at_start(), step=0)
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
                self._log(metrics, step=self.step_done)
                lines.append(metrics)
                if (cfg.save_every and self.step_done % cfg.save_every == 0) or self.step_done == cfg.total_steps:
                    with self._timed("checkpoints"):
                        self.save()
                bar.update(1)
                bar.set_postfix(success=f"{metrics['success_rate']:.2f}", loss=f"{metrics['loss']:.4f}")
        finally:
            bar.close()
            if self.metrics_log is not None:
                self.metrics_log.flush()
        if self.metrics_log is not None and lines:
            self.metrics_log.finish(step=self.step_done)
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
        return (f"time: {total / 60:.1f} min in all ({self.cfg.model.dtype}, {torch.get_num_threads()} threads): "
                + ", ".join(parts + [f"other {max(other, 0.0) / 60:.1f}"]) + " min")

    def warm_start(self) -> dict[str, Any]:
        """The supervised stage (`WarmStart`): trained, or reused from the cache."""
        summary = self.warm_starter.run(self.trained, self.runner)
        self.warm_start_done = True
        self._weights_dirty = True  # the rollout engine must sample from the warm-started weights
        return summary

    # ---- one RL step: collect -> score -> old / reference / teacher log-probs -> credit -> update -> log ----
    def step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        trajs, sampling = self.collect_step()
        seconds_rollout = time.perf_counter() - t0
        metrics, batch = self.train_on(trajs)
        metrics.update(sampling)
        metrics["seconds_rollout"] = seconds_rollout
        self.step_done += 1
        metrics["step"] = self.step_done
        if self.cfg.trainer.save_trajectories:
            union = [t for part in dist.all_gather_objects(trajs) for t in part]
            if self.is_main:
                save_jsonl(union, self.out / "trajectories" / f"step_{self.step_done:06d}.jsonl")
            self._save_credit(trajs, batch)
        self._weights_dirty = True  # vLLM gets the updated weights before it next generates
        return metrics

    def step_on(self, trajs: list[Trajectory]) -> dict[str, Any]:
        """Score, log-probs, credit and one update on given trajectories (also used by benchmarks and tests);
        the step's metrics."""
        return self.train_on(trajs)[0]

    def train_on(self, trajs: list[Trajectory]) -> tuple[dict[str, Any], TurnBatch]:
        """`step_on`, also returning the step batch, which gets its columns phase by phase (the credit file is
        written from it)."""
        batch = self.score(trajs)
        t0 = time.perf_counter()
        with self.engine.full_weights():  # ZeRO-3: these passes differ in length by rank
            batch.old_logprobs = self.old_logprobs(batch)
            batch.ref_logprobs = self.reference.logprobs(batch.prompt_ids, batch.response_ids)
            seconds_logprobs = time.perf_counter() - t0
            t0 = time.perf_counter()
            # GRPO reads no evidence: the teacher is the student itself, so every gap (and e_k) is exactly 0.
            batch.set_teacher(self.teacher_logprobs(batch, batch.old_logprobs) if self.cfg.algorithm.needs_teacher
                              else list(batch.old_logprobs))
            seconds_teacher = time.perf_counter() - t0
        self.credit(batch)
        t0 = time.perf_counter()
        update = self.update(batch)
        seconds_update = time.perf_counter() - t0
        metrics = step_metrics(batch, update, lam=self.current_lam())
        metrics.update(seconds_teacher=seconds_teacher, seconds_logprobs=seconds_logprobs,
                       seconds_update=seconds_update)
        if self.world > 1:
            metrics = reduce_step_metrics(metrics, trajs, batch, self.world)
        # one key style for every phase: `<phase>/<env spec>/<metric>`, as validation writes `val/<spec>/...`
        metrics.update(self._env_metrics(trajs, metrics))
        return metrics, batch

    def _env_metrics(self, trajs: list[Trajectory], metrics: dict[str, Any]) -> dict[str, float]:
        """`train/<env spec>/...`: one environment, its success rate (the step's); a mix, per environment the
        episodes it played this step and, when it played any, success rate, turns and invalid-action rate
        (summed over the ranks)."""
        if len(self.envs) == 1:
            return {f"train/{self.envs[0].spec}/success_rate": metrics["success_rate"]}
        sums: list[float] = []
        for env in self.envs:
            mine = [t for t in trajs if self.env_of(t) is env]
            sums += [float(len(mine)), float(sum(t.won for t in mine)), float(sum(t.num_turns for t in mine)),
                     float(sum(t.num_invalid_actions for t in mine))]
        sums = dist.all_reduce(sums) if self.world > 1 else sums
        out: dict[str, float] = {}
        for k, env in enumerate(self.envs):
            episodes, won, turns, invalid = sums[4 * k:4 * k + 4]
            out[f"train/{env.spec}/episodes"] = episodes
            if episodes:
                out.update({f"train/{env.spec}/success_rate": won / episodes,
                            f"train/{env.spec}/turns_mean": turns / episodes,
                            f"train/{env.spec}/invalid_action_rate": invalid / max(turns, 1.0)})
        return out

    def collect_step(self) -> tuple[list[Trajectory], dict[str, float]]:
        """This rank's trajectories of one step and the sampling metrics. Without dynamic sampling: B / ranks
        whole groups, numbered as in a one-process run. With it: rounds of B tasks until this rank holds
        B / ranks groups with mixed outcomes or `rollout.max_sampling_rounds` rounds were played (every rank
        plays the same number of rounds)."""
        r, outcome = self.cfg.rollout, self.cfg.env.outcome
        if not r.dynamic_sampling:
            trajs = self.collect()
            return trajs, {f"rollout/{k}": v for k, v in group_diversity(trajs, outcome=outcome).items()}
        seen: list[Trajectory] = []

        def play(_: int) -> list[Trajectory]:
            seen.extend(trajs := self.collect())
            return trajs

        def keep_going(kept: int) -> bool:  # collective: ZeRO-3 generation gathers weights on every rank
            return any(k < self.tasks_per_rank for k in dist.all_gather_objects(kept))

        trajs, report = collect_informative(play, want_groups=self.tasks_per_rank, max_rounds=r.max_sampling_rounds,
                                            keep_going=keep_going, outcome=outcome)
        return trajs, {**report.metrics(),
                       **{f"rollout/{k}": v for k, v in group_diversity(seen, outcome=outcome).items()}}

    def collect(self) -> list[Trajectory]:
        """One round: the next B tasks of the training stream (this rank's B / ranks whole groups, numbered
        as in a one-process run), G rollouts each."""
        r = self.cfg.rollout
        first = self.task_cursor + self.rank * self.tasks_per_rank
        slots = mixed_task_specs(first, self.tasks_per_rank, weights=[env.weight for env in self.envs],
                                 num_tasks=[env.num_tasks for env in self.envs], seed=self.cfg.trainer.seed,
                                 block=r.tasks_per_step)
        self.model.eval()
        trajs: list[Trajectory] = []
        with self._generating():
            for index, env in enumerate(self.envs):  # one environment after the other, each in one batch
                mine = [(slot, task) for slot, (e, task) in enumerate(slots, start=first) if e == index]
                if mine:
                    trajs += self._play(env, mine)
        trajs.sort(key=lambda t: t.traj_id)  # stream order, whatever the environment
        for traj in trajs:
            traj.metadata["rank"] = self.rank
        self.task_cursor += r.tasks_per_step
        return trajs

    def _play(self, env: TrainEnv, slots: list[tuple[int, Any]]) -> list[Trajectory]:
        """G rollouts of each (slot, task) on `env`'s runner. A group's id is its slot in the stream and a
        trajectory's `slot * G + copy`, so ids are unique across environments; `metadata["env_spec"]` names
        the environment."""
        g = self.cfg.rollout.group_size
        trajs = env.runner.run(self.policy, [task for _, task in slots], group_size=g, first_group_id=slots[0][0],
                               first_traj_id=slots[0][0] * g)
        for i, traj in enumerate(trajs):  # task-major, copy-minor
            slot = slots[i // g][0]
            traj.group_id, traj.traj_id = slot, slot * g + i % g
            traj.metadata["env_spec"] = env.spec
        return trajs

    def env_of(self, traj: Trajectory) -> TrainEnv:
        """The training environment a trajectory came from (the first one for trajectories not collected by
        `collect`, e.g. a benchmark's own)."""
        return self._env_by_spec.get(str(traj.metadata.get("env_spec")), self.envs[0])

    def score(self, trajs: list[Trajectory]) -> TurnBatch:
        a = self.cfg.algorithm
        penalty = ([self.env_of(t).invalid_penalty for t in trajs] if len(self.envs) > 1  # each row its env's
                   else self.invalid_penalty)
        return build_turn_batch(trajs, encode_prompt=self.trained.encode,
                                teacher_messages=self._teacher_messages if a.needs_teacher else None,
                                reward_scale=self.cfg.env.reward_scale, invalid_penalty=penalty,
                                success_source=a.success_source, penalty_mode=a.penalty_mode, penalize=a.penalize,
                                outcome=self.cfg.env.outcome)

    def _teacher_messages(self, traj: Trajectory, turn: Any) -> list[dict[str, str]]:
        """The turn's privileged prompt, rendered by its own environment's runner."""
        return self.env_of(traj).runner.teacher_messages(traj, turn, context=self.cfg.teacher.context)

    def old_logprobs(self, batch: TurnBatch) -> list[Tensor]:
        """π_old of every response token: the sampler's own numbers when they are trustworthy (HF backend,
        `recompute_old_logprobs=False`), else a teacher-forced pass of the trainer model."""
        reuse = (not self.cfg.algorithm.recompute_old_logprobs and self.cfg.rollout.backend == "hf"
                 and all(len(r.sample_logprobs) == len(r.response_ids) for r in batch.rows))
        if reuse:
            return [torch.tensor(r.sample_logprobs, dtype=torch.float32) for r in batch.rows]
        return self.trained.logprobs(batch.prompt_ids, batch.response_ids)

    def teacher_logprobs(self, batch: TurnBatch, student: list[Tensor]) -> list[Tensor]:
        """Teacher-forced log-probs under the c+ prompt; rows without c+ reuse the student's (gap 0)."""
        idx = [i for i, r in enumerate(batch.rows) if r.teacher_prompt_ids is not None]
        out = list(student)
        if idx:
            prompts = [batch.rows[i].teacher_prompt_ids for i in idx]
            responses = [batch.rows[i].response_ids for i in idx]
            got = self.trained.logprobs(prompts, responses,  # type: ignore[arg-type]
                                        shared_prefix=self.cfg.optim.teacher_prefix_cache)
            for i, t in zip(idx, got, strict=True):
                out[i] = t
        return out

    def current_lam(self) -> float:
        """λ of this step: constant, or decaying linearly to 0 over the last `lam_warmdown_steps` steps."""
        a, total = self.cfg.algorithm, self.cfg.trainer.total_steps
        if not a.lam_warmdown_steps:
            return a.lam
        start = max(total - a.lam_warmdown_steps, 0)
        done = min(max(self.step_done - start + 1, 0), a.lam_warmdown_steps)
        return a.lam * (1.0 - done / a.lam_warmdown_steps)

    def credit(self, batch: TurnBatch) -> None:
        """The credit phase: per-row token advantages and the per-trajectory A_seq into the batch
        (`trainer/advantages.py`: the penalty mode's bookkeeping, the estimator, the row penalty term)."""
        a = self.cfg.algorithm
        assert batch.evidence is not None and batch.gaps is not None
        out = batch_advantages(batch, batch.evidence, batch.gaps, estimator=a.estimator,
                               config=a.credit_config(self.current_lam()), cross_steps=a.grpo_cross_steps,
                               normalize_std=a.normalize_std, return_details=self.cfg.trainer.save_trajectories)
        batch.advantages, batch.seq_advantages, batch.credit = out.tokens, out.seq, out.result

    def _save_credit(self, trajs: list[Trajectory], batch: TurnBatch) -> None:
        """`credit/step_N.jsonl` beside the trajectories: per turn e_k, B_k, ΔB_k, w_k, Ã_k (and GiGPO's step
        numbers, per-token gaps for a token-level estimator), one line per trajectory, joined by traj_id/turn."""
        lines: list[dict[str, Any]] = []
        if batch.credit is not None:
            assert batch.evidence is not None and batch.gaps is not None
            assert batch.seq_advantages is not None and batch.advantages is not None
            record = CreditRecord(batch, batch.evidence, batch.gaps, batch.seq_advantages, batch.advantages,
                                  batch.credit)
            token_text = None
            if batch.credit.granularity == "token":
                token_text = [self.tokenizer.batch_decode([[t] for t in r.response_ids]) for r in batch.rows]
            lines = credit_lines(trajs, record, estimator=self.cfg.algorithm.estimator, step=self.step_done,
                                 token_text=token_text, env_ids=[self.env_of(t).spec for t in trajs])
        # every rank takes part, also one without rows (no record): the gather is collective
        lines = [line for part in dist.all_gather_objects(lines) for line in part]
        if self.is_main and lines:
            write_jsonl_atomic(lines, self.out / "credit" / f"step_{self.step_done:06d}.jsonl")

    def mini_batches(self, num_rows: int, global_rows: int | None = None) -> list[list[int]]:
        """Row indices of each optimiser step of this RL step: `ppo_epochs` passes, each a fresh shuffle
        cut into `ppo_mini_batch_rows` (all rows at once when 0); seeded by the step, so a resumed run
        replays the same order.

        Data parallel (`global_rows` = the rows of all ranks): every rank must take the same number of
        optimiser steps, so each cuts its own shuffled rows into ceil(global_rows / ppo_mini_batch_rows)
        near-equal parts (possibly empty); mini-batch k is the union of the ranks' k-th parts."""
        a = self.cfg.algorithm
        gen = torch.Generator().manual_seed(self.cfg.trainer.seed * 1_000_003 + self.step_done + 7_919 * self.rank)
        out: list[list[int]] = []
        if global_rows is None or self.world == 1:
            size = a.ppo_mini_batch_rows or num_rows
            for _ in range(a.ppo_epochs):
                order = torch.randperm(num_rows, generator=gen).tolist() if size < num_rows else list(range(num_rows))
                out += [order[i:i + size] for i in range(0, num_rows, size)]
            return out
        parts = max(math.ceil(global_rows / a.ppo_mini_batch_rows), 1) if a.ppo_mini_batch_rows else 1
        for _ in range(a.ppo_epochs):
            order = torch.randperm(num_rows, generator=gen) if parts > 1 else torch.arange(num_rows)
            out += [chunk.tolist() for chunk in torch.tensor_split(order, parts)]
        return out

    def update(self, batch: TurnBatch) -> dict[str, float]:
        """PPO on the step batch's columns (old log-probs, advantages, reference log-probs when KL is on): one
        optimiser step per mini-batch (`mini_batches`), token-mean objective inside each, micro-batched by
        length; π_old stays the rollout policy for every mini-batch of the step."""
        a, o = self.cfg.algorithm, self.cfg.optim
        rows = batch.rows
        old, ref, advantages = batch.old_logprobs, batch.ref_logprobs, batch.advantages
        assert old is not None and advantages is not None, "update needs the old log-probs and the advantages"
        keys = ("loss", "policy_loss", "kl", "entropy", "clip_fraction", "approx_kl", "grad_norm", "optimizer_steps")
        global_rows = int(dist.all_reduce([len(rows)])[0])
        if not global_rows:
            return {**dict.fromkeys(keys, 0.0), **StartDrift().metrics()}
        prompts, responses = batch.prompt_ids, batch.response_ids
        lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
        sums = dict.fromkeys(("policy", "kl", "entropy", "clipped", "approx_kl", "tokens"), 0.0)
        losses, grad_norms = [], []
        drift = StartDrift()
        self.model.train()
        plan = self.mini_batches(len(rows), global_rows)
        micro = [bucket_micro_batches([lengths[i] for i in chosen], max_tokens=o.micro_batch_tokens,
                                      max_rows=o.micro_batch_rows, padded=not self.packed_update)
                 if chosen else [] for chosen in plan]
        # Token mean over every rank's rows: divide by the mini-batch's global token count; times the number of
        # ranks, since DeepSpeed averages the gradients over them. All ranks run the same number of micro-batches.
        local_tokens = [float(sum(len(responses[i]) for i in chosen)) for chosen in plan]
        global_tokens = dist.all_reduce(local_tokens)
        rounds = [int(n) for n in dist.all_reduce([float(len(m)) for m in micro], op="max")]
        for chosen, local, num_tokens, n_micro in zip(plan, micro, global_tokens, rounds, strict=True):
            loss = 0.0
            for k in range(n_micro):
                if k >= len(local):  # this rank has no rows left here: a zero-weight pass keeps ZeRO in step
                    self.engine.backward(self._idle_loss(), is_last=k == n_micro - 1)
                    continue
                idx = [chosen[j] for j in local[k]]
                logp, entropy, mask = self._update_logprobs(idx, prompts, responses)  # (rows, R) each
                width = mask.shape[1]
                old_tokens = _pad_left([old[i] for i in idx], width).to(self.device)
                terms = policy_objective(
                    logp, old_tokens,
                    _pad_left([advantages[i] for i in idx], width).to(self.device), mask,
                    entropy=entropy, ref_logp=_pad_left([ref[i] for i in idx], width).to(self.device) if ref else None,
                    clip_low=a.clip_low, clip_high=a.clip_high, clip_ratio_c=a.clip_ratio_c, kl_coef=a.kl_coef,
                    entropy_coef=a.entropy_coef, num_tokens=int(num_tokens))
                self.engine.backward(terms.loss * self.world if self.world > 1 else terms.loss,
                                     is_last=k == n_micro - 1)
                if not grad_norms:  # before the first optimiser step π_θ is the policy that sampled the rows
                    drift.add(logp.detach(), old_tokens, mask)
                loss += float(terms.loss.detach())
                for key, value in (("policy", terms.policy), ("kl", terms.kl), ("entropy", terms.entropy),
                                   ("clipped", terms.clipped_tokens), ("approx_kl", terms.approx_kl)):
                    sums[key] += float(value)
            sums["tokens"] += num_tokens / self.world  # summed over the ranks below
            losses.append(loss)
            grad_norms.append(self.engine.step())
        if self.world > 1:  # the loss terms are sums: add up the ranks' parts
            names = list(sums)
            sums = dict(zip(names, dist.all_reduce([sums[k] for k in names]), strict=True))
            losses = dist.all_reduce(losses)
        tokens = max(sums["tokens"], 1.0)
        return {"loss": float(np.mean(losses)), "policy_loss": sums["policy"] / tokens, "kl": sums["kl"] / tokens,
                "entropy": sums["entropy"] / tokens, "clip_fraction": sums["clipped"] / tokens,
                "approx_kl": sums["approx_kl"] / tokens, "grad_norm": float(np.nanmean(grad_norms)),
                "optimizer_steps": float(len(grad_norms)),
                **drift.metrics(dist.all_reduce if self.world > 1 else None)}

    def _update_logprobs(self, idx: list[int], prompts: list, responses: list) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probs, entropies and the response mask of one update micro-batch, all (rows, R) right-aligned:
        packed (no padding) when the model supports it, else left-padded."""
        temperature = self.cfg.rollout.temperature
        if self.packed_update:
            pb = pack(idx, prompts, responses).to(self.device)
            logp, entropy = packed_response_logprobs(self.model, pb, temperature=temperature, with_entropy=True)
            mask = pb.response_mask
        else:
            mb = collate(idx, prompts, responses, self.tokenizer.pad_token_id).to(self.device)
            logp, entropy = response_logprobs(self.model, mb, temperature=temperature, with_entropy=True)
            mask = mb.response_mask
        assert entropy is not None
        return logp, entropy, mask

    def _idle_loss(self) -> Tensor:
        """A zero loss through the whole model (one pad token): a rank without rows in a micro-batch still
        runs the forward/backward its ZeRO collectives expect, and adds nothing to the gradient."""
        pad = self.tokenizer.pad_token_id
        mb = collate([0], [[pad]], [[pad]], pad).to(self.device)
        logp, _ = response_logprobs(self.model, mb, temperature=self.cfg.rollout.temperature)
        return logp.sum() * 0.0

    # ---- validation, logging, checkpoints -----------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Held-out episodes at the validation temperature, and the pool check (`Validation`)."""
        self.model.eval()
        return self.validation.run(self._sampler_at, self.step_done)

    def validate_at_start(self) -> dict[str, float]:
        """The validation before the first RL step; from a cached warm start, computed once per evaluation
        setting and kept beside it (`StartEvaluationCache`), since every such run would play the same episodes
        with the same weights."""
        entry = self.warm_starter.cache_dir() if self.cfg.warm_start.enabled else None
        cache = StartEvaluationCache(entry, start_evaluation_key(self.cfg, threads=torch.get_num_threads(),
                                                                 world_size=self.world))
        hit = dist.broadcast_object(cache.load() if self.is_main else None)
        if hit is not None:
            log.info("validation before RL: reused %s", cache.path)
            return hit
        metrics = self.validate()
        if self.is_main:
            cache.store(metrics)
        return metrics

    def _log(self, metrics: dict[str, Any], *, step: int) -> None:
        if self.metrics_log is not None:  # rank 0; the metrics are reduced over the ranks already
            self.metrics_log.write(metrics, step=step)

    def save(self) -> Path:
        sampler = self.policy.get_rng_state()
        ds_zero = isinstance(self.engine, DeepSpeedEngineAdapter) and self.engine.zero_stage > 0
        rng = ckpt.capture_rng(sampler)
        rank_rng = dist.all_gather_objects(rng) if self.world > 1 else None  # each rank resumes its own streams
        state = ckpt.TrainerState(step=self.step_done, task_cursor=self.task_cursor,
                                  warm_start_done=self.warm_start_done,
                                  engine={} if ds_zero else self.engine.state_dict(),
                                  rng=rng, extra={"config": asdict(self.cfg)}, world_size=self.world,
                                  rank_rng=rank_rng)
        extra = (lambda d: self.engine.save_deepspeed_checkpoint(str(d / "deepspeed"))) if ds_zero else None
        path = ckpt.save_checkpoint(self.ckpt_dir, state, save_model=self._save_shareable_model,
                                    config_yaml=self.cfg.to_yaml(), save_extra=extra, ranks=dist.checkpoint_ranks())
        if self.is_main:
            ckpt.prune_checkpoints(self.ckpt_dir, self.cfg.trainer.keep_checkpoints)
        dist.barrier()
        return path

    def _save_shareable_model(self, folder: Path) -> None:
        """The weights, and beside them a model card and the sampling settings (`trainer/model_card.py`)."""
        self.trained.save(folder)
        if self.is_main:
            write_model_card(folder, self.cfg, step=self.step_done, metrics_path=self.out / "metrics.jsonl",
                             tokenizer=self.tokenizer)

    def close(self) -> None:
        for env in self.envs:
            env.runner.close()
        self.validation.close()
        if self.metrics_log is not None:
            self.metrics_log.close()
