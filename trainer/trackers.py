"""Experiment trackers: where a run's config, per-step metrics, validation tables and learning curve go besides
`metrics.jsonl`. `trainer.report_to` names them as TRL does: `tensorboard`, `wandb`, `mlflow`, `none`, or several.

- `tensorboard`: event files in `RUN/tensorboard` (the default).
- `wandb`: offline unless `WANDB_MODE` says otherwise, under `RUN/wandb` (`wandb sync RUN/wandb/offline-run-*`).
- `mlflow`: the local file store `RUN/mlruns`, or wherever `MLFLOW_TRACKING_URI` points.

wandb and mlflow are optional (`pip install agentgym-opsd[trackers]`), imported only when named; `check_trackers`
checks their set-up before the trainer loads the model. A resumed run replays the steps after its checkpoint and
every sink shows each step once: TensorBoard drops its events from the first replayed step on (`purge_step`);
wandb and MLflow cannot delete, so the steps the previous attempt logged (`logged_through`) are not sent again.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import re
import socket
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from agentgym_opsd.files import atomic_write_bytes

__all__ = ["TRACKERS", "Tracker", "TensorBoardTracker", "WandbTracker", "MLflowTracker", "check_trackers",
           "drop_events_from", "make_trackers", "parse_report_to"]

TRACKERS = ("tensorboard", "wandb", "mlflow")
_EXTRAS = {"tensorboard": "train", "wandb": "trackers", "mlflow": "trackers"}  # the extra that installs each


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


def drop_events_from(folder: Path, step: int) -> None:
    """Rewrite each TensorBoard event file in `folder` without its events at `step` or later (and without a record
    cut short by a kill), atomically per file; a file left with no data is removed. `SummaryWriter(purge_step=)`
    alone only asks TensorBoard's reader to hide such events: the files keep them, and other readers (tbparse,
    `tensorboard --inspect`, a script over the records) see those steps twice."""
    if not folder.is_dir():
        return
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    for path in sorted(folder.glob("*tfevents*")):
        records = [(r, Event.FromString(r)) for r in RawEventFileLoader(str(path)).Load()]
        # the file-version record heads every file (readers need it); everything else goes by its step
        kept = [r for r, event in records if event.step < step or event.HasField("file_version")]
        if len(kept) == len(records) and path.stat().st_size == sum(len(r) + 16 for r, _ in records):
            continue  # nothing to drop, nothing torn (each record is framed by 16 bytes of length and CRCs)
        if len(kept) == sum(event.HasField("file_version") for _, event in records):  # no data left
            path.unlink()
            continue
        buffer = io.BytesIO()
        writer = RecordWriter(buffer)
        for record in kept:
            writer.write(record)
        atomic_write_bytes(path, buffer.getvalue())


class TensorBoardTracker:
    def __init__(self, run_dir: Path, *, first_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder = run_dir / "tensorboard"
        drop_events_from(folder, first_step)
        self.first_step = first_step
        self.writer = SummaryWriter(str(folder), purge_step=first_step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        import yaml

        # at this session's first step: a resumed run's config is another step, not a second entry at step 0
        self.writer.add_text("config", "```\n" + yaml.safe_dump(dict(config), sort_keys=False) + "```",
                             self.first_step)

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
    def __init__(self, run_dir: Path, *, name: str, config: Mapping[str, Any], resume: bool,
                 logged_through: int = -1) -> None:
        import wandb

        self.wandb = wandb
        self.logged_through = logged_through  # steps the run holds already (module docstring)
        os.environ.setdefault("WANDB_SILENT", "true")
        mode = os.environ.get("WANDB_MODE", _WANDB_DEFAULT_MODE)
        # one id per run folder: a resumed run continues its wandb run instead of starting a second one
        id_file = run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else uuid.uuid4().hex[:8]
        id_file.write_text(run_id)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "agentgym-opsd"), name=name, id=run_id,
                              dir=str(run_dir), mode=mode, config=dict(config), resume="allow")

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if step > self.logged_through:
            self.run.log(numbers(metrics), step=step)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        if rows and step > self.logged_through:
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
    def __init__(self, run_dir: Path, *, name: str, resume: bool, logged_through: int = -1) -> None:
        import mlflow

        self.mlflow = mlflow
        self.logged_through = logged_through  # steps the run holds already (module docstring)
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

        if step <= self.logged_through:
            return
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
                  resume: bool, logged_through: int = -1) -> list[Tracker]:
    """The trackers of `names` for a run whose first logged step is `first_step`, when an attempt before it (killed)
    logged up to step `logged_through`; an optional package that is missing is an error naming the extra to
    install."""
    out: list[Tracker] = []
    for tracker in names:
        try:
            if tracker == "tensorboard":
                out.append(TensorBoardTracker(run_dir, first_step=first_step))
            elif tracker == "wandb":
                out.append(WandbTracker(run_dir, name=name, config=config, resume=resume,
                                        logged_through=logged_through))
            elif tracker == "mlflow":
                out.append(MLflowTracker(run_dir, name=name, resume=resume, logged_through=logged_through))
        except ImportError as exc:
            raise ImportError(f"trainer.report_to={tracker} needs the {tracker} package: "
                              f"pip install 'agentgym-opsd[{_EXTRAS[tracker]}]' ({exc})") from exc
        if tracker != "wandb":  # wandb took the config at init
            out[-1].log_config(config)
    return out


# ---- set-up checks: before the model loads ------------------------------------------------------------------
_WANDB_DEFAULT_MODE = "offline"  # no account, no network unless asked for
_WANDB_MODES = ("online", "offline", "shared", "disabled", "dryrun", "run")  # what wandb.init accepts


def check_trackers(names: list[str]) -> None:
    """Each tracker of `names` can start: its package is installed and the settings it reads from the environment
    (WANDB_MODE, MLFLOW_TRACKING_URI) name something it can write to. The trainer calls it before the model loads,
    so a wrong setting fails in a second instead of after the load; it creates no run and sends no data. A
    ValueError names the setting and what works instead."""
    for tracker in names:
        if importlib.util.find_spec(tracker) is None:
            raise ValueError(f"trainer.report_to={tracker} needs the {tracker} package: "
                             f"pip install 'agentgym-opsd[{_EXTRAS[tracker]}]'")
        _SETUP_CHECKS[tracker]()


def _check_wandb() -> None:
    mode = os.environ.get("WANDB_MODE", _WANDB_DEFAULT_MODE)
    if mode not in _WANDB_MODES:
        raise ValueError(f"trainer.report_to=wandb: WANDB_MODE={mode!r} is not a wandb mode; use offline (the "
                         "default: written under RUN/wandb, `wandb sync` uploads it), online or disabled")


def _check_mlflow() -> None:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return  # the run's own file store RUN/mlruns, which the tracker opts in to
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri=uri)  # builds the store: MLflow refuses a file store or an unknown scheme here
    except MlflowException as exc:
        reason = str(exc).strip().split(". ")[0].rstrip(".")
        raise ValueError(f"trainer.report_to=mlflow: MLFLOW_TRACKING_URI={uri} cannot be used ({reason}). What "
                         f"works: {_mlflow_alternatives()}") from None
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    if urllib.request.getproxies().get(parts.scheme) and not urllib.request.proxy_bypass(parts.hostname):
        return  # reached through a proxy: only MLflow's own requests can tell
    address = (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    try:  # a server that is down would otherwise show only after the load, and after minutes of MLflow's retries
        socket.create_connection(address, timeout=5.0).close()
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ValueError(f"trainer.report_to=mlflow: no MLflow server answers at MLFLOW_TRACKING_URI={uri} ({why}); "
                         f"start it (`mlflow server`), or use {_mlflow_alternatives()}") from None


def _mlflow_alternatives() -> str:
    database = "a database URI such as sqlite:///PATH/mlflow.db"
    if importlib.util.find_spec("sqlalchemy") is None:  # mlflow-skinny (the `trackers` extra) has no SQL stores
        database += " (needs the full MLflow: pip install mlflow)"
    return (f"unset MLFLOW_TRACKING_URI (the run's own store, RUN/mlruns); a tracking server "
            f"(MLFLOW_TRACKING_URI=http://HOST:5000); {database}; or, to keep a file store, "
            "MLFLOW_ALLOW_FILE_STORE=true")


_SETUP_CHECKS: dict[str, Callable[[], None]] = {
    "tensorboard": lambda: None,  # the package is all it needs
    "wandb": _check_wandb,
    "mlflow": _check_mlflow,
}
