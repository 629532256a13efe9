"""The shared vectorised core: AgentOPSD's belief and bounded re-weighting on a padded grid of sequences
(turns of a trajectory, or tokens of a turn), and the discounted sum it runs on, a blocked matrix scan
(stable for any horizon: no ``γ^-k`` growth)."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from agentgym_opsd.credit.config import CreditConfig

# Width of one block of the discounted scan. Inside a block the scan is a (L, L) lower-triangular matmul;
# blocks are chained by a (recursive) scan over block ends, so cost is O(n·L) and every weight is γ^j ≤ 1.
_SCAN_BLOCK = 64
# The per-row ``details`` keys of AgentOPSD (what _reshape_on_grid fills on its grid).
_AGENTOPSD_DETAILS = ("prior", "belief", "delta_belief", "weight")


def _reshape_on_grid(
    e_grid: Tensor,
    num_valid: Tensor,
    adv: Tensor,
    rate: Tensor,
    cfg: CreditConfig,
    details: dict[str, Tensor] | None = None,
) -> Tensor:
    """Reshaped advantages on a padded grid of sequences (turns of a trajectory, or tokens of a turn).

    ``e_grid`` (seqs, L) evidence, each row's ``num_valid`` (seqs,) entries packed left and zeros after;
    ``adv`` and ``rate`` (seqs,). Returns (seqs, L); entries past a row's ``num_valid`` are junk.
    ``details``, when given, receives ``prior`` (seqs,) and the (seqs, L) ``belief``, ``delta_belief`` and
    ``weight`` grids; without it nothing extra is copied (the in-place hot path is unchanged).
    """
    if cfg.variant == "no_prior":
        b0 = torch.full_like(rate, 0.5)
    else:  # clip to [ε0, 1 − ε0], then the same [ε, 1 − ε] clamp as B_k so ΔB_1 compares like with like
        b0 = rate.clamp(max(cfg.eps0, cfg.eps), 1.0 - max(cfg.eps0, cfg.eps))
    c = _discounted_cumsum(e_grid, cfg.gamma)  # (seqs, L) c_k = Σ_{j≤k} γ^(k−j) e_j
    logit_b0 = torch.logit(b0)
    logits = c.add_(logit_b0[:, None])  # (seqs, L) logit B_k
    belief = torch.sigmoid(logits).clamp_(cfg.eps, 1.0 - cfg.eps)
    start = torch.sigmoid(logit_b0).clamp_(cfg.eps, 1.0 - cfg.eps)  # B_0 as the belief's arithmetic gives it
    prev_logits = torch.cat([logit_b0[:, None], logits[:, :-1]], dim=1)
    # ΔB_k = B_k − B_(k−1), exactly 0 where the logit did not move (zero evidence): σ of equal inputs can round
    # differently in a vectorised kernel, and 1/(std + ε) would amplify that noise into weights (w ≈ 1.03).
    delta_b = torch.where(logits == prev_logits, 0.0, belief - torch.cat([start[:, None], belief[:, :-1]], dim=1))
    if details is not None:  # copies: the lines below overwrite delta_b in place
        details.update(prior=b0, belief=belief, delta_belief=delta_b.clone())

    # (seqs, L) 1.0 on valid entries, 0.0 after; a float mask because multiplying by it is the cheapest op.
    valid = (torch.arange(e_grid.shape[1], device=e_grid.device) < num_valid[:, None]).to(e_grid.dtype)
    # q without its sign(A) factor: z(sign·q) = sign·z(q), so the sign is applied to the per-row scale below.
    if cfg.variant == "raw_gap":
        q = e_grid  # already 0 past the valid entries
    elif cfg.variant == "unsigned":
        q = delta_b.abs_().mul_(valid)
    else:
        q = delta_b.mul_(valid)
    sign = torch.ones_like(adv) if cfg.variant == "unsigned" else torch.sign(adv)

    # z over the valid entries of each sequence: mean and population std.
    count = num_valid.to(q.dtype).clamp_min_(1.0)[:, None]  # (seqs, 1)
    centred = (q - q.sum(1, keepdim=True).div_(count)).mul_(valid)  # exactly 0 for a one-entry sequence
    std = torch.linalg.vector_norm(centred, dim=1, keepdim=True).div_(count.sqrt_())
    scale = std.add_(cfg.eps).reciprocal_().mul_(sign[:, None] * cfg.band)  # (seqs, 1) b·sign(A)/(std + ε)
    # w − 1 = clip(b z, −b, b); Ã = A + λ A (w − 1) equals A [(1 − λ) + λ w] and is exactly A when λ or z is 0.
    w_minus_1 = centred.mul_(scale).clamp_(-cfg.band, cfg.band)
    if details is not None:
        details["weight"] = w_minus_1 + 1.0
    return w_minus_1.mul_((cfg.lam * adv)[:, None]).add_(adv[:, None])  # (in place: addcmul is slower here)


@functools.lru_cache(maxsize=32)
def _decay_matrix(gamma: float, block: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(block, block) read-only constant, [j, k] = γ^(k − j) for k ≥ j else 0; memoised since the same γ and
    block size recur every training step. Built contiguous: a matmul with a transposed view is far slower."""
    lags = torch.arange(block, device=device)
    gamma_t = torch.tensor(gamma, dtype=dtype, device=device)  # powers in the target dtype, not float32
    return (gamma_t ** (lags[None, :] - lags[:, None]).clamp_min_(0)).triu_()


def _discounted_cumsum(x: Tensor, gamma: float) -> Tensor:
    """``out[:, k] = Σ_{j≤k} γ^(k−j) x[:, j]`` along the last dim of (seqs, L), without γ^-k blow-up.

    Blocks of ``_SCAN_BLOCK`` columns are scanned by a (B, B) triangular matmul; the block ends are then
    chained by the same scan with factor γ^B (recursively), so every weight used is in [0, 1] and the
    rounding error is that of a plain weighted sum (no γ^-k rescaling, which overflows for long rows).
    """
    num_seqs, length = x.shape
    block = min(length, _SCAN_BLOCK)
    num_blocks = -(-length // block)
    if num_blocks * block != length:
        x = torch.nn.functional.pad(x, (0, num_blocks * block - length))
    blocks = x.view(num_seqs, num_blocks, block)
    local = blocks @ _decay_matrix(gamma, block, x.dtype, x.device)  # (seqs, blocks, block) restarted scans
    if num_blocks > 1:
        block_end = local[:, :, -1]  # (seqs, blocks)
        carry = _discounted_cumsum(block_end, gamma**block)  # c at the end of each block
        carry_in = torch.nn.functional.pad(carry[:, :-1], (1, 0))  # c entering each block
        gamma_t = torch.tensor(gamma, dtype=x.dtype, device=x.device)  # powers in x's dtype, not float32
        lags = torch.arange(block, device=x.device)
        local = local + carry_in[:, :, None] * gamma_t ** (lags + 1)
    return local.reshape(num_seqs, num_blocks * block)[:, :length]
