"""Step records: the row every optimizer step writes to metrics.jsonl (each key defined in
`fasync.metrics.registry`), built from what the trainer returned (`StepRecords`) and written with the run's
throughput, its ledger's balance and the learning-signal streaks (`StepLog`).

A step whose loss or gradient was NaN or inf is skipped by the trainer; `BadSteps` counts them in a row, so
that the run stops at `train.max_bad_steps` instead of training on.
"""

from __future__ import annotations

import time
from collections import deque

from fasync.errors import TooManyBadSteps
from fasync.metrics.ledger import Ledger
from fasync.metrics.progress import Progress
from fasync.metrics.signal import LearningSignal
from fasync.metrics.writer import MetricsWriter
from fasync.staleness import VersionClock

REWARD_WINDOW = 3
"""Rollouts averaged for `train.target_reward` early stopping."""


def trained_samples(records: list[dict]) -> int:
    """Samples a rollout's steps trained on, each once: with `train.ppo_epochs` above 1 only the first pass counts."""
    return sum(record["num_samples"] for record in records if record.get("epoch", 0) == 0)


class StepRecords:
    """The optimizer steps taken, the mean reward of the last `REWARD_WINDOW` rollouts, and each step's record."""

    def __init__(self) -> None:
        self.step = 0
        self.recent_rewards: deque[float] = deque(maxlen=REWARD_WINDOW)

    def of_rollout(self, rollout: int, version: int, clock: VersionClock, batch, steps: list[dict],
                   train_time: float, extra: dict | None = None) -> list[dict]:
        """The records of the trainer's `steps` on one rollout (or drain) `batch`, trained at `version` in
        `train_time` seconds; counts the steps. What the records say about the batch as a whole comes from its
        `figures` (`fasync.metrics.batch.BatchFigures`)."""
        figures = batch.figures
        self.recent_rewards.append(figures.reward_mean)
        records = []
        for index, step in enumerate(steps):
            record = {
                "step": self.step,
                "rollout": rollout,
                "weight_version": version,
                "generate_time_s": batch.generate_time_s if index == 0 else 0.0,
                "weight_sync_time_s": 0.0,
                # The trainer's core is held for the whole call, the samples' transfer included.
                "train_call_time_s": train_time / len(steps),
                "rollout_reward_mean": self.recent_rewards[-1],
                **({} if batch.rounds is None else {"sampling_rounds": batch.rounds}),
                **{f"dropped_{reason}": count for reason, count in batch.drops.items()},
                **figures.stats,
                **(extra or {}),
                **step,
                # The step's oldest sample came from version `weight_version − staleness_max`.
                "policy_lag_max": clock.lag_steps(self.step, version - step["staleness_max"]),
            }
            record.setdefault("train_time_s", train_time / len(steps))
            self.step += 1
            records.append(record)
        return records


class BadSteps:
    """Optimizer steps skipped in a row for a NaN or inf loss or gradient."""

    def __init__(self) -> None:
        self.in_a_row = 0

    def count(self, record: dict) -> None:
        if record.get("nonfinite_skipped"):
            self.in_a_row += 1
        elif not record.get("skipped"):
            self.in_a_row = 0


class StepLog:
    """Writes each rollout's (drain's) records to metrics.jsonl and the live display, with the throughput since
    the previous rollout, the learning-signal streaks and their warnings, and a warning for a skipped step."""

    def __init__(self, writer: MetricsWriter, progress: Progress, max_bad_steps: int):
        self.writer = writer
        self.progress = progress
        self.max_bad_steps = max_bad_steps
        self.signal = LearningSignal()
        self.bad_steps = BadSteps()
        self._last_write = time.monotonic()

    def write(self, records: list[dict], weight_sync_time_s: float, ledger: Ledger) -> None:
        """Write the records, each with whether the run's `ledger` balances; then raise TooManyBadSteps once a run
        of skipped steps reached `train.max_bad_steps`."""
        if records:
            records[-1]["weight_sync_time_s"] = weight_sync_time_s
        now = time.monotonic()
        tokens = sum(r.get("num_tokens", 0) for r in records)
        samples = sum(r.get("num_samples", 0) for r in records)
        elapsed = max(now - self._last_write, 1e-9)
        self._last_write = now
        too_many = None
        for record in records:
            self.bad_steps.count(record)
            if self.bad_steps.in_a_row >= self.max_bad_steps:
                too_many = (self.bad_steps.in_a_row, record["step"])
            record["tokens_per_s"] = tokens / elapsed
            record["samples_per_s"] = samples / elapsed
            record["ledger_balanced"] = ledger.balanced
            warnings = self.signal.observe(record)
            self.progress.update(self.writer.write(record))
            for warning in warnings:
                self.progress.message(f"warning: {warning}")
            if record.get("skipped"):
                self.progress.message(f"warning: step {record['step']} took no optimizer step: {record['skip_reason']}")
        if too_many is not None:
            raise TooManyBadSteps(
                f"{too_many[0]} optimizer steps in a row had a NaN or inf loss or gradient and were skipped (the "
                f"last at step {too_many[1]}; train.max_bad_steps: {self.max_bad_steps}): the run stops without "
                "saving these weights")
