"""A new run never silently replaces an earlier run in the same folder: it is refused with a message naming
`--resume auto` and `trainer.overwrite=true`, nothing is touched; with `trainer.overwrite=true` the old run is
deleted first, so none of its files are mixed into the new one."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from agentgym_opsd.trainer.checkpoint import is_run_entry
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
    (out / ".checkpoints.123.0badc0de.tmp").mkdir()  # a save killed mid-write
    assert main([*TOY, f"trainer.output_dir={out}", "algorithm.estimator=grpo", "trainer.overwrite=true"]) == 0
    assert "estimator: grpo" in (out / "config.yaml").read_text()
    assert not (out / ".checkpoints.123.0badc0de.tmp").exists()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_overwrite_true_keeps_what_is_not_the_runs(tmp_path, toy_env_ids, caplog) -> None:
    """Issue 45, hole 1, and issue 67 item 2: a user's files beside the run survive `trainer.overwrite=true` (also
    those whose names look like a run's: metrics.2024.jsonl, metrics.backup.jsonl, a metrics log set aside by
    hand), and the log names them."""
    out = tmp_path / "R"
    assert main([*TOY, f"trainer.output_dir={out}"]) == 0
    (out / "notes.txt").write_text("my notes")
    (out / "mydata").mkdir()
    (out / "mydata" / "a.csv").write_text("x,y\n1,2\n")
    (out / ".gitkeep").write_text("")
    for name in ("metrics.2024.jsonl", "metrics.backup.jsonl", "metrics.20200101-000000.jsonl"):
        (out / name).write_text("{}\n")
    with caplog.at_level("WARNING", logger="agentgym_opsd.trainer.checkpoint"):
        assert main([*TOY, f"trainer.output_dir={out}", "algorithm.estimator=grpo", "trainer.overwrite=true"]) == 0
    assert (out / "notes.txt").read_text() == "my notes"
    assert (out / "mydata" / "a.csv").read_text() == "x,y\n1,2\n"
    assert (out / ".gitkeep").is_file()
    assert all((out / name).read_text() == "{}\n" for name in ("metrics.2024.jsonl", "metrics.backup.jsonl",
                                                                "metrics.20200101-000000.jsonl"))
    assert "estimator: grpo" in (out / "config.yaml").read_text()
    kept = [r.getMessage() for r in caplog.records if "kept what it did not write" in r.getMessage()]
    assert kept and ".gitkeep, metrics.20200101-000000.jsonl, metrics.2024.jsonl, metrics.backup.jsonl, mydata, " \
                    "notes.txt" in kept[0]


def test_every_entry_a_run_writes_is_one_overwrite_deletes(tmp_path, toy_env_ids) -> None:
    """`RUN_ENTRIES` is the one list of a run's names: a writer that adds a top-level entry without adding it
    there would have it survive an overwrite (and be mixed into the next run)."""
    out = tmp_path / "R"
    assert main([*TOY, f"trainer.output_dir={out}", "trainer.tensorboard=true", "trainer.eval_every=1",
                 "trainer.eval_episodes=2"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert {"config.yaml", "metrics.jsonl", "checkpoints", "trajectories", "tensorboard"} <= set(names)
    assert [n for n in names if not is_run_entry(n)] == []


@pytest.mark.parametrize(("name", "ours"), [
    ("config.yaml", True), ("metrics.20240101-120000.jsonl", True), (".config.yaml.4242.deadbeef.tmp", True),
    ("metrics.2024.jsonl", False), ("metrics.backup.jsonl", False),
    (".warm_start.7.0123abcd.tmp", True), ("notes.txt", False), ("mydata", False), (".gitkeep", False),
    (".notes.txt.4242.deadbeef.tmp", False), ("Config.yaml", False), ("checkpoints-backup", False),
])
def test_is_run_entry(name: str, ours: bool) -> None:
    assert is_run_entry(name) is ours


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
    # the reused validation brings its held-out episodes along, so run b pairs its after-episodes with them
    kept = [(tmp_path / run / "validation" / "step_000000.jsonl").read_text() for run in "abc"]
    assert kept[0] == kept[1] and kept[0].count("\n") == 4


def test_the_start_evaluation_key_leaves_out_the_warm_start_seed() -> None:
    """The seed picks the warm start, whose cache entry holds the evaluation: the README's run (warm_start.seed -1,
    trainer.seed 0) and a study's RL seed from the same warm start (warm_start.seed=0, trainer.seed=1) share it."""
    from agentgym_opsd.trainer.config import load_config
    from agentgym_opsd.trainer.validation import start_evaluation_key

    def key(*overrides: str) -> str:
        return start_evaluation_key(load_config("cpu-tiny", list(overrides)), threads=1, world_size=1)

    assert key() == key("warm_start.seed=0", "trainer.seed=1") == key("warm_start.seed=0")
    assert key() != key("trainer.eval_temperature=0.9")
