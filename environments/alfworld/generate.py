"""Write generated ALFWorld games in ALFWorld's on-disk layout.

    python -m agentgym_opsd.environments.alfworld.generate --out DIR --per-type N --seed S [--split NAME]
        [--receptacles LOW HIGH] [--distractors LOW HIGH] [--max-plan-length K] [--unseen-scenes]

writes `DIR/json_2.1.1/<split>/<task_type>-<Obj>-None-<Recep>-<scene>/trial_<id>/{traj_data.json,
game.tw-pddl}`; ALFWorld's `AlfredTWEnv` (data_path pointed at `DIR/json_2.1.1/<split>`) plays them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from agentgym_opsd.environments.alfworld.generator import GameGenerator, Horizon, check_split_name, write_game
from agentgym_opsd.environments.alfworld.vocabulary import (
    SCENE_NUMBERS_SEEN,
    SCENE_NUMBERS_UNSEEN,
    TASK_TYPES,
)

__all__ = ["main", "build_parser"]


def _split_name(text: str) -> str:
    try:
        return check_split_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="data root (json_2.1.1/ is created inside)")
    parser.add_argument("--per-type", type=int, required=True, help="games per task type (six types)")
    parser.add_argument("--seed", type=int, default=0, help="generation seed")
    parser.add_argument("--split", default="train", type=_split_name, help="split folder name under json_2.1.1/")
    parser.add_argument("--receptacles", type=int, nargs=2, default=(6, 14), metavar=("LOW", "HIGH"),
                        help="receptacles per room (inclusive range)")
    parser.add_argument("--distractors", type=int, nargs=2, default=(2, 8), metavar=("LOW", "HIGH"),
                        help="distractor objects per room (inclusive range)")
    parser.add_argument("--max-plan-length", type=int, default=None, help="reject games with longer optimal plans")
    parser.add_argument("--no-closed-start", action="store_true", help="targets never start in closed receptacles")
    parser.add_argument("--unseen-scenes", action="store_true", help="lay rooms out as the unseen scenes (1-6)")
    parser.add_argument("--task-types", nargs="+", default=list(TASK_TYPES), choices=TASK_TYPES)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.per_type < 1:
        build_parser().error(f"--per-type must be >= 1, got {args.per_type}")
    horizon = Horizon(num_receptacles=tuple(args.receptacles), num_distractors=tuple(args.distractors),
                      allow_closed_start=not args.no_closed_start, max_plan_length=args.max_plan_length)
    scenes = SCENE_NUMBERS_UNSEEN if args.unseen_scenes else SCENE_NUMBERS_SEEN
    generator = GameGenerator()
    start = time.perf_counter()
    count = 0
    for k in range(args.per_type):
        for task_type in args.task_types:
            game = generator.generate(task_type, f"{args.split}|{args.seed}|{task_type}|{k}", horizon,
                                      scene_numbers=scenes, trial_id=f"T{args.seed}_{task_type[:4]}_{k:05d}")
            write_game(game, args.out, args.split)
            count += 1
    seconds = time.perf_counter() - start
    print(f"wrote {count} games to {args.out}/json_2.1.1/{args.split} in {seconds:.1f}s ({count / seconds:.1f} games/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
