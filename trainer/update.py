"""The PPO update of one RL step: clipped (and dual-clipped) policy loss + k3 KL − entropy bonus, token-mean
per PPO mini-batch.

The step's rows are shuffled and cut into `ppo_mini_batch_rows` (`PPOUpdate.mini_batches`), one optimiser step
each, for `ppo_epochs` passes, π_old fixed for the whole step; each mini-batch is micro-batched by length for
memory, packed (no padding) when the model supports it (`trainer/logprobs.py`).

Data parallel: the loss is the token mean over the whole step on all ranks: each rank divides its token sums by
the global token count of the mini-batch and multiplies by W (DeepSpeed averages gradients over the ranks), and
all ranks run the same number of micro-batches (padding with zero-weight ones, `_idle_loss`) so ZeRO's
collectives line up.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from agentgym_opsd.trainer import engine as dist
from agentgym_opsd.trainer.config import Config
from agentgym_opsd.trainer.finite import NonFiniteError, require_finite
from agentgym_opsd.trainer.frozen_trunk import TrunkCache
from agentgym_opsd.trainer.logprobs import (
    bucket_micro_batches,
    collate,
    micro_batch_logprobs,
    response_logprobs,
    shared_prompt_prefix,
)
from agentgym_opsd.trainer.losses import StartDrift, policy_objective, row_loss_weights
from agentgym_opsd.trainer.tis import TIS_KEYS, SamplerCorrection
from agentgym_opsd.trainer.turn_batch import BatchAdvantages, PolicyLogProbs, TurnBatch

__all__ = ["PPOUpdate", "UPDATE_KEYS", "pad_left"]

UPDATE_KEYS = ("loss", "policy_loss", "kl", "entropy", "clip_fraction", "approx_kl", "grad_norm", "optimizer_steps")
"""The update's metrics (besides StartDrift's, `trainer/losses.py`, and the sampler correction's, `trainer/tis.py`)."""


def pad_left(rows: list[Tensor], width: int) -> Tensor:
    """(rows, width) right-aligned copy of 1-D tensors (zeros on the left), matching `collate`."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for r, t in enumerate(rows):
        if t.numel():
            out[r, width - t.numel():] = t
    return out


class PPOUpdate:
    """The optimiser's side of a step: the trained model under its engine, the PPO settings, and this rank's
    place among the ranks. `packed`: micro-batches without padding (the model must support it)."""

    def __init__(self, cfg: Config, model: Any, engine: Any, tokenizer: Any, device: torch.device, *,
                 rank: int, world: int, packed: bool) -> None:
        self.cfg, self.model, self.engine, self.tokenizer, self.device = cfg, model, engine, tokenizer, device
        self.rank, self.world, self.packed = rank, world, packed

    def mini_batches(self, num_rows: int, global_rows: int | None = None, *, step: int) -> list[list[int]]:
        """Row indices of each optimiser step of RL step `step` (the steps done before it): `ppo_epochs`
        passes, each a fresh shuffle cut into `ppo_mini_batch_rows` (all rows at once when 0); seeded by the
        step, so a resumed run replays the same order.

        Data parallel (`global_rows` = the rows of all ranks): every rank must take the same number of
        optimiser steps, so each cuts its own shuffled rows into ceil(global_rows / ppo_mini_batch_rows)
        near-equal parts (possibly empty); mini-batch k is the union of the ranks' k-th parts."""
        a = self.cfg.algorithm
        gen = torch.Generator().manual_seed(self.cfg.trainer.seed * 1_000_003 + step + 7_919 * self.rank)
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

    def __call__(self, batch: TurnBatch, logprobs: PolicyLogProbs, advantages: BatchAdvantages, *,
                 step: int) -> dict[str, float]:
        """PPO on the step batch (its old log-probs, advantages, reference log-probs when KL is on): one
        optimiser step per mini-batch, token-mean objective inside each, micro-batched by length; π_old stays
        the rollout policy for every mini-batch of the step."""
        a, o = self.cfg.algorithm, self.cfg.optim
        rows = batch.rows
        old, ref, token_advantages = logprobs.old, logprobs.reference, advantages.tokens
        global_rows = int(dist.all_reduce([len(rows)])[0])
        if not global_rows:
            return {**dict.fromkeys(UPDATE_KEYS, 0.0), **StartDrift().metrics(), **dict.fromkeys(TIS_KEYS, 0.0)}
        correction = SamplerCorrection.compute(
            old, [r.sample_logprobs for r in rows], cap=a.tis_cap,
            # on wherever the sampler's numbers are not the trainer's (`Precision.sampler_is_trainer`); where they
            # are, π_old is the sampler's own log-probs or the same computation again
            enabled=not self.cfg.model.numerics.sampler_is_trainer(self.cfg.rollout.backend))
        prompts, responses = batch.prompt_ids, batch.response_ids
        # the packed layout lays the prompts' shared prefix once per micro-batch, as the π_old pass over the same
        # prompts did (its trunk outputs follow that layout)
        prefix_len = shared_prompt_prefix(prompts) if self.packed else 0
        lengths = [len(p) - prefix_len + len(r) for p, r in zip(prompts, responses, strict=True)]
        weights = self._row_weights(batch)
        sums = dict.fromkeys(("policy", "kl", "entropy", "clipped", "approx_kl", "tokens"), 0.0)
        losses, grad_norms = [], []
        drift = StartDrift()
        self.model.train()
        plan = self.mini_batches(len(rows), global_rows, step=step)
        micro = [bucket_micro_batches([lengths[i] for i in chosen], max_tokens=o.micro_batch_tokens,
                                      max_rows=o.micro_batch_rows, padded=not self.packed)
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
                logp, entropy, mask = self._logprobs(idx, prompts, responses, logprobs.trunk,  # (rows, R) each
                                                     prefix_len=prefix_len)
                width = mask.shape[1]
                if a.loss_agg_mode != "token-mean":  # each token weighted by its trajectory's share
                    mask = mask * torch.tensor([weights[i] for i in idx], dtype=logp.dtype,
                                               device=mask.device).unsqueeze(1)
                old_tokens = pad_left([old[i] for i in idx], width).to(self.device)
                terms = policy_objective(
                    logp, old_tokens,
                    pad_left([token_advantages[i] for i in idx], width).to(self.device), mask,
                    entropy=entropy, ref_logp=pad_left([ref[i] for i in idx], width).to(self.device) if ref else None,
                    clip_low=a.clip_low, clip_high=a.clip_high, clip_ratio_c=a.clip_ratio_c, kl_coef=a.kl_coef,
                    entropy_coef=a.entropy_coef, num_tokens=int(num_tokens),
                    tis_weights=pad_left([correction.weights[i] for i in idx], width).to(self.device)
                    if correction.enabled else None)
                micro_loss = float(terms.loss.detach())
                if self.world == 1:  # several ranks: a rank's NaN reaches every rank's gradient norm, checked alike
                    require_finite(micro_loss, f"RL step {step + 1}: the update's loss")
                self.engine.backward(terms.loss * self.world if self.world > 1 else terms.loss,
                                     is_last=k == n_micro - 1)
                if not grad_norms:  # before the first optimiser step π_θ is the policy that sampled the rows
                    drift.add(logp.detach(), old_tokens, mask)
                loss += micro_loss
                for key, value in (("policy", terms.policy), ("kl", terms.kl), ("entropy", terms.entropy),
                                   ("clipped", terms.clipped_tokens), ("approx_kl", terms.approx_kl)):
                    sums[key] += float(value)
            sums["tokens"] += num_tokens / self.world  # summed over the ranks below
            losses.append(loss)
            try:
                grad_norms.append(self.engine.step())
            except NonFiniteError as exc:
                raise NonFiniteError(f"RL step {step + 1}: {exc}") from None
        if logprobs.trunk is not None:
            logprobs.trunk.release()  # every mini-batch has run: the step's trunk outputs are not needed again
        if self.world > 1:  # the loss terms are sums: add up the ranks' parts
            names = list(sums)
            sums = dict(zip(names, dist.all_reduce([sums[k] for k in names]), strict=True))
            losses = dist.all_reduce(losses)
        for value in losses:  # the same sums on every rank
            require_finite(value, f"RL step {step + 1}: the update's loss")
        tokens = max(sums["tokens"], 1.0)
        return {"loss": float(np.mean(losses)), "policy_loss": sums["policy"] / tokens, "kl": sums["kl"] / tokens,
                "entropy": sums["entropy"] / tokens, "clip_fraction": sums["clipped"] / tokens,
                "approx_kl": sums["approx_kl"] / tokens, "grad_norm": float(np.nanmean(grad_norms)),
                "optimizer_steps": float(len(grad_norms)),
                **drift.metrics(dist.all_reduce if self.world > 1 else None),
                **correction.metrics(dist.all_reduce if self.world > 1 else None),
                **self.engine.low_precision_stats()}  # the same on every rank (identical masters)

    def _row_weights(self, batch: TurnBatch) -> list[float]:
        """Each row's token weight under `algorithm.loss_agg_mode` (`losses.row_loss_weights`), over the step's
        trajectories on every rank (each rank holds whole trajectories)."""
        mode = self.cfg.algorithm.loss_agg_mode
        row_trajectory = [int(t) for t in batch.traj_index.tolist()]
        row_tokens = [len(r) for r in batch.response_ids]
        if mode == "token-mean" or self.world == 1:
            return row_loss_weights(mode, row_trajectory, row_tokens)
        total, count = dist.all_reduce([float(sum(row_tokens)), float(len(set(row_trajectory)))])
        return row_loss_weights(mode, row_trajectory, row_tokens, total_tokens=total, num_trajectories=count)

    def _logprobs(self, idx: list[int], prompts: list, responses: list,
                  trunk: TrunkCache | None = None, *, prefix_len: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probs, entropies and the response mask of one update micro-batch, all (rows, R) right-aligned:
        packed (no padding) when `self.packed`, else left-padded. Where `trunk` holds every row's frozen-trunk
        output from the π_old pass, only the trained blocks run (`trainer/frozen_trunk.py`). `prefix_len`: the
        prompts' shared prefix, laid once (packed only: `logprobs.shared_prompt_prefix`)."""
        logp, entropy, mask = micro_batch_logprobs(self.model, idx, prompts, responses, packed=self.packed,
                                                   device=self.device, pad_id=self.tokenizer.pad_token_id,
                                                   temperature=self.cfg.rollout.temperature, with_entropy=True,
                                                   trunk=trunk, prefix_len=prefix_len)
        assert entropy is not None
        return logp, entropy, mask

    def _idle_loss(self) -> Tensor:
        """A zero loss through the whole model (one pad token): a rank without rows in a micro-batch still
        runs the forward/backward its ZeRO collectives expect, and adds nothing to the gradient."""
        pad = self.tokenizer.pad_token_id
        mb = collate([0], [[pad]], [[pad]], pad).to(self.device)
        logp, _ = response_logprobs(self.model, mb, temperature=self.cfg.rollout.temperature)
        return logp.sum() * 0.0
