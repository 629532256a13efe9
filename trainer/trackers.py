"""Experiment trackers: where a run's config, per-step metrics, validation tables and learning curve go besides
`metrics.jsonl`. `trainer.report_to` names them as TRL does: `tensorboard`, `wandb`, `mlflow`, `none`, several
comma-separated.

- `tensorboard`: event files in `RUN/tensorboard` (the default).
- `wandb`: Weights & Biases. Offline unless `WANDB_MODE` says otherwise: the run is written under `RUN/wandb`
  with no account and no network, and `wandb sync RUN/wandb/offline-run-*` uploads it later.
- `mlflow`: an MLflow run in the local file store `RUN/mlruns` (`mlflow ui --backend-store-uri RUN/mlruns`),
  or wherever `MLFLOW_TRACKING_URI` points.

wandb and mlflow are optional extras (`pip install agentgym-opsd[trackers]`), imported only when named.
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = ["TRACKERS", "Tracker", "TensorBoardTracker", "WandbTracker", "MLflowTracker", "make_trackers",
           "parse_report_to"]

TRACKERS = ("tensorboard", "wandb", "mlflow")


class Tracker(Protocol):
    """One destination for a run's numbers (only rank 0 makes trackers)."""

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None: ...

    def log_image(self, name: str, path: Path, step: int) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def parse_report_to(value: str) -> list[str]:
    """`"tensorboard,wandb"` -> ["tensorboard", "wandb"]; `"none"` -> []; an unknown name is a ValueError."""
    names = [n.strip().lower() for n in str(value).split(",") if n.strip()]
    if names == ["none"] or not names:
        return []
    bad = [n for n in names if n not in TRACKERS]
    if bad or "none" in names:
        raise ValueError(f"unknown tracker {', '.join(bad) or 'none (alone only)'}; choose from {TRACKERS} or 'none'")
    return list(dict.fromkeys(names))


def numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics line (bools count as numbers; strings and NaN are left out)."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and math.isfinite(float(v)) and k != "step"}


def flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 1e-5}} -> {"optim.lr": 1e-5} (lists as JSON text)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flat(v, f"{key}."))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, tuple)) else v
    return out


class TensorBoardTracker:
    def __init__(self, run_dir: Path, *, first_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=first_step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        import yaml

        self.writer.add_text("config", "```\n" + yaml.safe_dump(dict(config), sort_keys=False) + "```")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for k, v in numbers(metrics).items():
            self.writer.add_scalar(k, v, step)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        if rows:
            head = list(rows[0])
            lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(str(r.get(h, "")) for h in head) + " |" for r in rows]
            self.writer.add_text(name, "\n".join(lines), step)

    def log_image(self, name: str, path: Path, step: int) -> None:
        import matplotlib.image

        self.writer.add_image(name, matplotlib.image.imread(str(path))[..., :3], step, dataformats="HWC")

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run_dir: Path, *, name: str, config: Mapping[str, Any], resume: bool) -> None:
        import wandb

        self.wandb = wandb
        os.environ.setdefault("WANDB_SILENT", "true")
        mode = os.environ.get("WANDB_MODE", "offline")  # no account, no network unless asked for
        # one id per run folder: a resumed run continues its wandb run instead of starting a second one
        id_file = run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else uuid.uuid4().hex[:8]
        id_file.write_text(run_id)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "agentgym-opsd"), name=name, id=run_id,
                              dir=str(run_dir), mode=mode, config=dict(config), resume="allow")

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(numbers(metrics), step=step)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        if rows:
            columns = list(rows[0])
            self.run.log({name: self.wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])},
                         step=step)

    def log_image(self, name: str, path: Path, step: int) -> None:
        self.run.log({name: self.wandb.Image(str(path))}, step=step)

    def flush(self) -> None:
        pass  # wandb writes as it goes

    def close(self) -> None:
        self.run.finish()


_MLFLOW_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


class MLflowTracker:
    def __init__(self, run_dir: Path, *, name: str, resume: bool) -> None:
        import mlflow

        self.mlflow = mlflow
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # the plain-folder store needs no database or server; MLflow 3 asks for this opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (run_dir / "mlruns").resolve().as_uri()
        self.client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "agentgym-opsd")
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        id_file = run_dir / "mlflow_run_id"
        if resume and id_file.is_file():
            self.run_id = id_file.read_text().strip()
        else:
            self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
            id_file.write_text(self.run_id)

    @staticmethod
    def key(name: str) -> str:
        """MLflow keys allow letters, digits, `_ - . / ` and space: `val/ALFWorld-v0:easy/x` -> `val/ALFWorld-v0_easy/x`."""
        return _MLFLOW_KEY.sub("_", name)

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(self.key(k), str(v)[:6000]) for k, v in flat(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(self.key(k), v, now, step) for k, v in numbers(metrics).items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        if rows:
            columns = list(rows[0])
            # MLflow's table layout ({"columns", "data"}) through log_dict: log_table would need pandas
            self.client.log_dict(self.run_id, {"columns": columns, "data": [[r.get(c) for c in columns] for r in rows]},
                                 f"{self.key(name)}_step{step}.json")

    def log_image(self, name: str, path: Path, step: int) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def make_trackers(names: list[str], run_dir: Path, first_step: int, *, name: str, config: Mapping[str, Any],
                  resume: bool) -> list[Tracker]:
    """The trackers of `names` for a run whose first logged step is `first_step`; an optional package that is
    missing is an error naming the extra to install."""
    out: list[Tracker] = []
    for tracker in names:
        try:
            if tracker == "tensorboard":
                out.append(TensorBoardTracker(run_dir, first_step=first_step))
            elif tracker == "wandb":
                out.append(WandbTracker(run_dir, name=name, config=config, resume=resume))
            elif tracker == "mlflow":
                out.append(MLflowTracker(run_dir, name=name, resume=resume))
        except ImportError as exc:
            raise ImportError(f"trainer.report_to={tracker} needs the {tracker} package: "
                              f"pip install 'agentgym-opsd[trackers]' ({exc})") from exc
        if tracker != "wandb":  # wandb took the config at init
            out[-1].log_config(config)
    return out
