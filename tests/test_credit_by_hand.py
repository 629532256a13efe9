"""AgentOPSD on a three-turn trajectory computed by hand (two-turn cases make z = ±1 whatever the evidence,
so they cannot catch a wrong belief recursion; here the beliefs differ and one weight hits the band).

    e = [1.0, -0.5, 2.0], R̄ = 0.5 (B_0 = 0.5, logit 0), γ = 0.95, λ = 0.5, b = 0.2
    c   = [1.0, 0.95·1.0 − 0.5 = 0.45, 0.95·0.45 + 2.0 = 2.4275]
    B   = σ(c) = [0.731059, 0.610639, 0.918900]
    ΔB  = [0.231059, −0.120419, 0.308261]
    won (A = +1): q = ΔB, mean 0.139634, population std 0.186573
        z = [0.490037, −1.393880, 0.903842] -> w = clip(1 + 0.2 z, 0.8, 1.2) = [1.098007, 0.8 (clipped), 1.180768]
        Ã = 0.5 + 0.5 w = [1.049004, 0.9, 1.090384]
    lost (A = −1): q = −ΔB, z flips sign -> w = [0.901993, 1.2 (clipped), 0.819232]
        Ã = −(0.5 + 0.5 w) = [−0.950996, −1.1, −0.909616]: the turn that lowered the belief takes the most blame
"""

from __future__ import annotations

import pytest
import torch

from agentgym_opsd import credit

EVIDENCE = [1.0, -0.5, 2.0]


def _run(a_seq: float, order: list[int]) -> list[float]:
    """The three turns fed in the given row order (rows may arrive in any order); returns Ã by turn."""
    turn_ids = torch.tensor(order)
    out = credit.agentopsd_advantages(
        torch.full((3,), a_seq, dtype=torch.float64), torch.tensor([EVIDENCE[k] for k in order], dtype=torch.float64),
        torch.zeros(3, dtype=torch.long), turn_ids, torch.full((3,), 0.5, dtype=torch.float64),
        lam=0.5, band=0.2, gamma=0.95, eps0=1e-3, eps=1e-6)
    return [float(out[order.index(k)]) for k in range(3)]


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1]])
def test_three_turns_by_hand(order: list[int]) -> None:
    assert _run(1.0, order) == pytest.approx([1.049004, 0.9, 1.090384], abs=1e-6)
    assert _run(-1.0, order) == pytest.approx([-0.950996, -1.1, -0.909616], abs=1e-6)
