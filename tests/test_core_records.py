from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_opsd.records import Trajectory, Turn, append_jsonl, load_jsonl, save_jsonl

text = st.text(max_size=40)
turns = st.builds(
    Turn,
    index=st.integers(0, 50),
    prompt=st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user"]), "content": text}), max_size=2),
    response_text=text,
    action=text,
    action_valid=st.booleans(),
    observation=text,
    reward=st.floats(-10, 10, allow_nan=False),
    response_token_ids=st.lists(st.integers(0, 50_000), max_size=8),
    response_logprobs=st.lists(st.floats(-50, 0, allow_nan=False), max_size=8),
    invalid_reason=st.none() | text,
    info=st.dictionaries(st.sampled_from(["score", "won"]), st.booleans()),
)
trajectories = st.builds(
    Trajectory,
    env_id=text, task_id=text, task_type=text, group_id=st.integers(0, 99), traj_id=st.integers(0, 999),
    seed=st.integers(0, 2**31), task_text=text, skill_context=text, turns=st.lists(turns, max_size=3),
    won=st.booleans(), score=st.floats(0, 1), total_reward=st.floats(-5, 5), error=st.none() | text,
    metadata=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=2),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(trajectories, max_size=4))
def test_jsonl_roundtrip_is_lossless(tmp_path_factory, trajs):
    path = tmp_path_factory.mktemp("rt") / "t.jsonl"
    save_jsonl(trajs, path)
    assert load_jsonl(path) == trajs


def test_append_and_counts(tmp_path):
    t = Trajectory("e", "t", "k", 0, 0, 1, turns=[Turn(0, [], "x", "", False, "o", 0.0)])
    append_jsonl([t], tmp_path / "a.jsonl")
    append_jsonl([t], tmp_path / "a.jsonl")
    loaded = load_jsonl(tmp_path / "a.jsonl")
    assert loaded == [t, t]
    assert loaded[0].num_turns == 1 and loaded[0].num_invalid_actions == 1


def test_bad_line_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"env_id": "e"}\nnot json\n')
    import pytest

    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_jsonl(p)


@pytest.mark.parametrize(("field_name", "value"), [
    ("traj_id", '7"><img src=x onerror="document.title=\'PWN\'">'), ("won", "yes"), ("group_id", 1.5),
    ("score", "1"), ("traj_id", True), ("task_id", 3), ("error", 5), ("metadata", []),
])
def test_a_record_with_a_wrong_type_is_refused_with_file_and_line(tmp_path, field_name, value) -> None:
    import json

    from agentgym_opsd.records import Trajectory, load_jsonl

    good = Trajectory(env_id="e", task_id="t", task_type="", group_id=0, traj_id=0, seed=0).to_dict()
    bad = {**good, field_name: value}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=rf"t.jsonl:2: not a trajectory record .*{field_name}"):
        load_jsonl(path)


def test_a_turn_with_a_wrong_type_is_refused() -> None:
    from agentgym_opsd.records import Trajectory

    good = Trajectory(env_id="e", task_id="t", task_type="", group_id=0, traj_id=0, seed=0).to_dict()
    turn = {"index": "0<script>", "prompt": [], "response_text": "", "action": "", "action_valid": True,
            "observation": "", "reward": 0.0}
    with pytest.raises(TypeError, match="turn 0 field 'index'"):
        Trajectory.from_dict({**good, "turns": [turn]})
    assert Trajectory.from_dict({**good, "turns": [{**turn, "index": 0}]}).turns[0].index == 0
