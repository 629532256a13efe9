"""Batched rollout generation vs a per-episode `generate` loop, on the same prompts, side by side.

    python benchmarks/bench_rollout.py [--tasks 4 --group-size 4] [--turns 2] [--max-new-tokens 24] [--model SPEC]

1. Rollout: `HFPolicy` (batched, left padding, KV cache, finished rows dropped, shared first-turn prefill)
   plays `--tasks` x `--group-size` episodes (a GRPO batch) of ALFWorld `easy` (or a small built-in text
   env when ALFWorld is unavailable) for at most `--turns` turns, sampling at temperature 1.0. Every
   prompt it saw is recorded.
2. The recorded prompts are answered again, greedily (identical work for both methods), by
   a. a per-episode loop: HF `model.generate` on one prompt at a time (KV cache, stop strings), and
   b. `HFPolicy` on all prompts of a turn at once (batch = the number of episodes).
Tokens/s counts generated answer tokens; the rollout row also pays for the environment steps.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from transformers import StoppingCriteria, StoppingCriteriaList  # noqa: E402

from agentgym_opsd.core import TextEnv  # noqa: E402
from agentgym_opsd.envpool import TaskSpec  # noqa: E402
from agentgym_opsd.models.hf_policy import DEFAULT_STOP_STRINGS, HFPolicy  # noqa: E402
from agentgym_opsd.models.loading import EMBEDDED_NAME, load_policy_model  # noqa: E402
from agentgym_opsd.policies import PolicyOutput, PolicyRequest  # noqa: E402
from agentgym_opsd.records import Trajectory  # noqa: E402
from agentgym_opsd.registry import EnvProfile, register_env  # noqa: E402
from agentgym_opsd.rollout import RolloutRunner  # noqa: E402


class HallwayEnv(TextEnv):
    """Fallback benchmark env: walk to door N of a hallway (`go to door K`, `open door K`)."""

    def __init__(self, *, max_turns: int = 10) -> None:
        super().__init__(max_turns=max_turns)
        self.target, self.position = 1, 0

    @property
    def num_tasks(self) -> int:
        return 8

    def _actions(self) -> list[str]:
        return [f"go to door {k}" for k in range(1, 9)] + [f"open door {self.position}"] * bool(self.position)

    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        index = int(options.get("task_index", self.np_random.integers(self.num_tasks)))
        self.target, self.position = index % self.num_tasks + 1, 0
        return "You stand at the end of a long hallway with eight closed doors.", {
            "task_id": f"hallway-{self.target}", "task_type": "open", "admissible_actions": self._actions(),
            "task_text": f"open door {self.target}",
        }

    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        valid = action in self._actions()
        if valid and action.startswith("go to door "):
            self.position = int(action.rsplit(" ", 1)[1])
        won = valid and action == f"open door {self.target}"
        obs = ("The door opens." if won else f"You are at door {self.position}.") if valid else "Nothing happens."
        return obs, float(won), won, {"action_valid": valid, "won": won, "score": float(won),
                                      "admissible_actions": self._actions()}

    def oracle_action(self) -> str:
        return f"open door {self.target}" if self.position == self.target else f"go to door {self.target}"


def _pick_env(choice: str, episodes: int, turns: int) -> tuple[str, dict[str, Any]]:
    """ALFWorld easy when every benchmark task resets cleanly here (or when asked), the hallway env otherwise."""
    spec, kwargs = "agentgym_opsd/ALFWorld-v0:easy", {"max_turns": turns}
    if choice == "alfworld":
        return spec, kwargs
    reason = "not requested"
    if choice == "auto":
        try:
            runner = RolloutRunner(spec, num_envs=episodes, env_kwargs=kwargs)
            try:
                errors = [s.error for s in runner.pool.reset([TaskSpec(i) for i in range(episodes)], 1) if s.error]
            finally:
                runner.close()
            if not errors:
                return spec, kwargs
            reason = errors[0]
        except (KeyError, ValueError, RuntimeError, ImportError, OSError) as exc:
            reason = repr(exc)
        Console(stderr=True).print(f"[yellow]ALFWorld easy unavailable ({reason[:120]}); using the hallway env[/]")
    register_env("BenchHallway-v0", f"{__name__}:HallwayEnv", override=True, profile=EnvProfile(
        system_prompt="You are in a text game. Think briefly, then answer with one action as <action>...</action>.",
        history_turns=2, max_turns=turns))
    return "agentgym_opsd/BenchHallway-v0", {"max_turns": turns}


class Recorder:
    """Wraps a policy and keeps every request batch it answered (one batch per turn)."""

    def __init__(self, policy: HFPolicy) -> None:
        self.policy, self.batches = policy, []

    def act(self, requests: list[PolicyRequest]) -> list[PolicyOutput]:
        self.batches.append(list(requests))
        return self.policy.act(requests)


class TailStop(StoppingCriteria):
    """Stop once the decoded answer tail holds a closing tag: the same check HFPolicy makes. (HF's own
    `stop_strings` criterion re-scans the whole vocabulary on every call, ~15 s here, which would make the
    baseline look far worse than it is.)"""

    def __init__(self, tok: Any, prompt_len: int) -> None:
        self.tok, self.prompt_len = tok, prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        tail = self.tok.decode(input_ids[0, self.prompt_len :][-12:].tolist(), skip_special_tokens=False)
        return torch.tensor([any(s in tail for s in DEFAULT_STOP_STRINGS)], device=input_ids.device)


def per_episode_loop(model: Any, tok: Any, prompts: list[list[int]], max_new_tokens: int) -> int:
    """HF `generate` on one prompt at a time (the usual baseline); returns generated answer tokens."""
    total = 0
    for ids in prompts:
        inputs = torch.tensor([ids])
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new_tokens,
                             do_sample=False, stopping_criteria=StoppingCriteriaList([TailStop(tok, len(ids))]),
                             pad_token_id=tok.pad_token_id)
        answer = out[0, len(ids):].tolist()
        total += sum(t != tok.pad_token_id for t in answer)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=EMBEDDED_NAME)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per task (GRPO group)")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--env", choices=("auto", "alfworld", "hallway"), default="auto")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 on a shared 2-core machine, where spinning threads collapse")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    args.episodes = args.tasks * args.group_size

    model, tok = load_policy_model(args.model, trainable=False)
    env_spec, env_kwargs = _pick_env(args.env, args.episodes, args.turns)
    policy = HFPolicy(model, tok, max_new_tokens=args.max_new_tokens, temperature=1.0,
                      batch_size=args.episodes, seed=0)
    recorder = Recorder(policy)
    # Warm-up outside the clock (first-call allocations and kernel selection), once for each method.
    warm = policy.prompt_ids([{"role": "user", "content": "warm up"}])
    policy.generate_ids([warm, warm + warm])
    per_episode_loop(model, tok, [warm], 2)
    runner = RolloutRunner(env_spec, num_envs=args.episodes, env_kwargs=env_kwargs)
    try:
        t0 = time.perf_counter()
        trajs: list[Trajectory] = runner.run(recorder, [TaskSpec(i) for i in range(args.tasks)],
                                             group_size=args.group_size)
        seconds_rollout = time.perf_counter() - t0
    finally:
        runner.close()
    rollout_tokens = sum(t.num_response_tokens for tr in trajs for t in tr.turns)
    failed = [tr.error for tr in trajs if tr.error]
    if failed or not rollout_tokens:
        raise SystemExit(f"the rollout on {env_spec} failed ({len(failed)} episodes: {failed[:1]}); "
                         f"try --env hallway")

    batches = [[policy.prompt_ids(r.messages) for r in batch] for batch in recorder.batches]
    prompts = [p for batch in batches for p in batch]
    policy.set_temperature(0.0)
    t0 = time.perf_counter()
    batched_tokens = sum(len(o.token_ids) for batch in batches for o in policy.generate_ids(batch))
    seconds_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    loop_tokens = per_episode_loop(model, tok, prompts, args.max_new_tokens)
    seconds_loop = time.perf_counter() - t0

    loop_rate = loop_tokens / seconds_loop
    table = Table(title=f"Rollout generation — {args.model}, {env_spec}, {args.tasks} tasks x {args.group_size} rollouts x "
                        f"<= {args.turns} turns, {len(prompts)} prompts, max_new_tokens={args.max_new_tokens}, "
                        f"{torch.get_num_threads()} threads")
    for col in ("method", "tokens", "seconds", "tokens/s", "speed-up vs loop"):
        table.add_column(col, justify="right" if col != "method" else "left")
    rows = [
        ("per-episode HF generate loop (greedy)", loop_tokens, seconds_loop),
        (f"HFPolicy batched, batch {args.episodes} (greedy)", batched_tokens, seconds_batched),
        ("HFPolicy batched rollout incl. env (T=1.0)", rollout_tokens, seconds_rollout),
    ]
    for name, tokens, seconds in rows:
        rate = tokens / seconds
        table.add_row(name, str(tokens), f"{seconds:.1f}", f"{rate:.1f}", f"{rate / loop_rate:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
