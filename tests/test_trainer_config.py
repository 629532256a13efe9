"""Trainer config: presets, dotted overrides, errors that name the key, the CLI's handling of bad input."""

from __future__ import annotations

import re

import pytest

from agentgym_opsd.trainer.cli import main
from agentgym_opsd.trainer.config import ConfigError, available_presets, config_from_dict, load_config


def test_presets_load_and_validate() -> None:
    names = available_presets()
    for required in ("paper-alfworld", "release-alfworld", "cpu-small", "cpu-tiny"):
        assert required in names
    for name in names:
        cfg = load_config(name)
        assert cfg.preset == name
        assert config_from_dict(cfg.to_dict()) == cfg  # the saved config round-trips


def test_paper_and_release_numbers() -> None:
    paper, release = load_config("paper-alfworld"), load_config("release-alfworld")
    assert (paper.algorithm.lam, paper.algorithm.band, paper.algorithm.gamma, paper.algorithm.eps0) == (0.5, 0.2, 0.95, 1e-3)
    assert (paper.algorithm.clip_low, paper.algorithm.clip_high, paper.algorithm.kl_coef) == (0.2, 0.24, 0.01)
    assert (paper.rollout.tasks_per_step, paper.rollout.group_size, paper.env.max_turns) == (16, 8, 50)
    assert paper.optim.lr == 1e-6 and paper.trainer.total_steps == 150 and paper.trainer.eval_temperature == 0.4
    assert (release.algorithm.gamma, release.algorithm.eps0, release.algorithm.success_source) == (1.0, 1e-4, "reward")
    assert release.env.reward_scale == 10.0
    # the released update: verl's clip, dual clip, 256-row mini-batches, per-turn format penalty, cross-step stats
    r = release.algorithm
    assert (r.clip_low, r.clip_high, r.clip_ratio_c, r.ppo_mini_batch_rows) == (0.2, 0.2, 3.0, 256)
    assert (r.penalty_mode, r.penalize, r.grpo_cross_steps) == ("turn", "format", True)
    assert (paper.algorithm.penalty_mode, paper.algorithm.ppo_mini_batch_rows) == ("trajectory", 256)


def test_yaml_off_reads_as_the_string_off() -> None:
    assert load_config("cpu-tiny", ["warm_start.cache=off"]).warm_start.cache == "off"


def test_overrides_parse_values() -> None:
    cfg = load_config("cpu-tiny", ["trainer.total_steps=7", "algorithm.estimator=grpo", "optim.lr=3e-4",
                                   "env.id=ALFWorld-v0:valid_seen", "trainer.tensorboard=false"])
    assert cfg.trainer.total_steps == 7 and cfg.algorithm.estimator == "grpo"
    assert cfg.optim.lr == pytest.approx(3e-4) and cfg.trainer.tensorboard is False
    assert cfg.env.id == "ALFWorld-v0:valid_seen"


@pytest.mark.parametrize(("override", "needle"), [
    ("trainer.total_stepz=3", "trainer.total_stepz"),
    ("trainr.total_steps=3", "trainr"),
    ("trainer.total_steps=abc", "trainer.total_steps"),
    ("trainer.total_steps=1.5", "trainer.total_steps"),
    ("algorithm.estimator=ppo", "algorithm.estimator"),
    ("algorithm.clip_low=2", "algorithm.clip_low"),
    ("rollout.group_size=0", "rollout.group_size"),
    ("deepspeed.zero_stage=5", "deepspeed.zero_stage"),
    ("trainer.total_steps", "key.sub=value"),
])
def test_bad_keys_and_values_name_the_key(override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config("cpu-tiny", [override])


@pytest.mark.parametrize(("overrides", "needle"), [
    (["model.lora=true", "model.lora_target_modules=[]"], "model.lora_target_modules"),
    (["model.lora=true", "model.lora_target_modules=[q_proj, '']"], "model.lora_target_modules"),
    (["env.kwargs={split: 5}"], "env.kwargs.split: set it through env.id"),
    (["env.kwargs={max_turns: 3}"], "env.kwargs.max_turns: set it through env.max_turns"),
])
def test_values_that_would_pass_and_fail_later_are_refused_at_load(overrides: list[str], needle: str) -> None:
    """Issue 67 item 6: an empty LoRA target list crashed after set-up; a split in env.kwargs was recorded and
    ignored."""
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config("cpu-tiny", overrides)


def test_unknown_key_lists_valid_keys() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("cpu-tiny", ["trainer.bogus=1"])
    assert "total_steps" in str(info.value) and "output_dir" in str(info.value)


def test_corrupt_config_file_is_a_clear_error(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="not a file and not a preset"):
        load_config("no-such-preset")


def test_cli_reports_config_errors(capsys) -> None:
    assert main(["--config", "cpu-tiny", "trainer.nope=1"]) == 2
    assert "trainer.nope" in capsys.readouterr().err
    assert main(["--config", "cpu-tiny", "--print-config", "trainer.total_steps=9"]) == 0
    assert "total_steps: 9" in capsys.readouterr().out


@pytest.mark.parametrize("key", ["env.id", "env.val_id"])
def test_an_unknown_environment_is_refused_at_config_load_naming_the_key(key):
    with pytest.raises(ConfigError, match=rf"{key}: unknown environment .*registered: .*ALFWorld-v0"):
        load_config("cpu-tiny", [f"{key}=Nope-v0"])


def test_help_config_lists_every_key_with_its_help(capsys):
    assert main(["--help-config"]) == 0
    out = capsys.readouterr().out
    for key, help_words in (("algorithm.lam", "λ"), ("model.trainable_layers", "decoder layers"),
                            ("warm_start.cache", "reuse"), ("preset", "preset")):
        assert key in out and help_words in out.split(key, 1)[1].split("\n  ", 2)[1]


def test_print_config_carries_help_comments_and_loads_back(tmp_path, capsys):
    assert main(["--config", "cpu-tiny", "--print-config", "algorithm.lam=0.3"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"\n  # auto \| fp32 \| bf16-mixed\. bf16-mixed:[^\n]*\n  precision: fp32\n", text)
    (tmp_path / "resolved.yaml").write_text(text)
    assert load_config(str(tmp_path / "resolved.yaml")).to_dict() == load_config("cpu-tiny", ["algorithm.lam=0.3"]).to_dict()


@pytest.mark.parametrize("override", ["optim.lr=1e999", "algorithm.kl_coef=inf", "optim.grad_clip=nan",
                                      "optim.lr=-.inf", "algorithm.entropy_coef=.nan"])
def test_non_finite_numbers_are_refused_by_name(override: str) -> None:
    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: expected a finite number"):
        load_config("cpu-tiny", [override])


@pytest.mark.parametrize(("override", "key"), [("optim.betas=[2,3]", "optim.betas"),
                                               ("optim.betas=[0.9]", "optim.betas"),
                                               ("trainer.output_dir=''", "trainer.output_dir")])
def test_settings_that_cannot_work_are_refused(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config("cpu-tiny", [override])


def test_a_config_inherits_from_its_base_and_shows_only_what_it_changes(tmp_path) -> None:
    child = tmp_path / "child.yaml"
    child.write_text("base: cpu-tiny\nrollout:\n  group_size: 3\n")
    grandchild = tmp_path / "grandchild.yaml"
    grandchild.write_text(f"base: {child}\ntrainer:\n  total_steps: 7\n")
    cfg, tiny = load_config(str(grandchild)), load_config("cpu-tiny")
    assert cfg.rollout.group_size == 3 and cfg.trainer.total_steps == 7
    assert cfg.rollout.max_new_tokens == tiny.rollout.max_new_tokens  # the rest of the section is the base's
    assert cfg.preset == "grandchild"
    small, learn = load_config("cpu-small"), load_config("cpu-learn")  # cpu-small: base cpu-learn
    assert small.algorithm == learn.algorithm and small.warm_start == learn.warm_start
    assert small.trainer.total_steps == 6 and learn.trainer.total_steps == 12


def test_output_dir_defaults_to_runs_slash_the_config_name(tmp_path) -> None:
    assert load_config("cpu-small").trainer.output_dir == "runs/cpu-small"  # not its base's runs/cpu-learn
    assert load_config("paper-webshop").trainer.output_dir == "runs/paper-webshop"
    mine = tmp_path / "mine.yaml"
    mine.write_text("base: cpu-tiny\n")
    assert load_config(str(mine)).trainer.output_dir == "runs/mine"
    assert load_config(str(mine), ["trainer.output_dir=out/x"]).trainer.output_dir == "out/x"
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text("base: cpu-tiny\ntrainer:\n  output_dir: out/pinned\n")
    assert load_config(str(pinned)).trainer.output_dir == "out/pinned"


def test_a_bad_base_is_named(tmp_path) -> None:
    loop_a, loop_b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    loop_a.write_text(f"base: {loop_b}\n")
    loop_b.write_text(f"base: {loop_a}\n")
    with pytest.raises(ConfigError, match="leads back to itself"):
        load_config(str(loop_a))
    missing = tmp_path / "m.yaml"
    missing.write_text("base: no-such-preset\n")
    with pytest.raises(ConfigError, match="base 'no-such-preset'"):
        load_config(str(missing))


@pytest.mark.parametrize("override", [
    "rollout.group_size=99999999999999999999", "rollout.group_size=1000000", "rollout.tasks_per_step=100000",
    "rollout.max_new_tokens=2000000", "optim.micro_batch_tokens=99999999999", "env.max_turns=100000",
    "trainer.total_steps=1000000", "trainer.seed=-99999999999999999999", "env.step_timeout_s=1e300",
    "warm_start.epochs=1e9", "algorithm.ppo_epochs=100000",
])
def test_a_count_beyond_its_bound_is_refused_at_load_naming_the_key(override: str) -> None:
    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: expected at (most|least) "):
        load_config("cpu-tiny", [override])


def test_the_bounds_leave_room_for_real_gpu_recipes() -> None:
    cfg = load_config("cpu-tiny", ["rollout.group_size=1024", "rollout.tasks_per_step=64", "rollout.max_new_tokens=32768",
                                   "optim.micro_batch_tokens=1048576", "env.max_turns=500", "trainer.total_steps=999999",
                                   "warm_start.seed=-1"])
    assert cfg.rollout.group_size == 1024 and cfg.trainer.total_steps == 999_999
    with pytest.raises(ConfigError, match=r"rollout.tasks_per_step x rollout.group_size: 128 x 1024"):
        load_config("cpu-tiny", ["rollout.group_size=1024", "rollout.tasks_per_step=128"])


def _numeric_fields() -> list[tuple[str, object]]:
    """(`section.key`, its dataclass field) of every int and float config key."""
    import dataclasses
    import typing

    from agentgym_opsd.trainer.config import Config

    out = []
    for section in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[section.name]
        if dataclasses.is_dataclass(cls):
            hints = typing.get_type_hints(cls)
            out += [(f"{section.name}.{f.name}", f) for f in dataclasses.fields(cls) if hints[f.name] in (int, float)]
    return out


def test_every_numeric_key_has_a_documented_range(capsys) -> None:
    """A new int or float key comes with its `Range` (or is a credit hyper-parameter, checked by CreditConfig),
    and `--help-config` shows it."""
    fields = _numeric_fields()
    assert len(fields) > 40
    unranged = [key for key, f in fields if "range" not in f.metadata and "range_text" not in f.metadata]
    assert unranged == []
    assert main(["--help-config"]) == 0
    out = capsys.readouterr().out
    for key, _ in fields:
        assert re.search(rf"^  {re.escape(key)} \(.*\[range: [^]]+\]$", out, re.M), key


def _outside(within) -> list[float]:
    """Values just outside a range, below and above (NaN-free; beyond every special value)."""
    lo = within.lo if within.lo_open else within.lo - max(1, abs(within.lo))
    hi = within.hi if within.hi_open else within.hi + max(1, within.hi)
    return [v for v in (lo, hi) if all(v != special for special, _ in within.special)]


@pytest.mark.parametrize(("key", "value"), [
    (key, value) for key, f in _numeric_fields() if "range" in f.metadata for value in _outside(f.metadata["range"])
])
def test_a_value_outside_its_range_is_refused_at_load_naming_the_key(key: str, value: float) -> None:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: expected (at (most|least)|[<>]) "):
        load_config("cpu-tiny", [f"{key}={value}"])


@pytest.mark.parametrize("override", [  # issue 45, hole 7: each of these passed
    "env.history_turns=-5", "env.max_prompt_chars=-1", "env.invalid_action_penalty=-7", "env.reward_scale=1e308",
    "rollout.vllm_gpu_memory_utilization=1.5", "model.lora_dropout=1", "optim.weight_decay=-0.1",
    "algorithm.entropy_coef=-1", "trainer.eval_episodes=0", "trainer.seed=-1", "warm_start.lr=0",
])
def test_values_that_make_no_sense_are_refused_naming_the_key(override: str) -> None:
    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: expected "):
        load_config("cpu-tiny", [override])


def test_the_special_values_keep_their_meaning() -> None:
    cfg = load_config("cpu-tiny", ["env.history_turns=-1", "env.invalid_action_penalty=-1", "algorithm.clip_ratio_c=0",
                                   "warm_start.seed=-1", "env.max_prompt_chars=0", "env.invalid_action_penalty=0"])
    assert (cfg.env.history_turns, cfg.algorithm.clip_ratio_c, cfg.warm_start.seed) == (-1, 0, -1)


def test_overrides_work_on_either_side_of_print_config(capsys) -> None:
    assert main(["--config", "cpu-tiny", "trainer.total_steps=3", "--print-config", "algorithm.lam=0.3"]) == 0
    out = capsys.readouterr().out
    assert "\n  total_steps: 3\n" in out and "\n  lam: 0.3\n" in out
    assert main(["--print-config", "env.history_turns=-5", "--config", "cpu-tiny"]) == 2
    assert "env.history_turns: expected at least 0" in capsys.readouterr().err


@pytest.mark.parametrize(("override", "message"), [  # OmegaConf alone would read 2 as True and '3' as 3
    ("model.lora=2", "model.lora: expected bool, got 2 (int)"),
    ("trainer.tensorboard=1", "trainer.tensorboard: expected bool, got 1 (int)"),
    ("trainer.total_steps='3'", "trainer.total_steps: expected int, got '3' (str)"),
    ("trainer.total_steps=true", "trainer.total_steps: expected int, got True (bool)"),
    ("optim.betas=5", "optim.betas: expected list, got 5 (int)"),
    ("trainer=5", "trainer: expected a mapping, got 5"),
])
def test_a_value_of_another_type_is_refused_not_converted(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        load_config("cpu-tiny", [override])


def test_nested_mappings_merge_key_by_key_and_values_may_interpolate(tmp_path) -> None:
    child = tmp_path / "child.yaml"
    child.write_text("base: cpu-tiny\ndeepspeed:\n  extra:\n    a: {x: 1}\n")
    cfg = load_config(str(child), ["deepspeed.extra.a.y=2", "trainer.output_dir=runs/${preset}-b"])
    assert cfg.deepspeed.extra == {"a": {"x": 1, "y": 2}} and cfg.trainer.output_dir == "runs/child-b"
    with pytest.raises(ConfigError, match=r"^trainer\.output_dir: Interpolation key 'nope' not found$"):
        load_config("cpu-tiny", ["trainer.output_dir=${nope}"])
