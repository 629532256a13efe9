"""The README and the docs stay true: the README is short with the two commands at the top, every relative
link in the Markdown the docs site does not build (README, environment and example READMEs) points at a file
and heading that exist, and every results table agrees with the JSON it is rendered from. The docs site's own
links are checked by `mkdocs build --strict` in `.ci/run`."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
SETUP_COMMANDS = (
    './.ci/setup.sh && .venv/bin/python -m agentgym_opsd.train --config cpu-small',
    './.ci/setup.sh && .venv/bin/python -m pytest -q -m "not gpu" --timeout 900',
)


def _render_results():
    spec = importlib.util.spec_from_file_location("render_results", ROOT / "benchmarks" / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(markdown: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", markdown.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {_github_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.MULTILINE)}


def _pages_outside_docs() -> list[Path]:
    return [README, *sorted((ROOT / "environments").glob("*/README.md")), ROOT / "examples/custom_env/README.md"]


def test_readme_is_short_with_the_two_commands_first():
    text = README.read_text(encoding="utf-8")
    assert len(text) <= 12_000, f"README.md is {len(text):,} characters; move detail to docs/ (limit 12,000)"
    first_section = text.split("\n## ")[1]
    assert first_section.startswith("Two commands on a fresh machine")
    for command in SETUP_COMMANDS:
        assert command in first_section, f"the README's first section lost the command {command!r}"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert SETUP_COMMANDS[1].split("&& ")[1] in ci, ".ci/run and the README's test command must stay in sync"


@pytest.mark.parametrize("page", _pages_outside_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for match in LINK.finditer(page.read_text(encoding="utf-8")):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_results_pages_agree_with_their_json():
    stale = _render_results().render_pages(check=True)
    assert not stale, ("these pages disagree with benchmarks/results/*.json; run "
                       f"`python benchmarks/render_results.py`: {[str(p.relative_to(ROOT)) for p in stale]}")


def test_study_forest_is_drawn_from_the_current_study_json(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # study_forest imports render_results as a script does
    spec = importlib.util.spec_from_file_location("study_forest", ROOT / "benchmarks" / "study_forest.py")
    forest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(forest)
    study = json.loads((ROOT / "benchmarks" / "results" / "study.json").read_text(encoding="utf-8"))
    assert forest.read_stamp() == forest.stamp(study), \
        "study_forest.png was not drawn from the current study.json; run `python benchmarks/study_forest.py`"
    rows = forest.forest_data(study)
    assert rows and all(row["low"] <= row["mean"] <= row["high"] for row in rows)
    assert "study_forest.png" in (ROOT / "docs" / "results.md").read_text(encoding="utf-8").split("**The study**")[0], \
        "docs/results.md leads the study section with the forest plot"


def test_render_replaces_a_stale_block_and_refuses_an_unknown_one():
    render = _render_results()
    stale = "before\n<!-- results:main_job -->\n| made up |\n<!-- /results:main_job -->\nafter\n"
    fresh = render.render_text(stale)
    assert "| made up |" not in fresh and "AgentOPSD" in fresh
    assert fresh.startswith("before\n") and fresh.endswith("<!-- /results:main_job -->\nafter\n")
    assert render.render_text(fresh) == fresh
    with pytest.raises(KeyError, match="unknown results block"):
        render.render_text("<!-- results:nope -->\n<!-- /results:nope -->")


def test_main_job_table_gets_the_paired_column_when_every_run_kept_its_episodes(tmp_path, monkeypatch):
    render = _render_results()
    pair = {"episodes": 48, "won_both": 18, "first_only": 3, "second_only": 5, "neither": 22,
            "difference": 2 / 48, "low": -0.05, "high": 0.13, "mcnemar_p": 0.727, "verdict": "cannot tell"}
    run = {"seed": 0, "valid_before": 0.4375, "valid_after": 0.479, "pool_before": 0.45, "pool_after": 0.55}
    summary = {"grpo": {"seeds": 1, "mean_valid_gain": 0.04, "mean_pool_gain": 0.1, "valid_never_worse": True}}
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    (tmp_path / "paired.json").write_text(json.dumps({"grpo": [{**run, "valid_paired": pair}], "summary": summary}))
    (tmp_path / "older.json").write_text(json.dumps({"grpo": [run], "summary": summary}))
    table = render.render_main_job("paired.json").splitlines()
    assert table[0].endswith("gained / lost (McNemar p) |") and table[2].endswith("| +5 / −3 (p 0.73) |")
    assert all(line.count("|") == 6 for line in table[:3])
    assert "McNemar" not in render.render_main_job("older.json")  # files from before episodes were kept


def test_sft_gradients_table_names_each_weights_and_numerics(monkeypatch):
    render = _render_results()
    every = {"error_vs_gradient": 0.0096, "error_vs_batch_spread": 0.0414, "error_kept_by_averaging": 0.635,
             "cosine": 0.99996, "sign_flips": 0.0036}
    by_kind = {"all trained tensors": every,
               "q_proj": {**every, "error_vs_gradient": 0.014}, "down_proj": {**every, "error_vs_gradient": 0.006}}
    data = {"machines": {"Test CPU": {"cpu": "Test CPU", "runs": {"initial": {
        "config": "cpu-small", "seed": 0, "batches": 16, "note": "as loaded", "loss": {},
        "vs_float32": {"autocast": by_kind}}}}}}
    monkeypatch.setattr(render, "_load", lambda name: data)
    page = render.render_sft_gradients()
    row = "| initial | autocast | 16 | 0.0096 | 0.0414 | 0.64 (noise: 0.25) | 0.99996 | 0.36% | q_proj (0.0140) |"
    assert row in page
    assert "_Test CPU, cpu-small, seed 0's SFT batches. initial: as loaded_" in page


def test_replays_table_gives_the_pairs_and_the_draw_flips_of_the_before_weights(monkeypatch):
    render = _render_results()
    pair = {"episodes": 144, "first_only": 2, "second_only": 13, "mcnemar_p": 0.0074}
    data = {"note": "one thread", "pooled": {"pairs": 1, "gained": 13, "lost": 2, "mcnemar_p": 0.0074,
                                             "change_mean": 0.076, "fell": 0, "draw_flips_mean": 7.0},
            "replays": {"seed 0": {
        "before_success": 0.5, "after_success": 0.576, "games": 48, "draws": 3, "valid_paired": pair,
        "games_better": 8, "games_worse": 2, "cpu": "Test CPU",
        "before_draw_flips": [{"draws": [0, 1], "games": 48, "gained": 2, "lost": 4},
                              {"draws": [1, 2], "games": 48, "gained": 2, "lost": 6}]}}}
    monkeypatch.setattr(render, "_load", lambda name: data)
    page = render.render_replays("any.json")
    assert "| seed 0 | 144 (48 × 3) | 50.0 → **57.6** | +13 / −2 (0.01) | 8 / 2 | +2 / −4, +2 / −6 |" in page
    assert "Pooled over the 1 pair: held-out episodes +13 / −2 (McNemar p 0.007), mean change +7.6 points" in page
    assert page.endswith("_Test CPU. one thread_")
