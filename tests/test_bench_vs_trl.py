"""benchmarks/bench_vs_trl.py without TRL: an episode packed into TRL's one-row multi-turn layout (actions trained,
prompts masked, in order), and the cut of a `generate` row whose padding is the end-of-sequence token."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest

from agentgym_opsd.records import Trajectory, Turn

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_vs_trl.py"
_spec = importlib.util.spec_from_file_location("bench_vs_trl", _PATH)
assert _spec is not None and _spec.loader is not None
bvt = importlib.util.module_from_spec(_spec)
sys.modules["bench_vs_trl"] = bvt
_spec.loader.exec_module(bvt)


def _encode(messages: list[dict[str, str]]) -> list[int]:
    """A stand-in tokenizer: one id per character of the user message, offset so ids never look like actions."""
    return [1000 + ord(c) for c in messages[-1]["content"]]


def _turn(k: int, prompt: str, action_ids: list[int]) -> Turn:
    return Turn(index=k, prompt=[{"role": "system", "content": "s"}, {"role": "user", "content": prompt}],
                response_text="", action="go", action_valid=True, observation="", reward=0.0,
                response_token_ids=action_ids, response_logprobs=[-0.5 - i for i in range(len(action_ids))])


def test_pack_episode_trains_actions_in_order_and_masks_prompts() -> None:
    traj = Trajectory(env_id="e", task_id="t", task_type="x", group_id=0, traj_id=0, seed=0,
                      turns=[_turn(0, "ab", [1, 2, 3]), _turn(1, "cde", [4, 5]), _turn(2, "f", [6])])
    row = bvt.pack_episode(traj, _encode, filler_id=2)
    assert row.prompt_ids == _encode(traj.turns[0].prompt)
    assert row.completion_ids == [1, 2, 3, *_encode(traj.turns[1].prompt), 4, 5, *_encode(traj.turns[2].prompt), 6]
    assert len(row.env_mask) == len(row.logprobs) == len(row.completion_ids)
    trained = [t for t, m in zip(row.completion_ids, row.env_mask, strict=True) if m]
    assert trained == [1, 2, 3, 4, 5, 6]  # every sampled token, in order, and nothing else
    kept = [lp for lp, m in zip(row.logprobs, row.env_mask, strict=True) if m]
    assert kept == [lp for turn in traj.turns for lp in turn.response_logprobs]
    assert all(lp == 0.0 for lp, m in zip(row.logprobs, row.env_mask, strict=True) if not m)


def test_pack_episode_without_turns_trains_nothing() -> None:
    traj = Trajectory(env_id="e", task_id="t", task_type="x", group_id=0, traj_id=0, seed=0, error="reset failed")
    row = bvt.pack_episode(traj, _encode, filler_id=2)
    assert (row.prompt_ids, row.completion_ids, row.env_mask, row.logprobs) == ([2], [2], [0], [0.0])


def test_cut_completion_tells_a_stop_string_from_the_padding_after_it() -> None:
    vocab = {1: "<action>", 3: "go", 4: "</act", 5: "ion>", 6: "x", 2: "<eos>"}

    def decode(ids: list[int]) -> str:
        return "".join(vocab[i] for i in ids)

    stops = ("</action>",)
    # stopped by the closing tag; generate padded the row with pad == eos (2) afterwards
    assert bvt.cut_completion([1, 3, 4, 5, 2, 2], {2}, decode, stops) == ([1, 3, 4, 5], "stop")
    # the model ended its turn: the end-of-sequence token is kept (it is a sampled token)
    assert bvt.cut_completion([1, 3, 2, 2], {2}, decode, stops) == ([1, 3, 2], "eos")
    # the budget ran out
    assert bvt.cut_completion([1, 6, 6], {2}, decode, stops) == ([1, 6, 6], "length")


def _step(side: str, seconds: float) -> dict:
    return {"seed": 1, "step": 1, "side": side, "seconds_step": seconds, "seconds_rollout": seconds / 4,
            "seconds_update": 3 * seconds / 4, "peak_rss_gb": 3.0, "success": 0.5, "episodes": 8, "rows": 40,
            "gen_tokens": 500, "train_tokens": 10_000, "padded_tokens": 12_000, "turns": 40}


def _eval(won: int, episodes: int = 32) -> dict:
    return {"success": won / episodes, "won": won, "episodes": episodes, "ci": [0.0, 1.0]}


def test_verdict_gives_the_success_difference_with_its_interval() -> None:
    """3.6x faster, one pool episode behind: the goal is not met on the point estimates, and the report says
    that one episode of 32 is within the noise rather than leaving a bare NOT MET."""
    run = bvt.SeedRun(rows=[_step("ours", 100.0), _step("trl", 360.0)], setup={},
                      after={"ours": _eval(17), "trl": _eval(18)})
    summary = bvt.summarize([run], _eval(18))
    low, high = summary["success_difference"]["ci"]
    assert summary["speedup_step"] == 3.6 and summary["goal_met"] is False
    assert low < summary["success_difference"]["ours_minus_trl"] < 0 < high
    text = bvt.verdict(summary)
    assert "NOT MET" in text and "-3.1 points" in text and "within the noise" in text
    run.after["ours"] = _eval(30)
    assert "a real difference" in bvt.verdict(bvt.summarize([run], _eval(18)))


def _report(tmp_path: Path, seed: int, *, steps: int = 2, before_won: int = 18) -> Path:
    rows = [_step("ours", 100.0) | {"seed": seed, "optimizer_steps": 3, "weights_moved": 1e-4},
            _step("trl", 360.0) | {"seed": seed, "optimizer_steps": 1, "weights_moved": 1e-4}]
    report = {"settings": {"steps": steps, "threads": 1, "pool_rollouts": 2, "model": "m", "seeds": [seed]},
              "versions": {"trl": "1.16.0"}, "setup": {"ours": {}, "trl": {}}, "steps": rows,
              "pool": {"before": _eval(before_won) | {"seconds": 200.0 + seed}, "after": {str(seed): {"ours": _eval(17), "trl": _eval(18)}}}}
    path = tmp_path / f"seed{seed}.json"
    path.write_text(json.dumps(report))
    return path


def test_merge_pools_the_seeds_of_separate_runs_and_refuses_other_settings(tmp_path: Path) -> None:
    runs, before, settings, _ = bvt.load_reports([_report(tmp_path, 1), _report(tmp_path, 2)])
    assert settings["seeds"] == [1, 2] and before["won"] == 18  # the wall times differ, the episodes do not
    report = bvt.write_report(runs, before, settings, {}, tmp_path / "merged", bvt.Console(file=io.StringIO()))
    assert report["summary"]["ours"]["pool_after"]["episodes"] == 64  # 32 per seed, two seeds
    assert (tmp_path / "merged.json").is_file() and (tmp_path / "merged.png").is_file()
    with pytest.raises(SystemExit, match="steps"):
        bvt.load_reports([_report(tmp_path, 1), _report(tmp_path, 3, steps=1)])
    with pytest.raises(SystemExit, match="pool.before"):
        bvt.load_reports([_report(tmp_path, 1), _report(tmp_path, 4, before_won=10)])
    with pytest.raises(SystemExit, match="seed 1"):
        bvt.load_reports([_report(tmp_path, 1), _report(tmp_path, 1)])
