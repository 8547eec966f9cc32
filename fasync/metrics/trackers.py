"""Experiment trackers: each metrics row also goes to TensorBoard, Weights & Biases or MLflow
(`logging.backends`), under the metric registry's names, with its units.

metrics.jsonl is always written and stays the record of the run; a tracker is a copy for the tools users
already watch. Each tracker's package is an optional extra and is imported only when a run asks for it;
`fasync check` reports a requested one that is not installed (`missing`, code E007) without importing
anything, so the check path stays light.

A tracker that fails in the middle of a run (a network error, a full disk) is switched off with one
message; training and metrics.jsonl go on.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from fasync.errors import ConfigurationError
from fasync.metrics.registry import METRICS, metric_for

DEFAULT_EXPERIMENT = "fasync"


@dataclass(frozen=True)
class Backend:
    module: str
    """The package's import name, looked up with importlib.util.find_spec (never imported by the check)."""
    extra: str
    """fasync's optional extra that installs it."""

    @property
    def install(self) -> str:
        return f"pip install 'fasync[{self.extra}]'"


BACKENDS: dict[str, Backend] = {
    "tensorboard": Backend("tensorboard", "tensorboard"),
    "wandb": Backend("wandb", "wandb"),
    "mlflow": Backend("mlflow", "mlflow"),
}
"""Every `logging.backends` value besides `jsonl`."""


def missing(backends: list[str]) -> list[str]:
    """The requested trackers whose package is not installed, found without importing anything."""
    return [name for name in dict.fromkeys(backends)
            if name in BACKENDS and importlib.util.find_spec(BACKENDS[name].module) is None]


def scalars(row: dict) -> dict[str, float]:
    """The row's numeric metrics (bools as 0/1), by registry name; text and missing values left out."""
    out = {}
    for name, value in row.items():
        metric = metric_for(name)
        if metric is None or metric.unit == "text" or value is None or isinstance(value, str):
            continue
        out[name] = float(value)
    return out


def units() -> dict[str, str]:
    """Every numeric metric's unit, as the registry defines it."""
    return {name: metric.unit for name, metric in METRICS.items() if metric.unit != "text"}


def flat_config(config: dict, prefix: str = "") -> dict[str, object]:
    """A nested config as dotted keys, the way fasync's overrides name them."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class Tracker:
    """One tracker of a run. `log` sends a row and switches the tracker off on its first failure."""

    name = ""

    def __init__(self) -> None:
        self.failed = False

    def log(self, row: dict) -> None:
        if not self.failed:
            self._guarded(f"at step {row.get('step')}", self.send, int(row["step"]), scalars(row))

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """Send samples.jsonl's lines of optimizer `step` (`fasync.metrics.samples`)."""
        if not self.failed:
            self._guarded(f"sending the samples of step {step}", self.send_samples, step, rows)

    def close(self, outcome: str = "finished") -> None:
        """End the tracker's run, marked with the run's `outcome` (summary.json's: finished, failed,
        interrupted, terminated), so that a failed run does not show as a finished one in the tracker."""
        if not self.failed:
            self._guarded("when closing", self.end, outcome)

    def _guarded(self, when: str, call, *args) -> None:
        try:
            call(*args)
        except Exception as error:  # noqa: BLE001 - a tracker must never stop the training it watches
            self.failed = True
            print(f"fasync: the {self.name} tracker failed {when} ({type(error).__name__}: {error}); it is off for "
                  "the rest of the run, metrics.jsonl goes on", file=sys.stderr, flush=True)

    def send(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def send_samples(self, step: int, rows: list[dict]) -> None:
        raise NotImplementedError

    def end(self, outcome: str) -> None:
        """Flush and end the tracker's run."""


def samples_markdown(rows: list[dict]) -> str:
    """samples.jsonl's lines as a Markdown table (TensorBoard renders its text as Markdown)."""
    from fasync.metrics.samples import FIELDS

    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(FIELDS) + " |", "|" + "---|" * len(FIELDS)]
    lines += ["| " + " | ".join(cell(row[field]) for field in FIELDS) + " |" for row in rows]
    return "\n".join(lines)


class TensorBoardTracker(Tracker):
    """Event files in <run_dir>/tensorboard, written with TensorBoard's own writer (no TensorFlow needed).
    Each tag's first value carries the metric's meaning and unit as its description."""

    name = "tensorboard"

    def __init__(self, run_dir: Path):
        super().__init__()
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.scalar import metadata
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary, self._metadata = event_pb2.Event, summary_pb2.Summary, metadata
        self.logdir = run_dir / "tensorboard"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.logdir))
        self._described: set[str] = set()

    def _value(self, name: str, value: float):
        entry = self._summary.Value(tag=name, simple_value=value)
        if name not in self._described:
            metric = metric_for(name)
            entry.metadata.CopyFrom(self._metadata.create_summary_metadata(
                display_name=name, description=f"{metric.meaning} (unit: {metric.unit})"))
            self._described.add(name)
        return entry

    def send(self, step: int, values: dict[str, float]) -> None:
        summary = self._summary(value=[self._value(name, value) for name, value in values.items()])
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=summary))
        self._writer.flush()

    def send_samples(self, step: int, rows: list[dict]) -> None:
        """A text summary under the tag `samples`: the lines as a Markdown table."""
        from tensorboard.plugins.text.summary_v2 import text_pb

        summary = text_pb("samples", samples_markdown(rows), "generations of the step (samples.jsonl)")
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=summary))
        self._writer.flush()

    def end(self, outcome: str) -> None:
        self._writer.close()


class WandbTracker(Tracker):
    """A W&B run named after the run directory, its files under <run_dir>/wandb; the resolved config is its
    config, and `metric_units` in it gives each metric's unit. Rows are logged at their optimizer step."""

    name = "wandb"

    def __init__(self, run_dir: Path, config: dict, experiment: str, mode: Optional[str]):
        super().__init__()
        import wandb

        self._run = wandb.init(project=experiment, name=run_dir.name, dir=str(run_dir), mode=mode,
                               config={**config, "metric_units": units()},
                               settings=wandb.Settings(console="off"))

    def send(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def send_samples(self, step: int, rows: list[dict]) -> None:
        """A W&B table under the key `samples`, its columns samples.jsonl's keys."""
        import wandb

        from fasync.metrics.samples import FIELDS

        table = wandb.Table(columns=list(FIELDS), data=[[row[field] for field in FIELDS] for row in rows])
        self._run.log({"samples": table}, step=step)

    def end(self, outcome: str) -> None:
        # W&B reads a non-zero exit code as a failed run (its "crashed"/"failed" state).
        self._run.finish(exit_code=0 if outcome == "finished" else 1)


class MlflowTracker(Tracker):
    """An MLflow run named after the run directory in experiment `experiment`; the resolved config as its
    params (dotted keys), the units as the artifact metric_units.json, one batch of metrics per row."""

    name = "mlflow"

    def __init__(self, run_dir: Path, config: dict, experiment: str, tracking_uri: Optional[str]):
        super().__init__()
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:
            # The run's own file store. MLflow 3 asks for this opt-in for file stores; the SQL store it
            # prefers needs the full `mlflow` package rather than the `mlflow-skinny` the extra installs.
            uri = (run_dir / "mlruns").absolute().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._metric, self.tracking_uri = Metric, uri
        self._client = MlflowClient(tracking_uri=uri)
        found = self._client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self._client.create_experiment(experiment)
        self.run_id = self._client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        params = [Param(key, str(value)) for key, value in flat_config(config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self._client.log_batch(self.run_id, params=params[start:start + 100])
        self._client.log_dict(self.run_id, units(), "metric_units.json")

    def send(self, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[self._metric(name, value, now, step)
                                                     for name, value in values.items()])

    def send_samples(self, step: int, rows: list[dict]) -> None:
        """The artifact samples/step_<step>.jsonl: samples.jsonl's lines of the step."""
        import json

        self._client.log_text(self.run_id, "".join(json.dumps(row) + "\n" for row in rows),
                              f"samples/step_{step:06d}.jsonl")

    def end(self, outcome: str) -> None:
        self._client.set_terminated(self.run_id, status=MLFLOW_STATUS.get(outcome, "FAILED"))


MLFLOW_STATUS = {"finished": "FINISHED", "interrupted": "KILLED", "terminated": "KILLED", "failed": "FAILED"}
"""A run's outcome as MLflow's run status (a stopped run is KILLED: stopped from outside, not broken)."""

START_HINTS = {
    "tensorboard": "check that the run directory is writable",
    "wandb": "log in with `wandb login` (or set WANDB_API_KEY), or set `logging.wandb_mode: offline`",
    "mlflow": "check `logging.mlflow_tracking_uri` (or MLFLOW_TRACKING_URI), or leave both unset for a file store "
              "in the run directory",
}


class TrackerError(ConfigurationError):
    """A tracker the config asks for did not start; the message names it and says what to change."""


def open_trackers(logging, run_dir: Path, config: dict) -> list[Tracker]:
    """The trackers `logging.backends` asks for (a `LoggingConfig`), each started for this run; `config` is
    the resolved config they record. Raises TrackerError, before any step, for one that cannot start."""
    experiment = logging.experiment or DEFAULT_EXPERIMENT
    run_dir = Path(run_dir)
    starts = {
        "tensorboard": lambda: TensorBoardTracker(run_dir),
        "wandb": lambda: WandbTracker(run_dir, config, experiment, logging.wandb_mode),
        "mlflow": lambda: MlflowTracker(run_dir, config, experiment, logging.mlflow_tracking_uri),
    }
    opened: list[Tracker] = []
    for name in dict.fromkeys(logging.backends):
        if name not in starts:
            continue  # jsonl: the writer itself
        try:
            opened.append(starts[name]())
        except Exception as error:  # noqa: BLE001 - whatever the tracker's library raises, said in one line
            for tracker in opened:
                tracker.close()
            raise TrackerError(f"`logging.backends`: the {name} tracker did not start ({type(error).__name__}: "
                               f"{error}); {START_HINTS[name]}") from error
    return opened
