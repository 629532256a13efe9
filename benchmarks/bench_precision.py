"""float32 vs bfloat16 on this machine, phase by phase, side by side in one run (prints a table, writes JSON + PNG).

For each dtype a fresh `cpu-small` trainer (SmolLM2-135M-Instruct, no warm start, the same seed) runs:
- rollout   one round of B x G episodes (the same tasks and sampler seed; the tokens sampled may differ, so
            tokens/s is reported beside the seconds);
- logprobs  the teacher-forced log-prob pass of the trainer (π_old recomputed) on one shared set of
            trajectories (collected once, by the float32 trainer);
- teacher   the self-teacher pass (c+ prompts) on those trajectories;
- update    the PPO update on them (the preset's mini-batches, micro-batching and trainable layers);
- sft_step  one warm-start step on 8 oracle demonstration rows.
Numerics: the sampler's log-probs vs the trainer's π_old pass on the same tokens (per dtype, on its own
rollouts; the pass in the update's packed layout, as the trainer runs it), the bf16 pass vs the float32 pass on
the shared trajectories, the PPO ratio's start deviation, and the sampler correction's figures (TIS).

`precision.json` keeps one record per CPU model (`lscpu`'s model name): a run replaces its own machine's record
and leaves the others, so the machines' numbers sit side by side.

Where the probe measures bf16 matmuls below 1/4 of float32 (`HOPELESS_SLOWDOWN`: an AVX2 CPU without bf16
instructions emulates them, 0.02x), the bf16 phases would take hours and `auto` can never pick bf16 there: the
record then holds the probe and the float32 phases, and says why bf16 was not run (`--force-bf16` runs it).

    python benchmarks/bench_precision.py                       # -> benchmarks/results/precision.json / .png
    python benchmarks/bench_precision.py --config cpu-tiny --out /tmp/p.json   # fast check of the script
    python benchmarks/bench_precision.py --force-bf16          # bf16 phases even where the probe rules bf16 out
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from bench_roofline import measure_peak_flops, sft_rows  # noqa: E402
from harness import cpu_model, make_trainer, peak_rss_mb, timed, write_machine_record  # noqa: E402
from render_results import render_pages  # noqa: E402

from agentgym_opsd.models.precision import BF16_MIN_SPEEDUP, HOPELESS_SLOWDOWN, probe_matmuls  # noqa: E402
from agentgym_opsd.records import summarize  # noqa: E402
from agentgym_opsd.trainer.losses import START_RATIO_BOUND  # noqa: E402
from agentgym_opsd.trainer.turn_batch import PolicyLogProbs  # noqa: E402

RESULTS = Path(__file__).parent / "results"
PHASES = ("rollout", "logprobs", "teacher", "update", "sft_step")


def measure_peak_flops_at(threads: int, dtype: torch.dtype) -> dict[str, float]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return measure_peak_flops((512, 1024, 1536, 2048), 3, dtype)
    finally:
        torch.set_num_threads(before)


def gap_stats(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict[str, float]:
    diffs = torch.cat([(x.float() - y.float()).abs() for x, y in zip(a, b, strict=True) if x.numel()])
    return {"mean": float(diffs.mean()), "max": float(diffs.max()), "tokens": int(diffs.numel())}


PRECISION_OF = {"float32": "fp32", "bfloat16": "bf16-mixed"}


def measure(dtype: str, args: argparse.Namespace, shared: list[Any] | None, tmp: str) -> dict[str, Any]:
    overrides = [f"model.precision={PRECISION_OF[dtype]}", "warm_start.epochs=0", "warm_start.steps=0", *args.overrides]
    trainer = make_trainer(args.config, overrides, f"{tmp}/{dtype}")
    try:
        trainer.session.reference.setup()
        seed_cursor = trainer.task_cursor
        rollout_s, own, tokens = [], None, 0
        for _ in range(args.repeats):  # the same tasks and sampler seed each time
            trainer.task_cursor = seed_cursor
            trainer.session.policy.set_rng_state(torch.Generator().manual_seed(trainer.session.cfg.trainer.seed).get_state())
            t0 = time.perf_counter()
            own = trainer.collect()
            rollout_s.append(time.perf_counter() - t0)
            tokens = sum(len(t.response_token_ids) for traj in own for t in traj.turns)
        assert own is not None
        trajs = shared if shared is not None else own
        # the sampler's numbers against this dtype's own teacher-forced pass, on its own rollouts
        own_batch = trainer.score(copy.deepcopy(own))
        sampled = [torch.tensor(r.sample_logprobs) for r in own_batch.rows]
        packed = trainer.session.packed_update
        recomputed = trainer.session.trained.logprobs(own_batch.prompt_ids, own_batch.response_ids, packed=packed)
        sampler_gap = gap_stats(sampled, recomputed)

        scored = copy.deepcopy(trajs)
        batch = trainer.score(scored)
        logprobs_s, old = timed(lambda: trainer.session.trained.logprobs(batch.prompt_ids, batch.response_ids,
                                                                         packed=packed), args.repeats)
        maker = trainer.session.evidence_maker
        prompts = maker.row_prompts(batch, scored)
        teacher_s, _ = timed(lambda: maker.teacher_logprobs(batch, prompts, old), args.repeats)
        logprobs = PolicyLogProbs(old)
        advantages = trainer.credit(batch, trainer.teacher(batch, logprobs, scored))
        state = {k: v.detach().clone() for k, v in trainer.session.trained.model.state_dict().items()}
        engine_state = copy.deepcopy(trainer.session.trained.engine.state_dict())
        update_s, update_metrics = [], {}
        for _ in range(args.repeats + 1):  # every update from the same weights
            trainer.session.trained.model.load_state_dict(state)
            trainer.session.trained.engine.load_state_dict(copy.deepcopy(engine_state))
            # π_old as the trainer gets it, with the frozen-trunk outputs its pass keeps for the update
            step_logprobs = trainer.logprobs(batch)
            t0 = time.perf_counter()
            update_metrics = trainer.update(batch, step_logprobs, advantages)
            update_s.append(time.perf_counter() - t0)
        rows = sft_rows(trainer, 8)
        from agentgym_opsd.trainer.warm_start import sft_step

        o = trainer.session.cfg.optim
        sft_s, _ = timed(lambda: sft_step(trainer.session.trained.engine, rows, list(range(8)), pad_id=trainer.session.trained.pad_id,
                                          max_tokens=o.micro_batch_tokens, max_rows=o.micro_batch_rows,
                                          device=trainer.session.trained.device,
                                          autocast_dtype=trainer.session.warm_starter.autocast_dtype), args.repeats)
        return {
            "phases": {"rollout": statistics.median(rollout_s), "logprobs": logprobs_s, "teacher": teacher_s,
                       "update": statistics.median(update_s[1:]), "sft_step": sft_s},
            "rollout_tokens": tokens, "rollout_tokens_per_s": tokens / statistics.median(rollout_s),
            "rollout_success": summarize(own).success_rate,
            "sampler_vs_pass": sampler_gap,
            "update_start": {k: update_metrics[k] for k in ("logprob_gap/mean", "logprob_gap/max",
                                                            "ppo/start_ratio_max_dev")},
            "tis": {k: v for k, v in update_metrics.items() if k.startswith("tis/")},
            "old_logprobs": [t.clone() for t in old],
            "trajs": own,
            "dtype_resolved": str(next(trainer.session.trained.model.parameters()).dtype),
            "float32_trainable": trainer.session.cfg.model.numerics.float32_trainable,
            "trainable_autocast": trainer.session.cfg.model.numerics.rl_autocast,
        }
    finally:
        trainer.close()


def write_record(out: Path, cpu: str, record: dict[str, Any]) -> None:
    """`record` as `cpu`'s entry of `out`, beside the other machines' entries; the docs' table follows."""
    write_machine_record(out, cpu, record)
    render_pages()


def plot(record: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(record["phases"])
    fp32 = [record["phases"][n]["fp32_s"] for n in names]
    bf16 = [record["phases"][n]["bf16_s"] for n in names]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar([i - 0.2 for i in x], fp32, width=0.4, label="float32")
    ax.bar([i + 0.2 for i in x], bf16, width=0.4, label="bfloat16")
    for i, n in enumerate(names):
        ax.text(i + 0.2, bf16[i], f"{record['phases'][n]['speedup']:.1f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), names)
    ax.set_ylabel("seconds (median)")
    ax.set_title(f"{record['config']}: float32 vs bfloat16 per phase, {record['cpu']} ({record['threads']} threads)",
                 fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "precision.json")
    ap.add_argument("--force-bf16", action="store_true",
                    help="run the bf16 phases even where the probe measures bf16 below 1/4 of float32")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    cpu = cpu_model()
    probe = probe_matmuls("cpu")
    print(f"{cpu}: {probe.describe()} -> model.precision=auto picks "
          f"{'bfloat16' if probe.bf16_pays else 'float32'}", file=sys.stderr)
    skip_bf16 = None if args.force_bf16 or probe.speedup * HOPELESS_SLOWDOWN >= 1 else (
        f"not run: the probe measured bf16 matmuls at {probe.speedup:.2f}x float32 (this CPU has no bf16 "
        f"instructions), so its phases would take hours and model.precision=auto never picks bf16 here; "
        f"--force-bf16 runs them")
    if skip_bf16:
        print(f"bfloat16 {skip_bf16}", file=sys.stderr)
    load_before = os.getloadavg()
    dtypes = ("float32",) if skip_bf16 else ("float32", "bfloat16")
    peaks = {dt: {threads: max(measure_peak_flops_at(threads, getattr(torch, dt)).values()) / 1e9
                  for threads in (1, torch.get_num_threads())} for dt in dtypes}
    with tempfile.TemporaryDirectory(prefix="bench_precision_") as tmp:
        fp32 = measure("float32", args, None, tmp)
        bf16 = None if skip_bf16 else measure("bfloat16", args, fp32["trajs"], tmp)
    record: dict[str, Any] = {
        "config": args.config, "overrides": args.overrides, "repeats": args.repeats,
        "cpu": cpu, "threads": torch.get_num_threads(),
        "probe": {"float32_gflops": probe.float32_gflops, "bfloat16_gflops": probe.bfloat16_gflops,
                  "speedup": probe.speedup, "bar": BF16_MIN_SPEEDUP,
                  "auto_picks": "bfloat16" if probe.bf16_pays else "float32"},
        "matmul_peak_gflops": peaks,  # best torch.mm of 512-2048 squares, per dtype and thread count
        "load_avg_before_after": [load_before[0], os.getloadavg()[0]],
        "peak_rss_mb": peak_rss_mb(),
    }
    measured = {"fp32": fp32, **({"bf16": bf16} if bf16 is not None else {})}
    steps = {tag: sum(m["phases"][p] for p in PHASES if p != "sft_step") for tag, m in measured.items()}
    record.update({
        "phases": {p: {f"{tag}_s": m["phases"][p] for tag, m in measured.items()} for p in PHASES},
        "rl_step": {f"{tag}_s": step for tag, step in steps.items()},
        **{key: {tag: m[key] for tag, m in measured.items()}
           for key in ("rollout_tokens_per_s", "rollout_success", "sampler_vs_pass", "tis")},
        "update_start": {**{tag: m["update_start"] for tag, m in measured.items()}, "bound": START_RATIO_BOUND},
    })
    if bf16 is None:
        record["bf16_skipped"] = skip_bf16
        write_record(args.out, cpu, record)
        print(f"float32 RL step {steps['fp32']:.1f} s; sampler vs pass {fp32['sampler_vs_pass']['mean']:.1e} nats "
              f"per token; wrote {args.out}", file=sys.stderr)
        return
    for row in (*record["phases"].values(), record["rl_step"]):
        row["speedup"] = row["fp32_s"] / row["bf16_s"]
    # bf16-mixed as the measurement resolved it: float32 trainable layers over bf16 ones
    record["bf16_float32_trainable"] = bf16["float32_trainable"]
    record["bf16_trainable_autocast"] = bf16["trainable_autocast"]
    # bf16 log-prob pass vs the float32 one, same weights, same tokens
    record["logprob_gap"] = gap_stats(bf16["old_logprobs"], fp32["old_logprobs"])
    step_fp32, step_bf16 = steps["fp32"], steps["bf16"]
    write_record(args.out, cpu, record)
    plot(record, args.out.with_suffix(".png"))

    table = Table(title=f"float32 vs bfloat16, {args.config}, {record['threads']} threads (median of {args.repeats})")
    for col in ("phase", "float32 s", "bfloat16 s", "speed-up"):
        table.add_column(col, justify="right")
    for p, v in record["phases"].items():
        table.add_row(p, f"{v['fp32_s']:.2f}", f"{v['bf16_s']:.2f}", f"{v['speedup']:.2f}x")
    table.add_row("RL step", f"{step_fp32:.2f}", f"{step_bf16:.2f}", f"{record['rl_step']['speedup']:.2f}x")
    console = Console()
    console.print(table)
    console.print(f"log-prob gap bf16 vs fp32 pass: mean {record['logprob_gap']['mean']:.4f}, "
                  f"max {record['logprob_gap']['max']:.4f} nats/token; sampler vs pass: "
                  f"fp32 {record['sampler_vs_pass']['fp32']['mean']:.4f} / {record['sampler_vs_pass']['fp32']['max']:.4f}, "
                  f"bf16 {record['sampler_vs_pass']['bf16']['mean']:.4f} / {record['sampler_vs_pass']['bf16']['max']:.4f}")
    console.print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
