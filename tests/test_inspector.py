"""The credit inspector: files the trainer writes → one static HTML page, checked in headless Chromium."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from agentgym_opsd import credit
from agentgym_opsd.inspector import load_step, main, render_html
from agentgym_opsd.records import Trajectory, Turn, save_jsonl
from agentgym_opsd.trainer.credit_file import credit_lines, write_jsonl_atomic
from agentgym_opsd.trainer.turn_batch import (
    BatchAdvantages,
    PolicyLogProbs,
    StepRecord,
    TeacherEvidence,
    build_turn_batch,
)
from agentgym_opsd.turns import ORACLE_AFTER, ORACLE_BEFORE

TESTS = Path(__file__).parent
HOSTILE = '<script>document.title="pwned"</script><img src=x onerror="document.title=\'pwned\'">'


def _turn(index: int, response: str, action: str, observation: str, *, valid: bool = True, reward: float = 0.0,
          oracle: int | None = None, prompt: str = "") -> Turn:
    tokens = response.split(" ")
    info: dict = {} if oracle is None else {ORACLE_AFTER: oracle}  # as the rollout records it
    if not valid:
        info["invalid_kind"] = "not_admissible"
    return Turn(index=index, prompt=[{"role": "system", "content": "You are an agent."},
                                     {"role": "user", "content": prompt or f"observation before turn {index}"}],
                response_text=response, action=action, action_valid=valid, observation=observation, reward=reward,
                response_token_ids=list(range(10, 10 + len(tokens))), response_logprobs=[-0.5] * len(tokens),
                invalid_reason=None if valid else "the environment refused the action", info=info)


def make_run(run_dir: Path, estimator: str = "agentopsd-token") -> dict:
    """A hand-built step 1 (ALFWorld-like text, one hostile response), written by the trainer's own writers."""
    start = "You are in the middle of a room. Looking around, you see a cabinet 1, a countertop 1 and a fridge 1."
    trajs = [
        Trajectory(env_id="ALFWorld-v0", task_id="pick-apple", task_type="pick", group_id=0, traj_id=0, seed=3,
                   task_text="put a clean apple in the fridge", won=True, total_reward=1.0, turns=[
                       _turn(0, "<think>apples are on countertops</think> <action>go to countertop 1</action>",
                             "go to countertop 1", "On the countertop 1, you see an apple 1.", oracle=3, prompt=start),
                       _turn(1, "<action>take apple 1 from countertop 1</action>", "take apple 1 from countertop 1",
                             "You pick up the apple 1.", oracle=2),
                       _turn(2, "<action>go to fridge 1</action>", "go to fridge 1", "You put the apple 1 in it.",
                             reward=1.0, oracle=0)]),
        Trajectory(env_id="ALFWorld-v0", task_id="pick-apple", task_type="pick", group_id=0, traj_id=1, seed=3,
                   task_text="put a clean apple in the fridge", turns=[
                       _turn(0, "<action>go to cabinet 1</action>", "go to cabinet 1", "The cabinet 1 is closed.",
                             oracle=3, prompt=start),
                       _turn(1, HOSTILE, "", "Nothing happens.", valid=False, oracle=4)]),
        Trajectory(env_id="ALFWorld-v0", task_id="look-lamp", task_type="look", group_id=1, traj_id=2, seed=4,
                   task_text="look at the book under the lamp", won=True, total_reward=1.0, turns=[
                       _turn(0, "<action>use desklamp 1</action>", "use desklamp 1", "You turn on the desklamp 1.",
                             reward=1.0)]),
        Trajectory(env_id="ALFWorld-v0", task_id="look-lamp", task_type="look", group_id=1, traj_id=3, seed=4,
                   task_text="look at the book under the lamp", turns=[
                       _turn(0, "<action>inventory</action>", "inventory", "You are not carrying anything.")]),
    ]
    batch = build_turn_batch(trajs, encode_prompt=lambda m: [1, 2, 3], invalid_penalty=0.1)
    g = torch.Generator().manual_seed(0)
    gaps = [torch.randn(len(r.response_ids), generator=g, dtype=torch.float64) for r in batch.rows]
    evidence = torch.stack([x.sum() for x in gaps])
    seq = credit.grpo_advantages(batch.traj_rewards, batch.traj_group_ids)
    grid, mask = credit.pad_ragged(gaps)
    inputs = credit.CreditInputs(seq[batch.traj_index], batch.traj_ids, batch.turn_ids, batch.success_rate,
                                 evidence=evidence, token_gaps=grid, token_mask=mask, group_ids=batch.group_ids,
                                 anchor_keys=batch.anchor_keys, turn_rewards=batch.turn_rewards,
                                 turn_penalties=batch.turn_penalties)
    result = credit.estimate(estimator, inputs, return_details=True)
    advantages = result.token_advantages(mask, dtype=torch.float32)
    student = [torch.zeros_like(g) for g in gaps]
    judged = TeacherEvidence(gaps, gaps, evidence) if credit.ESTIMATORS[estimator].needs_teacher else \
        TeacherEvidence.none(student)
    record = StepRecord(batch, PolicyLogProbs(student), judged,
                        BatchAdvantages(advantages, seq, torch.zeros(len(batch)), result))
    by_id = {t.traj_id: t for t in trajs}
    token_text = [[w + " " for w in by_id[r.traj_id].turns[r.turn_id].response_text.split(" ")] for r in batch.rows]
    lines = credit_lines(trajs, record, estimator=estimator, step=1,
                         token_text=token_text if result.granularity == "token" else None)
    save_jsonl(trajs, run_dir / "trajectories" / "step_000001.jsonl")
    write_jsonl_atomic(lines, run_dir / "credit" / "step_000001.jsonl")
    return {"trajectories": trajs, "lines": lines}


# ------------------------------------------------------------------------------------------------ files


def test_credit_lines_join_the_trajectories(tmp_path):
    made = make_run(tmp_path / "run")
    lines = [json.loads(x) for x in (tmp_path / "run" / "credit" / "step_000001.jsonl").read_text().splitlines()]
    assert [x["traj_id"] for x in lines] == [0, 1, 2, 3] and lines == made["lines"]
    first = lines[0]["turns"][0]
    assert {"turn", "evidence", "prior", "belief", "delta_belief", "weight", "advantage", "token_gaps",
            "tokens"} <= set(first)
    assert lines[0]["estimator"] == "agentopsd-token" and len(first["token_gaps"]) == len(first["tokens"])
    assert first["delta_belief"] == pytest.approx(first["belief"] - first["prior"], abs=1e-5)


def test_a_run_without_a_teacher_records_no_evidence(tmp_path):
    """GRPO's e_k is 0 by construction: written as evidence it would score as a chance-level teacher (AUC 0.5)."""
    from agentgym_opsd.evaluation.credit_quality import run_credit_auc

    made = make_run(tmp_path / "run", estimator="grpo")
    assert all("evidence" not in turn for line in made["lines"] for turn in line["turns"])
    result = run_credit_auc(tmp_path / "run")
    assert result is not None and result["estimator"] == "grpo" and "evidence" not in result


def test_page_is_self_contained_and_escaped(tmp_path):
    made = make_run(tmp_path / "run")
    page = render_html(load_step(tmp_path / "run"))
    assert "<script>document.title" not in page and "&lt;script&gt;document.title" in page
    assert "<img src=x" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched from anywhere
    assert page.count("<script>") == 1 and "<svg" in page and "oracle distance 3" in page
    first = made["lines"][0]["turns"][0]
    assert f"{first['belief']:.4f}" in page


def test_cli(tmp_path, capsys):
    make_run(tmp_path / "run")
    assert main([str(tmp_path / "run"), "--step", "1"]) == 0
    assert (tmp_path / "run" / "credit" / "step_000001.html").is_file()
    assert main([str(tmp_path / "run"), "--step", "7"]) == 2
    assert "no trajectories for step 7" in capsys.readouterr().err
    assert main([str(tmp_path / "empty")]) == 2


def test_one_cpu_tiny_step_writes_a_credit_file_the_inspector_reads(tmp_path, toy_env_ids):
    from agentgym_opsd.trainer.cli import main as train

    out = tmp_path / "tiny"
    assert train(["--config", "cpu-tiny", "env.id=ToyCounter-v0", f"trainer.output_dir={out}", "trainer.total_steps=1",
                  "trainer.backend=torch", "trainer.save_every=0", "trainer.tensorboard=false",
                  "algorithm.estimator=agentopsd+gigpo"]) == 0
    lines = [json.loads(x) for x in (out / "credit" / "step_000001.jsonl").read_text().splitlines()]
    trajs = [json.loads(x) for x in (out / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert [x["traj_id"] for x in lines] == [t["traj_id"] for t in trajs]
    for line, traj in zip(lines, trajs, strict=True):
        assert [t["turn"] for t in line["turns"]] == [t["index"] for t in traj["turns"] if t["response_token_ids"]]
        assert all({"belief", "weight", "step_advantage", "anchor_size", "advantage"} <= set(t) for t in line["turns"])
    assert main([str(out), "--out", str(tmp_path / "tiny.html")]) == 0
    assert "agentopsd+gigpo" in (tmp_path / "tiny.html").read_text()


# ------------------------------------------------------------------------------------------------ browser


def _driver():
    from agentgym_opsd.environments.webshop.browser import CHROMIUM_FLAGS, _binaries, browser_available

    ok, why = browser_available()
    if not ok:
        pytest.skip(f"browser unavailable: {why}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = _binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = str(browser)
    for flag in (*CHROMIUM_FLAGS, "--window-size=1280,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=str(driver_path)))


@pytest.mark.browser
def test_in_the_browser(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    made = make_run(tmp_path / "run")
    page = tmp_path / "page.html"
    assert main([str(tmp_path / "run"), "--out", str(page)]) == 0
    driver = _driver()
    try:
        driver.get(page.as_uri())
        assert "pwned" not in driver.title and driver.title.startswith("credit inspector")
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, severe
        # the DOM holds the saved numbers of a known turn
        line = made["lines"][0]
        turn = driver.find_element(By.CSS_SELECTOR, '.traj[data-traj-id="0"] .turn[data-turn="1"]')
        for key in ("evidence", "belief", "delta_belief", "weight", "advantage"):
            cell = turn.find_element(By.CSS_SELECTOR, f'td[data-key="{key}"]')
            assert cell.text == f"{line['turns'][1][key]:.4f}", key
        assert len(turn.find_elements(By.CSS_SELECTOR, ".response.shaded .tok")) == len(line["turns"][1]["tokens"])
        assert len(driver.find_elements(By.CSS_SELECTOR, ".traj svg.spark polyline")) == 4
        # the hostile response is shown as text, not run
        hostile = driver.find_element(By.CSS_SELECTOR, '.traj[data-traj-id="1"] .turn[data-turn="1"] .response')
        assert "<script>" in hostile.text and driver.execute_script("return document.images.length") == 0
        # a filter click changes what is shown
        visible = [t for t in driver.find_elements(By.CSS_SELECTOR, ".traj") if t.is_displayed()]
        assert len(visible) == 4
        Select(driver.find_element(By.ID, "f-outcome")).select_by_visible_text("won")
        shown = [t.get_attribute("data-traj-id") for t in driver.find_elements(By.CSS_SELECTOR, ".traj")
                 if t.is_displayed()]
        assert shown == ["0", "2"] and driver.find_element(By.ID, "shown").text == "2 of 4 trajectories shown"
        Select(driver.find_element(By.ID, "f-outcome")).select_by_visible_text("all")
        Select(driver.find_element(By.ID, "f-task")).select_by_visible_text("look")
        groups = [g.get_attribute("data-group-id") for g in driver.find_elements(By.CSS_SELECTOR, ".group")
                  if g.is_displayed()]
        assert groups == ["1"]
        Select(driver.find_element(By.ID, "f-task")).select_by_visible_text("all")
        Select(driver.find_element(By.ID, "sort")).select_by_visible_text("A_seq, high first")
        order = [t.get_attribute("data-traj-id") for t in driver.find_elements(By.CSS_SELECTOR, '.group[data-group-id="0"] .traj')]
        assert order == ["0", "1"]  # the won trajectory has the higher A_seq
        shot = tmp_path / "inspector.png"
        assert driver.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()


def _poison(value, path: str = ""):
    """Every string of a record (not the keys) becomes a hostile payload tagged with where it sits; numbers,
    booleans and the closed vocabularies the loader checks (invalid kinds, roles) stay as they are."""
    if isinstance(value, dict):
        return {k: v if k in ("invalid_kind", "role") else _poison(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_poison(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):
        tag = re.sub(r"[^A-Za-z0-9_.]", "_", path)[-40:]
        return (f'{value}<img src=x onerror="document.title=\'pwned {tag}\'">'
                f'<script>document.title="pwned {tag}"</script>"\'&<b>{tag}</b>')
    return value


def test_hostile_values_in_every_field_stay_text_in_the_browser(tmp_path):
    run = tmp_path / "run"
    make_run(run)
    for folder in ("trajectories", "credit"):
        path = run / folder / "step_000001.jsonl"
        lines = [_poison(json.loads(x)) for x in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    page = tmp_path / "page.html"
    assert main([str(run), "--out", str(page)]) == 0
    html = page.read_text()
    assert "<img src=x" not in html and not re.search(r"<b>\.", html)  # escaped wherever they landed
    driver = _driver()
    try:
        driver.get(page.as_uri())
        assert "pwned" not in driver.title and driver.title.startswith("credit inspector")
        assert driver.execute_script("return document.images.length") == 0
        bold = driver.execute_script("return [...document.querySelectorAll('b')].map(b => b.textContent)")
        assert not [b for b in bold if b.startswith(".")]  # the page's own labels only, none of the payloads' tags
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        body = driver.find_element("tag name", "body").text
        assert "<script>" in body  # the payloads are there, as text
    finally:
        driver.quit()


if __name__ == "__main__":  # regenerate docs/images/credit_inspector.png: python tests/test_inspector.py
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        make_run(Path(tmp) / "run-alfworld")
        main([str(Path(tmp) / "run-alfworld"), "--out", str(Path(tmp) / "page.html")])
        drv = _driver()
        try:
            drv.get((Path(tmp) / "page.html").as_uri())
            drv.save_screenshot(str(TESTS.parent / "docs" / "images" / "credit_inspector.png"))
        finally:
            drv.quit()
    sys.exit(0)


def test_the_oracle_badge_reads_what_the_rollout_records() -> None:
    from agentgym_opsd.inspector.page import _oracle_badge

    turn = _turn(0, "x", "go", "ok")
    assert _oracle_badge(turn) == ""
    turn.info.update({ORACLE_BEFORE: 4, ORACLE_AFTER: 3})
    assert "oracle distance 3 (from 4: progress)" in _oracle_badge(turn)
    turn.info.update({ORACLE_BEFORE: 3, ORACLE_AFTER: 3})
    assert "oracle distance 3 (from 3: wasted)" in _oracle_badge(turn)


# ------------------------------------------------------------------------------------------------ bad records
# Each line is checked as it is read: a wrong type anywhere is one error line naming the file, the line and the
# field (exit 2), never a traceback, and no page is left behind.

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from agentgym_opsd.inspector.page import _LINE_TYPES, _TURN_TYPES  # noqa: E402
from agentgym_opsd.records import _TRAJECTORY_TYPES  # noqa: E402
from agentgym_opsd.records import _TURN_TYPES as _RECORD_TURN_TYPES  # noqa: E402

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("good") / "run"
    make_run(run)
    return run


def _inspect_with(good: Path, folder: str, line_index: int, edit, tmp: Path, capsys) -> tuple[int, str, Path]:
    """Copy `good`, apply `edit` to one line of its `folder` file, run the inspector; (exit code, stderr, page)."""
    import shutil

    run = tmp / "run"
    shutil.copytree(good, run)
    path = run / folder / "step_000001.jsonl"
    lines = path.read_text().splitlines()
    lines[line_index] = edit(lines[line_index])
    path.write_text("\n".join(lines) + "\n")
    page = tmp / "page.html"
    capsys.readouterr()
    code = main([str(run), "--out", str(page)])
    return code, capsys.readouterr().err, page


def _assert_clean_error(code: int, err: str, page: Path, folder: str, line_no: int, field: str) -> None:
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err  # one line
    assert f"{folder}/step_000001.jsonl:{line_no}: " in err and field in err, err
    assert not page.exists()


@pytest.mark.parametrize(("key", "value", "field"), [
    ("advantage", "abc", "advantage"), ("belief", "0.5x", "belief"), ("prior", {"a": 1}, "prior"),
    ("token_gaps", ["x", {}], "token_gaps"), ("turn", "0", "turn"), ("evidence", True, "evidence"),
])
def test_a_wrong_type_in_a_credit_turn_is_one_clean_error(good_run, tmp_path, capsys, key, value, field):
    def edit(text: str) -> str:
        line = json.loads(text)
        line["turns"][0][key] = value
        return json.dumps(line)

    _assert_clean_error(*_inspect_with(good_run, "credit", 1, edit, tmp_path, capsys), "credit", 2, field)


@pytest.mark.parametrize(("key", "value"), [
    ("seq_advantage", "x"), ("turns", "abc"), ("turns", [1, 2]), ("traj_id", "1"), ("won", 1), ("reward", []),
])
def test_a_wrong_type_in_a_credit_line_is_one_clean_error(good_run, tmp_path, capsys, key, value):
    def edit(text: str) -> str:
        return json.dumps({**json.loads(text), key: value})

    _assert_clean_error(*_inspect_with(good_run, "credit", 0, edit, tmp_path, capsys), "credit", 1, key)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_value_in_any_field_is_read_or_refused_cleanly(good_run, tmp_path_factory, capsys, data):
    folder = data.draw(st.sampled_from(["credit", "trajectories"]), label="file")
    line_index = data.draw(st.integers(0, 3), label="line")
    value = data.draw(json_values, label="value")
    if folder == "credit":
        where = data.draw(st.sampled_from(["line", "turn"]), label="where")
        key = data.draw(st.sampled_from(sorted(_LINE_TYPES if where == "line" else _TURN_TYPES)), label="key")
    else:
        where = data.draw(st.sampled_from(["trajectory", "turn"]), label="where")
        key = data.draw(st.sampled_from(sorted(_TRAJECTORY_TYPES if where == "trajectory" else _RECORD_TURN_TYPES)),
                        label="key")

    def edit(text: str) -> str:
        record = json.loads(text)
        if where in ("line", "trajectory"):
            record[key] = value
        else:
            record["turns"][0][key] = value
        return json.dumps(record)

    tmp = tmp_path_factory.mktemp("case")
    code, err, page = _inspect_with(good_run, folder, line_index, edit, tmp, capsys)
    if code == 0:  # a value of the right type: the page is there
        assert page.is_file() and not err
    else:
        _assert_clean_error(code, err, page, folder, line_index + 1, key)


@pytest.mark.parametrize("folder", ["credit", "trajectories"])
def test_a_record_nested_200000_levels_deep_is_one_clean_error(good_run, tmp_path, capsys, folder):
    def edit(text: str) -> str:
        return text[:-1] + ', "deep": ' + "[" * 200_000 + "]" * 200_000 + "}"

    code, err, page = _inspect_with(good_run, folder, 2, edit, tmp_path, capsys)
    _assert_clean_error(code, err, page, folder, 3, "nested deeper")


def test_a_lone_surrogate_is_refused_and_leaves_no_page(good_run, tmp_path, capsys):
    def edit(text: str) -> str:
        return json.dumps({**json.loads(text), "task_text": "apple \ud800 fridge"})  # written as the escape \ud800

    page = tmp_path / "page.html"
    code, err, page = _inspect_with(good_run, "trajectories", 0, edit, tmp_path, capsys)
    _assert_clean_error(code, err, page, "trajectories", 1, "surrogate")


def test_a_page_that_cannot_be_written_leaves_no_file(good_run, tmp_path, capsys, monkeypatch):
    import agentgym_opsd.inspector.page as page_module

    monkeypatch.setattr(page_module, "render_html", lambda data: "<html>\ud800</html>")  # cannot be UTF-8
    page = tmp_path / "page.html"
    assert main([str(good_run), "--out", str(page)]) == 2
    assert "surrogate" in capsys.readouterr().err
    assert not page.exists() and not list(tmp_path.iterdir())  # not even the temporary file


# ---- issue 45, hole 6: non-finite numbers, huge integers, missing fields, oversized strings -------------------


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1" * 400 + ".0"])
@pytest.mark.parametrize(("folder", "key", "field"), [
    ("credit", '"evidence": ', "turns[0].evidence"), ("credit", '"seq_advantage": ', "seq_advantage"),
    ("trajectories", '"reward": ', "turns[0].reward"),
])
def test_a_number_json_cannot_hold_is_refused_naming_its_field(good_run, tmp_path, capsys, token, folder, key, field):
    def edit(text: str) -> str:
        start = text.index(key) + len(key)
        end = min(i for i in (text.find(",", start), text.find("}", start)) if i > 0)
        return text[:start] + token + text[end:]

    _assert_clean_error(*_inspect_with(good_run, folder, 0, edit, tmp_path, capsys), folder, 1, field)


@pytest.mark.parametrize(("folder", "key", "field"), [
    ("credit", '"step": ', "step"), ("trajectories", '"group_id": ', "group_id"),
])
def test_an_integer_over_4300_digits_is_refused_naming_its_field(good_run, tmp_path, capsys, folder, key, field):
    def edit(text: str) -> str:
        start = text.index(key) + len(key)
        return text[:start] + "9" * 5000 + text[text.index(",", start):]

    code, err, page = _inspect_with(good_run, folder, 0, edit, tmp_path, capsys)
    _assert_clean_error(code, err, page, folder, 1, f"field '{field}'")
    assert "5000 digits" in err


@pytest.mark.parametrize(("folder", "remove", "field"), [
    ("credit", ("turns",), "'turns'"), ("credit", ("estimator",), "'estimator'"), ("credit", ("won",), "'won'"),
    ("credit", ("turns", 0, "belief"), "'belief'"), ("credit", ("turns", 0, "advantage"), "'advantage'"),
    ("credit", ("turns", 1, "tokens"), "'tokens'"), ("trajectories", ("turns",), "'turns'"),
    ("trajectories", ("won",), "'won'"), ("trajectories", ("turns", 0, "observation"), "'observation'"),
])
def test_a_missing_field_is_refused_naming_it(good_run, tmp_path, capsys, folder, remove, field):
    def edit(text: str) -> str:
        record = json.loads(text)
        *parents, key = remove
        target = record
        for step in parents:
            target = target[step]
        del target[key]
        return json.dumps(record)

    _assert_clean_error(*_inspect_with(good_run, folder, 0, edit, tmp_path, capsys), folder, 1, field)


def test_a_turn_without_the_details_its_line_has_is_refused(good_run, tmp_path, capsys):
    """AgentOPSD writes B_0, B_k, ΔB_k and w_k for every turn: a turn with none of them was cut out."""
    def edit(text: str) -> str:
        line = json.loads(text)
        for key in ("prior", "belief", "delta_belief", "weight"):
            del line["turns"][1][key]
        return json.dumps(line)

    _assert_clean_error(*_inspect_with(good_run, "credit", 0, edit, tmp_path, capsys), "credit", 1, "turns[1]")


@pytest.mark.parametrize("folder", ["credit", "trajectories"])
def test_a_string_over_the_bound_is_refused_naming_its_field(good_run, tmp_path, capsys, folder):
    from agentgym_opsd.inspector.page import MAX_STRING_CHARS

    key = "task_type" if folder == "credit" else "task_text"

    def edit(text: str) -> str:
        return json.dumps({**json.loads(text), key: "a" * (MAX_STRING_CHARS + 1)})

    code, err, page = _inspect_with(good_run, folder, 0, edit, tmp_path, capsys)
    _assert_clean_error(code, err, page, folder, 1, f"field '{key}'")
    assert f"at most {MAX_STRING_CHARS}" in err
