"""One training run's set-up and persistence: ranks, resume, the model and its engine, the environments, the
rollout backend, validation and the metrics log; checkpoints (save, restore) and the step's files.

`RunSession(cfg, resume=...)` does, in this order (the order seeds the random streams, so it is fixed): join
the process group and split B over the ranks, pick the checkpoint to resume from (rank 0 decides), seed, load
the model (the checkpoint's, else the base model with LoRA / frozen layers), build the engine (DeepSpeed or
plain torch) and the `TrainedModel` around it, give each rank its own sampling seed, make one `TrainEnv` per
environment of `env.id`, the warm start, the reference policy, the rollout backend (`RolloutBackend`), the
validation and the metrics log, restore the checkpoint's state, write `config.yaml`.

Data parallel (several processes under torchrun or the `deepspeed` launcher): rank r of W collects B / W whole
groups with its own sampling seed; rank 0 alone writes metrics, the trackers, trajectories (the union, each
trajectory's `metadata["rank"]` saying who collected it), credit files and the config; checkpoints are
collective.

Several environments (`env.id` = `'ALFWorld-v0:easy=0.5,WebShop-v0:train=0.5'`): one `TrainEnv` each, with its
own `RolloutRunner` (prompt format, system prompt, skill library, turn budget) and invalid-action penalty; a
group is G rollouts of one task of one environment, its id the task's slot in the stream (unique across
environments).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym_opsd.cpu_runtime import LOG_PREFIX, describe_preloads
from agentgym_opsd.models.backends import RolloutBackend, choose_rollout_backend
from agentgym_opsd.models.loading import torch_dtype_of
from agentgym_opsd.models.precision import resolve_device
from agentgym_opsd.records import ChatMessage, Trajectory, Turn, save_jsonl
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer import checkpoint as ckpt
from agentgym_opsd.trainer import engine as dist
from agentgym_opsd.trainer.config import Config, ConfigError
from agentgym_opsd.trainer.credit_file import credit_lines, write_jsonl_atomic
from agentgym_opsd.trainer.engine import DeepSpeedEngineAdapter, make_engine
from agentgym_opsd.trainer.finite import NonFiniteError, nonfinite_weights, require_finite_weights
from agentgym_opsd.trainer.frozen_trunk import trunk_depth
from agentgym_opsd.trainer.logprobs import TrainedModel, supports_packing
from agentgym_opsd.trainer.metrics import MetricsLog
from agentgym_opsd.trainer.model_card import write_model_card
from agentgym_opsd.trainer.reference import ReferencePolicy
from agentgym_opsd.trainer.teacher_evidence import EvidenceMaker
from agentgym_opsd.trainer.trackers import check_trackers, make_trackers
from agentgym_opsd.trainer.turn_batch import StepRecord
from agentgym_opsd.trainer.validation import Validation
from agentgym_opsd.trainer.warm_start import WarmStart

__all__ = ["RunSession", "TrainEnv", "load_model", "seed_everything"]

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """The one seeding function: python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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

    def play(self, policy: Any, slots: list[tuple[int, Any]], group_size: int) -> list[Trajectory]:
        """G rollouts of each (slot, task). A group's id is its slot in the stream and a trajectory's
        `slot * G + copy`, so ids are unique across environments; `metadata["env_spec"]` names the
        environment."""
        g = group_size
        trajs = self.runner.run(policy, [task for _, task in slots], group_size=g, first_group_id=slots[0][0],
                                first_traj_id=slots[0][0] * g)
        for i, traj in enumerate(trajs):  # task-major, copy-minor
            slot = slots[i // g][0]
            traj.group_id, traj.traj_id = slot, slot * g + i % g
            traj.metadata["env_spec"] = self.spec
        return trajs


def load_model(cfg: Config, resume_from: Path | None) -> tuple[Any, Any]:
    """(model, tokenizer): the checkpoint's when resuming, else the base model (with LoRA adapters when on);
    the lower layers frozen and gradient checkpointing on as the config says."""
    from agentgym_opsd.models.loading import (
        LoraSettings,
        autocast_trainable_blocks,
        freeze_lower_layers,
        keep_trainable_in_float32,
        load_policy_model,
        restore_float32_weights,
    )

    m = cfg.model
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
    numerics = m.numerics
    if numerics.float32_trainable:
        cast = keep_trainable_in_float32(model)
        if resume_from is not None:  # loaded in m.dtype: the checkpoint's float32 layers back exactly, not rounded
            restore_float32_weights(model, resume_from / "model")
        log.info("model.precision=%s: %.1fM trained weights in float32 over %s frozen layers", m.precision,
                 cast / 1e6, m.dtype)
    if numerics.rl_autocast:
        blocks = autocast_trainable_blocks(model, torch_dtype_of(m.dtype))
        log.info("model.precision=%s: the %d trained blocks compute their matmuls in %s under autocast in the RL "
                 "phases, their weights and updates float32", m.precision, blocks, m.dtype)
    if resume_from is not None:  # a checkpoint of an earlier version (weights hashed by size only) meets this
        try:
            require_finite_weights(model.named_parameters(), f"checkpoint {resume_from} is corrupt")
        except NonFiniteError as exc:
            raise ckpt.CheckpointError(f"{exc}; resume from an earlier checkpoint or start over") from None
    if m.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model, tok


class RunSession:
    """Everything of one run but the step: its ranks, model, engine, environments, rollout backend, validation
    and output folder, built in `__init__`; checkpoints written by `save` and read back on resume."""

    def __init__(self, cfg: Config, *, resume: str | None = None, force: bool = False) -> None:
        self.cfg = cfg
        self.out = Path(cfg.trainer.output_dir)
        try:
            check_trackers(cfg.trainer.trackers)  # a tracker that cannot start fails now, before any load or delete
            # the launcher's RANK: the process group is not joined yet; rank 0 alone deletes and records
            self.output = ckpt.claim_run_folder(self.out, resume=bool(resume), overwrite=cfg.trainer.overwrite,
                                                force=force, writer=os.environ.get("RANK", "0") == "0")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.out.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir = self.out / "checkpoints"
        device = resolve_device(cfg.trainer.device)
        # `model.precision: auto` becomes what this machine computes fastest in (bf16-mixed where bf16 measures
        # faster), once, here: the model, the reference, the rollout engine, the cache keys and config.yaml see it.
        requested_precision = cfg.model.precision
        if (model := cfg.model.resolved(device)) != cfg.model:
            cfg = self.cfg = dataclasses.replace(cfg, model=model)
        # `rollout.backend: auto` likewise, once: TIS, the checkpoint and config.yaml see the backend that sampled.
        backend = choose_rollout_backend(cfg.rollout.backend, device_type=device.type,
                                         planned_episodes=cfg.planned_episodes())
        if backend.name != cfg.rollout.backend:
            log.info("rollout.backend=%s -> %s: %s", cfg.rollout.backend, backend.name, backend.reason)
            cfg = self.cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, backend=backend.name))
        if backend.name == "vllm" and device.type == "cpu":
            log.info("%s%s", LOG_PREFIX, describe_preloads())
        self._join_ranks(device)
        self.state: ckpt.TrainerState | None = None
        # rank 0 verifies and decides, so every rank resumes from the same intact folder (or raises the same error)
        resume_from, refused = dist.broadcast_object(self._resume_path(resume) if self.is_main else None)
        if refused is not None:
            raise ckpt.CheckpointError(refused)
        if resume_from is not None:
            self.state = ckpt.load_trainer_state(resume_from)
            self._check_resumable(resume_from, self.state)
            log.info("resuming from %s (step %d)", resume_from, self.state.step)
            # a resumed run keeps the numerics it started with where `model.precision` was left to `auto`
            kept = ckpt.saved_precision(resume_from)
            if requested_precision == "auto" and kept is not None and kept != cfg.model.precision:
                log.info("model.precision=auto -> %s: as the checkpoint's run computed", kept)
                cfg = self.cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, precision=kept))
        seed_everything(cfg.trainer.seed)

        model, tokenizer = load_model(cfg, resume_from)
        model.to(device)
        engine = make_engine(model, cfg.optim, cfg.deepspeed, backend=cfg.trainer.backend)
        # The update's micro-batches without padding (`trainer/logprobs.py`):
        # same numbers as the padded layout to float rounding; models it does not support keep the padded one.
        self.packed_update = supports_packing(engine.module)
        # the update reuses the π_old pass's trunk in the layout both share: packed
        self.trunk_depth = trunk_depth(engine.module, zero_stage=cfg.deepspeed.zero_stage,
                                       budget_mb=cfg.optim.trunk_cache_mb) if self.packed_update else 0
        self.trained = TrainedModel(engine.module, tokenizer, engine, device, is_main=self.is_main,
                                    lora=cfg.model.lora, temperature=cfg.rollout.temperature,
                                    micro_batch_tokens=cfg.optim.micro_batch_tokens,
                                    micro_batch_rows=cfg.optim.micro_batch_rows)
        if self.rank:  # ranks share the weights (seeded alike above), not their random streams
            seed_everything(self.rank_seed(cfg.trainer.seed))
        self.envs = [self._make_train_env(spec, weight) for spec, weight in cfg.env.mix]
        self._env_by_spec = {env.spec: env for env in self.envs}
        first = self.envs[0]  # the warm start plays the first environment
        self.warm_starter = WarmStart(cfg, run_dir=self.out, system_prompt=first.runner.profile.system_prompt,
                                      env_num_tasks=first.env_num_tasks, demonstrator=first.runner.profile.demonstrator)
        self.reference = ReferencePolicy(self.trained, kl_coef=cfg.algorithm.kl_coef,
                                         base_model=cfg.model.name_or_path, dtype=cfg.model.dtype,
                                         warm_start_dir=self.warm_starter.model_dir)
        self.policy: RolloutBackend = self._make_rollout_backend()
        self.weights_dirty = False  # the trainer's weights changed since the vLLM engine last got them
        self.validation = Validation(cfg, {env.spec: env.runner for env in self.envs}, self.make_runner,
                                     self.generating)
        self.metrics_log = MetricsLog(self.out, functools.partial(
            make_trackers, cfg.trainer.trackers, self.out, name=self.out.name, config=cfg.to_dict(),
            resume=self.state is not None)) if self.is_main else None
        if self.state is not None:
            self._restore(resume_from)
        elif self.metrics_log is not None:
            self.metrics_log.set_aside_old()
        if self.is_main:
            self.output.file("config.yaml").write_text(cfg.to_yaml(), encoding="utf-8")
            self.output.record(["metrics.jsonl"])
        dist.barrier()  # nobody starts before rank 0 has set the run folder up

    # ---- ranks and resume ---------------------------------------------------------------------------------
    def _join_ranks(self, device: torch.device) -> None:
        """Join the process group (DeepSpeed backend) and split B over the ranks; a bad split is an error."""
        if self.cfg.trainer.backend == "deepspeed":
            dist.init_distributed(device)
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

    def rank_seed(self, seed: int) -> int:
        """Rank 0 keeps the run's seed (a one-process run is unchanged); others get distinct streams."""
        return seed + 7_919 * self.rank

    def _resume_path(self, resume: str | None) -> tuple[Path | None, str | None]:
        """(the checkpoint to resume from, verified against its manifest; why none can be): `auto` is the newest
        intact checkpoint (newer corrupt ones are named and skipped), a path must itself be intact."""
        try:
            if not resume:
                return None, None
            if resume == "auto":
                return ckpt.resume_point(self.ckpt_dir), None
            path = Path(resume)
            if not path.is_dir():
                raise ckpt.CheckpointError(f"--resume {resume}: no such checkpoint folder")
            ckpt.verify_manifest(path)
            return path, None
        except ckpt.CheckpointError as exc:
            return None, str(exc)

    def _check_resumable(self, folder: Path, state: ckpt.TrainerState) -> None:
        """The same number of ranks and the same ZeRO layout (its manifest was verified by `_resume_path`)."""
        zero = self.cfg.trainer.backend == "deepspeed" and self.cfg.deepspeed.zero_stage > 0
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

    def _restore(self, folder: Path | None) -> None:
        assert self.state is not None and folder is not None
        if isinstance(self.trained.engine, DeepSpeedEngineAdapter) and self.trained.engine.zero_stage > 0:
            self.trained.engine.load_deepspeed_checkpoint(str(folder / "deepspeed"))
        else:
            self.trained.engine.load_state_dict(self.state.engine)
        rng = self.state.rank_rng[self.rank] if self.state.rank_rng else self.state.rng
        sampler = ckpt.restore_rng(rng)
        if sampler is not None:
            self.policy.set_rng_state(sampler)
        self.weights_dirty = True  # a vLLM engine was built before DeepSpeed loaded its state
        if self.metrics_log is not None:
            self.metrics_log.truncate_after(self.state.step)

    # ---- environments and the rollout backend -------------------------------------------------------------
    def _make_train_env(self, spec: str, weight: float) -> TrainEnv:
        """A training environment: its runner sized for this rank's B / ranks tasks (any step may draw them all
        from it), its penalty (`env.invalid_action_penalty`, else its profile's) and its task cycle."""
        e = self.cfg.env
        runner = self.make_runner(spec, self.tasks_per_rank * self.cfg.rollout.group_size)
        penalty = e.invalid_action_penalty if e.invalid_action_penalty >= 0 else runner.profile.invalid_action_penalty
        env_num_tasks = runner.pool.num_tasks
        return TrainEnv(spec, weight, runner, penalty, env_num_tasks, e.num_train_tasks or env_num_tasks)

    def make_runner(self, env_spec: str, num_envs: int) -> RolloutRunner:
        """A runner for `env_spec` with its own profile's system prompt and history length (unless the config
        overrides them)."""
        cfg = self.cfg.env
        kwargs = dict(cfg.kwargs)
        if cfg.max_turns > 0:
            kwargs["max_turns"] = cfg.max_turns
        teacher = self.cfg.teacher
        return RolloutRunner(env_spec, num_envs=num_envs, env_kwargs=kwargs, renderer=cfg.prompt_renderer(env_spec),
                             use_skills=cfg.use_skills, step_timeout_s=cfg.step_timeout_s,
                             hint_level=teacher.hint_level if teacher.uses_hint else "",
                             env_workers=self.cfg.rollout.env_workers)

    @functools.cached_property
    def evidence_maker(self) -> EvidenceMaker:
        """The teacher phase in the configured evidence form (`trainer/teacher_evidence.py`), on the trained
        model: choices (and, on the teacher side, the sampled reply) are scored at the rollout temperature with
        each prompt's KV cache shared by them."""
        t = self.cfg.teacher

        def teacher_messages(traj: Trajectory, turn: Turn) -> list[ChatMessage]:
            return self.env_of(traj).runner.teacher_messages(traj, turn, context=t.context)

        return EvidenceMaker(t.evidence, self.trained, teacher_messages, lambda traj: self.env_of(traj).runner.parser,
                             choice_norm=t.choice_norm, shared_prefix=self.cfg.optim.teacher_prefix_cache)

    def env_of(self, traj: Trajectory) -> TrainEnv:
        """The training environment a trajectory came from (the first one for trajectories not collected by
        `collect`, e.g. a benchmark's own)."""
        return self._env_by_spec.get(str(traj.metadata.get("env_spec")), self.envs[0])

    def _make_rollout_backend(self) -> RolloutBackend:
        """The rollout policy at the rollout temperature with this rank's seed. Other samplers (validation)
        are `policy.with_sampling(...)` views of it: for vLLM the one engine, never a second one. vLLM runs
        in sleep mode: it frees its KV cache and weights while the trainer runs its passes."""
        from agentgym_opsd.models.backends import make_policy_backend

        r = self.cfg.rollout
        seed = self.rank_seed(self.cfg.trainer.seed)
        if r.backend == "hf":
            return make_policy_backend("hf", model=self.trained.model, tokenizer=self.trained.tokenizer,
                                       max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                                       batch_size=r.batch_size, seed=seed)
        from agentgym_opsd.models.vllm_policy import save_for_engine

        folder = self.out / "vllm_init_model"
        dtype = self.cfg.model.dtype  # the engine's (`dtype` below)
        save_for_engine(self.trained.model, self.trained.tokenizer, folder, write=self.is_main,
                        dtype=torch_dtype_of(dtype) if dtype != "auto" else None)
        dist.barrier()  # every rank's engine reads rank 0's files
        return make_policy_backend(
            "vllm", model_path=str(folder), tokenizer=self.trained.tokenizer, max_new_tokens=r.max_new_tokens,
            temperature=r.temperature, top_p=r.top_p, seed=seed, dtype=self.cfg.model.dtype,
            gpu_memory_utilization=r.vllm_gpu_memory_utilization, max_model_len=self.engine_max_model_len(),
            kv_cache_gib=r.vllm_kv_cache_gib, enable_sleep_mode=True,
            llm_kwargs={"enforce_eager": True} if r.vllm_enforce_eager else None)

    def engine_max_model_len(self) -> int:
        """`rollout.vllm_max_model_len`, at most the model's own context (`max_position_embeddings`): vLLM refuses a
        longer one, and a model with a short context (the tiny test models) would not start an engine at all."""
        own = getattr(self.trained.model.config, "max_position_embeddings", None)
        wanted = self.cfg.rollout.vllm_max_model_len
        return min(wanted, int(own)) if isinstance(own, int) and own > 0 else wanted

    def sampler_at(self, temperature: float, seed: int) -> RolloutBackend:
        """Validation's sampler: a view of the rollout policy that generates for up to `trainer.eval_batch_episodes`
        prompts at once (never fewer than `rollout.batch_size`), so the turns of the episodes validation plays
        side by side are one batch: a decode step streams the weights once for all of them."""
        rows = max(self.cfg.rollout.batch_size, self.cfg.trainer.eval_batch_episodes)
        return self.policy.with_sampling(temperature=temperature, seed=seed, batch_size=rows)

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """Around every generation phase: the rollout backend woken and, when the trainer's weights changed
        since it last saw them, synced (every rank, in step: gathering ZeRO-3 shards is collective), put back
        to sleep afterwards; the HF backend generates with the trainer model, under ZeRO-3 with its weights
        gathered for the phase."""
        self.policy.wake_up()
        if self.weights_dirty:
            self.policy.sync_weights(self.trained.model)
        self.weights_dirty = False
        hf = self.cfg.rollout.backend == "hf"
        with self.trained.engine.full_weights() if hf else contextlib.nullcontext():
            try:
                yield
            finally:
                self.policy.sleep()

    # ---- persistence ----------------------------------------------------------------------------------------
    def save(self, *, step: int, task_cursor: int, warm_start_done: bool) -> Path:
        """An atomic, collective checkpoint of the run at `step` (`trainer/checkpoint.py`); the oldest pruned once
        the newest verify. Weights that are not all finite are never saved: `NonFiniteError` on every rank."""
        trainable = [(n, p) for n, p in self.trained.model.named_parameters() if p.requires_grad]
        bad = nonfinite_weights(trainable)
        if self.world > 1 and dist.all_reduce([float(len(bad))], op="max")[0] and not bad:  # ZeRO-3: rank shards
            raise NonFiniteError(f"step {step}: another rank holds non-finite trained weights; no checkpoint written")
        require_finite_weights(trainable, f"step {step}: the trained weights (no checkpoint written)")
        sampler = self.policy.get_rng_state()
        ds_zero = isinstance(self.trained.engine, DeepSpeedEngineAdapter) and self.trained.engine.zero_stage > 0
        rng = ckpt.capture_rng(sampler)
        rank_rng = dist.all_gather_objects(rng) if self.world > 1 else None  # each rank resumes its own streams
        state = ckpt.TrainerState(step=step, task_cursor=task_cursor, warm_start_done=warm_start_done,
                                  engine={} if ds_zero else self.trained.engine.state_dict(),
                                  rng=rng, extra={"config": asdict(self.cfg)}, world_size=self.world,
                                  rank_rng=rank_rng)
        extra = (lambda d: self.trained.engine.save_deepspeed_checkpoint(str(d / "deepspeed"))) if ds_zero else None
        path = ckpt.save_checkpoint(self.ckpt_dir, state, save_model=functools.partial(self._save_model, step=step),
                                    config_yaml=self.cfg.to_yaml(), save_extra=extra, ranks=dist.checkpoint_ranks())
        if self.is_main:
            ckpt.prune_checkpoints(self.ckpt_dir, self.cfg.trainer.keep_checkpoints)
            self.output.record_written(ckpt.is_run_entry)  # what the run's writers added since
        dist.barrier()
        return path

    def _save_model(self, folder: Path, *, step: int) -> None:
        """The weights, and beside them a model card and the sampling settings (`trainer/model_card.py`)."""
        self.trained.save(folder)
        if self.is_main:
            write_model_card(folder, self.cfg, step=step, metrics_path=self.out / "metrics.jsonl",
                             tokenizer=self.trained.tokenizer)

    def save_step_files(self, trajs: list[Trajectory], record: StepRecord, *, step: int) -> None:
        """`trajectories/step_N.jsonl` (every rank's) and `credit/step_N.jsonl` beside it: per turn e_k, B_k,
        ΔB_k, w_k, Ã_k (and GiGPO's step numbers, per-token gaps for a token-level estimator), one line per
        trajectory, joined by traj_id/turn. Collective: every rank takes part, also one without rows."""
        union = [t for part in dist.all_gather_objects(trajs) for t in part]
        if self.is_main:
            save_jsonl(union, self.out / "trajectories" / f"step_{step:06d}.jsonl")
        lines: list[dict[str, Any]] = []
        if record.credit.result is not None:  # None: this rank had no rows
            token_text = None
            if record.credit.result.granularity == "token":
                token_text = [self.trained.tokenizer.batch_decode([[t] for t in r.response_ids]) for r in record.batch.rows]
            lines = credit_lines(trajs, record, estimator=self.cfg.algorithm.estimator, step=step,
                                 token_text=token_text, env_ids=[self.env_of(t).spec for t in trajs])
        lines = [line for part in dist.all_gather_objects(lines) for line in part]
        if self.is_main and lines:
            write_jsonl_atomic(lines, self.out / "credit" / f"step_{step:06d}.jsonl")

    def log(self, metrics: dict[str, Any], *, step: int) -> None:
        if self.metrics_log is not None:  # rank 0; the metrics are reduced over the ranks already
            self.metrics_log.write(metrics, step=step)

    def close(self) -> None:
        for env in self.envs:
            env.runner.close()
        self.validation.close()
        if self.metrics_log is not None:
            self.metrics_log.close()
        if self.is_main:
            self.output.record_written(ckpt.is_run_entry)
