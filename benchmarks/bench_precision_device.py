"""bf16 numerics on any device (the GPU path included), without the environments or the embedded weights.

What `bench_precision.py` measures on `cpu-small`, reduced to what a device needs: a SmolLM2-135M-shaped Llama
(random weights, scaled so its next-token distributions are peaked like a trained model's) samples with our
HF sampler, then the trainer's passes score the same tokens:

- the `auto` probe (`models.precision.probe_matmuls`) on this device, for SmolLM2's and a 7B model's shapes;
- sampler vs π_old pass (nats per token), bf16 with and without the float32 LM head, and float32;
- π_old in the padded and in the packed layout vs the update's first forward (packed, other micro-batches,
  gradients on): the PPO start ratio's deviation from 1;
- the TIS figures of the bf16 sampler against the packed π_old;
- where the sampler/pass gap comes from (`--sources`): bf16 with the attention computed in float32, and bf16
  autocast over float32 weights (the residual stream and norms in float32, only the matmuls in bf16).

`--model PATH` runs the same on a trained checkpoint (e.g. a warm start) instead of the random model.

    python benchmarks/bench_precision_device.py --device cuda --out /tmp/device.json
    python benchmarks/bench_precision_device.py --device cpu --layers 2 --prompts 4   # a quick check here
    python benchmarks/bench_precision_device.py --device cpu --model RUN/warm_start/model --sources --out X.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

from agentgym_opsd.models.hf_policy import HFPolicy
from agentgym_opsd.models.precision import float32_lm_head, probe_matmuls
from agentgym_opsd.trainer.logprobs import (
    batched_response_logprobs,
    bucket_micro_batches,
    pack,
    packed_batched_response_logprobs,
    packed_response_logprobs,
)
from agentgym_opsd.trainer.tis import SamplerCorrection


class _Tokenizer:
    """The two ids the sampler and the passes need (no text is decoded into prompts here)."""

    pad_token_id = 0
    eos_token_id = 2

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(map(str, ids))


@contextlib.contextmanager
def attention_in_float32() -> Any:
    """transformers' SDPA attention with q, k, v and the mask in float32 and the output cast back, in the sampler
    and in both trainer passes (the packed attention calls the same function): isolates how much of the
    sampler/pass gap the attention's blocking (a decode step vs the whole sequence) causes."""
    from transformers import AttentionInterface
    from transformers.integrations import sdpa_attention

    original = sdpa_attention.sdpa_attention_forward

    def in_float32(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()
        out, weights = original(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)
        return out.to(query.dtype), weights

    sdpa_attention.sdpa_attention_forward = in_float32
    AttentionInterface.register("sdpa", in_float32)
    try:
        yield
    finally:
        sdpa_attention.sdpa_attention_forward = original
        AttentionInterface.register("sdpa", original)


def make_model(layers: int, dtype: torch.dtype, device: str, head32: bool, *,
               model_path: str | None = None) -> torch.nn.Module:
    if model_path:
        from agentgym_opsd.models.loading import load_policy_model

        name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
        model = load_policy_model(model_path, dtype=name, float32_head=head32)[0].to(device)
    else:
        model = _random_model(layers, dtype, device)
        if head32:
            float32_lm_head(model)
    return model.eval()


def _random_model(layers: int, dtype: torch.dtype, device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                         tie_word_embeddings=True, initializer_range=0.06, pad_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype)


def gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict[str, float]:
    d = torch.cat([(x.float().cpu() - y.float().cpu()).abs() for x, y in zip(a, b, strict=True) if x.numel()])
    return {"mean": float(d.mean()), "max": float(d.max())}


def update_first_forward(model: torch.nn.Module, prompts: list, responses: list, device: str) -> list[torch.Tensor]:
    """The update's first forward: packed, gradients on, rows shuffled into other micro-batches than π_old's."""
    order = list(range(len(prompts)))
    random.Random(1).shuffle(order)
    lengths = [len(prompts[i]) + len(responses[i]) for i in order]
    out: list[torch.Tensor] = [torch.zeros(0)] * len(prompts)
    model.train()
    for local in bucket_micro_batches(lengths, max_tokens=1500, max_rows=5, padded=False):
        idx = [order[j] for j in local]
        pb = pack(idx, prompts, responses).to(device)
        logp, _ = packed_response_logprobs(model, pb, with_entropy=True)
        logp = logp.detach().cpu()
        for r, i in enumerate(idx):
            n = len(responses[i])
            out[i] = logp[r, logp.shape[1] - n:]
    model.eval()
    return out


def measure(dtype: torch.dtype, head32: bool, args: argparse.Namespace, *, attention32: bool = False,
            autocast: bool = False) -> dict[str, Any]:
    model = make_model(args.layers, dtype, args.device, head32, model_path=args.model)
    device_type = torch.device(args.device).type
    with (torch.autocast(device_type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext(),
          attention_in_float32() if attention32 else contextlib.nullcontext()):
        return _measure(model, args)


def _measure(model: torch.nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    policy = HFPolicy(model, _Tokenizer(), max_new_tokens=args.new_tokens, temperature=1.0, batch_size=args.prompts,
                      stop_strings=(), seed=0)
    gen = random.Random(0)
    prompts = [[gen.randrange(3, 49152) for _ in range(gen.randrange(args.prompt_tokens // 2, args.prompt_tokens))]
               for _ in range(args.prompts)]
    outputs = policy.generate_ids(prompts)
    responses = [list(o.token_ids) for o in outputs]
    sampled = [torch.tensor(o.logprobs) for o in outputs]
    kw = {"max_tokens": 4096, "max_rows": 16, "device": args.device}
    padded = batched_response_logprobs(model, prompts, responses, pad_id=0, **kw)
    packed = packed_batched_response_logprobs(model, prompts, responses, **kw)
    first = update_first_forward(model, prompts, responses, args.device)
    tis = SamplerCorrection.compute(packed, [o.logprobs for o in outputs], cap=2.0, enabled=True).metrics()
    return {"sampler_vs_packed_pass": gap(sampled, packed), "sampler_vs_padded_pass": gap(sampled, padded),
            "start_ratio_max_dev_padded_old": float(torch.expm1(torch.tensor(gap(padded, first)["max"]))),
            "start_ratio_max_dev_packed_old": float(torch.expm1(torch.tensor(gap(packed, first)["max"]))),
            "tis": tis, "tokens": sum(len(r) for r in responses)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=600)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--model", help="a trained checkpoint folder instead of the random SmolLM2-shaped model")
    ap.add_argument("--sources", action="store_true", help="also bf16 with float32 attention, and bf16 autocast")
    ap.add_argument("--threads", type=int, default=0, help="torch threads on the CPU (0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    record: dict[str, Any] = {"device": device_name, "torch": torch.__version__, "layers": args.layers,
                              "model": args.model or "random SmolLM2-135M-shaped", "threads": torch.get_num_threads(),
                              "probe": {}, "runs": {}}
    for name, dims in (("smollm2-135m", (576, 1536)), ("7b", (3584, 18944))):
        p = probe_matmuls(args.device, dims, tokens=2048 if args.device.startswith("cuda") else 512)
        record["probe"][name] = {"float32_gflops": p.float32_gflops, "bfloat16_gflops": p.bfloat16_gflops,
                                 "speedup": p.speedup, "auto_picks": "bfloat16" if p.bf16_pays else "float32"}
        print(f"probe {name}: {p.describe()}", flush=True)
    variants: list[tuple[str, torch.dtype, bool, dict[str, bool]]] = [
        ("float32", torch.float32, False, {}), ("bf16 (bf16 head)", torch.bfloat16, False, {}),
        ("bf16 (float32 head)", torch.bfloat16, True, {})]
    if args.sources:
        variants += [("bf16 (float32 head, float32 attention)", torch.bfloat16, True, {"attention32": True}),
                     ("bf16 autocast (float32 weights and residual stream)", torch.float32, False, {"autocast": True})]
    for label, dtype, head32, options in variants:
        record["runs"][label] = result = measure(dtype, head32, args, **options)
        print(f"{label}: {json.dumps(result)}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
