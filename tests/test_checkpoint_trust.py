"""Checkpoints that can be trusted: every file hashed in the manifest and checked on every resume, a corrupt
checkpoint named and skipped for the newest intact one (never trained on, never the reason an intact one is
pruned), and a run that meets a NaN or an infinity stops before it writes anything."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from run_metrics import metrics_lines
from safetensors.torch import load_file, save_file

from agentgym_opsd.trainer import checkpoint as ckpt
from agentgym_opsd.trainer.cli import main
from agentgym_opsd.trainer.config import OptimConfig
from agentgym_opsd.trainer.engine import TorchEngine
from agentgym_opsd.trainer.finite import NonFiniteError, require_finite_weights

TOY = ["env.id=ToyCounter-v0"]


def _save(root: Path, step: int) -> Path:
    state = ckpt.TrainerState(step=step, task_cursor=step, warm_start_done=True, engine={"lr": 1.0},
                              rng={"torch": torch.get_rng_state()}, extra={})

    def weights(folder: Path) -> None:
        folder.mkdir(parents=True)
        save_file({"w": torch.full((4096,), float(step))}, str(folder / "model.safetensors"))

    return ckpt.save_checkpoint(root, state, save_model=weights, config_yaml="x: 1\n")


def _smash_middle(path: Path, size: int = 4096) -> None:
    """`size` bytes of 0xFF written into the middle of `path`, its length unchanged (the attack of issue 67)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2 - size // 2
    data[middle:middle + size] = b"\xff" * size
    path.write_bytes(bytes(data))


def _flip(path: Path, at: int = 40, count: int = 4) -> None:
    data = bytearray(path.read_bytes())
    for i in range(at, at + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_the_manifest_hashes_every_file(tmp_path) -> None:
    folder = _save(tmp_path, 1)
    listed = json.loads((folder / ckpt.MANIFEST).read_text())["files"]
    assert set(listed) == {"model/model.safetensors", "trainer_state.pt", "config.yaml"}
    assert all(len(entry["sha256"]) == 64 and entry["bytes"] > 0 for entry in listed.values())
    assert ckpt.verify_manifest(folder)["version"] == ckpt.MANIFEST_VERSION


@pytest.mark.parametrize("damage", ["weights", "state", "manifest", "extra_file", "missing_file"])
def test_every_kind_of_damage_is_named(tmp_path, damage) -> None:
    folder = _save(tmp_path, 1)
    if damage == "weights":
        _smash_middle(folder / "model" / "model.safetensors")
        named = "model/model.safetensors"
    elif damage == "state":
        _flip(folder / "trainer_state.pt")
        named = "trainer_state.pt"
    elif damage == "manifest":
        (folder / ckpt.MANIFEST).unlink()
        named = ckpt.MANIFEST
    elif damage == "extra_file":
        (folder / "model" / "extra.bin").write_bytes(b"x")
        named = "extra.bin"
    else:
        (folder / "config.yaml").unlink()
        named = "config.yaml"
    with pytest.raises(ckpt.CheckpointError, match=named.replace(".", r"\.")) as err:
        ckpt.verify_manifest(folder)
    assert str(folder) in str(err.value)


def test_resume_point_skips_a_corrupt_newest_checkpoint_by_name(tmp_path, caplog) -> None:
    _save(tmp_path, 1)
    _smash_middle(_save(tmp_path, 2) / "model" / "model.safetensors")
    with caplog.at_level(logging.WARNING):
        assert ckpt.resume_point(tmp_path).name == "step_000001"
    assert "skipping step_000002" in caplog.text and "SHA-256" in caplog.text
    _flip(tmp_path / "step_000001" / "trainer_state.pt")
    with pytest.raises(ckpt.CheckpointError, match="no intact checkpoint") as err:
        ckpt.resume_point(tmp_path)
    assert "step_000001" in str(err.value) and "step_000002" in str(err.value)
    assert ckpt.resume_point(tmp_path / "none") is None  # no checkpoint at all: a fresh start


def test_an_intact_checkpoint_is_never_pruned_below_an_unverified_one(tmp_path) -> None:
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    _smash_middle(_save(tmp_path, 3) / "model" / "model.safetensors")  # the newest does not verify
    assert ckpt.prune_checkpoints(tmp_path, keep=2) == []  # it does not count: 2 and 1 are the two to keep
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_000001", "step_000002", "step_000003"]
    _save(tmp_path, 4)
    deleted = ckpt.prune_checkpoints(tmp_path, keep=2)  # the two newest intact: 4 and 2; 1 goes, 3 is kept
    assert [p.name for p in deleted] == ["step_000001"]
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_000002", "step_000003", "step_000004"]
    # step 4 was verified by the last prune; damaged since, it is checked again, not taken on trust
    weights = tmp_path / "step_000004" / "model" / "model.safetensors"
    _smash_middle(weights)
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    _save(tmp_path, 5)
    assert ckpt.prune_checkpoints(tmp_path, keep=2) == []  # 5 and 2 are the two intact ones
    assert len(ckpt.list_checkpoints(tmp_path)) == 4


def test_a_checkpoint_of_the_first_manifest_version_still_resumes(tmp_path, caplog) -> None:
    folder = _save(tmp_path, 1)
    manifest = json.loads((folder / ckpt.MANIFEST).read_text())
    manifest["version"] = 1
    for rel, entry in manifest["files"].items():
        if rel != "trainer_state.pt":
            del entry["sha256"]
    (folder / ckpt.MANIFEST).write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING):
        ckpt.verify_manifest(folder)
    assert "before every file was hashed" in caplog.text


def test_a_non_finite_gradient_never_reaches_the_weights() -> None:
    model = torch.nn.Linear(3, 1)
    engine = TorchEngine(model, OptimConfig())
    before = [p.detach().clone() for p in model.parameters()]
    (model(torch.ones(1, 3)).sum() * math.nan).backward()
    with pytest.raises(NonFiniteError, match="gradient norm is nan"):
        engine.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_non_finite_weights_are_named() -> None:
    weights = {"a": torch.ones(3), "b": torch.tensor([1.0, math.inf, math.nan]), "ids": torch.arange(3)}
    with pytest.raises(NonFiniteError, match=r"2 non-finite values in 1 tensors: b \(2\)"):
        require_finite_weights(weights.items(), "here")
    require_finite_weights([("a", torch.ones(2))], "fine")


# ---- end to end, on the toy environment -----------------------------------------------------------------------
def _args(out: Path, *extra: str) -> list[str]:
    return ["--config", "cpu-tiny", *TOY, f"trainer.output_dir={out}", "trainer.backend=torch",
            "trainer.tensorboard=false", "trainer.save_every=1", *extra]


def test_a_corrupt_last_checkpoint_is_skipped_never_trained_on(tmp_path, toy_env_ids, caplog, capsys) -> None:
    out = tmp_path / "run"
    assert main(_args(out, "trainer.total_steps=2")) == 0
    weights = out / "checkpoints" / "step_000002" / "model" / "model.safetensors"
    _smash_middle(weights)
    smashed = weights.read_bytes()
    # an explicit path is refused by name, and nothing is trained or deleted
    assert main(_args(out, "trainer.total_steps=3", "--resume", str(weights.parent.parent))) == 2
    err = capsys.readouterr().err
    assert "model/model.safetensors" in err and "SHA-256" in err
    with caplog.at_level(logging.WARNING):
        assert main(_args(out, "trainer.total_steps=3", "--resume", "auto")) == 0
    assert "skipping step_000002" in caplog.text
    assert [x["step"] for x in metrics_lines(out)] == [1, 2, 3]  # step 2 trained again from step 1
    assert all(math.isfinite(x["loss"]) for x in metrics_lines(out))
    for name in ("step_000002", "step_000003"):  # the corrupt one replaced by the step trained again
        folder = out / "checkpoints" / name
        ckpt.verify_manifest(folder)
        assert all(torch.isfinite(t).all() for t in load_file(str(folder / "model" / "model.safetensors")).values())
    assert (out / "checkpoints" / "step_000002" / "model" / "model.safetensors").read_bytes() != smashed


def test_a_nan_loss_stops_the_run_before_anything_is_written(tmp_path, toy_env_ids, monkeypatch, capsys) -> None:
    from agentgym_opsd.trainer import update

    objective, call = update.policy_objective, update.PPOUpdate.__call__
    at_step: list[int] = []

    def update_call(self, *args, step, **kwargs):
        at_step.append(step)
        return call(self, *args, step=step, **kwargs)

    def poisoned(*args, **kwargs):  # the second step's loss turns NaN
        terms = objective(*args, **kwargs)
        return dataclasses.replace(terms, loss=terms.loss * math.nan) if at_step[-1] == 1 else terms

    monkeypatch.setattr(update.PPOUpdate, "__call__", update_call)
    monkeypatch.setattr(update, "policy_objective", poisoned)
    out = tmp_path / "run"
    assert main(_args(out, "trainer.total_steps=3")) == 4
    err = capsys.readouterr().err
    assert "training error: RL step 2: the update's loss is nan" in err and "step_000001" in err
    assert [x["step"] for x in metrics_lines(out)] == [1]
    assert [p.name for p in ckpt.list_checkpoints(out / "checkpoints")] == ["step_000001"]
    assert not (out / "trajectories" / "step_000002.jsonl").exists()


def test_a_warm_start_cache_entry_that_does_not_verify_is_trained_again(tmp_path, toy_env_ids, monkeypatch,
                                                                         caplog) -> None:
    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path / "cache"))
    ws = ["warm_start.steps=2", "warm_start.episodes=4", "trainer.total_steps=1"]
    assert main(_args(tmp_path / "a", *ws)) == 0
    summary = json.loads((tmp_path / "a" / "warm_start" / "summary.json").read_text())
    entry = Path(summary["warm_start/model_dir"]).parent
    ckpt.verify_manifest(entry / "model", marker=ckpt.MANIFEST)
    _smash_middle(entry / "model" / "model.safetensors")
    with caplog.at_level(logging.WARNING):
        assert main(_args(tmp_path / "b", *ws)) == 0
    assert "not reusing" in caplog.text
    again = json.loads((tmp_path / "b" / "warm_start" / "summary.json").read_text())
    assert again["warm_start/cache_hit"] == 0.0
    ckpt.verify_manifest(entry / "model", marker=ckpt.MANIFEST)  # replaced by the entry trained again
    shutil.rmtree(tmp_path / "cache")


def test_non_finite_weights_in_a_sealed_checkpoint_are_refused_on_load(tmp_path, toy_env_ids, capsys) -> None:
    out = tmp_path / "run"
    assert main(_args(out, "trainer.total_steps=1")) == 0
    folder = out / "checkpoints" / "step_000001"
    weights = folder / "model" / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(iter(tensors))
    tensors[name] = torch.full_like(tensors[name], math.nan)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    ckpt.write_manifest(folder, step=1, world_size=1)  # sealed as it is: only the load sees the NaNs
    assert main(_args(out, "trainer.total_steps=2", "--resume", str(folder))) == 2
    err = capsys.readouterr().err
    assert "is corrupt" in err and "non-finite values" in err and name in err
