"""Credit-assignment settings: :class:`CreditConfig` (one validated set of hyper-parameters for every
estimator), its error :class:`CreditConfigError`, and the choices ``VARIANTS`` and ``STEP_NORMS``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

VARIANTS: tuple[str, ...] = ("paper", "raw_gap", "unsigned", "no_prior")
"""AgentOPSD variants: the paper method and the three ablations it reports (docs/method.md, "Ablations")."""

STEP_NORMS: tuple[str, ...] = ("mean_norm", "mean_std_norm")
"""How GiGPO normalises a step return within its anchor group: centre only, or centre and divide by the std."""


class CreditConfigError(ValueError):
    """A credit hyper-parameter out of its range; ``field`` names it so a caller can re-key the message
    (the trainer's config says ``algorithm.lam`` where this says ``CreditConfig.lam``)."""

    def __init__(self, field_name: str, expected: str, value: object) -> None:
        self.field = field_name
        self.expected = expected
        self.value = value
        super().__init__(f"CreditConfig.{field_name}: expected {expected}, got {value!r}.")


# The one table of valid ranges: CreditConfig checks itself against it and the trainer's AlgorithmConfig
# validates through CreditConfig, so a range is written down once. Every predicate is written so that NaN fails.
RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "lam": (lambda v: 0.0 <= v <= 1.0, "0 ≤ lam ≤ 1"),
    "band": (lambda v: 0.0 < v < 1.0, "0 < band < 1"),
    "gamma": (lambda v: 0.0 < v <= 1.0, "0 < gamma ≤ 1"),
    "eps0": (lambda v: 0.0 < v < 0.5, "0 < eps0 < 0.5"),
    "eps": (lambda v: 0.0 < v < 0.5, "0 < eps < 0.5"),
    "omega": (lambda v: 0.0 <= v < math.inf, "0 ≤ omega < inf"),
    "step_gamma": (lambda v: 0.0 <= v <= 1.0, "0 ≤ step_gamma ≤ 1"),
}
_CHOICES: dict[str, tuple[str, ...]] = {"variant": VARIANTS, "step_norm": STEP_NORMS}


@dataclass(frozen=True)
class CreditConfig:
    """Hyper-parameters of credit assignment (defaults: the AgentOPSD paper and GiGPO's released recipe)."""

    lam: float = field(default=0.5, metadata={"help": "λ: mix between GRPO (0) and fully reshaped (1)."})
    band: float = field(default=0.2, metadata={"help": "b: per-turn weight is clipped to [1 − b, 1 + b]."})
    gamma: float = field(default=0.95, metadata={"help": "γ: discount of older evidence in the belief (1 = released "
                                                         "code)."})
    eps0: float = field(default=1e-3, metadata={"help": "ε0: the prior B_0 is clipped to [ε0, 1 − ε0]."})
    eps: float = field(default=1e-6, metadata={"help": "ε: belief clamp and std guard for numerical safety."})
    variant: str = field(default="paper", metadata={"help": f"one of {VARIANTS} (paper or an ablation)."})
    omega: float = field(default=1.0, metadata={"help": "ω: weight of GiGPO's step-level advantage."})
    step_gamma: float = field(default=0.95, metadata={"help": "GiGPO: discount of the per-step returns."})
    step_norm: str = field(default="mean_norm", metadata={"help": f"GiGPO anchor-group normalisation {STEP_NORMS}."})

    PAPER: ClassVar[CreditConfig]
    """The paper's defaults (λ=0.5, b=0.2, γ=0.95, ε0=1e-3, ε=1e-6)."""
    RELEASE: ClassVar[CreditConfig]
    """What the released code runs: a plain cumulative sum (γ=1) and ε0=1e-4."""

    def __post_init__(self) -> None:
        for name, (ok, expected) in RANGES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(float(value)):
                raise CreditConfigError(name, expected, value)
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                raise CreditConfigError(name, f"one of {choices}", getattr(self, name))

    def agentopsd_kwargs(self) -> dict[str, float | str]:
        """The keyword arguments of :func:`agentopsd_advantages` (the GiGPO fields left out)."""
        return {k: getattr(self, k) for k in ("lam", "band", "gamma", "eps0", "eps", "variant")}


CreditConfig.PAPER = CreditConfig()
CreditConfig.RELEASE = CreditConfig(gamma=1.0, eps0=1e-4)
