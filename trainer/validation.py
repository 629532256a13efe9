"""Validation during training (`Validation`): held-out episodes through the evaluation suite, and sampled success
on the fixed training pool.

Held-out episodes use reset seeds from 10_000 on (never a training seed) at the validation temperature; the pool
check plays every pool game `eval_pool_rollouts` times at the rollout temperature with seeds above the training
range. Every rank plays the same episodes with the same seeds. Every validation point samples from the same sampler
seed (common random numbers), so the points before and after RL differ by what the weights changed, not by another
draw of the sampler. Each held-out episode's outcome is kept (`validation/step_<step>.jsonl`) for comparison episode
by episode (`evaluation.paired.paired_episodes`). With several environments, each validation environment writes
`val/<spec>/...` keys and the pool check `pool/<spec>/...`; the plain keys are over all episodes.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.records import Trajectory, invalid_rates, summarize
from agentgym_opsd.registry import EnvProfile, parse_env_spec
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer.config import Config
from agentgym_opsd.trainer.dynamic_sampling import group_diversity
from agentgym_opsd.trainer.task_stream import TRAIN_SEED_LIMIT

__all__ = ["EPISODE_FIELDS", "HELD_OUT_SAMPLER_SEED", "POOL_SAMPLER_SEED", "StartEvaluationCache", "Validation",
           "episode_outcome", "read_episode_outcomes", "start_evaluation_key", "validation_file",
           "write_episode_outcomes"]

HELD_OUT_SAMPLER_SEED = TRAIN_SEED_LIMIT
POOL_SAMPLER_SEED = 2 * TRAIN_SEED_LIMIT
EPISODE_FIELDS = ("env_spec", "seed", "task_id", "task_type", "won", "score", "turns", "invalid_actions", "error",
                  "actions")
"""One line of `validation/step_<step>.jsonl`: which held-out episode (environment spec and reset seed) and how
it went. `won` follows `records.summarize`'s rule (an episode that errored is lost). `actions`: the action of
each turn with whether the environment took it (`{"action", "valid"}`), so an episode that training turned from
won to lost can be read turn by turn, as the training rollouts can (validation episodes keep no prompts)."""


def validation_file(run_dir: Path, step: int) -> Path:
    """Where a run keeps the held-out episodes of its validation after `step` RL steps."""
    return Path(run_dir) / "validation" / f"step_{step:06d}.jsonl"


def episode_outcome(env_spec: str, traj: Trajectory) -> dict[str, Any]:
    """The `EPISODE_FIELDS` record of one held-out episode."""
    return {"env_spec": env_spec, "seed": traj.seed, "task_id": traj.task_id, "task_type": traj.task_type,
            "won": traj.succeeded, "score": float(traj.score) if traj.error is None else 0.0,
            "turns": traj.num_turns, "invalid_actions": traj.num_invalid_actions, "error": traj.error,
            "actions": [{"action": t.action, "valid": t.action_valid} for t in traj.turns]}

Generating = Callable[[], contextlib.AbstractContextManager[Any]]


class Validation:
    """`run(sampler_at)` -> the `val/...` (and `pool/...`) metrics of one validation point.

    `sampler_at(temperature, seed)` gives a policy over the current weights; `generating()` is the context
    every generation phase runs in (the vLLM engine woken and synced). `train_runners`: the training
    environments' runners by spec (the pool check plays them). The held-out runners are built on first use,
    with `make_runner(env_spec, num_envs)`."""

    def __init__(self, cfg: Config, train_runners: Mapping[str, RolloutRunner],
                 make_runner: Callable[[str, int], RolloutRunner], generating: Generating) -> None:
        self.cfg = cfg
        self.train_runners = dict(train_runners)
        self.make_runner = make_runner
        self.generating = generating
        self._runners: dict[str, RolloutRunner] = {}
        self.episodes: list[dict[str, Any]] = []
        """The last held-out call's episode outcomes (`episode_outcome`), in play order."""

    @staticmethod
    def default_spec(train_spec: str, profile: EnvProfile) -> str:
        """The unseen split of a training environment when it has one, else the training spec itself."""
        base, split = parse_env_spec(train_spec)
        if "valid_seen" in profile.splits and split not in (None, "valid_seen"):
            return f"{base.partition('/')[2]}:valid_seen"
        return train_spec

    def env_specs(self) -> list[str]:
        """`env.val_id` (one or several), else each training environment's `default_spec` (once each)."""
        if self.cfg.env.val_id:
            return self.cfg.env.val_specs
        specs = [self.default_spec(spec, runner.profile) for spec, runner in self.train_runners.items()]
        return list(dict.fromkeys(specs))

    def run(self, sampler_at: Callable[[float, int], Any]) -> dict[str, float]:
        """One validation point; the same sampler seeds at every point (common random numbers, module doc)."""
        out = self.held_out(sampler_at(self.cfg.trainer.eval_temperature, HELD_OUT_SAMPLER_SEED))
        if self.cfg.trainer.eval_pool_rollouts and self.cfg.env.num_train_tasks:
            out.update(self.pool(sampler_at(self.cfg.rollout.temperature, POOL_SAMPLER_SEED)))
        return out

    def held_out(self, policy: Any) -> dict[str, float]:
        """Held-out episodes (seeds >= 10_000) through the evaluation suite, `eval_episodes` per environment."""
        from agentgym_opsd.evaluation.runner import evaluate_policy

        t = self.cfg.trainer
        specs = self.env_specs()
        num_envs = min(t.eval_episodes, t.eval_batch_episodes)
        for spec in specs:
            if spec not in self._runners:
                self._runners[spec] = self.make_runner(spec, num_envs)
        t0 = time.perf_counter()
        with self.generating():
            summaries = [evaluate_policy(policy, spec, episodes=t.eval_episodes, num_envs=num_envs,
                                         runner=self._runners[spec], progress=t.progress) for spec in specs]
        seconds = time.perf_counter() - t0
        self.episodes = [episode_outcome(s.env_spec, x) for s in summaries for x in s.trajectories]
        # one rule for every environment and for the whole (`records.summarize`): errored episodes are failures
        every = summarize([x for s in summaries for x in s.trajectories])
        out = {"val/success_rate": every.success_rate, "val/episodes": float(every.episodes),
               "val/score": every.score_mean, "val/turns_mean": every.turns_mean,
               "val/invalid_action_rate": every.invalid_action_rate, "val/env_errors": float(every.errors),
               "seconds_validation": seconds}
        for summary in summaries:
            out.update(summary.metrics("val"))
        if len(summaries) > 1:  # the per-kind invalid rates are written without the spec: over all environments' turns
            out.update({f"val/{kind}": rate for kind, rate in
                        invalid_rates([x for s in summaries for x in s.trajectories]).items()})
        return out

    def pool(self, policy: Any) -> dict[str, float]:
        """Sampled success on the fixed training pool (`env.num_train_tasks` games of each training environment,
        `eval_pool_rollouts` copies each): the direct check that the optimiser improves the policy on the games
        it trains on."""
        copies = self.cfg.trainer.eval_pool_rollouts
        t0 = time.perf_counter()
        per_env: dict[str, list[Trajectory]] = {}
        tasks = [TaskSpec(TRAIN_SEED_LIMIT + i, {"task_index": i}) for i in range(self.cfg.env.num_train_tasks)]
        # whole games side by side, up to eval_batch_episodes episodes (never fewer than one game's copies)
        per_call = max(min(self.cfg.trainer.eval_batch_episodes // copies, len(tasks)), 1)
        with self.generating():
            for k, spec in enumerate(self.train_runners):
                runner = self._pool_runner(spec, per_call * copies)
                trajs = per_env.setdefault(spec, [])
                for start in range(0, len(tasks), per_call):  # group ids unique over the calls (group_diversity)
                    first = k * len(tasks) + start
                    trajs += runner.run(policy, tasks[start:start + per_call], group_size=copies,
                                        first_group_id=first, first_traj_id=first * copies,
                                        progress=self.cfg.trainer.progress)
        everything = [x for trajs in per_env.values() for x in trajs]
        out = {**_pool_rates(everything, "pool/"), **group_diversity(everything, prefix="pool/"),
               "pool/episodes": float(len(everything)), "seconds_pool": time.perf_counter() - t0}
        if len(per_env) > 1:
            for spec, trajs in per_env.items():
                out.update(_pool_rates(trajs, f"pool/{spec}/"))
        return out

    def _pool_runner(self, spec: str, num_envs: int) -> RolloutRunner:
        """The pool check's runner of a training environment: the training runner when it is large enough,
        else one of its own with `num_envs` environments (built once, made like the training one)."""
        train = self.train_runners[spec]
        if train.pool.num_envs >= num_envs:
            return train
        key = f"pool:{spec}"
        if key not in self._runners:
            self._runners[key] = self.make_runner(spec, num_envs)
        return self._runners[key]

    def close(self) -> None:
        for runner in self._runners.values():
            runner.close()


def _pool_rates(trajs: list[Trajectory], prefix: str) -> dict[str, float]:
    s = summarize(trajs)
    return {f"{prefix}success_rate": s.success_rate, f"{prefix}score": s.score_mean,
            f"{prefix}invalid_action_rate": s.invalid_action_rate, f"{prefix}env_errors": float(s.errors)}


# Config fields that cannot change what the validation before the first RL step sees: the RL update, the teacher,
# the run's bookkeeping and the training stream (held-out and pool seeds and the samplers' streams are fixed). The
# warm start's seed picks the warm start itself, which the cache's place already names (it lives in the warm
# start's entry): `warm_start.seed=0` and the default -1 with `trainer.seed=0` evaluate the same weights.
_NOT_IN_START_KEY = {
    "trainer": ("seed", "total_steps", "output_dir", "overwrite", "backend", "save_every", "keep_checkpoints",
                "eval_every", "save_trajectories", "report_to", "tensorboard", "progress"),
    "rollout": ("tasks_per_step", "group_size", "dynamic_sampling", "max_sampling_rounds"),
    "warm_start": ("seed",),
    "algorithm": "*", "optim": "*", "teacher": "*", "deepspeed": "*",
}


def start_key_config(cfg: Config) -> dict[str, Any]:
    """The config as the start-evaluation key hashes it: less the fields in `_NOT_IN_START_KEY`."""
    data = {**cfg.to_dict(), "model": cfg.model.cache_key_settings(), "env": cfg.env.cache_key_settings()}
    for section, fields in _NOT_IN_START_KEY.items():
        if fields == "*":
            data.pop(section, None)
        else:
            for name in fields:
                data.get(section, {}).pop(name, None)
    return data


def start_evaluation_key(cfg: Config, *, threads: int, world_size: int) -> str:
    """A hash of everything that determines the step-0 validation of a warm start: the config less the fields
    above, and the threads and ranks (float reductions, and so sampled tokens, may differ with them)."""
    import hashlib
    import json

    data = start_key_config(cfg)
    # vLLM evaluations from before one sampling seed per request repeated one sample per prompt: not reused
    sampler = {"vllm_seeds": "per request"} if cfg.rollout.backend == "vllm" else {}
    blob = json.dumps({"config": data, "threads": threads, "world_size": world_size, **sampler}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


class StartEvaluationCache:
    """The validation before the first RL step, kept beside the cached warm start it evaluated
    (`<warm-start cache entry>/start_evaluations/<key>.json`, its held-out episodes in `<key>.episodes.jsonl`):
    every run from that warm start with the same evaluation settings plays the same episodes with the same
    weights and seeds, so the numbers are computed once. A reused result carries `val/from_cache: 1`."""

    def __init__(self, warm_start_entry: Path | None, key: str) -> None:
        self.path = warm_start_entry / "start_evaluations" / f"{key}.json" if warm_start_entry else None

    @property
    def episodes_path(self) -> Path | None:
        return self.path.with_suffix(".episodes.jsonl") if self.path else None

    def load(self) -> dict[str, float] | None:
        if self.path is None or not self.path.is_file():
            return None
        import json

        try:
            metrics = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # a damaged entry is recomputed
        return {**metrics, "val/from_cache": 1.0} if isinstance(metrics, dict) else None

    def load_episodes(self) -> list[dict[str, Any]]:
        """The cached held-out episodes ([] for an entry written before they were kept, or a damaged one)."""
        return read_episode_outcomes(self.episodes_path) if self.episodes_path else []

    def store(self, metrics: dict[str, float], episodes: Sequence[dict[str, Any]] = ()) -> None:
        if self.path is None or not self.path.parent.parent.is_dir():
            return
        from agentgym_opsd.files import atomic_write_text, to_json

        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = {k: float(v) for k, v in metrics.items()  # a nan metric stays out: the JSON is strict
                if k != "val/from_cache" and isinstance(v, (int, float)) and math.isfinite(v)}
        if episodes and self.episodes_path is not None:  # first, so a metrics file never lacks its episodes
            write_episode_outcomes(self.episodes_path, episodes)
        atomic_write_text(self.path, to_json(kept, indent=2))


def write_episode_outcomes(path: Path, episodes: Sequence[dict[str, Any]]) -> None:
    """`episodes` (`EPISODE_FIELDS` records) as JSON lines, atomically."""
    from agentgym_opsd.files import atomic_write_lines, to_json

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_lines(path, (to_json(e, ensure_ascii=False) + "\n" for e in episodes))


def read_episode_outcomes(path: Path) -> list[dict[str, Any]]:
    """The records of a `write_episode_outcomes` file ([] when it is missing or any line is unreadable: the
    file is written whole, so a bad line means a damaged file, and half a comparison is worse than none)."""
    import json

    if not path.is_file():
        return []
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
        return []
    return rows if all(isinstance(r, dict) and {"env_spec", "seed", "won"} <= r.keys() for r in rows) else []
