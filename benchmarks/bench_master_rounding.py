"""How much of a bf16 run's update reached its model: the float32 masters of a checkpoint against the bf16 weights
rounded from them, both measured from the warm start the run began at (prints a table, writes JSON).

A bf16 run's optimiser steps float32 master weights and rounds them into the model. Masters copied from bf16
weights sit on the rounding grid, so a weight moves only once its master has drifted half a rounding cell. From
the checkpoint's masters (`trainer_state.pt`: the torch engine's `master_weights` or DeepSpeed ZeRO-0's
`fp32_groups`), its bf16 model and the warm start's weights, this reports the masters' drift in cells, the share
of bf16 weights that moved, and the projection of the model's change on the masters' drift (1 = the whole
first-order update reached the model); then the same drift replayed from masters dithered within their cells
(`optim.dither_masters`, three draws).

    python benchmarks/bench_master_rounding.py --checkpoint RUN/checkpoints/step_000008 \\
        --warm-start ~/.cache/agentgym_opsd/warm_start/KEY/model --out benchmarks/results/master_rounding.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
from harness import cpu_model  # noqa: E402

from agentgym_opsd.models.precision import rounding_cell  # noqa: E402
from agentgym_opsd.trainer.engine import dither_masters  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def checkpoint_masters(state: dict) -> list[torch.Tensor]:
    """The float32 masters of a checkpoint's `trainer_state.pt`, in the order of the model's trainable parameters."""
    engine = state["engine"]
    if engine.get("master_weights") is not None:
        return list(engine["master_weights"])
    groups = engine.get("optimizer", {}).get("fp32_groups")
    if groups:
        return [m for group in groups for m in group]
    raise ValueError("the checkpoint holds no float32 master weights (a float32 run, or ZeRO >= 1)")


def trainable_names(model_dir: Path, masters: list[torch.Tensor]) -> list[str]:
    """The parameter names the masters belong to: trainable layers are the model's last ones, so the masters are
    the tail of `named_parameters()` (a tied LM head is not listed); checked shape by shape."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    named = list(model.named_parameters())[-len(masters):]
    if [tuple(p.shape) for _, p in named] != [tuple(m.shape) for m in masters]:
        raise ValueError("the masters do not match the model's last parameters (LoRA, or another model)")
    return [name for name, _ in named]


def run_relative(checkpoint: Path) -> str:
    """The checkpoint as `<arm>/<seed>/checkpoints/step_N`: which run it was, without this machine's folders."""
    return "/".join(checkpoint.resolve().parts[-4:])


def measure(masters: list[torch.Tensor], start: list[torch.Tensor], now: list[torch.Tensor],
            draws: int = 3) -> dict:
    m = torch.cat([x.float().flatten() for x in masters])
    w0 = torch.cat([x.flatten() for x in start])
    w = torch.cat([x.float().flatten() for x in now])
    drift, change = m - w0.float(), w - w0.float()
    down, up = rounding_cell(w0)
    cell = torch.where(drift >= 0, up, down)
    steps = drift.abs() / cell.clamp_min(torch.finfo(torch.float32).tiny)

    drift64 = drift.double()  # sums over tens of millions of terms: float32's would move with the thread count

    def summary(model_change: torch.Tensor) -> dict[str, float]:
        change = model_change.double()
        return {"weights_changed": float((model_change != 0).double().mean()),
                "projection": float(change @ drift64 / (drift64 @ drift64)),
                "cosine": float(change @ drift64 / (change.norm() * drift64.norm())),
                "norm_ratio": float(change.norm() / drift64.norm())}

    out = {"weights": int(m.numel()), "model_rounded_from_masters": bool(torch.equal(m.to(w0.dtype).float(), w)),
           "drift_cells_median": float(steps.median()), "drift_over_half_cell": float((steps > 0.5).float().mean()),
           "on_grid": summary(change), "dithered": []}
    for k in range(draws):
        start_masters = torch.empty_like(m)
        dither_masters([(w0, start_masters)], seed=k)
        out["dithered"].append(summary((start_masters + drift).to(w0.dtype).float() - w0.float()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True, help="a bf16 run's checkpoints/step_N folder")
    ap.add_argument("--warm-start", type=Path, required=True, help="the model folder the run started from")
    ap.add_argument("--out", type=Path, default=RESULTS / "master_rounding.json")
    args = ap.parse_args()
    state = torch.load(args.checkpoint / "trainer_state.pt", map_location="cpu", weights_only=False)
    masters = checkpoint_masters(state)
    names = trainable_names(args.checkpoint / "model", masters)
    start = load_file(str(args.warm_start / "model.safetensors"))
    now = load_file(str(args.checkpoint / "model" / "model.safetensors"))
    result = measure(masters, [start[n] for n in names], [now[n] for n in names])
    result.update({"checkpoint": run_relative(args.checkpoint), "warm_start": args.warm_start.parent.name,
                   "step": int(state.get("step", 0)), "cpu": cpu_model()})
    table = Table(title=f"{result['weights']:,} bf16 weights, step {result['step']}: the masters moved a median "
                        f"{result['drift_cells_median']:.2f} cells ({100 * result['drift_over_half_cell']:.0f}% "
                        "past half a cell)")
    for col in ("masters start", "weights moved", "projection on the masters' drift", "cosine", "norm ratio"):
        table.add_column(col, justify="right")
    for label, row in [("on the grid (as run)", result["on_grid"]),
                       *[(f"dithered, draw {k}", r) for k, r in enumerate(result["dithered"])]]:
        table.add_row(label, f"{100 * row['weights_changed']:.1f}%", f"{row['projection']:.2f}",
                      f"{row['cosine']:.2f}", f"{row['norm_ratio']:.2f}")
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
