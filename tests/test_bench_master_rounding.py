"""`benchmarks/bench_master_rounding.py`: how much of the masters' drift reached the bf16 model, as run (masters on
the grid) and replayed from dithered masters."""

from __future__ import annotations

import pytest
import torch
from benchmark_scripts import load_benchmark

from agentgym_opsd.models.precision import rounding_cell

bench = load_benchmark("bench_master_rounding")


def test_a_drift_below_half_a_cell_reaches_the_model_only_from_dithered_masters() -> None:
    start = torch.full((100_000,), 0.1).to(torch.bfloat16)
    _, up = rounding_cell(start)
    masters = start.float() + 0.2 * up  # every master a fifth of a cell up
    result = bench.measure([masters], [start], [masters.to(torch.bfloat16)], draws=1)
    assert result["model_rounded_from_masters"] and result["drift_cells_median"] == pytest.approx(0.2, rel=1e-3)
    assert result["on_grid"]["weights_changed"] == 0.0 and result["on_grid"]["projection"] == 0.0
    dithered = result["dithered"][0]
    assert dithered["projection"] == pytest.approx(1.0, abs=0.03)
    assert dithered["weights_changed"] == pytest.approx(0.2, abs=0.01)


def test_the_masters_of_either_engine_are_found() -> None:
    masters = [torch.zeros(2), torch.ones(3)]
    assert bench.checkpoint_masters({"engine": {"master_weights": masters}}) == masters
    ds = {"engine": {"optimizer": {"fp32_groups": [masters]}}}
    assert bench.checkpoint_masters(ds) == masters
    with pytest.raises(ValueError, match="no float32 master"):
        bench.checkpoint_masters({"engine": {"optimizer": {}}})
