"""vLLM backend: what the CPU can check (clear error without vLLM, sampling params, weight names, and the
trainer's engine lifecycle against a recording stand-in)."""

from __future__ import annotations

import logging
import os
import types
from types import SimpleNamespace

import pytest
import torch
from log_records import records_of

from agentgym_opsd.models import vllm_policy as vllm_backend
from agentgym_opsd.models.backends import make_policy_backend
from agentgym_opsd.models.loading import LoraSettings, load_policy_model
from agentgym_opsd.models.vllm_policy import hf_weight_items, sampling_params_kwargs, vllm_weight_name
from agentgym_opsd.policies import PolicyRequest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _platform_that_sleeps(monkeypatch):
    """The recording stand-in is a platform that can sleep (a GPU's), also where vLLM's CPU build, which cannot,
    is installed beside these tests."""
    monkeypatch.setattr(vllm_backend, "_sleep_mode_available", lambda: True)


def test_selecting_vllm_without_it_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: False)  # as where it is not installed
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


# ---- the trainer's vLLM lifecycle, against a recording stand-in for vLLM -------------------------------------
# This checks the wiring (which engine calls happen, in which order, with which settings), not vLLM itself.


def _recording_vllm(events: list[tuple], tokenizer) -> types.ModuleType:
    """A `vllm` module whose LLM records every call and answers every prompt with `<action>inc</action>`."""
    answer = tokenizer("<action>inc</action>", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class LLM:
        def __init__(self, **options):
            events.append(("LLM", options))
            worker = SimpleNamespace(model_runner=SimpleNamespace(model=SimpleNamespace(load_weights=self._load)))
            self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=worker))

        def _load(self, weights):
            if not events or events[-1][0] != "load_weights":
                events.append(("load_weights",))

        def generate(self, prompts, params, use_tqdm=False):
            assert len(params) == len(prompts)  # one SamplingParams, and so one seed, per request
            assert len({p.kwargs.get("seed") for p in params}) == len(params) or params[0].kwargs["temperature"] == 0
            events.append(("generate", params[0].kwargs["temperature"]))
            step = SimpleNamespace(logprob=-0.5)
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(answer), finish_reason="stop",
                                                             logprobs=[{t: step} for t in answer])])
                    for _ in prompts]

        def sleep(self, level=1):
            events.append(("sleep", level))

        def wake_up(self):
            events.append(("wake_up",))

        def reset_prefix_cache(self):
            events.append(("reset_prefix_cache",))

    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = LLM, SamplingParams
    return module


def test_trainer_keeps_one_vllm_engine_synced_after_the_warm_start_and_every_step(tmp_path, monkeypatch,
                                                                                  toy_env_ids):
    from agentgym_opsd.models.loading import load_tokenizer
    from agentgym_opsd.trainer.config import load_config
    from agentgym_opsd.trainer.loop import Trainer

    events: list[tuple] = []
    fake = _recording_vllm(events, load_tokenizer("tiny-random"))
    monkeypatch.setattr(vllm_backend, "require_vllm", lambda: fake)
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS"):  # the policy sets them; restored after
        monkeypatch.delenv(name, raising=False)
    cfg = load_config("cpu-tiny", [
        "env.id=ToyCounter-v0", "rollout.backend=vllm", "trainer.backend=torch", "trainer.total_steps=2",
        "trainer.eval_every=1", "trainer.eval_episodes=2", "trainer.eval_temperature=0.4", "trainer.save_every=0",
        "trainer.tensorboard=false", "warm_start.steps=1", "warm_start.episodes=2", "warm_start.cache=off",
        f"trainer.output_dir={tmp_path / 'run'}"])
    trainer = Trainer(cfg)
    try:
        trainer.train()
    finally:
        trainer.close()
    kinds = [e[0] for e in events]
    assert kinds.count("LLM") == 1  # validation reuses the rollout engine
    options = events[0][1]
    assert options["dtype"] == "float32" and options["enable_sleep_mode"] is True
    # rollout.vllm_max_model_len (8192) capped at the tiny model's own context: vLLM refuses a longer one
    assert options["max_model_len"] == 4096
    # one process: the engine core in this process (a launcher's ranks get external_launcher instead)
    assert "distributed_executor_backend" not in options
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    # phases: (sync?) generate... sleep; a sync is load_weights then reset_prefix_cache, while awake
    phases, current = [], []
    for event in events[1:]:
        current.append(event)
        if event[0] == "sleep":
            phases.append(current)
            current = []
    assert not current

    def temperatures(phase):
        return {e[1] for e in phase if e[0] == "generate"}

    def synced(phase):
        names = [e[0] for e in phase]
        return "load_weights" in names and names.index("load_weights") < names.index("generate") and \
            names.index("reset_prefix_cache") < names.index("generate")

    # step 1 (after the warm start), validation 1, step 2, validation 2
    assert [temperatures(p) for p in phases] == [{1.0}, {0.4}, {1.0}, {0.4}]
    assert synced(phases[0]), "the first RL step sampled from the pre-warm-start weights"
    assert synced(phases[1]) and not synced(phases[2]) and synced(phases[3])  # synced once per weight change
    assert all(p[0][0] == "wake_up" for p in phases[1:])  # woken before anything touches the engine


def test_with_sampling_shares_the_engine_and_its_sleep_state(monkeypatch):
    from agentgym_opsd.models.loading import load_tokenizer

    events: list[tuple] = []
    tok = load_tokenizer("tiny-random")
    monkeypatch.setattr(vllm_backend, "require_vllm", lambda: _recording_vllm(events, tok))
    policy = vllm_backend.VLLMPolicy("somewhere", tokenizer=tok, temperature=1.0, enable_sleep_mode=True)
    view = policy.with_sampling(temperature=0.4, seed=123)
    assert view.llm is policy.llm and policy.temperature == 1.0 and view.temperature == 0.4
    policy.sleep()
    view.act([PolicyRequest([{"role": "user", "content": "hi"}])])
    assert [e[0] for e in events] == ["LLM", "sleep", "wake_up", "generate"]
    policy.wake_up()  # already awake through the view: nothing to do
    assert [e[0] for e in events][-1] == "generate"


def test_kv_cache_size_is_explicit_on_the_cpu_build_and_from_the_utilisation_on_gpus():
    from agentgym_opsd.models.vllm_policy import CPU_KV_CACHE_GIB, kv_cache_bytes

    assert kv_cache_bytes(0.0, cuda=True) is None  # vLLM sizes it from gpu_memory_utilization
    assert kv_cache_bytes(2.0, cuda=True) == 2 * 2**30
    assert kv_cache_bytes(0.0, cuda=False) == int(CPU_KV_CACHE_GIB * 2**30)
    assert kv_cache_bytes(0.25, cuda=False) == 2**28
    with pytest.raises(ValueError, match="kv_cache_gib"):
        kv_cache_bytes(-1.0, cuda=False)


def test_weights_reach_the_engine_in_its_dtype_rounded_as_its_loader_would():
    """float32 trained blocks over a bf16 engine: cast on the way in, to the same bits the engine's `copy_` gives
    (and no warning per tensor); integer tensors and an engine without a named dtype are left alone."""
    weight, ids = torch.randn(64, 64), torch.arange(4)
    cast, kept = vllm_backend._in_dtype(weight, torch.bfloat16), vllm_backend._in_dtype(ids, torch.bfloat16)
    loaded = torch.empty(64, 64, dtype=torch.bfloat16).copy_(weight)
    assert cast.dtype == torch.bfloat16 and torch.equal(cast, loaded) and kept is ids
    assert vllm_backend._in_dtype(weight, None) is weight


def test_the_engines_start_model_is_its_weights_in_its_dtype(tmp_path):
    """What `save_for_engine` writes loads back as a plain model: the weights in the engine's dtype (the tied head
    left to the config, as save_pretrained leaves it), the config and the tokenizer."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from agentgym_opsd.models.loading import load_tokenizer

    model, tok = load_policy_model("tiny-random")
    vllm_backend.save_for_engine(model, tok, tmp_path / "bf16", dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "plain")
    saved, plain = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("bf16", "plain"))
    assert saved.keys() == plain.keys() and {t.dtype for t in saved.values()} == {torch.bfloat16}
    assert all(torch.equal(saved[k], plain[k].to(torch.bfloat16)) for k in saved)
    assert load_tokenizer(str(tmp_path / "bf16")).vocab_size == tok.vocab_size
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "bf16").config.tie_word_embeddings == \
        model.config.tie_word_embeddings
    vllm_backend.save_for_engine(model, tok, tmp_path / "other_rank", dtype=torch.bfloat16, write=False)
    assert not (tmp_path / "other_rank").exists()


def test_a_lora_models_engine_start_is_its_merged_weights_and_the_adapter_survives(tmp_path):
    """vLLM cannot start from an adapter folder: with LoRA the start model is the base with the adapter merged,
    and the live model keeps its adapter unmerged."""
    from transformers import AutoModelForCausalLM

    model, tok = load_policy_model("tiny-random", lora=LoraSettings(r=2, alpha=4, target_modules=("q_proj", "v_proj")))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()  # a trained adapter (lora_B starts at zero)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    model.eval()  # no LoRA dropout
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    vllm_backend.save_for_engine(model, tok, tmp_path / "merged")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, expected, atol=1e-4)
        assert torch.allclose(model(input_ids=ids).logits, expected, atol=1e-5)  # unmerged again, adapter intact
    assert any("lora_B" in name for name, _ in model.named_parameters())


def test_modules_that_fail_inspection_sit_out_the_cpu_engine_start():
    """`modules_the_cpu_engine_can_scan`: a module with an attribute that raises when looked at (as Flask's request
    proxies do outside a request) is out of sys.modules within the block and back, the same object, after it."""
    import sys

    class Proxy:
        __slots__ = ()  # no instance dict: looking for one reaches __getattr__, as with Flask's proxies

        def __getattr__(self, name):
            raise RuntimeError("working outside of a request")

    module = types.ModuleType("_agentgym_test_proxies")
    module.request = Proxy()
    sys.modules[module.__name__] = module
    try:
        with vllm_backend.modules_the_cpu_engine_can_scan() as hidden:
            assert module.__name__ in hidden and module.__name__ not in sys.modules
            assert "os" in sys.modules  # an ordinary module stays
        assert sys.modules[module.__name__] is module
    finally:
        sys.modules.pop(module.__name__, None)


@pytest.mark.parametrize(("layer", "tied", "shown"), [
    ("RotaryEmbedding", False, False),  # a computed table: no checkpoint has it
    ("ParallelLMHead", True, False),  # tied: redone from the embedding right after the reload
    ("ParallelLMHead", False, True),  # untied: its weight should have come, so the warning stays
    ("QKVParallelLinear", True, True),  # any other layer left stale stays loud
])
def test_a_weight_sync_hides_only_the_reload_warnings_it_expects(layer, tied, shown):
    logger = logging.getLogger(vllm_backend.RELOAD_LOGGER)
    with records_of(vllm_backend.RELOAD_LOGGER) as seen:
        with vllm_backend._without_expected_reload_warnings(tied):
            logger.warning("%s: Failed to load weights", layer)
        logger.warning("%s: Failed to load weights", "RotaryEmbedding")  # after the sync: the filter is gone
    assert [r.getMessage() for r in seen] == [f"{layer}: Failed to load weights"] * shown + [
        "RotaryEmbedding: Failed to load weights"]
