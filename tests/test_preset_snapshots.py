"""Every preset resolves to the config committed in tests/data/preset_snapshots.json.

Presets inherit (`base:`), so an edit to one preset changes every preset built on it; this test makes such a change
visible. When a change is deliberate (a new setting, a new default, a preset retuned), write the snapshot anew and
commit it with the change:

    python tests/test_preset_snapshots.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym_opsd.trainer.config import available_presets, load_config

SNAPSHOTS = Path(__file__).parent / "data" / "preset_snapshots.json"


def resolved(name: str) -> dict:
    """The preset's resolved config as JSON reads it back (lists, not tuples)."""
    return json.loads(json.dumps(load_config(name).to_dict()))


def _differences(expected: dict, actual: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(expected) | set(actual)):
        want, got = expected.get(key, "<absent>"), actual.get(key, "<absent>")
        if isinstance(want, dict) and isinstance(got, dict):
            out += _differences(want, got, f"{prefix}{key}.")
        elif want != got:
            out.append(f"{prefix}{key}: snapshot {want!r}, now {got!r}")
    return out


def test_the_snapshot_lists_every_preset() -> None:
    assert sorted(json.loads(SNAPSHOTS.read_text(encoding="utf-8"))) == available_presets(), \
        "a preset was added or removed: write the snapshot anew (python tests/test_preset_snapshots.py)"


@pytest.mark.parametrize("name", available_presets())
def test_a_preset_resolves_to_its_snapshot(name: str) -> None:
    snapshot = json.loads(SNAPSHOTS.read_text(encoding="utf-8"))
    assert name in snapshot, f"preset {name} has no snapshot: python tests/test_preset_snapshots.py"
    changed = _differences(snapshot[name], resolved(name))
    assert not changed, (f"preset {name} no longer resolves to its snapshot:\n  " + "\n  ".join(changed) +
                         "\nif this is deliberate, write the snapshot anew: python tests/test_preset_snapshots.py")


if __name__ == "__main__":
    SNAPSHOTS.write_text(json.dumps({name: resolved(name) for name in available_presets()}, indent=1,
                                    sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {SNAPSHOTS}")
