"""Trackers (`logging.backends`): what each wrote is read back with the tool's own reader, a tracker that
fails is switched off without stopping the run, and a tracker whose package is missing is a `fasync check`
finding (E007) with the install command, not a failure at step 1."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fasync.cli import app
from fasync.metrics import trackers
from fasync.metrics.registry import METRICS
from fasync.metrics.trackers import BACKENDS, Backend, Tracker, scalars, units
from fasync.metrics.writer import MetricsWriter

runner = CliRunner()
CONFIG = {"train": {"lr": 0.002, "num_rollouts": 3}, "mode": "sync"}


def rows() -> list[dict]:
    return [{"step": step, "rollout": step, "weight_version": step, "reward_mean": 0.25 * step,
             "is/kl_k3": 0.01 * (step + 1), "staleness_max": 0, "num_samples": 16, "skipped": step == 1,
             "skip_reason": "every token rejected" if step == 1 else None} for step in range(3)]


def write_rows(run_dir: Path, tracker: Tracker, outcome: str = "finished") -> list[dict]:
    writer = MetricsWriter(run_dir, "sync", [tracker])
    written = [writer.write(row) for row in rows()]
    writer.close(outcome)
    return written


def test_a_row_goes_out_as_numbers_under_the_registry_names():
    row = rows()[1]
    assert scalars(row) == {"step": 1.0, "rollout": 1.0, "weight_version": 1.0, "reward_mean": 0.25,
                            "is/kl_k3": 0.02, "staleness_max": 0.0, "num_samples": 16.0, "skipped": 1.0}
    assert units()["is/kl_k3"] == "nats/token" and "skip_reason" not in units()


def test_tensorboard_events_read_back_with_tensorboards_reader(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_rows(tmp_path, trackers.TensorBoardTracker(tmp_path))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"reward_mean", "is/kl_k3", "skipped", "wall_time"} <= set(tags) and "skip_reason" not in tags
    assert [(e.step, e.value) for e in events.Scalars("reward_mean")] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    # TensorBoard stores scalars as fp32: one rounding (2**-24 relative), inside approx's rel=1e-6.
    assert [e.value for e in events.Scalars("is/kl_k3")] == pytest.approx([0.01, 0.02, 0.03])
    assert [e.value for e in events.Scalars("skipped")] == [0.0, 1.0, 0.0]
    described = events.SummaryMetadata("is/kl_k3").summary_description
    assert METRICS["is/kl_k3"].meaning in described and "(unit: nats/token)" in described


def wandb_records(path: Path):
    """The records of a W&B transaction log (.wandb), parsed with W&B's own protobuf schema. The framing is
    LevelDB's log format (a 7-byte file header, 32 KiB blocks, records split into FULL/FIRST/MIDDLE/LAST
    chunks); wandb 0.2x's Python reader for it was removed when the Go core took over writing."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    block, offset, pending = 32768, 7, b""
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # a block's tail too short for a chunk header is padding
            offset += block - offset % block
            continue
        _, length, kind = struct.unpack("<IHB", data[offset:offset + 7])
        if kind == 0 or offset + 7 + length > len(data):  # the end, or a chunk still being written
            break
        chunk = data[offset + 7:offset + 7 + length]
        offset += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def finished_wandb_log(run_dir: Path) -> list:
    """The records of the run's offline log once W&B's core process has written its exit record (`finish`
    returns while the core may still be flushing)."""
    deadline = time.monotonic() + 60
    while True:
        logs = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
        records = list(wandb_records(logs[0])) if len(logs) == 1 else []
        if any(record.WhichOneof("record_type") == "exit" for record in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def test_wandb_offline_run_reads_back(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    write_rows(tmp_path, trackers.WandbTracker(tmp_path, CONFIG, "fasync-test", "offline"))
    history, config = [], {}
    for record in finished_wandb_log(tmp_path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
        elif kind == "run":
            assert record.run.display_name == tmp_path.name and record.run.project == "fasync-test"
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
    assert [(row["_step"], row["reward_mean"], row["is/kl_k3"]) for row in history] == \
        [(0, 0.0, 0.01), (1, 0.25, 0.02), (2, 0.5, 0.03)]
    assert all("skip_reason" not in row for row in history)
    assert config["train"]["lr"] == 0.002 and config["mode"] == "sync"
    assert config["metric_units"]["policy_lag_max"] == "optimizer steps"


def test_mlflow_file_store_reads_back(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = trackers.MlflowTracker(tmp_path, CONFIG, "fasync-test", None)
    assert tracker.tracking_uri == (tmp_path / "mlruns").as_uri()
    write_rows(tmp_path, tracker)
    client = MlflowClient(tracking_uri=tracker.tracking_uri)
    run = client.get_run(tracker.run_id)
    assert run.info.run_name == tmp_path.name and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "fasync-test"
    assert [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, "reward_mean")] == \
        [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert [m.value for m in client.get_metric_history(tracker.run_id, "is/kl_k3")] == pytest.approx([0.01, 0.02, 0.03])
    assert client.get_metric_history(tracker.run_id, "skip_reason") == []
    assert run.data.params["train.lr"] == "0.002" and run.data.params["mode"] == "sync"
    saved = Path(client.download_artifacts(tracker.run_id, "metric_units.json", str(tmp_path / "artifacts")))
    assert json.loads(saved.read_text())["is/ess_token"] == "fraction"


@pytest.mark.parametrize(("outcome", "status"), [("failed", "FAILED"), ("interrupted", "KILLED"),
                                                 ("terminated", "KILLED")])
def test_mlflow_run_ends_with_the_runs_outcome(tmp_path, monkeypatch, outcome, status):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = trackers.MlflowTracker(tmp_path, CONFIG, "fasync-test", None)
    write_rows(tmp_path, tracker, outcome)
    assert MlflowClient(tracking_uri=tracker.tracking_uri).get_run(tracker.run_id).info.status == status


@pytest.mark.parametrize(("outcome", "exit_code"), [("finished", 0), ("failed", 1)])
def test_wandb_run_exits_with_the_runs_outcome(tmp_path, monkeypatch, outcome, exit_code):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    write_rows(tmp_path, trackers.WandbTracker(tmp_path, CONFIG, "fasync-test", "offline"), outcome)
    exits = [record.exit for record in finished_wandb_log(tmp_path) if record.WhichOneof("record_type") == "exit"]
    assert [record.exit_code for record in exits] == [exit_code]


class Failing(Tracker):
    name = "failing"

    def __init__(self):
        super().__init__()
        self.sent = []

    def send(self, step, values):
        self.sent.append(step)
        if step == 1:
            raise ConnectionError("no route to host")


def test_a_failing_tracker_is_switched_off_and_the_run_goes_on(tmp_path, capsys):
    failing = Failing()
    written = write_rows(tmp_path, failing)
    assert failing.sent == [0, 1] and failing.failed
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == \
        [row["step"] for row in written] == [0, 1, 2]
    assert "the failing tracker failed at step 1 (ConnectionError: no route to host); it is off" in \
        capsys.readouterr().err


def config_file(tmp_path: Path, backends: list[str], **logging) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"mode": "sync", "logging": {"progress": "none", "backends": backends, **logging}},
                                   sort_keys=False))
    return path


@pytest.fixture
def wandb_not_installed(monkeypatch):
    monkeypatch.setitem(BACKENDS, "wandb", Backend("fasync_no_such_package", "wandb"))


def test_check_names_a_missing_tracker_package_with_its_install_command(tmp_path, wandb_not_installed):
    config = config_file(tmp_path, ["jsonl", "tensorboard", "wandb"])
    result = runner.invoke(app, ["check", str(config)])
    assert result.exit_code == 1, result.output
    line = next(n for n, text in enumerate(config.read_text().splitlines(), 1) if text.lstrip().startswith("backends:"))
    assert f"{config}:{line}" in result.output and "E007" in result.output
    assert "asks for wandb, but the `fasync_no_such_package` package is not installed" in result.output
    assert "pip install 'fasync[wandb]'" in result.output
    assert runner.invoke(app, ["check", "--ignore", "E007", str(config)]).exit_code == 0
    assert runner.invoke(app, ["check", str(config), "lint.ignore=[E007]"]).exit_code == 0
    assert runner.invoke(app, ["check", str(config), "logging.backends=[jsonl]"]).exit_code == 0


def test_train_refuses_a_missing_tracker_before_anything_starts(tmp_path, wandb_not_installed):
    from fasync.commands.train import run as train

    config = config_file(tmp_path, ["wandb"])
    assert train(str(config), run_dir=str(tmp_path / "out")) == 1
    assert not (tmp_path / "out").exists()


def test_an_unknown_backend_is_a_load_problem_at_its_line(tmp_path):
    config = config_file(tmp_path, ["jsonl", "neptune"])
    result = runner.invoke(app, ["check", str(config)])
    assert result.exit_code == 1 and "neptune" in result.output and "Traceback" not in result.output


@pytest.mark.ray
@pytest.mark.slow
def test_a_training_run_logs_every_row_to_every_tracker(ray_session, tmp_path, monkeypatch):
    """The driver wires the trackers: a short real run, its metrics.jsonl and what each tracker holds agree;
    `fasync report` reads the same run."""
    for package in ("tensorboard", "wandb", "mlflow"):
        pytest.importorskip(package)
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fasync.commands.train import run as train

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "mode": "sync",
        "model": {"n_layers": 1, "d_model": 32, "n_heads": 2, "max_seq_len": 16},
        "data": {"task": "reverse", "length": 2},
        "rollout": {"batch_size": 4, "n_samples_per_prompt": 4, "max_new_tokens": 2},
        "train": {"global_batch_size": 16, "micro_batch_size": 16, "num_rollouts": 3},
        "logging": {"progress": "none", "backends": ["jsonl", "tensorboard", "wandb", "mlflow"],
                    "wandb_mode": "offline", "experiment": "fasync-e2e"},
    }))
    out = tmp_path / "out"
    assert train(str(config), run_dir=str(out)) == 0
    written = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(written) == 3
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    # fp32 in TensorBoard (one rounding), float64 in metrics.jsonl: approx's rel=1e-6 holds the difference.
    assert [e.value for e in events.Scalars("reward_mean")] == pytest.approx([r["reward_mean"] for r in written])
    logged = [record for record in finished_wandb_log(out) if record.WhichOneof("record_type") == "history"]
    assert len(logged) == 3
    client = MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("fasync-e2e").experiment_id])
    assert run.info.run_name == "out"
    assert [m.value for m in client.get_metric_history(run.info.run_id, "policy_lag_max")] == \
        [r["policy_lag_max"] for r in written]

    # The same run through `fasync report`: its table agrees with the run's own summary.json.
    from fasync.report import SUMMARY, load_runs, summary_rows, write_report

    assert write_report([out], tmp_path / "report").is_file()
    table = dict(zip(SUMMARY, summary_rows(load_runs([out]))[0]))
    summary = json.loads((out / "summary.json").read_text())
    assert table["optimizer steps"] == summary["optimizer_steps"] == 3 and table["mode"] == summary["mode"]
    assert table["final reward"] == summary["final_rollout_reward_mean"]
    assert table["best reward"] == summary["best_rollout_reward_mean"]
    assert table["staleness max (versions)"] == summary["staleness_max"] == 0
    assert table["policy lag max (optimizer steps)"] == summary["policy_lag_max"]


def test_a_tracker_that_cannot_start_is_one_message_with_a_hint(tmp_path, monkeypatch):
    from fasync.config.schema import LoggingConfig

    pytest.importorskip("tensorboard")
    closed = []
    monkeypatch.setattr(trackers.TensorBoardTracker, "end", lambda self, outcome: closed.append(self.name))

    def refuse(*args):
        raise RuntimeError("api_key not configured (no-tty)")

    monkeypatch.setattr(trackers, "WandbTracker", refuse)
    logging = LoggingConfig(backends=["jsonl", "tensorboard", "wandb"])
    with pytest.raises(trackers.TrackerError) as raised:
        trackers.open_trackers(logging, tmp_path, CONFIG)
    assert str(raised.value) == ("`logging.backends`: the wandb tracker did not start (RuntimeError: api_key not "
                                 "configured (no-tty)); log in with `wandb login` (or set WANDB_API_KEY), or set "
                                 "`logging.wandb_mode: offline`")
    assert closed == ["tensorboard"]  # the one already started is closed again


SAMPLES = [{"step": 1, "rollout": 0, "group": "3.0", "prompt": "123=", "completion": "321", "reward": 1.0,
            "label": "321", "finish_reason": "stop", "version": 0, "staleness": 1},
           {"step": 1, "rollout": 0, "group": "4.0", "prompt": "4|5=", "completion": "5\n4", "reward": 0.0,
            "label": "5|4", "finish_reason": "length", "version": 1, "staleness": 0}]
"""samples.jsonl lines (fasync.metrics.samples), one with the characters a Markdown table must escape."""


def write_rows_and_samples(run_dir: Path, tracker: Tracker) -> None:
    writer = MetricsWriter(run_dir, "sync", [tracker])
    writer.write(rows()[0])
    writer.write(rows()[1])
    tracker.log_samples(1, SAMPLES)
    writer.write(rows()[2])
    writer.close()


def test_tensorboard_samples_read_back_as_text(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_rows_and_samples(tmp_path, trackers.TensorBoardTracker(tmp_path))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    [event] = events.Tensors("samples")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 1 and events.SummaryMetadata("samples").plugin_data.plugin_name == "text"
    header, rule, first, second = text.split("\n")
    assert header == "| step | rollout | group | prompt | completion | reward | label | finish_reason | version | " \
                     "staleness |"
    assert first == "| 1 | 0 | 3.0 | 123= | 321 | 1.0 | 321 | stop | 0 | 1 |"
    assert second == "| 1 | 0 | 4.0 | 4\\|5= | 5<br>4 | 0.0 | 5\\|4 | length | 1 | 0 |"


def test_wandb_samples_read_back_as_a_table(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    write_rows_and_samples(tmp_path, trackers.WandbTracker(tmp_path, CONFIG, "fasync-test", "offline"))
    # A table goes into the history as nested keys (samples/_type, samples/path, ...) at its step.
    history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
               for record in finished_wandb_log(tmp_path) if record.WhichOneof("record_type") == "history"]
    tables = [(row["_step"], row["samples/path"]) for row in history if row.get("samples/_type") == "table-file"]
    assert len(tables) == 1 and tables[0][0] == 1
    [files] = list(tmp_path.glob("wandb/offline-run-*/files"))
    table = json.loads((files / tables[0][1]).read_text())
    assert table["columns"] == list(SAMPLES[0])
    assert [dict(zip(table["columns"], row)) for row in table["data"]] == SAMPLES


def test_mlflow_samples_read_back_as_an_artifact(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = trackers.MlflowTracker(tmp_path, CONFIG, "fasync-test", None)
    write_rows_and_samples(tmp_path, tracker)
    client = MlflowClient(tracking_uri=tracker.tracking_uri)
    saved = Path(client.download_artifacts(tracker.run_id, "samples/step_000001.jsonl", str(tmp_path / "artifacts")))
    assert [json.loads(line) for line in saved.read_text().splitlines()] == SAMPLES
