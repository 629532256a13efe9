"""`trainer.report_to`: TensorBoard, Weights & Biases (offline: no account, no network) and MLflow (local file
store) receive the config, every step's metrics, the validation table and the learning curve."""

from __future__ import annotations

import json

import pytest

from agentgym_opsd.train import main
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
