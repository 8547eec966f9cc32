"""samples.jsonl: generations a user can read. Every `logging.samples_every` optimizer steps, the rollout's
(drain's) `logging.samples_per_write` generations, spread over its prompt groups, are appended one per line, and
sent to the trackers (a W&B table, TensorBoard text, an MLflow artifact).

A line: the optimizer `step` and `rollout` it was trained in, the `group` id, `prompt`, `completion`, `reward`,
`label`, `finish_reason`, the weight `version` that generated it (the oldest, for a partial rollout) and its
`staleness` at the version it was trained at. A resumed run appends: steps it trains again appear again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from fasync.atomic import JsonlAppender

FIELDS = ("step", "rollout", "group", "prompt", "completion", "reward", "label", "finish_reason", "version",
          "staleness")
"""The keys of a samples.jsonl line, in order (the trackers' table columns)."""


def pick(groups: Sequence, count: int) -> list[tuple]:
    """`count` (group, sample) pairs spread over the groups: each group's first sample, then each one's second,
    and so on."""
    picked = []
    depth = 0
    while len(picked) < count and any(depth < len(group.samples) for group in groups):
        picked += [(group, group.samples[depth]) for group in groups if depth < len(group.samples)]
        depth += 1
    return picked[:count]


def sample_rows(groups: Sequence, count: int, step: int, rollout: int, version: int) -> list[dict]:
    """samples.jsonl lines for `count` of the groups' samples, trained at `version` in `step` of `rollout`."""
    return [{"step": step, "rollout": rollout, "group": str(group.group_id), "prompt": group.prompt,
             "completion": sample.completion, "reward": sample.reward, "label": sample.label,
             "finish_reason": sample.finish_reason, "version": sample.oldest_version,
             "staleness": sample.staleness(version)}
            for group, sample in pick(groups, count)]


class SampleLog:
    """Writes samples.jsonl and hands the same lines to the `trackers`; `every` 0 writes nothing."""

    def __init__(self, run_dir: Path, every: int, count: int, trackers: Sequence = ()):
        self.every = every
        self.count = count
        self.trackers = list(trackers)
        self.path = Path(run_dir) / "samples.jsonl"
        self._file: JsonlAppender | None = None
        self._step = 0
        self.latest: dict | None = None
        """The last line written (the live display shows it at --verbose)."""

    def start(self, step: int) -> None:
        """Count the interval from optimizer `step` (0, or where a resumed run goes on)."""
        self._step = step

    def due(self, step: int) -> bool:
        """Whether `step` passed another multiple of `every` since the last write."""
        return bool(self.every) and step // self.every > self._step // self.every

    def after_rollout(self, step: int, rollout: int, version: int, groups: Sequence) -> list[dict]:
        """The rollout's samples when `step` passed another multiple of `every`, written; else none."""
        if not self.due(step):
            return []
        self._step = step
        rows = sample_rows(groups, self.count, step - 1, rollout, version)
        if self._file is None:
            self._file = JsonlAppender(self.path)
        for row in rows:
            self._file.append(row)
        for tracker in self.trackers:
            tracker.log_samples(step - 1, rows)
        self.latest = rows[-1] if rows else self.latest
        return rows

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
