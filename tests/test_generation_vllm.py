"""vLLM backend: what the CPU can check (clear error without vLLM, sampling params, weight names)."""

from __future__ import annotations

import os

import pytest
import torch

from agentgym_opsd.models import vllm_policy as vllm_backend
from agentgym_opsd.models.hf_policy import make_policy_backend
from agentgym_opsd.models.loading import LoraSettings, load_policy_model
from agentgym_opsd.models.vllm_policy import hf_weight_items, sampling_params_kwargs, vllm_weight_name

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.mark.skipif(vllm_backend.vllm_available(), reason="vLLM is installed here")
def test_selecting_vllm_without_it_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"gpu extra"):
        make_policy_backend("vllm", model_path="tiny-random")
    with pytest.raises(RuntimeError, match=r"agentgym-opsd\[gpu\]"):
        vllm_backend.VLLMPolicy("tiny-random")


def test_broken_vllm_install_is_reported_with_the_cause(monkeypatch):
    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: True)

    def fail(name):
        raise ImportError("libcudart.so.12: cannot open shared object file")

    monkeypatch.setattr(vllm_backend.importlib, "import_module", fail)
    with pytest.raises(RuntimeError, match="libcudart"):
        vllm_backend.require_vllm()


def test_sampling_params_ask_for_the_sampled_logprob_and_keep_the_closing_tag():
    kw = sampling_params_kwargs(max_new_tokens=64, temperature=1.0, stop_strings=("</action>",), seed=7)
    assert kw["n"] == 1 and kw["logprobs"] == 0 and kw["max_tokens"] == 64
    assert kw["stop"] == ["</action>"] and kw["include_stop_str_in_output"] is True
    assert kw["top_p"] == 1.0 and kw["top_k"] == 0 and kw["seed"] == 7
    assert kw["skip_special_tokens"] is False
    greedy = sampling_params_kwargs(max_new_tokens=8, temperature=0.0)
    assert greedy["temperature"] == 0.0 and "seed" not in greedy
    for bad, match in [({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": -0.1}, "temperature"),
                       ({"top_p": 1.5}, "top_p")]:
        args = {"max_new_tokens": 8, "temperature": 1.0} | bad
        with pytest.raises(ValueError, match=match):
            sampling_params_kwargs(**args)


@pytest.mark.parametrize(
    ("trainer_name", "hf_name"),
    [
        ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("module.model.norm.weight", "model.norm.weight"),
        ("_orig_mod.model.embed_tokens.weight", "model.embed_tokens.weight"),
        ("base_model.model.model.layers.1.mlp.up_proj.base_layer.weight", "model.layers.1.mlp.up_proj.weight"),
        ("base_model.model.lm_head.modules_to_save.default.weight", "lm_head.weight"),
        ("model.layers.0._checkpoint_wrapped_module.mlp.down_proj.weight", "model.layers.0.mlp.down_proj.weight"),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", None),
        ("base_model.model.lm_head.original_module.weight", None),
    ],
)
def test_trainer_names_map_to_hf_checkpoint_names(trainer_name, hf_name):
    assert vllm_weight_name(trainer_name) == hf_name


def test_weight_items_of_a_plain_model_are_its_parameters():
    model, _ = load_policy_model("tiny-random")
    items = dict(hf_weight_items(model))
    assert items.keys() == dict(model.named_parameters()).keys()
    assert all(items[n].data_ptr() == p.data_ptr() for n, p in model.named_parameters())  # views, no copies


def test_weight_items_of_a_lora_model_are_the_merged_base_weights_and_the_adapter_survives():
    model, tok = load_policy_model("tiny-random", lora=LoraSettings(r=2, alpha=4, target_modules=("q_proj", "v_proj")))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    ids = torch.tensor([tok("check the merge", add_special_tokens=False)["input_ids"]])
    model.eval()
    with torch.no_grad():
        before = model(ids).logits
    items = {n: t.clone() for n, t in hf_weight_items(model)}
    base, _ = load_policy_model("tiny-random")
    assert items.keys() == dict(base.named_parameters()).keys()
    # the pushed weights are the merged model: a plain model holding them gives the adapted logits
    base.load_state_dict(items, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(base.eval()(ids).logits, before, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(model(ids).logits, before)  # unmerged again afterwards
    assert not torch.equal(items["model.layers.0.self_attn.q_proj.weight"],
                           dict(model.named_parameters())["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])
