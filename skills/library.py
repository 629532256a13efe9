"""Skill libraries: the privileged context `c+` the self-teacher reads (`SkillLibrary.from_folder`).

A library is a folder with `skills.yaml`, `general.md` (rules for every task) and one Markdown file per task kind;
`skills.yaml` maps task types and keyword patterns to those files, which must lie inside the folder::

    general: general.md
    task_types: {pick_heat_then_place_in_recep: heat.md}    # exact task type -> file
    keywords: [{pattern: "microwave", file: heat.md}]        # first regex found in the task text (any case) -> file

`context_for(task_type=..., text=...)` returns the general rules followed by the rules of the task kind: the file
mapped to the task type if there is one, else the first keyword rule that matches the task text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["SkillLibrary", "SkillLibraryError", "MAPPING_FILE"]

MAPPING_FILE = "skills.yaml"
_ALLOWED_KEYS = {"name", "description", "general", "task_types", "keywords"}


class SkillLibraryError(ValueError):
    """A skill library folder that cannot be used, with the file and the reason."""


@dataclass(frozen=True)
class KeywordRule:
    pattern: re.Pattern[str]
    text: str


@dataclass(frozen=True)
class SkillLibrary:
    name: str
    general: str
    by_task_type: dict[str, str] = field(default_factory=dict)
    keyword_rules: tuple[KeywordRule, ...] = ()
    root: Path | None = None

    @classmethod
    def from_folder(cls, folder: str | Path) -> SkillLibrary:
        root = Path(folder)
        mapping_path = root / MAPPING_FILE
        if not mapping_path.is_file():
            raise SkillLibraryError(f"{root}: not a skill library (missing {MAPPING_FILE})")
        try:
            mapping = yaml.safe_load(mapping_path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise SkillLibraryError(f"{mapping_path}: invalid YAML ({exc})") from exc
        if not isinstance(mapping, dict):
            raise SkillLibraryError(f"{mapping_path}: expected a mapping at the top level")
        unknown = set(mapping) - _ALLOWED_KEYS
        if unknown:
            raise SkillLibraryError(f"{mapping_path}: unknown keys {sorted(unknown)}; allowed {sorted(_ALLOWED_KEYS)}")

        def read(rel: Any, where: str) -> str:
            if not isinstance(rel, str) or not rel:
                raise SkillLibraryError(f"{mapping_path}: {where} must be a file name, got {rel!r}")
            path = (root / rel).resolve()
            if root.resolve() not in path.parents:
                raise SkillLibraryError(f"{mapping_path}: {where} points outside the library: {rel!r}")
            if not path.is_file():
                raise SkillLibraryError(f"{mapping_path}: {where} names {rel!r}, which does not exist")
            text = path.read_text(encoding="utf-8").strip()
            if not text:
                raise SkillLibraryError(f"{path}: empty skill file")
            return text

        general = read(mapping.get("general", "general.md"), "general")
        task_types = mapping.get("task_types") or {}
        if not isinstance(task_types, dict):
            raise SkillLibraryError(f"{mapping_path}: task_types must map task type -> file")
        by_task_type = {str(k): read(v, f"task_types.{k}") for k, v in task_types.items()}
        keywords = mapping.get("keywords") or []
        if not isinstance(keywords, list):
            raise SkillLibraryError(f"{mapping_path}: keywords must be a list of {{pattern, file}}")
        rules = []
        for i, rule in enumerate(keywords):
            if not isinstance(rule, dict) or set(rule) != {"pattern", "file"}:
                raise SkillLibraryError(f"{mapping_path}: keywords[{i}] must have exactly 'pattern' and 'file'")
            try:
                pattern = re.compile(str(rule["pattern"]), re.IGNORECASE)
            except re.error as exc:
                raise SkillLibraryError(f"{mapping_path}: keywords[{i}].pattern is not a regex ({exc})") from exc
            rules.append(KeywordRule(pattern, read(rule["file"], f"keywords[{i}].file")))
        name = str(mapping.get("name") or root.name)
        return cls(name=name, general=general, by_task_type=by_task_type, keyword_rules=tuple(rules), root=root)

    def specific_for(self, *, task_type: str = "", text: str = "") -> str:
        """The task-kind rules alone ("" when no rule matches)."""
        if task_type in self.by_task_type:
            return self.by_task_type[task_type]
        for rule in self.keyword_rules:
            if rule.pattern.search(text or ""):
                return rule.text
        return ""

    def context_for(self, *, task_type: str = "", text: str = "") -> str:
        """`c+` for one task: general rules, then the rules of its kind."""
        specific = self.specific_for(task_type=task_type, text=text)
        return self.general if not specific else f"{self.general}\n\n{specific}"

    @property
    def task_types(self) -> list[str]:
        return sorted(self.by_task_type)
