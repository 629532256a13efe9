"""The main job's wall time, as a new user meets it: README's command (`-m agentgym_opsd.train --config
cpu-small`) run cold (an empty cache: the dtype probe, the generated games, the warm start, the start
evaluation and vLLM's compiled graphs are all made) and then warm (the same cache again), once per interpreter.

    python benchmarks/bench_main_job_time.py                      # .venv, cold then warm
    python benchmarks/bench_main_job_time.py --passes cold --threads 1 --out runs/seed1 --set trainer.seed=1

`rollout.backend=auto` picks vLLM's CPU engine where it is installed (`.venv`) and its start pays for the run's
episodes. Each record keeps what the run printed of its learning: held-out and pool success before -> after, and
the held-out episodes gained and lost one by one. Each run's own `time:` line gives the minutes per phase. Run it on idle
cores: the figures are the machine's, and the record says which CPU (one record per CPU, as `precision.json`).

Writes `benchmarks/results/main_job_time.json`: `{"machines": {cpu: {"runs": [{"python", "pass", "wall_min",
"time_report", "phases_min", "success", "precision", "rollout_backend", "warm_start"} and, for vLLM on
the CPU, "preloaded" (the runtime libraries its log names), ...]}}}`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from harness import (
    cpu_model,
    last_time_line,
    parse_time_report,
    read_machines,
    run_training,
    train_command,
    training_env,
    write_machine_record,
)
from rich.console import Console
from rich.table import Table

from agentgym_opsd.cpu_runtime import LOG_PREFIX

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SUCCESS = re.compile(r"^(?P<label>(held-out|training-pool) success|held-out episodes): (?P<line>.*)$")
PRELOADED = re.compile(re.escape(LOG_PREFIX) + r"(?P<what>.*)$")


def run_main_job(python: str, run_dir: Path, cache: Path, threads: int, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """README's main job under `python`, its output in `run_dir`, its cache in `cache` (`threads` > 0: its
    OMP_NUM_THREADS; `overrides`: `key=value` settings after the preset's, to time a recipe change): wall
    minutes, the run's time line, and the success lines it printed."""
    # vLLM's compiled graphs are cached too (in ~/.cache/vllm by default): a cold pass starts without them
    env = {**training_env(threads, cache), "VLLM_CACHE_ROOT": str(cache / "vllm")}
    argv = train_command(python, "cpu-small", run_dir, overrides)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = run_dir.with_suffix(".log")
    start = time.perf_counter()
    lines = run_training(argv, env, log_path, what=" ".join(argv), cwd=ROOT)
    wall_min = (time.perf_counter() - start) / 60
    time_line = last_time_line(log_path)
    success = {m["label"].strip(): m["line"].strip() for line in lines if (m := SUCCESS.match(line.strip()))}
    preloaded = [m["what"].strip() for line in lines if (m := PRELOADED.search(line))]  # agentgym_opsd/cpu_runtime.py
    return {"wall_min": round(wall_min, 2), "time_report": time_line,
            **({"preloaded": preloaded[0]} if preloaded else {}),
            "phases_min": parse_time_report(time_line) if time_line else {}, "success": success, **run_record(run_dir)}


def run_record(run_dir: Path) -> dict[str, Any]:
    """What the run resolved (precision, sampler) and its warm start: trained or reused, its held-out action exact
    match and seconds."""
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    summary_path = run_dir / "warm_start" / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() else {}
    return {"precision": resolved["model"]["precision"], "rollout_backend": resolved["rollout"]["backend"],
            "warm_start": {"cache_hit": bool(summary.get("warm_start/cache_hit")),
                           "heldout_action_exact_match": summary.get("warm_start/heldout_action_exact_match"),
                           "seconds_sft": summary.get("warm_start/seconds_sft")}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_pythons = [p for p in (ROOT / ".venv/bin/python",) if p.exists()]
    ap.add_argument("--python", nargs="+", default=[str(p) for p in default_pythons],
                    help="interpreters to run the main job with (default: .venv)")
    ap.add_argument("--passes", nargs="+", choices=("cold", "warm"), default=["cold", "warm"],
                    help="cold: an empty cache; warm: the cache the cold pass filled (run after it)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "main-job-time", help="run folders and caches")
    ap.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS for the runs (0: torch's default)")
    ap.add_argument("--results", type=Path, default=RESULTS / "main_job_time.json")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting after cpu-small's (repeatable), to time a recipe change; kept in the record")
    args = ap.parse_args(argv)
    cpu = cpu_model()
    record = read_machines(args.results).get(cpu, {"runs": []})
    for python in args.python:
        venv = Path(python).parents[1].name if Path(python).parent.name == "bin" else Path(python).name  # .venv-vllm
        cache = args.out / venv / "cache"
        for which in args.passes:
            run_dir = args.out / venv / which
            if which == "cold" and cache.exists():
                raise SystemExit(f"{cache} exists: a cold pass needs an empty cache (remove it, or run --passes warm)")
            if run_dir.exists():
                raise SystemExit(f"{run_dir} exists: remove it first (this benchmark never deletes a folder)")
            print(f"{venv} {which}: running the main job ({cpu}, {os.getloadavg()[0]:.1f} load)", file=sys.stderr)
            result = {"python": venv, "pass": which, "load_avg_before": round(os.getloadavg()[0], 2),
                      **({"overrides": args.overrides} if args.overrides else {}),
                      **run_main_job(python, run_dir, cache, args.threads, args.overrides)}
            same = (venv, which, args.overrides)  # a recipe change is a record of its own beside README's command
            record["runs"] = [r for r in record["runs"] if (r["python"], r["pass"], r.get("overrides", [])) != same]
            record["runs"].append(result)
            write_machine_record(args.results, cpu, record)
            print(f"{venv} {which}: {result['wall_min']:.1f} min; {result['time_report']}", file=sys.stderr)
    table = Table(title=f"the main job (cpu-small), {cpu}")
    for col in ("python", "pass", "precision", "sampler", "wall min", "warm start", "evaluation", "rollout", "teacher",
                "update"):
        table.add_column(col, justify="right")
    for r in record["runs"]:
        phases = r["phases_min"]
        table.add_row(r["python"], r["pass"], r.get("precision") or r["dtype"], r["rollout_backend"], f"{r['wall_min']:.1f}",
                      *(f"{phases.get(p, 0.0):.1f}" for p in ("warm start", "evaluation", "rollout", "teacher",
                                                              "update")))
    Console().print(table)
    print(f"wrote {args.results}", file=sys.stderr)


if __name__ == "__main__":
    main()
