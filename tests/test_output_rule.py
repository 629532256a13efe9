"""One output rule for every command (issue 67, items 2 and 3): a command writes into a new folder, an empty one or
its own (its owner record says so); a folder or file holding someone else's work is refused, naming it, unless
`--force`; a non-regular file is never replaced; `trainer.overwrite=true` deletes only what the run wrote."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from agentgym_opsd.outputs import OWNER_FILE, OutputRefused, check_output_file, claim_folder, owner_of
from agentgym_opsd.trainer.cli import main as train

TOY = ["--config", "cpu-tiny", "env.id=ToyCounter-v0", "trainer.total_steps=1", "trainer.tensorboard=false",
       "trainer.backend=torch"]


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def users_folder(tmp_path: Path) -> Path:
    """The issue's folder: a user's config.yaml and validation/gold.csv, no run."""
    folder = tmp_path / "mine"
    (folder / "validation").mkdir(parents=True)
    (folder / "config.yaml").write_text("lr: 3\n")
    (folder / "validation" / "gold.csv").write_text("a,b\n")
    return folder


def test_a_lone_config_yaml_is_not_a_run(tmp_path, toy_env_ids, capsys) -> None:
    folder = users_folder(tmp_path)
    before = snapshot(folder)
    for extra in (["--resume", "auto"], [], ["trainer.overwrite=true"]):
        assert train([*TOY, f"trainer.output_dir={folder}", *extra]) == 2
        err = capsys.readouterr().err
        assert "not a train output" in err and "config.yaml" in err and "--force" in err
        assert snapshot(folder) == before and not (folder / OWNER_FILE).exists()


def test_force_writes_beside_a_users_files_and_overwrite_never_takes_them(tmp_path, toy_env_ids) -> None:
    folder = tmp_path / "R"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "credit").mkdir()
    (folder / "credit" / "mine.txt").write_text("mine too")
    assert train([*TOY, f"trainer.output_dir={folder}", "--force"]) == 0
    record = owner_of(folder)
    assert record is not None and record["command"] == "train"
    assert {"config.yaml", "metrics.jsonl", "checkpoints"} <= set(record["entries"])
    assert "notes.txt" not in record["entries"] and "credit" not in record["entries"]  # there before the run
    assert train([*TOY, f"trainer.output_dir={folder}", "trainer.overwrite=true"]) == 0  # its own run now: no --force
    assert (folder / "notes.txt").read_text() == "mine" and (folder / "credit" / "mine.txt").read_text() == "mine too"


def test_a_run_from_before_owner_records_is_still_a_run(tmp_path, toy_env_ids, capsys) -> None:
    out = tmp_path / "R"
    assert train([*TOY, f"trainer.output_dir={out}"]) == 0
    (out / OWNER_FILE).unlink()  # as an earlier version left it
    assert train([*TOY, f"trainer.output_dir={out}"]) == 2
    assert "already holds a training run" in capsys.readouterr().err
    assert train([*TOY, f"trainer.output_dir={out}", "trainer.total_steps=2", "--resume", "auto"]) == 0
    assert owner_of(out)["command"] == "train" and (out / "checkpoints" / "step_000002").is_dir()


def test_eval_refuses_a_users_folder_and_a_training_run(tmp_path, toy_env_ids, capsys) -> None:
    from agentgym_opsd.evaluation.cli import main as evaluate

    users = tmp_path / "report"
    users.mkdir()
    (users / "report.md").write_text("my report")
    run = tmp_path / "run"
    assert train([*TOY, f"trainer.output_dir={run}"]) == 0
    args = ["--policy", "oracle", "--env", "ToyCounter-v0", "--episodes", "1", "--no-progress"]
    for folder in (users, run):
        before = snapshot(folder)
        with pytest.raises(SystemExit) as exit_info:
            evaluate([*args, "--out", str(folder)])
        assert exit_info.value.code == 2 and snapshot(folder) == before
        err = capsys.readouterr().err
        assert "--force" in err and ("report.md" in err or "the output of `train`" in err)
    mine = tmp_path / "eval"
    assert evaluate([*args, "--out", str(mine)]) == 0
    assert evaluate([*args, "--out", str(mine)]) == 0  # its own folder: goes on
    assert owner_of(mine)["command"] == "eval" and "results.json" in owner_of(mine)["entries"]
    assert evaluate([*args, "--out", str(users), "--force"]) == 0
    assert (users / "report.md").read_text() != "my report"  # forced: a file of an evaluation's name is replaced


def test_inspect_refuses_an_existing_file_a_fifo_and_a_missing_folder(tmp_path, toy_env_ids, capsys) -> None:
    from agentgym_opsd.inspector.page import main as inspect

    run = tmp_path / "run"
    assert train([*TOY, f"trainer.output_dir={run}"]) == 0
    assert inspect([str(run)]) == 0 and inspect([str(run)]) == 0  # the run's own page, written again
    config = (run / "config.yaml").read_text()
    assert inspect([str(run), "--out", str(run / "config.yaml")]) == 2
    assert (run / "config.yaml").read_text() == config and "--force" in capsys.readouterr().err
    assert inspect([str(run), "--out", str(tmp_path / "no" / "such" / "page.html")]) == 2
    assert not (tmp_path / "no").exists()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert inspect([str(run), "--out", str(fifo), "--force"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    page = tmp_path / "page.html"
    page.write_text("old")
    assert inspect([str(run), "--out", str(page), "--force"]) == 0 and page.read_text() != "old"


def test_openenv_package_refuses_a_folder_with_someone_elses_files(tmp_path, capsys) -> None:
    from agentgym_opsd.integrations.openenv_package import main as package

    folder = tmp_path / "pkg"
    (folder / "server").mkdir(parents=True)
    for name in ("README.md", "pyproject.toml", "server/app.py"):
        (folder / name).write_text("mine")
    before = snapshot(folder)
    with pytest.raises(SystemExit):
        package(["ALFWorld-v0:easy", str(folder), "--no-lock"])
    assert snapshot(folder) == before and "README.md" in capsys.readouterr().err
    fresh = tmp_path / "fresh"
    assert package(["ALFWorld-v0:easy", str(fresh), "--no-lock"]) == 0
    assert package(["ALFWorld-v0:easy", str(fresh), "--no-lock"]) == 0  # its own: written again
    assert owner_of(fresh)["command"] == "openenv-package"
    assert package(["ALFWorld-v0:easy", str(folder), "--no-lock", "--force"]) == 0
    assert (folder / "README.md").read_text() != "mine"


def test_the_rule_itself(tmp_path) -> None:
    folder = tmp_path / "f"
    out = claim_folder(folder, "eval")  # new: made
    out.file("results.json").write_text("{}")
    assert json.loads((folder / OWNER_FILE).read_text())["entries"] == ["results.json"]
    with pytest.raises(OutputRefused, match="the output of `eval`"):
        claim_folder(folder, "train")
    os.mkfifo(folder / "report.md")
    with pytest.raises(OutputRefused, match="not a regular file"):
        claim_folder(folder, "eval", will_write=["report.md"], force=True)
    with pytest.raises(OutputRefused, match="not a regular file"):
        out.file("report.md")
    (folder / "report.md").unlink()
    (folder / "theirs.txt").write_text("x")
    again = claim_folder(folder, "eval")
    assert again.entries == {"results.json"} and "theirs.txt" in again.others
    assert again.clear() == ["theirs.txt"] and not (folder / "results.json").exists()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OutputRefused, match="not a regular file"):
        check_output_file(tmp_path / "link", force=True)
    with pytest.raises(OutputRefused, match="not a folder"):
        claim_folder(tmp_path / "link", "eval")


@pytest.mark.parametrize("made_by_the_other", ["empty", "recorded", "file"])
def test_a_folder_another_rank_makes_between_the_look_and_the_mkdir(tmp_path, monkeypatch, made_by_the_other):
    """Every rank of a run claims the output folder before the process group exists: when another rank makes it
    between this one's look and its mkdir, the folder is judged as found (new and empty, or the run's own), not an
    error that kills the rank."""
    folder = tmp_path / "run"
    real_mkdir = Path.mkdir

    def the_other_rank_first(self, *args, **kwargs):
        if self == folder and not folder.exists() and not folder.is_symlink():
            if made_by_the_other == "file":
                folder.write_text("not a folder")
            else:
                real_mkdir(folder)
                if made_by_the_other == "recorded":
                    claim_folder(folder, "train").record([])  # the writing rank's owner record
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", the_other_rank_first)
    if made_by_the_other == "file":
        with pytest.raises(OutputRefused, match="is not a folder"):
            claim_folder(folder, "train")
        return
    out = claim_folder(folder, "train")
    assert out.path == folder and out.entries == set()
    assert (owner_of(folder) is not None) == (made_by_the_other == "recorded")
