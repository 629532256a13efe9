"""Evaluation: run any policy on registered environments, summarise, report and plot.

`evaluate_policy(policy, "ALFWorld-v0:valid_unseen", episodes=...)` is the one code path the suite CLI
(`python -m agentgym_opsd.evaluate`) and the trainer's periodic validation share; `make_policy(spec)` builds
a policy from a spec string (`hf:...`, `vllm:...`, `openai:URL`, `random`, `oracle`). Reports and plots
live in `reports` and `plots` (matplotlib is imported only there).
"""

from agentgym_opsd.evaluation.metrics import GroupStats, HorizonFit, fit_horizon, wilson_interval
from agentgym_opsd.evaluation.policy_spec import POLICY_KINDS, PolicySpecError, make_policy, parse_policy_spec
from agentgym_opsd.evaluation.runner import EVAL_SEED, EvalSummary, evaluate_policy, summarize

__all__ = [
    "EVAL_SEED",
    "POLICY_KINDS",
    "EvalSummary",
    "GroupStats",
    "HorizonFit",
    "PolicySpecError",
    "evaluate_policy",
    "fit_horizon",
    "make_policy",
    "parse_policy_spec",
    "summarize",
    "wilson_interval",
]
