"""fully_async: a rollouter streams prompt groups into a bounded queue; the trainer drains them.

The queue lives in the rollouter actor, and one call per drain brings the groups together with the
ledger and queue counters that the drain's records report.

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
from fasync.launch.actors import unpack
from fasync.rollout.rollouter import Rollouter

RemoteRollouter = ray.remote(num_cpus=0)(Rollouter)


class RolloutStopped(RuntimeError):
    pass


class FullyAsync:
    def __init__(self, run: Run):
        self.run = run
        cfg = run.cfg
        self.rollouter = RemoteRollouter.remote(cfg, run.engines, run.factory)
        self.running = self.rollouter.run.remote()
        self.got = 0
        self.dropped: Counter = Counter()
        self.pending_sync = None
        self.prefetched = None
        self.last_pause_s = 0.0
        self.last_busy_s = 0.0

    def _wait(self, ref):
        """ray.get that fails fast when the rollouter dies instead of waiting forever for its output."""
        ready, _ = ray.wait([ref, self.running], num_returns=1)
        if ready[0] == self.running and ref != self.running:
            ray.get(self.running)  # raises the rollouter's error, if it had one
            raise RolloutStopped("the rollouter stopped before the run was finished")
        return ray.get(ref)

    def drain(self) -> tuple[RolloutBatch, float, dict]:
        """`rollout.batch_size` groups fresh enough to train on at the current version, the seconds waited
        for them, and the rollouter's state right after the last of them was taken.

        The next drain's groups are asked for as soon as this one's are in, so that the round trip to the
        rollouter overlaps training. They are checked for staleness only when that drain uses them, at the
        version it trains with, and count as queued until then."""
        cfg = self.run.cfg
        bound = cfg.async_.max_weight_staleness
        fresh = []
        start = time.monotonic()
        while len(fresh) < cfg.rollout.batch_size:
            request = self.prefetched or self.rollouter.take.remote(cfg.rollout.batch_size - len(fresh))
            self.prefetched = None
            groups, state = unpack(self._wait(request))
            self.got += sum(g.size for g in groups)
            stale = [g for g in groups if bound is not None and self.run.version - g.oldest_version > bound]
            if stale:
                self.dropped["stale"] += sum(g.size for g in stale)
                self.rollouter.report_stale.remote(stale)
            fresh += [g for g in groups if g not in stale]
        waited = time.monotonic() - start
        self.prefetched = self.rollouter.take.remote(cfg.rollout.batch_size)
        return RolloutBatch(fresh, generate_time_s=0.0), waited, state

    def sync(self) -> float:
        """Start pushing the new version; the trainer goes on with the next drain meanwhile."""
        start = time.monotonic()
        if self.pending_sync is not None:
            self._wait(self.pending_sync)
        version = self.run.version + 1
        self.pending_sync = self.rollouter.update_weights.remote([self.run.trainer.state_dict_ref()], version)
        self.run.version = version
        return time.monotonic() - start

    def finish(self) -> dict:
        """Stop generating and take the final ledger once every engine loop has ended; groups still
        in the queue stay counted as queued."""
        if self.pending_sync is not None:
            self._wait(self.pending_sync)
        ray.get(self.rollouter.stop.remote())
        return self.account(ray.get(self.running))

    def account(self, rollouter: dict) -> dict:
        """The run's ledger from the rollouter's counts (produced, in flight, put) and the driver's own
        (taken, stale, trained, trimmed)."""
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
        except Exception:  # noqa: BLE001 - shutting down after a failure must not mask it
            pass
        ray.kill(self.rollouter)


def run_fully_async(run: Run) -> None:
    fa = FullyAsync(run)
    interval = run.cfg.async_.update_weights_interval
    try:
        run.wait_until_ready()
        for drain in range(run.cfg.train.num_rollouts):
            batch, waited, state = fa.drain()
            records = run.train(drain, batch, {"trainer_wait_s": waited})
            sync_time = fa.sync() if (drain + 1) % interval == 0 else 0.0
            fa.account(state)
            # Engine time spent generating since the last drain (spread over the engines' calls).
            records[0]["generate_time_s"] = state["busy_s"] - fa.last_busy_s
            for record in records:
                record.update(
                    queue_size=state["queue_size"],
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
