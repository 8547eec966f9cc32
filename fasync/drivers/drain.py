"""A fully_async drain as the driver holds it. Its own module because `Run.train_batch` (drivers/common.py) takes it
as it takes a `RolloutBatch`, and the fully_async driver, which makes it, builds on `Run`."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import cached_property

import ray

from fasync.metrics.batch import BatchFigures
from fasync.rollout.groups import PromptGroup
from fasync.rollout.rollouter import DrainSummary
from fasync.wire import unpack


class Drain:
    """A drain as the driver holds it: its `DrainSummary`, and a reference to its samples, which the rollouter
    stored as their own object and the trainer's call fetches (`trainer_samples`). The driver reads them only
    where something asks for its `groups` (samples.jsonl, the --verbose display)."""

    generate_time_s = 0.0
    """The engines' time is the rollouter's to add up (`add_rollouter_figures`)."""
    rounds = None
    """fully_async streams: no sampling rounds."""

    def __init__(self, summary: DrainSummary, samples_ref):
        self.summary = summary
        self.trainer_samples = samples_ref
        self.drops = Counter()
        """The rollouter counts its drops (`add_rollouter_figures`)."""

    @property
    def figures(self) -> BatchFigures:
        return self.summary.figures

    @property
    def group_ids(self) -> list:
        return [group.group_id for group in self.summary.groups]

    @cached_property
    def groups(self) -> list[PromptGroup]:
        """The groups with their samples, fetched from the object store."""
        by_group: dict = {}
        for sample in unpack(ray.get(self.trainer_samples)):
            by_group.setdefault(sample.group_id, []).append(sample)
        return [replace(group, samples=by_group.get(group.group_id, [])) for group in self.summary.groups]
