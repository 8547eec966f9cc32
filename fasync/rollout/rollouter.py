"""The rollouter (fully_async): streams prompt groups through the engines into the queue it holds.

Admission is version-based (bounded staleness, as in AReaL): the group about to
be admitted will be trained in drain d = (groups ahead of it) // batch_size, at
trainer version d // update_weights_interval; it is admitted only if that is at
most `max_weight_staleness` versions ahead of the weights it would be generated
with. Admission also stops while the queue plus the groups in flight would
overflow the queue, or the engines already generate `max_concurrent_samples`.
An engine loop with nothing admissible sleeps until something that admission
depends on changes (a drain, a delivery, a drop, a new version, the stop).

Each engine has at most one generate call outstanding, so a weight sync only
has to wait for (or, with partial rollout, abort) that call before loading.

The queue lives in this actor: a delivery is a local put, and the trainer's
drain is one call that also returns the ledger and the queue's counters.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque

from fasync.config.derived import derive
from fasync.config.schema import FasyncConfig
from fasync.launch.actors import pack, unpack
from fasync.rollout.groups import PromptGroup, zero_variance
from fasync.rollout.queue import GroupQueue, QueueClosed


class Rollouter:
    def __init__(self, cfg: FasyncConfig, engines: list, factory):
        self.cfg = cfg
        self.derived = derive(cfg)
        self.engines = engines
        self.queue = GroupQueue(self.derived.max_queue_size, priority=lambda group: group.oldest_version)
        self.factory = factory
        self.n = cfg.rollout.n_samples_per_prompt
        self.version = 0
        self.partial = cfg.async_.partial_rollout
        self.tokens_per_call = self.derived.tokens_per_call
        self.group_chunk = max(1, math.ceil(self.derived.max_concurrent_samples / self.n / len(engines)))
        self._running = asyncio.Event()
        self._running.set()
        self._stopping = False
        self._calls = 0
        self._calls_done = asyncio.Condition()
        self._retry: deque[PromptGroup] = deque()
        self._changed = asyncio.Event()
        # Ledger, in samples: produced = in_flight + dropped + put.
        self.produced = 0
        self.in_flight = 0
        self.put = 0
        self.dropped: Counter = Counter()
        self.groups_admitted = 0
        self.groups_dropped = 0
        self.pause_s = 0.0
        self.busy_s = 0.0
        self.syncs = 0
        self.resumed_groups = 0

    # -- admission -------------------------------------------------------------------------------

    def _groups_ahead(self) -> int:
        """Groups admitted so far that are still headed for training: consumed, queued or in flight."""
        return self.groups_admitted - self.groups_dropped

    def _fresh_enough(self, ahead: int) -> bool:
        bound = self.cfg.async_.max_weight_staleness
        if bound is None:
            return True
        drain = ahead // self.cfg.rollout.batch_size
        return drain // self.cfg.async_.update_weights_interval - self.version <= bound

    def _admit(self, most: int) -> list[PromptGroup]:
        room = self.derived.max_queue_size - self.queue.size() - self.in_flight // self.n
        slots = (self.derived.max_concurrent_samples - self.in_flight) // self.n
        count = 0
        while count < min(room, slots, most) and self._fresh_enough(self._groups_ahead() + count):
            count += 1
        groups = []
        while self._retry and len(groups) < count:
            groups.append(self.factory.again(self._retry.popleft(), self.version))
        groups += self.factory.new_groups(count - len(groups), self.version)
        self.groups_admitted += len(groups)
        admitted = sum(g.size for g in groups)
        self.produced += admitted
        self.in_flight += admitted
        return groups

    # -- generation ------------------------------------------------------------------------------

    async def _call(self, engine, groups: list[PromptGroup]) -> None:
        """One generate call over the groups' unfinished requests, which come back continued: finished,
        or unfinished when the call was aborted or spent its `tokens_per_call`."""
        pending = [req for group in groups for req in group.requests if not req.finished]
        for group in groups:
            # Continuing tokens an older version produced is what partial rollout means by a resume.
            if any(req.token_versions and req.token_versions[-1] != self.version
                   for req in group.requests if not req.finished):
                group.resumes += 1
                self.resumed_groups += 1
        self._calls += 1
        started = time.monotonic()
        try:
            results = unpack(await engine.generate.remote(pack(pending), self.factory.params, self.tokens_per_call))
        finally:
            self.busy_s += time.monotonic() - started
            self._calls -= 1
            async with self._calls_done:
                self._calls_done.notify_all()
        by_id = {gen.request_id: gen for gen in results}
        for group in groups:
            group.requests = [by_id.get(req.request_id, req) for req in group.requests]

    async def _deliver(self, group: PromptGroup) -> None:
        self.factory.score(group)
        if self.cfg.rollout.dynamic_sampling and zero_variance(group):
            self._drop(group, "zero_variance")
            return
        await self.queue.put(group)
        self.in_flight -= group.size
        self.put += group.size
        self._changed.set()

    def _drop(self, group: PromptGroup, reason: str) -> None:
        self.in_flight -= group.size
        self.dropped[reason] += group.size
        self.groups_dropped += 1
        self._changed.set()

    async def _engine_loop(self, engine) -> None:
        """Keep the engine's batch full: each call continues the groups in it, groups that finished
        leave for the queue, and admission tops the batch up before the next call."""
        active: list[PromptGroup] = []
        while not self._stopping:
            await self._running.wait()
            if self._stopping:
                break
            # Cleared before looking, and no await in between: a change after the look wakes the wait.
            self._changed.clear()
            active += self._admit(self.group_chunk - len(active))
            if not active:
                await self._changed.wait()
                continue
            await self._call(engine, active)
            if self._stopping:
                break
            finished = [group for group in active if group.finished]
            active = [group for group in active if not group.finished]
            for group in finished:
                try:
                    await self._deliver(group)
                except QueueClosed:
                    self._drop(group, "unfinished_at_stop")
        for group in active:
            self._drop(group, "unfinished_at_stop")

    async def run(self) -> dict:
        await asyncio.gather(*(self._engine_loop(engine) for engine in self.engines))
        return self.ledger()

    # -- control from the driver -----------------------------------------------------------------

    async def take(self, count: int) -> bytes:
        """The oldest `count` groups once the queue holds them (fewer only at shutdown), with the ledger and
        the queue's counters as they are right after taking them: `(groups, state)`, `pack`ed."""
        groups = await self.queue.get(count)
        self._changed.set()
        return pack((groups, {**self.ledger(), **self.queue.stats()}))

    async def update_weights(self, weights: list, version: int) -> float:
        """Pause generation, load `version` into every engine, resume; returns the pause in seconds.

        `weights` is a one-item list holding the reference to the trainer's weights, so that Ray hands
        this actor the reference and not the arrays: each engine fetches them from the object store.

        With partial rollout the call in flight is aborted (a sliced one finishes its slice) and its
        unfinished requests resume from their prefix under the new weights; without, it finishes under the
        old weights first."""
        start = time.monotonic()
        self._running.clear()
        # A sliced call ends within `tokens_per_call` tokens anyway: letting it finish keeps the rows it was
        # about to complete, and its end is the pause point the resume starts from.
        abort = self.partial and self.tokens_per_call is None
        aborts = [engine.abort.remote() for engine in self.engines] if abort else []
        # An engine runs one call at a time, in order: each load starts as soon as the call in flight has
        # returned, without waiting for this actor to see that return first.
        loads = [engine.load_weights.remote(weights[0], version) for engine in self.engines]
        await asyncio.gather(*aborts)
        async with self._calls_done:
            await self._calls_done.wait_for(lambda: self._calls == 0)
        await asyncio.gather(*loads)
        self.version = version
        self.syncs += 1
        self._running.set()
        self._changed.set()
        paused = time.monotonic() - start
        self.pause_s += paused
        return paused

    def report_stale(self, groups: list[PromptGroup]) -> None:
        """The trainer found these groups too stale to train on: free their places and maybe regenerate."""
        self.groups_dropped += len(groups)
        if self.cfg.async_.stale_policy == "regenerate":
            self._retry.extend(groups)
        self._changed.set()

    async def stop(self) -> dict:
        """Stop generating and close the queue; groups left in it stay counted as put."""
        self._stopping = True
        self._running.set()
        self._changed.set()
        await asyncio.gather(*(engine.abort.remote() for engine in self.engines))
        await self.queue.shutdown()
        return self.ledger()

    def ledger(self) -> dict:
        return {
            "produced": self.produced,
            "in_flight": self.in_flight,
            "put": self.put,
            "dropped": dict(self.dropped),
            "version": self.version,
            "pause_s": self.pause_s,
            "busy_s": self.busy_s,
            "resumed_groups": self.resumed_groups,
        }
