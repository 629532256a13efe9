"""`trainer.report_to`: TensorBoard, Weights & Biases (offline: no account, no network) and MLflow (local file
store) receive the config, every step's metrics, the validation table and the learning curve."""

from __future__ import annotations

import json

import pytest

from agentgym_opsd.trainer.cli import main
from agentgym_opsd.trainer.config import ConfigError, load_config
from agentgym_opsd.trainer.trackers import MLflowTracker, parse_report_to

RUN = ["--config", "cpu-tiny", "env.id=ToyCounter-v0", "trainer.total_steps=2", "trainer.backend=torch",
       "trainer.eval_every=2", "trainer.eval_episodes=2"]


def test_report_to_parsing_and_config_errors() -> None:
    assert parse_report_to("tensorboard, wandb,mlflow") == ["tensorboard", "wandb", "mlflow"]
    assert parse_report_to("none") == [] and parse_report_to("wandb,wandb") == ["wandb"]
    for bad in ("comet", "none,wandb"):
        with pytest.raises(ConfigError, match="trainer.report_to"):
            load_config("cpu-tiny", [f"trainer.report_to={bad}"])
    cfg = load_config("cpu-tiny", ["trainer.report_to=tensorboard,mlflow", "trainer.tensorboard=false"])
    assert cfg.trainer.trackers == ["mlflow"]
    assert MLflowTracker.key("val/ALFWorld-v0:easy/success_rate") == "val/ALFWorld-v0_easy/success_rate"


def test_all_three_trackers_offline(tmp_path, toy_env_ids, monkeypatch) -> None:
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    for key in ("WANDB_MODE", "WANDB_API_KEY", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    out = tmp_path / "run"
    assert main([*RUN, f"trainer.output_dir={out}", "trainer.report_to=tensorboard,wandb,mlflow"]) == 0
    assert (out / "training_curves.png").is_file()
    # TensorBoard: the scalars of both steps
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("success_rate")] == [1, 2]
    assert "val/success_rate" in events.Tags()["scalars"]
    # wandb, offline: a run folder with its history, nothing sent anywhere
    offline = list((out / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("*.wandb"))
    # MLflow: the local file store holds the run, its params, every step's metrics and the artifacts
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.tracking.MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    run = client.get_run((out / "mlflow_run_id").read_text().strip())
    assert run.data.params["algorithm.estimator"] == "agentopsd"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "success_rate")] == [1, 2]
    assert "val/success_rate" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "training_curves.png" in artifacts and any(a.startswith("validation") for a in artifacts)
    table = json.loads(next((out / "mlruns").rglob("validation_step2.json")).read_text())
    assert table["columns"] == ["metric", "value"] and any(row[0] == "val/success_rate" for row in table["data"])


def test_report_to_none_writes_only_metrics_jsonl(tmp_path, toy_env_ids) -> None:
    out = tmp_path / "run"
    assert main([*RUN, f"trainer.output_dir={out}", "trainer.report_to=none"]) == 0
    assert (out / "metrics.jsonl").is_file() and not (out / "tensorboard").exists()
    assert not (out / "wandb").exists() and not (out / "mlruns").exists()


def _event_steps(folder) -> dict[str, list[int]]:
    """tag -> the step of every summary record in the event files, read record by record (no reader-side purge)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps: dict[str, list[int]] = {}
    for path in sorted(folder.iterdir()):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                steps.setdefault(value.tag, []).append(event.step)
    return steps


def test_a_resumed_run_leaves_each_step_once_in_every_tracker(tmp_path, toy_env_ids, monkeypatch) -> None:
    import shutil

    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "run"
    args = [*RUN, f"trainer.output_dir={out}", "trainer.save_every=1", "trainer.report_to=tensorboard,mlflow"]
    assert main(args) == 0
    # as after a kill -9 between logging step 2 and completing its checkpoint: the resume replays step 2 (with its
    # validation table and, at the end, the learning curve)
    shutil.rmtree(out / "checkpoints" / "step_000002")
    assert main([*args, "--resume", "auto"]) == 0

    raw = _event_steps(out / "tensorboard")
    assert raw["success_rate"] == [1, 2] and raw["val/success_rate"] == [2]
    assert all(len(steps) == len(set(steps)) for steps in raw.values()), raw
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("success_rate")] == [1, 2]
    client = mlflow.tracking.MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    run_id = (out / "mlflow_run_id").read_text().strip()
    for key in client.get_run(run_id).data.metrics:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), (key, steps)
    assert [m.step for m in client.get_metric_history(run_id, "success_rate")] == [1, 2]


def test_event_files_lose_what_a_resume_replays_and_a_torn_record(tmp_path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from agentgym_opsd.trainer.trackers import drop_events_from

    folder = tmp_path / "tb"
    writer = SummaryWriter(str(folder))
    for step in range(1, 5):
        writer.add_scalar("x", float(step), step)
    writer.close()
    (path,) = folder.iterdir()
    path.write_bytes(path.read_bytes()[:-5])  # the last record cut by a kill
    drop_events_from(folder, 3)
    assert _event_steps(folder) == {"x": [1, 2]}
    drop_events_from(folder, 1)  # nothing left but the file header: no file
    assert not list(folder.iterdir())


def test_a_tracker_that_cannot_start_fails_before_the_model_loads(tmp_path, toy_env_ids, monkeypatch, capsys):
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    from agentgym_opsd.trainer import session

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the tracker's set-up was checked")

    monkeypatch.setattr(session, "load_model", no_model)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # MLflowTracker sets it for its own store
    out = tmp_path / "run"
    cases = [  # (environment, what the error says)
        ({"MLFLOW_TRACKING_URI": (tmp_path / "store").as_uri()}, ["maintenance mode", "sqlite:///", "RUN/mlruns",
                                                                 "http://HOST:5000"]),
        ({"MLFLOW_TRACKING_URI": "sqlite:///" + str(tmp_path / "m.db")}, ["MLFLOW_TRACKING_URI=sqlite:"]),
        ({"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}, ["no MLflow server answers", "RUN/mlruns"]),
    ]
    for env, needles in cases:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
        assert main([*RUN, f"trainer.output_dir={out}", "trainer.report_to=tensorboard,mlflow"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("config error: trainer.report_to=mlflow") and all(n in err for n in needles), err
        assert not out.exists()  # nothing made, nothing loaded
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.setenv("WANDB_MODE", "offlien")
    assert main([*RUN, f"trainer.output_dir={out}", "trainer.report_to=wandb"]) == 2
    assert "WANDB_MODE='offlien'" in capsys.readouterr().err and not out.exists()


def test_the_set_up_check_passes_what_works(tmp_path, monkeypatch) -> None:
    pytest.importorskip("mlflow")
    from agentgym_opsd.trainer.trackers import check_trackers

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    check_trackers(["tensorboard", "mlflow"])  # the run's own store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "store").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the user's own opt-in to a file store
    check_trackers(["mlflow"])
