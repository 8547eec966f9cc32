"""What a rollout's (drain's) step records say about its samples as a whole, computed once where the samples are:
in the driver's process in sync and async, in the rollouter in fully_async, whose drains go to the trainer without
passing through the driver (`fasync.drivers.fully_async`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fasync.metrics.agentic import agentic_stats
from fasync.staleness import version_stats


@dataclass(frozen=True)
class BatchFigures:
    num_samples: int
    reward_mean: float
    """The mean reward of the batch's samples (0 for none): what `train.target_reward` averages."""
    stats: dict
    """The records' keys that describe the batch: `version_stats`, and `agentic_stats` for agentic rollouts."""

    @classmethod
    def of(cls, groups: Sequence) -> "BatchFigures":
        samples = [sample for group in groups for sample in group.samples]
        spans = [sample.version_span for sample in samples]
        return cls(len(samples), sum(sample.reward for sample in samples) / max(len(samples), 1),
                   {**version_stats(spans), **agentic_stats(groups, spans)})
