"""The AgentOPSD training loop: collect → score → teacher evidence → advantages → update → log.

`Trainer(cfg).train()` runs the whole job: an optional supervised warm start on oracle demonstrations,
then `trainer.total_steps` RL steps. One RL step (`Trainer.step`):

1. collect   B tasks × G rollouts through the `EnvPool` with the current weights (batched generation);
2. score     turn rows (`build_turn_batch`): rewards, group success rates, prompt / teacher prompt ids;
3. logprobs  student (old) log-probs recomputed by the trainer model, reference log-probs when KL is on,
             teacher log-probs of the same responses under the prompt with `c+` (no grad; rows without
             skill text are skipped, their evidence is exactly 0);
4. credit    A_seq = GRPO over each group, then the configured estimator reshapes it per turn (or token);
5. update    clipped policy loss + k3 KL − entropy bonus, token-mean, micro-batched, one optimiser step
             per epoch through the engine (DeepSpeed or torch);
6. log       metrics.jsonl, TensorBoard, trajectories, periodic validation and atomic checkpoints.

Old log-probs: the rollout's sampling log-probs are kept in the trajectories, but the ratio uses the
trainer's recomputation (identical up to float noise for the HF backend; for vLLM the two differ and the
recomputed ones are the consistent reference for the trainer's own forward pass).
"""

from __future__ import annotations

import json
import logging
import math
import random
import resource
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from agentgym_opsd import credit
from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.prompts import PromptRenderer
from agentgym_opsd.records import Trajectory, save_jsonl
from agentgym_opsd.registry import env_profile, parse_env_spec
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer import checkpoint as ckpt
from agentgym_opsd.trainer.config import Config
from agentgym_opsd.trainer.engine import DeepSpeedEngineAdapter, make_engine
from agentgym_opsd.trainer.logprobs import (
    batched_response_logprobs,
    bucket_micro_batches,
    collate,
    prefix_shared_response_logprobs,
    response_logprobs,
)
from agentgym_opsd.trainer.losses import policy_objective
from agentgym_opsd.trainer.turn_batch import TurnBatch, build_turn_batch
from agentgym_opsd.trainer.warm_start import collect_demonstrations, demonstration_rows, sft_step

__all__ = ["Trainer", "seed_everything", "METRIC_KEYS", "train_task_specs"]

log = logging.getLogger(__name__)

METRIC_KEYS = (
    "step", "success_rate", "reward_mean", "turns_mean", "invalid_action_rate", "loss", "kl", "entropy",
    "clip_fraction", "evidence_mean", "evidence_std", "advantage_mean", "seconds_rollout", "seconds_teacher",
    "seconds_update",
)
"""Plain keys every metrics.jsonl line has (namespaced duplicates and extras come beside them)."""

TRAIN_SEED_LIMIT = 10_000  # training seeds stay below this; evaluation uses seeds >= 10_000


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
        self.state: ckpt.TrainerState | None = None
        resume_from = self._resume_path(resume)
        if resume_from is not None:
            self.state = ckpt.load_trainer_state(resume_from)
            log.info("resuming from %s (step %d)", resume_from, self.state.step)
        seed_everything(cfg.trainer.seed)
        self.step_done = self.state.step if self.state else 0
        self.task_cursor = self.state.task_cursor if self.state else 0
        self.warm_start_done = self.state.warm_start_done if self.state else cfg.warm_start.steps == 0

        self.model, self.tokenizer = self._load_model(resume_from)
        self.model.to(self.device)
        self.engine = make_engine(self.model, cfg.optim, cfg.deepspeed, backend=cfg.trainer.backend)
        self.model = self.engine.module
        self.profile = env_profile(parse_env_spec(cfg.env.id)[0])
        self.invalid_penalty = (cfg.env.invalid_action_penalty if cfg.env.invalid_action_penalty >= 0
                                else self.profile.invalid_action_penalty)
        self.runner = self._make_runner(cfg.env.id, cfg.rollout.tasks_per_step * cfg.rollout.group_size)
        self.num_tasks = self._num_tasks(self.runner)
        self.policy = self._make_policy(cfg.rollout.temperature, cfg.trainer.seed)
        self.reference: torch.nn.Module | None = None
        self._val_runner: RolloutRunner | None = None
        self._writer: Any = None
        if self.state is not None:
            self._restore(resume_from)
        self.out.joinpath("config.yaml").write_text(cfg.to_yaml(), encoding="utf-8")

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
        from agentgym_opsd.trainer.models import LoraSettings, load_policy_model

        m = self.cfg.model
        if resume_from is not None:
            return load_policy_model(str(resume_from / "model"), dtype=m.dtype, trainable=True)
        lora = LoraSettings(r=m.lora_r, alpha=m.lora_alpha, dropout=m.lora_dropout,
                            target_modules=tuple(m.lora_target_modules)) if m.lora else None
        model, tok = load_policy_model(m.name_or_path, dtype=m.dtype, lora=lora, trainable=True)
        if m.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        return model, tok

    def _make_runner(self, env_spec: str, num_envs: int) -> RolloutRunner:
        cfg = self.cfg.env
        history = cfg.history_turns if cfg.history_turns >= 0 else self.profile.history_turns
        renderer = PromptRenderer(self.profile.system_prompt, history_turns=history, max_chars=cfg.max_prompt_chars)
        kwargs = dict(cfg.kwargs)
        if cfg.max_turns > 0:
            kwargs["max_turns"] = cfg.max_turns
        return RolloutRunner(env_spec, num_envs=num_envs, env_kwargs=kwargs, renderer=renderer,
                             use_skills=cfg.use_skills, step_timeout_s=cfg.step_timeout_s)

    @staticmethod
    def _num_tasks(runner: RolloutRunner) -> int | None:
        value = getattr(runner.pool.unwrapped(0), "num_tasks", None)
        return int(value) if isinstance(value, int) and value > 0 else None

    def _make_policy(self, temperature: float, seed: int) -> Any:
        from agentgym_opsd.trainer.generation import make_policy_backend

        r = self.cfg.rollout
        if r.backend == "hf":
            return make_policy_backend("hf", model=self.model, tokenizer=self.tokenizer,
                                       max_new_tokens=r.max_new_tokens, temperature=temperature, top_p=r.top_p,
                                       batch_size=r.batch_size, seed=seed)
        return make_policy_backend(
            "vllm", model_path=self._export_for_vllm(), tokenizer=self.tokenizer, max_new_tokens=r.max_new_tokens,
            temperature=temperature, top_p=r.top_p, seed=seed,
            gpu_memory_utilization=r.vllm_gpu_memory_utilization, max_model_len=r.vllm_max_model_len)

    def _export_for_vllm(self) -> str:
        folder = self.out / "vllm_init_model"
        self._save_model(folder)
        return str(folder)

    def _restore(self, folder: Path | None) -> None:
        assert self.state is not None and folder is not None
        if isinstance(self.engine, DeepSpeedEngineAdapter) and self.engine.zero_stage > 0:
            self.engine.load_deepspeed_checkpoint(str(folder / "deepspeed"))
        else:
            self.engine.load_state_dict(self.state.engine)
        sampler = ckpt.restore_rng(self.state.rng)
        if sampler is not None and hasattr(self.policy, "set_rng_state"):
            self.policy.set_rng_state(sampler)
        self._truncate_metrics(self.state.step)

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
        from agentgym_opsd.trainer.generation import chat_prompt_ids

        return chat_prompt_ids(self.tokenizer, messages)

    # ---- the job ----------------------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """Warm start (once), then RL steps up to `total_steps`; returns this session's metric lines."""
        cfg = self.cfg.trainer
        if not self.warm_start_done:
            self.warm_start()
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
        """Supervised steps on oracle demonstrations (seeds from warm_start.seed_offset)."""
        ws = self.cfg.warm_start
        t0 = time.perf_counter()
        tasks = train_task_specs(ws.seed_offset, ws.episodes, num_tasks=self.num_tasks, seed=self.cfg.trainer.seed + 1)
        demos = collect_demonstrations(self.runner, tasks, thought=ws.thought, batch=self.runner.pool.num_envs)
        rows = demonstration_rows(demos, self._encode, self.tokenizer)
        if not rows:
            raise RuntimeError(f"the warm start found no won oracle episodes in {ws.episodes} tasks of {self.cfg.env.id}")
        rng = np.random.default_rng(self.cfg.trainer.seed)
        self.engine.set_lr(ws.lr)
        losses = []
        for _ in tqdm(range(ws.steps), desc="warm start (SFT)", unit="step", disable=not self.cfg.trainer.progress):
            losses.append(sft_step(self.engine, rows, rng, batch_rows=ws.batch_rows, pad_id=self.tokenizer.pad_token_id,
                                   max_tokens=self.cfg.optim.micro_batch_tokens, max_rows=self.cfg.optim.micro_batch_rows,
                                   device=self.device))
        self.engine.set_lr(self.cfg.optim.lr)
        optimizer = getattr(self.engine, "optimizer", None)
        if isinstance(optimizer, torch.optim.Optimizer):
            optimizer.state.clear()  # RL starts with fresh AdamW moments (the SFT ones have another scale)
        self.warm_start_done = True
        self._save_model(self.out / "warm_start" / "model")
        summary = {"warm_start/loss_first": losses[0] if losses else math.nan,
                   "warm_start/loss_last": losses[-1] if losses else math.nan,
                   "warm_start/demonstrations": float(len(demos)), "warm_start/rows": float(len(rows)),
                   "warm_start/seconds": time.perf_counter() - t0}
        (self.out / "warm_start" / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
        log.info("warm start: %s", summary)
        return summary

    def _setup_reference(self) -> None:
        """The frozen reference for the KL term: the policy at RL start (after any warm start)."""
        if self.cfg.algorithm.kl_coef <= 0 or self.cfg.model.lora:
            return  # no KL, or LoRA: the adapter-disabled base is the reference (no copy)
        from agentgym_opsd.trainer.models import load_policy_model

        source = self.out / "warm_start" / "model" if (self.out / "warm_start" / "model").is_dir() \
            else self.cfg.model.name_or_path
        self.reference, _ = load_policy_model(str(source), dtype=self.cfg.model.dtype, trainable=False)
        self.reference.to(self.device)

    # ---- one RL step ------------------------------------------------------------------------------------
    def collect(self) -> list[Trajectory]:
        r = self.cfg.rollout
        tasks = train_task_specs(self.task_cursor, r.tasks_per_step, num_tasks=self.num_tasks, seed=self.cfg.trainer.seed)
        self.model.eval()
        trajs = self.runner.run(self.policy, tasks, group_size=r.group_size, first_group_id=self.task_cursor,
                                first_traj_id=self.task_cursor * r.group_size)
        self.task_cursor += r.tasks_per_step
        return trajs

    def step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        trajs = self.collect()
        seconds_rollout = time.perf_counter() - t0
        metrics = self.step_on(trajs)
        metrics["seconds_rollout"] = seconds_rollout
        metrics["time/rollout"] = seconds_rollout
        self.step_done += 1
        metrics["step"] = self.step_done
        if self.cfg.trainer.save_trajectories:
            save_jsonl(trajs, self.out / "trajectories" / f"step_{self.step_done:06d}.jsonl")
        if hasattr(self.policy, "sync_weights"):
            self.policy.sync_weights(self.model)  # vLLM: push the updated weights into the engine
        return metrics

    def score(self, trajs: list[Trajectory]) -> TurnBatch:
        a = self.cfg.algorithm
        return build_turn_batch(trajs, encode_prompt=self._encode,
                                teacher_messages=self.runner.teacher_messages if a.needs_teacher else None,
                                reward_scale=self.cfg.env.reward_scale, invalid_penalty=self.invalid_penalty,
                                success_source=a.success_source)

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
            "response_tokens": float(batch.num_response_tokens),
            "sample_logprob_gap": self._sampling_gap(rows, old),
            "seconds_teacher": seconds_teacher,
            "seconds_logprobs": seconds_logprobs,
            "seconds_update": seconds_update,
            "time/teacher": seconds_teacher,
            "time/logprobs": seconds_logprobs,
            "time/update": seconds_update,
            "memory/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        }
        env_key = f"env/{parse_env_spec(self.cfg.env.id)[0].partition('/')[2]}"
        metrics[f"{env_key}/success_rate"] = batch.stats["success_rate"]
        metrics["loss/total"] = metrics["loss"]
        return metrics

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
            with self.model.disable_adapter():
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

    def advantages(self, batch: TurnBatch, evidence: Tensor, gaps: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """Per-row token advantages (1-D, one per response token) and the per-trajectory A_seq."""
        a = self.cfg.algorithm
        seq_adv = credit.grpo_advantages(batch.traj_rewards, batch.traj_group_ids, eps=a.eps,
                                         normalize_std=a.normalize_std)
        if not batch.rows:
            return [], seq_adv
        row_adv = seq_adv[batch.traj_index]
        lengths = [len(r.response_ids) for r in batch.rows]
        if a.estimator == "agentopsd-token":
            width = max(lengths)
            gap_grid = _pad_left(gaps, width).to(torch.float64)
            mask = _pad_left([torch.ones(n) for n in lengths], width).bool()
            grid = credit.agentopsd_token_advantages(row_adv, gap_grid, mask, batch.success_rate, lam=a.lam,
                                                     band=a.band, gamma=a.gamma, eps0=a.eps0, eps=a.eps)
            return [grid[i, width - n:].float() for i, n in enumerate(lengths)], seq_adv
        cc = credit.CreditConfig(lam=a.lam, band=a.band, gamma=a.gamma, eps0=a.eps0, eps=a.eps, variant=a.variant)
        turn_adv = credit.turn_advantages(a.estimator, row_adv, evidence, batch.traj_ids, batch.turn_ids,
                                          batch.success_rate, cc)
        return [torch.full((n,), float(v), dtype=torch.float32) for n, v in zip(lengths, turn_adv.tolist(), strict=True)], seq_adv

    def update(self, batch: TurnBatch, old: list[Tensor], ref: list[Tensor] | None,
               advantages: list[Tensor]) -> dict[str, float]:
        """`ppo_epochs` optimiser steps over all rows, micro-batched by length; token-mean objective."""
        a, o = self.cfg.algorithm, self.cfg.optim
        rows = batch.rows
        totals = {"loss": 0.0, "policy_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0}
        if not rows:
            return totals
        prompts = [r.prompt_ids for r in rows]
        responses = [r.response_ids for r in rows]
        num_tokens = batch.num_response_tokens
        batches = bucket_micro_batches([len(p) + len(r) for p, r in zip(prompts, responses, strict=True)],
                                       max_tokens=o.micro_batch_tokens, max_rows=o.micro_batch_rows)
        self.model.train()
        for _ in range(a.ppo_epochs):
            sums = {"loss": 0.0, "policy": 0.0, "kl": 0.0, "entropy": 0.0, "clipped": 0.0}
            for k, idx in enumerate(batches):
                mb = collate(idx, prompts, responses, self.tokenizer.pad_token_id).to(self.device)
                width = mb.response_ids.shape[1]
                logp, entropy = response_logprobs(self.model, mb, temperature=self.cfg.rollout.temperature,
                                                  with_entropy=True)
                terms = policy_objective(
                    logp, _pad_left([old[i] for i in idx], width).to(self.device),
                    _pad_left([advantages[i] for i in idx], width).to(self.device), mb.response_mask,
                    entropy=entropy, ref_logp=_pad_left([ref[i] for i in idx], width).to(self.device) if ref else None,
                    clip_low=a.clip_low, clip_high=a.clip_high, kl_coef=a.kl_coef, entropy_coef=a.entropy_coef,
                    num_tokens=num_tokens)
                self.engine.backward(terms.loss, is_last=k == len(batches) - 1)
                sums["loss"] += float(terms.loss.detach())
                sums["policy"] += float(terms.policy)
                sums["kl"] += float(terms.kl)
                sums["entropy"] += float(terms.entropy)
                sums["clipped"] += float(terms.clipped_tokens)
            grad_norm = self.engine.step()
        # Metrics of the last epoch (the only one with the default ppo_epochs=1).
        return {"loss": sums["loss"], "policy_loss": sums["policy"] / num_tokens, "kl": sums["kl"] / num_tokens,
                "entropy": sums["entropy"] / num_tokens, "clip_fraction": sums["clipped"] / num_tokens,
                "grad_norm": grad_norm}

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
        summary = evaluate_policy(policy, spec, episodes=t.eval_episodes, num_envs=num_envs, runner=self._val_runner)
        out = {"val/success_rate": summary.success_rate, "val/score": summary.score_mean,
               "val/turns_mean": summary.turns_mean, "val/invalid_action_rate": summary.invalid_action_rate,
               "time/validation": time.perf_counter() - t0}
        out.update(summary.metrics("val"))
        return out

    def _log(self, metrics: dict[str, Any], *, step: int) -> None:
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
        folder.parent.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(folder), safe_serialization=True)
        self.tokenizer.save_pretrained(str(folder))

    def save(self) -> Path:
        sampler = self.policy.get_rng_state() if hasattr(self.policy, "get_rng_state") else None
        ds_zero = isinstance(self.engine, DeepSpeedEngineAdapter) and self.engine.zero_stage > 0
        state = ckpt.TrainerState(step=self.step_done, task_cursor=self.task_cursor,
                                  warm_start_done=self.warm_start_done,
                                  engine={} if ds_zero else self.engine.state_dict(),
                                  rng=ckpt.capture_rng(sampler), extra={"config": asdict(self.cfg)})
        extra = (lambda d: self.engine.save_deepspeed_checkpoint(str(d / "deepspeed"))) if ds_zero else None
        path = ckpt.save_checkpoint(self.ckpt_dir, state, save_model=self._save_model,
                                    config_yaml=self.cfg.to_yaml(), save_extra=extra)
        ckpt.prune_checkpoints(self.ckpt_dir, self.cfg.trainer.keep_checkpoints)
        return path

    def close(self) -> None:
        self.runner.close()
        if self._val_runner is not None:
            self._val_runner.close()
        if self._writer is not None:
            self._writer.close()
