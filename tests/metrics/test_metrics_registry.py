"""The metric registry: what the writer accepts, and how readers combine rows."""

import pytest

from fasync.metrics.registry import METRICS, UnregisteredMetric, check_row, over
from fasync.metrics.writer import MetricsWriter, read_metrics


def test_the_writer_refuses_a_key_not_registered_for_the_mode(tmp_path):
    writer = MetricsWriter(tmp_path, "sync")
    writer.write({"step": 0, "rollout": 0, "loss": 1.0})
    with pytest.raises(UnregisteredMetric, match="loss_typo"):
        writer.write({"step": 1, "loss_typo": 1.0})
    with pytest.raises(UnregisteredMetric, match="queue_size"):  # fully_async only
        writer.write({"step": 1, "queue_size": 3})
    writer.close()
    assert [row["step"] for row in read_metrics(writer.path)] == [0]
    check_row({"queue_size": 3}, "fully_async")


def test_rollout_metrics_count_once_per_rollout_and_step_metrics_every_row():
    # Two steps per rollout: trainer_wait_s repeats on both rows of a rollout, generate_time_s is on the first.
    rows = [{"rollout": r, "trainer_wait_s": 1.5, "generate_time_s": 2.0 if step == 0 else 0.0,
             "staleness_max": r + step} for r in range(3) for step in range(2)]
    assert over("trainer_wait_s", rows) == 4.5
    assert over("generate_time_s", rows) == 6.0
    assert over("staleness_max", rows) == 3
    assert over("rollouter_pause_s", rows) == 0  # a sum of nothing
    assert over("policy_lag_max", rows) is None


def test_every_metric_has_a_unit_a_meaning_and_modes():
    for name, metric in METRICS.items():
        assert metric.name == name and metric.unit and metric.meaning and metric.modes, name
        assert metric.modes <= {"sync", "async", "fully_async"}
    assert METRICS["policy_lag_max"].unit == "optimizer steps"
    assert METRICS["staleness_max"].unit == "versions"
