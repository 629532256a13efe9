"""TRL's environment mode for our environments: a `rollout_func` for `trl.GRPOTrainer` (trl 1.16).

TRL takes multi-turn environments two ways: `environment_factory` (`trl_tools`: TRL's agent, calling tools in one
growing conversation) and `rollout_func`, this module's `AgentGymRollout`: our agent, prompted afresh each turn
(`PromptRenderer`) and answering in text the environment's parser reads. A dataset prompt names a task
(`task_dataset`); the copies of a task are played as one group by `RolloutRunner` (a group split across processes
keeps its global group id), so prompts, parsing, invalid actions and records are exactly our trainer's. Each
episode goes back as one row (`pack_episode`: turn 1's prompt, then the actions with the later prompts between
them at `env_mask` 0) with `won`, `score`, `num_turns`, `invalid_actions` and `invalid_penalty` for the reward
functions (`episode_won`, `episode_score`, `invalid_action_penalty`), and is appended to `record_path` in our JSONL.
docs/integrations.md has a full example, how TRL's update on such rows differs from ours, and what to leave off.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.policies import PolicyOutput, PolicyRequest
from agentgym_opsd.prompts import PromptRenderer
from agentgym_opsd.records import ChatMessage, Trajectory, append_jsonl
from agentgym_opsd.registry import env_profile, parse_env_spec, prompt_renderer_for
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.turns import check_penalize, num_penalised

__all__ = ["AgentGymRollout", "PackedEpisode", "TRLGeneratePolicy", "cut_completion", "episode_fields", "episode_score",
           "episode_won",
           "invalid_action_penalty", "pack_episode", "task_dataset", "task_of", "task_prompts",
           "template_prompt_ids"]

PromptEncoder = Callable[[Any, Sequence[ChatMessage]], list[int]]
"""(tokenizer, chat messages) -> prompt token ids ending with the assistant header."""


# ---- tasks as dataset prompts ----------------------------------------------------------------------------------


def task_prompts(tasks: Iterable[TaskSpec | int]) -> list[str]:
    """The dataset prompts naming `tasks`: a `TaskSpec`, or a task index `i` (reset seed `i`, task `i` of the
    split). A prompt is the task as JSON, read back by `AgentGymRollout`; TRL only repeats and batches it."""
    specs = [t if isinstance(t, TaskSpec) else TaskSpec(int(t), {"task_index": int(t)}) for t in tasks]
    return [json.dumps({"seed": t.seed, "options": t.options}, sort_keys=True) for t in specs]


def task_dataset(tasks: Iterable[TaskSpec | int]) -> Any:
    """A `datasets.Dataset` with one `prompt` per task (`task_prompts`), for `GRPOTrainer(train_dataset=...)`."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": task_prompts(tasks)})


def task_of(prompt: Any) -> TaskSpec:
    """The task a `task_prompts` entry names."""
    try:
        data = json.loads(prompt)
        return TaskSpec(int(data["seed"]), dict(data.get("options") or {}))
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"a task for our TRL adapters is a task as JSON (task_dataset / tool_task_dataset / "
                         f"task_prompts), got {str(prompt)[:80]!r}") from exc


# ---- reward functions (TRL passes the rollout's extra fields by name) ---------------------------------------


def episode_won(completions: list, won: list[float], **kwargs: Any) -> list[float]:
    """1.0 for a won episode, else 0.0 (the paper's outcome reward)."""
    return [float(w) for w in won]


def episode_score(completions: list, score: list[float], **kwargs: Any) -> list[float]:
    """The environment's partial credit in [0, 1] (WebShop's R)."""
    return [float(s) for s in score]


def invalid_action_penalty(completions: list, invalid_penalty: list[float], **kwargs: Any) -> list[float]:
    """Minus the profile's penalty per penalised invalid turn (`AgentGymRollout.penalize`; TRL adds the reward
    functions' values up)."""
    return [-float(p) for p in invalid_penalty]


def episode_fields(trajs: Sequence[Trajectory], penalty: float, penalize: str = "any") -> dict[str, list[Any]]:
    """The fields the reward functions read, one value per episode: `won` and `score` (an episode that ended
    with an error is a failure, `Trajectory.outcome`), `num_turns`, `invalid_actions`, and `invalid_penalty`:
    `penalty` per turn that `penalize` charges (`turns.num_penalised`, as our trainer charges it)."""
    return {"won": [t.outcome("won") for t in trajs], "score": [t.outcome("score") for t in trajs],
            "num_turns": [t.num_turns for t in trajs], "invalid_actions": [t.num_invalid_actions for t in trajs],
            "invalid_penalty": [penalty * num_penalised(t.turns, penalize) for t in trajs]}


# ---- episodes as TRL rows ---------------------------------------------------------------------------------------


@dataclass
class PackedEpisode:
    """One episode as one TRL row: `prompt_ids` (turn 1's prompt), then `completion_ids` = action 1, turn 2's
    prompt, action 2, ...; `env_mask` 1 on the policy's own tokens (trained), 0 on prompt text (not trained);
    `logprobs` the sampling log-probs of the action tokens (0.0 on prompt tokens)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float]


def pack_episode(traj: Trajectory, encode: Callable[[list[ChatMessage]], list[int]], filler_id: int) -> PackedEpisode:
    """`traj` as TRL's multi-turn row; an episode without turns (its reset failed) becomes a one-token row with
    nothing to train."""
    if not traj.turns:
        return PackedEpisode([filler_id], [filler_id], [0], [0.0])
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for k, turn in enumerate(traj.turns):
        if k:
            env = encode(turn.prompt)
            completion += env
            mask += [0] * len(env)
            logprobs += [0.0] * len(env)
        completion += turn.response_token_ids
        mask += [1] * len(turn.response_token_ids)
        logprobs += turn.response_logprobs
    return PackedEpisode(encode(traj.turns[0].prompt), completion, mask, logprobs)


# ---- generation with TRL's model ----------------------------------------------------------------------------


def cut_completion(ids: Sequence[int], eos_ids: set[int], decode: Callable[[list[int]], str],
                   stop_strings: Sequence[str]) -> tuple[list[int], str]:
    """The sampled tokens of one `generate` row: up to and including the first end-of-sequence token, or the token
    that completed a stop string (what follows it is padding), else all; and why it ended ("eos" | "stop" |
    "length"). The pad token is the end-of-sequence token for SmolLM2, so padding is told apart this way."""
    tail = max((len(s) for s in stop_strings), default=0) + 2
    for j, tok in enumerate(ids):
        if tok in eos_ids:
            return list(ids[:j + 1]), "eos"
        if stop_strings and any(s in decode(list(ids[max(0, j + 1 - tail):j + 1])) for s in stop_strings):
            return list(ids[:j + 1]), "stop"
    return list(ids), "length"


def template_prompt_ids(tokenizer: Any, messages: Sequence[ChatMessage], **template_kwargs: Any) -> list[int]:
    """The prompt ids of `messages` through the tokenizer's chat template, as TRL tokenises its own prompts."""
    return list(tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                              return_dict=False, **template_kwargs))


class TRLGeneratePolicy:
    """Our `Policy` protocol over TRL's non-vLLM generation (`GRPOTrainer._generate_single_turn`): our prompt
    tokens, left-padded into one batch, `generate` with the trainer's `generation_config` (sampling settings and
    stop strings) under `unwrap_model_for_generation`; log-probs from the processed scores (the distribution
    the tokens were sampled from)."""

    def __init__(self, trainer: Any, encode_prompt: PromptEncoder | None = None) -> None:
        self.trainer = trainer
        self.tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        template_kwargs = dict(getattr(trainer, "chat_template_kwargs", None) or {})
        self.encode: PromptEncoder = encode_prompt or (
            lambda tok, messages: template_prompt_ids(tok, messages, **template_kwargs))
        self.stop_strings = tuple(getattr(trainer.generation_config, "stop_strings", None) or ())
        self.eos_ids = set(trainer.eos_token_ids)
        # The trainer's sampling settings, asking `generate` for the scores too (inside the config: transformers
        # deprecates passing both a config and generation arguments).
        self.generation_config = copy.deepcopy(trainer.generation_config)
        self.generation_config.update(output_scores=True, return_dict_in_generate=True)

    def act(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        import torch
        from trl.models import unwrap_model_for_generation

        tr, tok = self.trainer, self.tokenizer
        prompts = [self.encode(tok, r.messages) for r in requests]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.as_tensor(p)
            mask[i, width - len(p):] = 1
        device = tr.accelerator.device
        with (unwrap_model_for_generation(tr.model_wrapped, tr.accelerator, generation_kwargs=tr.generation_kwargs)
              as model, torch.no_grad()):
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 generation_config=self.generation_config, tokenizer=tok)
        new = out.sequences[:, width:]  # (rows, steps)
        logps = torch.stack(out.scores, dim=1).float().log_softmax(-1).gather(-1, new[..., None]).squeeze(-1)
        outputs = []
        for row, row_lps in zip(new.tolist(), logps.tolist(), strict=True):
            kept, why = cut_completion(row, self.eos_ids, tok.decode, self.stop_strings)
            text = tok.decode(kept[:-1] if why == "eos" else kept, skip_special_tokens=False)
            outputs.append(PolicyOutput(text, kept, row_lps[:len(kept)], finish_reason=why))
        return outputs


# ---- the rollout_func ---------------------------------------------------------------------------------------


class AgentGymRollout:
    """TRL's `rollout_func` for one of our environments (`env_spec`: `Env-v0` or `Env-v0:split`).

    `record_path`: a JSONL file every episode is appended to (our `Trajectory` records; None: not recorded).
    `server_url`: play on that `serve-openenv` server (one session per episode: `openenv_session.SessionEnv`;
    the server's own settings set the turn limit) instead of in this process; the records are the same but for
    `metadata`, which lacks the info a server never sends.
    `renderer`, `env_kwargs`, `use_skills`, `step_timeout_s`, `env_workers`: as `RolloutRunner` takes them (the
    default renderer is the profile's, `registry.prompt_renderer_for`). `encode_prompt(tokenizer, messages)`
    turns a prompt into token ids (default: the chat template, as TRL does; our trainer's exact ids, which keep
    special-token strings inside observations as plain text, come from
    `agentgym_opsd.models.hf_policy.chat_prompt_ids`). `penalize`: which invalid turns `invalid_penalty` charges
    (`turns.PENALISED_KINDS`, as our trainer's `algorithm.penalize`). After each call, `last_episodes` and `last_rows` hold
    what was played and what TRL got."""

    def __init__(self, env_spec: str, *, record_path: str | os.PathLike[str] | None = None,
                 renderer: PromptRenderer | None = None, env_kwargs: dict[str, Any] | None = None,
                 use_skills: bool = False, step_timeout_s: float = 60.0, env_workers: str = "threads",
                 encode_prompt: PromptEncoder | None = None, server_url: str | None = None,
                 penalize: str = "any") -> None:
        self.penalize = check_penalize(penalize, "AgentGymRollout.penalize")
        if server_url is not None and env_kwargs:
            raise ValueError("AgentGymRollout: env_kwargs configure an environment made here; with server_url the "
                             "server's own options do (serve-openenv --max-turns ...)")
        self.env_spec = env_spec
        self.server_url = server_url
        self.profile = env_profile(parse_env_spec(env_spec)[0])  # an unknown id fails here, not in train()
        self.record_path = Path(record_path) if record_path is not None else None
        self.renderer = renderer or prompt_renderer_for(env_spec)
        self.env_kwargs = dict(env_kwargs or {})
        self.use_skills = use_skills
        self.step_timeout_s = step_timeout_s
        self.env_workers = env_workers
        self.encode_prompt = encode_prompt
        self.last_episodes: list[Trajectory] = []
        self.last_rows: list[PackedEpisode] = []
        self.seconds_rollout = 0.0
        self._runner: RolloutRunner | None = None
        self._prompts_played = 0  # global batch positions played so far, on all processes

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        if getattr(trainer, "use_vllm", False):
            raise ValueError("AgentGymRollout generates with TRL's non-vLLM path; set GRPOConfig(use_vllm=False) "
                             "(generation through TRL's vLLM client is not supported by this adapter)")
        training = bool(trainer.model.training)
        group = int(trainer.num_generations if training else trainer.num_generations_eval)
        # TRL hands each process a contiguous slice of the global batch, whose rows repeat each task `group` times
        # in a row; only the global batch must divide into groups, so a group may straddle processes. Each process
        # plays its own copies (the same seed gives the same task) and names them by their global position, so the
        # group id of a straddling group is the same on every process.
        first = self._prompts_played + trainer.accelerator.process_index * len(prompts)
        tasks = _tasks_of(prompts, group, first)
        policy = TRLGeneratePolicy(trainer, self.encode_prompt)
        t0 = time.perf_counter()
        trajs = self._runner_for(len(prompts)).run(policy, tasks, group_size=1, first_traj_id=first)
        self.seconds_rollout = time.perf_counter() - t0
        self._prompts_played += len(prompts) * trainer.accelerator.num_processes
        for i, traj in enumerate(trajs):
            traj.group_id = (first + i) // group
        for traj in trajs:
            traj.metadata.update(trl_global_step=int(trainer.state.global_step),
                                 trl_mode="train" if training else "eval")
        if self.record_path is not None:
            append_jsonl(trajs, self.record_path)
        tok = policy.tokenizer
        rows = [pack_episode(t, lambda messages: policy.encode(tok, messages), tok.eos_token_id) for t in trajs]
        self.last_episodes, self.last_rows = trajs, rows
        return {"prompt_ids": [r.prompt_ids for r in rows], "completion_ids": [r.completion_ids for r in rows],
                "logprobs": [r.logprobs for r in rows], "env_mask": [r.env_mask for r in rows],
                **episode_fields(trajs, self.profile.invalid_action_penalty, self.penalize)}

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    def _runner_for(self, num_envs: int) -> RolloutRunner:
        """The runner, with room for `num_envs` episodes at once (remade larger when an eval batch is bigger)."""
        if self._runner is not None and self._runner.pool.num_envs < num_envs:
            self.close()
        if self._runner is None:
            env_fn = None
            if self.server_url is not None:
                from agentgym_opsd.integrations.openenv_session import SessionEnv

                env_fn = functools.partial(SessionEnv, self.server_url, self.env_spec)
            self._runner = RolloutRunner(self.env_spec, num_envs=num_envs, env_kwargs=self.env_kwargs,
                                         renderer=self.renderer, use_skills=self.use_skills,
                                         step_timeout_s=self.step_timeout_s, env_workers=self.env_workers,
                                         env_fn=env_fn)
        return self._runner


def _tasks_of(prompts: Sequence[Any], group: int, first: int) -> list[TaskSpec]:
    """The task of each of this process's prompts, `prompts[0]` being position `first` of TRL's global batch: its
    sampler repeats each dataset prompt `group` times in a row, so positions `g*group .. g*group+group-1` (group
    `g`) name one task, wherever the processes' slices cut them."""
    if group < 1:
        raise ValueError(f"num_generations must be >= 1, got {group}")
    for i in range(len(prompts)):
        start = max(0, (first + i) // group * group - first)  # this process's first prompt of i's group
        if prompts[i] != prompts[start]:
            raise ValueError(f"expected groups of {group} identical task prompts from TRL's sampler; prompts "
                             f"{start} and {i} (global positions {first + start}, {first + i}) of group "
                             f"{(first + i) // group} differ: {str(prompts[start])[:60]!r} vs {str(prompts[i])[:60]!r}")
    return [task_of(p) for p in prompts]
