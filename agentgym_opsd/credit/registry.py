"""Named estimators: a registry the trainer dispatches through (it knows no estimator by name). Each
registered :class:`EstimatorSpec` declares what it needs; :func:`estimate` fills a :class:`CreditResult`
from a :class:`CreditInputs`. The built-in estimators (GRPO, AgentOPSD and its ablations, token-level
AgentOPSD, GiGPO, AgentOPSD + GiGPO, AgentOPSD on oracle evidence) are registered here, on import."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import torch
from torch import Tensor

from agentgym_opsd.credit._checks import _check_1d_same_length, _check_floating
from agentgym_opsd.credit.agentopsd import _agentopsd_rows
from agentgym_opsd.credit.agentopsd_token import _agentopsd_token_grid
from agentgym_opsd.credit.config import VARIANTS, CreditConfig
from agentgym_opsd.credit.gigpo import gigpo_step_advantages
from agentgym_opsd.credit.oracle import oracle_evidence

GRANULARITIES: tuple[str, ...] = ("turn", "token")


@dataclass(frozen=True)
class CreditInputs:
    """Everything a credit estimator may read. 1-D tensors have one entry per turn row (rows in any order).

    Required: ``seq_advantages`` A_seq of the row's trajectory (floating; sets the output dtype),
    ``traj_ids``, ``turn_ids`` (integer), ``success_rate`` R̄ of the row's group. Optional, supplied when an
    estimator declares it needs them (:attr:`EstimatorSpec.required_inputs`): ``evidence`` e_k (summed
    teacher − student log-probs), ``token_gaps`` and ``token_mask`` (rows, tokens) per-token gaps and
    which positions are response tokens (any alignment), ``group_ids`` task group of the row,
    ``anchor_keys`` integer hash of the state the turn acted on, ``turn_rewards`` the turn's own reward,
    ``turn_penalties`` its invalid-action penalty, ``oracle_progress`` the oracle distance the turn closed
    (d_before − d_after; NaN where the environment reported none).
    """

    seq_advantages: Tensor
    traj_ids: Tensor
    turn_ids: Tensor
    success_rate: Tensor
    evidence: Tensor | None = None
    token_gaps: Tensor | None = None
    token_mask: Tensor | None = None
    group_ids: Tensor | None = None
    anchor_keys: Tensor | None = None
    turn_rewards: Tensor | None = None
    turn_penalties: Tensor | None = None
    oracle_progress: Tensor | None = None

    @property
    def num_rows(self) -> int:
        return int(self.seq_advantages.shape[0])


@dataclass(frozen=True)
class CreditResult:
    """What :func:`estimate` returns: ``advantages`` (rows,) for a turn-level estimator or (rows, tokens) on
    the inputs' token grid for a token-level one; ``details`` the intermediate per-row numbers (only with
    ``return_details``: ``prior``, ``belief``, ``delta_belief``, ``weight`` for AgentOPSD; ``step_return``,
    ``step_advantage``, ``anchor_size`` for GiGPO)."""

    advantages: Tensor
    granularity: str
    details: Mapping[str, Tensor] = field(default_factory=dict)

    def token_advantages(
        self, token_mask: Tensor, *, row_offset: Tensor | None = None, row_max: Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> list[Tensor]:
        """One 1-D tensor per row with an advantage per response token (the mask's True positions, in
        order): a turn-level value repeated, or the token-level grid read under the mask; ``row_max`` (rows,)
        caps the estimator's value of every token of its row (``inf``: no cap), then ``row_offset`` (rows,) is
        added to every token of its row (e.g. a per-turn penalty term)."""
        mask = token_mask.bool()
        lengths = mask.sum(1)
        adv = self.advantages
        if row_max is not None:
            cap = row_max.to(adv.dtype)
            adv = torch.minimum(adv, cap[:, None] if self.granularity == "token" else cap)
        if self.granularity == "token":
            flat = (adv if row_offset is None else adv + row_offset.to(adv.dtype)[:, None])[mask]
        else:
            flat = (adv if row_offset is None else adv + row_offset.to(adv.dtype)).repeat_interleave(lengths)
        return list(torch.split(flat.to(dtype or flat.dtype), lengths.tolist()))


EstimatorFn = Callable[[CreditInputs, CreditConfig, "dict[str, Tensor] | None"], Tensor]
"""(inputs, config, details) -> advantages; fills ``details`` when it is a dict (else computes no extras)."""


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered estimator and what it needs, so callers dispatch on declarations, never on names."""

    name: str
    fn: EstimatorFn
    granularity: str = "turn"
    needs_teacher: bool = True
    needs_anchors: bool = False
    fixed_variant: str | None = None
    summary: str = ""
    needs_oracle: bool = False

    @property
    def required_inputs(self) -> tuple[str, ...]:
        """The optional :class:`CreditInputs` fields this estimator reads."""
        need: list[str] = []
        if self.needs_teacher:
            need += ["token_gaps", "token_mask"] if self.granularity == "token" else ["evidence"]
        if self.needs_anchors:
            need += ["group_ids", "anchor_keys", "turn_rewards"]
        if self.needs_oracle:
            need.append("oracle_progress")
        return tuple(need)

    def check_config(self, config: CreditConfig) -> None:
        """ValueError when ``config`` asks for something this estimator cannot honour."""
        if self.fixed_variant is not None and config.variant not in ("paper", self.fixed_variant):
            raise ValueError(
                f"estimator {self.name!r} fixes variant={self.fixed_variant!r}, but the config asks for "
                f"variant={config.variant!r}; use estimator 'agentopsd' with the config's variant, or "
                f"leave config.variant at 'paper'."
            )


_ESTIMATORS: dict[str, EstimatorSpec] = {}
ESTIMATORS: Mapping[str, EstimatorSpec] = MappingProxyType(_ESTIMATORS)
"""Read-only view of the registered estimators, by name; add to it with :func:`register_estimator`."""


def register_estimator(
    name: str,
    *,
    granularity: str = "turn",
    needs_teacher: bool = True,
    needs_anchors: bool = False,
    fixed_variant: str | None = None,
    needs_oracle: bool = False,
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator registering ``fn(inputs, config, details) -> advantages`` under ``name`` (names are unique)
    with what it needs: the teacher's evidence, anchor states and per-turn rewards, the oracle's progress,
    turn or token output."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity: expected one of {GRANULARITIES}, got {granularity!r}.")

    def decorate(fn: EstimatorFn) -> EstimatorFn:
        if name in _ESTIMATORS:
            raise ValueError(f"estimator {name!r} is already registered ({_ESTIMATORS[name].fn!r}).")
        summary = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        _ESTIMATORS[name] = EstimatorSpec(name, fn, granularity, needs_teacher, needs_anchors, fixed_variant, summary,
                                          needs_oracle)
        return fn

    return decorate


def estimator_spec(name: str) -> EstimatorSpec:
    """The registered spec of ``name``; ValueError listing the known names otherwise."""
    try:
        return _ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown estimator {name!r}; known: {sorted(_ESTIMATORS)}.") from None


def estimate(
    name: str, inputs: CreditInputs, config: CreditConfig = CreditConfig.PAPER, *, return_details: bool = False
) -> CreditResult:
    """Advantages from the estimator registered as ``name``; ``return_details`` also returns its intermediate
    numbers (copies made only then, so the training hot path pays nothing for them)."""
    spec = estimator_spec(name)
    spec.check_config(config)
    missing = [f for f in spec.required_inputs if getattr(inputs, f) is None]
    if missing:
        raise ValueError(f"estimator {name!r} needs {', '.join(missing)} in its CreditInputs.")
    details: dict[str, Tensor] | None = {} if return_details else None
    advantages = spec.fn(inputs, config, details)
    return CreditResult(advantages, spec.granularity, MappingProxyType(details) if details is not None else {})


def turn_advantages(
    name: str,
    seq_advantages: Tensor,
    evidence: Tensor,
    traj_ids: Tensor,
    turn_ids: Tensor,
    success_rate: Tensor,
    config: CreditConfig = CreditConfig.PAPER,
) -> Tensor:
    """Per-row advantages of a turn-level estimator that needs no anchors (shorthand for :func:`estimate`)."""
    inputs = CreditInputs(seq_advantages, traj_ids, turn_ids, success_rate, evidence=evidence)
    return estimate(name, inputs, config).advantages


def pad_ragged(seqs: Sequence[Tensor], dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """(rows, longest) grid of 1-D tensors packed left, zeros after, and its (rows, longest) bool mask."""
    if not seqs:
        return torch.zeros(0, 0, dtype=dtype), torch.zeros(0, 0, dtype=torch.bool)
    lengths = torch.tensor([s.numel() for s in seqs])
    grid = torch.nn.utils.rnn.pad_sequence([s.to(dtype) for s in seqs], batch_first=True)
    width = grid.shape[1] if grid.dim() == 2 else 0
    mask = torch.arange(width) < lengths[:, None]
    return grid.reshape(len(seqs), width), mask


def _evidence(inputs: CreditInputs) -> Tensor:
    assert inputs.evidence is not None  # estimate() checked required_inputs
    return inputs.evidence


def _step_term(inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None) -> Tensor:
    assert inputs.group_ids is not None and inputs.anchor_keys is not None and inputs.turn_rewards is not None
    step = gigpo_step_advantages(
        inputs.traj_ids, inputs.turn_ids, inputs.group_ids, inputs.anchor_keys,
        inputs.turn_rewards.to(inputs.seq_advantages.dtype), turn_penalties=inputs.turn_penalties,
        step_gamma=config.step_gamma, step_norm=config.step_norm, eps=config.eps, details=details,
    )
    if details is not None:
        details["step_advantage"] = step
    return step


@register_estimator("grpo", needs_teacher=False)
def _grpo_estimator(inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None) -> Tensor:
    """GRPO: every turn keeps its trajectory's advantage."""
    _check_1d_same_length(seq_advantages=inputs.seq_advantages, traj_ids=inputs.traj_ids,
                          turn_ids=inputs.turn_ids, success_rate=inputs.success_rate)
    _check_floating("seq_advantages", inputs.seq_advantages)
    return inputs.seq_advantages.clone()


@register_estimator("agentopsd")
def _agentopsd_estimator(inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None) -> Tensor:
    """AgentOPSD with ``config.variant`` (the paper form unless the config says otherwise)."""
    return _agentopsd_rows(inputs.seq_advantages, _evidence(inputs), inputs.traj_ids, inputs.turn_ids,
                           inputs.success_rate, config, details)


def _make_ablation(variant: str) -> EstimatorFn:
    def estimator(inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None) -> Tensor:
        cfg = replace(config, variant=variant)
        return _agentopsd_rows(inputs.seq_advantages, _evidence(inputs), inputs.traj_ids, inputs.turn_ids,
                               inputs.success_rate, cfg, details)

    estimator.__name__ = f"_agentopsd_{variant}_estimator"
    estimator.__doc__ = f"AgentOPSD ablation {variant!r} (docs/method.md, 'Ablations')."
    return estimator


for _variant in VARIANTS[1:]:
    register_estimator(f"agentopsd-{_variant}", fixed_variant=_variant)(_make_ablation(_variant))
del _variant


@register_estimator("agentopsd-oracle", needs_teacher=False, needs_oracle=True)
def _agentopsd_oracle_estimator(
    inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None
) -> Tensor:
    """AgentOPSD on oracle evidence (the distance each turn closed): a diagnostic upper bound, privileged state."""
    assert inputs.oracle_progress is not None
    evidence = oracle_evidence(inputs.oracle_progress.to(inputs.seq_advantages.dtype))
    if details is not None:
        details["evidence"] = evidence
    return _agentopsd_rows(inputs.seq_advantages, evidence, inputs.traj_ids, inputs.turn_ids, inputs.success_rate,
                           config, details)


@register_estimator("agentopsd-token", granularity="token", fixed_variant="paper")
def _agentopsd_token_estimator(
    inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None
) -> Tensor:
    """AgentOPSD over the response tokens of each turn (the released WebShop / Search-QA variant)."""
    assert inputs.token_gaps is not None and inputs.token_mask is not None
    return _agentopsd_token_grid(inputs.seq_advantages, inputs.token_gaps, inputs.token_mask,
                                 inputs.success_rate, config, details)


@register_estimator("gigpo", needs_teacher=False, needs_anchors=True)
def _gigpo_estimator(inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None) -> Tensor:
    """GiGPO: episode advantage plus ω × the anchor-state step advantage (verl-agent)."""
    _check_1d_same_length(seq_advantages=inputs.seq_advantages, traj_ids=inputs.traj_ids)
    _check_floating("seq_advantages", inputs.seq_advantages)
    return torch.add(inputs.seq_advantages, _step_term(inputs, config, details), alpha=config.omega)


@register_estimator("agentopsd+gigpo", needs_anchors=True)
def _agentopsd_gigpo_estimator(
    inputs: CreditInputs, config: CreditConfig, details: dict[str, Tensor] | None
) -> Tensor:
    """AgentOPSD-reshaped episode advantage plus ω × GiGPO's step advantage (see agentopsd_gigpo_advantages)."""
    opsd = _agentopsd_rows(inputs.seq_advantages, _evidence(inputs), inputs.traj_ids, inputs.turn_ids,
                           inputs.success_rate, config, details)
    return torch.add(opsd, _step_term(inputs, config, details), alpha=config.omega)
