"""Where bf16 autocast changes the warm start's SFT gradients: float32 against autocast at the same weights.

The SFT under autocast (`bf16-mixed`'s RL numerics) left policies that chose more inadmissible actions than the
float32 SFT of the same seed (docs/results.md). This takes the SFT's own batches of one seed's demonstrations and,
at the same weights, computes each batch's gradient twice: the trained blocks in float32, and under autocast. Per
kind of tensor (the attention and MLP projections, the norms) it reports how far the autocast gradient is from the
float32 one against how far two batches' float32 gradients are from each other (the noise the SFT lives with
anyway), whether the autocast error points the same way batch after batch (a bias accumulates over the SFT's
steps, rounding noise averages out), and how often it flips the sign of a coordinate (Adam's first steps move each
coordinate by the learning rate in the gradient's sign).

    python benchmarks/bench_sft_gradients.py --batches 8                    # the preset's initial weights
    python benchmarks/bench_sft_gradients.py --weights RUN_DIR/warm_start   # a trained warm start's
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from experiments import warm_start_dir  # noqa: E402
from harness import cpu_model, make_trainer, read_machines, write_machine_record  # noqa: E402

RESULTS = Path(__file__).parent / "results"
KIND = re.compile(r"\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|input_layernorm|post_attention_layernorm)\.")


ALL = "all trained tensors"


def kind_of(name: str) -> str:
    """The tensor's kind (`q_proj`, ..., the norms), `other` for the rest."""
    found = KIND.search(name)
    return found.group(1) if found else "other"


NUMERICS = ("float32", "autocast", "rounded-weights")
"""How the trained blocks compute: in float32; under bf16 autocast (weights and matmul inputs rounded to bf16);
in float32 from their weights rounded to bf16 (autocast's weight rounding alone)."""


@contextlib.contextmanager
def weights_rounded(params: dict[str, torch.nn.Parameter]) -> Iterator[None]:
    """Within the block, the trained matrices hold their bf16-rounded values (as float32); as before afterwards."""
    kept = {name: p.data for name, p in params.items() if p.dim() == 2}
    for name in kept:
        params[name].data = kept[name].to(torch.bfloat16).float()
    try:
        yield
    finally:
        for name, data in kept.items():
            params[name].data = data


def batch_gradient(model: torch.nn.Module, rows: list[Any], pick: list[int], params: dict[str, torch.nn.Parameter],
                   *, numerics: str, prefix_len: int) -> tuple[float, dict[str, torch.Tensor]]:
    """The SFT loss of rows `pick` (mean NLL of their response tokens, one packed micro-batch) and its gradient
    per trained tensor, the trained blocks computing in `numerics` (`NUMERICS`)."""
    from agentgym_opsd.models.loading import blocks_autocast
    from agentgym_opsd.trainer.logprobs import micro_batch_logprobs

    model.zero_grad(set_to_none=True)
    prompts = [rows[i].prompt_ids for i in pick]
    responses = [rows[i].response_ids for i in pick]
    rounding = weights_rounded(params) if numerics == "rounded-weights" else contextlib.nullcontext()
    with blocks_autocast(model, enabled=numerics == "autocast"), rounding:
        logp, _, mask = micro_batch_logprobs(model, range(len(pick)), prompts, responses, packed=True, device="cpu",
                                             prefix_len=prefix_len)
        loss = -(logp * mask).sum() / mask.sum()
        loss.backward()
    return float(loss.detach()), {name: p.grad.detach().flatten().clone() for name, p in params.items()}


class Agreement:
    """Per kind of tensor, batch by batch: how far one numerics' gradient is from float32's (`add`), kept as running
    sums so no batch's gradient outlives its comparison (the trained blocks' gradients are ~0.2 GB each)."""

    def __init__(self) -> None:
        self.sum32: dict[str, torch.Tensor] = {}
        self.sum_err: dict[str, torch.Tensor] = {}
        self.sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.batches = 0

    def add(self, grad32: dict[str, torch.Tensor], grad: dict[str, torch.Tensor]) -> None:
        self.batches += 1
        by_kind: dict[str, list[str]] = defaultdict(list)
        for name in grad32:
            by_kind[kind_of(name)].append(name)
            by_kind[ALL].append(name)
        for kind, names in by_kind.items():
            g32 = torch.cat([grad32[n] for n in names]).double()
            err = torch.cat([grad[n] for n in names]).double() - g32
            self.sum32[kind] = self.sum32.get(kind, 0) + g32
            self.sum_err[kind] = self.sum_err.get(kind, 0) + err
            s = self.sums[kind]
            s["numel"] = g32.numel()
            s["tensors"] = len(names)
            s["grad_sq"] += float(g32.square().sum())
            s["grad_norm"] += float(g32.norm())
            s["err_norm"] += float(err.norm())
            s["cosine"] += float(torch.nn.functional.cosine_similarity(g32 + err, g32, dim=0))
            s["sign_flips"] += float((((g32 + err).sign() != g32.sign()) & (g32 != 0)).double().mean())

    def figures(self) -> dict[str, Any]:
        """Per kind: the error's size against the gradient's and against the batch-to-batch spread (root mean
        square distance from the mean gradient), how much of it survives averaging over the batches (1: a bias;
        1/sqrt(batches): noise), the mean cosine, and the share of coordinates whose sign it flips."""
        n, out = self.batches, {}
        for kind, s in sorted(self.sums.items()):
            mean32 = self.sum32[kind] / n
            spread = max(s["grad_sq"] / n - float(mean32.square().sum()), 0.0) ** 0.5
            err = s["err_norm"] / n
            out[kind] = {"tensors": int(s["tensors"]), "numel": int(s["numel"]),
                         "error_vs_gradient": err / (s["grad_norm"] / n),
                         "error_vs_batch_spread": err / spread if spread > 0 else 0.0,
                         "error_kept_by_averaging": float((self.sum_err[kind] / n).norm()) / err if err > 0 else 0.0,
                         "cosine": s["cosine"] / n, "sign_flips": s["sign_flips"] / n}
        return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--seed", type=int, default=0, help="warm_start.seed: whose demonstrations and batches")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--weights", type=Path, default=None,
                    help="a warm start's model folder or a run folder (default: the preset's initial weights)")
    ap.add_argument("--label", default="", help="the record's name (default: initial, or the weights' folder)")
    ap.add_argument("--note", default="", help="where the weights came from, kept in the record")
    ap.add_argument("--out", type=Path, default=RESULTS / "sft_gradients.json")
    args = ap.parse_args(argv)

    from agentgym_opsd.trainer.logprobs import shared_prompt_prefix
    from agentgym_opsd.trainer.warm_start import (
        WarmStart,
        collect_demonstrations,
        demonstration_rows,
        sft_schedule,
        split_heldout,
    )

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(args.config, ["rollout.backend=hf", "model.precision=bf16-mixed",
                                             "warm_start.cache=off"], tmp)
        session, policy = trainer.session, trainer.session.trained
        runner = session.envs[0].runner
        cfg = dataclasses.replace(session.cfg, warm_start=dataclasses.replace(session.cfg.warm_start, seed=args.seed))
        stage = WarmStart(cfg, run_dir=Path(tmp), system_prompt=runner.profile.system_prompt,
                          env_num_tasks=session.envs[0].env_num_tasks, demonstrator=runner.profile.demonstrator)
        demos = collect_demonstrations(runner, stage.demonstration_tasks(), thought=cfg.warm_start.thought,
                                       batch=runner.pool.num_envs)
        train_demos, _ = split_heldout(demos, cfg.warm_start.heldout_episodes)
        rows = demonstration_rows(train_demos, policy.encode, policy.tokenizer)
        if args.weights is not None:
            folder = Path(warm_start_dir(args.weights) or args.weights)
            policy.load_weights(folder / "model" if (folder / "model").is_dir() else folder)
        model = policy.model
        model.train()
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        # the SFT's own first batches of this seed (`WarmStart._train`'s schedule)
        schedule = sft_schedule(len(rows), batch_rows=cfg.warm_start.batch_rows, epochs=cfg.warm_start.epochs,
                                rng=np.random.default_rng(args.seed))[: args.batches]
        prefix_len = shared_prompt_prefix([r.prompt_ids for r in rows])
        agreement = {numerics: Agreement() for numerics in NUMERICS[1:]}
        losses: dict[str, list[float]] = {numerics: [] for numerics in NUMERICS}
        for k, pick in enumerate(schedule, start=1):
            grads = {}
            for numerics in NUMERICS:
                loss, grads[numerics] = batch_gradient(model, rows, [int(i) for i in pick], params,
                                                       numerics=numerics, prefix_len=prefix_len)
                losses[numerics].append(loss)
            for numerics in NUMERICS[1:]:
                agreement[numerics].add(grads["float32"], grads[numerics])
            print(f"batch {k}: loss " + ", ".join(f"{n} {losses[n][-1]:.5f}" for n in NUMERICS), file=sys.stderr,
                  flush=True)
    label = args.label or ("initial" if args.weights is None else args.weights.name)
    record = {"config": args.config, "seed": args.seed, "batches": len(schedule), "note": args.note,
              "loss": {n: float(np.mean(losses[n])) for n in NUMERICS},
              "vs_float32": {n: agreement[n].figures() for n in NUMERICS[1:]}}
    cpu = cpu_model()
    runs = read_machines(args.out).get(cpu, {}).get("runs", {})  # one record per set of weights, kept side by side
    write_machine_record(args.out, cpu, {"cpu": cpu, "runs": {**runs, label: record}})

    table = Table(title=f"SFT gradients against float32's ({label}, seed {args.seed}, {len(schedule)} batches, {cpu})")
    for col in ("numerics", "tensor", "error / gradient", "error / batch spread", "kept by averaging", "cosine",
                "sign flips"):
        table.add_column(col, justify="right")
    for numerics, by_kind in record["vs_float32"].items():
        for kind, fig in by_kind.items():
            table.add_row(numerics, kind, f"{fig['error_vs_gradient']:.4f}", f"{fig['error_vs_batch_spread']:.4f}",
                          f"{fig['error_kept_by_averaging']:.3f}", f"{fig['cosine']:.5f}", f"{fig['sign_flips']:.2%}")
    Console().print(table)
    print(f"loss {record['loss']}; wrote {args.out}", file=sys.stderr)

if __name__ == "__main__":
    main()
