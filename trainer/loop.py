"""The AgentOPSD training loop: collect → score → teacher evidence → advantages → update → log.

`Trainer(cfg).train()` runs the whole job: an optional supervised warm start on oracle demonstrations,
then `trainer.total_steps` RL steps. One RL step (`Trainer.step`):

1. collect   B tasks × G rollouts through the `EnvPool` with the current weights (batched generation);
2. score     turn rows (`build_turn_batch`): rewards, group success rates, prompt / teacher prompt ids;
3. logprobs  student (old) log-probs recomputed by the trainer model, reference log-probs when KL is on,
             teacher log-probs of the same responses under the prompt with `c+` (no grad; rows without
             skill text are skipped, their evidence is exactly 0);
4. credit    A_seq = GRPO over each group, then the configured estimator reshapes it per turn (or token);
5. update    clipped (and dual-clipped) policy loss + k3 KL − entropy bonus, token-mean per PPO mini-batch:
             the rows are shuffled and cut into `ppo_mini_batch_rows`, one optimiser step each, for
             `ppo_epochs` passes, π_old fixed for the whole step; micro-batched inside for memory;
6. log       metrics.jsonl, TensorBoard, trajectories, periodic validation and atomic checkpoints.

Data parallel (several processes under torchrun or the `deepspeed` launcher): rank r of W collects tasks
`cursor + r·B/W .. cursor + (r+1)·B/W − 1` of the step's B (all G copies of a task on one rank, so GRPO
groups and the credit, which are per group and per trajectory, are computed locally and equal what one
process would compute on the union), with its own sampling seed. The update's loss is the token mean over
the whole step on all ranks: each rank divides its token sums by the global token count of the mini-batch
and multiplies by W (DeepSpeed averages gradients over the ranks), and all ranks run the same number of
micro-batches (padding with zero-weight ones) so ZeRO's collectives line up. Metrics are reduced across
ranks; rank 0 alone writes metrics, TensorBoard, trajectories (the union, each trajectory's
`metadata["rank"]` saying who collected it), credit files and the config; checkpoints are collective.
The warm start and validation run identically on every rank (no speed-up, no divergence).

Old log-probs: the rollout's sampling log-probs are kept in the trajectories, but the ratio uses the
trainer's recomputation (identical up to float noise for the HF backend; for vLLM the two differ and the
recomputed ones are the consistent reference for the trainer's own forward pass).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import random
import resource
import shutil
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from agentgym_opsd.envpool import EVAL_SEED, TaskSpec
from agentgym_opsd.files import cache_dir, remove_dead_tmp_dirs
from agentgym_opsd.prompts import PromptRenderer
from agentgym_opsd.records import Trajectory, save_jsonl
from agentgym_opsd.registry import env_profile, parse_env_spec
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer import checkpoint as ckpt
from agentgym_opsd.trainer import engine as dist
from agentgym_opsd.trainer.advantages import batch_advantages
from agentgym_opsd.trainer.config import Config, ConfigError
from agentgym_opsd.trainer.dynamic_sampling import collect_informative, group_diversity
from agentgym_opsd.trainer.engine import DeepSpeedEngineAdapter, make_engine
from agentgym_opsd.trainer.logprobs import (
    batched_response_logprobs,
    bucket_micro_batches,
    collate,
    prefix_shared_response_logprobs,
    response_logprobs,
)
from agentgym_opsd.trainer.losses import policy_objective
from agentgym_opsd.trainer.turn_batch import (
    CreditRecord,
    TurnBatch,
    build_turn_batch,
    credit_lines,
    write_jsonl_atomic,
)
from agentgym_opsd.trainer.warm_start import (
    action_exact_match,
    collect_demonstrations,
    demonstration_rows,
    sft_schedule,
    sft_step,
    warm_start_key,
)

__all__ = ["Trainer", "seed_everything", "METRIC_KEYS", "train_task_specs"]

log = logging.getLogger(__name__)

METRIC_KEYS = (
    "step", "success_rate", "reward_mean", "turns_mean", "invalid_action_rate", "loss", "kl", "entropy",
    "clip_fraction", "approx_kl", "grad_norm", "optimizer_steps", "invalid/no_tag", "invalid/not_admissible",
    "invalid/truncated", "evidence_mean", "evidence_std", "advantage_mean", "seconds_rollout", "seconds_teacher",
    "seconds_update",
)
"""Plain keys every metrics.jsonl line has (namespaced duplicates and extras come beside them)."""

TRAIN_SEED_LIMIT = EVAL_SEED  # training seeds stay below this; evaluation uses seeds from it on


def seed_everything(seed: int) -> None:
    """The one seeding function: python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def train_task_specs(cursor: int, count: int, *, num_tasks: int | None, seed: int) -> list[TaskSpec]:
    """Tasks `cursor .. cursor+count-1` of the training stream: a seeded permutation of the task indices,
    cycled; reset seeds stay below 10_000 (disjoint from evaluation)."""
    specs = []
    order = np.random.default_rng(seed).permutation(num_tasks) if num_tasks else None
    for j in range(cursor, cursor + count):
        options = {"task_index": int(order[j % num_tasks])} if order is not None and num_tasks else {}
        specs.append(TaskSpec(j % TRAIN_SEED_LIMIT, options))
    return specs


def _pad_left(rows: list[Tensor], width: int) -> Tensor:
    """(rows, width) right-aligned copy of 1-D tensors (zeros on the left), matching `collate`."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for r, t in enumerate(rows):
        if t.numel():
            out[r, width - t.numel():] = t
    return out


class Trainer:
    """Owns the model, the engine, the rollout runner and the output directory of one run."""

    def __init__(self, cfg: Config, *, resume: str | None = None) -> None:
        self.cfg = cfg
        self.out = Path(cfg.trainer.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir = self.out / "checkpoints"
        self.device = torch.device("cuda" if cfg.trainer.device == "auto" and torch.cuda.is_available()
                                   else ("cpu" if cfg.trainer.device == "auto" else cfg.trainer.device))
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

        self.model, self.tokenizer = self._load_model(resume_from)
        self.model.to(self.device)
        self.engine = make_engine(self.model, cfg.optim, cfg.deepspeed, backend=cfg.trainer.backend)
        self.model = self.engine.module
        if self.rank:  # ranks share the weights (seeded alike above), not their random streams
            seed_everything(self._rank_seed(cfg.trainer.seed))
        self.profile = env_profile(parse_env_spec(cfg.env.id)[0])
        self.invalid_penalty = (cfg.env.invalid_action_penalty if cfg.env.invalid_action_penalty >= 0
                                else self.profile.invalid_action_penalty)
        self.runner = self._make_runner(cfg.env.id, self.tasks_per_rank * cfg.rollout.group_size)
        self.env_num_tasks = self._num_tasks(self.runner)
        self.num_tasks = cfg.env.num_train_tasks or self.env_num_tasks
        self.policy: Any = None
        self.policy = self._make_policy(cfg.rollout.temperature, self._rank_seed(cfg.trainer.seed))
        self.reference: torch.nn.Module | None = None
        self._weights_dirty = False  # the trainer's weights changed since the vLLM engine last got them
        self._val_runner: RolloutRunner | None = None
        self._writer: Any = None
        self._credit_record: CreditRecord | None = None  # this step's credit numbers, until saved
        if self.state is not None:
            self._restore(resume_from)
        elif self.is_main:
            self._set_aside_old_metrics()
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

    def _make_runner(self, env_spec: str, num_envs: int) -> RolloutRunner:
        cfg = self.cfg.env
        history = cfg.history_turns if cfg.history_turns >= 0 else self.profile.history_turns
        template = Path(cfg.prompt_template).read_text(encoding="utf-8") if cfg.prompt_template else None
        renderer = PromptRenderer(self.profile.system_prompt, history_turns=history, max_chars=cfg.max_prompt_chars,
                                  user_template=template)
        kwargs = dict(cfg.kwargs)
        if cfg.max_turns > 0:
            kwargs["max_turns"] = cfg.max_turns
        teacher = self.cfg.teacher
        return RolloutRunner(env_spec, num_envs=num_envs, env_kwargs=kwargs, renderer=renderer,
                             use_skills=cfg.use_skills, step_timeout_s=cfg.step_timeout_s,
                             hint_level=teacher.hint_level if teacher.uses_hint else "")

    @staticmethod
    def _num_tasks(runner: RolloutRunner) -> int | None:
        value = getattr(runner.pool.unwrapped(0), "num_tasks", None)
        return int(value) if isinstance(value, int) and value > 0 else None

    def _make_policy(self, temperature: float, seed: int) -> Any:
        """The rollout policy (first call), or a sampler at another temperature/seed over the same weights:
        for vLLM a view of the one engine (never a second engine)."""
        from agentgym_opsd.models.backends import make_policy_backend

        r = self.cfg.rollout
        if r.backend == "hf":
            return make_policy_backend("hf", model=self.model, tokenizer=self.tokenizer,
                                       max_new_tokens=r.max_new_tokens, temperature=temperature, top_p=r.top_p,
                                       batch_size=r.batch_size, seed=seed)
        if self.policy is not None:
            return self.policy.with_sampling(temperature=temperature, seed=seed)
        # Sleep mode: the engine frees its KV cache and weights while the trainer runs its passes.
        return make_policy_backend(
            "vllm", model_path=self._export_for_vllm(), tokenizer=self.tokenizer, max_new_tokens=r.max_new_tokens,
            temperature=temperature, top_p=r.top_p, seed=seed, dtype=self.cfg.model.dtype,
            gpu_memory_utilization=r.vllm_gpu_memory_utilization, max_model_len=r.vllm_max_model_len,
            enable_sleep_mode=True)

    def _export_for_vllm(self) -> str:
        folder = self.out / "vllm_init_model"
        self._save_model(folder)
        dist.barrier()  # every rank's engine reads rank 0's files
        return str(folder)

    @contextlib.contextmanager
    def _generating(self):
        """Around every generation phase: the vLLM engine woken and, when the trainer's weights changed since
        it last saw them, synced (every rank, in step: gathering ZeRO-3 shards is collective), put back to
        sleep afterwards; the HF backend generates with the trainer model, under ZeRO-3 with its weights
        gathered for the phase."""
        if hasattr(self.policy, "wake_up"):
            self.policy.wake_up()
        if self._weights_dirty and hasattr(self.policy, "sync_weights"):
            self.policy.sync_weights(self.model)
        self._weights_dirty = False
        hf = self.cfg.rollout.backend == "hf"
        with self.engine.full_weights() if hf else contextlib.nullcontext():
            try:
                yield
            finally:
                if hasattr(self.policy, "sleep"):
                    self.policy.sleep()

    def _restore(self, folder: Path | None) -> None:
        assert self.state is not None and folder is not None
        if isinstance(self.engine, DeepSpeedEngineAdapter) and self.engine.zero_stage > 0:
            self.engine.load_deepspeed_checkpoint(str(folder / "deepspeed"))
        else:
            self.engine.load_state_dict(self.state.engine)
        rng = self.state.rank_rng[self.rank] if self.state.rank_rng else self.state.rng
        sampler = ckpt.restore_rng(rng)
        if sampler is not None and hasattr(self.policy, "set_rng_state"):
            self.policy.set_rng_state(sampler)
        self._weights_dirty = True  # a vLLM engine was built before DeepSpeed loaded its state
        if self.is_main:
            self._truncate_metrics(self.state.step)

    def _set_aside_old_metrics(self) -> None:
        """A run that starts from step 0 (fresh, or `--resume auto` without a finished checkpoint) begins a
        new metrics.jsonl; the old one is kept beside it, not appended to (steps would read 1, 1, 2, ...)."""
        path = self.out / "metrics.jsonl"
        if path.is_file() and path.stat().st_size:
            os.replace(path, path.with_name(f"metrics.{time.strftime('%Y%m%d-%H%M%S')}.jsonl"))

    def _truncate_metrics(self, step: int) -> None:
        """Drop metric lines of steps after the checkpoint (they will be replayed exactly)."""
        path = self.out / "metrics.jsonl"
        if not path.is_file():
            return
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                if int(json.loads(line).get("step", 0)) <= step:
                    kept.append(line)
            except (json.JSONDecodeError, ValueError):
                continue  # a line cut by the kill
        path.write_text("".join(x + "\n" for x in kept), encoding="utf-8")

    def _encode(self, messages: list[dict[str, str]]) -> list[int]:
        from agentgym_opsd.models.hf_policy import chat_prompt_ids

        return chat_prompt_ids(self.tokenizer, messages)

    # ---- the job ----------------------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """Warm start (once), then RL steps up to `total_steps`; returns this session's metric lines."""
        cfg = self.cfg.trainer
        if not self.warm_start_done:
            self.warm_start()
            self._weights_dirty = True  # the rollout engine must sample from the warm-started weights
        self._setup_reference()
        if cfg.eval_at_start and self.step_done == 0:
            self._log(self.validate(), step=0)
        lines = []
        bar = tqdm(total=cfg.total_steps, initial=self.step_done, desc="train", unit="step",
                   disable=not cfg.progress)
        try:
            while self.step_done < cfg.total_steps:
                metrics = self.step()
                if cfg.eval_every and self.step_done % cfg.eval_every == 0:
                    metrics.update(self.validate())
                self._log(metrics, step=self.step_done)
                lines.append(metrics)
                if (cfg.save_every and self.step_done % cfg.save_every == 0) or self.step_done == cfg.total_steps:
                    self.save()
                bar.update(1)
                bar.set_postfix(success=f"{metrics['success_rate']:.2f}", loss=f"{metrics['loss']:.4f}")
        finally:
            bar.close()
            if self._writer is not None:
                self._writer.flush()
        return lines

    def warm_start(self) -> dict[str, float]:
        """The supervised stage: oracle demonstrations of the training games, epochs of SFT, greedy action
        exact match on held-out demonstration episodes; reused from the cache when nothing that determines
        it changed (`warm_start.cache=auto`)."""
        t0 = time.perf_counter()
        folder = self.out / "warm_start"
        folder.mkdir(parents=True, exist_ok=True)
        cached = self._warm_start_cache_dir()
        # rank 0 decides: another run may fill the shared cache between two ranks' looks
        if dist.broadcast_object(cached is not None and (cached / "summary.json").is_file()):
            assert cached is not None
            self._load_weights(cached / "model")
            summary = json.loads((cached / "summary.json").read_text(encoding="utf-8"))
            summary.update({"warm_start/cache_hit": 1.0, "warm_start/sft_steps_this_run": 0.0,
                            "warm_start/seconds_this_run": time.perf_counter() - t0})
            log.info("warm start: reused %s", cached)
        else:
            summary = self._train_warm_start(cached)
            summary["warm_start/seconds_this_run"] = time.perf_counter() - t0
        self._reset_optimizer_moments()
        self.warm_start_done = True
        if self.is_main:
            (folder / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
        dist.barrier()
        log.info("warm start: %s", summary)
        return summary

    def _warm_start_settings(self) -> dict[str, Any]:
        c = self.cfg
        env = {k: v for k, v in asdict(c.env).items() if k not in ("val_id", "use_skills", "step_timeout_s")}
        # A user template shapes every prompt: its text (not its path) is part of the key. Without one the
        # key leaves the field out, so warm starts cached before the field existed are still found.
        template = env.pop("prompt_template")
        if template:
            env["prompt_template_text"] = Path(template).read_text(encoding="utf-8")
        return {"model": asdict(c.model), "env": env,
                "system_prompt": self.profile.system_prompt,
                # `seed` enters once, as the effective seed, so keys from before the field existed still match
                "warm_start": {k: v for k, v in asdict(c.warm_start).items() if k not in ("cache", "seed")},
                "optim": {k: getattr(c.optim, k) for k in ("betas", "weight_decay", "grad_clip")},
                "env_num_tasks": self.env_num_tasks, "seed": self.warm_start_seed}

    @property
    def warm_start_seed(self) -> int:
        """The seed of the warm start: `warm_start.seed`, or `trainer.seed` when that is -1."""
        ws = self.cfg.warm_start
        return ws.seed if ws.seed >= 0 else self.cfg.trainer.seed

    def _warm_start_cache_dir(self) -> Path | None:
        if self.cfg.warm_start.cache == "off":
            return None
        return cache_dir("warm_start", warm_start_key(self._warm_start_settings()))

    def warm_start_model_dir(self) -> Path | None:
        """Where the warm-started weights of this run are (the run folder, or the shared cache)."""
        summary = self.out / "warm_start" / "summary.json"
        if summary.is_file():
            where = json.loads(summary.read_text(encoding="utf-8")).get("warm_start/model_dir")
            if where and Path(where).is_dir():
                return Path(where)
        local = self.out / "warm_start" / "model"
        return local if local.is_dir() else None

    def _train_warm_start(self, cache_dir: Path | None) -> dict[str, Any]:
        ws, t = self.cfg.warm_start, self.cfg.trainer
        seed = self.warm_start_seed
        t0 = time.perf_counter()
        if ws.episodes == 0 and self.env_num_tasks:
            # one demonstration per training game, in a seeded order (the held-out slice is its tail)
            order = np.random.default_rng(seed + 1).permutation(self.env_num_tasks)
            if ws.exclude_rl_pool and self.cfg.env.num_train_tasks:
                order = order[order >= self.cfg.env.num_train_tasks]
            tasks = [TaskSpec((ws.seed_offset + j) % TRAIN_SEED_LIMIT, {"task_index": int(k)})
                     for j, k in enumerate(order)]
        else:
            tasks = train_task_specs(ws.seed_offset, ws.episodes or 32, num_tasks=self.env_num_tasks, seed=seed + 1)
        demos = collect_demonstrations(self.runner, tasks, thought=ws.thought, batch=self.runner.pool.num_envs)
        heldout = demos[len(demos) - ws.heldout_episodes:] if 0 < ws.heldout_episodes < len(demos) else []
        train_demos = demos[: len(demos) - len(heldout)]
        rows = demonstration_rows(train_demos, self._encode, self.tokenizer)
        if not rows:
            raise RuntimeError(f"the warm start found no won oracle episodes in {len(tasks)} tasks of {self.cfg.env.id}")
        seconds_demos = time.perf_counter() - t0
        rng = np.random.default_rng(seed)
        epochs = ws.epochs if ws.epochs > 0 else ws.steps * ws.batch_rows / len(rows)
        schedule = sft_schedule(len(rows), batch_rows=ws.batch_rows, epochs=epochs, rng=rng)
        if ws.epochs == 0:
            schedule = schedule[: ws.steps]
        self.engine.set_lr(ws.lr)
        losses = []
        for pick in tqdm(schedule, desc="warm start (SFT)", unit="step", disable=not t.progress):
            losses.append(sft_step(self.engine, rows, pick, pad_id=self.tokenizer.pad_token_id,
                                   max_tokens=self.cfg.optim.micro_batch_tokens,
                                   max_rows=self.cfg.optim.micro_batch_rows, device=self.device))
        self.engine.set_lr(self.cfg.optim.lr)
        seconds_sft = time.perf_counter() - t0 - seconds_demos
        exact = math.nan
        if heldout:
            from agentgym_opsd.models.backends import make_policy_backend

            greedy = make_policy_backend("hf", model=self.model, tokenizer=self.tokenizer,
                                         max_new_tokens=self.cfg.rollout.max_new_tokens, temperature=0.0,
                                         batch_size=self.cfg.rollout.batch_size, seed=seed)
            self.model.eval()
            with self.engine.full_weights():
                exact = action_exact_match(greedy, heldout, self.runner.parser)
        target = cache_dir if cache_dir is not None else self.out / "warm_start"
        summary: dict[str, Any] = {
            "warm_start/loss_first": losses[0] if losses else math.nan,
            "warm_start/loss_last": float(np.mean(losses[-10:])) if losses else math.nan,
            "warm_start/demonstrations": float(len(train_demos)), "warm_start/rows": float(len(rows)),
            "warm_start/heldout_episodes": float(len(heldout)), "warm_start/epochs": float(epochs),
            "warm_start/sft_steps": float(len(schedule)), "warm_start/sft_steps_this_run": float(len(schedule)),
            "warm_start/heldout_action_exact_match": exact, "warm_start/seconds_demonstrations": seconds_demos,
            "warm_start/seconds_sft": seconds_sft, "warm_start/seconds": time.perf_counter() - t0,
            "warm_start/cache_hit": 0.0, "warm_start/model_dir": str(target / "model"),
        }
        self._save_atomically(target, summary)
        return summary

    def _save_atomically(self, target: Path, summary: dict[str, Any]) -> None:
        """`target/model` + `target/summary.json`, complete or absent (a shared cache may see two writers).
        Collective: every rank helps gather the weights, rank 0 writes, the others wait for it."""
        if self.is_main:
            remove_dead_tmp_dirs(target)
        # the writer's pid in the name: a later run can tell a dead writer's leftovers from a live one's
        tmp = target.parent / dist.broadcast_object(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        self._save_model(tmp / "model")
        if self.is_main:
            self._publish(tmp, target, summary)
        dist.barrier()

    def _publish(self, tmp: Path, target: Path, summary: dict[str, Any]) -> None:
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
        if target != self.out / "warm_start":  # a shared cache entry: published in one rename
            if (target / "summary.json").is_file():
                shutil.rmtree(tmp)  # another run cached the same warm start first: theirs is as good
                return
            if target.exists():  # half-published by a run killed between two renames (older versions)
                shutil.rmtree(target, ignore_errors=True)
            try:
                os.rename(tmp, target)  # complete or absent: a reader never sees model/ without summary.json
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)  # another writer published between our look and now
            return
        target.mkdir(parents=True, exist_ok=True)
        for item in ("model", "summary.json"):
            if (target / item).is_dir():
                shutil.rmtree(target / item)
            os.replace(tmp / item, target / item)
        shutil.rmtree(tmp, ignore_errors=True)

    def _load_weights(self, folder: Path) -> None:
        """Load saved weights (a full model or a LoRA adapter folder) into the live model, in place, so the
        engine's optimiser keeps its parameters."""
        from safetensors.torch import load_file

        state: dict[str, Tensor] = {}
        for f in sorted(folder.glob("*.safetensors")):
            state.update(load_file(str(f)))
        if not state:
            raise ckpt.CheckpointError(f"{folder}: no safetensors weights to load")
        if self.cfg.model.lora:
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.model, state)
            unexpected = list(getattr(result, "unexpected_keys", []) or [])
            refresh = getattr(getattr(self.engine, "optimizer", None), "refresh_fp32_params", None)
            if callable(refresh):  # ZeRO / bf16 keep an fp32 master copy the next step would write back
                refresh()
        else:
            result = self.engine.load_full_state_dict(state)
            tied = {k for k in result.missing_keys if "lm_head" in k}
            missing = [k for k in result.missing_keys if k not in tied]
            if missing:
                raise ckpt.CheckpointError(f"{folder}: weights missing for {missing[:5]}")
            unexpected = list(result.unexpected_keys)
        if unexpected:
            raise ckpt.CheckpointError(f"{folder}: unexpected weights {unexpected[:5]}")

    def _reset_optimizer_moments(self) -> None:
        self.engine.reset_optimizer_state()  # RL starts with fresh AdamW moments (the SFT ones have another scale)

    def _setup_reference(self) -> None:
        """The frozen reference for the KL term: the policy at RL start (after any warm start). With LoRA it
        is a second, frozen adapter holding the warm-started adapter (the base model alone, without any
        adapter, when there was no warm start); otherwise a frozen copy of the model."""
        if self.cfg.algorithm.kl_coef <= 0:
            return
        source = self.warm_start_model_dir()
        if self.cfg.model.lora:
            if source is not None and "reference" not in self.model.peft_config:
                with self._keep_requires_grad():
                    self.model.load_adapter(str(source), adapter_name="reference", is_trainable=False)
                    self.model.set_adapter("default")
            return
        from agentgym_opsd.models.loading import load_policy_model

        self.reference, _ = load_policy_model(str(source or self.cfg.model.name_or_path), dtype=self.cfg.model.dtype,
                                              trainable=False)
        self.reference.to(self.device)

    @contextlib.contextmanager
    def _keep_requires_grad(self):
        """PEFT's set_adapter marks the active adapter trainable everywhere; keep our frozen layers frozen."""
        flags = [(p, p.requires_grad) for p in self.model.parameters()]
        try:
            yield
        finally:
            for p, flag in flags:
                p.requires_grad_(flag)

    @contextlib.contextmanager
    def _reference_adapter(self):
        with self._keep_requires_grad():
            self.model.set_adapter("reference")
            try:
                yield
            finally:
                self.model.set_adapter("default")

    # ---- one RL step ------------------------------------------------------------------------------------
    def collect_step(self) -> tuple[list[Trajectory], dict[str, float]]:
        """This rank's trajectories of one step and the sampling metrics. Without dynamic sampling: B / ranks
        whole groups, numbered as in a one-process run. With it: rounds of B tasks until this rank holds
        B / ranks groups with mixed outcomes or `rollout.max_sampling_rounds` rounds were played (every rank
        plays the same number of rounds)."""
        r = self.cfg.rollout
        if not r.dynamic_sampling:
            trajs = self.collect()
            return trajs, {f"rollout/{k}": v for k, v in group_diversity(trajs).items()}
        seen: list[Trajectory] = []

        def play(_: int) -> list[Trajectory]:
            seen.extend(trajs := self.collect())
            return trajs

        def keep_going(kept: int) -> bool:  # collective: ZeRO-3 generation gathers weights on every rank
            return any(k < self.tasks_per_rank for k in dist.all_gather_objects(kept))

        trajs, report = collect_informative(play, want_groups=self.tasks_per_rank, max_rounds=r.max_sampling_rounds,
                                            keep_going=keep_going)
        return trajs, {**report.metrics(), **{f"rollout/{k}": v for k, v in group_diversity(seen).items()}}

    def collect(self) -> list[Trajectory]:
        """One round: the next B tasks of the training stream (this rank's B / ranks whole groups, numbered
        as in a one-process run), G rollouts each."""
        r = self.cfg.rollout
        first = self.task_cursor + self.rank * self.tasks_per_rank
        tasks = train_task_specs(first, self.tasks_per_rank, num_tasks=self.num_tasks, seed=self.cfg.trainer.seed)
        self.model.eval()
        with self._generating():
            trajs = self.runner.run(self.policy, tasks, group_size=r.group_size, first_group_id=first,
                                    first_traj_id=first * r.group_size)
        for traj in trajs:
            traj.metadata["rank"] = self.rank
        self.task_cursor += r.tasks_per_step
        return trajs

    def step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        trajs, sampling = self.collect_step()
        seconds_rollout = time.perf_counter() - t0
        metrics = self.step_on(trajs)
        metrics.update(sampling)
        metrics["seconds_rollout"] = seconds_rollout
        self.step_done += 1
        metrics["step"] = self.step_done
        if self.cfg.trainer.save_trajectories:
            union = [t for part in dist.all_gather_objects(trajs) for t in part]
            if self.is_main:
                save_jsonl(union, self.out / "trajectories" / f"step_{self.step_done:06d}.jsonl")
            self._save_credit(trajs)
        self._weights_dirty = True  # vLLM gets the updated weights before it next generates
        return metrics

    def score(self, trajs: list[Trajectory]) -> TurnBatch:
        a = self.cfg.algorithm
        return build_turn_batch(trajs, encode_prompt=self._encode,
                                teacher_messages=functools.partial(self.runner.teacher_messages,
                                                                   context=self.cfg.teacher.context)
                                if a.needs_teacher else None,
                                reward_scale=self.cfg.env.reward_scale, invalid_penalty=self.invalid_penalty,
                                success_source=a.success_source, penalty_mode=a.penalty_mode, penalize=a.penalize)

    def _logprobs(self, model: torch.nn.Module, prompts: list[list[int]], responses: list[list[int]]) -> list[Tensor]:
        o = self.cfg.optim
        return batched_response_logprobs(model, prompts, responses, pad_id=self.tokenizer.pad_token_id,
                                         temperature=self.cfg.rollout.temperature, max_tokens=o.micro_batch_tokens,
                                         max_rows=o.micro_batch_rows, device=self.device)

    def step_on(self, trajs: list[Trajectory]) -> dict[str, Any]:
        """Score, evidence, advantages and one update on given trajectories (also used by benchmarks)."""
        a = self.cfg.algorithm
        batch = self.score(trajs)
        rows = batch.rows
        prompts = [r.prompt_ids for r in rows]
        responses = [r.response_ids for r in rows]

        t0 = time.perf_counter()
        with self.engine.full_weights():  # ZeRO-3: these passes differ in length by rank
            old = self._old_logprobs(rows, prompts, responses)
            ref = self._reference_logprobs(prompts, responses)
            seconds_logprobs = time.perf_counter() - t0

            t0 = time.perf_counter()
            # GRPO reads no evidence: the teacher is the student itself, so every gap (and e_k) is exactly 0.
            teacher = self.teacher_logprobs(batch, old) if a.needs_teacher else list(old)
            seconds_teacher = time.perf_counter() - t0
        gaps = [t - s for t, s in zip(teacher, old, strict=True)]  # per-token evidence (0 without c+)
        evidence = torch.tensor([float(g.sum()) for g in gaps], dtype=torch.float64)

        advantages, seq_adv = self.advantages(batch, evidence, gaps)

        t0 = time.perf_counter()
        update = self.update(batch, old, ref, advantages)
        seconds_update = time.perf_counter() - t0

        tok_adv = torch.cat([a_.flatten() for a_ in advantages]) if advantages else torch.zeros(0)
        metrics: dict[str, Any] = {
            **batch.stats,
            **update,
            "evidence_mean": float(evidence.mean()) if len(evidence) else 0.0,
            "evidence_std": float(evidence.std(unbiased=False)) if len(evidence) else 0.0,
            "advantage_mean": float(tok_adv.mean()) if tok_adv.numel() else 0.0,
            "advantage_abs_mean": float(tok_adv.abs().mean()) if tok_adv.numel() else 0.0,
            "seq_advantage_std": float(seq_adv.std(unbiased=False)) if seq_adv.numel() else 0.0,
            "teacher_rows": float(sum(r.teacher_prompt_ids is not None for r in rows)),
            "lam": self.current_lam(),
            "response_tokens": float(batch.num_response_tokens),
            "sample_logprob_gap": self._sampling_gap(rows, old),
            "seconds_teacher": seconds_teacher,
            "seconds_logprobs": seconds_logprobs,
            "seconds_update": seconds_update,
            "memory/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        }
        if self.world > 1:
            metrics = self._reduce_metrics(metrics, trajs, evidence, tok_adv, seq_adv)
        # one key style for every phase: `<phase>/<env spec>/<metric>`, as validation writes `val/<spec>/...`
        metrics[f"train/{self.cfg.env.id}/success_rate"] = metrics["success_rate"]
        return metrics

    def _reduce_metrics(self, metrics: dict[str, Any], trajs: list[Trajectory], evidence: Tensor, tok_adv: Tensor,
                        seq_adv: Tensor) -> dict[str, Any]:
        """This rank's step metrics -> the whole step's: each mean weighted by what it averages over (episodes,
        turns, rows, tokens), counts summed, stds from sums of squares, timings and memory the maximum;
        the update's numbers (loss, kl, grad_norm, ...) are global already. One all-reduce for the sums, one for the maxima."""
        per = {"traj": float(len(trajs)), "turn": float(sum(t.num_turns for t in trajs)),
               "row": float(len(evidence)), "token": float(tok_adv.numel())}
        by_turn = {"invalid_action_rate"} | {k for k in metrics if k.startswith("invalid/")}
        by_traj = {"success_rate", "reward_mean", "turns_mean", "score_mean"}
        summed = {"env_errors", "num_rows", "teacher_rows", "response_tokens"}
        biggest = {k for k in metrics if k.startswith(("seconds_", "memory/"))}
        weighted = [k for k in metrics if k in by_turn | by_traj and isinstance(metrics[k], (int, float))]
        gap = metrics.get("sample_logprob_gap", math.nan)
        gap_rows = per["row"] if math.isfinite(gap) else 0.0
        e, q = evidence.double(), seq_adv.double()
        vector = ([per["traj"], per["turn"], per["row"], per["token"], float(len(q)), gap_rows,
                   gap * gap_rows if gap_rows else 0.0, float(e.sum()), float((e * e).sum()),
                   float(tok_adv.double().sum()), float(tok_adv.double().abs().sum()), float(q.sum()),
                   float((q * q).sum())]
                  + [float(metrics[k]) * (per["turn"] if k in by_turn else per["traj"]) for k in weighted]
                  + [float(metrics.get(k, 0.0)) for k in sorted(summed)])
        total = dist.all_reduce(vector)
        n_traj, n_turn, n_row, n_tok, n_seq, n_gap, gap_sum, e1, e2, a1, a_abs, q1, q2 = total[:13]
        out = dict(metrics)
        for k, v in zip(weighted, total[13:13 + len(weighted)], strict=True):
            out[k] = v / max(n_turn if k in by_turn else n_traj, 1.0)
        for k, v in zip(sorted(summed), total[13 + len(weighted):], strict=True):
            if k in metrics:
                out[k] = v
        mean_e = e1 / n_row if n_row else 0.0
        out["evidence_mean"] = mean_e
        out["evidence_std"] = math.sqrt(max(e2 / n_row - mean_e ** 2, 0.0)) if n_row else 0.0
        out["advantage_mean"] = a1 / n_tok if n_tok else 0.0
        out["advantage_abs_mean"] = a_abs / n_tok if n_tok else 0.0
        mean_q = q1 / n_seq if n_seq else 0.0
        out["seq_advantage_std"] = math.sqrt(max(q2 / n_seq - mean_q ** 2, 0.0)) if n_seq else 0.0
        out["sample_logprob_gap"] = gap_sum / n_gap if n_gap else math.nan
        keys = sorted(biggest)
        for k, v in zip(keys, dist.all_reduce([float(metrics[k]) for k in keys], op="max"), strict=True):
            out[k] = v
        out["ranks"] = float(self.world)
        return out

    def _old_logprobs(self, rows: list[Any], prompts: list[list[int]], responses: list[list[int]]) -> list[Tensor]:
        """π_old of every response token: the sampler's own numbers when they are trustworthy (HF backend,
        `recompute_old_logprobs=False`), else a teacher-forced pass of the trainer model."""
        reuse = (not self.cfg.algorithm.recompute_old_logprobs and self.cfg.rollout.backend == "hf"
                 and all(len(r.sample_logprobs) == len(r.response_ids) for r in rows))
        if reuse:
            return [torch.tensor(r.sample_logprobs, dtype=torch.float32) for r in rows]
        return self._logprobs(self.model, prompts, responses)

    def _reference_logprobs(self, prompts: list[list[int]], responses: list[list[int]]) -> list[Tensor] | None:
        if self.cfg.algorithm.kl_coef <= 0:
            return None
        if self.cfg.model.lora:
            if "reference" not in self.model.peft_config:
                self._setup_reference()
            if "reference" in self.model.peft_config:
                with self._reference_adapter():
                    return self._logprobs(self.model, prompts, responses)
            with self.model.disable_adapter():  # no warm start: the base model is where RL started
                return self._logprobs(self.model, prompts, responses)
        if self.reference is None:
            self._setup_reference()
        assert self.reference is not None
        return self._logprobs(self.reference, prompts, responses)

    def teacher_logprobs(self, batch: TurnBatch, student: list[Tensor]) -> list[Tensor]:
        """Teacher-forced log-probs under the c+ prompt; rows without c+ reuse the student's (gap 0)."""
        idx = [i for i, r in enumerate(batch.rows) if r.teacher_prompt_ids is not None]
        out = list(student)
        if idx:
            prompts = [batch.rows[i].teacher_prompt_ids for i in idx]
            responses = [batch.rows[i].response_ids for i in idx]
            if self.cfg.optim.teacher_prefix_cache:
                o = self.cfg.optim
                got = prefix_shared_response_logprobs(
                    self.model, prompts, responses, pad_id=self.tokenizer.pad_token_id,  # type: ignore[arg-type]
                    temperature=self.cfg.rollout.temperature, max_tokens=o.micro_batch_tokens,
                    max_rows=o.micro_batch_rows, device=self.device)
            else:
                got = self._logprobs(self.model, prompts, responses)  # type: ignore[arg-type]
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

    def advantages(self, batch: TurnBatch, evidence: Tensor, gaps: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """Per-row token advantages (1-D, one per response token) and the per-trajectory A_seq
        (`trainer/advantages.py`: the penalty mode's bookkeeping, the estimator, the row penalty term)."""
        a = self.cfg.algorithm
        out = batch_advantages(batch, evidence, gaps, estimator=a.estimator, config=a.credit_config(self.current_lam()),
                               cross_steps=a.grpo_cross_steps, normalize_std=a.normalize_std,
                               return_details=self.cfg.trainer.save_trajectories)
        if self.cfg.trainer.save_trajectories and out.result is not None:  # for the step's credit file
            self._credit_record = CreditRecord(batch, evidence, gaps, out.seq, out.tokens, out.result)
        return out.tokens, out.seq

    def _save_credit(self, trajs: list[Trajectory]) -> None:
        """`credit/step_N.jsonl` beside the trajectories: per turn e_k, B_k, ΔB_k, w_k, Ã_k (and GiGPO's step
        numbers, per-token gaps for a token-level estimator), one line per trajectory, joined by traj_id/turn."""
        record, self._credit_record = self._credit_record, None
        lines: list[dict[str, Any]] = []
        if record is not None:
            token_text = None
            if record.result.granularity == "token":
                token_text = [self.tokenizer.batch_decode([[t] for t in r.response_ids]) for r in record.batch.rows]
            lines = credit_lines(trajs, record, estimator=self.cfg.algorithm.estimator, step=self.step_done,
                                 token_text=token_text)
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

    def update(self, batch: TurnBatch, old: list[Tensor], ref: list[Tensor] | None,
               advantages: list[Tensor]) -> dict[str, float]:
        """PPO: one optimiser step per mini-batch (`mini_batches`), token-mean objective inside each,
        micro-batched by length; π_old stays the rollout policy for every mini-batch of the step."""
        a, o = self.cfg.algorithm, self.cfg.optim
        rows = batch.rows
        keys = ("loss", "policy_loss", "kl", "entropy", "clip_fraction", "approx_kl", "grad_norm", "optimizer_steps")
        global_rows = int(dist.all_reduce([len(rows)])[0])
        if not global_rows:
            return dict.fromkeys(keys, 0.0)
        prompts = [r.prompt_ids for r in rows]
        responses = [r.response_ids for r in rows]
        lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
        sums = dict.fromkeys(("policy", "kl", "entropy", "clipped", "approx_kl", "tokens"), 0.0)
        losses, grad_norms = [], []
        self.model.train()
        plan = self.mini_batches(len(rows), global_rows)
        micro = [bucket_micro_batches([lengths[i] for i in chosen], max_tokens=o.micro_batch_tokens,
                                      max_rows=o.micro_batch_rows) if chosen else [] for chosen in plan]
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
                mb = collate(idx, prompts, responses, self.tokenizer.pad_token_id).to(self.device)
                width = mb.response_ids.shape[1]
                logp, entropy = response_logprobs(self.model, mb, temperature=self.cfg.rollout.temperature,
                                                  with_entropy=True)
                terms = policy_objective(
                    logp, _pad_left([old[i] for i in idx], width).to(self.device),
                    _pad_left([advantages[i] for i in idx], width).to(self.device), mb.response_mask,
                    entropy=entropy, ref_logp=_pad_left([ref[i] for i in idx], width).to(self.device) if ref else None,
                    clip_low=a.clip_low, clip_high=a.clip_high, clip_ratio_c=a.clip_ratio_c, kl_coef=a.kl_coef,
                    entropy_coef=a.entropy_coef, num_tokens=int(num_tokens))
                self.engine.backward(terms.loss * self.world if self.world > 1 else terms.loss,
                                     is_last=k == n_micro - 1)
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
                "optimizer_steps": float(len(grad_norms))}

    def _idle_loss(self) -> Tensor:
        """A zero loss through the whole model (one pad token): a rank without rows in a micro-batch still
        runs the forward/backward its ZeRO collectives expect, and adds nothing to the gradient."""
        pad = self.tokenizer.pad_token_id
        mb = collate([0], [[pad]], [[pad]], pad).to(self.device)
        logp, _ = response_logprobs(self.model, mb, temperature=self.cfg.rollout.temperature)
        return logp.sum() * 0.0

    @staticmethod
    def _sampling_gap(rows: list[Any], recomputed: list[Tensor]) -> float:
        """Mean |sampling − recomputed| log-prob (≈0 for the HF backend; a health check for vLLM)."""
        diffs = [(torch.tensor(r.sample_logprobs) - t).abs().mean() for r, t in zip(rows, recomputed, strict=True)
                 if len(r.sample_logprobs) == t.numel() and t.numel()]
        return float(torch.stack(diffs).mean()) if diffs else math.nan

    # ---- validation, logging, checkpoints -----------------------------------------------------------------
    def val_env_spec(self) -> str:
        if self.cfg.env.val_id:
            return self.cfg.env.val_id
        base, split = parse_env_spec(self.cfg.env.id)
        if "valid_seen" in self.profile.splits and split not in (None, "valid_seen"):
            return f"{base.partition('/')[2]}:valid_seen"
        return self.cfg.env.id

    def validate(self) -> dict[str, float]:
        """Held-out episodes (seeds >= 10_000) at the validation temperature, through the evaluation suite."""
        from agentgym_opsd.evaluation.runner import evaluate_policy

        t = self.cfg.trainer
        spec = self.val_env_spec()
        num_envs = min(t.eval_episodes, self.runner.pool.num_envs)
        if self._val_runner is None:
            self._val_runner = self._make_runner(spec, num_envs)
        policy = self._make_policy(t.eval_temperature, seed=TRAIN_SEED_LIMIT + self.step_done)
        self.model.eval()
        t0 = time.perf_counter()
        with self._generating():  # every rank plays the same episodes with the same seeds (same numbers)
            summary = evaluate_policy(policy, spec, episodes=t.eval_episodes, num_envs=num_envs,
                                      runner=self._val_runner)
        out = {"val/success_rate": summary.success_rate, "val/episodes": float(summary.episodes),
               "val/score": summary.score_mean,
               "val/turns_mean": summary.turns_mean, "val/invalid_action_rate": summary.invalid_action_rate,
               "seconds_validation": time.perf_counter() - t0}
        out.update(summary.metrics("val"))
        if t.eval_pool_rollouts and self.cfg.env.num_train_tasks:
            out.update(self.pool_success())
        return out

    def pool_success(self) -> dict[str, float]:
        """Sampled success on the fixed training pool (`env.num_train_tasks` games, `eval_pool_rollouts`
        copies each, at the rollout temperature): the direct check that the optimiser improves the policy
        on the games it trains on. Reset seeds sit above the training range, so no training episode repeats."""
        t, r = self.cfg.trainer, self.cfg.rollout
        copies = t.eval_pool_rollouts
        per_call = max(self.runner.pool.num_envs // copies, 1)
        policy = self._make_policy(r.temperature, seed=2 * TRAIN_SEED_LIMIT + self.step_done)
        self.model.eval()
        t0 = time.perf_counter()
        trajs: list[Trajectory] = []
        tasks = [TaskSpec(TRAIN_SEED_LIMIT + i, {"task_index": i}) for i in range(self.cfg.env.num_train_tasks)]
        with self._generating():
            for start in range(0, len(tasks), per_call):  # group ids unique over the calls (group_diversity)
                trajs += self.runner.run(policy, tasks[start:start + per_call], group_size=copies,
                                         first_group_id=start, first_traj_id=start * copies)
        turns = max(sum(x.num_turns for x in trajs), 1)
        return {"pool/success_rate": sum(x.won for x in trajs) / max(len(trajs), 1),
                "pool/invalid_action_rate": sum(x.num_invalid_actions for x in trajs) / turns,
                **group_diversity(trajs, prefix="pool/"),
                "pool/episodes": float(len(trajs)), "seconds_pool": time.perf_counter() - t0}

    def _log(self, metrics: dict[str, Any], *, step: int) -> None:
        if not self.is_main:  # the metrics are reduced over the ranks already
            return
        line = {"step": step, **{k: v for k, v in metrics.items() if k != "step"}}
        with (self.out / "metrics.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
        if self.cfg.trainer.tensorboard:
            if self._writer is None:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(self.out / "tensorboard"), purge_step=step)
            for k, v in line.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self._writer.add_scalar(k, v, step)

    def _save_model(self, folder: Path) -> None:
        """save_pretrained of the full weights; collective (ZeRO-3 gathers them on rank 0), rank 0 writes."""
        state = self.engine.full_state_dict()
        if not self.is_main:
            return
        folder.parent.mkdir(parents=True, exist_ok=True)
        kwargs: dict[str, Any] = {"safe_serialization": True}
        if state is not None:
            kwargs["state_dict"] = state
        if hasattr(self.model, "peft_config"):  # the trained adapter only, never the frozen reference copy
            self.model.save_pretrained(str(folder), selected_adapters=["default"], **kwargs)
        else:
            self.model.save_pretrained(str(folder), **kwargs)
        self.tokenizer.save_pretrained(str(folder))

    def save(self) -> Path:
        sampler = self.policy.get_rng_state() if hasattr(self.policy, "get_rng_state") else None
        ds_zero = isinstance(self.engine, DeepSpeedEngineAdapter) and self.engine.zero_stage > 0
        rng = ckpt.capture_rng(sampler)
        rank_rng = dist.all_gather_objects(rng) if self.world > 1 else None  # each rank resumes its own streams
        state = ckpt.TrainerState(step=self.step_done, task_cursor=self.task_cursor,
                                  warm_start_done=self.warm_start_done,
                                  engine={} if ds_zero else self.engine.state_dict(),
                                  rng=rng, extra={"config": asdict(self.cfg)}, world_size=self.world,
                                  rank_rng=rank_rng)
        extra = (lambda d: self.engine.save_deepspeed_checkpoint(str(d / "deepspeed"))) if ds_zero else None
        ranks = ckpt.Ranks(self.rank, dist.barrier, dist.broadcast_object)
        path = ckpt.save_checkpoint(self.ckpt_dir, state, save_model=self._save_model,
                                    config_yaml=self.cfg.to_yaml(), save_extra=extra, ranks=ranks)
        if self.is_main:
            ckpt.prune_checkpoints(self.ckpt_dir, self.cfg.trainer.keep_checkpoints)
        dist.barrier()
        return path

    def close(self) -> None:
        self.runner.close()
        if self._val_runner is not None:
            self._val_runner.close()
        if self._writer is not None:
            self._writer.close()
