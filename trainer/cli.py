"""`agentgym-opsd train --config NAME_OR_PATH key.sub=value ...` (= `python -m agentgym_opsd.train`): AgentOPSD /
GRPO training.

Examples::

    python -m agentgym_opsd.train --config cpu-small                       # SmolLM2 on ALFWorld easy, CPU
    python -m agentgym_opsd.train --config cpu-tiny trainer.total_steps=2  # tiny random model (CI smoke)
    python -m agentgym_opsd.train --config cpu-small algorithm.estimator=grpo trainer.output_dir=runs/grpo
    python -m agentgym_opsd.train --config cpu-small --resume auto         # continue the latest checkpoint

Presets are the YAML files in `trainer/presets/` of the repository (`--list-presets`); `--print-config` shows
the resolved config and exits. Unknown keys and bad values are errors that name the key. Exit status: 0 done, 2 a config
or checkpoint error (with several processes, a save that failed on any rank: every rank names the rank that
failed first), 3 the output folder's disk filled up (one line says what was kept for `--resume auto`).

Several processes (data parallel; gloo on the CPU, nccl on GPUs, chosen from the training device)::

    torchrun --nproc-per-node 2 -m agentgym_opsd.train --config cpu-tiny deepspeed.zero_stage=3
    deepspeed --num_gpus 8 -m agentgym_opsd.train --config paper-alfworld
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

__all__ = ["main", "build_arg_parser", "disk_full_message", "learning_summary"]


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agentgym_opsd.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="cpu-small", help="preset name or YAML path (default: cpu-small)")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. trainer.total_steps=5")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import a module (dotted name or .py file) that registers environments/skills (repeatable)")
    p.add_argument("--resume", default=None, help="'auto' (latest checkpoint in the output dir) or a checkpoint folder")
    p.add_argument("--force", action="store_true",
                   help="write into an output dir that holds other files (they are kept, never taken for the run's)")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (with each key's help as a comment) and exit")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default and help")
    p.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    p.add_argument("--log-level", default="INFO")
    # The `deepspeed` launcher appends --local_rank=N; LOCAL_RANK in the environment carries the same.
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    # intermixed: overrides may stand before and after the flags (`key=v --print-config key2=v2`)
    args = build_arg_parser().parse_intermixed_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # this project never downloads weights
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    from agentgym_opsd.trainer.checkpoint import CheckpointError, CheckpointSaveError
    from agentgym_opsd.trainer.config import ConfigError, available_presets, config_help, load_config
    from agentgym_opsd.trainer.finite import NonFiniteError

    if args.list_presets:
        print("\n".join(available_presets()))
        return 0
    if args.help_config:
        print(config_help())
        return 0
    from agentgym_opsd.registry import RegistryError, import_user_module

    try:
        for module in args.imports:  # before the config: it checks env.id against the registry
            import_user_module(module)
    except RegistryError as exc:
        print(f"import error: {exc}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(cfg.to_yaml(with_help=True))
        return 0
    from agentgym_opsd.files import is_disk_full
    from agentgym_opsd.trainer.loop import Trainer

    try:
        trainer = Trainer(cfg, resume=args.resume, force=args.force)
    except CheckpointError as exc:
        print(f"checkpoint error: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:  # what only the run's folder and ranks can tell (a folder that is not a run)
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        return _report_disk_full(cfg.trainer.output_dir, exc)
    try:
        lines = trainer.train()
    except Exception as exc:
        if is_disk_full(exc):
            return _report_disk_full(cfg.trainer.output_dir, exc)
        if isinstance(exc, CheckpointSaveError):  # on every rank alike, naming the rank that failed first
            logging.getLogger(__name__).debug("checkpoint save failed", exc_info=True)
            print(f"checkpoint error: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, NonFiniteError):
            logging.getLogger(__name__).debug("non-finite value", exc_info=True)
            print(non_finite_message(cfg.trainer.output_dir, exc), file=sys.stderr)
            return 4
        raise
    finally:
        trainer.close()
    if not trainer.session.is_main:  # data parallel: rank 0 reports for all
        return 0
    if lines:
        last = lines[-1]
        print(f"done: step {last['step']} success_rate {last['success_rate']:.3f} loss {last['loss']:.4f} "
              f"-> {cfg.trainer.output_dir}")
    for line in learning_summary(trainer.session.out / "metrics.jsonl"):
        print(line)
    print(trainer.time_report())
    return 0


def _report_disk_full(output_dir: str, exc: BaseException) -> int:
    logging.getLogger(__name__).debug("disk full", exc_info=True)  # the traceback, for --log-level DEBUG
    print(disk_full_message(output_dir, exc), file=sys.stderr)
    return 3


def disk_full_message(output_dir: os.PathLike[str] | str, exc: BaseException) -> str:
    """One line for a run that ran out of space: the folder, what failed, and what is kept for `--resume auto`
    (the last complete checkpoint; a half-written one is never renamed into place, see trainer/checkpoint.py)."""
    from pathlib import Path

    from agentgym_opsd.trainer.checkpoint import latest_checkpoint

    out = Path(output_dir)
    filename = getattr(exc, "filename", None)
    where = f" (writing {filename})" if filename and Path(filename) != out else ""
    try:
        kept = latest_checkpoint(out / "checkpoints")
    except OSError:
        kept = None
    resume = (f"kept: the last complete checkpoint {kept} (metrics.jsonl lines after its step are replayed); "
              "free some space and continue with --resume auto") if kept is not None else \
        "no complete checkpoint was written; free some space and start the run again"
    return f"error: no space left on device in {out}{where}; {resume}"


def non_finite_message(output_dir: os.PathLike[str] | str, exc: BaseException) -> str:
    """One line for a run that met a NaN or an infinity: where, and what `--resume auto` would continue from."""
    from pathlib import Path

    from agentgym_opsd.trainer.checkpoint import latest_checkpoint

    kept = latest_checkpoint(Path(output_dir) / "checkpoints")
    resume = (f"the last checkpoint is {kept}: lower optim.lr or optim.grad_clip, then continue with "
              "--resume auto") if kept is not None else "no checkpoint was written; lower optim.lr and start again"
    return f"training error: {exc}; {resume}"


def learning_summary(metrics_path: os.PathLike[str] | str) -> list[str]:
    """'before -> after' lines for held-out validation and the training pool, from a run's metrics.jsonl
    (the first and the last line that has each number; nothing when a run validated once or never), each
    with its Wilson 95% interval when the episode count is logged; the held-out episodes compared one by one
    where the run kept them (`validation/step_*.jsonl`: how many it gained and lost, the paired interval of
    the change); and a warning line when training made the agent worse beyond what chance explains (the
    after-interval wholly below the before-interval, or the paired interval wholly below 0)."""
    from pathlib import Path

    from agentgym_opsd.evaluation.compare import load_metrics
    from agentgym_opsd.evaluation.metrics import wilson_interval
    from agentgym_opsd.evaluation.paired import paired_episodes
    from agentgym_opsd.trainer.validation import read_episode_outcomes, validation_file

    path = Path(metrics_path)
    if not path.is_file():
        return []
    rows = load_metrics(path)
    out = []
    for prefix, label in (("val", "held-out success"), ("pool", "training-pool success")):
        key = f"{prefix}/success_rate"
        seen = [(r.get("step", 0), r[key], r.get(f"{prefix}/episodes")) for r in rows
                if isinstance(r.get(key), (int, float))]
        if len(seen) < 2:
            continue
        (s0, v0, n0), (s1, v1, n1) = seen[0], seen[-1]
        if not (n0 and n1):
            out.append(f"{label}: {100 * v0:.1f}% (step {s0}) -> {100 * v1:.1f}% (step {s1})")
            continue
        lo0, hi0 = wilson_interval(round(v0 * n0), int(n0))
        lo1, hi1 = wilson_interval(round(v1 * n1), int(n1))
        out.append(f"{label}: {100 * v0:.1f}% [{100 * lo0:.0f}, {100 * hi0:.0f}] (step {s0}) -> "
                   f"{100 * v1:.1f}% [{100 * lo1:.0f}, {100 * hi1:.0f}] (step {s1}), 95% intervals over "
                   f"{int(n0)} / {int(n1)} episodes")
        paired = paired_episodes(read_episode_outcomes(validation_file(path.parent, s0)),
                                 read_episode_outcomes(validation_file(path.parent, s1))) if prefix == "val" else None
        if paired is not None:
            out.append(f"held-out episodes: {paired.second_only} won that were lost, {paired.first_only} lost that "
                       f"were won, of {paired.episodes} (change {100 * paired.difference:+.1f} points, paired 95% "
                       f"interval [{100 * paired.low:+.0f}, {100 * paired.high:+.0f}], McNemar p "
                       f"{paired.mcnemar_p:.2f})")
        why = ("lies wholly below its value before" if hi1 < lo0 else
               "is lower on the same episodes beyond chance" if paired is not None and paired.verdict == "worse"
               else None)
        if why:
            out.append(f"WARNING: {label} after training {why}: the run made the agent worse; look at "
                       f"{path.parent / 'credit'} and the trajectories before reusing it.")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
