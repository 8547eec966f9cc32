"""What the three drivers share: actors, the weight version, generation of prompt groups, step records."""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

import ray

from fasync.config.derived import Derived
from fasync.config.schema import FasyncConfig
from fasync.launch.actors import TrainerGroup, push_weights, start_engines
from fasync.launch.placement import Placement
from fasync.launch.plan import ResourcePlan
from fasync.launch.wire import pack, unpack
from fasync.metrics.ledger import Ledger
from fasync.metrics.progress import Progress
from fasync.metrics.signal import LearningSignal
from fasync.metrics.trackers import open_trackers
from fasync.metrics.writer import MetricsWriter
from fasync.rollout.groups import GroupFactory, PromptGroup, zero_variance
from fasync.staleness import VersionClock

COMPLETED = "completed all rollouts"
"""`Run.stop_reason` of a run that neither stopped early nor failed."""

REWARD_WINDOW = 3
"""Rollouts averaged for `train.target_reward` early stopping."""


def build_factory(cfg: FasyncConfig) -> GroupFactory:
    """The prompts, tokenizer and reward of a run, each checked here in the driver (the dataset against the
    tokenizer and the context, the weight files against config.json) so that bad input stops the run before
    Ray starts; raises ConfigurationError."""
    from fasync.data import build_dataset
    from fasync.data.datasets import check_prompts
    from fasync.data.rewards import build_reward
    from fasync.memory import model_dims
    from fasync.model import build_tokenizer

    tokenizer = build_tokenizer(cfg.model, cfg.data)
    dataset = build_dataset(cfg.data)
    dims = model_dims(cfg)
    check_prompts(dataset, tokenizer, dims.max_context if dims is not None else None)
    if cfg.model.path is not None:
        from fasync.model.weights import check_weights

        check_weights(cfg.model.path)
    return GroupFactory(cfg, tokenizer, dataset, build_reward(cfg.reward))


def generate(engines: list, groups: list[PromptGroup], params) -> list[PromptGroup]:
    """Run every request of `groups` to completion, spreading the groups over the engines."""
    shares = [groups[i:: len(engines)] for i in range(len(engines))]
    calls = [
        engine.generate.remote(pack([req for group in share for req in group.requests]), params)
        for engine, share in zip(engines, shares)
        if share
    ]
    by_id = {gen.request_id: gen for result in ray.get(calls) for gen in unpack(result)}
    for group in groups:
        group.requests = [by_id[req.request_id] for req in group.requests]
    return groups


def version_stats(samples) -> dict:
    """How many weight versions a batch mixes, and how much of it partial rollouts stitched together."""
    spans = [s.newest_version - s.oldest_version for s in samples]
    return {
        "version_diversity": len({s.oldest_version for s in samples}),
        "partial_ratio": sum(span > 0 for span in spans) / max(len(spans), 1),
        "max_partial_span": max(spans, default=0),
    }


class Stopwatch:
    """`with Stopwatch() as watch: ...`, then `watch.seconds`: timing stays with the caller, so that no
    command has to return how long it took."""

    seconds = 0.0

    def __enter__(self) -> "Stopwatch":
        self._start = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.monotonic() - self._start


def trained_samples(records: list[dict]) -> int:
    return sum(record["num_samples"] for record in records)


@dataclass
class RolloutBatch:
    groups: list[PromptGroup]
    generate_time_s: float
    rounds: int | None = 1
    """Generation rounds dynamic sampling took; None where there are no rounds (fully_async streams)."""
    drops: Counter = field(default_factory=Counter)

    @property
    def samples(self):
        return [sample for group in self.groups for sample in group.samples]


class Run:
    """State every driver keeps: the actors, the weight version and when each was published, the ledger
    and the step records.

    `ledger` is the run's sample ledger. sync and async keep it here, where their samples are; fully_async's
    rollouter keeps it, and the driver puts the copy each drain brings here."""

    def __init__(self, cfg: FasyncConfig, derived: Derived, plan: ResourcePlan, factory: GroupFactory,
                 run_dir: Path, progress: Progress, engines: list | None = None):
        self.cfg = cfg
        self.derived = derived
        self.plan = plan
        self.run_dir = run_dir
        self.progress = progress
        self.writer = MetricsWriter(run_dir, cfg.mode, open_trackers(
            cfg.logging, run_dir, cfg.model_dump(mode="json", by_alias=True)))
        self.ledger = Ledger()
        self.signal = LearningSignal()
        self.factory = factory
        self._owns_engines = engines is None
        # Every GPU of the run reserved at once, before any actor starts (fasync/launch/plan.py).
        self.placement = Placement(plan)
        self.engines = engines if engines is not None else start_engines(cfg, plan, self.placement)
        self.trainer = TrainerGroup(cfg, plan, self.placement)
        self.version = 0
        self.clock = VersionClock()
        self.step = 0
        self.recent_rewards: deque[float] = deque(maxlen=REWARD_WINDOW)
        self._last_record_time = time.monotonic()
        self.stop_reason = COMPLETED
        # Version 0, pushed without waiting: a driver starts its own actors before `wait_until_ready`,
        # so that they start up alongside the engines and the trainer.
        self._first_push = push_weights(self.engines, self.trainer.state_dict_ref(), self.version)

    def wait_until_ready(self) -> None:
        """Block until the engines and the trainer have started and the engines hold version 0; raises the
        start-up error of an actor that failed."""
        try:
            ray.get(self._first_push)
        except Exception:
            self.stop_reason = "start-up failed: an engine or the trainer did not start, or did not load weight version 0"
            raise

    def next_version(self) -> int:
        """The trainer's weights become the next version, published after the steps taken so far."""
        self.version += 1
        self.clock.publish(self.version, self.step)
        return self.version

    def publish_weights(self, wait: bool = True) -> None:
        """Push the trainer's weights to every engine as the next version. Without `wait` the push queues
        behind any generation in progress on an engine."""
        pushes = push_weights(self.engines, self.trainer.state_dict_ref(), self.next_version())
        if wait:
            ray.get(pushes)

    def collect(self) -> RolloutBatch:
        """One rollout of `rollout.batch_size` groups; with dynamic sampling, zero-variance groups are
        dropped and more prompts generated until the batch is full or the rounds run out."""
        cfg = self.cfg.rollout
        start = time.monotonic()
        kept: list[PromptGroup] = []
        drops: Counter = Counter()
        rounds = 0
        want = cfg.batch_size
        while len(kept) < cfg.batch_size and rounds < (cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            groups = self.factory.new_groups(want)
            self.ledger.admit(sum(g.size for g in groups))
            for group in generate(self.engines, groups, self.factory.params):
                self.factory.score(group)
                if cfg.dynamic_sampling and zero_variance(group):
                    drops["zero_variance"] += group.size
                else:
                    kept.append(group)
            rounds += 1
            want = cfg.over_sampling_batch_size or cfg.batch_size
        surplus = kept[cfg.batch_size:]
        kept = kept[: cfg.batch_size]
        drops["surplus"] += sum(g.size for g in surplus)
        for reason, count in drops.items():
            self.ledger.drop(reason, count)
        self.ledger.deliver(sum(g.size for g in kept))
        return RolloutBatch(kept, time.monotonic() - start, rounds, drops)

    def train_batch(self, rollout: int, batch: RolloutBatch, extra: dict | None = None) -> list[dict]:
        """Train on one rollout (or drain) at the current version; returns its step records, not yet written.
        The ledger is the caller's to update: its samples may be elsewhere."""
        samples = batch.samples
        start = time.monotonic()
        steps = self.trainer.train_rollout(samples, self.version)
        train_time = time.monotonic() - start
        self.recent_rewards.append(sum(s.reward for s in samples) / max(len(samples), 1))
        batch_stats = version_stats(samples)
        records = []
        for index, step in enumerate(steps):
            record = {
                "step": self.step,
                "rollout": rollout,
                "weight_version": self.version,
                "generate_time_s": batch.generate_time_s if index == 0 else 0.0,
                "weight_sync_time_s": 0.0,
                # The trainer's core is held for the whole call, the samples' transfer included.
                "train_call_time_s": train_time / len(steps),
                "rollout_reward_mean": self.recent_rewards[-1],
                **({} if batch.rounds is None else {"sampling_rounds": batch.rounds}),
                **{f"dropped_{reason}": count for reason, count in batch.drops.items()},
                **batch_stats,
                **(extra or {}),
                **step,
                # The step's oldest sample came from version `weight_version − staleness_max`.
                "policy_lag_max": self.clock.lag_steps(self.step, self.version - step["staleness_max"]),
            }
            record.setdefault("train_time_s", train_time / len(steps))
            self.step += 1
            records.append(record)
        return records

    def write(self, records: list[dict], weight_sync_time_s: float = 0.0) -> None:
        if records:
            records[-1]["weight_sync_time_s"] = weight_sync_time_s
        now = time.monotonic()
        tokens = sum(r.get("num_tokens", 0) for r in records)
        samples = sum(r.get("num_samples", 0) for r in records)
        elapsed = max(now - self._last_record_time, 1e-9)
        self._last_record_time = now
        for record in records:
            record["tokens_per_s"] = tokens / elapsed
            record["samples_per_s"] = samples / elapsed
            record["ledger_balanced"] = self.ledger.balanced
            warnings = self.signal.observe(record)
            self.progress.update(self.writer.write(record))
            for warning in warnings:
                self.progress.message(f"warning: {warning}")
            if record.get("skipped"):
                self.progress.message(f"warning: step {record['step']} took no optimizer step: {record['skip_reason']}")
        every = self.cfg.checkpoint.every
        if records and every and (records[-1]["rollout"] + 1) % every == 0:
            self.trainer.save(str(self.run_dir / f"checkpoint-{records[-1]['rollout'] + 1}.pt"))

    def reached_target(self) -> bool:
        target = self.cfg.train.target_reward
        if target is None or len(self.recent_rewards) < REWARD_WINDOW:
            return False
        if sum(self.recent_rewards) / len(self.recent_rewards) >= target:
            self.stop_reason = f"reached target reward {target}"
            return True
        return False

    def close(self) -> None:
        """Flush the metrics and end the actors this run started."""
        self.writer.close()
        self.trainer.kill()
        for engine in self.engines if self._owns_engines else ():
            ray.kill(engine)
        self.placement.remove()
