"""AgentOPSD at token level (the released code's WebShop / Search-QA variant): each turn is its own
sequence, and the belief runs over its response tokens."""

from __future__ import annotations

import torch
from torch import Tensor

from agentgym_opsd.credit._checks import _check_1d_same_length, _check_floating
from agentgym_opsd.credit.agentopsd import _AGENTOPSD_DETAILS, _reshape_on_grid
from agentgym_opsd.credit.config import CreditConfig


def agentopsd_token_advantages(
    seq_advantages: Tensor,
    token_logprob_gaps: Tensor,
    response_mask: Tensor,
    success_rate: Tensor,
    *,
    lam: float = 0.5,
    band: float = 0.2,
    gamma: float = 0.95,
    eps0: float = 1e-3,
    eps: float = 1e-6,
) -> Tensor:
    """Token-granularity AgentOPSD, as in the released code for WebShop and Search-QA.

    Each row (a turn) is its own sequence: the belief restarts at B_0 and runs over the row's response
    tokens, skipping masked-out positions (c_t = γ c_prev + gap_t over valid tokens only); z is taken over
    the valid tokens of that row. Inputs: ``seq_advantages`` (rows,) floating, ``token_logprob_gaps``
    (rows, tokens) teacher − student token log-probs, ``response_mask`` (rows, tokens) bool or 0/1,
    ``success_rate`` (rows,). Returns (rows, tokens) in the dtype of ``seq_advantages``, zero where masked.
    """
    cfg = CreditConfig(lam=lam, band=band, gamma=gamma, eps0=eps0, eps=eps, variant="paper")
    return _agentopsd_token_grid(seq_advantages, token_logprob_gaps, response_mask, success_rate, cfg, None)


def _agentopsd_token_grid(
    seq_advantages: Tensor,
    token_logprob_gaps: Tensor,
    response_mask: Tensor,
    success_rate: Tensor,
    cfg: CreditConfig,
    details: dict[str, Tensor] | None,
) -> Tensor:
    """:func:`agentopsd_token_advantages` with a validated config. ``details`` (when given) gets per-row
    summaries, so a turn reads like a turn-level one: ``prior`` B_0, ``belief`` B after the row's last valid
    token, ``delta_belief`` that minus B_0, ``weight`` the mean w over the valid tokens."""
    _check_1d_same_length(seq_advantages=seq_advantages, success_rate=success_rate)
    _check_floating("seq_advantages", seq_advantages)
    if token_logprob_gaps.dim() != 2 or response_mask.shape != token_logprob_gaps.shape:
        raise ValueError(
            "token_logprob_gaps and response_mask must both be (rows, tokens); got "
            f"{tuple(token_logprob_gaps.shape)} and {tuple(response_mask.shape)}."
        )
    if token_logprob_gaps.shape[0] != seq_advantages.shape[0]:
        raise ValueError(
            f"token_logprob_gaps has {token_logprob_gaps.shape[0]} rows but seq_advantages has "
            f"{seq_advantages.shape[0]}."
        )
    if response_mask.dtype != torch.bool:
        if bool(((response_mask != 0) & (response_mask != 1)).any()):
            raise ValueError("response_mask must be bool or contain only 0 and 1.")
        response_mask = response_mask != 0
    dtype = seq_advantages.dtype
    num_rows, num_tokens = token_logprob_gaps.shape
    if num_rows == 0 or num_tokens == 0:
        if details is not None:
            details.update({k: seq_advantages.new_zeros(num_rows) for k in _AGENTOPSD_DETAILS})
        return torch.zeros(token_logprob_gaps.shape, dtype=dtype, device=seq_advantages.device)

    # Compact each row's valid tokens to the left, so masked positions neither add evidence nor decay c.
    # Column num_tokens is a dump for masked positions and is dropped.
    compact_col = torch.where(response_mask, response_mask.long().cumsum(1) - 1, num_tokens)  # (rows, tokens)
    gaps = torch.where(response_mask, token_logprob_gaps.to(dtype), 0)
    e_grid = torch.zeros(num_rows, num_tokens + 1, dtype=dtype, device=seq_advantages.device)
    e_grid.scatter_(1, compact_col, gaps)
    num_valid = response_mask.sum(1)  # (rows,)
    grid_details: dict[str, Tensor] | None = {} if details is not None else None
    out_grid = _reshape_on_grid(e_grid, num_valid, seq_advantages, success_rate.to(dtype), cfg, grid_details)
    if details is not None and grid_details is not None:
        last = (num_valid - 1).clamp_min(0)[:, None]  # (rows, 1) compact column of the last valid token
        prior = grid_details["prior"]
        belief = torch.where(num_valid > 0, grid_details["belief"].gather(1, last).squeeze(1), prior)
        valid = torch.arange(e_grid.shape[1], device=e_grid.device) < num_valid[:, None]
        weight = torch.where(valid, grid_details["weight"], 0).sum(1) / num_valid.clamp_min(1)
        details.update(prior=prior, belief=belief, delta_belief=belief - prior,
                       weight=torch.where(num_valid > 0, weight, 1.0))
    out = out_grid.gather(1, compact_col)
    return torch.where(response_mask, out, 0)
