"""fully_async: a rollouter streams prompt groups into a bounded queue; the trainer drains them.

The queue and the sample ledger live in the rollouter actor. One call per drain (`Rollouter.drain`) returns two
objects: the drain's summary with the rollouter's state (`RolloutState`), which the drain's records report, and
its samples, which the driver passes to the trainer's call as a reference without reading them (`Drain`).

Each drain takes exactly `rollout.batch_size` groups, trains `num_steps_per_rollout`
optimizer steps on them (one by default: see docs/fully-async.md) and, every
`async.update_weights_interval` drains, pushes new weights through the rollouter.
Groups staler than `async.max_weight_staleness` at the version the drain trains at are
never trained: the rollouter drops (or regenerates) and counts them.

A checkpoint waits for the weight sync in progress and the trained reports, then saves the rollouter's
snapshot: the groups queued, taken by the next drain and in flight, with their tokens so far. A resumed run
puts them back (`Rollouter.restore`).
"""

from __future__ import annotations

import ray

from fasync import staleness
from fasync.checkpoint.run import ModeCheckpoint
from fasync.drivers.common import Run
from fasync.drivers.drain import Drain
from fasync.drivers.loop import DriverLoop, Stopwatch
from fasync.drivers.weight_sync import PendingSync
from fasync.errors import ActorFailed, ConfigurationError, RunFault, describe_failure
from fasync.killpoints import kill_point
from fasync.launch.actors import RolloutActor
from fasync.launch.faults import POLL_S
from fasync.metrics.ledger import Ledger
from fasync.metrics.steps import trained_samples
from fasync.rollout.rollouter import RolloutState
from fasync.wire import pack, unpack


class RolloutStopped(RuntimeError):
    pass


class FullyAsyncDriver(DriverLoop):
    """The rollouter owns the run's ledger; `ledger` is the copy it sent last."""

    mode = "fully_async"

    def __init__(self, run: Run):
        super().__init__(run)
        self.interval = run.cfg.async_.update_weights_interval
        self.rollouter = None
        self.running = None
        """The rollouter's `run` call: its generation, which returns the final ledger once stopped."""
        self.prefetched = None
        """The next drain's `take`, asked for as soon as this drain's groups are in."""
        self.pending_sync: PendingSync | None = None
        self.reports: list = []
        """`report_trained_with_journal` calls whose journal entries are not yet written."""
        self.seen = RolloutState()
        """The rollouter's state at the previous drain: its totals become per-drain figures."""

    def setup(self) -> None:
        """Start the rollouter on the run's engines (with what it held at the resumed checkpoint), then wait
        for the run to be ready."""
        run = self.run
        self.rollouter = RolloutActor.remote(run.resolved, run.engines, run.factory,
                                              actor_names=run.watchdog.actors)
        run.watchdog.name_actors([self.rollouter], ["the rollouter"])
        if "rollouter" in self.resumed_state:
            run.journal.write(ray.get(self.rollouter.restore.remote(pack(self.resumed_state["rollouter"]))))
        self.running = self.rollouter.run.remote()
        if self.resumed_state:
            self.seen = ray.get(self.rollouter.state.remote())
        super().setup()

    def loop(self) -> None:
        run = self.run
        for drain in range(run.start_rollout, run.cfg.train.num_rollouts):
            with Stopwatch() as wait:
                batch, state = self.drain(drain)
            records = run.train_batch(drain, batch, {"trainer_wait_s": wait.seconds})
            self.reports.append(self.rollouter.report_trained_with_journal.remote(
                batch.group_ids, batch.figures.num_samples, trained_samples(records)))
            with Stopwatch() as sync:
                if staleness.syncs_after(drain, self.interval):
                    self.sync()
            self.ledger = state.ledger
            add_rollouter_figures(records, state, self.seen)
            self.seen = state
            self._write_reports(keep=1)
            if self.end_rollout(records, sync.seconds, batch):
                break
        self.save_last_checkpoint()
        self.finish()

    def drain(self, drain: int) -> tuple[Drain, RolloutState]:
        """`rollout.batch_size` groups fresh enough to train on at the current version, and the rollouter's
        state right after they were taken.

        The next drain's groups are asked for as soon as this one's are in, so that the round trip to the
        rollouter overlaps training; the rollouter checks them for staleness at the version that drain
        will train at, and they count as queued until then."""
        summary_ref, samples_ref = self.prefetched or self._take(drain)
        summary, state = unpack(self._wait(summary_ref, "the queue (the rollouter's take)"))
        if len(summary.groups) < self.run.cfg.rollout.batch_size:
            raise RolloutStopped("the rollouter stopped before the run was finished")
        self.prefetched = self._take(drain + 1)
        kill_point("prefetch")
        return Drain(summary, samples_ref), state

    def _take(self, drain: int) -> tuple:
        """The rollouter's two objects for drain `drain` (`Rollouter.drain`): its summary with the rollouter's
        state, and its samples."""
        return self.rollouter.drain.options(num_returns=2).remote(
            self.run.cfg.rollout.batch_size, staleness.train_version(drain, self.interval),
            staleness.train_version(drain + 1, self.interval))

    def settle_heaps(self) -> None:
        self.run.settle_heaps(self.rollouter)

    def sync(self) -> None:
        """Start pushing the new version; the trainer goes on with the next drain meanwhile (on the `ipc` and
        `nccl` transports once its ranks have sent it: the engines take it while the rollouter holds
        generation, and report it through the rollouter as on the `cpu` path)."""
        self.finish_sync()
        self.pending_sync = self.run.weights.hand_off(self.run.step, self.rollouter.update_weights.remote)

    def finish_sync(self) -> None:
        """Wait for the weight sync under way, and check what every engine serves after it."""
        if self.pending_sync is not None:
            pending = self.pending_sync
            self.run.weights.finish(pending, self._wait(pending.call, f"the weight sync to version {pending.version}"))
            self.pending_sync = None

    def checkpoint_state(self, last: bool = False) -> ModeCheckpoint:
        """The rollouter's snapshot, once the weight sync in progress and the trained reports are done (so that
        the engines hold the trainer's version and the ledger counts every drain trained). The `last` one leaves
        generation paused: nothing is drawn after the cursor the run's last checkpoint records."""
        self.finish_sync()
        self._write_reports()
        snapshot = unpack(self._wait(self.rollouter.snapshot.remote(last), "the rollouter's snapshot"))
        self.ledger = Ledger.from_dict(snapshot["ledger"])
        return ModeCheckpoint(self.ledger, {"rollouter": snapshot}, journal=snapshot.pop("journal"),
                              engine_rngs=snapshot["engine_rngs"], draws=snapshot["factory"]["draws"])

    def _write_reports(self, keep: int = 0) -> None:
        """Wait for the trained reports but the last `keep`, and write the journal entries they took, in order. The
        drain just trained keeps its report running while the next one trains: nothing waits for its round trip."""
        done, self.reports = self.reports[:len(self.reports) - keep], self.reports[len(self.reports) - keep:]
        for entries in self.run.watchdog.get(done, ["the rollouter's ledger report"] * len(done)):
            self.run.journal.write(entries)

    def finish(self) -> None:
        """Stop generating and take the final ledger once every engine loop has ended; groups still
        in the queue stay counted as queued."""
        self.finish_sync()
        self._write_reports()
        self.run.watchdog.get([self.rollouter.stop.remote()], ["the rollouter's stop"])
        self.ledger = self.run.watchdog.get([self.running], ["the rollouter's last generate calls"])[0]
        self.running = None
        self.run.journal.write(ray.get(self.rollouter.take_journal.remote()))  # the engine loops have ended

    def _wait(self, ref, label: str):
        """The result of a call to the rollouter, failing fast when the rollouter dies (with its error, which
        names the engine when an engine failed), and when the run stalls (with what the rollouter waits for)."""
        with self.run.watchdog.waiting([label], detail=self._rollouter_waits):
            while True:
                ready, _ = ray.wait([ref, self.running], num_returns=1, timeout=POLL_S)
                if ready:
                    break
                self.run.watchdog.check()
        if ready[0] == self.running and ref != self.running:
            try:
                ray.get(self.running)  # raises the rollouter's error, if it had one
            except ConfigurationError:
                raise  # bad input (a reward that is not a number): its own message says it all
            except Exception as error:  # noqa: BLE001 - re-raised with the rollouter named
                if isinstance(getattr(error, "cause", None), RunFault):
                    raise error.cause from None  # a fault of the run's own (nothing to train on): its message
                raise ActorFailed(f"the rollouter failed: {describe_failure(error, self.run.watchdog.actors)}") \
                    from None
            raise RolloutStopped("the rollouter stopped before the run was finished")
        return self.run.watchdog.fetch(ref, label)

    def _rollouter_waits(self) -> list[str]:
        return [f"the rollouter waits for {wait}" for wait in ray.get(self.rollouter.waiting_on.remote(), timeout=5)]

    def cleanup(self) -> None:
        """End the rollouter; a run that stops early takes its ledger as generation stopped, so that what
        was in flight is accounted for."""
        if self.running is not None:
            try:
                ray.get(self.rollouter.stop.remote(), timeout=10)
                self.ledger = ray.get(self.running, timeout=10)
            except Exception:  # noqa: BLE001 - shutting down after a failure must not mask it
                # An engine loop failed: the ledger as the rollouter holds it, with what that engine had in flight.
                try:
                    self.ledger = ray.get(self.rollouter.state.remote(), timeout=5).ledger
                except Exception:  # noqa: BLE001 - the rollouter itself is gone: the last drain's copy stays
                    pass
        if self.rollouter is not None:
            ray.kill(self.rollouter)


def add_rollouter_figures(records: list[dict], state: RolloutState, seen: RolloutState) -> None:
    """What a drain's records say about the rollouter: its `state` now, and its totals since it was `seen` at the
    previous drain."""
    # Engine time spent generating since the last drain (spread over the engines' calls).
    records[0]["generate_time_s"] = state.busy_s - seen.busy_s
    dropped = state.ledger.dropped - seen.ledger.dropped
    for record in records:
        record.update(
            queue_size=state.queue_size,
            rollouter_pause_s=state.pause_s - seen.pause_s,
            # Trimming happens in the trainer, and every mode counts it in the ledger only.
            **{f"dropped_{reason}": dropped[reason] for reason in state.ledger.dropped
               if reason not in ("trimmed", "stale")},
            dropped_stale=dropped["stale"],
            resumed_groups=state.resumed_groups,
        )
