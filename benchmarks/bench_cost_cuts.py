"""Cost cuts for RL on 2 CPU cores, each measured side by side in one run (prints rich tables).

    python benchmarks/bench_cost_cuts.py                 # SmolLM2-135M, real ALFWorld `easy` prompts
    python benchmarks/bench_cost_cuts.py --rows 4 --repeats 1

1. Layer freezing (`model.trainable_layers`): forward+backward tokens/s of one update micro-batch of real
   turn rows, training all 30 layers vs the top 12 vs the top 6 (the forward pass alone for reference).
2. Response-only logits (`logits_to_keep`, what every log-prob pass does): forward time with the LM head on
   the response positions only vs on every position.
3. Prompt length (`env.history_turns`, the admissible list): mean student and teacher prompt tokens of
   oracle turns for history 0/1/2, with and without the admissible-action list.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from harness import timed  # benchmarks/ is on sys.path when a script runs from it
from rich.console import Console
from rich.table import Table

from agentgym_opsd.models.hf_policy import chat_prompt_ids
from agentgym_opsd.models.loading import freeze_lower_layers, load_policy_model
from agentgym_opsd.prompts import PromptRenderer
from agentgym_opsd.registry import env_profile
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer.logprobs import collate, response_logprobs
from agentgym_opsd.trainer.task_stream import train_task_specs
from agentgym_opsd.trainer.warm_start import collect_demonstrations

ENV = "ALFWorld-v0:easy"


def demos(history: int, admissible: bool, episodes: int):
    profile = env_profile("agentgym_opsd/ALFWorld-v0")
    renderer = PromptRenderer(profile.system_prompt, history_turns=history, show_admissible=admissible)
    runner = RolloutRunner(ENV, num_envs=8, env_kwargs={"max_turns": 10}, renderer=renderer, use_skills=True)
    try:
        trajs = collect_demonstrations(runner, train_task_specs(0, episodes, num_tasks=120, seed=1), batch=8)
        return trajs, runner
    except Exception:
        runner.close()
        raise


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8, help="turn rows per micro-batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=16)
    args = ap.parse_args()
    console = Console()

    # 3. prompt lengths (and the rows the timing below uses)
    _, tok = load_policy_model(trainable=False)
    table = Table(title=f"prompt tokens per turn, {ENV} oracle turns")
    for col in ("history turns", "admissible list", "student prompt", "teacher prompt (+ c+)"):
        table.add_column(col, justify="right")
    rows = None
    for history in (2, 1, 0):
        for admissible in (True, False):
            trajs, runner = demos(history, admissible, args.episodes)
            turns = [(traj, t) for traj in trajs for t in traj.turns]
            student = [len(chat_prompt_ids(tok, t.prompt)) for _, t in turns]
            teacher = [len(chat_prompt_ids(tok, runner.teacher_messages(traj, t))) for traj, t in turns]
            if history == 2 and admissible:
                rows = [(chat_prompt_ids(tok, t.prompt), tok(t.response_text, add_special_tokens=False)["input_ids"])
                        for _, t in turns[: args.rows]]
            runner.close()
            table.add_row(str(history), "yes" if admissible else "no", f"{statistics.mean(student):.0f}",
                          f"{statistics.mean(teacher):.0f}")
    assert rows is not None
    prompts, responses = [r[0] for r in rows], [r[1] for r in rows]
    mb = collate(list(range(len(rows))), prompts, responses, tok.pad_token_id)
    tokens = int(mb.attention_mask.sum())

    # 1. layer freezing
    speed = Table(title=f"update micro-batch: {len(rows)} real rows, {tokens} tokens, "
                        f"{torch.get_num_threads()} threads (median of {args.repeats})")
    for col in ("trained layers", "trainable params (M)", "fwd+bwd s", "tokens/s", "speed-up"):
        speed.add_column(col, justify="right")
    base = None
    for layers in (0, 12, 6):
        model, _ = load_policy_model(trainable=True)
        trainable = freeze_lower_layers(model, layers) if layers else sum(p.numel() for p in model.parameters())

        def step(model=model) -> None:
            logp, _ = response_logprobs(model, mb)
            (-logp.sum()).backward()
            model.zero_grad(set_to_none=True)

        seconds = timed(step, args.repeats, warm_up=False)[0]
        base = base or seconds
        speed.add_row("all 30" if not layers else f"top {layers}", f"{trainable / 1e6:.1f}", f"{seconds:.2f}",
                      f"{tokens / seconds:.0f}", f"{base / seconds:.2f}x")
    with torch.no_grad():
        fwd = timed(lambda: response_logprobs(model, mb), args.repeats, warm_up=False)[0]
    speed.add_row("forward only", "-", f"{fwd:.2f}", f"{tokens / fwd:.0f}", f"{base / fwd:.2f}x")
    console.print(table)
    console.print(speed)

    # 2. response-only logits
    model.eval()
    width = mb.response_ids.shape[1]
    kwargs = dict(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids)
    with torch.no_grad():
        only = timed(lambda: model(**kwargs, logits_to_keep=width + 1), args.repeats, warm_up=False)[0]
        full = timed(lambda: model(**kwargs, logits_to_keep=0), args.repeats, warm_up=False)[0]
    logits = Table(title="forward pass: LM head on response positions only vs on every position")
    for col in ("logits", "seconds", "ratio"):
        logits.add_column(col, justify="right")
    logits.add_row(f"response only ({width + 1} positions)", f"{only:.2f}", "1.00x")
    logits.add_row(f"all ({mb.input_ids.shape[1]} positions)", f"{full:.2f}", f"{full / only:.2f}x")
    console.print(logits)


if __name__ == "__main__":
    main()
