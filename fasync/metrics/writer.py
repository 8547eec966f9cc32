"""metrics.jsonl: one JSON object per optimizer step, flushed as it is written. Every key is one of the
metrics `fasync/metrics/registry.py` defines for the run's mode."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Sequence

from fasync.metrics.registry import check_row


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return value


class MetricsWriter:
    def __init__(self, run_dir: Path, mode: str, trackers: Sequence = ()):
        """`trackers` (fasync/metrics/trackers.py) get each row after metrics.jsonl has it, and close with it."""
        self.mode = mode
        self.trackers = list(trackers)
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        self.started = time.monotonic()
        self.history: list[dict] = []

    def write(self, record: dict) -> dict:
        record = {key: _jsonable(value) for key, value in record.items()}
        record["wall_time"] = round(time.monotonic() - self.started, 4)
        check_row(record, self.mode)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self.history.append(record)
        for tracker in self.trackers:
            tracker.log(record)
        return record

    def close(self) -> None:
        self._file.close()
        for tracker in self.trackers:
            tracker.close()


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
