"""Benchmark: vectorised AgentOPSD credit assignment vs the slow per-trajectory reference loop.

The ALFWorld paper setting: 16 tasks × 8 rollouts × 50 turns = 6,400 turn rows, shuffled, float64.
Run with ``python benchmarks/bench_credit.py`` (options: ``--help``). Target: ≥ 20× faster, equal to 1e-9.

``--compare`` instead runs every registered estimator (``agentgym_opsd.credit.ESTIMATORS``: GRPO, AgentOPSD
and its ablations, the token variant, GiGPO, AgentOPSD + GiGPO) on the same seeded synthetic rollouts and
prints one table: time, agreement with its slow reference, and what each does to the advantages.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from agentgym_opsd.credit import (
    ESTIMATORS,
    VARIANTS,
    CreditConfig,
    CreditInputs,
    agentopsd_advantages,
    estimate,
    pad_ragged,
    reference_agentopsd_advantages,
    reference_gigpo_step_advantages,
)

TARGET_SPEEDUP = 20.0
TARGET_MAX_ABS_DIFF = 1e-9


@dataclass(frozen=True)
class BenchArgs:
    """Problem size and timing of one benchmark run."""

    num_tasks: int = 16
    """tasks per batch"""
    group_size: int = 8
    """rollouts per task (G)"""
    num_turns: int = 50
    """turns per trajectory (ALFWorld max)"""
    repeats: int = 101
    """timed repeats of the vectorised path; the median is reported"""
    reference_repeats: int = 11
    """timed repeats of the reference loop (it is slow); the median is reported"""
    seed: int = 0
    """seed of the synthetic batch"""
    threads: int = 1
    """torch intra-op threads (0: torch's default). One by default: these tensors are tiny, and on a shared
    machine OpenMP workers spin-waiting for busy cores can make a multi-threaded run 10× slower."""


ID_PATTERNS = ("contiguous", "gaps", "sparse")
"""How trajectory ids look: ``first_traj_id + i`` as rollout.py assigns them (the realistic case),
``3·i + 17`` (counting sort plus compaction), or random 62-bit integers (the torch.sort fallback)."""


def make_batch(args: BenchArgs, ids: str = "contiguous") -> tuple[torch.Tensor, ...]:
    """Shuffled turn rows: (seq_advantages, evidence, traj_ids, turn_ids, success_rate), all (rows,)."""
    g = torch.Generator().manual_seed(args.seed)
    num_traj = args.num_tasks * args.group_size
    success = (torch.rand(num_traj, generator=g) < 0.4).double()  # (trajectories,)
    group = torch.arange(num_traj) // args.group_size
    rate = success.view(args.num_tasks, args.group_size).mean(1)[group]
    adv = success - rate  # sign is what matters here; scale is irrelevant to timing
    traj_ids = {
        "contiguous": lambda: 40_000 + torch.arange(num_traj),  # a later training step's first_traj_id
        "gaps": lambda: torch.arange(num_traj) * 3 + 17,
        "sparse": lambda: torch.randint(0, 2**62, (num_traj,), generator=g),
    }[ids]()
    row_traj = torch.arange(num_traj).repeat_interleave(args.num_turns)  # (rows,) trajectory of each row
    turn = torch.arange(args.num_turns).repeat(num_traj)
    evidence = torch.randn(row_traj.numel(), generator=g, dtype=torch.float64) * 2.0
    perm = torch.randperm(row_traj.numel(), generator=g)
    return adv[row_traj][perm], evidence[perm], traj_ids[row_traj][perm], turn[perm], rate[row_traj][perm]


@dataclass(frozen=True)
class Timing:
    """Medians over repeats of one method: wall-clock and this thread's CPU time, in seconds."""

    seconds_wall: float
    seconds_cpu: float


@dataclass(frozen=True)
class CaseResult:
    case: str
    vectorised: Timing
    reference: Timing
    max_abs_diff: float

    @property
    def speedup_wall(self) -> float:
        return self.reference.seconds_wall / self.vectorised.seconds_wall

    @property
    def speedup_cpu(self) -> float:
        return self.reference.seconds_cpu / self.vectorised.seconds_cpu

    @property
    def ok(self) -> bool:
        # The smaller of the two ratios: on a busy machine a 30 ms Python loop is preempted more often
        # than a 0.5 ms call, which inflates the wall-clock ratio.
        speedup = min(self.speedup_wall, self.speedup_cpu)
        return speedup >= TARGET_SPEEDUP and self.max_abs_diff <= TARGET_MAX_ABS_DIFF


def measure(fn: Callable[[], torch.Tensor], repeats: int) -> tuple[Timing, torch.Tensor]:
    out = fn()  # warm-up (allocator, lazy init, the memoised scan matrix)
    wall, cpu = [], []
    for _ in range(repeats):
        start_wall, start_cpu = time.perf_counter(), time.thread_time()
        out = fn()
        cpu.append(time.thread_time() - start_cpu)
        wall.append(time.perf_counter() - start_wall)
    return Timing(statistics.median(wall), statistics.median(cpu)), out


def run(args: BenchArgs) -> list[CaseResult]:
    """Every AgentOPSD variant on contiguous ids, then the paper variant on the other id patterns."""
    batches = {ids: make_batch(args, ids) for ids in ID_PATTERNS}
    cases = [(variant, batches["contiguous"], variant) for variant in VARIANTS]
    cases += [(f"paper, {ids} ids", batches[ids], "paper") for ids in ID_PATTERNS[1:]]
    results = []
    for name, rows, variant in cases:
        fast = functools.partial(agentopsd_advantages, *rows, variant=variant)
        slow = functools.partial(reference_agentopsd_advantages, *rows, variant=variant)
        fast_timing, fast_out = measure(fast, args.repeats)
        slow_timing, slow_out = measure(slow, args.reference_repeats)
        max_abs_diff = float((fast_out - slow_out).abs().max())
        results.append(CaseResult(name, fast_timing, slow_timing, max_abs_diff))
    return results


def print_table(args: BenchArgs, results: list[CaseResult]) -> None:
    rows = args.num_tasks * args.group_size * args.num_turns
    title = (
        f"AgentOPSD credit: {args.num_tasks} tasks × {args.group_size} rollouts × {args.num_turns} turns "
        f"= {rows:,} shuffled float64 rows; medians of {args.repeats} (vectorised) / "
        f"{args.reference_repeats} (reference) runs; torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s)"
    )
    header = ("case", "vectorised ms", "reference ms", "speedup wall", "speedup CPU", "max |diff|", "ok")
    body = [
        (
            r.case,
            f"{r.vectorised.seconds_wall * 1e3:.3f}",
            f"{r.reference.seconds_wall * 1e3:.2f}",
            f"{r.speedup_wall:.1f}×",
            f"{r.speedup_cpu:.1f}×",
            f"{r.max_abs_diff:.2e}",
            ("yes" if r.ok else "NO") if not _is_extra(r) else ("(yes)" if r.ok else "(no)"),
        )
        for r in results
    ]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # rich is optional: fall back to plain text
        widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]
        print(title)
        for line in (header, *body):
            print("  ".join(str(x).rjust(w) for x, w in zip(line, widths, strict=True)))
        return
    table = Table(title=title)
    for name in header:
        table.add_column(name, justify="right")
    for line in body:
        table.add_row(*line)
    Console(width=120).print(table)


def _is_extra(result: CaseResult) -> bool:
    """Cases with other trajectory-id patterns than the rollout's (informational rows)."""
    return result.case.endswith(" ids")


# ---- --compare: every estimator on the same rollouts ------------------------------------------------------


def make_rollouts(args: BenchArgs, *, num_states: int = 4, max_tokens: int = 24) -> CreditInputs:
    """Seeded synthetic rollouts with everything any estimator reads: turn rows of ``num_tasks`` groups of
    ``group_size`` trajectories, ``num_turns`` turns each, shuffled. Trajectories of a group visit states
    from a small pool per turn (so anchor states repeat, as when rollouts of one task walk the same rooms);
    a won trajectory's last turn has reward 1; token gaps are random, ``evidence`` their sums."""
    g = torch.Generator().manual_seed(args.seed)
    num_traj = args.num_tasks * args.group_size
    won = (torch.rand(num_traj, generator=g) < 0.4).double()
    group = torch.arange(num_traj) // args.group_size
    rate = won.view(args.num_tasks, args.group_size).mean(1)[group]
    std = won.view(args.num_tasks, args.group_size).std(1)[group]
    seq = (won - rate) / (std + 1e-6)  # GRPO A_seq
    row_traj = torch.arange(num_traj).repeat_interleave(args.num_turns)
    turn = torch.arange(args.num_turns).repeat(num_traj)
    state = torch.randint(0, num_states, (row_traj.numel(),), generator=g)
    anchor = (turn * num_states + state) * 1_000_003 + 17  # the state a turn acted on: (time, room) pairs
    reward = torch.where(turn == args.num_turns - 1, won[row_traj], torch.zeros(()))
    lengths = torch.randint(1, max_tokens + 1, (row_traj.numel(),), generator=g).tolist()
    gaps = [torch.randn(n, generator=g, dtype=torch.float64) * 0.3 for n in lengths]
    evidence = torch.stack([x.sum() for x in gaps])
    perm = torch.randperm(row_traj.numel(), generator=g)
    token_gaps, token_mask = pad_ragged([gaps[i] for i in perm.tolist()])
    return CreditInputs(
        seq[row_traj][perm], (40_000 + row_traj)[perm], turn[perm], rate[row_traj][perm], evidence=evidence[perm],
        token_gaps=token_gaps, token_mask=token_mask, group_ids=group[row_traj][perm], anchor_keys=anchor[perm],
        turn_rewards=reward[perm].double(), turn_penalties=torch.zeros(row_traj.numel(), dtype=torch.float64))


def reference_of(name: str, inputs: CreditInputs, config: CreditConfig) -> torch.Tensor | None:
    """The slow loop's answer for ``name``, or None when the library has no reference for it."""
    spec = ESTIMATORS[name]
    if spec.granularity != "turn":
        return None
    if name == "grpo":
        return inputs.seq_advantages
    base = inputs.seq_advantages
    if spec.needs_teacher:
        variant = spec.fixed_variant or config.variant
        base = reference_agentopsd_advantages(inputs.seq_advantages, inputs.evidence, inputs.traj_ids,
                                              inputs.turn_ids, inputs.success_rate,
                                              **{**config.agentopsd_kwargs(), "variant": variant})
    if spec.needs_anchors:
        step = reference_gigpo_step_advantages(
            inputs.traj_ids, inputs.turn_ids, inputs.group_ids, inputs.anchor_keys, inputs.turn_rewards,
            turn_penalties=inputs.turn_penalties, step_gamma=config.step_gamma, step_norm=config.step_norm,
            eps=config.eps)
        base = base + config.omega * step
    return base


@dataclass(frozen=True)
class EstimatorRow:
    name: str
    granularity: str
    needs: str
    seconds: float
    max_abs_diff: float | None
    mean_abs: float
    sign_kept: float
    spread: float
    corr_grpo: float


def compare(args: BenchArgs, config: CreditConfig = CreditConfig.PAPER) -> list[EstimatorRow]:
    """Every registered estimator on the same rollouts: median time, max |fast − reference|, and per-turn
    statistics of Ã: mean |Ã|, the fraction of turns keeping the sign of A_seq, the within-trajectory spread
    (std of Ã over a trajectory's turns, averaged), and the correlation with GRPO's per-turn advantages."""
    inputs = make_rollouts(args)
    rows = []
    grpo = inputs.seq_advantages
    for name, spec in ESTIMATORS.items():
        timing, result = measure(lambda name=name: estimate(name, inputs, config).advantages, args.repeats)
        turn_adv = result if spec.granularity == "turn" else _token_mean(result, inputs.token_mask)
        ref = reference_of(name, inputs, config)
        diff = float((result - ref).abs().max()) if ref is not None else None
        needs = ", ".join(x for x, on in (("teacher", spec.needs_teacher), ("anchors", spec.needs_anchors)) if on)
        rows.append(EstimatorRow(
            name, spec.granularity, needs or "–", timing.seconds_wall, diff, float(turn_adv.abs().mean()),
            float((torch.sign(turn_adv) == torch.sign(grpo)).double().mean()), _spread(turn_adv, inputs.traj_ids),
            float(torch.corrcoef(torch.stack([turn_adv, grpo]))[0, 1])))
    return rows


def _token_mean(grid: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (grid * mask).sum(1) / mask.sum(1).clamp_min(1)


def _spread(values: torch.Tensor, traj_ids: torch.Tensor) -> float:
    _, index = torch.unique(traj_ids, return_inverse=True)
    n = int(index.max()) + 1
    count = torch.zeros(n, dtype=values.dtype).index_add_(0, index, torch.ones_like(values))
    mean = torch.zeros(n, dtype=values.dtype).index_add_(0, index, values) / count
    var = torch.zeros(n, dtype=values.dtype).index_add_(0, index, (values - mean[index]) ** 2) / count
    return float(var.sqrt().mean())


def print_compare(args: BenchArgs, rows: list[EstimatorRow]) -> None:
    num_rows = args.num_tasks * args.group_size * args.num_turns
    print(f"every estimator on the same rollouts: {args.num_tasks} tasks × {args.group_size} rollouts × "
          f"{args.num_turns} turns = {num_rows:,} shuffled float64 rows, seed {args.seed}; median of "
          f"{args.repeats} runs; paper hyper-parameters (λ=0.5, b=0.2, γ=0.95; ω=1, step γ=0.95, mean_norm)")
    header = ("estimator", "granularity", "needs", "ms", "max |diff| vs ref", "mean |Ã|", "sign of A_seq kept",
              "spread in traj.", "corr. with GRPO")
    body = [(r.name, r.granularity, r.needs, f"{r.seconds * 1e3:.3f}",
             f"{r.max_abs_diff:.1e}" if r.max_abs_diff is not None else "–", f"{r.mean_abs:.3f}",
             f"{r.sign_kept:.3f}", f"{r.spread:.3f}", f"{r.corr_grpo:.3f}") for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]
    for line in (header, *body):
        print("  ".join(str(x).rjust(w) for x, w in zip(line, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = BenchArgs()
    for name in ("num_tasks", "group_size", "num_turns", "repeats", "reference_repeats", "seed", "threads"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--compare", action="store_true",
                        help="run every registered estimator on the same seeded rollouts and print one table")
    options = vars(parser.parse_args())
    run_compare = options.pop("compare")
    args = BenchArgs(**options)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if run_compare:
        print_compare(args, compare(args))
        return
    results = run(args)
    print_table(args, results)
    # The target is stated for the trainer's workload (ids as rollout.py assigns them, every variant); the
    # other id patterns are shown for information, in parentheses.
    target = [r for r in results if not _is_extra(r)]
    worst_speedup = min(min(r.speedup_wall, r.speedup_cpu) for r in target)
    worst_diff = max(r.max_abs_diff for r in results)
    print(
        f"rollout ids, all variants: worst speedup {worst_speedup:.1f}× (target ≥ {TARGET_SPEEDUP:.0f}×); "
        f"all cases: worst max |diff| {worst_diff:.2e} (target ≤ {TARGET_MAX_ABS_DIFF:.0e})"
    )
    # Wall-clock numbers from a busy machine are slower for both paths alike; say how busy it was.
    load_1min = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} CPUs, 1-minute load average {load_1min:.2f}")


if __name__ == "__main__":
    main()
