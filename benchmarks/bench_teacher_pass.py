"""Teacher-pass cost: plain teacher forcing vs the prefix-cached pass, on the same ALFWorld turn rows.

    python benchmarks/bench_teacher_pass.py [--model embedded:smollm2-135m-instruct --episodes 8]

Rows come from oracle episodes on ALFWorld `easy` (prompts as the policy sees them); the teacher prompt
adds the task's skill block `c+` to the system message. Both passes and the student pass run in one process,
interleaved, and the table reports medians and the max |difference| of the two teacher results.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.models.hf_policy import chat_prompt_ids
from agentgym_opsd.models.loading import load_policy_model
from agentgym_opsd.policies import OraclePolicy
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer.logprobs import batched_response_logprobs, prefix_shared_response_logprobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--env", default="ALFWorld-v0:easy")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model, tok = load_policy_model(args.model, trainable=False)
    runner = RolloutRunner(args.env, num_envs=args.episodes)
    trajs = runner.run(OraclePolicy(), [TaskSpec(i, {"task_index": i}) for i in range(args.episodes)])
    runner.close()
    student, teacher, responses = [], [], []
    for traj in trajs:
        for turn in traj.turns:
            student.append(chat_prompt_ids(tok, turn.prompt))
            teacher.append(chat_prompt_ids(tok, runner.teacher_messages(traj, turn)))
            responses.append(tok(turn.response_text, add_special_tokens=False)["input_ids"])
    kw = dict(pad_id=tok.pad_token_id, max_tokens=4096, max_rows=16)
    passes = {
        "student (plain)": lambda: batched_response_logprobs(model, student, responses, **kw),
        "teacher (plain)": lambda: batched_response_logprobs(model, teacher, responses, **kw),
        "teacher (prefix cache)": lambda: prefix_shared_response_logprobs(model, teacher, responses, **kw),
    }
    times: dict[str, list[float]] = {k: [] for k in passes}
    results = {}
    for _ in range(args.repeats):
        for name, fn in passes.items():
            t0 = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - t0)
    diff = max(float((a - b).abs().max()) for a, b in zip(results["teacher (plain)"],
                                                             results["teacher (prefix cache)"], strict=True))
    table = Table(title=f"Teacher pass on {len(responses)} turn rows ({args.env}, {args.model}, "
                        f"{torch.get_num_threads()} threads)")
    for col in ("pass", "mean prompt tokens", "median s", "vs student"):
        table.add_column(col, justify="right")
    base = statistics.median(times["student (plain)"])
    lengths = {"student (plain)": student, "teacher (plain)": teacher, "teacher (prefix cache)": teacher}
    for name in passes:
        med = statistics.median(times[name])
        table.add_row(name, f"{statistics.mean(len(p) for p in lengths[name]):.0f}", f"{med:.2f}", f"{med / base:.2f}x")
    Console().print(table)
    print(f"max |plain - prefix-cache| teacher log-prob: {diff:.2e}")


if __name__ == "__main__":
    main()
