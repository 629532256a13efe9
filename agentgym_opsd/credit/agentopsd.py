"""AgentOPSD's credit (the paper, docs/method.md), in one place: each trajectory's A_seq redistributed over its turns
by the self-teacher's evidence e_k, vectorised over turn rows in any order.

- the evidence forms: how the teacher's judgement of a turn becomes e_k (`compute_evidence`: the paper's summed
  log-prob gap over the student's tokens, or its per-token mean, its argument tokens only, or the chosen action
  among the turn's choices; a row with nothing for its form to read falls back to the paper's sum);
- the layout: turn rows ranked by (trajectory, turn) onto a padded grid, once, without a Python loop;
- the belief and the bounded re-weighting on that grid (`_reshape_on_grid`, shared with the token-level
  estimator), and the discounted sum it runs on, a blocked matrix scan (no ``γ^-k`` growth);
- `agentopsd_advantages`, the estimator itself.

The model passes that produce the evidence's inputs live in the trainer (`trainer/teacher_evidence.py`); this
module is the arithmetic only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

from agentgym_opsd.credit._checks import _check_turn_rows, _per_trajectory
from agentgym_opsd.credit.config import CreditConfig

__all__ = ["CHOICE_NORMS", "ChoiceScores", "EVIDENCE_FORMS", "EvidenceForm", "EvidenceInputs", "EvidenceResult",
           "agentopsd_advantages", "choice_evidence", "choice_log_probs", "compute_evidence", "evidence_form",
           "form_counts"]


# ---- the layout of turn rows ------------------------------------------------------------

# Rows are ranked by a counting sort over the (traj id, turn id) range when that range has at most
# FACTOR·rows + SLACK cells, else by torch.sort (see _layout_turn_rows).
_COUNTING_SORT_FACTOR = 8
_COUNTING_SORT_SLACK = 4096


@dataclass(frozen=True)
class _TurnLayout:
    """Where each turn row sits on the padded (trajectories, max_turns) grid."""

    traj_index: Tensor  # (rows,) dense trajectory index 0..n−1, trajectories in increasing id order
    turn_pos: Tensor  # (rows,) 0-based position of the row's turn within its trajectory
    num_turns: Tensor  # (n,) turns of each trajectory
    max_turns: int


def _layout_turn_rows(traj_ids: Tensor, turn_ids: Tensor) -> _TurnLayout:
    """Rank rows by (traj, turn) without a Python loop; ValueError on a duplicated (traj, turn) pair.

    Ids are usually dense (rollout.py numbers trajectories ``first_traj_id + i`` and turns 0..K−1): then a
    counting sort over the id range is O(rows + range) and much cheaper than a comparison sort. Sparse ids
    are first made dense with torch.unique (one sort), then counted the same way.
    """
    traj_lo, traj_hi, turn_lo, turn_hi = torch.stack(
        [*torch.aminmax(traj_ids), *torch.aminmax(turn_ids)]
    ).tolist()
    traj_span, turn_span = traj_hi - traj_lo + 1, turn_hi - turn_lo + 1
    cells_max = _COUNTING_SORT_FACTOR * traj_ids.numel() + _COUNTING_SORT_SLACK
    if traj_span * turn_span <= cells_max:
        return _layout_by_counting(
            traj_ids - traj_lo, turn_ids - turn_lo, traj_span, turn_span, traj_ids, turn_ids
        )
    traj_key = torch.unique(traj_ids, return_inverse=True)[1]  # (rows,) dense 0..n−1, order kept
    traj_span = int(traj_key.max()) + 1
    if traj_span * turn_span <= cells_max:
        return _layout_by_counting(traj_key, turn_ids - turn_lo, traj_span, turn_span, traj_ids, turn_ids)
    turn_key = torch.unique(turn_ids, return_inverse=True)[1]  # both keys < rows: their product fits int64
    return _layout_by_sorting(traj_key, turn_key, int(turn_key.max()) + 1, traj_ids, turn_ids)


def _layout_by_counting(
    traj_key: Tensor, turn_key: Tensor, traj_span: int, turn_span: int, traj_ids: Tensor, turn_ids: Tensor
) -> _TurnLayout:
    """Counting sort; ``traj_key`` in [0, traj_span) and ``turn_key`` in [0, turn_span) keep the id order."""
    key = torch.add(turn_key, traj_key, alpha=turn_span)  # (rows,) cell of the (traj_span, turn_span) table
    table = torch.bincount(key, minlength=traj_span * turn_span).view(traj_span, turn_span)
    num_turns = table.sum(1)  # (traj_span,) 0 for a key in the range that no row uses
    present = num_turns > 0
    most_per_cell, max_turns, num_traj = torch.stack([table.max(), num_turns.max(), present.sum()]).tolist()
    if most_per_cell > 1:
        _raise_duplicate(traj_ids, turn_ids)
    rank = table.cumsum(1).sub_(1)  # (traj_span, turn_span) turn key -> position within its trajectory
    turn_pos = rank.take(key)
    if num_traj == traj_span:  # no unused keys: the key is the grid row
        return _TurnLayout(traj_key, turn_pos, num_turns, max_turns)
    dense = present.cumsum(0).sub_(1)  # (traj_span,) key -> grid row, skipping unused keys
    return _TurnLayout(dense.take(traj_key), turn_pos, num_turns[present], max_turns)


def _layout_by_sorting(
    traj_key: Tensor, turn_key: Tensor, turn_span: int, traj_ids: Tensor, turn_ids: Tensor
) -> _TurnLayout:
    """Comparison sort on one int64 key; for many trajectories that each use different turn ids."""
    key = torch.add(turn_key, traj_key, alpha=turn_span)
    sorted_key, order = torch.sort(key)  # non-stable is fine: keys are unique unless duplicated
    if bool((sorted_key[1:] == sorted_key[:-1]).any()):
        _raise_duplicate(traj_ids, turn_ids)
    traj_sorted = traj_key[order]
    starts = torch.ones_like(traj_sorted, dtype=torch.bool)  # (rows,) True at each trajectory's first row
    starts[1:] = traj_sorted[1:] != traj_sorted[:-1]
    seg = starts.long().cumsum(0) - 1  # (rows,) dense trajectory index of each sorted row
    pos = torch.arange(order.numel(), device=order.device) - starts.nonzero().squeeze(1)[seg]
    num_turns = torch.bincount(seg)
    unsort = torch.empty_like(order)
    return _TurnLayout(
        unsort.scatter(0, order, seg), unsort.scatter(0, order, pos), num_turns, int(num_turns.max())
    )


def _raise_duplicate(traj_ids: Tensor, turn_ids: Tensor) -> None:
    """Error path only: name one duplicated (traj, turn) pair."""
    seen: set[tuple[int, int]] = set()
    for pair in zip(traj_ids.tolist(), turn_ids.tolist(), strict=True):
        if pair in seen:
            break
        seen.add(pair)
    raise ValueError(
        f"duplicate (traj_id, turn_id) = {pair} in the turn rows: each turn must appear once "
        "(drop padding rows before credit assignment)."
    )


# ---- the belief and the re-weighting on the grid ------------------------------------------------------------

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


# ---- the estimator ------------------------------------------------------------

def agentopsd_advantages(
    seq_advantages: Tensor,
    evidence: Tensor,
    traj_ids: Tensor,
    turn_ids: Tensor,
    success_rate: Tensor,
    *,
    lam: float = 0.5,
    band: float = 0.2,
    gamma: float = 0.95,
    eps0: float = 1e-3,
    eps: float = 1e-6,
    variant: str = "paper",
) -> Tensor:
    """AgentOPSD advantage Ã_k of every turn row (docs/method.md), vectorised; rows may come in any order.

    All arguments are 1-D with one entry per turn row:
      ``seq_advantages`` A_seq of the row's trajectory (floating; sets the output dtype and device),
      ``evidence`` e_k, the summed teacher − student log-prob of the turn's response tokens,
      ``traj_ids`` any integer trajectory ids, ``turn_ids`` integer turn position within the trajectory
      (only their order matters: the smallest turn id of a trajectory is its first turn k=1),
      ``success_rate`` R̄, the row's group success rate in [0, 1] before clipping.
    ``seq_advantages`` and ``success_rate`` must be constant within a trajectory, and each (traj, turn)
    pair may occur once (a duplicated, e.g. padding, row would count a turn twice): otherwise ValueError.
    ``variant``: "paper"; "raw_gap" (q_k = sign(A)·e_k); "unsigned" (q_k = |ΔB_k|); "no_prior" (B_0 = 0.5).
    """
    cfg = CreditConfig(lam=lam, band=band, gamma=gamma, eps0=eps0, eps=eps, variant=variant)
    return _agentopsd_rows(seq_advantages, evidence, traj_ids, turn_ids, success_rate, cfg, None)


def _agentopsd_rows(
    seq_advantages: Tensor,
    evidence: Tensor,
    traj_ids: Tensor,
    turn_ids: Tensor,
    success_rate: Tensor,
    cfg: CreditConfig,
    details: dict[str, Tensor] | None,
) -> Tensor:
    """:func:`agentopsd_advantages` with a validated config; fills ``details`` (when given) with the per-row
    ``prior`` B_0, ``belief`` B_k, ``delta_belief`` ΔB_k and ``weight`` w_k."""
    _check_turn_rows(seq_advantages, evidence, traj_ids, turn_ids, success_rate)
    dtype = seq_advantages.dtype
    num_rows = seq_advantages.numel()
    if num_rows == 0:
        if details is not None:
            details.update({k: seq_advantages.new_zeros(0) for k in _AGENTOPSD_DETAILS})
        return seq_advantages.clone()

    layout = _layout_turn_rows(traj_ids, turn_ids)
    num_traj, max_turns = layout.num_turns.numel(), layout.max_turns
    flat = torch.add(layout.turn_pos, layout.traj_index, alpha=max_turns)  # (rows,) cell of the flat grid
    e_grid = seq_advantages.new_zeros(num_traj * max_turns).scatter_(0, flat, evidence.to(dtype))

    # Trajectory-level inputs: one value per trajectory (traj,), and every row must agree with it.
    adv = _per_trajectory("seq_advantages", seq_advantages, layout.traj_index, num_traj)
    rate = _per_trajectory("success_rate", success_rate.to(dtype), layout.traj_index, num_traj)
    grid_details: dict[str, Tensor] | None = {} if details is not None else None
    out_grid = _reshape_on_grid(e_grid.view(num_traj, max_turns), layout.num_turns, adv, rate, cfg, grid_details)
    if details is not None and grid_details is not None:
        details["prior"] = grid_details.pop("prior").take(layout.traj_index)
        details.update({k: v.take(flat) for k, v in grid_details.items()})
    return out_grid.take(flat)


# ---- the evidence forms ------------------------------------------------------------

CHOICE_NORMS: tuple[str, ...] = ("sum", "mean")
"""How a choice's token log-probs become its score ℓ(c) before the softmax over the set."""


@dataclass(frozen=True)
class ChoiceScores:
    """One turn's scored choice set: ``teacher`` and ``student`` (choices,) sequence log-probs Σ_t log π of
    each choice's rendered text under the teacher's and the student's prompt, ``lengths`` (choices,) its
    token count, ``chosen`` the index of the action the student took."""

    teacher: Tensor
    student: Tensor
    lengths: Tensor
    chosen: int

    def __post_init__(self) -> None:
        n = self.teacher.numel()
        if self.student.numel() != n or self.lengths.numel() != n:
            raise ValueError(f"teacher, student and lengths need one entry per choice, got "
                             f"{n}, {self.student.numel()}, {self.lengths.numel()}")
        if not 0 <= self.chosen < n:
            raise ValueError(f"chosen={self.chosen} is not the index of one of the {n} choices")
        if bool((self.lengths <= 0).any()):
            raise ValueError("every choice needs at least one token")


def choice_log_probs(scores: Tensor, lengths: Tensor, norm: str = "sum") -> Tensor:
    """(choices,) log p(c | A): the log-softmax over the set of each choice's score — its summed token
    log-prob (``norm="sum"``) or that sum over its token count (``"mean"``)."""
    if norm not in CHOICE_NORMS:
        raise ValueError(f"choice norm: expected one of {CHOICE_NORMS}, got {norm!r}")
    scores = scores.to(torch.float64)
    if norm == "mean":
        scores = scores / lengths.to(torch.float64)
    return torch.log_softmax(scores, dim=0)


def choice_evidence(choice: ChoiceScores, norm: str = "sum") -> float:
    """e_k = log p_teacher(chosen | A) − log p_student(chosen | A) (0 for a set of one: no decision)."""
    teacher = choice_log_probs(choice.teacher, choice.lengths, norm)
    student = choice_log_probs(choice.student, choice.lengths, norm)
    return float(teacher[choice.chosen] - student[choice.chosen])


@dataclass(frozen=True)
class EvidenceInputs:
    """What the forms read, one entry per turn row: ``gaps`` (tokens,) teacher − student log-prob of each
    response token; ``argument_masks`` (tokens,) bool, the tokens of the action's argument (None for a row
    without one); ``choices`` the row's scored choice set (None where it has none)."""

    gaps: Sequence[Tensor]
    argument_masks: Sequence[Tensor | None] | None = None
    choices: Sequence[ChoiceScores | None] | None = None


@dataclass(frozen=True)
class EvidenceResult:
    """``evidence`` (rows,) float64 e_k, and per row the form it was computed with (the requested one, or
    ``"paper"`` where the row fell back)."""

    evidence: Tensor
    forms: tuple[str, ...]


RowEvidence = Callable[[EvidenceInputs, int, str], "float | None"]
"""(inputs, row, choice_norm) -> e_k of that row, or None when the form cannot judge it (paper fallback)."""


@dataclass(frozen=True)
class EvidenceForm:
    """A registered evidence form: its per-row rule and what it needs, so callers compute only that (the
    choice passes cost model time, argument masks a tokenizer)."""

    name: str
    row: RowEvidence
    needs_choices: bool = False
    needs_arguments: bool = False
    summary: str = ""


def _paper(inputs: EvidenceInputs, row: int, norm: str) -> float:
    return float(inputs.gaps[row].sum())


def _mean(inputs: EvidenceInputs, row: int, norm: str) -> float | None:
    gap = inputs.gaps[row]
    return float(gap.double().mean()) if gap.numel() else None


def _args(inputs: EvidenceInputs, row: int, norm: str) -> float | None:
    mask = inputs.argument_masks[row] if inputs.argument_masks is not None else None
    if mask is None or not bool(mask.any()):
        return None
    gap = inputs.gaps[row]
    if mask.shape != gap.shape:
        raise ValueError(f"row {row}: argument mask of shape {tuple(mask.shape)} for {tuple(gap.shape)} gaps")
    return float(gap.double()[mask.bool()].sum())


def _choice(inputs: EvidenceInputs, row: int, norm: str) -> float | None:
    choice = inputs.choices[row] if inputs.choices is not None else None
    return choice_evidence(choice, norm) if choice is not None else None


_FORMS: dict[str, EvidenceForm] = {
    "paper": EvidenceForm("paper", _paper, summary="Σ_t gap_t over the response tokens (the paper)"),
    "choice": EvidenceForm("choice", _choice, needs_choices=True,
                           summary="log p_T(a | A) − log p_S(a | A) over the turn's choice set"),
    "mean": EvidenceForm("mean", _mean, summary="the mean gap per response token"),
    "args": EvidenceForm("args", _args, needs_arguments=True, summary="Σ gap over the action's argument tokens"),
}
EVIDENCE_FORMS_BY_NAME: Mapping[str, EvidenceForm] = MappingProxyType(_FORMS)
EVIDENCE_FORMS: tuple[str, ...] = tuple(_FORMS)
"""The evidence forms, the paper's first (the default)."""


def evidence_form(name: str) -> EvidenceForm:
    """The registered form ``name``; ValueError listing the known forms otherwise."""
    try:
        return _FORMS[name]
    except KeyError:
        raise ValueError(f"unknown evidence form {name!r}; known: {EVIDENCE_FORMS}") from None


def compute_evidence(form: str, inputs: EvidenceInputs, *, choice_norm: str = "sum") -> EvidenceResult:
    """e_k of every row in ``form``; a row the form cannot judge gets the paper's sum (recorded in
    ``forms``)."""
    spec = evidence_form(form)
    if choice_norm not in CHOICE_NORMS:
        raise ValueError(f"choice norm: expected one of {CHOICE_NORMS}, got {choice_norm!r}")
    for name, given, needed in (("choices", inputs.choices, spec.needs_choices),
                                ("argument_masks", inputs.argument_masks, spec.needs_arguments)):
        if needed and given is not None and len(given) != len(inputs.gaps):
            raise ValueError(f"{name}: {len(given)} entries for {len(inputs.gaps)} rows")
    values: list[float] = []
    forms: list[str] = []
    for row in range(len(inputs.gaps)):
        value = spec.row(inputs, row, choice_norm)
        if value is None:
            value, used = _paper(inputs, row, choice_norm), "paper"
        else:
            used = spec.name
        values.append(value)
        forms.append(used)
    return EvidenceResult(torch.tensor(values, dtype=torch.float64), tuple(forms))


def form_counts(forms: Sequence[str] | None) -> dict[str, float]:
    """`teacher/<form>_rows`: how many rows got each evidence form (every form listed, so the keys are the
    same each step; under `choice`, `teacher/paper_rows` counts the rows that fell back). Empty for None."""
    if forms is None:
        return {}
    return {f"teacher/{name}_rows": float(sum(f == name for f in forms)) for name in EVIDENCE_FORMS}
