"""fully_async: a rollouter streams prompt groups into a bounded queue; the trainer drains them.

Each drain takes exactly `rollout.batch_size` groups, trains `num_steps_per_rollout`
optimizer steps on them (one by default: see docs/fully-async.md) and, every
`async.update_weights_interval` drains, pushes new weights through the rollouter.
Groups staler than `async.max_weight_staleness` at drain time are never trained:
they are dropped (or regenerated) and counted.
"""

from __future__ import annotations

import time
from collections import Counter

import ray

from fasync.drivers.common import RolloutBatch, Run
from fasync.rollout.queue import GroupQueue
from fasync.rollout.rollouter import Rollouter

RemoteQueue = ray.remote(num_cpus=0)(GroupQueue)
RemoteRollouter = ray.remote(num_cpus=0)(Rollouter)


class RolloutStopped(RuntimeError):
    pass


class FullyAsync:
    def __init__(self, run: Run):
        self.run = run
        cfg = run.cfg
        self.queue = RemoteQueue.remote(run.derived.max_queue_size)
        self.rollouter = RemoteRollouter.remote(cfg, run.engines, self.queue, run.factory)
        self.running = self.rollouter.run.remote()
        self.got = 0
        self.dropped: Counter = Counter()
        self.pending_sync = None
        self.last_pause_s = 0.0
        self.last_busy_s = 0.0

    def _wait(self, ref):
        """ray.get that fails fast when the rollouter dies instead of waiting forever for its output."""
        ready, _ = ray.wait([ref, self.running], num_returns=1)
        if ready[0] == self.running and ref != self.running:
            ray.get(self.running)  # raises the rollouter's error, if it had one
            raise RolloutStopped("the rollouter stopped before the run was finished")
        return ray.get(ref)

    def drain(self) -> tuple[RolloutBatch, float]:
        """`rollout.batch_size` groups fresh enough to train on at the current version."""
        cfg = self.run.cfg
        bound = cfg.async_.max_weight_staleness
        fresh = []
        start = time.monotonic()
        while len(fresh) < cfg.rollout.batch_size:
            groups = self._wait(self.queue.get.remote(cfg.rollout.batch_size - len(fresh)))
            self.got += sum(g.size for g in groups)
            stale = [g for g in groups if bound is not None and self.run.version - g.oldest_version > bound]
            if stale:
                self.dropped["stale"] += sum(g.size for g in stale)
                self.rollouter.report_stale.remote(stale)
            fresh += [g for g in groups if g not in stale]
        waited = time.monotonic() - start
        return RolloutBatch(fresh, generate_time_s=0.0), waited

    def sync(self) -> float:
        """Start pushing the new version; the trainer goes on with the next drain meanwhile."""
        start = time.monotonic()
        if self.pending_sync is not None:
            self._wait(self.pending_sync)
        version = self.run.version + 1
        self.pending_sync = self.rollouter.update_weights.remote(self.run.trainer.state_dict_ref(), version)
        self.run.version = version
        return time.monotonic() - start

    def ledger(self) -> dict:
        return self._account(self._wait(self.rollouter.ledger.remote()))

    def finish(self) -> dict:
        """Stop generating and take the final ledger once every engine loop has ended; groups still
        in the queue stay counted as queued."""
        if self.pending_sync is not None:
            self._wait(self.pending_sync)
        ray.get(self.rollouter.stop.remote())
        ray.get(self.queue.shutdown.remote())
        return self._account(ray.get(self.running))

    def _account(self, rollouter: dict) -> dict:
        consumed = self.run.ledger.consumed
        trimmed = self.run.ledger.dropped.get("trimmed", 0)
        dropped = Counter(rollouter["dropped"]) + self.dropped + Counter({"trimmed": trimmed})
        ledger = self.run.ledger
        ledger.produced = rollouter["produced"]
        ledger.in_flight = rollouter["in_flight"]
        ledger.queued = rollouter["put"] - self.got
        ledger.dropped = dropped
        ledger.consumed = consumed
        return rollouter

    def close(self) -> None:
        try:
            ray.get(self.rollouter.stop.remote(), timeout=10)
            ray.get(self.queue.shutdown.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - shutting down after a failure must not mask it
            pass
        for actor in (self.rollouter, self.queue):
            ray.kill(actor)


def run_fully_async(run: Run) -> None:
    fa = FullyAsync(run)
    interval = run.cfg.async_.update_weights_interval
    try:
        for drain in range(run.cfg.train.num_rollouts):
            batch, waited = fa.drain()
            records = run.train(drain, batch, {"trainer_wait_s": waited})
            sync_time = fa.sync() if (drain + 1) % interval == 0 else 0.0
            state = fa.ledger()
            queue_stats = ray.get(fa.queue.stats.remote())
            # Engine time spent generating since the last drain (spread over the engines' calls).
            records[0]["generate_time_s"] = state["busy_s"] - fa.last_busy_s
            for record in records:
                record.update(
                    queue_size=queue_stats["queue_size"],
                    rollouter_pause_s=state["pause_s"] - fa.last_pause_s,
                    **{f"dropped_{reason}": count for reason, count in state["dropped"].items()},
                    dropped_stale=fa.dropped["stale"],
                    resumed_groups=state["resumed_groups"],
                )
            fa.last_pause_s, fa.last_busy_s = state["pause_s"], state["busy_s"]
            run.write(records, sync_time)
            if run.reached_target():
                break
        fa.finish()
    finally:
        fa.close()
