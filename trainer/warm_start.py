"""Supervised warm start on oracle demonstrations (a 135M model cannot play ALFWorld zero-shot).

The environments' experts (`oracle_action()`) play through the same `RolloutRunner` as the policy, so the
demonstration prompts are exactly what the policy will see. The response text is the parser's own format
of the expert action (optionally after a short canned thought), tokenised once; the loss is the mean NLL of
the response tokens only (the prompt is context). Training runs in epochs over shuffled rows
(`sft_schedule`); a held-out slice of demonstration episodes is scored by `action_exact_match`, the
fraction of turns where the greedy reply parses to exactly the expert's action (token NLL hides that the
action tokens are the hard ones). `warm_start_key` names everything that determines the result, so the
trainer can cache it. `WarmStart` is the stage itself: the first stage of `python -m agentgym_opsd.train`,
reused from the shared cache when nothing that determines it changed, skipped on resume once done.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.files import cache_dir, make_tmp_dir, publish_dir, to_json
from agentgym_opsd.models.hf_policy import text_ids
from agentgym_opsd.policies import OraclePolicy, PolicyOutput, PolicyRequest
from agentgym_opsd.records import Trajectory
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer import engine as dist
from agentgym_opsd.trainer.checkpoint import MANIFEST, CheckpointError, verify_manifest, write_manifest
from agentgym_opsd.trainer.finite import NonFiniteError, require_finite
from agentgym_opsd.trainer.frozen_trunk import TrunkCache, trunk_depth
from agentgym_opsd.trainer.logprobs import (
    bucket_micro_batches,
    micro_batch_logprobs,
    shared_prompt_prefix,
    supports_packing,
)
from agentgym_opsd.trainer.task_stream import TRAIN_SEED_LIMIT, train_task_specs

if TYPE_CHECKING:
    from agentgym_opsd.trainer.config import Config
    from agentgym_opsd.trainer.logprobs import TrainedModel

__all__ = ["Demonstration", "ThoughtOracle", "WarmStart", "action_exact_match", "collect_demonstrations",
           "demonstration_rows", "sft_schedule", "sft_step", "split_heldout", "warm_start_key", "WARM_START_VERSION"]

log = logging.getLogger(__name__)

WARM_START_VERSION = 2
"""Bump when the warm-start procedure changes, so cached warm starts of the old procedure are not reused."""
SUMMARY = "summary.json"


class ThoughtOracle(OraclePolicy):
    """The oracle, writing `thought` (if any) before the formatted action, like a model would."""

    def __init__(self, thought: str = "") -> None:
        self.thought = thought

    def act(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        outputs = super().act(requests)
        if self.thought:
            for out in outputs:
                out.text = f"{self.thought} {out.text}"
        return outputs


@dataclass
class Demonstration:
    """One supervised row: the prompt ids and the response ids to imitate."""

    prompt_ids: list[int]
    response_ids: list[int]


def collect_demonstrations(
    runner: RolloutRunner, tasks: Sequence[TaskSpec], *, thought: str = "", batch: int = 16
) -> list[Trajectory]:
    """Play `tasks` with the oracle (one copy each), `batch` environments at a time; only won episodes."""
    won: list[Trajectory] = []
    for start in range(0, len(tasks), batch):
        trajs = runner.run(ThoughtOracle(thought), list(tasks[start:start + batch]), group_size=1)
        won.extend(t for t in trajs if t.succeeded)
    return won


def demonstration_rows(trajectories: Sequence[Trajectory], encode_prompt, tokenizer) -> list[Demonstration]:
    """Tokenise every turn of the demonstrations (response text without special tokens)."""
    rows = []
    for traj in trajectories:
        for turn in traj.turns:
            ids = text_ids(tokenizer, turn.response_text)
            if ids:
                rows.append(Demonstration(list(encode_prompt(turn.prompt)), list(ids)))
    return rows


def split_heldout(demos: Sequence[Trajectory], heldout_episodes: int) -> tuple[list[Trajectory], list[Trajectory]]:
    """(training, held-out) demonstrations: the last `heldout_episodes` are held out, none when that would leave
    nothing to train on."""
    held = heldout_episodes if 0 < heldout_episodes < len(demos) else 0
    return list(demos[: len(demos) - held]), list(demos[len(demos) - held:])


def sft_schedule(num_rows: int, *, batch_rows: int, epochs: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Row indices of every SFT step: each epoch is a fresh permutation cut into `batch_rows` (the last
    batch of an epoch may be smaller); a fractional epoch takes the first part of one more permutation."""
    if num_rows <= 0 or epochs <= 0:
        return []
    batches: list[np.ndarray] = []
    whole, frac = int(epochs), epochs - int(epochs)
    for e in range(whole + (1 if frac > 0 else 0)):
        order = rng.permutation(num_rows)
        if e == whole:
            order = order[: max(1, math.ceil(frac * num_rows))]
        batches += [order[i:i + batch_rows] for i in range(0, len(order), batch_rows)]
    return batches


def sft_step(
    engine,
    rows: Sequence[Demonstration],
    pick: Sequence[int] | np.ndarray,
    *,
    pad_id: int,
    max_tokens: int,
    max_rows: int,
    device: torch.device | str,
    trunk: TrunkCache | None = None,
    packed: bool = False,
    prefix_len: int = 0,
) -> float:
    """One optimiser step on the demonstrations `pick`; returns their mean response-token NLL. `trunk` (keyed by
    index into `rows`):
    a micro-batch whose rows it holds runs only the trained blocks from their frozen-trunk output, one it does
    not runs the whole model and leaves theirs there (`trainer/frozen_trunk.py`). `packed`: the micro-batches
    lay their rows end to end without padding (`logprobs.pack`, the update's layout, where `supports_packing`):
    the same loss to float rounding, without computing the padding (about a tenth of ALFWorld's SFT tokens).
    `prefix_len` (packed): the demonstrations' shared prompt prefix, laid once per micro-batch (`shared_prompt_prefix`:
    ALFWorld's system message, a fifth of its tokens)."""
    pick = [int(i) for i in pick]
    prompts = [rows[i].prompt_ids for i in pick]
    responses = [rows[i].response_ids for i in pick]
    num_tokens = sum(len(r) for r in responses)
    lengths = [len(p) - prefix_len + len(r) for p, r in zip(prompts, responses, strict=True)]
    batches = bucket_micro_batches(lengths, max_tokens=max_tokens, max_rows=max_rows, padded=not packed)
    model = engine.module
    model.train()
    total = 0.0
    for k, idx in enumerate(batches):
        logp, _, mask = micro_batch_logprobs(model, idx, prompts, responses, packed=packed, device=device,
                                             pad_id=pad_id, trunk=trunk, rows=[pick[i] for i in idx], keep=True,
                                             prefix_len=prefix_len)
        loss = -(logp * mask).sum() / num_tokens
        value = float(loss.detach())
        if dist.world_size() == 1:  # several ranks: a rank's NaN reaches every rank's gradient norm, checked alike
            require_finite(value, "the SFT loss")
        engine.backward(loss, is_last=k == len(batches) - 1)
        total += value
    engine.step()
    require_finite(total, "the SFT loss")
    return total


def action_exact_match(policy, trajectories: Sequence[Trajectory], parser) -> float:
    """Fraction of the demonstrations' turns where `policy` (greedy, e.g. an HFPolicy at temperature 0)
    answers the turn's prompt with text that `parser` reads as exactly the expert's action."""
    turns = [t for traj in trajectories for t in traj.turns]
    if not turns:
        return math.nan
    requests = [PolicyRequest(t.prompt) for t in turns]
    outputs = policy.act(requests)
    hits = 0
    for turn, out in zip(turns, outputs, strict=True):
        parsed = parser.parse(out.text)
        hits += bool(parsed.valid and parsed.action.strip().lower() == turn.action.strip().lower())
    return hits / len(turns)


def warm_start_key(settings: dict[str, Any]) -> str:
    """A short stable hash of everything that determines a warm start (model, environment and prompt
    settings, demonstration and SFT settings, seed, `WARM_START_VERSION`)."""
    blob = json.dumps({"version": WARM_START_VERSION, **settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


class WarmStart:
    """The supervised stage of one run: where its weights are cached (`cache_dir`, keyed by everything that
    determines them), where they are after it ran (`model_dir`), and `run`, which trains them or reuses the
    cache entry. `system_prompt`, `env_num_tasks` and `demonstrator` (the profile's expert version) come from the
    environment (they enter the key; an empty `demonstrator` is left out, so older keys still match)."""

    def __init__(self, cfg: Config, *, run_dir: Path, system_prompt: str, env_num_tasks: int | None,
                 demonstrator: str = "") -> None:
        self.cfg = cfg
        self.folder = run_dir / "warm_start"
        self.system_prompt = system_prompt
        self.env_num_tasks = env_num_tasks
        self.demonstrator = demonstrator

    @property
    def seed(self) -> int:
        """`warm_start.seed`, or `trainer.seed` when that is -1."""
        ws = self.cfg.warm_start
        return ws.seed if ws.seed >= 0 else self.cfg.trainer.seed

    def settings(self) -> dict[str, Any]:
        """Everything that determines the warm-started weights (hashed by `warm_start_key`)."""
        c = self.cfg
        # the RL outcome (won or score) does not shape the demonstrations: left out, so keys stay as they were
        env = {k: v for k, v in c.env.cache_key_settings().items()
               if k not in ("val_id", "use_skills", "step_timeout_s", "outcome")}
        # A user template shapes every prompt: its text (not its path) is part of the key. Without one the
        # key leaves the field out, so warm starts cached before the field existed are still found.
        template = env.pop("prompt_template")
        if template:
            env["prompt_template_text"] = Path(template).read_text(encoding="utf-8")
        if not env["action_history"]:  # left out when off, as the template: older keys still match
            del env["action_history"]
        model = c.model.cache_key_settings()
        model.pop("autocast", None)  # the SFT computes its float32 blocks in float32 either way (`run`)
        return {"model": model, "env": env,
                "system_prompt": self.system_prompt,
                # `seed` enters once, as the effective seed, so keys from before the field existed still match
                "warm_start": {k: v for k, v in asdict(c.warm_start).items() if k not in ("cache", "seed")},
                "optim": {k: getattr(c.optim, k) for k in ("betas", "weight_decay", "grad_clip")},
                "env_num_tasks": self.env_num_tasks, "seed": self.seed,
                **({"demonstrator": self.demonstrator} if self.demonstrator else {})}

    def cache_dir(self) -> Path | None:
        """The shared cache entry of these settings (None with `warm_start.cache=off`)."""
        if self.cfg.warm_start.cache == "off":
            return None
        return cache_dir("warm_start", warm_start_key(self.settings()))

    def model_dir(self) -> Path | None:
        """Where the warm-started weights of this run are (the run folder, or the shared cache)."""
        summary = self.folder / SUMMARY
        if summary.is_file():
            where = json.loads(summary.read_text(encoding="utf-8")).get("warm_start/model_dir")
            if where and Path(where).is_dir():
                return Path(where)
        local = self.folder / "model"
        return local if local.is_dir() else None

    def run(self, policy: TrainedModel, runner: RolloutRunner) -> dict[str, Any]:
        """Train (or load from the cache) the warm start into `policy`, reset the optimiser moments, and write
        the run's `warm_start/summary.json`. Collective: every rank calls it."""
        t0 = time.perf_counter()
        self.folder.mkdir(parents=True, exist_ok=True)
        cached = self.cache_dir()
        # rank 0 decides: another run may fill the shared cache between two ranks' looks
        if dist.broadcast_object(cached is not None and policy.is_main and intact_entry(cached, say_why=True)):
            assert cached is not None
            policy.load_weights(cached / "model")
            summary = json.loads((cached / SUMMARY).read_text(encoding="utf-8"))
            summary.update({"warm_start/cache_hit": 1.0, "warm_start/sft_steps_this_run": 0.0,
                            "warm_start/seconds_this_run": time.perf_counter() - t0})
            log.info("warm start: reused %s", cached)
        else:
            from agentgym_opsd.models.loading import blocks_autocast

            # bf16-mixed's autocast is for the RL phases: the SFT under it matched the exact match but left a
            # weaker policy (fewer held-out episodes won; docs/training.md)
            with blocks_autocast(policy.model, enabled=False):
                summary = self._train(policy, runner, cached)
            summary["warm_start/seconds_this_run"] = time.perf_counter() - t0
        policy.engine.reset_optimizer_state()  # RL starts with fresh AdamW moments (the SFT ones have another scale)
        if policy.is_main:
            (self.folder / SUMMARY).write_text(to_json(summary, indent=2), encoding="utf-8")
        dist.barrier()
        log.info("warm start: %s", summary)
        return summary

    def demonstration_tasks(self) -> list[TaskSpec]:
        """The tasks the oracle demonstrates, in the seeded order whose tail is held out (`split_heldout`)."""
        ws, seed = self.cfg.warm_start, self.seed
        if ws.episodes == 0 and self.env_num_tasks:
            # one demonstration per training game, in a seeded order (the held-out slice is its tail)
            order = np.random.default_rng(seed + 1).permutation(self.env_num_tasks)
            if ws.exclude_rl_pool and self.cfg.env.num_train_tasks:
                order = order[order >= self.cfg.env.num_train_tasks]
            return [TaskSpec((ws.seed_offset + j) % TRAIN_SEED_LIMIT, {"task_index": int(k)})
                    for j, k in enumerate(order)]
        return train_task_specs(ws.seed_offset, ws.episodes or 32, num_tasks=self.env_num_tasks, seed=seed + 1)

    def _train(self, policy: TrainedModel, runner: RolloutRunner, cached: Path | None) -> dict[str, Any]:
        ws, cfg = self.cfg.warm_start, self.cfg
        t0 = time.perf_counter()
        tasks = self.demonstration_tasks()
        demos = collect_demonstrations(runner, tasks, thought=ws.thought, batch=runner.pool.num_envs)
        train_demos, heldout = split_heldout(demos, ws.heldout_episodes)
        rows = demonstration_rows(train_demos, policy.encode, policy.tokenizer)
        if not rows:
            raise RuntimeError(f"the warm start found no won oracle episodes in {len(tasks)} tasks of {cfg.env.id}")
        seconds_demos = time.perf_counter() - t0
        rng = np.random.default_rng(self.seed)
        epochs = ws.epochs if ws.epochs > 0 else ws.steps * ws.batch_rows / len(rows)
        schedule = sft_schedule(len(rows), batch_rows=ws.batch_rows, epochs=epochs, rng=rng)
        if ws.epochs == 0:
            schedule = schedule[: ws.steps]
        policy.engine.set_lr(ws.lr)
        # later epochs run only the trained blocks from the first one's frozen-trunk output (same numbers)
        depth = trunk_depth(policy.model, zero_stage=cfg.deepspeed.zero_stage, budget_mb=cfg.optim.trunk_cache_mb)
        trunk = TrunkCache.within(depth, cfg.optim.trunk_cache_mb) if epochs > 1 else None
        packed = supports_packing(policy.model)  # no padding computed; the update's layout
        # every micro-batch lays the system message all demonstrations start with once (the same numbers)
        prefix_len = shared_prompt_prefix([r.prompt_ids for r in rows]) if packed else 0
        losses = []
        every = max(len(schedule) // 10, 1)  # a log line per tenth: background runs have no progress bar
        for k, pick in enumerate(tqdm(schedule, desc="warm start (SFT)", unit="step",
                                      disable=not cfg.trainer.progress), start=1):
            try:
                losses.append(sft_step(policy.engine, rows, pick, pad_id=policy.pad_id,
                                       max_tokens=cfg.optim.micro_batch_tokens, max_rows=cfg.optim.micro_batch_rows,
                                       device=policy.device, trunk=trunk,
                                       packed=packed, prefix_len=prefix_len))
            except NonFiniteError as exc:
                raise NonFiniteError(f"warm start, SFT step {k} of {len(schedule)}: {exc}") from None
            if not cfg.trainer.progress and (k % every == 0 or k == len(schedule)):
                log.info("warm start: SFT step %d / %d, loss %.3f, %.0f s", k, len(schedule),
                         float(np.mean(losses[-every:])), time.perf_counter() - t0 - seconds_demos)
        policy.engine.set_lr(cfg.optim.lr)
        if trunk is not None:
            log.info("warm start: %d of %d rows' frozen-trunk outputs kept (%.0f MiB)", len(trunk.rows), len(rows),
                     trunk.used_bytes / 2**20)
            trunk.release()
        seconds_sft = time.perf_counter() - t0 - seconds_demos
        exact = math.nan
        if heldout:
            from agentgym_opsd.models.backends import make_policy_backend

            greedy = make_policy_backend("hf", model=policy.model, tokenizer=policy.tokenizer,
                                         max_new_tokens=cfg.rollout.max_new_tokens, temperature=0.0,
                                         batch_size=cfg.rollout.batch_size, seed=self.seed)
            policy.model.eval()
            with policy.engine.full_weights():
                exact = action_exact_match(greedy, heldout, runner.parser)
        target = cached if cached is not None else self.folder
        summary: dict[str, Any] = {
            "warm_start/loss_first": losses[0] if losses else math.nan,
            "warm_start/loss_last": float(np.mean(losses[-10:])) if losses else math.nan,
            "warm_start/demonstrations": float(len(train_demos)), "warm_start/rows": float(len(rows)),
            "warm_start/heldout_episodes": float(len(heldout)), "warm_start/epochs": float(epochs),
            "warm_start/sft_steps": float(len(schedule)), "warm_start/sft_steps_this_run": float(len(schedule)),
            "warm_start/heldout_action_exact_match": exact, "warm_start/seconds_demonstrations": seconds_demos,
            "warm_start/seconds_sft": seconds_sft, "warm_start/seconds": time.perf_counter() - t0,
            "warm_start/cache_hit": 0.0, "warm_start/model_dir": str(target / "model"),
        }
        self.save_atomically(policy, target, summary)
        return summary

    def save_atomically(self, policy: TrainedModel, target: Path, summary: dict[str, Any]) -> None:
        """`target/model` + `target/summary.json`, complete or absent (a shared cache may see two writers).
        Collective: every rank helps gather the weights, rank 0 writes, the others wait for it."""
        # rank 0 names the folder (its pid in the name: a later run can tell a dead writer's leftovers)
        tmp = target.parent / dist.broadcast_object(make_tmp_dir(target).name if policy.is_main else None)
        policy.save(tmp / "model")
        if policy.is_main:
            self._publish(tmp, target, summary)
        dist.barrier()

    def _publish(self, tmp: Path, target: Path, summary: dict[str, Any]) -> None:
        # the weights' manifest (the entry also gathers start evaluations later): a reuse checks them against it
        write_manifest(tmp / "model", step=0, world_size=1, marker=MANIFEST)
        (tmp / SUMMARY).write_text(to_json(summary, indent=2), encoding="utf-8")
        # complete or absent: a reader never sees model/ without summary.json. In the shared cache, an entry
        # another run completed first is as good as ours; one that does not verify (corrupt, or a killed older
        # version's) is not
        shared = target != self.folder
        publish_dir(tmp, target, keep=intact_entry if shared else None)


def intact_entry(entry: Path, *, say_why: bool = False) -> bool:
    """Whether a warm-start folder is complete and its files are as written (`verify_manifest`); `say_why` logs
    why one that exists is not (it is then trained again and replaced)."""
    if not (entry / SUMMARY).is_file():
        return False
    try:
        verify_manifest(entry / "model", marker=MANIFEST)
    except CheckpointError as exc:
        if say_why:
            log.warning("warm start: not reusing %s, it does not verify (%s); training it again", entry, exc)
        return False
    return True
