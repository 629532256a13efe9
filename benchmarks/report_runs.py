"""Finished training runs side by side, from their own folders: held-out and pool success and invalid actions
before and after RL, the held-out change episode by episode, and the credit checks of their training rollouts
(rows of lost rollouts pushed up; invalid turns pushed up). For runs made by hand with `agentgym_opsd.train`
(each evaluated at step 0 and after its last step), where `bench_main_job.py` would run them itself.

    python benchmarks/report_runs.py --run "seed 0" runs/a --run "seed 0, fix" runs/b --results out.json

With `--replay NAME BEFORE AFTER` it compares instead two evaluation-only runs (`trainer.total_steps=0
trainer.eval_at_start=true`, `model.name_or_path` the weights, `warm_start.epochs=0`) that played the same held-out
episodes, typically each game several times (`trainer.eval_episodes` a multiple of the games): the paired change
over all of them, the change per game, and how many episodes two draws of the BEFORE weights alone turn around
(the flips the sampler gives a 48-episode comparison with no change in the weights at all).

Each run's "before" is its own step-0 validation (a cached start evaluation counts: every run from one warm start
plays the same episodes with the same sampler seed). Writes the JSON given (one record per run name, with the CPU,
and `pooled`: the runs' held-out episodes gained and lost summed, with McNemar's test of the sums, and the mean
change of held-out and pool success) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml
from experiments import read_metrics, run_result
from harness import cpu_model
from rich.console import Console
from rich.table import Table

from agentgym_opsd.evaluation.paired import mcnemar_p, paired_episodes
from agentgym_opsd.trainer.validation import read_episode_outcomes, validation_file


def report(run_dir: Path) -> dict[str, Any]:
    """`experiments.run_result` of one finished run against its own step-0 validation, with its seeds and the
    penalty settings from its saved config."""
    start = next((m for m in read_metrics(run_dir) if m.get("step") == 0 and "val/success_rate" in m), None)
    if start is None:
        raise SystemExit(f"{run_dir}: no validation at step 0 in its metrics.jsonl")
    result = run_result(run_dir, start, before_dir=run_dir)
    if result is None:
        raise SystemExit(f"{run_dir}: no validation after an RL step yet (not finished?)")
    config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    algorithm = config.get("algorithm", {})
    warm_seed = config.get("warm_start", {}).get("seed", -1)
    summary = run_dir / "warm_start" / "summary.json"
    exact = (json.loads(summary.read_text(encoding="utf-8")).get("warm_start/heldout_action_exact_match")
             if summary.is_file() else None)
    return {"run_dir": run_dir.name, "trainer_seed": config["trainer"]["seed"],
            # the warm start's seed (`warm_start.seed`, -1 = trainer.seed) and its held-out exact match
            "warm_start_seed": warm_seed if warm_seed >= 0 else config["trainer"]["seed"],
            "warm_start_exact_match": exact,
            "penalty_mode": algorithm.get("penalty_mode"),
            "penalised_turns_gain": algorithm.get("penalised_turns_gain", True),  # before the option: they gained
            "loss_agg_mode": algorithm.get("loss_agg_mode", "token-mean"), "kl_coef": algorithm.get("kl_coef"), **result}


def draws(episodes: list[dict[str, Any]]) -> list[dict[str, bool]]:
    """The episodes split by draw, each draw's games won or lost: the k-th play of each game goes to draw k."""
    plays: dict[str, int] = {}
    out: list[dict[str, bool]] = []
    for episode in episodes:
        k = plays.get(episode["task_id"], 0)
        plays[episode["task_id"]] = k + 1
        if k == len(out):
            out.append({})
        out[k][episode["task_id"]] = bool(episode["won"])
    return out


def draw_flips(by_draw: list[dict[str, bool]]) -> list[dict[str, Any]]:
    """Each pair of `draws` of one evaluation compared game by game, as two evaluations of one run are: the
    episodes the second draw won that the first lost and the reverse, with no change in the weights at all."""
    flips = []
    for i, first in enumerate(by_draw):
        for j in range(i + 1, len(by_draw)):
            second = by_draw[j]
            games = first.keys() & second.keys()
            flips.append({"draws": [i, j], "games": len(games),
                          "gained": sum(second[g] and not first[g] for g in games),
                          "lost": sum(first[g] and not second[g] for g in games)})
    return flips


def replay(before_dir: Path, after_dir: Path) -> dict[str, Any]:
    """Two evaluation-only runs of the same held-out episodes: success of each, the paired change episode by
    episode, the change in wins per game, and `draw_flips` of the BEFORE weights."""
    before, after = (read_episode_outcomes(validation_file(d, 0)) for d in (before_dir, after_dir))
    paired = paired_episodes(before, after)
    if paired is None:
        raise SystemExit(f"{before_dir} and {after_dir}: no held-out episodes in common")
    wins: dict[str, list[int]] = {}
    for k, episodes in enumerate((before, after)):
        for e in episodes:
            wins.setdefault(e["task_id"], [0, 0])[k] += bool(e["won"])
    per_game = [after_wins - before_wins for before_wins, after_wins in wins.values()]
    by_draw = draws(before)
    # folder names, as `report` keeps them: the folders live outside the repository
    return {"before_dir": before_dir.name, "after_dir": after_dir.name,
            "before_success": sum(bool(e["won"]) for e in before) / len(before),
            "after_success": sum(bool(e["won"]) for e in after) / len(after),
            "games": len(wins), "draws": len(by_draw), "valid_paired": paired.to_json(),
            "games_better": sum(d > 0 for d in per_game), "games_worse": sum(d < 0 for d in per_game),
            "before_draw_flips": draw_flips(by_draw), "cpu": cpu_model()}


def summed_pairs(paired: list[dict[str, Any]]) -> tuple[int, int, float]:
    """Held-out episodes lost and gained summed over paired comparisons, and McNemar's p of the sums (comparisons
    that share their "before" episodes make the sums overstate the evidence a little)."""
    lost, gained = sum(p["first_only"] for p in paired), sum(p["second_only"] for p in paired)
    return lost, gained, mcnemar_p(lost, gained)


def pooled(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The runs together: held-out episodes won before and lost after (`first_only`) and the reverse, summed over
    the runs that kept their episodes, McNemar's p of the sums (runs from one warm start share their "before"
    episodes, so the sums overstate the evidence a little), and the mean before -> after change per run."""
    paired = [r["valid_paired"] for r in runs.values() if r["valid_paired"]]
    lost, gained, p_value = summed_pairs(paired)

    def changes(split: str) -> list[float]:
        return [r["after"][split]["success"] - r["before"][split]["success"]
                for r in runs.values() if r["before"][split] and r["after"][split]]

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    valid = changes("valid")
    return {"runs": len(runs), "paired_runs": len(paired), "episodes": sum(p["episodes"] for p in paired),
            "first_only": lost, "second_only": gained, "mcnemar_p": p_value,
            "valid_change_mean": mean(valid), "pool_change_mean": mean(changes("pool")),
            "valid_fell": sum(change < 0 for change in valid)}


def _pct(rate: dict[str, Any] | None, key: str) -> str:
    value = (rate or {}).get(key)
    return "–" if value is None else f"{100 * value:.1f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", nargs=2, action="append", default=[], metavar=("NAME", "DIR"))
    ap.add_argument("--replay", nargs=3, action="append", default=[], metavar=("NAME", "BEFORE", "AFTER"),
                    help="two evaluation-only runs of the same held-out episodes (module doc)")
    ap.add_argument("--results", type=Path, required=True, help="the JSON to write (runs by name)")
    ap.add_argument("--note", default="", help="how the runs were made (commit, threads), kept in the JSON")
    args = ap.parse_args(argv)
    if bool(args.run) == bool(args.replay):
        ap.error("give --run (training runs) or --replay (evaluation-only pairs), not both or neither")
    if args.replay:
        write_replays(args.replay, args.results, args.note)
        return
    runs = {name: report(Path(folder)) for name, folder in args.run}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    summary = pooled(runs)
    record = {"runs": runs, "pooled": summary, **({"note": args.note} if args.note else {})}
    args.results.write_text(json.dumps(record, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    table = Table(title="runs, before -> after RL (%)")
    for col in ("run", "held-out", "held-out invalid", "pool", "pool invalid", "won->lost / lost->won",
                "invalid turns pushed up"):
        table.add_column(col, justify="right")
    for name, r in runs.items():
        before, after, paired = r["before"], r["after"], r["valid_paired"] or {}
        table.add_row(name, *(f"{_pct(before[s], k)} -> {_pct(after[s], k)}"
                              for s, k in (("valid", "success"), ("valid", "invalid_action_rate"),
                                           ("pool", "success"), ("pool", "invalid_action_rate"))),
                      f"{paired.get('first_only', '–')} / {paired.get('second_only', '–')}",
                      f"{r['invalid_rows_positive']} of {r['invalid_rows']}")
    Console().print(table)
    print(f"pooled over {summary['paired_runs']} runs: held-out {summary['second_only']} episodes gained, "
          f"{summary['first_only']} lost (McNemar p {summary['mcnemar_p']:.2f}); {summary['valid_fell']} of "
          f"{summary['runs']} runs fell on the held-out games")
    print(f"wrote {args.results}", file=sys.stderr)


def write_replays(pairs: list[list[str]], results: Path, note: str) -> None:
    """`--replay`: the pairs' records (`replay`) and a table."""
    replays = {name: replay(Path(before), Path(after)) for name, before, after in pairs}
    results.parent.mkdir(parents=True, exist_ok=True)
    changes = [r["after_success"] - r["before_success"] for r in replays.values()]
    lost, gained, p_value = summed_pairs([r["valid_paired"] for r in replays.values()])
    summary = {"pairs": len(replays), "gained": gained, "lost": lost, "mcnemar_p": p_value,
               "change_mean": statistics.mean(changes), "fell": sum(c < 0 for c in changes),
               "draw_flips_mean": statistics.mean(f["gained"] + f["lost"] for r in replays.values()
                                                  for f in r["before_draw_flips"])}
    record = {"replays": replays, "pooled": summary, **({"note": note} if note else {})}
    results.write_text(json.dumps(record, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    table = Table(title="held-out episodes replayed, before -> after (%)")
    for col in ("pair", "episodes", "before -> after", "gained / lost (McNemar p)", "games better / worse",
                "two draws of BEFORE: gained / lost"):
        table.add_column(col, justify="right")
    for name, r in replays.items():
        pair = r["valid_paired"]
        flips = ", ".join(f"{f['gained']} / {f['lost']}" for f in r["before_draw_flips"])
        table.add_row(name, str(pair["episodes"]), f"{100 * r['before_success']:.1f} -> {100 * r['after_success']:.1f}",
                      f"{pair['second_only']} / {pair['first_only']} ({pair['mcnemar_p']:.2f})",
                      f"{r['games_better']} / {r['games_worse']}", flips)
    Console().print(table)
    print(f"wrote {results}", file=sys.stderr)


if __name__ == "__main__":
    main()
