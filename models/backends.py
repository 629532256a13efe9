"""Rollout policy backends by name: `make_policy_backend("hf" | "vllm", ...)`.

The factory lives apart from both policies so that neither imports the other's module for it (vLLM's policy
reuses the HF chat encoding; the HF policy knows nothing of vLLM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentgym_opsd.models.hf_policy import HFPolicy
from agentgym_opsd.policies import PolicyOutput, PolicyRequest

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["BACKENDS", "BACKEND_CHOICES", "VLLM_CPU_MIN_EPISODES", "BackendChoice", "RolloutBackend",
           "choose_rollout_backend", "make_policy_backend"]

BACKENDS = ("hf", "vllm")
BACKEND_CHOICES = ("auto", *BACKENDS)
VLLM_CPU_MIN_EPISODES = 64
"""`auto` takes vLLM's CPU build for a run that plays at least this many episodes: about twice the episodes after
which its slower engine start is paid back on the CPUs measured (docs: Benchmarks, the rollout backends), which
leaves room for slower machines and shorter episodes. On a GPU the start pays for any real run."""


@dataclass(frozen=True)
class BackendChoice:
    """The rollout backend a run uses and why (the log line and the run's config say it)."""

    name: str
    reason: str


def choose_rollout_backend(requested: str, *, device_type: str, planned_episodes: int,
                           vllm_installed: bool | None = None) -> BackendChoice:
    """`rollout.backend` resolved: `hf` and `vllm` as asked; `auto` is vLLM where it is installed and its
    engine start pays for the episodes the run will play (any run on a GPU, `VLLM_CPU_MIN_EPISODES` on the
    CPU), else HF. The sampler then differs from the trainer's computation, which TIS corrects for
    (`trainer/tis.py`)."""
    if requested not in BACKEND_CHOICES:
        raise ValueError(f"unknown generation backend {requested!r}; choose one of {BACKEND_CHOICES}")
    if requested != "auto":
        return BackendChoice(requested, "asked for")
    if vllm_installed is None:
        from agentgym_opsd.models.vllm_policy import vllm_available  # never imports vLLM itself

        vllm_installed = vllm_available()
    if not vllm_installed:
        return BackendChoice("hf", "vLLM is not installed (`./.ci/setup.sh` puts its CPU build in .venv)")
    if device_type == "cuda":
        return BackendChoice("vllm", "vLLM is installed and the run is on a GPU")
    if device_type != "cpu":
        return BackendChoice("hf", f"vLLM has no build for device {device_type!r} here")
    if planned_episodes >= VLLM_CPU_MIN_EPISODES:
        return BackendChoice("vllm", f"vLLM's CPU build is installed and the run plays {planned_episodes} episodes "
                                     f"(its engine start pays from {VLLM_CPU_MIN_EPISODES})")
    return BackendChoice("hf", f"the run plays {planned_episodes} episodes, fewer than the {VLLM_CPU_MIN_EPISODES} "
                               "that pay for vLLM's engine start on the CPU")


@runtime_checkable
class RolloutBackend(Protocol):
    """What the trainer asks of a rollout policy besides `act` (both backends implement all of it; the HF
    backend's lifecycle methods are no-ops because it samples from the trainer's own module)."""

    def act(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]: ...

    def with_sampling(self, *, temperature: float, seed: int, batch_size: int | None = None) -> RolloutBackend:
        """A sampler over the same weights at another temperature, with its own seeded stream; `batch_size`:
        the most prompts it generates for together (None: the policy's own; vLLM schedules its own batches)."""
        ...

    def wake_up(self) -> None:
        """Before a generation phase: bring back what `sleep` freed."""
        ...

    def sleep(self) -> None:
        """After a generation phase: free generation memory for the trainer's passes."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> int:
        """Take the trainer's current weights; returns how many tensors were pushed."""
        ...

    def get_rng_state(self) -> Any:
        """The sampling stream's state for a checkpoint (None when there is none to keep)."""
        ...

    def set_rng_state(self, state: Any) -> None: ...


def make_policy_backend(
    name: str,
    *,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    model_path: str | None = None,
    **options: Any,
) -> RolloutBackend:
    """Build a rollout policy by backend name.

    `"hf"`: an `HFPolicy` over `model` + `tokenizer` (or over `load_policy_model(model_path)` when no model
    is given). `"vllm"`: a `VLLMPolicy` serving `model_path` (GPU; needs the `gpu` extra, imported only
    here). `options` go to the policy's constructor (max_new_tokens, temperature, top_p, stop_strings,
    seed, and batch_size for HF or engine settings for vLLM).
    """
    if name == "hf":
        if model is None:
            if model_path is None:
                raise ValueError("the hf backend needs a model and tokenizer, or a model_path to load")
            from agentgym_opsd.models.loading import load_policy_model

            model, tokenizer = load_policy_model(model_path, trainable=False)
        if tokenizer is None:
            raise ValueError("the hf backend needs the tokenizer that belongs to the model")
        return HFPolicy(model, tokenizer, **options)
    if name == "vllm":
        if model_path is None:
            raise ValueError("the vllm backend needs model_path (a folder or hub name vLLM can load)")
        from agentgym_opsd.models.vllm_policy import VLLMPolicy, require_vllm

        require_vllm()
        return VLLMPolicy(model_path, tokenizer=tokenizer, **options)
    raise ValueError(f"unknown generation backend {name!r}; choose one of {BACKENDS}")
