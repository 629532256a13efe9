"""Credit assignment: GRPO group advantages, AgentOPSD turn-level reshaping, GiGPO and their combination.

AgentOPSD (docs/method.md) redistributes a trajectory's GRPO advantage ``A_seq`` over its turns. The model, given
privileged skill context, supplies per-turn evidence ``e_k`` (teacher minus student log-prob of the sampled
turn). A recursive log-odds belief of success is anchored at the group success rate:

    B_0 = clip(R̄, ε0, 1 − ε0),   c_k = γ c_(k−1) + e_k,   B_k = σ(logit(B_0) + c_k),   ΔB_k = B_k − B_(k−1)

and each turn's share is a bounded re-weighting of ``A_seq``:

    q_k = sign(A_seq) ΔB_k,   z_k = standardise(q) within the trajectory,
    w_k = clip(1 + b z_k, 1 − b, 1 + b),   Ã_k = A_seq [(1 − λ) + λ w_k].

GiGPO (verl-agent) adds a step-level advantage computed within anchor-state groups (turns of one task group
that acted on the same state): ``Ã_k = A_seq + ω (G_k − mean_anchor G)`` (optionally ``/ std``), with G_k the
discounted return of per-turn rewards; ``agentopsd+gigpo`` adds the same step term to AgentOPSD's Ã_k.

The package, one concern a module (everything public is re-exported here):
  ``config``           :class:`CreditConfig`, its ranges and :class:`CreditConfigError`
  ``grpo``             GRPO group advantages and the invalid-action penalty bookkeeping
  ``agentopsd``        AgentOPSD at turn level (the paper): the evidence forms e_k, the turn rows' grid, the
                       belief and the bounded re-weighting, the discounted scan
  ``agentopsd_token``  AgentOPSD at token level (the released WebShop / Search-QA variant)
  ``gigpo``            GiGPO's step advantage and AgentOPSD + GiGPO
  ``oracle``           the oracle's progress as e_k (a diagnostic bound: privileged state)
  ``registry``         named estimators; the trainer picks one by name through :func:`estimate`
  ``reference``        the slow, obvious loops the tests and the benchmark check the fast paths against
  ``_checks``          input validation
"""

from agentgym_opsd.credit.agentopsd import (
    CHOICE_NORMS,
    EVIDENCE_FORMS,
    ChoiceScores,
    EvidenceInputs,
    EvidenceResult,
    agentopsd_advantages,
    choice_evidence,
    compute_evidence,
)
from agentgym_opsd.credit.agentopsd_token import agentopsd_token_advantages
from agentgym_opsd.credit.config import STEP_NORMS, VARIANTS, CreditConfig, CreditConfigError
from agentgym_opsd.credit.gigpo import (
    agentopsd_gigpo_advantages,
    anchor_groups,
    gigpo_advantages,
    gigpo_step_advantages,
    step_discounted_returns,
)
from agentgym_opsd.credit.grpo import (
    grpo_advantages,
    grpo_turn_penalty_advantages,
    outcome_penalty_advantages,
)
from agentgym_opsd.credit.reference import reference_agentopsd_advantages, reference_gigpo_step_advantages
from agentgym_opsd.credit.registry import (
    ESTIMATORS,
    GRANULARITIES,
    CreditInputs,
    CreditResult,
    EstimatorFn,
    EstimatorSpec,
    estimate,
    estimator_spec,
    pad_ragged,
    register_estimator,
    turn_advantages,
)

__all__ = [
    "CHOICE_NORMS",
    "ESTIMATORS",
    "EVIDENCE_FORMS",
    "GRANULARITIES",
    "STEP_NORMS",
    "VARIANTS",
    "CreditConfig",
    "ChoiceScores",
    "CreditConfigError",
    "CreditInputs",
    "CreditResult",
    "EstimatorFn",
    "EstimatorSpec",
    "EvidenceInputs",
    "EvidenceResult",
    "agentopsd_advantages",
    "agentopsd_gigpo_advantages",
    "agentopsd_token_advantages",
    "anchor_groups",
    "choice_evidence",
    "compute_evidence",
    "estimate",
    "estimator_spec",
    "gigpo_advantages",
    "gigpo_step_advantages",
    "grpo_advantages",
    "grpo_turn_penalty_advantages",
    "outcome_penalty_advantages",
    "pad_ragged",
    "reference_agentopsd_advantages",
    "reference_gigpo_step_advantages",
    "register_estimator",
    "step_discounted_returns",
    "turn_advantages",
]
