"""What every simulated driver shares: prompt groups, engine calls, training and the record of what happened.

The rules are the real ones, imported: batch geometry from `fasync.config.derived`, versions and staleness
from `fasync.staleness`, the sample ledger from `fasync.metrics.ledger`. Only time is simulated.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from fasync.config.derived import Derived
from fasync.metrics.ledger import Ledger
from fasync.simulate.costs import Costs
from fasync.simulate.lengths import Lengths
from fasync.staleness import VersionClock, staleness

LENGTH_BUCKETS = 4
"""Completion lengths are reported in this many equal slices of `rollout.max_new_tokens`."""


@dataclass
class Group:
    """A prompt group: its prompt length and each sample's completion length, in ascending order.

    Every row of a group is in the same engine calls, and a call gives each unfinished row the same
    number of new tokens (its budget, or the decode steps done before an abort, or fewer where the row
    finishes), so one count says how far the whole group has come: row i has `min(lengths[i], progress)`
    tokens."""

    group_id: int
    prompt: int
    lengths: list[int]
    progress: int = 0
    oldest_version: Optional[int] = None
    """Version of the weights that produced the group's first tokens."""
    newest_version: Optional[int] = None
    cached_on: Optional[tuple[int, int]] = None
    """(engine, loads) when the engine's prefix cache holds this group's unfinished contexts."""

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def finished(self) -> bool:
        return self.progress >= self.lengths[-1]

    def takes(self, budget: Optional[int]) -> list[int]:
        """New tokens each unfinished row gets from a call with this budget (None: to the end)."""
        return [length - self.progress if budget is None else min(length - self.progress, budget)
                for length in self.lengths if length > self.progress]

    def runs(self, count: int) -> list[tuple[int, int]]:
        """(prompt + completion length, samples) of the first `count` samples, equal lengths together."""
        if self.lengths[0] == self.lengths[-1]:
            return [(self.prompt + self.lengths[0], count)]
        return [(self.prompt + length, 1) for length in self.lengths[:count]]


@dataclass
class Call:
    """One generate call planned on an engine: the groups in it, what each row gets, what it costs."""

    groups: list[Group]
    budget: Optional[int]
    rows: int
    steps: int
    """Decode steps: the largest take."""
    row_steps: int
    """Rows counted over the steps: every row every step (static batch), or each row's own take."""
    prefill_tokens: int
    version: int
    start: float
    slowdown: float
    duration: float

    def takes(self) -> list[int]:
        return [take for group in self.groups for take in group.takes(self.budget)]


class Workload:
    """New prompt groups and the ledger of every sample that entered generation."""

    def __init__(self, lengths: Lengths):
        self.lengths = lengths
        self.ids = itertools.count()
        self.ledger = Ledger()

    def new_groups(self, count: int) -> list[Group]:
        groups = []
        for _ in range(count):
            prompt, completions = self.lengths.group()
            groups.append(Group(next(self.ids), prompt, sorted(completions)))
        return groups

    def again(self, group: Group) -> Group:
        """The same prompt from scratch (regenerating a stale group); drawn lengths are drawn again."""
        completions = group.lengths if self.lengths.answers is not None else sorted(self.lengths.group()[1])
        return Group(next(self.ids), group.prompt, list(completions))


def plan_call(groups: list[Group], budget: Optional[int], version: int, engine: int, loads: int,
              start: float, costs: Costs, static: bool, slowdown: float = 1.0) -> Call:
    """A call over the groups' unfinished rows, each given at most `budget` tokens (None: to the end).

    A row the engine's prefix cache holds (it left the previous call unfinished, with no weight load
    since) sends only its newest token through the model; any other row prefills its whole context."""
    rows = steps = row_sum = prefill = 0
    for group in groups:
        cached = group.cached_on == (engine, loads) and group.progress > 0
        progress = group.progress
        if group.lengths[0] == group.lengths[-1]:
            take = group.lengths[0] - progress if budget is None else min(group.lengths[0] - progress, budget)
            count = group.size
            rows += count
            steps = max(steps, take)
            row_sum += take * count
            prefill += count if cached else count * (group.prompt + progress)
            continue
        for take in group.takes(budget):
            rows += 1
            steps = max(steps, take)
            row_sum += take
            prefill += 1 if cached else group.prompt + progress
    row_steps = rows * steps if static else row_sum
    duration = (costs.engine_call + costs.engine_prefill_token * prefill + costs.engine_step * steps
                + costs.engine_row * row_steps)
    return Call(groups, budget, rows, steps, row_steps, prefill, version, start, slowdown, slowdown * duration)


def finish_call(call: Call, steps: Optional[int], engine: int, loads: int) -> None:
    """Give every row its tokens (at most `steps` of them when an abort cut the call short)."""
    offered = call.budget
    if steps is not None:
        offered = steps if offered is None else min(offered, steps)
    for group in call.groups:
        if offered is None:
            group.progress = group.lengths[-1]
        elif offered:
            group.progress += offered
        if offered is None or offered:
            if group.oldest_version is None:
                group.oldest_version = call.version
            group.newest_version = call.version
        group.cached_on = None if group.finished else (engine, loads)


def split_steps(groups: list[Group], derived: Derived, dynamic: bool) -> tuple[list[list[tuple[Group, int]]], int]:
    """The optimizer steps a train call takes over the groups' samples, as (group, samples) runs, and how many
    samples it trims: `plan_steps`'s rule."""
    total = sum(g.size for g in groups)
    size = derived.effective_global_batch_size
    if dynamic or total < size:
        return ([[(g, g.size) for g in groups]] if groups else []), 0
    count = min(derived.num_steps_per_rollout, total // size)
    steps: list[list[tuple[Group, int]]] = [[] for _ in range(count)]
    step, room = 0, size
    for group in groups:
        left = group.size
        while left and step < count:
            used = min(left, room)
            steps[step].append((group, used))
            left, room = left - used, room - used
            if room == 0:
                step, room = step + 1, size
    return steps, total - count * size


@dataclass
class Recorder:
    """What a simulated run measured: the same quantities `fasync bench` reads from metrics.jsonl."""

    engines: int
    max_new_tokens: int
    engine_busy: list[list[tuple[float, float]]] = field(default_factory=list)
    trainer_busy: list[tuple[float, float]] = field(default_factory=list)
    records: list[tuple[float, int, int]] = field(default_factory=list)
    """(time the rollout's record is written, samples trained, optimizer steps)."""
    staleness: Counter = field(default_factory=Counter)
    lag_steps: Counter = field(default_factory=Counter)
    taken: Counter = field(default_factory=Counter)
    """Samples handed to the trainer, by completion-length bucket."""
    stale: Counter = field(default_factory=Counter)
    queue_area: float = 0.0
    queue_size: int = 0
    queue_max: int = 0
    queue_since: float = 0.0
    unbalanced_at: Optional[int] = None
    clock: VersionClock = field(default_factory=VersionClock)
    steps_taken: int = 0
    pause_s: float = 0.0
    resumed_groups: int = 0
    generate_s: list[float] = field(default_factory=list)
    """sync and async: each rollout's generation as the driver times it (`generate_time_s`)."""
    train_calls: list[tuple[float, float]] = field(default_factory=list)
    """(the whole train call, its optimizer steps alone): `train_call_time_s` and `train_time_s`."""
    sync_held_s: list[float] = field(default_factory=list)
    """sync: what each weight sync held the driver (`weight_sync_time_s`)."""

    def __post_init__(self) -> None:
        self.engine_busy = [[] for _ in range(self.engines)]

    def bucket(self, length: int) -> int:
        return min((length - 1) * LENGTH_BUCKETS // self.max_new_tokens, LENGTH_BUCKETS - 1)

    def hand_over(self, group: Group, stale: bool) -> None:
        lengths = group.lengths
        if lengths[0] == lengths[-1]:
            bucket = self.bucket(lengths[0])
            self.taken[bucket] += len(lengths)
            if stale:
                self.stale[bucket] += len(lengths)
            return
        for length in lengths:
            bucket = self.bucket(length)
            self.taken[bucket] += 1
            if stale:
                self.stale[bucket] += 1

    def queue(self, now: float, size: int) -> None:
        self.queue_area += self.queue_size * (now - self.queue_since)
        self.queue_size, self.queue_since = size, now
        self.queue_max = max(self.queue_max, size)

    def train(self, steps: list[list[tuple[Group, int]]], version: int) -> None:
        """Staleness (versions) and lag (optimizer steps) of every trained sample, step by step."""
        for step in steps:
            for group, count in step:
                self.staleness[staleness(version, group.oldest_version)] += count
                self.lag_steps[self.clock.lag_steps(self.steps_taken, group.oldest_version)] += count
            self.steps_taken += 1

    def publish(self, version: int) -> None:
        self.clock.publish(version, self.steps_taken)

    def record(self, now: float, samples: int, steps: int, ledger: Ledger) -> None:
        self.records.append((now, samples, steps))
        if not ledger.balanced and self.unbalanced_at is None:
            self.unbalanced_at = len(self.records) - 1
