"""Same seeds, same numbers: record a seeded training run's per-step metrics, and check a later tree against them.

    python benchmarks/same_numbers.py --record benchmarks/results/same_numbers.json        # before a refactor
    python benchmarks/same_numbers.py --check  benchmarks/results/same_numbers.json        # after it
    python benchmarks/same_numbers.py --check FILE --cases cpu-tiny                         # only the seconds-long case

A refactor that claims "no change in behaviour" proves it here: each case is a short seeded training run whose
per-step metrics (losses, advantages, success, gradient norms, ... everything but wall-clock and memory) must
match the recorded ones to `--rtol`. The cases:

- `cpu-tiny`: the CI preset (tiny random model, AgentOPSD, DeepSpeed on the CPU), 2 steps.
- `cpu-tiny-outcome`: the same with the main job's recipe switches (outcome penalty, dynamic sampling, the
  teacher with the privileged hint), 2 steps.
- `cpu-learn-step`: one RL step of `cpu-learn` (SmolLM2-135M from the cached warm start; 2 tasks per step),
  after the preset's validation at start (48 held-out episodes; it runs, but only the RL step is compared): ~15 min on an
  idle 2-core machine, an hour on a loaded one. Needs the warm start's cache entry (else it trains it first,
  ~20 min).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "cpu-tiny": ("cpu-tiny", ("trainer.seed=0",)),
    "cpu-tiny-outcome": ("cpu-tiny", ("trainer.seed=1", "algorithm.penalty_mode=outcome",
                                      "rollout.dynamic_sampling=true", "rollout.max_sampling_rounds=2",
                                      "teacher.context=skills+hint")),
    "cpu-learn-step": ("cpu-learn", ("trainer.seed=0", "trainer.total_steps=1", "rollout.tasks_per_step=2",
                                     "trainer.eval_every=0", "trainer.save_every=0", "warm_start.seed=0")),
}
# Wall-clock, memory and throughput differ between runs of the same code; everything else must not.
VOLATILE_PREFIXES = ("seconds", "memory/", "tokens_per_second", "warm_start/seconds")


def run_case(name: str, workdir: Path, threads: int) -> list[dict[str, float]]:
    import torch

    from agentgym_opsd.trainer.config import load_config
    from agentgym_opsd.trainer.loop import Trainer

    torch.set_num_threads(threads)
    config, overrides = CASES[name]
    cfg = load_config(config, [*overrides, f"trainer.output_dir={workdir / name}", "trainer.progress=false"])
    trainer = Trainer(cfg)
    try:
        history = trainer.train()
    finally:
        trainer.close()
    return [{k: float(v) for k, v in step.items()
             if isinstance(v, (int, float)) and not k.startswith(VOLATILE_PREFIXES)} for step in history]


def differences(recorded: list[dict[str, float]], now: list[dict[str, float]], rtol: float) -> list[str]:
    if len(recorded) != len(now):
        return [f"{len(now)} logged steps, recorded {len(recorded)}"]
    out = []
    for i, (a, b) in enumerate(zip(recorded, now, strict=True)):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                out.append(f"step {i}: {key} only {'recorded' if key in a else 'now'}")
            elif not math.isclose(a[key], b[key], rel_tol=rtol, abs_tol=rtol) and not (math.isnan(a[key]) and math.isnan(b[key])):
                out.append(f"step {i}: {key} recorded {a[key]!r}, now {b[key]!r}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", type=Path, help="run the cases and write their metrics here (merged by case)")
    mode.add_argument("--check", type=Path, help="run the cases and compare with this file")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rtol", type=float, default=1e-6)
    args = ap.parse_args()
    path: Path = args.record or args.check
    recorded: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    failures = 0
    with tempfile.TemporaryDirectory(prefix="same-numbers-") as tmp:
        for name in args.cases:
            now = run_case(name, Path(tmp), args.threads)
            if args.record:
                recorded[name] = now
                print(f"{name}: recorded {len(now)} steps")
                continue
            if name not in recorded:
                print(f"{name}: not in {path}", file=sys.stderr)
                failures += 1
                continue
            diff = differences(recorded[name], now, args.rtol)
            failures += bool(diff)
            print(f"{name}: {'same numbers' if not diff else 'DIFFERENT'} ({len(now)} steps, "
                  f"{sum(len(s) for s in now)} values)")
            for line in diff[:20]:
                print(f"  {line}")
    if args.record:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
