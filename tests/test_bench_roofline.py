"""benchmarks/bench_roofline.py: the analytic FLOP / byte counts by hand on a small config, the per-call token
counts of a masked, cached forward call, the forward hooks on a real generation (prefill vs decode), and the
`--quick` run end to end."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from benchmark_scripts import load_benchmark

br = load_benchmark("bench_roofline")

# hidden 8, 2 layers, 2 heads of 4 (q_dim 8), 1 KV head (kv_dim 4), MLP 16, vocab 10, tied LM head
SMALL = br.ModelShape(hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10, tied=True)


def test_small_config_by_hand() -> None:
    # q 8x8 + k, v 2 x 8x4 + o 8x8 + gate, up, down 3 x 8x16 = 64 + 64 + 64 + 384
    assert SMALL.linear_params_per_layer == 576
    assert SMALL.num_params == 2 * (576 + 2 * 8) + 8 + 10 * 8 == 1272  # + norms, final norm, tied embedding
    untied = br.ModelShape(**{**SMALL.__dict__, "tied": False})
    assert untied.num_params == 1272 + 80
    assert SMALL.weight_bytes(4) == untied.weight_bytes(4) == 4 * 1272  # the embedding gather reads no matrix
    assert SMALL.kv_bytes(5, 4) == 4 * 2 * 2 * 4 * 5  # K and V, 2 layers, kv_dim 4, 5 entries

    # 5 tokens, 15 (query, key) pairs, LM head on 4 positions
    per_layer = 2 * 576 * 5 + 4 * 8 * 15  # 5760 + 480
    assert br.layer_flops(SMALL, 5, 15) == per_layer == 6240
    assert br.head_flops(SMALL, 4) == 2 * 8 * 10 * 4 == 640
    assert br.forward_flops(SMALL, 5, 15, 4) == 2 * 6240 + 640 == 13120
    # top layer trains, tied head frozen: 2 x one layer + 1 x head (activation gradient only)
    assert br.backward_flops(SMALL, 5, 15, 4, trainable_layers=1, head_trainable=False) == 2 * 6240 + 640
    assert br.backward_flops(SMALL, 5, 15, 4, trainable_layers=2, head_trainable=False) == 4 * 6240 + 640 == 25600
    assert br.backward_flops(SMALL, 5, 15, 4, trainable_layers=2, head_trainable=True) == 4 * 6240 + 1280 == 26240
    assert br.backward_flops(SMALL, 5, 15, 4, trainable_layers=0, head_trainable=False) == 640


def test_smollm2_135m_shape() -> None:
    config = SimpleNamespace(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                             intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True)
    shape = br.ModelShape.from_config(config)
    assert (shape.head_dim, shape.q_dim, shape.kv_dim) == (64, 576, 192)
    assert shape.linear_params_per_layer == 3_538_944
    assert shape.num_params == 134_515_008  # SmolLM2-135M's published parameter count
    # one token, no context: 2 x (30 layers' linear weights + LM head)
    assert br.forward_flops(shape, 1, 0, 1) == 2 * (30 * 3_538_944 + 576 * 49152) == 268_959_744


def test_call_counts_masked_and_cached() -> None:
    ids = torch.zeros(2, 3, dtype=torch.long)
    # row 0: 2 cached + 3 new real tokens; row 1: left padding (2 cached pads, 1 new pad), then 2 real tokens
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]])
    c = br.call_counts(ids, mask, past=2, logits_to_keep=2)
    # contexts: row 0 sees 3, 4, 5 keys; row 1's real tokens see 1, 2
    assert (c.tokens, c.attn_pairs, c.head_positions, c.kv_tokens, c.padded_tokens) == (5, 3 + 4 + 5 + 1 + 2, 4, 7, 6)
    assert br.call_counts(ids, mask, past=2).head_positions == 5  # logits_to_keep 0: every real position
    prefill = br.call_counts(torch.zeros(1, 4, dtype=torch.long), None, past=0, logits_to_keep=1)
    assert (prefill.tokens, prefill.attn_pairs, prefill.head_positions, prefill.kv_tokens) == (4, 10, 1, 4)


def test_packed_call_counts() -> None:
    # rows of 3 and 2 tokens end to end, the LM head on 2 positions: no padding, causal pairs within each row
    c = br.packed_call_counts(torch.zeros(1, 5, dtype=torch.long), torch.tensor([0, 3, 5]), torch.tensor([1, 3]))
    assert (c.tokens, c.attn_pairs, c.head_positions, c.kv_tokens, c.padded_tokens) == (5, 6 + 3, 2, 5, 5)


def test_packed_calls_count_each_span_with_the_prefix_every_span_sees() -> None:
    ids, cu, keep = torch.zeros(1, 7, dtype=torch.long), torch.tensor([0, 2, 5, 7]), torch.tensor([1, 4, 6])
    plain = br.packed_call_counts(ids, cu, keep)
    assert plain.attn_pairs == 3 + 6 + 3 and plain.tokens == plain.padded_tokens == plain.kv_tokens == 7
    shared = br.packed_call_counts(ids, cu, keep, shared_prefix_len=2)  # the first span: the trainer's system message
    assert shared.attn_pairs == 3 + (6 + 3 * 2) + (3 + 2 * 2)
    cached = br.packed_call_counts(ids, cu, keep, past=4)  # the sampler's prefix in the KV cache
    assert cached.attn_pairs == (3 + 2 * 4) + (6 + 3 * 4) + (3 + 2 * 4) and cached.kv_tokens == 7 + 4


def test_hooks_split_prefill_and_decode() -> None:
    from agentgym_opsd.models.hf_policy import HFPolicy
    from agentgym_opsd.models.loading import load_policy_model

    model, tok = load_policy_model("tiny-random", trainable=False)
    meter = br.ForwardMeter(br.ModelShape.from_config(model.config), trainable_layers=0, head_trainable=False,
                            dtype_bytes=4)
    meter.attach(model)
    prompts = [[5, 6, 7, 8, 9], [5, 6, 7], [5, 6, 7]]  # two copies of one prompt: prefilled once
    with meter.phase("rollout"):
        outs = HFPolicy(model, tok, max_new_tokens=4, temperature=0.0, stop_strings=["</action>"]).generate_ids(prompts)
    meter.detach()
    prefill = [c for c in meter.calls if c.phase == "prefill"]
    decode = [c for c in meter.calls if c.phase == "decode"]
    # packed (left-padding would compute 2 pad tokens of 10: over PACKED_PREFILL_MIN_PADDING), so nothing padded
    assert len(prefill) == 1 and prefill[0].counts.tokens == prefill[0].counts.padded_tokens == 5 + 3
    assert prefill[0].counts.attn_pairs == 5 * 6 // 2 + 3 * 4 // 2  # each row causally on its own span
    assert prefill[0].counts.head_positions == 2  # logits_to_keep=1 per distinct prompt
    # every generated token but a row's last is fed back, one per alive row and step
    assert sum(c.counts.tokens for c in decode) == sum(len(o.token_ids) - 1 for o in outs)
    assert all(c.seconds > 0 and not c.grad for c in meter.calls)
    # the decode step of a row sees its real prompt tokens and every token fed so far
    first = decode[0].counts
    assert first.attn_pairs == (5 + 1) + 2 * (3 + 1)


def test_quick_run_end_to_end(tmp_path) -> None:
    pytest.importorskip("textworld")
    out = tmp_path / "roofline"
    threads = torch.get_num_threads()
    try:
        br.main(["--quick", "--threads", "1", "--out", str(out)])
    finally:  # the script sets the process's torch threads; later tests compare runs bit for bit across processes
        torch.set_num_threads(threads)
    record = json.loads(out.with_suffix(".json").read_text())
    assert out.with_suffix(".png").is_file()
    phases = {p["name"]: p for p in record["phases"]}
    assert {"prefill", "decode", "teacher pass", "update", "old/ref log-probs"} <= set(phases)
    assert phases["prefill"]["flops"] > 0 and phases["decode"]["calls"] > 0 and record["sft"]["flops"] > 0
    assert phases["update"]["tokens"] == record["step"]["update_tokens_expected_from_batch"]
    assert 0 < phases["update"]["share_of_peak"] and record["most_seconds_lost"] in {*phases, "SFT step"}
