"""Replay a run's recorded steps under other advantage recipes: what would each have done to the same rows?

    python benchmarks/replay_credit.py runs/study/alfworld/agentopsd/seed0 [--penalty 0.1] [--json OUT]

Reads `trajectories/step_N.jsonl` and the teacher evidence e_k of `credit/step_N.jsonl` (no model is run) and
recomputes every row's advantage with the trainer's own composition (`trainer.advantages.batch_advantages`)
under each recipe: the CPU presets' (`penalty_mode=outcome`) and the released bookkeeping the presets used
before (`penalty_mode=turn` with cross-step statistics), each for GRPO and AgentOPSD. Per recipe: turn rows
of lost rollouts, how many get a positive advantage and the largest, the mean |advantage| of penalised
rows against the mean |A_seq|, and how far AgentOPSD moves a row from GRPO (max |Ã − A| / |A|).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from agentgym_opsd.credit import CreditConfig
from agentgym_opsd.records import load_jsonl
from agentgym_opsd.trainer.advantages import batch_advantages
from agentgym_opsd.trainer.turn_batch import build_turn_batch

RECIPES = {"outcome (CPU presets now)": ("outcome", False), "turn + cross-step (released, before)": ("turn", True)}


def replay(run: Path, penalty: float) -> dict[str, dict[str, float]]:
    totals: dict[str, dict[str, float]] = {}
    for traj_file in sorted((run / "trajectories").glob("step_*.jsonl")):
        trajs = load_jsonl(traj_file)
        credit_file = run / "credit" / traj_file.name
        evidence_of = {}
        if credit_file.is_file():
            for text in credit_file.read_text(encoding="utf-8").splitlines():
                line = json.loads(text)
                for turn in line["turns"]:
                    evidence_of[(line["traj_id"], turn["turn"])] = float(turn.get("evidence") or 0.0)
        for recipe, (mode, cross) in RECIPES.items():
            batch = build_turn_batch(trajs, encode_prompt=lambda m: [0], teacher_messages=None,
                                     invalid_penalty=penalty, penalty_mode=mode)
            evidence = torch.tensor([evidence_of.get((r.traj_id, r.turn_id), 0.0) for r in batch.rows],
                                    dtype=torch.float64)
            gaps = [torch.full((len(r.response_ids),), float(e) / max(len(r.response_ids), 1))
                    for r, e in zip(batch.rows, evidence.tolist(), strict=True)]
            out = {est: batch_advantages(batch, evidence, gaps, estimator=est, config=CreditConfig(), cross_steps=cross)
                   for est in ("grpo", "agentopsd")}
            for est, adv in out.items():
                t = totals.setdefault(f"{recipe} / {est}", dict.fromkeys(
                    ("lost_rows", "lost_rows_positive", "max_positive_lost", "penalised_rows", "penalty_abs_sum",
                     "seq_abs_sum", "rows", "max_rel_change_vs_grpo"), 0.0))
                row_adv = [float(a.double().mean()) if a.numel() else 0.0 for a in adv.tokens]
                grpo = [float(a.double().mean()) if a.numel() else 0.0 for a in out["grpo"].tokens]
                for row, ti in enumerate(batch.traj_index.tolist()):
                    seq = float(adv.seq[ti])
                    t["rows"] += 1
                    t["seq_abs_sum"] += abs(seq)
                    if batch.rows[row].penalty:
                        t["penalised_rows"] += 1
                        t["penalty_abs_sum"] += abs(row_adv[row])
                    if not trajs[ti].won:
                        t["lost_rows"] += 1
                        if row_adv[row] > 0:
                            t["lost_rows_positive"] += 1
                            t["max_positive_lost"] = max(t["max_positive_lost"], row_adv[row])
                    base = grpo[row] - float(adv.penalty[row])
                    if abs(base) > 1e-12:
                        change = abs(row_adv[row] - grpo[row]) / abs(base)
                        t["max_rel_change_vs_grpo"] = max(t["max_rel_change_vs_grpo"], change)
    for t in totals.values():
        t["mean_abs_penalised_row"] = t.pop("penalty_abs_sum") / max(t["penalised_rows"], 1)
        t["mean_abs_seq"] = t.pop("seq_abs_sum") / max(t["rows"], 1)
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--penalty", type=float, default=0.1, help="the invalid-action penalty (ALFWorld: 0.1)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result = {str(run): replay(run, args.penalty) for run in args.runs}
    for run, totals in result.items():
        print(run)
        for recipe, t in totals.items():
            print(f"  {recipe:45s} lost-rollout rows {int(t['lost_rows']):4d}, positive {int(t['lost_rows_positive']):4d}"
                  f" (max {t['max_positive_lost']:+.2f}); penalised rows |A| {t['mean_abs_penalised_row']:.2f} vs "
                  f"mean |A_seq| {t['mean_abs_seq']:.2f}; max |Ã−A|/|A| vs GRPO {t['max_rel_change_vs_grpo']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
