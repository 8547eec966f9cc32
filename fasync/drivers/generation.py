"""Generation in the driver's process (sync and async): the engines generate one rollout of prompt groups at a
time, and colocated sync runs put them to sleep while the trainer trains. fully_async's rollouter generates in
its own actor instead (`fasync.rollout.rollouter`)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from fasync.config.schema import FasyncConfig
from fasync.errors import NothingToTrain
from fasync.launch.faults import Watchdog
from fasync.metrics.batch import BatchFigures
from fasync.metrics.ledger import Ledger
from fasync.rollout.groups import GroupFactory, PromptGroup, zero_variance
from fasync.wire import pack, unpack


def generate(engines: list, groups: list[PromptGroup], params, watchdog: Watchdog) -> list[PromptGroup]:
    """Run every request of `groups` to completion, spreading the groups over the engines."""
    shares = [groups[i:: len(engines)] for i in range(len(engines))]
    calls = {
        f"engine {index}'s generate call": engine.generate.remote(
            pack([req for group in share for req in group.requests]), params)
        for index, (engine, share) in enumerate(zip(engines, shares))
        if share
    }
    by_id = {gen.request_id: gen for result in watchdog.get(list(calls.values()), list(calls))
             for gen in unpack(result)}
    for group in groups:
        group.requests = [by_id[req.request_id] for req in group.requests]
    return groups


@dataclass
class RolloutBatch:
    groups: list[PromptGroup]
    generate_time_s: float
    rounds: int | None = 1
    """Generation rounds dynamic sampling took; None where there are no rounds (fully_async streams)."""
    drops: Counter = field(default_factory=Counter)
    """Samples dropped while collecting, by reason."""

    @property
    def samples(self):
        return [sample for group in self.groups for sample in group.samples]

    @property
    def trainer_samples(self):
        """What the trainer's call takes: the samples (fully_async's `Drain`: a reference to them)."""
        return self.samples

    @property
    def figures(self) -> BatchFigures:
        return BatchFigures.of(self.groups)


class EngineRollouts:
    """The engines' rollouts and the run's sample `ledger`, which lives here in sync and async: every sample
    these engines generate enters it, and the driver counts what the trainer takes."""

    def __init__(self, cfg: FasyncConfig, factory: GroupFactory, engines: list, watchdog: Watchdog, ledger: Ledger):
        self.cfg = cfg.rollout
        self.factory = factory
        self.engines = engines
        self.watchdog = watchdog
        self.ledger = ledger
        self.sleeps = cfg.resources.colocate and cfg.mode == "sync"
        """Colocated sync runs hand the engines' GPU memory to training between generation and the next weight
        push (`sleep`, `wake`). The async modes generate while training, so their engines stay awake."""

    def next_batch(self) -> RolloutBatch:
        """One rollout of `rollout.batch_size` groups; with dynamic sampling, zero-variance groups are
        dropped and more prompts generated until the batch is full or the rounds run out. Rounds that keep no
        group at all end the run (`NothingToTrain`)."""
        cfg = self.cfg
        start = time.monotonic()
        kept: list[PromptGroup] = []
        drops: Counter = Counter()
        rounds = generated = 0
        want = cfg.batch_size
        while len(kept) < cfg.batch_size and rounds < (cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            groups = self.factory.new_groups(want)
            self.ledger.admit(sum(g.size for g in groups), groups)
            agent = self.factory.agent
            done = agent.generate(self.engines, groups, self.factory.params) if agent is not None else \
                generate(self.engines, groups, self.factory.params, self.watchdog)
            for group in self.scored(done):
                if group.reward_failure is not None:
                    drops["reward_failed"] += group.size
                    self.ledger.drop("reward_failed", group.size, [group])
                elif cfg.dynamic_sampling and zero_variance(group):
                    drops["zero_variance"] += group.size
                    self.ledger.drop("zero_variance", group.size, [group])
                else:
                    kept.append(group)
            rounds += 1
            generated += len(groups)
            want = cfg.over_sampling_batch_size or cfg.batch_size
        if not kept:
            raise NothingToTrain.after(generated, rounds)
        surplus = kept[cfg.batch_size:]
        kept = kept[: cfg.batch_size]
        drops["surplus"] += sum(g.size for g in surplus)
        self.ledger.drop("surplus", sum(g.size for g in surplus), surplus)
        self.ledger.deliver(sum(g.size for g in kept), kept)
        return RolloutBatch(kept, time.monotonic() - start, rounds, drops)

    def scored(self, groups: list[PromptGroup]) -> list[PromptGroup]:
        """`groups`, scored by the reward function under the stall watchdog, as fully_async's rollouter is
        watched: a reward that hangs fails the run after `train.stall_timeout_s`, naming the reward."""
        rewards = self.factory.rewards
        self.watchdog.call(lambda: self.factory.score_all(groups),
                           f"the reward {'function' if rewards.key == 'reward.function' else 'server'} "
                           f"({rewards.name}) scoring {len(groups)} prompt groups")
        return groups

    def sleep(self) -> None:
        """Colocated sync runs: the engines release their GPU memory (weights and KV cache) for training."""
        if self.sleeps:
            self.watchdog.get([engine.sleep.remote() for engine in self.engines],
                              [f"engine {index}'s sleep" for index in range(len(self.engines))])

    def wake(self, tags: list[str]) -> None:
        """Colocated sync runs: the engines take back the memory `tags` name (`weights` before a push,
        `kv_cache` before generating)."""
        if self.sleeps:
            self.watchdog.get([engine.wake_up.remote(tags) for engine in self.engines],
                              [f"engine {index}'s wake-up ({', '.join(tags)})" for index in range(len(self.engines))])
