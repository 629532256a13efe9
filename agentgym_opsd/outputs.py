"""One output rule for every command that writes files (`train`, `eval`, `inspect`, `openenv-package`): it writes
into a new folder, an empty one, or one it made itself; a folder or file that holds someone else's work is refused,
naming what is there, unless the user says `--force`; and a non-regular file (a FIFO, a device, a symlink, a folder
where a file goes) is never replaced, `--force` or not.

A folder a command writes carries its owner record, `OWNER_FILE` (hidden, JSON): which command made it and the
top-level names it wrote there. That record, not a name such as `config.yaml`, is what makes a folder a training
run or an evaluation: a user's `config.yaml` alone is nobody's run. Deleting a command's earlier output
(`OutputFolder.clear`, `trainer.overwrite=true`) deletes the names recorded and nothing else, and names what it kept.
"""

from __future__ import annotations

import contextlib
import json
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agentgym_opsd.files import atomic_write_text, remove_path

__all__ = ["OWNER_FILE", "OutputFolder", "OutputRefused", "check_output_file", "claim_folder", "owner_of",
           "refuse_non_regular"]

OWNER_FILE = ".agentgym-opsd.json"
"""The owner record of a folder a command wrote: {"command": ..., "entries": [top-level names it wrote]}."""


class OutputRefused(ValueError):
    """An output path that holds someone else's work (or a non-regular file); the message names it and the way on."""


def owner_of(folder: Path) -> dict | None:
    """The owner record of `folder`, or None when it has none (or an unreadable one: then it is nobody's)."""
    path = folder / OWNER_FILE
    if not path.is_file() or path.is_symlink():
        return None
    with contextlib.suppress(OSError, ValueError):
        record = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(record, dict) and isinstance(record.get("command"), str) and \
                isinstance(record.get("entries"), list) and all(isinstance(e, str) for e in record["entries"]):
            return record
    return None


def refuse_non_regular(path: Path, *, folder_ok: bool = False) -> None:
    """OutputRefused when an entry is at `path` that is not a regular file (a FIFO, a device, a symlink; a folder
    unless `folder_ok`): such an entry is never replaced. lstat: the entry itself, not what a link points to."""
    if not (path.is_symlink() or path.exists()):
        return
    mode = path.lstat().st_mode
    if not (stat.S_ISREG(mode) or (folder_ok and stat.S_ISDIR(mode))):
        raise OutputRefused(f"{path} is not a regular file; it is never replaced: move it away or choose another path")


def _shown(names: Iterable[str], limit: int = 6) -> str:
    names = sorted(names)
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


@dataclass
class OutputFolder:
    """A folder a command may write into (`claim_folder`): its path, the command, the top-level names the command
    wrote there (`entries`, kept in the owner record) and the names that were there before and are not its own."""

    path: Path
    command: str
    entries: set[str] = field(default_factory=set)
    others: frozenset[str] = frozenset()

    def record(self, names: Iterable[str]) -> None:
        """Add `names` (top-level entries this command wrote) to the owner record."""
        new = set(names) - self.entries - {OWNER_FILE}
        if new or not (self.path / OWNER_FILE).is_file():
            self.entries |= new
            atomic_write_text(self.path / OWNER_FILE, json.dumps(
                {"command": self.command, "entries": sorted(self.entries)}, indent=1) + "\n")

    def record_written(self, is_ours: Callable[[str], bool] = lambda name: True) -> None:
        """Record every top-level name present now that was not there at the claim and that `is_ours` accepts (the
        command's own names): what this command wrote, for writers that do not record their files themselves."""
        present = {p.name for p in self.path.iterdir()} if self.path.is_dir() else set()
        self.record(name for name in present - self.others if is_ours(name) and name != OWNER_FILE)

    def file(self, name: str) -> Path:
        """The path of top-level file `name`, recorded as this command's; OutputRefused when a non-regular file is
        there (it is never replaced)."""
        path = self.path / name
        refuse_non_regular(path)
        self.record([name])
        return path

    def clear(self) -> list[str]:
        """Delete what this command wrote here before (the recorded entries); return the names kept (not its own)."""
        for name in sorted(self.entries):
            entry = self.path / name
            if entry.is_symlink() or entry.exists():
                remove_path(entry)
        self.entries = set()
        self.record([])
        return sorted(p.name for p in self.path.iterdir() if p.name != OWNER_FILE)


def claim_folder(folder: str | Path, command: str, *, force: bool = False, flag: str = "--force",
                 legacy: Callable[[Path], bool] | None = None, is_own: Callable[[str], bool] = lambda name: True,
                 will_write: Iterable[str] = ()) -> OutputFolder:
    """The folder `command` may write its output into: new (created), empty (hidden files aside), or `command`'s
    own (its owner record says so; `legacy(folder)` recognises one written before owner records, whose names that
    `is_own` accepts are then the command's). Anything else (another command's output, a user's files) is refused,
    naming what is there and `flag`, unless `force`; then the names already there are not the command's and are
    kept. A non-regular entry where the command writes one of `will_write` is refused whatever `force` says. The
    owner record is written by `OutputFolder.record` (the first write), so a refused claim writes nothing."""
    path = Path(folder).expanduser()
    if not path.exists() and not path.is_symlink():
        try:
            path.mkdir(parents=True)
            return OutputFolder(path, command)
        except FileExistsError:  # made between the look and the mkdir (another rank of the run): judged as found
            pass
    if path.is_symlink() or not path.is_dir():
        raise OutputRefused(f"{path} is not a folder; choose a new or empty folder for the {command} output")
    record = owner_of(path)
    names = {p.name for p in path.iterdir()} - {OWNER_FILE}
    visible = {n for n in names if not n.startswith(".")}
    for name in will_write:
        refuse_non_regular(path / name, folder_ok=True)
    if record is not None and record["command"] == command:
        entries = set(record["entries"]) & names
        return OutputFolder(path, command, entries, frozenset(names - entries))
    if record is None and legacy is not None and legacy(path):  # an earlier output of ours
        entries = {name for name in names if is_own(name)}
        return OutputFolder(path, command, entries, frozenset(names - entries))
    if not visible and record is None:
        return OutputFolder(path, command, set(), frozenset(names))
    if not force:
        what = f"the output of `{record['command']}`" if record is not None else f"files that are not a {command} output"
        raise OutputRefused(f"{path} holds {what} ({_shown(visible or names)}); choose a new or empty folder, or pass "
                            f"{flag} to write there anyway (what is there is kept unless the {command} output "
                            f"replaces a file of the same name)")
    return OutputFolder(path, command, set(), frozenset(names))


def check_output_file(path: str | Path, *, force: bool = False, flag: str = "--force", own: bool = False) -> Path:
    """The file a command may write: its folder must exist (a command does not create folders anywhere a typo
    points); a file already there is refused (naming `flag`) unless `force` or `own` (the command's own earlier
    output); a non-regular entry there is refused always."""
    target = Path(path).expanduser()
    if not target.parent.is_dir():
        raise OutputRefused(f"{target}: its folder {target.parent} does not exist; create it first")
    refuse_non_regular(target)
    if target.exists():
        if not (force or own):
            raise OutputRefused(f"{target} exists; choose a new path, or pass {flag} to replace it")
    return target
