"""A new run never silently replaces an earlier run in the same folder: it is refused with a message naming
`--resume auto` and `trainer.overwrite=true`, nothing is touched; with `trainer.overwrite=true` the old run is
deleted first, so none of its files are mixed into the new one."""

from __future__ import annotations

import hashlib
from pathlib import Path

from agentgym_opsd.trainer.cli import main

TOY = ["--config", "cpu-tiny", "env.id=ToyCounter-v0", "trainer.total_steps=1", "trainer.tensorboard=false",
       "trainer.backend=torch"]


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_rerun_into_a_run_folder_is_refused_and_loses_nothing(tmp_path, toy_env_ids, capsys) -> None:
    out = tmp_path / "R"
    assert main([*TOY, f"trainer.output_dir={out}"]) == 0
    before = snapshot(out)
    assert "config.yaml" in before and any(k.startswith("checkpoints/") for k in before)
    capsys.readouterr()

    code = main([*TOY, f"trainer.output_dir={out}", "algorithm.estimator=grpo", "optim.lr=5e-4"])
    err = capsys.readouterr().err
    assert code == 2
    assert "already holds a training run" in err and "--resume auto" in err and "trainer.overwrite=true" in err
    assert snapshot(out) == before  # not a byte changed, nothing renamed

    # continuing it is still possible
    assert main([*TOY, f"trainer.output_dir={out}", "trainer.total_steps=2", "--resume", "auto"]) == 0
    assert (out / "checkpoints" / "step_000002").is_dir()


def test_overwrite_true_replaces_the_old_run_entirely(tmp_path, toy_env_ids) -> None:
    out = tmp_path / "R"
    assert main([*TOY, f"trainer.output_dir={out}"]) == 0
    (out / "notes-from-the-old-run.txt").write_text("old")
    assert main([*TOY, f"trainer.output_dir={out}", "algorithm.estimator=grpo", "trainer.overwrite=true"]) == 0
    assert "estimator: grpo" in (out / "config.yaml").read_text()
    assert not (out / "notes-from-the-old-run.txt").exists()
    assert not list(out.glob("metrics.*.jsonl"))  # no old metrics set aside: the old run is gone, as asked
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_a_new_folder_and_an_empty_one_need_no_flag(tmp_path, toy_env_ids) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / ".gitkeep").write_text("")
    assert main([*TOY, f"trainer.output_dir={empty}"]) == 0
    assert main([*TOY, f"trainer.output_dir={tmp_path / 'new'}"]) == 0


def test_the_validation_before_rl_is_computed_once_per_cached_warm_start(tmp_path, toy_env_ids, monkeypatch) -> None:
    """Two runs from one cached warm start with the same evaluation settings (another RL seed) play the same
    step-0 episodes: the second reuses the first's numbers; another evaluation setting computes its own."""
    import json

    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path / "cache"))
    base = [*TOY, "warm_start.steps=2", "warm_start.episodes=4", "warm_start.seed=0", "trainer.eval_at_start=true",
            "trainer.eval_episodes=4", "trainer.total_steps=1"]

    def step0(out: Path) -> dict:
        return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])

    assert main([*base, f"trainer.output_dir={tmp_path / 'a'}"]) == 0
    assert main([*base, f"trainer.output_dir={tmp_path / 'b'}", "trainer.seed=3", "optim.lr=1e-3"]) == 0
    assert main([*base, f"trainer.output_dir={tmp_path / 'c'}", "trainer.eval_temperature=0.9"]) == 0
    a, b, c = step0(tmp_path / "a"), step0(tmp_path / "b"), step0(tmp_path / "c")
    assert "val/from_cache" not in a and b["val/from_cache"] == 1.0 and "val/from_cache" not in c
    def numbers(line: dict) -> dict:
        return {k: v for k, v in line.items() if k.startswith(("val/", "pool/")) and k != "val/from_cache"}

    assert numbers(b) == numbers(a) and numbers(a)
    entries = list((tmp_path / "cache" / "warm_start").glob("*/start_evaluations/*.json"))
    assert len(entries) == 2
