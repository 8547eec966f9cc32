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

With the vLLM engine (`Derived.streams_requests`) an engine loop makes no calls: it submits each group's
requests as soon as admission lets the group in, a collector task takes requests back as they end, and a
group leaves for the queue once its last request has finished (continuous batching,
fasync.rollout.vllm_stream). The rest is the same mechanism: a weight sync submits nothing new and waits
until the engines hold no request (with partial rollout it aborts them first; they are resubmitted from
their prefix under the new weights), and so does a snapshot. Under `async.pause_mode: keep`
(`Derived.keeps_kv_at_sync`) a sync waits for nothing: each engine pauses with its requests and their KV
cache in it, loads and resumes, and the requests go on under the new weights.

The queue and the run's sample ledger live in this actor, where the samples are:
a delivery is a local put, the trainer's drain is one call that drops the groups
too stale for the version it trains at (under `async.stale_policy: wait` it first
waits for the groups in flight that would miss it and go stale) and returns the rest (a summary with a copy
of the ledger for the driver, the samples as their own object for the trainer),
and the driver reports back what it trained.

Every group not yet trained or dropped is held by id, in flight or waiting (queued, or taken by a drain
and not yet reported trained), so that `snapshot` can save them for a checkpoint and `restore` can put them
back: waiting groups into the queue, in-flight ones (with their tokens so far and per-token versions) into
the engines' batches, to continue from their prefix.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass, field

from fasync import heap, staleness
from fasync.errors import ActorFailed, NothingToTrain, describe_failure
from fasync.killpoints import kill_point
from fasync.metrics.batch import BatchFigures
from fasync.metrics.ledger import DropReason, Ledger
from fasync.rollout.groups import PromptGroup, zero_variance
from fasync.rollout.queue import GroupQueue, QueueClosed
from fasync.rollout.types import GroupId
from fasync.wire import pack, unpack


@dataclass(frozen=True)
class RolloutState:
    """The rollouter as a drain leaves it. Times and `resumed_groups` are totals since the start."""

    ledger: Ledger = field(default_factory=Ledger)
    version: int = 0
    """The weight version the engines hold."""
    queue_size: int = 0
    """Prompt groups left in the queue."""
    pause_s: float = 0.0
    """Seconds generation was paused for weight syncs."""
    busy_s: float = 0.0
    """Seconds the engines spent in generate calls, or holding streamed requests (summed over the engines)."""
    resumed_groups: int = 0
    """Groups a weight sync interrupted that went on from their prefix under the new weights."""


@dataclass(frozen=True)
class DrainSummary:
    """A drain as the driver reads it: what its step records, the ledger and samples.jsonl need, without the
    samples, which go to the trainer as their own object."""

    groups: list[PromptGroup]
    """The groups with no requests and no samples: their ids, prompts and labels."""
    figures: BatchFigures

    @classmethod
    def of(cls, groups: list[PromptGroup]) -> "DrainSummary":
        return cls([PromptGroup(group.group_id, group.prompt, group.label, requests=[], prompt_index=group.prompt_index)
                    for group in groups], BatchFigures.of(groups))


class Rollouter:
    def __init__(self, resolved, engines: list, factory, actor_names: dict[str, str] | None = None):
        """`resolved`: the config with what follows from it (`fasync.launch.plan.Resolved`). `actor_names`: actor
        id → name of the run's actors (the driver's watchdog's), so that an engine call that fails because another
        actor died names that one (a weight load fails when the trainer that made the weights died); None outside Ray
        (local engines, which cannot die as actors do)."""
        self.cfg = cfg = resolved.config
        self.derived = resolved.derived
        self.engines = engines
        self.actor_names = actor_names or {}
        self.queue = GroupQueue(self.derived.max_queue_size, priority=lambda group: group.oldest_version)
        self.factory = factory
        self.n = cfg.rollout.n_samples_per_prompt
        self.version = 0
        self.partial = cfg.async_.partial_rollout
        self.tokens_per_call = self.derived.tokens_per_call
        self.streaming = self.derived.streams_requests
        self.group_chunk = max(1, math.ceil(self.derived.max_concurrent_samples / self.n / len(engines)))
        self._running = asyncio.Event()
        self._running.set()
        self._stopping = False
        self._held: list[set[int]] = [set() for _ in engines]
        """The request ids each engine holds now: those of its generate call in flight, or submitted to it
        and not yet collected. A weight load and a snapshot wait until every engine holds none."""
        self._released = asyncio.Condition()
        self._collectors: dict[int, asyncio.Task] = {}
        """Streaming: each engine's task that collects its requests as they end, while it holds any."""
        self._retry: deque[PromptGroup] = deque()
        self._changed = asyncio.Event()
        self.ledger = Ledger()
        # Admission counts prompt groups: those headed for training are admitted − dropped.
        self.groups_admitted = 0
        self.groups_dropped = 0
        self.pause_s = 0.0
        self.busy_s = 0.0
        self.resumed_groups = 0
        self.zero_variance_in_a_row = 0
        """Groups dynamic sampling dropped since the last one it kept: `rollout.max_sampling_rounds` rollouts'
        worth end the run, as the rounds of sync and async do."""
        self._outstanding: dict[str, float] = {}
        """What this actor awaits from the engines now ("engine 1's generate call"), and since when."""
        self.in_flight: dict[GroupId, PromptGroup] = {}
        self.waiting: dict[GroupId, PromptGroup] = {}
        """Delivered groups not yet reported trained: in the queue, or taken by a drain."""
        self._restored: list[PromptGroup] = []
        """In-flight groups from a checkpoint, for the engine loops' first batches."""
        self._agent_runs: dict[GroupId, asyncio.Task] = {}
        """Agentic rollouts: each group's task running its trajectories (`AgentRunner.run_group`)."""
        self._agent_clients: dict[int, object] = {}
        """Agentic rollouts: each engine's `EngineClient`."""

    # -- admission -------------------------------------------------------------------------------

    def _groups_ahead(self) -> int:
        """Groups admitted so far that are still headed for training: consumed, queued or in flight."""
        return self.groups_admitted - self.groups_dropped

    def _fresh_enough(self, ahead: int) -> bool:
        return staleness.may_generate(ahead // self.cfg.rollout.batch_size, self.version,
                                       self.cfg.async_.update_weights_interval, self.cfg.async_.max_weight_staleness)

    def _admit(self, most: int) -> list[PromptGroup]:
        in_flight = self.ledger.in_flight
        room = self.derived.max_queue_size - self.queue.size() - in_flight // self.n
        slots = (self.derived.max_concurrent_samples - in_flight) // self.n
        count = 0
        while count < min(room, slots, most) and self._fresh_enough(self._groups_ahead() + count):
            count += 1
        groups = []
        while self._retry and len(groups) < count:
            groups.append(self.factory.again(self._retry.popleft()))
        groups += self.factory.new_groups(count - len(groups))
        for group in groups:
            group.admitted_version = self.version
        self.groups_admitted += len(groups)
        self.ledger.admit(sum(g.size for g in groups), groups)
        self.in_flight.update((g.group_id, g) for g in groups)
        return groups

    # -- generation ------------------------------------------------------------------------------

    async def _awaiting(self, label: str, call):
        """Await an engine's call, marked in `waiting_on`; a call that fails because an actor died (the engine, or
        the trainer whose weights it loads) or raised fails with that actor's name."""
        self._outstanding[label] = time.monotonic()
        try:
            return await call
        except Exception as error:  # noqa: BLE001 - re-raised with the actor that died named
            raise ActorFailed(f"{label} failed: {describe_failure(error, self.actor_names)}") from None
        finally:
            del self._outstanding[label]

    def waiting_on(self) -> list[str]:
        """The engine calls this actor awaits, oldest first, with how long each has lasted."""
        now = time.monotonic()
        return [f"{label} ({now - since:.0f} s)"
                for label, since in sorted(self._outstanding.items(), key=lambda item: item[1])] or \
            ["nothing: no engine call is outstanding (admission is waiting for the trainer to drain the queue)"]

    async def _call(self, index: int, engine, groups: list[PromptGroup]) -> None:
        """One generate call over the groups' unfinished requests, which come back continued: finished,
        or unfinished when the call was aborted or spent its `tokens_per_call`."""
        pending = self._to_send(groups, index)
        if not pending:  # finished before a checkpoint, not yet delivered
            return
        self._hold(index, pending)
        started = time.monotonic()
        try:
            results = unpack(await self._awaiting(
                f"engine {index}'s generate call",
                engine.generate.remote(pack(pending), self.factory.params, self.tokens_per_call)))
            # Applied before the call counts as done: a snapshot that waits for no call in flight sees them.
            self._apply(results, groups)
        finally:
            self.busy_s += time.monotonic() - started
            await self._release(index, [req.request_id for req in pending])

    async def _stream(self, index: int, engine, groups: list[PromptGroup]) -> None:
        """Submit the groups' requests the engine does not hold yet (unless a sync or a snapshot pauses
        submission), then wait until the engine's collector brings some back, or until admission may have
        news (a drain, a delivery, a new version, the stop)."""
        if self._running.is_set():
            pending = self._to_send(groups, index)
            if pending:
                self._hold(index, pending)  # before the await: a sync or a snapshot that starts meanwhile waits
                await self._awaiting(f"engine {index}'s submit",
                                     engine.submit.remote(pack(pending), self.factory.params))
        if not self._held[index]:
            return
        collector = self._collectors.get(index)
        if collector is not None and collector.done():
            collector.result()  # the engine's failure, named, if the last collector met one
            collector = None
        if collector is None:
            collector = self._collectors[index] = asyncio.create_task(self._take_back(index, engine))
        changed = asyncio.create_task(self._changed.wait())
        try:
            await asyncio.wait([collector, changed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
        if collector.done():
            collector.result()  # the engine's failure, named

    async def _take_back(self, index: int, engine) -> None:
        """Take the engine's requests back as they end, until it holds none; apart from the engine loop, so that
        a delivery waiting for room in the queue does not keep a sync or a snapshot waiting for the engine."""
        started = time.monotonic()
        try:
            while self._held[index]:
                ended = unpack(await self._awaiting(f"engine {index}'s generation", engine.take_ended.remote()))
                self._apply(ended, self.in_flight.values())
                await self._release(index, [gen.request_id for gen in ended])
                self._changed.set()
        finally:
            self.busy_s += time.monotonic() - started

    async def _run_agents(self, index: int, engine, groups: list[PromptGroup]) -> None:
        """Agentic rollouts: start the groups not yet running as tasks of the rollout function, then wait until
        one of them has finished, or until admission may have news. Their turns reach the engine through
        `_agent_call`; a tool call holds no engine, so a weight sync never waits for one."""
        client = self._agent_clients.get(index)
        if client is None:
            client = self._agent_clients[index] = self.factory.agent.client(self._agent_call(index, engine),
                                                                            self.factory.params)
        if any(group.finished for group in groups):
            return  # finished before a checkpoint, not yet delivered: the engine loop delivers it now
        for group in groups:
            if group.group_id not in self._agent_runs:
                self._agent_runs[group.group_id] = asyncio.create_task(self.factory.agent.run_group(group, client))
        runs = [self._agent_runs[group.group_id] for group in groups]
        changed = asyncio.create_task(self._changed.wait())
        try:
            await asyncio.wait([*runs, changed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
        for group, run in zip(groups, runs):
            if run.done():
                del self._agent_runs[group.group_id]
                run.result()  # the rollout function's failure, named

    def _agent_call(self, index: int, engine):
        """Agentic rollouts: engine `index`'s generate call for its client. It waits while a weight sync or a
        snapshot holds generation, and holds its requests while in flight, so that a sync waits for it (or aborts
        it, with partial rollout: the client continues the turns from their prefix once generation resumes)."""
        async def call(requests: list, params) -> list:
            await self._running.wait()
            self._hold(index, requests)  # no await since the wait: a sync that starts now waits for this call
            started = time.monotonic()
            try:
                return unpack(await self._awaiting(f"engine {index}'s generate call",
                                                   engine.generate.remote(pack(requests), params)))
            finally:
                self.busy_s += time.monotonic() - started
                await self._release(index, [req.request_id for req in requests])
        return call

    def _to_send(self, groups: list[PromptGroup], index: int) -> list:
        """The groups' unfinished requests that engine `index` does not hold, counting the groups they resume."""
        held = self._held[index]
        by_group = [[req for req in group.requests if not req.finished and req.request_id not in held]
                    for group in groups]
        # Continuing tokens an older version produced is what partial rollout means by a resume.
        self.resumed_groups += sum(any(req.token_versions and req.token_versions[-1] != self.version for req in reqs)
                                   for reqs in by_group)
        return [req for reqs in by_group for req in reqs]

    @staticmethod
    def _apply(results: list, groups) -> None:
        """Put the engine's `results` in place of the requests they continue."""
        by_id = {gen.request_id: gen for gen in results}
        for group in groups:
            group.requests = [by_id.get(req.request_id, req) for req in group.requests]

    def _hold(self, index: int, requests: list) -> None:
        self._held[index].update(req.request_id for req in requests)

    async def _release(self, index: int, request_ids: list[int]) -> None:
        self._held[index].difference_update(request_ids)
        async with self._released:
            self._released.notify_all()

    async def _until_idle(self) -> None:
        """Wait until no engine holds a request."""
        async with self._released:
            await self._released.wait_for(lambda: not any(self._held))

    async def _deliver(self, group: PromptGroup) -> None:
        if self.factory.rewards.instant:
            self.factory.score(group)  # microseconds: admission goes on at once, with no hand-off to a thread
        else:  # in a worker thread: a slow reward must not stall the loop that streams the engines' requests
            await asyncio.get_running_loop().run_in_executor(None, self.factory.score, group)
        if group.reward_failure is not None:
            self._drop(group, "reward_failed")
            await self.queue.recheck()  # a drain may have waited for it (`stale_policy: wait`)
            return
        if self.cfg.rollout.dynamic_sampling and zero_variance(group):
            self._drop(group, "zero_variance")
            await self.queue.recheck()
            self.zero_variance_in_a_row += 1
            rounds = self.cfg.rollout.max_sampling_rounds
            if self.zero_variance_in_a_row >= rounds * self.cfg.rollout.batch_size:
                # As many groups as sync's rounds would generate for a rollout, and not one kept.
                raise NothingToTrain.after(self.zero_variance_in_a_row, rounds)
            return
        self.zero_variance_in_a_row = 0
        await self.queue.put(group)
        self.ledger.deliver(group.size, [group])
        self.waiting[group.group_id] = self.in_flight.pop(group.group_id)
        await self.queue.recheck()  # a take waiting for it to leave `in_flight` (`stale_policy: wait`)
        self._changed.set()

    def _drop(self, group: PromptGroup, reason: DropReason) -> None:
        self.ledger.drop(reason, group.size, [group])
        self.in_flight.pop(group.group_id, None)
        self.waiting.pop(group.group_id, None)
        self.groups_dropped += 1
        self._changed.set()

    async def _engine_loop(self, index: int, engine, active: list[PromptGroup]) -> None:
        """Keep the engine's batch full: each call continues the groups in it (streaming: the engine continues
        them, and each round waits for some to end), groups that finished leave for the queue, and admission
        tops the batch up before the next call (round)."""
        advance = self._run_agents if self.factory.agent is not None else \
            self._stream if self.streaming else self._call
        while not self._stopping:
            if not self._running.is_set() and not self._held[index]:
                await self._running.wait()
                continue
            # Cleared before looking, and no await in between: a change after the look wakes the wait.
            self._changed.clear()
            if self._running.is_set():
                active += self._admit(self.group_chunk - len(active))
            if not active:
                await self._changed.wait()
                continue
            await advance(index, engine, active)
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

    async def run(self) -> Ledger:
        """Generate until `stop`; returns the final ledger."""
        restored, self._restored = self._restored, []
        try:
            await asyncio.gather(*(self._engine_loop(index, engine, restored[index:: len(self.engines)])
                                   for index, engine in enumerate(self.engines)))
        finally:
            # What the engines still held was dropped with its groups (`unfinished_at_stop`).
            for collector in self._collectors.values():
                collector.cancel()
            for run in self._agent_runs.values():
                run.cancel()
        return self.ledger

    # -- control from the driver -----------------------------------------------------------------

    async def take(self, count: int, train_version: int,
                   next_train_version: int | None = None) -> tuple[list[PromptGroup], RolloutState]:
        """The oldest `count` groups fresh enough to train on at `train_version`, once the queue holds them
        (fewer only at shutdown), and the `RolloutState` right after taking them.

        Groups too stale for `train_version` are dropped (or regenerated) here, without being sent. Under
        `async.stale_policy: wait` the take also waits until no group still generating would be too stale for the
        next drain, at `next_train_version`, while fresh enough for this one (`_would_go_stale`)."""
        return await self._take_fresh(count, train_version, next_train_version), self.state()

    async def drain(self, count: int, train_version: int, next_train_version: int | None = None) -> tuple[bytes, bytes]:
        """`take` as the driver asks for it, in two objects (the call asks Ray for `num_returns=2`): the
        `DrainSummary` of the groups and the `RolloutState` after taking them, `(summary, state)` `pack`ed, which
        the driver reads; and the groups' samples, `pack`ed, which it hands to the trainer unread."""
        fresh, state = await self.take(count, train_version, next_train_version)
        return pack((DrainSummary.of(fresh), state)), pack([sample for group in fresh for sample in group.samples])

    def _would_go_stale(self, train_version: int, next_train_version: int) -> bool:
        """Whether a group still generating is `stale_if_late`: admitted at the bound's edge, it misses its drain only
        by finishing after it (a long completion among short ones), and the next would drop it."""
        bound = self.cfg.async_.max_weight_staleness
        return any(staleness.stale_if_late(train_version, next_train_version,
                                           group.oldest_possible_version(self.version), bound)
                   for group in self.in_flight.values())

    async def _take_fresh(self, count: int, train_version: int, next_train_version: int | None) -> list[PromptGroup]:
        bound = self.cfg.async_.max_weight_staleness
        waits = self.cfg.async_.stale_policy == "wait" and bound is not None and next_train_version is not None
        ready = (lambda: not self._would_go_stale(train_version, next_train_version)) if waits else None
        fresh: list[PromptGroup] = []
        while len(fresh) < count:
            groups = await self.queue.get(count - len(fresh), ready=ready)
            if not groups:
                break  # the queue was shut down
            for group in groups:
                if staleness.too_stale(train_version, group.oldest_version, bound):
                    self._drop(group, "stale")
                    if self.cfg.async_.stale_policy == "regenerate":
                        self._retry.append(group)
                else:
                    fresh.append(group)
            self._changed.set()
        return fresh

    def report_trained(self, group_ids: list[GroupId], taken: int, trained: int) -> None:
        """The trainer trained on `trained` of the `taken` samples of the drain of `group_ids` (the rest were
        trimmed)."""
        self.ledger.train(taken, trained, [self.waiting.pop(group_id) for group_id in group_ids])

    def report_trained_with_journal(self, group_ids: list[GroupId], taken: int, trained: int) -> list[dict]:
        """`report_trained`, then `take_journal`: the driver's one call per drain after training it."""
        self.report_trained(group_ids, taken, trained)
        return self.take_journal()

    def settle_heap(self) -> None:
        heap.settle()

    def take_journal(self) -> list[dict]:
        """The ledger's journal entries since the last call (the driver appends them to ledger.jsonl)."""
        return self.ledger.take_journal()

    async def update_weights(self, weights: list, version: int) -> list[tuple[int, str]]:
        """Pause generation, load `version` into every engine, resume; returns what each engine serves after
        its load (`RolloutEngine.served_weights`), for the driver to check.

        `weights` is a one-item list holding the reference to the trainer's weights, so that Ray hands
        this actor the reference and not the arrays: each engine fetches them from the object store.

        With partial rollout the call in flight is aborted (a sliced one finishes its slice) and its
        unfinished requests resume from their prefix under the new weights; without, it finishes under the
        old weights first. Under `async.pause_mode: keep` the streamed requests stay in the engines across
        the load."""
        start = time.monotonic()
        self._running.clear()
        if self.derived.keeps_kv_at_sync:
            loaded = await asyncio.gather(*(
                self._awaiting(f"engine {index}'s weight load (version {version})",
                               engine.load_weights_keeping_requests.remote(weights[0], version))
                for index, engine in enumerate(self.engines)))
            kept = {request_id for _, ids in loaded for request_id in ids}
            self.resumed_groups += sum(any(req.request_id in kept for req in group.requests)
                                       for group in self.in_flight.values())
            self._resume(version, start)
            return [served for served, _ in loaded]
        # A sliced call ends within `tokens_per_call` tokens anyway: letting it finish keeps the rows it was
        # about to complete, and its end is the pause point the resume starts from.
        abort = self.partial and self.tokens_per_call is None
        aborts = [engine.abort.remote() for engine in self.engines] if abort else []

        def loads():
            return [engine.load_weights.remote(weights[0], version) for engine in self.engines]

        # An engine runs one call at a time, in order: each load starts as soon as the call in flight has
        # returned, without waiting for this actor to see that return first. A streaming engine would load
        # between two steps of requests still in flight: its load waits until this actor has them back.
        sent = [] if self.streaming else loads()
        await asyncio.gather(*aborts)
        await self._until_idle()
        served = await asyncio.gather(*(self._awaiting(f"engine {index}'s weight load (version {version})", load)
                                        for index, load in enumerate(sent or loads())))
        self._resume(version, start)
        return list(served)

    def _resume(self, version: int, paused_since: float) -> None:
        """Generation goes on after the sync to `version`."""
        self.version = version
        self._running.set()
        self._changed.set()
        self.pause_s += time.monotonic() - paused_since

    async def stop(self) -> None:
        """Stop generating and close the queue; groups left in it stay counted as queued."""
        self._stopping = True
        self._running.set()
        self._changed.set()
        await asyncio.gather(*(engine.abort.remote() for engine in self.engines))
        await self.queue.shutdown()

    async def snapshot(self, last: bool = False) -> bytes:
        """Everything a checkpoint needs from the rollouter, `pack`ed, taken between engine calls: the groups in
        flight (tokens so far, per-token versions) and waiting, the data cursor, the ledger and its journal
        entries not yet taken, the counters and every engine's RNG. Generation is paused meanwhile; calls in
        flight are aborted, and what they generated so far is kept: the weights do not change, so the
        groups go on from their prefix under the same version.

        The `last` snapshot of a run leaves generation paused until `stop`: the data cursor it records is the
        run's last, and a group admitted after it would be a draw beyond that cursor (the audit's check)."""
        self._running.clear()
        await asyncio.gather(*(engine.abort.remote() for engine in self.engines))
        await self._until_idle()
        kill_point("rollouter_snapshot")
        engine_rngs = await asyncio.gather(*(engine.rng_state.remote() for engine in self.engines))
        snapshot = {
            "in_flight": list(self.in_flight.values()),
            "waiting": list(self.waiting.values()),
            "retry": list(self._retry),
            "factory": self.factory.state_dict(),
            "ledger": self.ledger.as_dict(),
            "journal": self.ledger.take_journal(),
            "engine_rngs": engine_rngs,
            "counters": {"version": self.version, "groups_admitted": self.groups_admitted,
                         "groups_dropped": self.groups_dropped, "pause_s": self.pause_s, "busy_s": self.busy_s,
                         "resumed_groups": self.resumed_groups},
        }
        if not self._stopping and not last:
            self._running.set()
            self._changed.set()
        return pack(snapshot)

    async def restore(self, snapshot: bytes) -> list[dict]:
        """Before `run`: take up a `snapshot` from a checkpoint. Waiting groups go back into the queue (over
        its bound, if the trainer had taken some); in-flight groups continue from their prefix, unless their
        oldest token is already too stale for the engines' version: those are dropped (`stale_at_resume`),
        or regenerated under `async.stale_policy: regenerate`. Returns the journal entries of those drops."""
        state = unpack(snapshot)
        self.factory.load_state_dict(state["factory"])
        self.ledger = Ledger.from_dict(state["ledger"])
        counters = state["counters"]
        self.version = counters["version"]
        self.groups_admitted, self.groups_dropped = counters["groups_admitted"], counters["groups_dropped"]
        self.pause_s, self.busy_s, self.resumed_groups = counters["pause_s"], counters["busy_s"], \
            counters["resumed_groups"]
        await asyncio.gather(*(engine.set_rng_state.remote(rng)
                               for engine, rng in zip(self.engines, state["engine_rngs"])))
        self._retry.extend(state["retry"])
        self.queue.refill(state["waiting"])
        self.waiting = {group.group_id: group for group in state["waiting"]}
        bound = self.cfg.async_.max_weight_staleness
        for group in state["in_flight"]:
            self.in_flight[group.group_id] = group
            oldest = group.oldest_token_version
            if oldest is not None and staleness.too_stale(self.version, oldest, bound):
                self._drop(group, "stale_at_resume")
                if self.cfg.async_.stale_policy == "regenerate":
                    self._retry.append(group)
            else:
                self._restored.append(group)
        return self.ledger.take_journal()

    def state(self) -> RolloutState:
        return RolloutState(self.ledger.copy(), self.version, self.queue.size(), self.pause_s, self.busy_s,
                            self.resumed_groups)
