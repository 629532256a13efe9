"""How closely saved warm starts fit their demonstrations: teacher-forced NLL in float32 and under bf16 autocast.

`bench_warm_start_autocast.py` plays each warm start's policy; this reads the same warm starts another way. For
each `NAME@SEED=DIR` (a warm start's `model` folder, or a run folder with `warm_start/summary.json`), it rebuilds
the demonstrations of that `warm_start.seed` (its held-out episodes and a sample of its training rows), loads the
weights into the preset's model and scores the expert's response tokens twice: with the trained blocks in float32
and under autocast (`model.autocast=on`, what the RL phases compute). Per token: the mean NLL and the share of
tokens the model gives less than 0.5; per response (one action): the mean NLL and the share the model would
sample with probability under 0.9.

Two questions it answers: does one SFT precision leave a looser fit of the demonstrations, and does the
precision of the measurement change the figures? Neither `trainer.total_steps` nor the warm-start cache is touched.

    python benchmarks/bench_sft_fit.py float32@0=RUN_A autocast@0=RUN_B      # -> results/sft_fit.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from bench_warm_start_autocast import run_label  # noqa: E402
from experiments import warm_start_dir  # noqa: E402
from harness import cpu_model, make_trainer, write_machine_record  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def parse_model(arg: str) -> tuple[str, int, Path]:
    """`NAME@SEED=DIR` -> (NAME, SEED, the weights folder): DIR itself, DIR/model, or the model folder a run's
    warm-start summary names."""
    label, _, folder = arg.partition("=")
    name, _, seed = label.partition("@")
    if not folder or not name or not seed.isdigit():
        raise SystemExit(f"{arg!r}: expected NAME@SEED=DIR")
    path = Path(folder)
    if (run_weights := warm_start_dir(path)) is not None:
        path = Path(run_weights)
    elif (path / "model").is_dir():
        path = path / "model"
    if not any(path.glob("*.safetensors")):
        raise SystemExit(f"{arg!r}: no safetensors weights in {path}")
    return name, int(seed), path


def fit_figures(token_nll: list[np.ndarray]) -> dict[str, float]:
    """The figures of one set of responses, from each response's per-token NLL."""
    tokens = np.concatenate(token_nll)
    responses = np.array([row.sum() for row in token_nll])
    return {"token_nll": float(tokens.mean()), "tokens_p_under_half": float((tokens > np.log(2)).mean()),
            "response_nll": float(responses.mean()),
            "responses_p_under_0.9": float((responses > -np.log(0.9)).mean()), "responses": len(token_nll)}


def response_nll(model: torch.nn.Module, rows: list[Any]) -> list[np.ndarray]:
    """Each row's response tokens' NLL, in the rows' order (the SFT's packed layout, the shared prefix laid once)."""
    from agentgym_opsd.trainer.logprobs import packed_batched_response_logprobs

    logps = packed_batched_response_logprobs(model, [r.prompt_ids for r in rows], [r.response_ids for r in rows])
    return [-logp.double().numpy() for logp in logps]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", metavar="NAME@SEED=DIR")
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--train-rows", type=int, default=96, help="training rows sampled per seed (0: all)")
    ap.add_argument("--note", default="", help="where the warm starts came from, kept in the record")
    ap.add_argument("--out", type=Path, default=RESULTS / "sft_fit.json")
    args = ap.parse_args(argv)
    models = [parse_model(arg) for arg in args.models]

    from agentgym_opsd.models.loading import blocks_autocast
    from agentgym_opsd.trainer.warm_start import (
        WarmStart,
        collect_demonstrations,
        demonstration_rows,
        split_heldout,
    )

    with tempfile.TemporaryDirectory() as tmp:
        # the warm starts' own model: bf16 frozen layers under float32 trained blocks, which autocast on demand
        trainer = make_trainer(args.config, ["rollout.backend=hf", "model.dtype=bfloat16", "model.autocast=on",
                                             "warm_start.cache=off"], tmp)
        session, policy = trainer.session, trainer.session.trained
        runner = session.envs[0].runner
        rows_of: dict[int, dict[str, list[Any]]] = {}
        for seed in sorted({seed for _, seed, _ in models}):
            cfg = dataclasses.replace(session.cfg, warm_start=dataclasses.replace(session.cfg.warm_start, seed=seed))
            stage = WarmStart(cfg, run_dir=Path(tmp), system_prompt=runner.profile.system_prompt,
                              env_num_tasks=session.envs[0].env_num_tasks, demonstrator=runner.profile.demonstrator)
            demos = collect_demonstrations(runner, stage.demonstration_tasks(), thought=cfg.warm_start.thought,
                                           batch=runner.pool.num_envs)
            train_demos, heldout = split_heldout(demos, cfg.warm_start.heldout_episodes)  # as the SFT split them
            train = demonstration_rows(train_demos, policy.encode, policy.tokenizer)
            if 0 < args.train_rows < len(train):
                pick = np.random.default_rng(seed).choice(len(train), args.train_rows, replace=False)
                train = [train[i] for i in sorted(pick)]
            rows_of[seed] = {"heldout": demonstration_rows(heldout, policy.encode, policy.tokenizer), "train": train}
        runs: dict[str, dict[str, Any]] = {}
        for name, seed, folder in models:
            policy.load_weights(folder)
            entry: dict[str, Any] = {"variant": name, "seed": seed}
            for numerics, autocast in (("float32", False), ("autocast", True)):
                with blocks_autocast(policy.model, enabled=autocast):
                    entry[numerics] = {split: fit_figures(response_nll(policy.model, rows))
                                       for split, rows in rows_of[seed].items() if rows}
            runs[run_label(name, seed)] = entry
            print(f"{name}@{seed}: {json.dumps(entry)}", file=sys.stderr, flush=True)
    cpu = cpu_model()
    write_machine_record(args.out, cpu, {"config": args.config, "cpu": cpu, "note": args.note, "runs": runs})

    table = Table(title=f"the warm starts' fit of their demonstrations, {args.config}, {cpu}")
    for col in ("SFT", "seed", "measured in", "held-out token NLL", "held-out actions p < 0.9", "train token NLL",
                "train actions p < 0.9"):
        table.add_column(col, justify="right")
    for run in runs.values():
        for numerics in ("float32", "autocast"):
            fig = run[numerics]
            cells = []
            for split in ("heldout", "train"):
                cells += [f"{fig[split]['token_nll']:.4f}", f"{fig[split]['responses_p_under_0.9']:.1%}"] \
                    if split in fig else ["-", "-"]
            table.add_row(run["variant"], str(run["seed"]), numerics, *cells)
    Console().print(table)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
