"""Oracle evidence: AgentOPSD's belief driven by the environment's own progress instead of a teacher.

A diagnostic upper bound, not a method a deployed agent can use: it reads the oracle's distance to the goal
(`info["oracle_distance"]`, privileged state), so it answers "if the teacher ranked the turns perfectly, would
redistributing A_seq over them help?" The evidence of turn k is the distance it closed,

    e_k = NATS_PER_STEP · (d_before − d_after)     (0 where the environment reported no distance),

in the belief's own unit (log-odds of success, as the teacher's summed log-prob gap is): a step towards the
goal raises the belief, a step away lowers it, a wasted turn leaves it where it was. The belief, the prior and
the bounded re-weighting are AgentOPSD's (`agentopsd._agentopsd_rows`), so zero progress everywhere is GRPO.
"""

from __future__ import annotations

import torch
from torch import Tensor

NATS_PER_STEP = 1.0
"""Log-odds of success one step of closed oracle distance is worth. The re-weighting z-scores ΔB_k within a
trajectory, so the value sets how fast the belief saturates, not which turns gain."""


def oracle_evidence(progress: Tensor) -> Tensor:
    """e_k of every row from ``progress`` (rows,) d_before − d_after, NaN where the distance is unknown.

    ValueError when no row has a distance: the estimator would silently be GRPO on an environment that
    reports none."""
    known = ~torch.isnan(progress)
    if progress.numel() and not bool(known.any()):
        raise ValueError("oracle evidence needs info['oracle_distance'] from the environment, and no turn of "
                         "this batch reported one; pick another estimator for this environment")
    return torch.where(known, progress, 0.0) * NATS_PER_STEP
