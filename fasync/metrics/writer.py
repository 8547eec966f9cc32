"""metrics.jsonl: one JSON object per optimizer step, each line written whole and flushed
(`fasync.atomic.JsonlAppender`). Every key is one of the metrics `fasync/metrics/registry.py` defines for the
run's mode.

A resumed run cuts the file back to its checkpoint (the steps after it, which the resume trains again, are
kept in metrics.jsonl.rolled-back) and appends a marker line `{"resume": {...}}` before its own steps, so that
the file's steps run on without a gap or a repeat.

`read_metrics_log` is the one reader of the file: `fasync report`, `fasync bench`, `fasync simulate --calibrate`
and a resuming run all read it so, and get the step rows without the markers."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from fasync.atomic import DamagedFileError, JsonlAppender, read_jsonl_lines
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
        self._file = JsonlAppender(self.path)
        self.started = time.monotonic()
        self.history: list[dict] = []
        """Every step's row of the run, earlier processes' included after a resume."""

    def write(self, record: dict) -> dict:
        record = {key: _jsonable(value) for key, value in record.items()}
        record["wall_time"] = round(self.elapsed, 4)
        check_row(record, self.mode)
        self._file.append(record)
        self.history.append(record)
        for tracker in self.trackers:
            tracker.log(record)
        return record

    @property
    def elapsed(self) -> float:
        """Seconds of the run so far, over all its processes (`wall_time`)."""
        return time.monotonic() - self.started

    @property
    def size(self) -> int:
        return self._file.size

    def resume(self, size: int, wall_time: float, marker: dict) -> None:
        """Go back to a checkpoint taken when the file was `size` bytes long and the run `wall_time` s old."""
        self._file.rewind(size)
        self.history = read_metrics(self.path)
        self.started = time.monotonic() - wall_time
        self._file.append({"resume": {**marker, "wall_time": round(wall_time, 4)}})

    def close(self, outcome: str = "finished") -> None:
        """Close metrics.jsonl and end the trackers' runs with the run's `outcome`."""
        self._file.close()
        for tracker in self.trackers:
            tracker.close(outcome)


REQUIRED = ("step", "rollout", "wall_time")
"""Keys every step row has: where it sits and when it was written."""


@dataclass
class MetricsLog:
    rows: list[dict]
    """The step rows, in file order."""
    resumes: list[dict]
    """The resume markers' contents, in file order: one per resume of the run."""


def read_metrics_log(path: Path, cut_last_line: Literal["skip", "refuse"] = "skip") -> MetricsLog:
    """The step rows and resume markers of a metrics.jsonl. A last line a crash cut short is skipped or refused
    (`cut_last_line`); any other line that is not a step row or a marker is a DamagedFileError naming the file
    and line."""
    rows, resumes = [], []
    for number, value in read_jsonl_lines(path, cut_last_line):
        if not isinstance(value, dict):
            raise DamagedFileError(f"{path}:{number}: a metrics row must be a JSON object, not "
                                   f"{type(value).__name__}; fasync writes one object per optimizer step")
        if isinstance(value.get("resume"), dict):
            resumes.append(value["resume"])
            continue
        missing = [key for key in REQUIRED if not isinstance(value.get(key), (int, float))]
        if missing:
            raise DamagedFileError(f"{path}:{number}: the row has no numeric {', '.join(missing)}; is this a "
                                   "metrics.jsonl written by `fasync train`?")
        rows.append(value)
    return MetricsLog(rows, resumes)


def read_metrics(path: Path) -> list[dict]:
    """The step rows of a metrics.jsonl (`read_metrics_log`), a last line a crash cut short left out."""
    return read_metrics_log(path).rows
