from __future__ import annotations

import pytest
from conftest import SMALL_SKILLS

from agentgym_opsd.skills import SkillLibrary, SkillLibraryError


def test_context_for_task_type_keyword_and_general():
    lib = SkillLibrary.from_folder(SMALL_SKILLS)
    assert lib.name == "toy"
    up = lib.context_for(task_type="up", text="make the counter show 3")
    assert up.startswith("Count carefully") and "Odd targets" in up
    even = lib.context_for(task_type="even", text="make the counter show 4")
    assert "Even targets" in even
    assert lib.context_for(task_type="other", text="nothing") == lib.general


@pytest.mark.parametrize(
    ("files", "error"),
    [
        ({}, "missing skills.yaml"),
        ({"skills.yaml": "name: [unclosed"}, "invalid YAML"),
        ({"skills.yaml": "general: general.md\nbogus: 1\n", "general.md": "x"}, "unknown keys"),
        ({"skills.yaml": "general: nope.md\n"}, "does not exist"),
        ({"skills.yaml": "general: g.md\n", "g.md": "  "}, "empty skill file"),
        ({"skills.yaml": "general: ../g.md\n"}, "outside the library"),
        ({"skills.yaml": "keywords:\n  - {pattern: '(', file: general.md}\n", "general.md": "x"}, "not a regex"),
        ({"skills.yaml": "task_types: [a]\n", "general.md": "x"}, "task_types must map"),
    ],
)
def test_validation_errors_are_clear(tmp_path, files, error):
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    with pytest.raises(SkillLibraryError, match=error):
        SkillLibrary.from_folder(tmp_path)
