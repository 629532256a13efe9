"""Our trainer vs TRL's `GRPOTrainer`, side by side on the same multi-turn ALFWorld work (issue 23).

    pip install -e ".[bench]"                      # trl==1.16.0 (adds datasets, pandas, pyarrow; torch unchanged)
    python benchmarks/bench_vs_trl.py              # 2 RL steps each, seed 0, pool success before / after
    python benchmarks/bench_vs_trl.py --steps 1 --pool-rollouts 1 --threads 1     # the smoke run
    python benchmarks/bench_vs_trl.py --steps 2 --seeds 2 --pool-rollouts 2 --out benchmarks/results/vs_trl_steps2_seed2
    python benchmarks/bench_vs_trl.py --merge benchmarks/results/vs_trl_steps2_seed{1,2}.json \
        --out benchmarks/results/vs_trl_steps2_seeds    # seeds run apart (e.g. in two sessions), one summary

RESULT (the issue's goal: >= 2x faster per RL step than TRL at equal or better success). Seeds 1 and 2, run
apart (`--steps 2 --seeds S --pool-rollouts 2 --threads 1`) and merged (`vs_trl_steps2_seeds.json`), on the
shared 2-core machine (one or two other one-thread jobs beside it), with the packed update micro-batches: ours
**4.09x faster per RL step** (median 102 vs 416 s; 3.60x per turn played, 196 vs 194 turns), peak RSS 3.3 vs
8.1 GB. Pool success after two steps (16 games x 2, the same sampler seed on both sides): ours 35/64 = 54.7%
vs TRL 37/64 = 57.8% (before: 18/32 = 56.2%, the same in both files); ours - TRL = -3.1 points, 95% interval
[-20, +14] (Newcombe): neither side moved from the before-evaluation, and the two cannot be told apart. The
script's verdict compares point estimates, so it prints NOT MET; what the runs show is the speed half met
(3.5-4.1x in every run) and the success half a tie within a 34-point-wide interval. Two steps at lr 2e-5,
whose first step's groups were mostly all won (no GRPO signal on either side), teach too little to show a
success difference; that would take the study's budget (6-12 steps with dynamic sampling, several seeds),
about 1.4 CPU-hours per seed on TRL's side alone. The first run (seed 0, one step, 16 pool episodes, before
the packed update landed) gave 2.1x / 3.0x and 9/16 on both sides (`vs_trl.json`).
Causes, from the runs' own printouts:
- update 4.7x (165 vs 35 trained tokens/s, the same ~50k real tokens): TRL trains one packed row per
  episode, ~1,550 real tokens each and padded to the longest of its generation batch (36% of the 77k tokens
  forwarded are padding), so attention spans whole episodes and its fused LM head runs (with the entropy) on
  every completion position, env tokens included; ours trains ~255-token turn rows in length buckets with the
  LM head on the response tokens only.
- rollout 1.5x (16.1 vs 10.8 sampled tokens/s): `generate` prefills the G identical first-turn
  prompts G times, keeps finished rows decoding as padding until the batch's last row stops, and runs its
  logits processors and stop-string check every token; our `HFPolicy` prefills each distinct prompt once and
  drops finished rows from the batch and its KV cache.
- memory 2.4x: activations of the packed, padded episode rows (TRL) against length-bucketed micro-batches of
  at most 2,048 tokens (ours).
Every run prints its own result and causes in this form (and writes them to the JSON).

What runs. Both sides play the `cpu-small` recipe's ALFWorld work with GRPO: the 16-game `easy` pool, B = 2
tasks per RL step (the same tasks, in the same order: `train_task_specs`), G = 4 rollouts each, at most 10
turns, 2 past turns in the prompt, 24 new tokens per turn, temperature 1.0, AdamW at lr 2e-5 (constant),
gradient clipping 1.0, PPO clip 0.2 / 0.24, entropy bonus 0.001, no KL term, the top 12 of 30 layers
trained, float32 — all read from one `cpu-small` config, so the two cannot drift apart. Both start from the
cached warm start of `cpu-small` (`$AGENTGYM_OPSD_CACHE/warm_start/<key>/model`), or the embedded SmolLM2 when
that cache entry does not exist. Each side lives in its own process (its own peak memory, its own torch
threads); the parent alternates them step by step (ABBA order), so machine noise hits both, and only one works
at a time. Pool success is measured by the same code for both (our `RolloutRunner` + `HFPolicy`, every pool
game `--pool-rollouts` times at T=1.0, the same sampler seed): once before training (the weights are shared)
and after each side's last step.

- Ours: `Trainer` in-process with `algorithm.estimator=grpo` (its own `step()`: rollout through the
  `EnvPool` with the batched `HFPolicy`, per-turn rows, outcome A_seq + the invalid-action push, PPO update
  in length-bucketed micro-batches, one optimiser step per 16 turn rows).
- TRL: `GRPOTrainer` (no vLLM: none on a CPU) with a `rollout_func` — TRL's documented hook for multi-turn
  environments; it works without vLLM (`GRPOTrainer._generate` calls it before any vLLM use). The
  `rollout_func` is our public adapter, `agentgym_opsd.integrations.trl.AgentGymRollout` (docs/integrations.md),
  given this config's prompt renderer and environment settings. It plays the
  same episodes through our `RolloutRunner` (our `EnvPool`, `PromptRenderer`, parsers), generating with TRL's
  own non-vLLM generation path (`unwrap_model_for_generation` + `model.generate` with the trainer's
  `generation_config`, left-padded batch: what `GRPOTrainer._generate_single_turn` does). Each episode goes
  back to TRL as ONE row, as TRL's multi-turn examples build them: the first turn's prompt as `prompt_ids`,
  then action 1, the second turn's prompt (env tokens, `env_mask` 0: no loss), action 2, ...; reward = won.

What differs (TRL cannot express ours exactly; each item is TRL's contract or default, not a choice of ours):
1. Rows. TRL scores one sequence per rollout (groups of G rows), so a 10-turn episode is one packed row whose
   action k is trained in the context "turn 1 prompt, action 1, ..., turn k prompt"; it was sampled from
   "turn k prompt" alone (history 2 rebuilds the prompt each turn), so TRL's update is off-context (an
   approximation every packed multi-turn `rollout_func` makes when prompts are rebuilt). Ours trains each turn
   as its own row, in exactly the prompt it was sampled from.
2. Credit. TRL: one advantage per episode from `won` (group mean / std). Ours: the same outcome advantage on
   every turn row, plus the preset's separate -0.1 push on invalid turns (TRL has no per-turn reward).
3. Optimiser steps. TRL: one per RL step (gradient accumulation over the 8 episode rows, TRL's default
   `steps_per_generation = gradient_accumulation_steps`). Ours: one per 16 turn rows (`ppo_mini_batch_rows`).
4. Sampling. Ours: dynamic sampling is OFF here (the preset plays up to 3 rounds until groups have mixed
   outcomes; TRL has no such filter and "same work" means one round of B x G episodes on both sides).
   Different RNG streams: the two sides play the same tasks but not the same samples.
5. TRL defaults changed to match ours: `activation_checkpointing=False` (TRL's `gradient_checkpointing`
   defaults to True), `bf16=False` (TRL defaults to True), `lr_scheduler_type="constant"` (HF defaults to
   linear decay), `top_k=0`, `shuffle_dataset=False`; kept: `loss_type="dapo"` (TRL's default: token mean over
   the generation batch, as ours). The sampling log-probs `rollout_func` returns are unused without vLLM (TRL
   uses them only for its vLLM importance-sampling correction); on-policy, TRL needs no old-log-prob pass.
6. Memory layout. TRL's micro-batch is one packed episode padded to the longest episode of the generation
   batch (TRL pads the whole generation batch once, then splits it), with the LM head on every completion
   position (env tokens included; TRL's fused LM head skips only the prompt). Ours: turn rows bucketed by
   length (`optim.micro_batch_tokens`), LM head on response tokens only. Ours runs in a one-process DeepSpeed
   ZeRO-0 engine (the preset's backend), TRL through accelerate on the CPU.

Reported per step and side: wall seconds of the rollout and of everything after it (scoring, log-prob passes,
loss, backward, optimiser), peak RSS of that side's process during the step (sampled every 50 ms),
generated tokens/s (sampled action tokens / rollout s), trained tokens/s (prompt + response tokens of the
trained rows, padding left out / update s), and training-rollout success; then pool success after N steps.
Files: `benchmarks/results/vs_trl.json` and `vs_trl.png`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import shutil
import statistics
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).resolve().parent / "results"
SIDES = ("ours", "trl")
PRESET = "cpu-small"
POOL_EVAL_SEED = 20_000
"""Sampler seed of every pool evaluation (both sides, before and after): paired comparisons."""


@dataclass(frozen=True)
class BenchSettings:
    """What every worker process needs (pickled to it): the run's size and where the warm start is."""

    steps: int
    threads: int
    pool_rollouts: int
    model: str
    workdir: str


# ---- shared by both sides --------------------------------------------------------------------------------


def preset_config(seed: int, overrides: Sequence[str] = ()) -> Any:
    """The `cpu-small` config with GRPO, one sampling round per step and the warm start's seed fixed at 0 (every RL
    seed starts from the same cached weights); both sides read their settings from it. float32 for both: TRL's
    side loads the model as configured, while `model.precision: auto` would be resolved on our side only."""
    from agentgym_opsd.trainer.config import load_config

    return load_config(PRESET, ["algorithm.estimator=grpo", "rollout.dynamic_sampling=false", f"trainer.seed={seed}",
                                "warm_start.seed=0", "model.precision=fp32", *overrides])


def warm_start_model() -> str:
    """The cached `cpu-small` warm start's model folder, or the embedded SmolLM2 when it is not cached."""
    from agentgym_opsd.models.loading import EMBEDDED_NAME
    from agentgym_opsd.registry import env_profile, make, parse_env_spec
    from agentgym_opsd.trainer.warm_start import WarmStart

    cfg = preset_config(0)
    env = make(cfg.env.id)
    try:
        num_tasks = getattr(env.unwrapped, "num_tasks", None)
    finally:
        env.close()
    warm = WarmStart(cfg, run_dir=Path(tempfile.gettempdir()), env_num_tasks=num_tasks,
                     system_prompt=env_profile(parse_env_spec(cfg.env.id)[0]).system_prompt)
    cached = warm.cache_dir()
    model = cached / "model" if cached is not None else None
    return str(model) if model is not None and (model / "config.json").is_file() else EMBEDDED_NAME


def make_runner(cfg: Any, num_envs: int) -> Any:
    """A `RolloutRunner` with the trainer's environment and prompt settings (as `RunSession.make_runner`)."""
    from agentgym_opsd.rollout import RolloutRunner

    renderer = cfg.env.prompt_renderer(cfg.env.id)
    kwargs = {**cfg.env.kwargs, **({"max_turns": cfg.env.max_turns} if cfg.env.max_turns > 0 else {})}
    return RolloutRunner(cfg.env.id, num_envs=num_envs, env_kwargs=kwargs, renderer=renderer,
                         use_skills=False, step_timeout_s=cfg.env.step_timeout_s)


def pool_success(model: Any, tokenizer: Any, cfg: Any, rollouts: int) -> dict[str, Any]:
    """Every pool game `rollouts` times at the rollout temperature, with our `HFPolicy` and a fixed sampler seed
    (reset seeds above the training range, as `Validation.pool`); the same function scores both sides."""
    from agentgym_opsd.envpool import TaskSpec
    from agentgym_opsd.evaluation.metrics import wilson_interval
    from agentgym_opsd.models.hf_policy import HFPolicy
    from agentgym_opsd.records import summarize
    from agentgym_opsd.trainer.task_stream import TRAIN_SEED_LIMIT

    r = cfg.rollout
    policy = HFPolicy(model, tokenizer, max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                      batch_size=r.batch_size, seed=POOL_EVAL_SEED)
    tasks = [TaskSpec(TRAIN_SEED_LIMIT + i, {"task_index": i}) for i in range(cfg.env.num_train_tasks)]
    runner = make_runner(cfg, len(tasks))
    per_call = max(len(tasks) // rollouts, 1)
    t0 = time.perf_counter()
    try:
        trajs = [t for start in range(0, len(tasks), per_call)
                 for t in runner.run(policy, tasks[start:start + per_call], group_size=rollouts)]
    finally:
        runner.close()
    summary = summarize(trajs)
    return {"success": summary.success_rate, "won": summary.successes, "episodes": summary.episodes,
            "ci": list(wilson_interval(summary.successes, summary.episodes)),
            "invalid_action_rate": summary.invalid_action_rate,
            "seconds": time.perf_counter() - t0}


class PeakRss:
    """This process's resident set size, sampled every `interval_s` in a daemon thread; `peak_gb()` is the largest
    value since the last `reset()`."""

    def __init__(self, interval_s: float = 0.05) -> None:
        import psutil

        self._proc = psutil.Process()
        self._peak = 0
        self._interval_s = interval_s
        threading.Thread(target=self._sample, daemon=True, name="peak-rss").start()

    def _sample(self) -> None:
        while True:
            self._peak = max(self._peak, self._proc.memory_info().rss)
            time.sleep(self._interval_s)

    def reset(self) -> None:
        self._peak = self._proc.memory_info().rss

    def peak_gb(self) -> float:
        return max(self._peak, self._proc.memory_info().rss) / 2**30


class WeightDrift:
    """A copy of the last `tensors` trainable tensors (the top decoder layer and the final norm); `relative()` is how
    far training has moved them, ||w - w0|| / ||w0|| (0.0: the optimiser changed nothing)."""

    def __init__(self, model: Any, tensors: int = 10) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad][-tensors:]
        self.start = [p.detach().clone() for p in self.params]

    def relative(self) -> float:
        moved = sum(float((p.detach() - p0).double().pow(2).sum()) for p, p0 in zip(self.params, self.start, strict=True))
        size = sum(float(p0.double().pow(2).sum()) for p0 in self.start)
        return (moved / max(size, 1e-30)) ** 0.5


def token_counts(trajs: Sequence[Any], encode: Callable[[list], list[int]]) -> dict[str, int]:
    """Sampled action tokens, and prompt + response tokens of every played turn (what the update trains on)."""
    gen = sum(len(turn.response_token_ids) for t in trajs for turn in t.turns)
    prompts = sum(len(encode(turn.prompt)) for t in trajs for turn in t.turns)
    return {"gen_tokens": gen, "train_tokens": gen + prompts, "turns": sum(t.num_turns for t in trajs)}


# ---- ours ------------------------------------------------------------------------------------------------


class OursSide:
    """Our `Trainer` driven step by step (its own `step()`; the trajectories are recorded for the token counts)."""

    def __init__(self, seed: int, settings: BenchSettings) -> None:
        from agentgym_opsd.trainer.loop import Trainer

        self.cfg = preset_config(seed, [
            f"model.name_or_path={settings.model}", "warm_start.epochs=0", "warm_start.steps=0",
            f"trainer.total_steps={settings.steps}", f"trainer.output_dir={settings.workdir}/ours-seed{seed}",
            "trainer.eval_every=0", "trainer.eval_at_start=false", "trainer.save_trajectories=false",
            "trainer.progress=false", "trainer.tensorboard=false", "trainer.save_every=0"])
        self.trainer = Trainer(self.cfg)
        self.trainer.session.reference.setup()
        self.rss = PeakRss()
        self.drift = WeightDrift(self.trainer.session.trained.model)

    def describe(self) -> dict[str, Any]:
        a, o = self.cfg.algorithm, self.cfg.optim
        return {"trainer": "agentgym_opsd Trainer", "backend": self.cfg.trainer.backend,
                "rows": "one per turn", "ppo_mini_batch_rows": a.ppo_mini_batch_rows,
                "micro_batch_tokens": o.micro_batch_tokens, "penalty_mode": a.penalty_mode}

    def step(self) -> dict[str, Any]:
        trainer, recorded = self.trainer, []
        collect = trainer.collect_step

        def recording() -> Any:  # Trainer.step() itself, its trajectories kept for the token counts
            trajs, sampling = collect()
            recorded.extend(trajs)
            return trajs, sampling

        trainer.collect_step = recording  # type: ignore[method-assign]
        self.rss.reset()
        t0 = time.perf_counter()
        try:
            m = trainer.step()
        finally:
            del trainer.collect_step  # back to the class's method
        seconds = time.perf_counter() - t0
        return {"seconds_step": seconds, "seconds_rollout": m["seconds_rollout"],
                "seconds_update": seconds - m["seconds_rollout"], "seconds_update_only": m["seconds_update"],
                "peak_rss_gb": self.rss.peak_gb(), "success": m["success_rate"], "episodes": len(recorded),
                "rows": int(m.get("num_rows", 0)), "optimizer_steps": int(m["optimizer_steps"]),
                "weights_moved": self.drift.relative(), **token_counts(recorded, trainer.session.trained.encode)}

    def evaluate(self, rollouts: int) -> dict[str, Any]:
        return pool_success(self.trainer.session.trained.model, self.trainer.session.trained.tokenizer, self.cfg, rollouts)

    def close(self) -> None:
        self.trainer.close()


# ---- TRL -------------------------------------------------------------------------------------------------


@dataclass
class TRLStepProbe:
    """What `rollout_func` measured in the current step (read by the step gate at the step's end)."""

    seconds_rollout: float = 0.0
    gen_tokens: int = 0
    train_tokens: int = 0
    padded_tokens: int = 0
    turns: int = 0
    episodes: int = 0
    won: int = 0


class TRLSide:
    """TRL's `GRPOTrainer.train()` in a thread, held at every step's start until `step()` lets it go."""

    def __init__(self, seed: int, settings: BenchSettings) -> None:
        from trl import GRPOConfig, GRPOTrainer

        from agentgym_opsd.integrations.trl import AgentGymRollout, episode_won, task_dataset
        from agentgym_opsd.models.hf_policy import DEFAULT_STOP_STRINGS, chat_prompt_ids
        from agentgym_opsd.models.loading import freeze_lower_layers, load_policy_model
        from agentgym_opsd.trainer.task_stream import train_task_specs

        self.cfg = cfg = preset_config(seed)
        r, a, o = cfg.rollout, cfg.algorithm, cfg.optim
        model, self.tokenizer = load_policy_model(settings.model, dtype=cfg.model.dtype, trainable=True)
        if cfg.model.trainable_layers:
            freeze_lower_layers(model, cfg.model.trainable_layers)
        self.drift = WeightDrift(model)
        tasks = train_task_specs(0, settings.steps * r.tasks_per_step, num_tasks=cfg.env.num_train_tasks, seed=seed)
        args = GRPOConfig(
            output_dir=f"{settings.workdir}/trl-seed{seed}", seed=seed, max_steps=settings.steps,
            per_device_train_batch_size=1, gradient_accumulation_steps=r.tasks_per_step * r.group_size,
            num_generations=r.group_size, shuffle_dataset=False, learning_rate=o.lr, lr_scheduler_type="constant",
            warmup_steps=0, weight_decay=o.weight_decay, adam_beta1=o.betas[0], adam_beta2=o.betas[1],
            max_grad_norm=o.grad_clip, beta=a.kl_coef, epsilon=a.clip_low, epsilon_high=a.clip_high,
            entropy_coef=a.entropy_coef, loss_type="dapo", scale_rewards="group" if a.normalize_std else "none",
            temperature=r.temperature, top_p=r.top_p, top_k=0, max_completion_length=r.max_new_tokens,
            generation_kwargs={"stop_strings": list(DEFAULT_STOP_STRINGS)},
            # transformers 5.20 renamed gradient_checkpointing to activation_checkpointing (.venv has 5.19)
            **{"activation_checkpointing" if "activation_checkpointing" in GRPOConfig.__dataclass_fields__
               else "gradient_checkpointing": False},
            bf16=False, use_cpu=True, report_to="none", logging_strategy="no", save_strategy="no",
            disable_tqdm=True, dataloader_pin_memory=False)
        # The public adapter, with the runner settings of `make_runner` and our trainer's exact prompt ids.
        kwargs = {**cfg.env.kwargs, **({"max_turns": cfg.env.max_turns} if cfg.env.max_turns > 0 else {})}
        self.adapter = AgentGymRollout(cfg.env.id, renderer=cfg.env.prompt_renderer(cfg.env.id), env_kwargs=kwargs,
                                       step_timeout_s=cfg.env.step_timeout_s, encode_prompt=chat_prompt_ids)
        self.probe = TRLStepProbe()
        self.rss = PeakRss()
        self._go: queue.Queue[bool] = queue.Queue()
        self._done: queue.Queue[dict[str, Any] | BaseException] = queue.Queue()
        self.trainer = GRPOTrainer(model=model, processing_class=self.tokenizer, reward_funcs=[episode_won],
                                   args=args, train_dataset=task_dataset(tasks), rollout_func=self.rollout,
                                   callbacks=[_make_step_gate()(self)])
        self._thread = threading.Thread(target=self._train, daemon=True, name="trl-train")
        self._thread.start()

    def describe(self) -> dict[str, Any]:
        import trl

        args = self.trainer.args
        return {"trainer": f"trl {trl.__version__} GRPOTrainer + rollout_func", "backend": "accelerate (cpu)",
                "rows": "one packed row per episode", "per_device_train_batch_size": args.per_device_train_batch_size,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
                "steps_per_generation": args.steps_per_generation, "loss_type": args.loss_type,
                "activation_checkpointing": bool(getattr(args, "activation_checkpointing", args.gradient_checkpointing)), "bf16": bool(args.bf16)}

    def rollout(self, prompts: list[str], trainer: Any) -> dict[str, list]:
        """TRL's `rollout_func`: the adapter plays the B tasks x G copies and packs each episode into one row;
        the probe keeps what it measured for the step's report."""
        from agentgym_opsd.records import summarize

        out = self.adapter(prompts, trainer)
        trajs, rows = self.adapter.last_episodes, self.adapter.last_rows
        lengths = [len(x.prompt_ids) + len(x.completion_ids) for x in rows]
        width = max(len(x.prompt_ids) for x in rows) + max(len(x.completion_ids) for x in rows)
        self.probe = TRLStepProbe(self.adapter.seconds_rollout, sum(sum(x.env_mask) for x in rows), sum(lengths),
                                  width * len(rows), sum(t.num_turns for t in trajs), len(trajs),
                                  summarize(trajs).successes)
        return out

    def step(self) -> dict[str, Any]:
        if not self._thread.is_alive():
            raise RuntimeError("TRL's train() has ended (max_steps reached or it failed)")
        self._go.put(True)
        result = self._done.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def _train(self) -> None:
        try:
            self.trainer.train()
        except Exception as exc:  # noqa: BLE001 - handed to the waiting step() and reported by the parent
            self._done.put(RuntimeError(f"TRL train() failed: {exc!r}\n{traceback.format_exc()}"))

    def evaluate(self, rollouts: int) -> dict[str, Any]:
        self._thread.join(timeout=600)  # after the last step train() only cleans up
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        return pool_success(model, self.tokenizer, self.cfg, rollouts)

    def close(self) -> None:
        self.adapter.close()


def _make_step_gate() -> type:
    """A `TrainerCallback` that holds TRL at each optimiser step's start until the parent says go, and reports the
    step (wall time from go to the optimiser step's end, the rollout's share, peak RSS) at its end."""
    from transformers import TrainerCallback

    class StepGate(TrainerCallback):
        def __init__(self, side: TRLSide) -> None:
            self.side = side
            self.t0 = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.side._go.get()
            self.side.rss.reset()
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seconds, p = time.perf_counter() - self.t0, self.side.probe
            self.side._done.put({
                "seconds_step": seconds, "seconds_rollout": p.seconds_rollout,
                "seconds_update": seconds - p.seconds_rollout, "peak_rss_gb": self.side.rss.peak_gb(),
                "success": p.won / max(p.episodes, 1), "episodes": p.episodes, "rows": p.episodes,
                "optimizer_steps": 1, "gen_tokens": p.gen_tokens, "train_tokens": p.train_tokens,
                "padded_tokens": p.padded_tokens, "turns": p.turns, "weights_moved": self.side.drift.relative()})

    return StepGate


# ---- worker processes and the parent ---------------------------------------------------------------------

DIFFERENCES = (
    "rows: TRL one packed row per episode (action k trained in the context of every earlier prompt and action, "
    "sampled from turn k's prompt alone); ours one row per turn, in the prompt it was sampled from",
    "credit: TRL one advantage per episode from won; ours the same outcome advantage on each turn row plus the "
    "preset's -0.1 push on invalid turns",
    "optimiser steps per RL step: TRL 1 (gradient accumulation over the 8 episode rows); ours 1 per 16 turn rows",
    "ours without dynamic sampling (one round of B x G episodes per step on both sides); different sample streams",
    "TRL defaults changed to ours: activation (gradient) checkpointing off, bf16=False, constant lr, top_k=0",
    "micro-batches: TRL one packed episode padded to the generation batch's longest, LM head on every completion "
    "position; ours turn rows bucketed by length, LM head on response tokens only",
    "engines: ours DeepSpeed ZeRO-0 in one process (the preset's backend); TRL accelerate on the CPU",
)


def _serve(side: str, conn: Any, seed: int, settings: BenchSettings) -> None:
    """A worker process: build one side, report ready, then answer ("step",) and ("eval", rollouts) until
    ("close",)."""
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(settings.threads)
    hf_logging.set_verbosity_error()
    impl: OursSide | TRLSide | None = None
    try:
        impl = OursSide(seed, settings) if side == "ours" else TRLSide(seed, settings)
        conn.send({"ready": {**impl.describe(), "rss_ready_gb": impl.rss.peak_gb()}})
        while (msg := conn.recv())[0] != "close":
            conn.send(impl.step() if msg[0] == "step" else impl.evaluate(msg[1]))
    except Exception:  # noqa: BLE001 - sent to the parent, which stops the run naming the side
        conn.send({"error": traceback.format_exc()})
    finally:
        if impl is not None:
            impl.close()


class Worker:
    """The parent's handle on one side's process."""

    def __init__(self, ctx: Any, side: str, seed: int, settings: BenchSettings) -> None:
        self.side = side
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(side, child, seed, settings), name=f"bench-vs-trl-{side}")
        self.proc.start()
        child.close()

    def receive(self) -> dict[str, Any]:
        try:
            reply = self.conn.recv()
        except EOFError:
            self.proc.join(5)
            raise RuntimeError(f"the {self.side} worker died (exit code {self.proc.exitcode}; -9 = killed, "
                               "e.g. out of memory)") from None
        if "error" in reply:
            raise RuntimeError(f"the {self.side} side failed:\n{reply['error']}")
        return reply

    def call(self, *message: Any) -> dict[str, Any]:
        self.conn.send(message)
        return self.receive()

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("close",))
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(120)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(10)


@dataclass
class SeedRun:
    """One seed's numbers: the per-step rows, each side's setup, pool success after its last step."""

    rows: list[dict[str, Any]]
    setup: dict[str, Any]
    after: dict[str, Any]


def run_seed(seed: int, first: str, settings: BenchSettings, console: Console,
             before: dict[str, Any] | None) -> tuple[SeedRun, dict[str, Any] | None]:
    """Both sides of one seed, steps alternated (`first` leads on odd steps); the shared before-evaluation when
    `before` is None and pool evaluations are on."""
    ctx = mp.get_context("spawn")
    workers = {side: Worker(ctx, side, seed, settings) for side in SIDES}
    try:
        setup = {side: w.receive()["ready"] for side, w in workers.items()}
        if before is None and settings.pool_rollouts:
            before = workers["ours"].call("eval", settings.pool_rollouts)
            console.print(f"pool success before (shared weights): {_pct(before)}")
        order = (first, *(s for s in SIDES if s != first))
        rows = []
        for step in range(1, settings.steps + 1):
            for side in order if step % 2 else order[::-1]:
                m = workers[side].call("step")
                rows.append({"seed": seed, "step": step, "side": side, **m})
                console.print(f"seed {seed} step {step} {side:>4}: rollout {m['seconds_rollout']:.1f} s, update "
                              f"{m['seconds_update']:.1f} s, peak RSS {m['peak_rss_gb']:.2f} GB, "
                              f"{m['turns']} turns, won {m['success']:.2f}")
        after = {side: workers[side].call("eval", settings.pool_rollouts) for side in order} \
            if settings.pool_rollouts else {}
        return SeedRun(rows, setup, after), before
    finally:
        for w in workers.values():
            w.close()


# ---- summary, table, files -------------------------------------------------------------------------------


def _pct(ev: dict[str, Any] | None) -> str:
    if not ev:
        return "-"
    lo, hi = ev["ci"]
    return f"{100 * ev['success']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] ({ev['won']}/{ev['episodes']})"


def _pooled(evals: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Several evaluations as one: successes and episodes added up, with the Wilson interval."""
    from agentgym_opsd.evaluation.metrics import wilson_interval

    if not evals:
        return None
    won, n = sum(e["won"] for e in evals), sum(e["episodes"] for e in evals)
    return {"success": won / n, "won": won, "episodes": n, "ci": list(wilson_interval(won, n))}


def summarize(runs: Sequence[SeedRun], before: dict[str, Any] | None) -> dict[str, Any]:
    """Medians per side, throughput over all steps, pooled success, the speed-ups and the goal's verdict."""
    rows = [r for run in runs for r in run.rows]
    out: dict[str, Any] = {"pool_before": before}
    for side in SIDES:
        mine = [r for r in rows if r["side"] == side]
        total = {k: sum(r[k] for r in mine) for k in ("seconds_step", "seconds_rollout", "seconds_update",
                                                      "gen_tokens", "train_tokens", "turns")}
        out[side] = {
            **{f"median_{k}": statistics.median(r[k] for r in mine)
               for k in ("seconds_step", "seconds_rollout", "seconds_update", "peak_rss_gb")},
            "max_peak_rss_gb": max(r["peak_rss_gb"] for r in mine),
            "gen_tok_s": total["gen_tokens"] / max(total["seconds_rollout"], 1e-9),
            "train_tok_s": total["train_tokens"] / max(total["seconds_update"], 1e-9),
            "seconds_per_turn": total["seconds_step"] / max(total["turns"], 1),
            "train_success": statistics.mean(r["success"] for r in mine),
            "pool_after": _pooled([run.after[side] for run in runs if side in run.after]),
        }
    out["speedup_step"] = out["trl"]["median_seconds_step"] / out["ours"]["median_seconds_step"]
    out["speedup_per_turn"] = out["trl"]["seconds_per_turn"] / out["ours"]["seconds_per_turn"]
    ours_after, trl_after = out["ours"]["pool_after"], out["trl"]["pool_after"]
    out["success_equal_or_better"] = None if not (ours_after and trl_after) else \
        ours_after["success"] >= trl_after["success"]
    if ours_after and trl_after:  # how large a difference these episodes can tell from zero
        from agentgym_opsd.evaluation.metrics import success_difference_interval

        out["success_difference"] = {
            "ours_minus_trl": ours_after["success"] - trl_after["success"],
            "ci": list(success_difference_interval(ours_after["won"], ours_after["episodes"],
                                                   trl_after["won"], trl_after["episodes"]))}
    out["goal_met"] = bool(out["speedup_step"] >= 2.0 and out["success_equal_or_better"] is not False)
    return out


def causes(runs: Sequence[SeedRun], summary: dict[str, Any]) -> list[str]:
    """What makes the difference, in this run's numbers."""
    rows = [r for run in runs for r in run.rows]
    ours = [r for r in rows if r["side"] == "ours"]
    trl = [r for r in rows if r["side"] == "trl"]

    def tot(side: list[dict[str, Any]], key: str) -> float:
        return float(sum(r[key] for r in side))

    pad = 1.0 - tot(trl, "train_tokens") / max(tot(trl, "padded_tokens"), 1.0)
    s_ours, s_trl = summary["ours"], summary["trl"]
    return [
        f"rollout: {s_trl['gen_tok_s']:.1f} vs {s_ours['gen_tok_s']:.1f} sampled tokens/s (TRL vs ours, "
        f"{s_ours['gen_tok_s'] / max(s_trl['gen_tok_s'], 1e-9):.2f}x). TRL's `generate` prefills the G identical "
        "first-turn prompts G times and keeps every row decoding (padding) until the batch's last row stops; our "
        "HFPolicy prefills each distinct prompt once and drops finished rows from the batch and its KV cache.",
        f"update: {s_trl['train_tok_s']:.0f} vs {s_ours['train_tok_s']:.0f} trained tokens/s "
        f"({s_ours['train_tok_s'] / max(s_trl['train_tok_s'], 1e-9):.2f}x). TRL trains {tot(trl, 'episodes'):.0f} "
        f"packed episode rows: {tot(trl, 'padded_tokens'):.0f} tokens forwarded for {tot(trl, 'train_tokens'):.0f} "
        f"real ones ({100 * pad:.0f}% padding, every row padded to the longest episode of its generation batch), "
        "attention over whole episodes, the LM head on env tokens too. Ours trains "
        f"{tot(ours, 'rows'):.0f} turn rows ({tot(ours, 'train_tokens'):.0f} tokens) bucketed by length, the LM head "
        "on response tokens only.",
        f"memory: peak RSS {s_trl['max_peak_rss_gb']:.2f} GB (TRL) vs {s_ours['max_peak_rss_gb']:.2f} GB (ours).",
        f"work: {tot(trl, 'turns'):.0f} vs {tot(ours, 'turns'):.0f} turns played (TRL vs ours; won episodes end "
        f"early, so per-step seconds also follow the samples): per turn ours is {summary['speedup_per_turn']:.2f}x "
        "faster.",
    ]


def verdict(summary: dict[str, Any]) -> str:
    ours_after, trl_after = summary["ours"]["pool_after"], summary["trl"]["pool_after"]
    success = "pool success not measured (--pool-rollouts 0)" if ours_after is None else \
        f"pool success after: ours {_pct(ours_after)} vs TRL {_pct(trl_after)} (before {_pct(summary['pool_before'])})"
    met = "MET" if summary["goal_met"] else "NOT MET"
    if diff := summary.get("success_difference"):
        low, high = diff["ci"]
        tells = "a real difference" if low > 0 or high < 0 else "within the noise of these episodes"
        success += (f"; ours − TRL {100 * diff['ours_minus_trl']:+.1f} points, 95% interval "
                    f"[{100 * low:+.0f}, {100 * high:+.0f}]: {tells}")
    return (f"Ours is {summary['speedup_step']:.2f}x faster per RL step than TRL's GRPOTrainer (median step "
            f"{summary['ours']['median_seconds_step']:.1f} s vs {summary['trl']['median_seconds_step']:.1f} s; "
            f"{summary['speedup_per_turn']:.2f}x per turn played); {success}. Goal (>= 2x at equal or better "
            f"success): {met}.")


def print_table(console: Console, runs: Sequence[SeedRun]) -> None:
    table = Table(title=f"Ours vs TRL GRPOTrainer, {PRESET} (GRPO, B=2 x G=4, ALFWorld easy pool of 16)")
    for col in ("seed", "step", "side", "rollout s", "update s", "step s", "peak RSS GB", "gen tok/s",
                "train tok/s", "turns", "rows", "opt steps", "won", "top layer moved"):
        table.add_column(col, justify="right")
    for run in runs:
        for r in run.rows:
            table.add_row(str(r["seed"]), str(r["step"]), r["side"], f"{r['seconds_rollout']:.1f}",
                          f"{r['seconds_update']:.1f}", f"{r['seconds_step']:.1f}", f"{r['peak_rss_gb']:.2f}",
                          f"{r['gen_tokens'] / max(r['seconds_rollout'], 1e-9):.1f}",
                          f"{r['train_tokens'] / max(r['seconds_update'], 1e-9):.0f}", str(r["turns"]),
                          str(r["rows"]), str(r["optimizer_steps"]), f"{r['success']:.2f}", f"{r['weights_moved']:.1e}")
    console.print(table)


def plot(runs: Sequence[SeedRun], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r["seed"], r["step"]) for run in runs for r in run.rows})
    by = {(r["seed"], r["step"], r["side"]): r for run in runs for r in run.rows}
    colors = {"ours": ("#1f77b4", "#aec7e8"), "trl": ("#d62728", "#ff9896")}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for j, side in enumerate(SIDES):
        xs = [i + (j - 0.5) * 0.38 for i in range(len(keys))]
        roll = [by[(s, t, side)]["seconds_rollout"] for s, t in keys]
        upd = [by[(s, t, side)]["seconds_update"] for s, t in keys]
        axes[0].bar(xs, roll, 0.38, color=colors[side][0], label=f"{side} rollout")
        axes[0].bar(xs, upd, 0.38, bottom=roll, color=colors[side][1], label=f"{side} update")
        axes[1].bar(xs, [by[(s, t, side)]["peak_rss_gb"] for s, t in keys], 0.38, color=colors[side][0], label=side)
    for ax, title in ((axes[0], "seconds per RL step"), (axes[1], "peak RSS during the step (GB)")):
        ax.set_xticks(range(len(keys)), [f"seed {s}\nstep {t}" for s, t in keys])
        ax.set_title(title)
        ax.legend(fontsize=8)
    bars = [("before", summary["pool_before"], "#7f7f7f"), ("ours after", summary["ours"]["pool_after"], "#1f77b4"),
            ("TRL after", summary["trl"]["pool_after"], "#d62728")]
    bars = [(name, ev, c) for name, ev, c in bars if ev]
    for i, (_, ev, c) in enumerate(bars):
        lo, hi = ev["ci"]
        axes[2].bar(i, 100 * ev["success"], color=c, yerr=[[100 * (ev["success"] - lo)], [100 * (hi - ev["success"])]],
                    capsize=4)
    if not bars:
        axes[2].text(0.5, 0.5, "not measured (--pool-rollouts 0)", ha="center", transform=axes[2].transAxes)
    axes[2].set_xticks(range(len(bars)), [name for name, _, _ in bars])
    axes[2].set_ylim(0, 100)
    axes[2].set_title("pool success % (95% Wilson)")
    fig.suptitle(f"ours vs TRL GRPOTrainer: {summary['speedup_step']:.2f}x per RL step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(runs: Sequence[SeedRun], before: dict[str, Any] | None, settings: dict[str, Any],
                 versions: dict[str, str], out: Path, console: Console) -> dict[str, Any]:
    """Summary, verdict and causes of the seeds' runs: printed, and written to OUT.json and OUT.png."""
    seeds = settings["seeds"]
    summary = summarize(runs, before)
    why, result = causes(runs, summary), verdict(summary)
    print_table(console, runs)
    for line in (result, *why):
        console.print(f"- {line}")
    console.print("What differs between the two setups:")
    for line in DIFFERENCES:
        console.print(f"  * {line}")
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"benchmark": "bench_vs_trl", "preset": PRESET, "settings": settings,
              "versions": versions, "setup": runs[0].setup, "differences": list(DIFFERENCES),
              "steps": [r for run in runs for r in run.rows],
              "pool": {"before": before, "after": {str(s): run.after for s, run in zip(seeds, runs, strict=True)}},
              "summary": summary, "result": result, "causes": why}
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot(runs, summary, out.with_suffix(".png"))
    console.print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return report


def _outcome(evaluation: dict[str, Any] | None) -> dict[str, Any] | None:
    """An evaluation without its wall time (the same episodes take other seconds on a busy machine)."""
    return None if evaluation is None else {k: v for k, v in evaluation.items() if k != "seconds"}


def load_reports(paths: Sequence[Path]) -> tuple[list[SeedRun], dict[str, Any] | None, dict[str, Any], dict[str, str]]:
    """Several runs of this script (other seeds, same settings) as one: their seeds side by side, one summary.
    The before-evaluation is the same in every file (the same warm start, evaluated with the same sampler seed);
    files whose settings or before-evaluation differ are refused, not averaged."""
    reports = [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]
    key = ("steps", "threads", "pool_rollouts", "model")
    first = reports[0]
    for path, rep in zip(paths, reports, strict=True):
        differ = [k for k in key if rep["settings"][k] != first["settings"][k]]
        if _outcome(rep["pool"]["before"]) != _outcome(first["pool"]["before"]):
            differ.append("pool.before")
        if differ:
            raise SystemExit(f"{path}: not the same benchmark as {paths[0]} ({', '.join(differ)} differ)")
    runs, seeds = [], []
    for rep in reports:
        for seed, after in rep["pool"]["after"].items():
            if int(seed) in seeds:
                raise SystemExit(f"seed {seed} is in more than one file")
            seeds.append(int(seed))
            runs.append(SeedRun([r for r in rep["steps"] if r["seed"] == int(seed)], rep["setup"], after))
    settings = {k: first["settings"][k] for k in key} | {"seeds": seeds, "merged_from": [str(p) for p in paths]}
    return runs, first["pool"]["before"], settings, first["versions"]


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("trl", "torch", "transformers", "accelerate", "deepspeed"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2, help="RL steps per side and seed")
    ap.add_argument("--seeds", default="0", help="comma-separated RL seeds (each a fresh pair of processes)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per side (the sides never run at once)")
    ap.add_argument("--pool-rollouts", type=int, default=4,
                    help="pool evaluation: rollouts of each of the 16 games before and after (0 = skip)")
    ap.add_argument("--model", default="", help="model folder (default: the cached cpu-small warm start, else the "
                                                "embedded SmolLM2)")
    ap.add_argument("--out", default=str(RESULTS / "vs_trl"), help="writes OUT.json and OUT.png")
    ap.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                    help="no run: pool the seeds of earlier runs' OUT.json files (same settings) into --out")
    args = ap.parse_args(argv)
    if args.merge:
        write_report(*load_reports(args.merge), Path(args.out), Console(width=max(Console().width, 150)))
        return 0
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        print("TRL is not installed: pip install -e '.[bench]'  (trl==1.16.0)")
        return 2
    if args.steps < 1 or args.threads < 1 or args.pool_rollouts < 0:
        ap.error("--steps and --threads must be >= 1, --pool-rollouts >= 0")
    threads = str(args.threads)
    os.environ.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="false",
                      HF_HUB_OFFLINE="1", DS_ACCELERATOR="cpu", TRL_EXPERIMENTAL_SILENCE="1")
    console = Console(width=max(Console().width, 150))  # the step table stays readable in a log file
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    workdir = tempfile.mkdtemp(prefix="bench_vs_trl_")
    settings = BenchSettings(args.steps, args.threads, args.pool_rollouts, args.model or warm_start_model(), workdir)
    console.print(f"model: {settings.model}; seeds {seeds}, {args.steps} step(s) each, {args.threads} thread(s)")
    runs: list[SeedRun] = []
    before = None
    try:
        for i, seed in enumerate(seeds):
            run, before = run_seed(seed, SIDES[i % 2], settings, console, before)
            runs.append(run)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    settings_out = {k: v for k, v in asdict(settings).items() if k != "workdir"} | {"seeds": seeds}
    write_report(runs, before, settings_out, _versions(), Path(args.out), console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
