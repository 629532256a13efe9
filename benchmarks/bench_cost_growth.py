"""How the cost of an RL step grows with the work (issue 23, part 3): episodes per step, group size, turns per
episode, prompt length.

    python benchmarks/bench_cost_growth.py            # SmolLM2-135M, top 12 layers train, 1 thread: ~12 min CPU
    python benchmarks/bench_cost_growth.py --quick    # a smaller grid: ~5 min CPU
    python benchmarks/bench_cost_growth.py --model tiny-random --trainable-layers 1 --quick   # seconds

Each phase of a step is measured directly on synthetic token batches of `cpu-learn`'s shapes (the roofline
run's step: student prompts of ~225 tokens, a ~280-token skill block c+ in the teacher's system message,
replies of 6-18 tokens, 24 new tokens per decode, history of 2 turns), so no environment or reward enters:

- decode: the project's HF sampler (`HFPolicy.generate_ids`, batches of 16 as `rollout.batch_size`, 24 new
  tokens, no stop string or end-of-sequence, so every row decodes the full budget), one call per turn of the
  episodes. At the first turn the G copies of a task share their prompt (the sampler prefills it once);
  later turns differ.
- teacher: `prefix_shared_response_logprobs` on every turn row's teacher prompt (2048-token / 16-row
  micro-batches), which computes the prefix common to the rows once: the system block and the general rules
  of c+ when the step holds tasks of several kinds, the whole prompt but one token when it holds one task.
- update: every turn row once, PPO mini-batches of 16 rows (one AdamW step each), micro-batches as
  `Trainer.update` cuts them (packed, `trainer/logprobs.py`), forward + backward of the policy objective.

The axes (each varies one quantity from the base point; "rows" are turn rows = episodes x turns):
- episodes per step E (8, 16, 32, 64), group size 4, 1 turn;
- group size G (1, 4, 16) at 16 episodes, 1 turn: the rows and their lengths do not change, only how many of
  them share a prompt (decode: one prefill per task; teacher: one task leaves one prefix); the update is the
  same work and is not re-measured;
- turns per episode T (1, 2, 4, 8) at 1 episode: T decode calls, T rows, each turn's prompt longer by ~60
  tokens per turn of history up to 2;
- student prompt length P (128 ... 1024 tokens) at 2 episodes of different tasks, 1 turn.
`--quick`: 3 points per axis (E 4-16 with G 2, G 1-8, T 1-4 at 2 episodes, P 128-512 at 4 episodes).

Per phase: CPU seconds of the process (the measure on a shared machine), wall seconds, and peak memory: the
largest resident set size sampled every 5 ms during the phase, less the resident set at its start (freed
heap is handed back with `malloc_trim` before each phase, so one phase's leftovers do not hide the next
one's growth). For each axis and phase the log-log slope between the first and the last point says how the
cost grows (1 = linear). Writes benchmarks/results/cost_growth.json and .png (`--quick`: cost_growth_quick.*).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from agentgym_opsd.models.hf_policy import HFPolicy
from agentgym_opsd.models.loading import freeze_lower_layers, load_policy_model
from agentgym_opsd.trainer.logprobs import (
    bucket_micro_batches,
    collate,
    pack,
    packed_response_logprobs,
    prefix_shared_response_logprobs,
    response_logprobs,
    supports_packing,
)
from agentgym_opsd.trainer.losses import policy_objective

RESULTS = Path(__file__).parent / "results"
PHASES = ("decode", "teacher", "update")


@dataclass(frozen=True)
class Shapes:
    """Token counts of a synthetic `cpu-learn` row (measured on the roofline run's step)."""

    system_tokens: int = 60  # the system prompt, in every prompt
    rules_tokens: int = 150  # the general rules of c+: in every teacher prompt
    kind_tokens: int = 130  # the task kind's part of c+
    task_kinds: int = 6  # ALFWorld's task types
    prompt_tokens: int = 225  # a first-turn student prompt (system included)
    history_tokens_per_turn: int = 60  # an earlier turn's reply and observation in the prompt
    history_turns: int = 2
    response_tokens: tuple[int, int] = (6, 18)  # replies drawn uniformly in this range
    new_tokens: int = 24  # decode budget per turn
    decode_batch: int = 16
    micro_batch_tokens: int = 2048
    micro_batch_rows: int = 16
    mini_batch_rows: int = 16


@dataclass
class Point:
    axis: str
    x: int
    episodes: int
    group_size: int
    turns: int
    prompt_tokens: int
    rows: int = 0
    update_tokens: int = 0
    teacher_tokens: int = 0
    phases: dict[str, dict[str, float]] = field(default_factory=dict)


# ---- synthetic rows -------------------------------------------------------------------------------------------
@dataclass
class StepRows:
    """One step's turn rows, turn by turn: student prompts (rows of turn t at `turns[t]`), teacher prompts and
    replies in the same order."""

    turns: list[list[list[int]]]
    teacher: list[list[int]]
    responses: list[list[int]]

    @property
    def prompts(self) -> list[list[int]]:
        return [p for turn in self.turns for p in turn]


def synthetic_step(s: Shapes, *, episodes: int, group_size: int, turns: int, prompt_tokens: int, vocab: int,
                   seed: int) -> StepRows:
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    system, rules = tokens(s.system_tokens), tokens(s.rules_tokens)
    kinds = [tokens(s.kind_tokens) for _ in range(s.task_kinds)]
    tasks = max(1, episodes // group_size)
    first = [tokens(max(1, prompt_tokens - s.system_tokens)) for _ in range(tasks)]  # task text + observation
    all_turns, teacher, responses = [], [], []
    history: list[list[list[int]]] = [[] for _ in range(episodes)]  # per episode: its last turns' tokens
    for t in range(turns):
        rows = []
        for e in range(episodes):
            if t:  # the previous reply and observation join the history; the oldest leaves beyond history_turns
                history[e] = (history[e] + [tokens(s.history_tokens_per_turn)])[-s.history_turns:]
            body = first[e // group_size % tasks] + [tok for h in history[e] for tok in h]
            rows.append(system + body)
            teacher.append(system + rules + kinds[(e // group_size) % s.task_kinds] + body)
            responses.append(tokens(rng.randint(*s.response_tokens)))
        all_turns.append(rows)
    return StepRows(all_turns, teacher, responses)


# ---- measuring ------------------------------------------------------------------------------------------------
def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _trim_heap() -> None:
    """Hand freed heap back to the OS (glibc keeps it otherwise, and the next phase's growth would hide)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@contextlib.contextmanager
def measured(out: dict[str, float]) -> Iterator[None]:
    """Wall and CPU seconds of the block, and its peak RSS above the RSS at its start (sampled every 5 ms)."""
    _trim_heap()
    start_rss = _rss_bytes()
    peak = [start_rss]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        done.set()
        sampler.join()
        peak[0] = max(peak[0], _rss_bytes())
        out.update(wall_s=wall, cpu_s=cpu, peak_rss_mb=peak[0] / 2**20, extra_rss_mb=(peak[0] - start_rss) / 2**20)


def decode(policy: HFPolicy, step: StepRows) -> None:
    for prompts in step.turns:  # one sampler call per turn: the environments answer in between
        policy.generate_ids(prompts)


def teacher(model: Any, step: StepRows, s: Shapes, pad_id: int) -> None:
    prefix_shared_response_logprobs(model, step.teacher, step.responses, pad_id=pad_id,
                                    max_tokens=s.micro_batch_tokens, max_rows=s.micro_batch_rows)


def update(model: Any, optimizer: torch.optim.Optimizer, step: StepRows, s: Shapes, pad_id: int) -> None:
    """`Trainer.update`'s work on these rows: mini-batches of `mini_batch_rows`, one AdamW step each."""
    prompts, responses = step.prompts, step.responses
    packed = supports_packing(model)
    model.train()
    order = list(range(len(prompts)))
    random.Random(0).shuffle(order)
    for m in range(0, len(order), s.mini_batch_rows):
        chosen = order[m:m + s.mini_batch_rows]
        lengths = [len(prompts[i]) + len(responses[i]) for i in chosen]
        num_tokens = sum(len(responses[i]) for i in chosen)
        for local in bucket_micro_batches(lengths, max_tokens=s.micro_batch_tokens, max_rows=s.micro_batch_rows,
                                          padded=not packed):
            idx = [chosen[j] for j in local]
            if packed:
                pb = pack(idx, prompts, responses)
                logp, ent = packed_response_logprobs(model, pb, with_entropy=True)
                mask = pb.response_mask
            else:
                mb = collate(idx, prompts, responses, pad_id)
                logp, ent = response_logprobs(model, mb, with_entropy=True)
                mask = mb.response_mask
            adv = torch.tensor([1.0 if i % 2 else -1.0 for i in idx]).unsqueeze(1).expand_as(logp)
            terms = policy_objective(logp, logp.detach() - 0.01, adv, mask, entropy=ent, ref_logp=None,
                                     clip_low=0.2, clip_high=0.28, kl_coef=0.0, entropy_coef=0.001,
                                     num_tokens=num_tokens)
            terms.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def grid(quick: bool) -> list[Point]:
    """(episodes, group size, turns, prompt tokens) of every point. Off the group-size axis, G is small enough
    that a step holds several tasks (of different kinds): with one task every first-turn prompt would be the
    same and decode and teacher would compute it once, hiding the growth the axis is about."""
    if quick:
        axes = {"episodes": [(e, 2, 1, 225) for e in (4, 8, 16)],
                "group size": [(8, g, 1, 225) for g in (1, 4, 8)],
                "turns": [(2, 1, t, 225) for t in (1, 2, 4)],
                "prompt tokens": [(4, 1, 1, p) for p in (128, 256, 512)]}
    else:
        axes = {"episodes": [(e, 4, 1, 225) for e in (8, 16, 32, 64)],
                "group size": [(16, g, 1, 225) for g in (1, 4, 16)],
                "turns": [(1, 1, t, 225) for t in (1, 2, 4, 8)],
                "prompt tokens": [(2, 1, 1, p) for p in (128, 256, 512, 1024)]}
    x_of = {"episodes": 0, "group size": 1, "turns": 2, "prompt tokens": 3}
    return [Point(axis, v[x_of[axis]], *v) for axis, values in axes.items() for v in values]


def slope(xs: list[float], ys: list[float]) -> float:
    """Log-log slope between the first and the last point (1 = linear growth)."""
    if len(xs) < 2 or min(ys[0], ys[-1]) <= 0:
        return math.nan
    return math.log(ys[-1] / ys[0]) / math.log(xs[-1] / xs[0])


def growth_words(exponent: float) -> str:
    if math.isnan(exponent):
        return "n/a"
    if abs(exponent) < 0.15:
        return "flat"
    if exponent < 0:
        return "falling"
    if exponent < 0.85:
        return "sublinear"
    return "linear" if exponent <= 1.15 else "superlinear"


def summary(points: list[Point]) -> tuple[dict[str, dict[str, float]], str]:
    slopes: dict[str, dict[str, float]] = {}
    for axis in dict.fromkeys(p.axis for p in points):
        pts = [p for p in points if p.axis == axis]
        slopes[axis] = {}
        for phase in PHASES:
            have = [p for p in pts if phase in p.phases]
            if len(have) >= 2:
                slopes[axis][phase] = slope([p.x for p in have], [p.phases[phase]["cpu_s"] for p in have])
                slopes[axis][f"{phase} memory"] = slope([p.x for p in have],
                                                        [max(p.phases[phase]["extra_rss_mb"], 1.0) for p in have])
    parts = []
    for axis, s in slopes.items():
        times = ", ".join(f"{ph} {growth_words(s[ph])} ({s[ph]:.2f})" for ph in PHASES if ph in s)
        mems = ", ".join(f"{ph} {growth_words(s[f'{ph} memory'])} ({s[f'{ph} memory']:.2f})"
                         for ph in PHASES if ph in s)
        parts.append(f"with {axis}: time {times}; peak memory {mems}")
    return slopes, "CPU time and peak memory (log-log slope, 1 = linear) grow " + "; ".join(parts) + "."


def plot(points: list[Point], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_names = list(dict.fromkeys(p.axis for p in points))
    fig, axes = plt.subplots(2, len(axes_names), figsize=(4.2 * len(axes_names), 7.5), squeeze=False)
    colors = {"decode": "tab:blue", "teacher": "tab:orange", "update": "tab:green", "step": "black"}
    for col, axis in enumerate(axes_names):
        pts = [p for p in points if p.axis == axis]
        for row, (key, label) in enumerate((("cpu_s", "CPU seconds"), ("extra_rss_mb", "peak extra RSS (MB)"))):
            ax = axes[row][col]
            for phase in PHASES:
                have = [p for p in pts if phase in p.phases]
                if have:
                    ax.plot([p.x for p in have], [max(p.phases[phase][key], 1e-3) for p in have], "o-",
                            color=colors[phase], label=phase)
            if key == "cpu_s" and all(len(p.phases) == len(PHASES) for p in pts):
                ax.plot([p.x for p in pts], [sum(v["cpu_s"] for v in p.phases.values()) for p in pts], "s--",
                        color=colors["step"], label="step (sum)")
            xs = [p.x for p in pts]
            if axis != "group size":  # a line of slope 1 through the first point of the largest phase: linear growth
                y0 = max(p.phases[ph][key] for p in pts[:1] for ph in p.phases)
                ax.plot(xs, [y0 * x / xs[0] for x in xs], ":", color="gray", label="∝ x (linear)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.set_xlabel(axis)
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
            if row == 0 and col == 0:
                ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct", help="model spec or folder")
    ap.add_argument("--trainable-layers", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="a smaller grid (3 points per axis, shorter ranges)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="output stem (default benchmarks/results/cost_growth)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    console = Console(width=200)
    shapes = Shapes()
    model, tok = load_policy_model(args.model)
    freeze_lower_layers(model, args.trainable_layers)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.0)  # weights stay put
    policy = HFPolicy(model, tok, max_new_tokens=shapes.new_tokens, temperature=1.0, stop_strings=(),
                      batch_size=shapes.decode_batch, seed=args.seed)
    policy.eos_ids = set()  # every row decodes the full budget: the cost of a full-length turn
    pad_id = int(tok.pad_token_id)
    points = grid(args.quick)
    t_start = time.perf_counter()
    # warm-up (allocator, lazy init): one small point of each phase, not recorded
    warm = synthetic_step(shapes, episodes=2, group_size=2, turns=1, prompt_tokens=64, vocab=len(tok), seed=1)
    decode(policy, warm)
    teacher(model, warm, shapes, pad_id)
    update(model, optimizer, warm, shapes, pad_id)
    for n, p in enumerate(points):
        step = synthetic_step(shapes, episodes=p.episodes, group_size=p.group_size, turns=p.turns,
                              prompt_tokens=p.prompt_tokens, vocab=len(tok), seed=args.seed + n)
        p.rows = len(step.responses)
        p.update_tokens = sum(len(a) + len(b) for a, b in zip(step.prompts, step.responses, strict=True))
        p.teacher_tokens = sum(len(a) + len(b) for a, b in zip(step.teacher, step.responses, strict=True))
        phases = ("decode", "teacher") if p.axis == "group size" else PHASES
        for phase in phases:
            out: dict[str, float] = {}
            with measured(out):
                if phase == "decode":
                    decode(policy, step)
                elif phase == "teacher":
                    teacher(model, step, shapes, pad_id)
                else:
                    update(model, optimizer, step, shapes, pad_id)
            p.phases[phase] = out
        console.print(f"[{n + 1}/{len(points)}] {p.axis}={p.x}: {p.rows} rows, "
                      + ", ".join(f"{ph} {v['cpu_s']:.1f} CPU s / +{v['extra_rss_mb']:.0f} MB"
                                  for ph, v in p.phases.items()))
    seconds = time.perf_counter() - t_start

    table = Table(title=f"cost growth ({args.model}, top {args.trainable_layers} layers train, {args.threads} "
                        f"thread(s); CPU seconds and peak extra RSS per phase)")
    for col in ("axis", "value", "episodes", "G", "turns", "prompt", "rows", "update tokens", "decode s",
                "teacher s", "update s", "step s", "decode MB", "teacher MB", "update MB", "update s / 1k tokens"):
        table.add_column(col, justify="left" if col == "axis" else "right")
    for p in points:
        ph = p.phases

        def cell(phase: str, key: str, fmt: str, ph: dict = ph) -> str:
            return format(ph[phase][key], fmt) if phase in ph else "–"

        step_s = f"{sum(v['cpu_s'] for v in ph.values()):.1f}" if len(ph) == len(PHASES) else "–"
        per_k = f"{1000 * ph['update']['cpu_s'] / p.update_tokens:.2f}" if "update" in ph else "–"
        table.add_row(p.axis, str(p.x), str(p.episodes), str(p.group_size), str(p.turns), str(p.prompt_tokens),
                      str(p.rows), str(p.update_tokens), cell("decode", "cpu_s", ".1f"), cell("teacher", "cpu_s", ".1f"),
                      cell("update", "cpu_s", ".1f"), step_s, cell("decode", "extra_rss_mb", ".0f"),
                      cell("teacher", "extra_rss_mb", ".0f"), cell("update", "extra_rss_mb", ".0f"), per_k)
    console.print(table)
    slopes, sentence = summary(points)
    console.print(sentence)

    stem = Path(args.out) if args.out else RESULTS / ("cost_growth_quick" if args.quick else "cost_growth")
    stem.parent.mkdir(parents=True, exist_ok=True)
    plot(points, stem.with_suffix(".png"),
         f"cost growth per phase ({args.threads} thread, CPU s; memory = peak RSS above the phase's start)")
    payload = {"model": args.model, "trainable_layers": args.trainable_layers, "threads": args.threads,
               "quick": args.quick, "shapes": asdict(shapes), "seconds_total": seconds,
               "loadavg": list(os.getloadavg()), "cpu_count": os.cpu_count(), "points": [asdict(p) for p in points],
               "slopes": slopes, "summary": sentence}
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    console.print(f"wrote {stem.with_suffix('.json')} and {stem.with_suffix('.png')} ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
