"""The three drivers, simulated: the same order of generation, training and weight syncs as
`fasync/drivers/` and `fasync/rollout/rollouter.py`, with time taken from the cost model.

- sync: generate a rollout (one call per engine, to completion), train, push the weights and wait.
- async: one generator thread runs rollouts in order, each started only while `may_generate` allows it
  and at most `(bound + 1) × interval` ahead; an engine runs calls and weight loads in the order they
  were sent, so a push queues behind the generation in progress and the next rollout gets the weights of
  every push sent before it started.
- fully_async: each engine loop admits groups (queue room, `max_concurrent_samples`, `may_generate` on the
  groups ahead), runs calls of at most `tokens_per_call` tokens, and puts finished groups in the queue,
  oldest version first; the trainer drains `rollout.batch_size` fresh groups, dropping (or regenerating)
  those `too_stale` at its version (under `stale_policy: wait` once no group in flight would miss its drain and
  go stale), and asks for the next drain at once; a weight sync pauses every
  engine, aborts the calls in flight (partial rollout, whole calls), lets sliced calls finish their
  slice or, without partial rollout, waits for the calls to end, loads, and resumes; a trainer that waited
  for that sync sends its next one after a round trip, when the engines have already resumed.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from typing import Optional

from fasync.config.derived import Derived
from fasync.config.schema import FasyncConfig
from fasync.simulate.costs import Costs
from fasync.simulate.lengths import Lengths
from fasync.simulate.state import Call, Group, Recorder, Workload, finish_call, plan_call, split_steps
from fasync.staleness import may_generate, rollouts_ahead, stale_if_late, syncs_after, too_stale, train_version


class Simulation:
    """One config's run in simulated time."""

    def __init__(self, cfg: FasyncConfig, derived: Derived, costs: Costs, lengths: Lengths, weight_bytes: int):
        self.cfg = cfg
        self.derived = derived
        self.costs = costs
        self.static = cfg.rollout.engine == "hf"
        self.n = cfg.rollout.n_samples_per_prompt
        self.engines = cfg.resources.num_rollout_engines
        self.work = Workload(lengths)
        self.ledger = self.work.ledger
        self.recorder = Recorder(self.engines, cfg.rollout.max_new_tokens)
        self.sync_cost = costs.sync(weight_bytes)
        self.loads = [0] * self.engines
        """Weight loads each engine has done: a load empties its prefix cache."""

    def run(self) -> Recorder:
        {"sync": self._sync, "async": self._async, "fully_async": self._fully_async}[self.cfg.mode]()
        return self.recorder

    # -- shared ----------------------------------------------------------------------------------

    def _admit(self, count: int, version: int) -> list[Group]:
        """`count` new groups for weights at `version` to generate."""
        groups = self.work.new_groups(count, self.policy_steps(version))
        self.ledger.admit(self.n * len(groups))
        return groups

    def policy_steps(self, version: int) -> int:
        """Optimizer steps behind the weights of `version`."""
        return self.recorder.clock.published[version]

    def _generate_rollout(self, groups: list[Group], start: float, version: int,
                          engine_free: list[float], slowdown: float) -> float:
        """One call per engine over its share of the groups, each to completion; returns when the last ends."""
        end = start
        for engine in range(self.engines):
            share = groups[engine::self.engines]
            if not share:
                continue
            begin = max(start, engine_free[engine])
            call = plan_call(share, None, version, engine, self.loads[engine], begin, self.costs, self.static,
                             slowdown)
            duration = call.duration
            finish_call(call, None, engine, self.loads[engine])
            self.recorder.engine_busy[engine].append((begin, begin + duration))
            engine_free[engine] = begin + duration
            end = max(end, begin + duration)
        self.ledger.deliver(self.n * len(groups))
        return end

    def _train(self, groups: list[Group], version: int, start: float, slowdown: float) -> tuple[float, int, int]:
        """Train on the groups at `version` from `start`: (end, samples trained, optimizer steps). Each of
        `train.ppo_epochs` passes takes the rollout's steps again, so the samples train, and age in steps, once
        per pass. Each pass costs what the first does: the trainer reshuffles the samples between passes, which
        with several steps a pass changes only how the steps' micro batches pad."""
        steps, trimmed = split_steps(groups, self.derived, self.cfg.train.use_dynamic_global_batch_size)
        steps *= self.cfg.train.ppo_epochs
        runs = [[run for group, count in step for run in group.runs(count)] for step in steps]
        micro, ranks = self.derived.micro_batch_size, self.cfg.resources.trainer_ranks
        duration = self.costs.train_call(runs, micro, ranks, self.derived.ratio_anchor == "recompute") * slowdown
        self.recorder.train_calls.append((duration, slowdown * self.costs.optimizer_steps(runs, micro, ranks)))
        trained = self.n * len(groups) - trimmed
        self.ledger.train(self.n * len(groups), trained)
        self.recorder.train(steps, version)
        self.recorder.trainer_busy.append((start, start + duration))
        return start + duration, trained, len(steps)

    def _slowdown(self, other_busy: bool) -> float:
        return self.costs.overlap_slowdown if other_busy else 1.0

    # -- sync ------------------------------------------------------------------------------------

    def _sync(self) -> None:
        now, version = 0.0, 0
        free = [0.0] * self.engines
        for _ in range(self.cfg.train.num_rollouts):
            groups = self._admit(self.cfg.rollout.batch_size, version)
            started, now = now, self._generate_rollout(groups, now, version, free, 1.0)
            self.recorder.generate_s.append(now - started)
            for group in groups:
                self.recorder.hand_over(group, stale=False)
            now, trained, steps = self._train(groups, version, now, 1.0)
            version += 1
            self.recorder.publish(version)
            self.loads = [loads + 1 for loads in self.loads]
            now += self.sync_cost  # the driver waits for every engine to load
            self.recorder.sync_held_s.append(self.sync_cost)
            free = [now] * self.engines
            self.recorder.record(now, trained, steps, self.ledger)

    # -- async -----------------------------------------------------------------------------------

    def _async(self) -> None:
        cfg = self.cfg
        interval, bound = cfg.async_.update_weights_interval, cfg.async_.max_weight_staleness
        total = cfg.train.num_rollouts
        lookahead = rollouts_ahead(bound, interval)
        pushes: list[float] = []
        """When each push was sent: version v + 1 at pushes[v]."""
        applied = 0
        engine_free = [0.0] * self.engines
        generator_free = 0.0
        pending: deque[int] = deque()
        submitted: dict[int, float] = {}
        generated: dict[int, tuple[float, list[Group]]] = {}
        next_rollout, now, version = 0, 0.0, 0
        for rollout in range(total):
            while next_rollout < total and len(pending) < lookahead and may_generate(next_rollout, version,
                                                                                     interval, bound):
                pending.append(next_rollout)
                submitted[next_rollout] = now
                next_rollout += 1
            self.recorder.queue(now, len(pending) - 1)
            while rollout not in generated:
                index = min(k for k in pending if k not in generated)
                start = max(submitted[index], generator_free)
                # The loads sent before this rollout's calls run first on each engine, in order.
                while applied < len(pushes) and pushes[applied] <= start:
                    for engine in range(self.engines):
                        engine_free[engine] = max(pushes[applied], engine_free[engine]) + self.sync_cost
                        self.loads[engine] += 1
                    applied += 1
                groups = self._admit(cfg.rollout.batch_size, applied)
                training = any(begin < start + 1e-12 < end for begin, end in self.recorder.trainer_busy[-1:])
                end = self._generate_rollout(groups, start, applied, engine_free, self._slowdown(training))
                generated[index] = (end, groups)
                self.recorder.generate_s.append(end - start)
                generator_free = end
            end, groups = generated.pop(rollout)
            pending.popleft()
            now = max(now, end)
            for group in groups:
                self.recorder.hand_over(group, stale=False)
            generating = any(end_ > now for busy in self.recorder.engine_busy for _, end_ in busy[-1:])
            now, trained, steps = self._train(groups, train_version(rollout, interval), now,
                                              self._slowdown(generating))
            if syncs_after(rollout, interval):
                version += 1
                self.recorder.publish(version)
                pushes.append(now)  # sent without waiting: the engines load it after their call in progress
            self.recorder.record(now, trained, steps, self.ledger)
        self.recorder.queue(now, 0)

    # -- fully_async -----------------------------------------------------------------------------

    def _fully_async(self) -> None:
        FullyAsync(self).run()


class FullyAsync:
    """The rollouter's engine loops, its queue and the trainer's drains, as events in time order."""

    def __init__(self, sim: Simulation):
        self.sim = sim
        cfg = sim.cfg
        self.cfg = cfg
        self.derived = sim.derived
        self.n = cfg.rollout.n_samples_per_prompt
        self.batch = cfg.rollout.batch_size
        self.bound = cfg.async_.max_weight_staleness
        self.interval = cfg.async_.update_weights_interval
        self.budget = self.derived.tokens_per_call
        self.abort_on_sync = cfg.async_.partial_rollout and self.budget is None
        self.chunk = max(1, math.ceil(self.derived.max_concurrent_samples / self.n / sim.engines))
        self.events: list = []
        self.order = itertools.count()
        self.now = 0.0
        # The rollouter.
        self.queue: list = []
        self.version = 0
        self.in_flight_groups = 0
        self.admitted = 0
        self.dropped_groups = 0
        self.retry: deque[Group] = deque()
        self.active: list[list[Group]] = [[] for _ in range(sim.engines)]
        self.calls: list[Optional[Call]] = [None] * sim.engines
        self.call_ids = [0] * sim.engines
        self.waiting: set[int] = set()
        """Engines with nothing admissible, waiting for a change."""
        self.paused = False
        self.sync_version: Optional[int] = None
        self.sync_started = 0.0
        self.loads_left: set[int] = set()
        self.sync_done_at: Optional[float] = 0.0
        # The trainer.
        self.trainer_version = 0
        self.drain = 0
        self.request: Optional[int] = None
        """Groups the outstanding take waits for."""
        self.request_drain = 0
        """The drain the outstanding take is for."""
        self.taken: Optional[list[Group]] = None
        self.fresh: list[Group] = []
        self.trainer_waits: Optional[str] = None
        """What the trainer waits for: `take` (groups) or `sync` (the previous push)."""
        self.trainer_busy_until = 0.0
        self.last_trained = (0, 0)
        self.finished = False

    # -- the event loop --------------------------------------------------------------------------

    def at(self, time: float, action, *args) -> None:
        heapq.heappush(self.events, (time, next(self.order), action, args))

    def run(self) -> None:
        for engine in range(self.sim.engines):
            self.at(0.0, self.engine_ready, engine)
        self.at(0.0, self.start_drain)
        while self.events and not self.finished:
            self.now, _, action, args = heapq.heappop(self.events)
            action(*args)
        self.sim.recorder.queue(self.now, len(self.queue))

    def changed(self) -> None:
        for engine in sorted(self.waiting):
            self.at(self.now, self.engine_ready, engine)
        self.waiting.clear()

    # -- the rollouter ---------------------------------------------------------------------------

    def admit(self, most: int) -> list[Group]:
        room = self.derived.max_queue_size - len(self.queue) - self.in_flight_groups
        slots = (self.derived.max_concurrent_samples - self.in_flight_groups * self.n) // self.n
        count = 0
        while count < min(room, slots, most) and may_generate(
                (self.admitted - self.dropped_groups + count) // self.batch, self.version, self.interval, self.bound):
            count += 1
        groups = []
        while self.retry and len(groups) < count:
            groups.append(self.sim.work.again(self.retry.popleft(), self.sim.policy_steps(self.version)))
            self.sim.ledger.admit(self.n)
        groups += self.sim._admit(count - len(groups), self.version)
        for group in groups:
            group.admitted_version = self.version
        self.admitted += len(groups)
        self.in_flight_groups += len(groups)
        return groups

    def engine_ready(self, engine: int) -> None:
        if self.paused or self.calls[engine] is not None:
            return  # resumed by the end of the sync
        active = self.active[engine]
        active += self.admit(self.chunk - len(active))
        if not active:
            self.waiting.add(engine)
            return
        sim = self.sim
        for group in active:
            if group.newest_version is not None and group.newest_version != self.version and not group.finished:
                sim.recorder.resumed_groups += 1
        call = plan_call(active, self.budget, self.version, engine, sim.loads[engine], self.now, sim.costs, sim.static,
                         sim._slowdown(self.trainer_busy_until > self.now))
        self.calls[engine] = call
        self.call_ids[engine] += 1
        self.at(self.now + call.duration, self.call_end, engine, self.call_ids[engine], None)

    def call_end(self, engine: int, call_id: int, steps: Optional[int]) -> None:
        if call_id != self.call_ids[engine]:
            return  # an abort ended this call earlier
        call = self.calls[engine]
        self.calls[engine] = None
        sim = self.sim
        sim.recorder.engine_busy[engine].append((call.start, self.now))
        finish_call(call, steps, engine, sim.loads[engine])
        active = self.active[engine]
        for group in [g for g in active if g.finished]:
            heapq.heappush(self.queue, (group.oldest_version, next(self.order), group))
            sim.recorder.queue(self.now, len(self.queue))
            self.in_flight_groups -= 1
            sim.ledger.deliver(self.n)
        self.active[engine] = [g for g in active if not g.finished]
        self.changed()
        self.serve_take()
        if self.sync_version is not None and engine in self.loads_left:
            self.at(self.now + sim.sync_cost, self.load_end, engine)
        else:
            self.at(self.now, self.engine_ready, engine)

    def load_end(self, engine: int) -> None:
        self.sim.loads[engine] += 1
        self.loads_left.discard(engine)
        if self.loads_left:
            return
        self.version = self.sync_version
        self.sync_version = None
        self.paused = False
        self.sync_done_at = self.now
        self.sim.recorder.pause_s += self.now - self.sync_started
        self.waiting.clear()
        for other in range(self.sim.engines):
            self.at(self.now, self.engine_ready, other)
        if self.trainer_waits == "sync":
            # The trainer learns that this sync has ended through a round trip (`update_weights` returns
            # to the driver, which then sends the next), while the engine loops, inside the rollouter,
            # resume at once: the engines' next calls start under this version before the next push
            # arrives. Scheduled after their `engine_ready`, at the same time, it keeps that order.
            self.trainer_waits = None
            self.at(self.now, self.issue_sync)

    def begin_sync(self, version: int) -> None:
        """`Rollouter.update_weights`: pause; abort the calls in flight (partial rollout, whole calls) or let
        them end; load each engine once its call has returned; resume when every engine has loaded."""
        self.paused = True
        self.sync_version = version
        self.sync_started = self.now
        self.sync_done_at = None
        self.loads_left = set(range(self.sim.engines))
        for engine, call in enumerate(self.calls):
            if call is None:
                self.at(self.now + self.sim.sync_cost, self.load_end, engine)
            elif self.abort_on_sync:
                costs, static, takes = self.sim.costs, self.sim.static, call.takes()
                steps = costs.steps_done_by((self.now - call.start) / call.slowdown, call.prefill_tokens, takes,
                                            static)
                # The step in progress finishes first: the call returns at that step's end.
                ends = call.start + call.slowdown * costs.call_time_to(steps, call.prefill_tokens, takes, static)
                self.call_ids[engine] += 1
                self.at(max(ends, self.now), self.call_end, engine, self.call_ids[engine], steps)

    # -- the trainer -----------------------------------------------------------------------------

    def take(self, count: int, drain: int) -> None:
        self.request, self.request_drain = count, drain
        self.serve_take()

    def serve_take(self) -> None:
        """`GroupQueue.get`: the outstanding take gets its groups, oldest version first, once there are enough (and,
        under `stale_policy: wait`, once no group in flight would go stale by missing its drain)."""
        if self.request is None or len(self.queue) < self.request or self.would_go_stale(self.request_drain):
            return
        self.taken = [heapq.heappop(self.queue)[2] for _ in range(self.request)]
        self.request = None
        self.sim.recorder.queue(self.now, len(self.queue))
        self.changed()
        if self.trainer_waits == "take":
            self.trainer_waits = None
            self.use_taken()

    def would_go_stale(self, drain: int) -> bool:
        """`Rollouter._would_go_stale` for the take of `drain`, under `stale_policy: wait`."""
        if self.cfg.async_.stale_policy != "wait" or self.bound is None:
            return False
        now, later = train_version(drain, self.interval), train_version(drain + 1, self.interval)
        return any(stale_if_late(now, later, group.admitted_version, self.bound)
                   for active in self.active for group in active)

    def start_drain(self) -> None:
        self.fresh = []
        if self.taken is None and self.request is None:
            self.take(self.batch, self.drain)
        if self.taken is not None:
            self.use_taken()
        else:
            self.trainer_waits = "take"

    def use_taken(self) -> None:
        """Check the taken groups at the trainer's version; take more until the drain has enough fresh ones."""
        groups, self.taken = self.taken, None
        sim = self.sim
        stale = [too_stale(self.trainer_version, g.oldest_version, self.bound) for g in groups]
        for group, is_stale in zip(groups, stale):
            sim.recorder.hand_over(group, is_stale)
        if any(stale):
            dropped = [g for g, is_stale in zip(groups, stale) if is_stale]
            sim.ledger.drop("stale", self.n * len(dropped))
            self.dropped_groups += len(dropped)
            if self.cfg.async_.stale_policy == "regenerate":
                self.retry.extend(dropped)
            self.changed()
        self.fresh += [g for g, is_stale in zip(groups, stale) if not is_stale]
        if len(self.fresh) < self.batch:
            self.take(self.batch - len(self.fresh), self.drain)
            if self.taken is not None:
                self.use_taken()
            elif self.request is not None:
                self.trainer_waits = "take"
            return
        self.take(self.batch, self.drain + 1)  # the next drain's groups, asked for at once
        generating = any(call is not None for call in self.calls)
        end, trained, steps = sim._train(self.fresh, self.trainer_version, self.now, sim._slowdown(generating))
        self.trainer_busy_until = end
        self.last_trained = (trained, steps)
        self.at(end, self.train_end)

    def train_end(self) -> None:
        if not syncs_after(self.drain, self.interval):
            self.end_drain()
        elif self.sync_done_at is None:
            self.trainer_waits = "sync"  # `FullyAsync.sync` waits for the previous push before sending this one
        else:
            self.issue_sync()

    def issue_sync(self) -> None:
        self.trainer_version += 1
        self.sim.recorder.publish(self.trainer_version)
        self.begin_sync(self.trainer_version)
        self.end_drain()

    def end_drain(self) -> None:
        trained, steps = self.last_trained
        self.sim.recorder.record(self.now, trained, steps, self.sim.ledger)
        self.drain += 1
        if self.drain >= self.cfg.train.num_rollouts:
            self.finished = True
        else:
            self.start_drain()
