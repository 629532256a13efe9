"""The update pass, padded vs packed, side by side on the same rows (issue 23: the phase furthest from its limit).

    python benchmarks/bench_update_path.py                      # SmolLM2-135M, 16 real ALFWorld turn rows
    python benchmarks/bench_update_path.py --candidates         # + eager attention, head-only trim, same buckets
    python benchmarks/bench_update_path.py --model ~/.cache/agentgym_opsd/warm_start/<key>/model --rows 8
    python benchmarks/bench_update_path.py --quick              # tiny random model: a smoke check in seconds

What one micro-batch of `Trainer.update` costs: forward + backward of the policy objective (top
`--trainable-layers` of 30 layers trained, as `cpu-learn`), over the micro-batches the trainer would cut from
`--rows` turn rows (`optim.micro_batch_tokens` 2048, `micro_batch_rows` 16). The rows are real: oracle turns of
ALFWorld `easy` rendered as the policy sees them (history 2) and drawn at random, so their lengths mix as a
shuffled PPO mini-batch's do. No optimiser step (AdamW is < 1% of the phase).

Variants (the first is the old path, the second and third what the trainer runs):
- padded: `collate` + `response_logprobs` (left-padded micro-batches, rows x longest <= budget, SDPA with a
  padding mask, LM head on the last R+1 positions of every row).
- packed: `pack` + `packed_response_logprobs` (rows end to end, real-token budget, causal SDPA per row, LM
  head on response positions only).
- packed, trunk kept: the trainer's path where a π_old pass ran: the packed layout from each row's output of the
  frozen blocks, which that pass kept (`trainer/frozen_trunk.py`; the pass itself is not timed: it runs anyway).
  The FLOP count (and "% of limit") still counts the frozen blocks' forward.
- with `--candidates`: padded with eager attention; padded with the LM head on response positions only (what
  the head trim alone gives); packed on the padded path's buckets (what removing the padding gives at equal
  micro-batches).

Each round runs every variant once, in turn (every other round in reverse order), so machine noise hits all
of them; the table gives the best round's seconds, and the ratio of the best and of the medians. CPU seconds
(the process's, all threads) are the measure on a shared machine: wall seconds include the time other
processes held the cores. "% of limit" = the model FLOPs (benchmarks/bench_roofline.py's count: real tokens,
causal pairs, LM head on response positions) / the best fp32 matmul rate measured here (best of 5 square 512
and 1024 `torch.mm`, before and after), per CPU second.
Equality: every variant's response log-probs, entropies, loss and trainable-parameter gradients against the
padded path's (max abs diff; gradients relative to their largest entry). Writes
benchmarks/results/update_path.json (`--quick`: runs/update-path-quick.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from bench_roofline import ModelShape, backward_flops, forward_flops, measure_peak_flops
from harness import cpu_model
from rich.console import Console
from rich.table import Table

from agentgym_opsd.models.loading import freeze_lower_layers, load_policy_model
from agentgym_opsd.trainer.frozen_trunk import TrunkCache, frozen_depth
from agentgym_opsd.trainer.logprobs import (
    bucket_micro_batches,
    collate,
    pack,
    packed_batched_response_logprobs,
    packed_response_logprobs,
    response_logprobs,
)
from agentgym_opsd.trainer.losses import policy_objective

RESULTS = Path(__file__).parent / "results"
ENV = "ALFWorld-v0:easy"
Rows = tuple[list[list[int]], list[list[int]]]  # prompts, responses


# ---- the rows -------------------------------------------------------------------------------------------------
def alfworld_rows(tok: Any, want: int, seed: int) -> Rows:
    """`want` oracle turn rows of ALFWorld `easy` (prompt ids as the policy sees them, history 2; the reply
    the warm start imitates), drawn at random from the turns of 16 episodes."""
    from agentgym_opsd.models.hf_policy import chat_prompt_ids, text_ids
    from agentgym_opsd.prompts import PromptRenderer
    from agentgym_opsd.registry import env_profile
    from agentgym_opsd.rollout import RolloutRunner
    from agentgym_opsd.trainer.task_stream import train_task_specs
    from agentgym_opsd.trainer.warm_start import collect_demonstrations

    profile = env_profile("agentgym_opsd/ALFWorld-v0")
    renderer = PromptRenderer(profile.system_prompt, history_turns=2)
    runner = RolloutRunner(ENV, num_envs=8, env_kwargs={"max_turns": 10}, renderer=renderer, use_skills=True)
    try:
        trajs = collect_demonstrations(runner, train_task_specs(0, 16, num_tasks=120, seed=seed), batch=8)
    finally:
        runner.close()
    turns = [t for traj in trajs for t in traj.turns]
    random.Random(seed).shuffle(turns)
    rows = [(chat_prompt_ids(tok, t.prompt), text_ids(tok, t.response_text)) for t in turns]
    rows = [(list(p), list(r)) for p, r in rows if r][:want]
    if len(rows) < want:
        raise SystemExit(f"only {len(rows)} oracle turns, asked for {want} rows")
    return [p for p, _ in rows], [r for _, r in rows]


def random_rows(vocab: int, want: int, seed: int) -> Rows:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(20, 60))] for _ in range(want)]
    responses = [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 8))] for _ in range(want)]
    return prompts, responses


# ---- the variants ---------------------------------------------------------------------------------------------
LogProbs = Callable[[Any, list[int], Rows, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def padded(model: Any, idx: list[int], rows: Rows, pad_id: int):
    mb = collate(idx, *rows, pad_id)
    logp, ent = response_logprobs(model, mb, with_entropy=True)
    return logp, ent, mb.response_mask


def packed(model: Any, idx: list[int], rows: Rows, pad_id: int):
    pb = pack(idx, *rows)
    logp, ent = packed_response_logprobs(model, pb, with_entropy=True)
    return logp, ent, pb.response_mask


TRUNK: dict[str, TrunkCache] = {}
"""The frozen trunk's output of every row, kept by a π_old pass before the timing (the trainer's π_old pass runs
anyway; `trainer/frozen_trunk.py`)."""


def packed_trunk_kept(model: Any, idx: list[int], rows: Rows, pad_id: int):
    pb = pack(idx, *rows)
    trunk = TRUNK["cache"]
    logp, ent = packed_response_logprobs(model, pb, with_entropy=True, trunk=(trunk.depth, trunk.packed(idx)))
    return logp, ent, pb.response_mask


def keep_trunk(model: Any, rows: Rows, max_tokens: int, max_rows: int) -> None:
    """The π_old pass that keeps each row's trunk output for `packed_trunk_kept`."""
    cache = TrunkCache(frozen_depth(model), budget_bytes=1 << 34)
    packed_batched_response_logprobs(model, *rows, max_tokens=max_tokens, max_rows=max_rows, trunk_cache=cache)
    model.train()
    TRUNK["cache"] = cache


def padded_head_trim(model: Any, idx: list[int], rows: Rows, pad_id: int):
    """The padded decoder pass, then the LM head on the response positions only (candidate, not product code)."""
    mb = collate(idx, *rows, pad_id)
    width = mb.response_ids.shape[1]
    hidden = model.get_decoder()(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                                 position_ids=mb.position_ids, use_cache=False).last_hidden_state
    logits = model.get_output_embeddings()(hidden[:, -width - 1:-1][mb.response_mask]).float()  # (N, vocab)
    logp_all = torch.log_softmax(logits, dim=-1)
    flat = logp_all.gather(-1, mb.response_ids[mb.response_mask].unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)

    def unpack(x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(mb.response_mask.shape).masked_scatter(mb.response_mask, x)

    return unpack(flat), unpack(ent), mb.response_mask


@dataclass(frozen=True)
class Variant:
    name: str
    logprobs: LogProbs
    padded_budget: bool  # micro-batches cut by rows x longest (else by real tokens)
    attn: str = "sdpa"
    note: str = ""


VARIANTS = [Variant("padded (old)", padded, True, note="collate + response_logprobs"),
            Variant("packed (new)", packed, False, note="pack + packed_response_logprobs"),
            Variant("packed, trunk kept", packed_trunk_kept, False,
                    note="the trained blocks only, from the frozen trunk's output the π_old pass kept")]
CANDIDATES = [Variant("padded, eager attention", padded, True, attn="eager"),
              Variant("padded, head on responses", padded_head_trim, True),
              Variant("packed, padded buckets", packed, True)]


@contextlib.contextmanager
def attention(model: Any, name: str) -> Iterator[None]:
    before = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def micro_batches(rows: Rows, padded_budget: bool, max_tokens: int, max_rows: int) -> list[list[int]]:
    lengths = [len(p) + len(r) for p, r in zip(*rows, strict=True)]
    return bucket_micro_batches(lengths, max_tokens=max_tokens, max_rows=max_rows, padded=padded_budget)


def run_variant(model: Any, v: Variant, rows: Rows, batches: list[list[int]], pad_id: int, *,
                keep: bool) -> dict[str, Any]:
    """Forward + backward of the policy objective over `batches`; (wall, CPU) seconds, and with `keep` the
    per-row log-probs / entropies, the loss and the gradients (for the equality check)."""
    prompts, responses = rows
    num_tokens = sum(len(r) for r in responses)
    model.zero_grad(set_to_none=True)
    per_row: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    loss_sum, fwd = 0.0, [0.0, 0.0]
    with attention(model, v.attn):
        w0, c0 = time.perf_counter(), time.process_time()
        for idx in batches:
            f0, fc0 = time.perf_counter(), time.process_time()
            logp, ent, mask = v.logprobs(model, idx, rows, pad_id)
            width = mask.shape[1]
            old = torch.full_like(logp, -1.0)
            adv = torch.tensor([1.0 if i % 2 else -1.0 for i in idx]).unsqueeze(1).expand_as(logp)
            terms = policy_objective(logp, old, adv, mask, entropy=ent, ref_logp=None, clip_low=0.2, clip_high=0.28,
                                     kl_coef=0.0, entropy_coef=0.001, num_tokens=num_tokens)
            fwd[0] += time.perf_counter() - f0
            fwd[1] += time.process_time() - fc0
            terms.loss.backward()
            loss_sum += float(terms.loss.detach())
            if keep:
                for r, i in enumerate(idx):
                    n = len(responses[i])
                    per_row[i] = (logp[r, width - n:].detach().clone(), ent[r, width - n:].detach().clone())
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    out: dict[str, Any] = {"wall_s": wall, "cpu_s": cpu, "forward_wall_s": fwd[0], "forward_cpu_s": fwd[1]}
    if keep:
        out["rows"] = per_row
        out["loss"] = loss_sum
        out["grads"] = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def differences(new: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    rows = ref["rows"]

    def most(k: int) -> float:
        return max((float((new["rows"][i][k] - rows[i][k]).abs().max()) for i in rows if rows[i][k].numel()),
                   default=0.0)

    logp, ent = most(0), most(1)
    grad = max(float((new["grads"][k] - g).abs().max() / g.abs().max().clamp_min(1e-30)) for k, g in ref["grads"].items())
    return {"max_abs_diff_logp": logp, "max_abs_diff_entropy": ent, "abs_diff_loss": abs(new["loss"] - ref["loss"]),
            "max_rel_diff_grad": grad}


# ---- the FLOP count -------------------------------------------------------------------------------------------
def model_flops(shape: ModelShape, rows: Rows, trainable_layers: int) -> dict[str, int]:
    """Forward + backward model FLOPs of the update on these rows, wherever they are cut into micro-batches:
    real tokens, causal (query, key) pairs, the LM head on response positions; the tied head does not train."""
    lengths = [len(p) + len(r) for p, r in zip(*rows, strict=True)]
    tokens, pairs = sum(lengths), sum(n * (n + 1) // 2 for n in lengths)
    head = sum(len(r) for r in rows[1])
    fwd = forward_flops(shape, tokens, pairs, head)
    bwd = backward_flops(shape, tokens, pairs, head, trainable_layers=trainable_layers, head_trainable=False)
    return {"tokens": tokens, "attn_pairs": pairs, "head_positions": head, "forward": fwd, "backward": bwd}


def frozen_layers_recorded(model: Any, rows: Rows, pad_id: int) -> dict[str, int]:
    """Candidate 1 (frozen layers under no_grad): how many frozen decoder layers' outputs autograd records
    (require grad) on a real forward pass. Zero means there is nothing to gain: the graph starts at the first
    trainable layer already."""
    layers = model.get_decoder().layers
    frozen = [i for i, layer in enumerate(layers) if not any(p.requires_grad for p in layer.parameters())]
    seen: dict[int, bool] = {}
    hooks = [layers[i].register_forward_hook(
        lambda _m, _a, out, i=i: seen.__setitem__(i, (out[0] if isinstance(out, tuple) else out).requires_grad))
        for i in frozen]
    try:
        mb = collate([0], *rows, pad_id)
        response_logprobs(model, mb)
    finally:
        for h in hooks:
            h.remove()
    return {"frozen_layers": len(frozen), "frozen_layers_recorded_by_autograd": sum(seen.values())}


# ---- the run --------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct",
                    help="model spec or folder (a warm start's model/ folder: the timings do not depend on weights)")
    ap.add_argument("--rows", type=int, default=16, help="turn rows (cpu-learn's PPO mini-batch is 16)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds; each runs every variant once")
    ap.add_argument("--trainable-layers", type=int, default=12)
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    ap.add_argument("--micro-batch-rows", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the trainer's setting on 2 cores)")
    ap.add_argument("--candidates", action="store_true", help="also the candidate variants (see above)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="tiny random model and rows, 1 round: a smoke check")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/update_path.json)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    console = Console(width=200)
    quick = args.quick
    model, tok = load_policy_model("tiny-random" if quick else args.model)
    trainable = freeze_lower_layers(model, 1 if quick else args.trainable_layers)
    model.train()
    rows = random_rows(len(tok), args.rows, args.seed) if quick else alfworld_rows(tok, args.rows, args.seed)
    rounds = 1 if quick else args.rounds
    variants = VARIANTS + (CANDIDATES if args.candidates else [])
    shape = ModelShape.from_config(model.config)
    flops = model_flops(shape, rows, 1 if quick else args.trainable_layers)
    peak_before = measure_peak_flops((256,) if quick else (512, 1024), 5)
    frozen = frozen_layers_recorded(model, rows, tok.pad_token_id)
    lengths = [len(p) + len(r) for p, r in zip(*rows, strict=True)]
    plans = {v.name: micro_batches(rows, v.padded_budget, args.micro_batch_tokens, args.micro_batch_rows)
             for v in variants}
    keep_trunk(model, rows, args.micro_batch_tokens, args.micro_batch_rows)
    run_variant(model, variants[0], rows, plans[variants[0].name][:1], tok.pad_token_id, keep=False)  # warm-up
    times: dict[str, list[dict[str, float]]] = {v.name: [] for v in variants}
    kept: dict[str, dict[str, Any]] = {}
    for r in range(rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:  # ABBA: a drift in the machine's load hits all
            res = run_variant(model, v, rows, plans[v.name], tok.pad_token_id, keep=r == 0)
            if r == 0:
                kept[v.name] = {k: res.pop(k) for k in ("rows", "loss", "grads")}
            times[v.name].append(res)
            console.print(f"round {r + 1}/{rounds}  {v.name:28s} CPU {res['cpu_s']:7.2f} s  wall {res['wall_s']:7.2f} s")
    peak_after = measure_peak_flops((256,) if quick else (512, 1024), 5)
    peak = max(*peak_before.values(), *peak_after.values())
    total_flops = flops["forward"] + flops["backward"]

    base = variants[0].name
    best = {name: min(ts, key=lambda t: t["cpu_s"]) for name, ts in times.items()}
    results = []
    for v in variants:
        b = best[v.name]
        computed = sum(len(m) * max(lengths[i] for i in m) if v.padded_budget and v.logprobs not in (packed, packed_trunk_kept)
                       else sum(lengths[i] for i in m) for m in plans[v.name])
        diff = differences(kept[v.name], kept[base])
        results.append({
            "variant": v.name, "note": v.note, "attention": v.attn, "micro_batches": len(plans[v.name]),
            "tokens_computed": computed, "cpu_s": b["cpu_s"], "wall_s": b["wall_s"],
            "forward_cpu_s": b["forward_cpu_s"], "backward_cpu_s": b["cpu_s"] - b["forward_cpu_s"],
            "cpu_s_rounds": [t["cpu_s"] for t in times[v.name]], "wall_s_rounds": [t["wall_s"] for t in times[v.name]],
            "tokens_per_cpu_s": flops["tokens"] / b["cpu_s"], "tokens_per_wall_s": flops["tokens"] / b["wall_s"],
            "speedup_cpu": best[base]["cpu_s"] / b["cpu_s"],
            "speedup_cpu_median": statistics.median(t["cpu_s"] for t in times[base])
            / statistics.median(t["cpu_s"] for t in times[v.name]),
            "speedup_wall": statistics.median(t["wall_s"] for t in times[base])
            / statistics.median(t["wall_s"] for t in times[v.name]),
            "share_of_limit_per_cpu_s": total_flops / peak / b["cpu_s"], **diff})

    table = Table(title=f"update fwd+bwd: {len(lengths)} ALFWorld turn rows, {flops['tokens']} real tokens "
                        f"({flops['head_positions']} response), top {args.trainable_layers} layers train, "
                        f"{args.threads} thread(s), best of {rounds} rounds" if not quick else "update path (quick)")
    for col in ("variant", "micro-batches", "tokens computed", "CPU s", "wall s", "tokens / CPU s",
                "× vs old (CPU, best)", "× (CPU, median)", "× (wall, median)", "% of limit / CPU s", "max |Δ logp|",
                "max rel Δ grad"):
        table.add_column(col, justify="right" if col != "variant" else "left")
    for r in results:
        table.add_row(r["variant"], str(r["micro_batches"]), str(r["tokens_computed"]), f"{r['cpu_s']:.2f}",
                      f"{r['wall_s']:.2f}", f"{r['tokens_per_cpu_s']:.0f}", f"{r['speedup_cpu']:.3f}",
                      f"{r['speedup_cpu_median']:.3f}", f"{r['speedup_wall']:.3f}", f"{100 * r['share_of_limit_per_cpu_s']:.1f}",
                      f"{r['max_abs_diff_logp']:.1e}", f"{r['max_rel_diff_grad']:.1e}")
    console.print(table)
    pad = sum(len(m) * max(lengths[i] for i in m) for m in plans[base]) / flops["tokens"] - 1
    console.print(f"padding of the old path: {100 * pad:.1f}% extra tokens; frozen layers recorded by autograd: "
                  f"{frozen['frozen_layers_recorded_by_autograd']} of {frozen['frozen_layers']}; fp32 matmul peak "
                  f"{peak / 1e9:.1f} GFLOP/s; load average {os.getloadavg()[0]:.1f}")
    out = Path(args.out) if args.out else (Path("runs/update-path-quick.json") if quick else RESULTS / "update_path.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"model": "tiny-random" if quick else args.model, "quick": quick, "threads": args.threads,
               "rounds": rounds, "trainable_layers": args.trainable_layers, "trainable_params": trainable,
               "micro_batch_tokens": args.micro_batch_tokens, "micro_batch_rows": args.micro_batch_rows,
               "rows": len(lengths), "row_lengths": lengths, "response_lengths": [len(r) for r in rows[1]],
               "padding_extra_share_old": pad, "model_flops": flops, "peak_flops_per_s": peak,
               "peak_before": peak_before, "peak_after": peak_after, "loadavg": list(os.getloadavg()),
               "cpu_count": os.cpu_count(), "cpu": cpu_model(), **frozen, "results": results}
    out.write_text(json.dumps(payload, indent=1, default=lambda x: None if isinstance(x, float) and math.isnan(x)
                              else str(x)) + "\n", encoding="utf-8")
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
