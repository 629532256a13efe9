"""The HF sampler with and without one of its savings, side by side in one process (`--compare`):

- `shared-prefix`: `HFPolicy` prefills the prefix that every prompt of a chunk starts with (the system message)
  once and copies its cache rows (`models/hf_policy.py`, `MIN_SHARED_PREFIX`), against prefilling every prompt
  whole. Modes `shared` / `whole`; `benchmarks/results/hf_shared_prefix.json`.
- `kv-cache`: decoding writes each token's keys and values into room reserved after the prefill
  (`models/kv_cache.py`), against transformers' `DynamicCache`, which concatenates the whole cache again per
  token; both prefill left-padded (a concatenating cache cannot take a packed prefill). Modes `reserved` / `concatenated`; `benchmarks/results/hf_kv_cache.json`.
- `packed-prefill`: a chunk's prompts (their suffixes after the shared prefix) are prefilled end to end in one
  sequence, each row attending to the prefix and itself (`models/packed_attention.py`), against left-padding them
  to the chunk's longest. Modes `packed` / `padded`; `benchmarks/results/hf_packed_prefill.json`. With
  `--set rollout.batch_size=64 --episodes 64` a chunk is validation's (`trainer.eval_batch_episodes` on
  `cpu-learn`), whose prompts are further apart in length than a training chunk's of 16 (that one's record:
  `--out benchmarks/results/hf_packed_prefill_rollout.json`).
- `autocast`: on a bf16 model with float32 trainable blocks, those blocks' matmuls in bf16 under autocast
  (`model.autocast=on`, what `auto` picks where bf16 pays), against the same blocks in float32
  (`blocks_autocast(model, enabled=False)`). Autocast casts the float32 weights to bf16 in every forward, and a
  decode step is a forward for one token a row, so this is where it could cost rather than pay. Modes
  `autocast` / `float32-blocks`; `benchmarks/results/hf_autocast.json`. The samples differ (other numerics).

A `cpu-small` trainer (SmolLM2-135M-Instruct, float32, no warm start, dynamic sampling off; `--set KEY=VALUE` for
more, such as `model.name_or_path=` a warm start's folder, whose replies are as short as the main job's) plays the
same ALFWorld episodes with the same sampler seed in alternating rounds (new, baseline, baseline, new, ...) after one
warm-up round, so a drift of the machine falls on both. Both must sample the same tokens (float32 rounding aside):
the table reports whether every round generated the same tokens. Reported per mode: the median seconds, generated
tokens/s, and the tokens fed to the model. The JSON keeps one record per CPU (`harness.cpu_model`).

    python benchmarks/bench_hf_sampler.py                        # -> benchmarks/results/hf_shared_prefix.json
    python benchmarks/bench_hf_sampler.py --compare kv-cache     # -> benchmarks/results/hf_kv_cache.json
    python benchmarks/bench_hf_sampler.py --compare packed-prefill --set rollout.batch_size=64 --episodes 64
    python benchmarks/bench_hf_sampler.py --compare autocast     # -> benchmarks/results/hf_autocast.json
    python benchmarks/bench_hf_sampler.py --episodes 4 --rounds 1 --config cpu-tiny --out /tmp/h.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from bench_rollout_backends import GROUP_SIZE, RESULTS  # noqa: E402
from harness import cpu_model, make_trainer, write_machine_record  # noqa: E402

from agentgym_opsd.models import hf_policy, kv_cache  # noqa: E402
from agentgym_opsd.models.loading import autocast_blocks, blocks_autocast  # noqa: E402


@contextlib.contextmanager
def as_is(model: torch.nn.Module) -> Iterator[None]:
    """The sampler as it ships."""
    yield


def _concatenating_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=getattr(model, "config", None))


def _padded_prefill() -> contextlib.AbstractContextManager:
    """The sampler with its chunks' prompts prefilled left-padded, not packed."""
    return mock.patch.object(hf_policy.HFPolicy, "_packs", lambda self, *args: False)


COMPARISONS: dict[str, dict[str, Callable[[torch.nn.Module], contextlib.AbstractContextManager]]] = {
    # the sampler as it ships first, then the mode without the saving; each switch gets the trained model
    "shared-prefix": {"shared": as_is,
                      "whole": lambda model: mock.patch.object(hf_policy, "MIN_SHARED_PREFIX", 10**9)},
    # both prefill left-padded: a concatenating cache cannot be unpacked into rows after a packed prefill
    "kv-cache": {"reserved": lambda model: _padded_prefill(),
                 "concatenated": lambda model: mock.patch.object(kv_cache, "reserved_cache", _concatenating_cache)},
    "packed-prefill": {"packed": as_is, "padded": lambda model: _padded_prefill()},
    "autocast": {"autocast": as_is, "float32-blocks": lambda model: blocks_autocast(model, enabled=False)},
}
RESULT_FILES = {"shared-prefix": "hf_shared_prefix.json", "kv-cache": "hf_kv_cache.json",
                "packed-prefill": "hf_packed_prefill.json", "autocast": "hf_autocast.json"}
COMPARISON_SETTINGS = {"autocast": ("model.dtype=bfloat16", "model.autocast=on")}  # after the bench's float32


def portable(setting: str) -> str:
    """`KEY=VALUE` with an absolute path's folders above its last three left out (`…/warm_start/<key>/model`): a
    record says which cache entry a run used without this machine's paths."""
    key, _, value = setting.partition("=")
    parts = Path(value).parts
    return f"{key}=…/{'/'.join(parts[-3:])}" if Path(value).is_absolute() and len(parts) > 4 else setting


def order(modes: tuple[str, str], rounds: int) -> list[str]:
    """new, baseline, baseline, new, ...: each mode first in half of the pairs."""
    return [mode for i in range(rounds) for mode in (modes if i % 2 == 0 else modes[::-1])]


def counting_prefill(model: torch.nn.Module) -> tuple[list[int], Any]:
    """Counts the tokens every forward call feeds the model (its embedding's input), prefill and decode."""
    fed: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda mod, args, out: fed.append(args[0].numel()))
    return fed, hook


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", choices=list(COMPARISONS), default="shared-prefix")
    ap.add_argument("--config", default="cpu-small")
    ap.add_argument("--episodes", type=int, default=32, help="a multiple of 4 (G = 4)")
    ap.add_argument("--rounds", type=int, default=2, help="pairs of rounds (one per mode each)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a setting after the bench's own")
    ap.add_argument("--out", type=Path, help="the JSON (default: benchmarks/results/ per --compare)")
    args = ap.parse_args(argv)
    out = args.out or RESULTS / RESULT_FILES[args.compare]
    switches = COMPARISONS[args.compare]
    modes = tuple(switches)
    if args.episodes % GROUP_SIZE:
        raise SystemExit(f"--episodes must be a multiple of {GROUP_SIZE}")
    tasks = args.episodes // GROUP_SIZE
    overrides = ["model.dtype=float32", "rollout.backend=hf", "warm_start.epochs=0", "warm_start.steps=0",
                 "rollout.dynamic_sampling=false", f"rollout.tasks_per_step={tasks}", f"rollout.group_size={GROUP_SIZE}",
                 *COMPARISON_SETTINGS.get(args.compare, ()), *args.set]
    load_before = os.getloadavg()[0]
    rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    samples: dict[str, list[tuple[int, ...]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_hf_sampler_") as tmp:
        trainer = make_trainer(args.config, overrides, tmp)
        try:
            cfg = trainer.session.cfg
            fed, hook = counting_prefill(trainer.session.trained.model)

            def play(n_tasks: int, mode: str) -> tuple[float, list[Any], dict[str, Any]]:
                """The round's seconds, trajectories, and what the sampler ran with (its KV cache's layer kind, its
                shared-prefix threshold, the blocks computing under autocast), so a record shows that the mode's
                switch was in effect."""
                trainer.session.cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, tasks_per_step=n_tasks))
                trainer.session.tasks_per_rank, trainer.task_cursor = n_tasks, 0  # the same tasks and sampler seed
                trainer.session.policy = trainer.session.policy.with_sampling(temperature=cfg.rollout.temperature,
                                                                              seed=cfg.trainer.seed)
                with switches[mode](trainer.session.trained.model):
                    made, factory = [], kv_cache.reserved_cache
                    with mock.patch.object(kv_cache, "reserved_cache", lambda m: made.append(factory(m)) or made[-1]):
                        t0 = time.perf_counter()
                        trajs = trainer.collect()
                        seconds = time.perf_counter() - t0
                    blocks = autocast_blocks(trainer.session.trained.model)
                    ran_with = {"cache_layers": sorted({type(layer).__name__ for c in made for layer in c.layers}),
                                "min_shared_prefix": hf_policy.MIN_SHARED_PREFIX,
                                "autocasting_blocks": sum(block.autocast_enabled for block in blocks)}
                    return seconds, trajs, ran_with

            play(1, modes[0])  # warm-up: allocator, caches
            for mode in order(modes, args.rounds):
                fed.clear()
                seconds, trajs, ran_with = play(tasks, mode)
                tokens = [tuple(t.response_token_ids) for traj in trajs for t in traj.turns]
                samples.setdefault(mode, tokens)
                rounds[mode].append({"seconds": seconds, "generated_tokens": sum(map(len, tokens)),
                                     "fed_tokens": sum(fed), "same_samples": tokens == samples[mode], **ran_with})
                print(f"{mode}: {seconds:.1f} s, {sum(map(len, tokens))} tokens generated, {sum(fed)} fed",
                      file=sys.stderr)
        finally:
            hook.remove()
            trainer.close()
    summary = {mode: {"median_s": statistics.median(r["seconds"] for r in rs),
                      "tokens_per_s": statistics.median(r["generated_tokens"] / r["seconds"] for r in rs),
                      "fed_tokens": rs[0]["fed_tokens"], "rounds": rs} for mode, rs in rounds.items()}
    new, baseline = modes
    same = samples[new] == samples[baseline] and all(r["same_samples"] for rs in rounds.values() for r in rs)
    cpu = cpu_model()
    record = {"compare": args.compare, "config": args.config, "settings": [portable(s) for s in args.set],
              "episodes": args.episodes,
              "group_size": GROUP_SIZE, "rounds": args.rounds,
              "threads": torch.get_num_threads(), "min_shared_prefix": hf_policy.MIN_SHARED_PREFIX,
              "load_avg_before_after": [load_before, os.getloadavg()[0]], "cpu": cpu, "modes": summary,
              "same_samples": same, "speedup": summary[baseline]["median_s"] / summary[new]["median_s"]}
    write_machine_record(out, cpu, record)

    table = Table(title=f"HF sampler, {args.episodes} episodes, {cpu}")
    for col in (args.compare, "median s", "tokens/s", "tokens fed", "rounds"):
        table.add_column(col, justify="right")
    for mode, s in summary.items():
        table.add_row(mode, f"{s['median_s']:.1f}", f"{s['tokens_per_s']:.1f}", str(s["fed_tokens"]), str(len(s["rounds"])))
    Console().print(table)
    print(f"{args.compare}: {new} {record['speedup']:.2f}x {baseline}'s speed; same samples: {same}; wrote {out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
