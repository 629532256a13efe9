"""Truncated importance sampling (TIS): the correction for a sampler that is not quite the trained policy.

Rollout tokens come from π_sampler (vLLM, or the HF sampler in bf16) and the PPO ratio from the trainer's π_old
(a teacher-forced pass); as different computations they disagree by rounding, so the gradient is that of a
slightly different policy. TIS weights each token's policy-gradient term by

    w_t = min(π_old(y_t) / π_sampler(y_t), C)

(Yao et al., "On the Rollout-Training Mismatch in Modern RL Systems"): the expectation over the sampler's tokens
becomes one over π_old's, and the cap C bounds the variance a rare token would bring. The weight is a constant (no
gradient) on the policy term only. `SamplerCorrection` also reports the mismatch every step, used or not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["TIS_KEYS", "SamplerCorrection"]

TIS_KEYS = ("tis/mismatch_k3", "tis/weight_mean", "tis/weight_max", "tis/clipped_fraction", "tis/on")

_LOG_RATIO_LIMIT = 20.0  # exp() guard: a token the sampler gave e^-20 of π_old's probability is a bug, not noise


@dataclass(frozen=True)
class SamplerCorrection:
    """Per-row token weights (1-D, like π_old) and the step's mismatch metrics (this rank's sums: combine
    ranks with `metrics(all_reduce)`)."""

    weights: list[Tensor]
    enabled: bool
    k3_sum: float
    weight_sum: float
    weight_max: float
    clipped: float
    tokens: float

    @classmethod
    def compute(cls, old: Sequence[Tensor], sampled: Sequence[Sequence[float]], *, cap: float,
                enabled: bool) -> SamplerCorrection:
        """Weights min(exp(old − sampled), cap) per token (1 for rows without the sampler's numbers, and
        everywhere when not `enabled`) and the mismatch on every row that has them."""
        if not cap > 1.0:
            raise ValueError(f"algorithm.tis_cap: expected > 1, got {cap}")
        weights: list[Tensor] = []
        k3_sum = weight_sum = clipped = tokens = 0.0
        weight_max = 0.0
        for old_row, sampled_row in zip(old, sampled, strict=True):
            ones = torch.ones_like(old_row, dtype=torch.float32)
            if len(sampled_row) != old_row.numel() or not old_row.numel():
                weights.append(ones)
                continue
            log_ratio = (old_row.float() - torch.as_tensor(sampled_row, dtype=torch.float32)).clamp(
                -_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
            ratio = log_ratio.exp()  # π_old / π_sampler on the sampled tokens
            k3_sum += float((ratio - 1.0 - log_ratio).sum())
            truncated = ratio.clamp(max=cap)
            weight_sum += float(truncated.sum())
            weight_max = max(weight_max, float(ratio.max()))
            clipped += float((ratio > cap).sum())
            tokens += float(ratio.numel())
            weights.append(truncated if enabled else ones)
        return cls(weights, enabled, k3_sum, weight_sum, weight_max, clipped, tokens)

    def metrics(self, all_reduce: Callable[..., list[float]] | None = None) -> dict[str, float]:
        k3, total, clipped, tokens, top = self.k3_sum, self.weight_sum, self.clipped, self.tokens, self.weight_max
        if all_reduce is not None:
            k3, total, clipped, tokens = all_reduce([k3, total, clipped, tokens])
            top = all_reduce([top], op="max")[0]
        if not tokens:
            return {"tis/mismatch_k3": math.nan, "tis/weight_mean": math.nan, "tis/weight_max": math.nan,
                    "tis/clipped_fraction": math.nan, "tis/on": float(self.enabled)}
        return {"tis/mismatch_k3": k3 / tokens, "tis/weight_mean": total / tokens, "tis/weight_max": top,
                "tis/clipped_fraction": clipped / tokens, "tis/on": float(self.enabled)}
