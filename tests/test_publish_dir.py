"""`files.publish_dir`: a folder built beside its target appears whole or not at all, and what dead writers
left behind (of every kind: builds, folders moved aside, atomic file writes) is removed the same way."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agentgym_opsd import files
from agentgym_opsd.files import make_tmp_dir, publish_dir, remove_dead_tmp_dirs


def _build(target: Path, text: str) -> Path:
    tmp = make_tmp_dir(target)
    (tmp / "data.txt").write_text(text)
    return tmp


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_publish_puts_the_folder_in_place_and_replaces_an_old_one(tmp_path: Path) -> None:
    target = tmp_path / "out"
    assert publish_dir(_build(target, "one"), target)
    assert publish_dir(_build(target, "two"), target)
    assert (target / "data.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # neither the build nor the old folder stays


def test_keep_leaves_a_good_folder_and_discards_the_new_build(tmp_path: Path) -> None:
    target = tmp_path / "out"
    publish_dir(_build(target, "first"), target)
    assert not publish_dir(_build(target, "second"), target, keep=lambda there: (there / "data.txt").is_file())
    assert (target / "data.txt").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_rename_leaves_the_old_folder_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out"
    publish_dir(_build(target, "old"), target)
    tmp = _build(target, "new")
    real_rename = os.rename

    def into_place_fails(src: os.PathLike[str], dst: os.PathLike[str]) -> None:
        if Path(src) == tmp:
            raise OSError("disk trouble")
        real_rename(src, dst)

    monkeypatch.setattr(files.os, "rename", into_place_fails)
    with pytest.raises(OSError, match="disk trouble"):
        publish_dir(tmp, target)
    monkeypatch.undo()
    assert (target / "data.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_dead_writers_leftovers_of_every_kind_are_removed_live_ones_stay(tmp_path: Path) -> None:
    dead, live = _dead_pid(), os.getpid()
    build = tmp_path / f".other.{dead}.0123abcd.tmp"  # a build of another target, killed mid-way
    build.mkdir()
    aside = tmp_path / f".out.{dead}.89abcdef.tmp"  # an old folder moved aside, killed before it was deleted
    (aside / "sub").mkdir(parents=True)
    written = tmp_path / f".log.txt.{dead}.deadbeef.tmp"  # an atomic file write, killed mid-write
    written.write_text("half")
    running = tmp_path / f".out.{live}.cafecafe.tmp"
    running.mkdir()
    foreign = tmp_path / ".not-ours.tmp"
    foreign.mkdir()
    tmp = make_tmp_dir(tmp_path / "out")
    assert not build.exists() and not aside.exists() and not written.exists()
    assert running.exists() and foreign.exists() and tmp.exists()
    assert remove_dead_tmp_dirs(tmp_path / "out") == []
