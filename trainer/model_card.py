"""What makes an exported `model/` folder ready to share: a model card (`README.md` in the Hub's format: YAML
metadata, then prose) and a generation config holding the sampling settings the policy was trained with.

The folder then loads in transformers (`AutoModelForCausalLM.from_pretrained(folder)`, `GenerationConfig`
from the same folder) and in vLLM with no project code.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from agentgym_opsd.trainer.config import Config

__all__ = ["model_card", "write_model_card", "write_generation_config", "before_after"]


def before_after(metrics_path: Path, key: str) -> tuple[float, float] | None:
    """(first, last) finite value of `key` in a metrics.jsonl, or None when it was never logged."""
    from agentgym_opsd.evaluation.compare import load_metrics  # skips lines a kill cut short

    if not metrics_path.is_file():
        return None
    values = [float(v) for row in load_metrics(metrics_path) if isinstance(v := row.get(key), (int, float))
              and math.isfinite(v)]
    return (values[0], values[-1]) if values else None


def _base_model(cfg: Config) -> str:
    name = cfg.model.name_or_path
    return {"embedded:smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}.get(name, name)


def model_card(cfg: Config, *, step: int, metrics_path: Path) -> str:
    """The card's text: metadata (base model, library, tags), what was trained how, and the numbers."""
    base = _base_model(cfg)
    meta: dict[str, Any] = {
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["agentgym-opsd", "reinforcement-learning", "llm-agent", cfg.algorithm.estimator,
                 *(spec.split(":")[0].split("/")[-1] for spec, _ in cfg.env.mix)],
    }
    if "/" in base and not Path(base).exists():  # a hub id, not a local folder
        meta["base_model"] = base
    rows = []
    for label, key in (("held-out success", "val/success_rate"), ("training-pool success", "pool/success_rate"),
                       ("held-out invalid-action rate", "val/invalid_action_rate")):
        got = before_after(metrics_path, key)
        if got is not None:
            rows.append(f"| {label} | {got[0]:.1%} | {got[1]:.1%} |")
    results = ("| metric | first validation | last validation |\n|---|---|---|\n" + "\n".join(rows)) if rows else \
        "No validation was logged during this run."
    estimator = cfg.algorithm.estimator
    return (
        f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n\n"
        f"# {base} trained with {estimator} on {cfg.env.id}\n\n"
        f"A multi-turn agent policy trained with agentgym-opsd "
        f"(`python -m agentgym_opsd.train`): {step} RL steps of `{estimator}` credit assignment "
        f"(λ = {cfg.algorithm.lam}, penalty mode `{cfg.algorithm.penalty_mode}`), "
        f"{cfg.rollout.tasks_per_step} tasks × {cfg.rollout.group_size} rollouts per step, "
        f"learning rate {cfg.optim.lr:g}"
        + (", after a supervised warm start on oracle demonstrations" if cfg.warm_start.enabled else "")
        + f", from `{cfg.model.name_or_path}`.\n\n"
        f"## Results\n\n{results}\n\n"
        f"## Use\n\n"
        f"```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f"model = AutoModelForCausalLM.from_pretrained(\"path/to/this/folder\")\n"
        f"tokenizer = AutoTokenizer.from_pretrained(\"path/to/this/folder\")\n```\n\n"
        f"The prompts it expects are the environment's (system prompt, observation, admissible actions); "
        f"answers end with `<action>...</action>`. Sampling settings of training are in `generation_config.json`.\n\n"
        f"## Training configuration\n\n```yaml\n{cfg.to_yaml()}```\n"
    )


def write_generation_config(folder: Path, cfg: Config, tokenizer: Any) -> None:
    """`generation_config.json` with the rollout's sampling settings (temperature, top-p, answer length)."""
    from transformers import GenerationConfig

    path = folder / "generation_config.json"
    try:
        gen = GenerationConfig.from_pretrained(str(folder))
    except (OSError, ValueError):
        gen = GenerationConfig()
    gen.do_sample = cfg.rollout.temperature > 0
    if gen.do_sample:
        gen.temperature = cfg.rollout.temperature
        gen.top_p = cfg.rollout.top_p
    gen.max_new_tokens = cfg.rollout.max_new_tokens
    if getattr(tokenizer, "pad_token_id", None) is not None:
        gen.pad_token_id = tokenizer.pad_token_id
    gen.save_pretrained(str(path.parent))


def write_model_card(folder: Path, cfg: Config, *, step: int, metrics_path: Path, tokenizer: Any) -> None:
    """The card and the generation config into a saved `model/` folder."""
    (folder / "README.md").write_text(model_card(cfg, step=step, metrics_path=metrics_path), encoding="utf-8")
    write_generation_config(folder, cfg, tokenizer)
