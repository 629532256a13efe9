"""Skill libraries shipped with agentgym-opsd (one folder each) and their loader."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from agentgym_opsd.skills.library import MAPPING_FILE, SkillLibrary, SkillLibraryError

__all__ = ["SkillLibrary", "SkillLibraryError", "builtin_library_folders"]


def builtin_library_folders() -> dict[str, Path]:
    """name -> folder for every library shipped inside this package (a subfolder with a skills.yaml)."""
    root = Path(str(resources.files("agentgym_opsd.skills")))
    return {p.name: p for p in sorted(root.iterdir()) if (p / MAPPING_FILE).is_file()}
