"""Teacher-pass cost: plain teacher forcing vs the prefix-cached pass, on the same ALFWorld turn rows.

    python benchmarks/bench_teacher_pass.py [--model embedded:smollm2-135m-instruct --episodes 8]

Rows come from oracle episodes on ALFWorld `easy` (prompts as the policy sees them); the teacher prompt
adds the task's skill block `c+` to the system message. Both passes and the student pass run in one process,
interleaved, and the table reports medians and the max |difference| of the two teacher results. The prefix-cached
pass runs twice: its rows left-padded after a copy of the prefix's cache repeated over them, and packed end to end
after the one-row cache (the trainer keeps the left-padded rows: packed measured 0.96x on a CPU).

The choice-level teacher (`teacher.evidence=choice`) scores every admissible action under the teacher prompt
too. Two ways to get both numbers are timed beside the others: the choice pass and then the teacher pass
(two runs of each long prompt), and the choice pass with each sampled reply as one more continuation of the
same KV cache (`score_continuations(..., replies)`: one run), with the max |difference| of the folded reply
log-probs from the teacher pass.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.models.hf_policy import chat_prompt_ids, text_ids
from agentgym_opsd.models.loading import load_policy_model
from agentgym_opsd.policies import OraclePolicy
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer.choice_logprobs import score_continuations
from agentgym_opsd.trainer.logprobs import batched_response_logprobs, prefix_shared_response_logprobs
from agentgym_opsd.trainer.teacher_evidence import turn_choice_set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--env", default="ALFWorld-v0:easy")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--choices-only", action="store_true",
                    help="time only the two ways of the choice-level teacher (the student pass stays as the base)")
    args = ap.parse_args()
    model, tok = load_policy_model(args.model, trainable=False)
    runner = RolloutRunner(args.env, num_envs=args.episodes)
    trajs = runner.run(OraclePolicy(), [TaskSpec(i, {"task_index": i}) for i in range(args.episodes)])
    runner.close()
    student, teacher, responses, choices = [], [], [], []
    for traj in trajs:
        for turn in traj.turns:
            student.append(chat_prompt_ids(tok, turn.prompt))
            teacher.append(chat_prompt_ids(tok, runner.teacher_messages(traj, turn)))
            responses.append(tok(turn.response_text, add_special_tokens=False)["input_ids"])
            choice_set = turn_choice_set(turn, runner.parser)
            choices.append([text_ids(tok, t) for t in choice_set.texts] if choice_set else [])
    kw = dict(pad_id=tok.pad_token_id, max_tokens=4096, max_rows=16)
    passes = {
        "student (plain)": lambda: batched_response_logprobs(model, student, responses, **kw),
        "teacher (plain)": lambda: batched_response_logprobs(model, teacher, responses, **kw),
        "teacher (prefix cache)": lambda: prefix_shared_response_logprobs(model, teacher, responses, **kw),
        "teacher (prefix cache, packed rows)": lambda: prefix_shared_response_logprobs(model, teacher, responses,
                                                                                      packed=True, **kw),
        "choices, then teacher (prefix cache)": lambda: (
            score_continuations(model, teacher, choices, max_tokens=4096),
            prefix_shared_response_logprobs(model, teacher, responses, **kw)),
        "choices with the reply folded in": lambda: score_continuations(model, teacher, choices, responses,
                                                                        max_tokens=4096),
    }
    if args.choices_only:
        passes = {k: v for k, v in passes.items() if k.startswith(("student", "choices"))}
    times: dict[str, list[float]] = {k: [] for k in passes}
    results = {}
    for _ in range(args.repeats):
        for name, fn in passes.items():
            t0 = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - t0)
    table = Table(title=f"Teacher pass on {len(responses)} turn rows ({args.env}, {args.model}, "
                        f"{torch.get_num_threads()} threads)")
    for col in ("pass", "mean prompt tokens", "median s", "vs student"):
        table.add_column(col, justify="right")
    base = statistics.median(times["student (plain)"])
    for name in passes:
        med = statistics.median(times[name])
        prompts = student if name.startswith("student") else teacher
        table.add_row(name, f"{statistics.mean(len(p) for p in prompts):.0f}", f"{med:.2f}", f"{med / base:.2f}x")
    Console().print(table)
    if "teacher (plain)" in results:
        prefix_diff = _max_diff(results["teacher (plain)"], results["teacher (prefix cache)"])
        packed_diff = _max_diff(results["teacher (plain)"], results["teacher (prefix cache, packed rows)"])
        packed = statistics.median(times["teacher (prefix cache)"]) / statistics.median(
            times["teacher (prefix cache, packed rows)"])
        print(f"max |plain - prefix-cache| teacher log-prob: {prefix_diff:.2e} (packed rows: {packed_diff:.2e}); "
              f"packed rows after the one-row prefix cache: {packed:.2f}x the left-padded rows' speed")
    judged = [c for c in choices if c]
    two = statistics.median(times["choices, then teacher (prefix cache)"])
    one = statistics.median(times["choices with the reply folded in"])
    fold_diff = _max_diff(results["choices with the reply folded in"].replies,
                          results["choices, then teacher (prefix cache)"][1])
    print(f"{sum(map(len, judged)) / max(len(judged), 1):.1f} choices per turn on {len(judged)} of {len(choices)} "
          f"rows; folding the reply into the choice pass: {two / one:.2f}x faster, max |folded - teacher pass| "
          f"reply log-prob {fold_diff:.2e}")


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


if __name__ == "__main__":
    main()
