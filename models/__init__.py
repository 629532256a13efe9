"""Policies backed by a model: local Hugging Face models (`hf_policy`), vLLM engines (`vllm_policy`, GPU),
OpenAI-compatible endpoints (`openai_client`), and model loading (`loading`: the embedded SmolLM2, local
folders, LoRA adapters, trainer checkpoints); `kv_cache`: the HF sampler's KV cache, which decodes in place.

Both the trainer and evaluation use this layer; it imports neither. Import rule of the package:
environments know nothing of models, `models` knows nothing of training or evaluation, evaluation knows
nothing of training (see docs/architecture.md).
"""
