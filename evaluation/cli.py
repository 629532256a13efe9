"""`agentgym-opsd eval` (= `python -m agentgym_opsd.evaluate`): run a policy on a suite of environments, and compare runs.

    python -m agentgym_opsd.evaluate --policy oracle --env ALFWorld-v0:valid_unseen --episodes 20 --out runs/oracle
    python -m agentgym_opsd.evaluate --policy hf:embedded:smollm2-135m-instruct --suite default --out runs/smol
    python -m agentgym_opsd.evaluate --policy openai:http://127.0.0.1:8000 --model my-model --env ... --out ...
    python -m agentgym_opsd.evaluate compare runs/grpo runs/agentopsd --out runs/compare
    python -m agentgym_opsd.evaluate curves runs/train-agentopsd          # training curves from metrics.jsonl
    python -m agentgym_opsd.evaluate report runs/smol                     # rebuild reports from episodes.jsonl

Rerunning the same command resumes: finished episodes in OUT/episodes.jsonl are skipped. Episodes that could
not run (an environment crashed or hung, the policy endpoint was down, after `--max-retries` replays) are
not results: they are left out of the statistics, reported, and played by the next run; the command then
exits with status 3 (2 is a usage error).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from agentgym_opsd.envpool import ENV_WORKERS, EVAL_SEED
from agentgym_opsd.evaluation.runner import evaluate_policy
from agentgym_opsd.outputs import OutputRefused, check_output_file, claim_folder
from agentgym_opsd.prompts import PromptRenderer
from agentgym_opsd.registry import prompt_renderer_for

__all__ = ["main", "build_parser", "training_run_config"]

_SUBCOMMANDS = ("compare", "curves", "report")


def _policy_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    for cast in (int, float):
        try:
            return key, cast(value)
        except ValueError:
            continue
    return key, value


# The CLI's defaults are the library's: one place to change them (evaluate_policy's keyword defaults).
_LIBRARY_DEFAULTS = {name: p.default for name, p in inspect.signature(evaluate_policy).parameters.items()
                     if p.default is not inspect.Parameter.empty}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agentgym_opsd.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", required=True,
                   help="hf:PATH_OR_NAME | vllm:PATH | openai:URL | random | oracle")
    p.add_argument("--env", action="append", default=[], metavar="ENV-v0[:split]",
                   help="environment spec (repeatable); without a split, the env's held-out split")
    p.add_argument("--suite", default=None, help="named suite of environments ('default' = every registered env)")
    p.add_argument("--episodes", type=int, default=20, help="episodes per environment spec")
    p.add_argument("--out", required=True, help="output folder (episodes.jsonl, results.json, report.md, PNGs): new, "
                                              "empty, or an earlier evaluation's (played on where it stopped)")
    p.add_argument("--force", action="store_true",
                   help="write into an --out folder that holds other files (they are kept unless one has the name "
                        "of an evaluation file)")
    p.add_argument("--seed", type=int, default=EVAL_SEED, help=f"first evaluation seed (training uses < {EVAL_SEED})")
    p.add_argument("--max-turns", type=int, default=None, help="override the environments' turn limit")
    p.add_argument("--temperature", type=float, default=0.4, help="sampling temperature (0 = greedy)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="response length limit of model policies")
    p.add_argument("--num-envs", type=int, default=_LIBRARY_DEFAULTS["num_envs"],
                   help="environments played in parallel (one policy batch)")
    p.add_argument("--env-workers", choices=sorted(ENV_WORKERS), default=_LIBRARY_DEFAULTS["env_workers"],
                   help="where the environments run: threads (this process), processes (a worker process per "
                        "core; CPU-bound environments such as ALFWorld), ray (Ray actors, `ray` extra)")
    p.add_argument("--max-retries", type=int, default=_LIBRARY_DEFAULTS["max_retries"],
                   help="replays of an episode that ended in an error")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import a module (dotted name or .py file) that registers environments/skills (repeatable)")
    p.add_argument("--model", default=None, help="model name for openai: endpoints")
    p.add_argument("--policy-option", action="append", type=_policy_option, default=[], metavar="KEY=VALUE",
                   help="extra policy option (e.g. adapter=PATH, timeout_s=30, dtype=bfloat16)")
    p.add_argument("--no-oracle-horizon", action="store_true",
                   help="do not play the oracle to find horizons when an env does not report them")
    p.add_argument("--keep-prompts", action="store_true", help="store prompts and token ids in episodes.jsonl")
    p.add_argument("--prompts-from", default="auto", metavar="auto|none|RUN",
                   help="render prompts as a training run did (its history length, prompt bound, action history "
                        "and template): RUN is the run folder or its config.yaml; 'auto' (default) = the run the "
                        "policy's weights come from, when they are a training run's; 'none' = each profile's")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _print_summaries(summaries: Sequence[Any], policy: str) -> None:
    table = Table(title=f"Evaluation: {policy}")
    for col in ("environment", "episodes", "success % [95% CI]", "score", "turns", "invalid %", "failed"):
        table.add_column(col, justify="left" if col == "environment" else "right")
    for s in summaries:
        table.add_row(s.env_spec, str(s.episodes), f"{100 * s.success_rate:.1f} [{100 * s.ci_low:.1f}, "
                      f"{100 * s.ci_high:.1f}]", f"{s.score_mean:.3f}", f"{s.turns_mean:.1f}",
                      f"{100 * s.invalid_action_rate:.1f}", str(s.failed_episodes))
    console = Console()
    if not console.is_terminal:  # a log file or a pipe: rich would assume 80 columns and cut the env names
        console = Console(width=max(console.width, 130))
    console.print(table)


def training_run_config(path: str | Path) -> Path | None:
    """The config.yaml of the training run that `path` (the run, one of its checkpoints, or a checkpoint's
    model folder) belongs to; None when it is not inside a training run."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return None
    for folder in (p, *list(p.parents)[:3]):
        if (folder / "config.yaml").is_file() and (folder / "checkpoints").is_dir():
            return folder / "config.yaml"
    return None


def _prompts_config(choice: str, policy: str) -> str:
    """The config whose prompt settings the evaluation uses ('' = the profiles'), from --prompts-from."""
    if choice == "none":
        return ""
    if choice == "auto":
        kind, _, argument = policy.partition(":")
        found = training_run_config(argument) if kind in ("hf", "vllm") and argument else None
        return str(found) if found else ""
    path = Path(choice).expanduser()
    config = path / "config.yaml" if path.is_dir() else path
    if not config.is_file():
        raise FileNotFoundError(f"--prompts-from {choice}: no training config ({config} does not exist)")
    return str(config)


PROMPT_SETTINGS = ("history_turns", "max_prompt_chars", "action_history", "prompt_template")
"""The keys of a training config's `env` section that decide how prompts are rendered."""


def prompts_of_run(config: str | Path) -> Callable[[str], PromptRenderer]:
    """How the training run whose config.yaml is `config` rendered the prompts of an env spec: its `env`
    section's prompt settings (read from the file: the evaluation does not import the trainer), each absent
    one the profile's own."""
    try:
        data = yaml.safe_load(Path(config).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--prompts-from {config}: not readable as a training config ({exc})") from None
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict):
        raise ValueError(f"--prompts-from {config}: not a training config (no `env` section)")
    return functools.partial(prompt_renderer_for, **{key: env[key] for key in PROMPT_SETTINGS if key in env})


EXIT_INFRASTRUCTURE_FAILURE = 3
"""Exit status when some episodes could not run (environment or policy endpoint down); 2 is a usage error."""


def _run(argv: Sequence[str]) -> int:
    from agentgym_opsd.evaluation.policy_spec import PolicySpecError, make_policy
    from agentgym_opsd.evaluation.suite import SuiteOptions, expand_env_specs, run_suite
    from agentgym_opsd.registry import RegistryError, import_user_module

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.num_envs < 1:
        parser.error("--episodes and --num-envs must be >= 1")
    try:
        for module in args.imports:
            import_user_module(module)
        envs = expand_env_specs(args.env, args.suite)
    except (RegistryError, ValueError) as exc:
        parser.error(str(exc))
    options: dict[str, Any] = {"temperature": args.temperature, "seed": args.seed}
    if args.max_new_tokens is not None:
        options["max_new_tokens"] = args.max_new_tokens
    if args.model is not None:
        options["model"] = args.model
    options.update(dict(args.policy_option))
    try:  # before the model loads: a folder that is someone else's, or a wrong path, fails at once
        output = claim_folder(args.out, "eval", force=args.force, legacy=is_legacy_eval, will_write=EVAL_FILES)
    except OutputRefused as exc:
        parser.error(f"--out: {exc}")
    try:
        prompts_from = _prompts_config(args.prompts_from, args.policy)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    try:
        renderer_for = prompts_of_run(prompts_from) if prompts_from else None
    except ValueError as exc:
        parser.error(str(exc))
    try:
        policy = make_policy(args.policy, **options)
    except PolicySpecError as exc:
        parser.error(str(exc))
    if prompts_from:
        print(f"prompts rendered as in {prompts_from} (--prompts-from none: each environment's own)")
    suite = SuiteOptions(policy=args.policy, envs=envs, episodes=args.episodes, seed=args.seed,
                         num_envs=args.num_envs, max_turns=args.max_turns, max_retries=args.max_retries,
                         oracle_horizon=not args.no_oracle_horizon, keep_prompts=args.keep_prompts,
                         policy_options=options, env_workers=args.env_workers, prompts_from=prompts_from)
    output.record([])  # the owner record first: an evaluation stopped halfway is still this command's to go on
    try:
        summaries = run_suite(policy, suite, args.out, progress=not args.no_progress, renderer_for=renderer_for)
    finally:
        output.record_written()
    _print_summaries(summaries, args.policy)
    print(f"reports written to {args.out}/ (results.json, report.md, success_by_task_type.png, horizon.png)")
    failed = sum(s.failed_episodes for s in summaries)
    if failed:  # infrastructure failures are not results: say so and let scripts notice
        reasons = sorted({r for s in summaries for r in s.failure_reasons})
        print(f"error: {failed} episode(s) did not run ({'; '.join(reasons[:3])}); they are not in the results. "
              f"Fix the cause and run the same command again: only those episodes are played.", file=sys.stderr)
        return EXIT_INFRASTRUCTURE_FAILURE
    return 0


def _subcommand(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m agentgym_opsd.evaluate")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="runs side by side (table + plot)")
    c.add_argument("runs", nargs="+", help="evaluation output folders and/or training run folders")
    c.add_argument("--out", default="compare", help="where compare.md / compare.png go (a new, empty or earlier "
                                                      "comparison's folder)")
    c.add_argument("--force", action="store_true", help="write into an --out folder that holds other files")
    k = sub.add_parser("curves", help="training curves from a run's metrics.jsonl")
    k.add_argument("run", help="training run folder (or its metrics.jsonl)")
    k.add_argument("--out", default=None, help="PNG path (default RUN/training_curves.png); an existing file is "
                                               "refused unless --force")
    k.add_argument("--force", action="store_true", help="replace the file at --out")
    r = sub.add_parser("report", help="rebuild results.json, report.md and plots from episodes.jsonl")
    r.add_argument("out", help="evaluation output folder")
    r.add_argument("--policy", default=None, help="which policy's episodes (default: the last one written)")
    args = p.parse_args(argv)
    try:
        if args.command == "compare":
            from agentgym_opsd.evaluation.compare import compare_runs

            output = claim_folder(args.out, "compare", force=args.force, will_write=("compare.md", "compare.png"))
            written = compare_runs(args.runs, args.out)
            output.record(path.name for path in written.values())
            print((written["table"]).read_text(encoding="utf-8"))
            print("written: " + ", ".join(str(v) for v in written.values()))
        elif args.command == "curves":
            from agentgym_opsd.evaluation.compare import write_curves

            if args.out is not None:
                check_output_file(args.out, force=args.force)
            print(f"written: {write_curves(args.run, args.out)}")
        else:
            from agentgym_opsd.evaluation.suite import rebuild_reports

            if Path(args.out).is_dir():  # a missing one is rebuild_reports' FileNotFoundError, not a new folder
                claim_folder(args.out, "eval", legacy=is_legacy_eval)  # an evaluation's folder, none other
            summaries = rebuild_reports(args.out, policy=args.policy)
            _print_summaries(summaries, summaries[0].policy if summaries else "")
    except (FileNotFoundError, ValueError) as exc:  # OutputRefused among them
        p.error(str(exc))
    return 0


EVAL_FILES = ("episodes.jsonl", "results.json", "report.md", "success_by_task_type.png", "horizon.png")
"""The files an evaluation writes at the top of its --out folder."""


def is_legacy_eval(folder: Path) -> bool:
    """An evaluation's folder from before owner records: its episodes beside its run settings."""
    from agentgym_opsd.evaluation.suite import RUN_FILE

    return (folder / "episodes.jsonl").is_file() and (folder / RUN_FILE).is_file()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if argv and argv[0] in _SUBCOMMANDS:
        return _subcommand(argv)
    return _run(argv)


if __name__ == "__main__":
    raise SystemExit(main())
