"""What the three drivers share: one run's actors and the parts they work through, started and ended together."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import ray

from fasync import checkpoint
from fasync.checkpoint.run import DriverState, ModeCheckpoint, RunCheckpoints, Standing
from fasync.drivers.generation import RolloutBatch
from fasync.drivers.weight_sync import WeightSync
from fasync.launch.actors import TrainerGroup, start_engines
from fasync.launch.faults import Watchdog
from fasync.launch.placement import Placement
from fasync.launch.plan import Resolved
from fasync.metrics.ledger import Journal, Ledger
from fasync.metrics.progress import Progress
from fasync.metrics.samples import SampleLog
from fasync.metrics.steps import StepLog, StepRecords
from fasync.metrics.stops import StopCriteria
from fasync.metrics.trackers import open_trackers
from fasync.metrics.writer import MetricsWriter
from fasync.rollout.groups import GroupFactory
from fasync.weights.transport import check_transport, transport_of

if TYPE_CHECKING:
    from fasync.drivers.drain import Drain


class Run:
    """One training run's actors (the engines and the trainer ranks, on the GPUs the plan reserves) and the parts
    every driver works through: the weight versions (`weights`), the step records (`records`, written by `log`),
    the stop criteria (`stops`), the ledger's journal and the checkpoints; the sample ledger is the driver's
    (`Driver.ledger`), where the samples are. Building a `Run` starts nothing; `start` opens the run's files, starts
    the actors, takes up the checkpoint it resumes from (`resume`; the caller read its driver.pt, `resume_state`,
    before any actor started) and starts pushing the trainer's weights; `close` ends what it started."""

    def __init__(self, resolved: Resolved, factory: GroupFactory, run_dir: Path, progress: Progress,
                 engines: list | None = None, resume: checkpoint.Checkpoint | None = None,
                 resume_state: dict | None = None, eval_prompts=None):
        self.resolved = resolved
        """The config with what follows from it (fasync.launch.plan.resolve), which the actors are given too."""
        self.cfg = cfg = resolved.config
        self.factory = factory
        self.eval_prompts = eval_prompts
        """The eval set (`fasync.data.held_out.EvalPrompts`) the driver evaluates on; None: no evaluation."""
        self.run_dir = run_dir
        self.progress = progress
        check_transport(cfg)
        self.writer: MetricsWriter | None = None
        self.journal: Journal | None = None
        self.samples: SampleLog | None = None
        self.log: StepLog | None = None
        self.records = StepRecords()
        self.stops = StopCriteria(cfg.train.target_reward)
        self.watchdog = Watchdog(cfg.train.stall_timeout_s)
        self.engines: list = engines or []
        self._owns_engines = engines is None
        self.placement: Placement | None = None
        self.trainer: TrainerGroup | None = None
        self.weights: WeightSync | None = None
        self.checkpoints: RunCheckpoints | None = None
        self._resume_from = resume
        self.resumed = None if resume_state is None else DriverState.from_dict(resume_state)
        """driver.pt of the checkpoint the run resumes from: the driver takes up its ledger and its mode's part."""
        self.start_rollout = 0
        """The first rollout (drain) this process trains: 0, or where the resumed checkpoint left off."""

    def start(self) -> None:
        """Reserve every GPU of the run at once (fasync/launch/plan.py), start the engines and the trainer, take
        up the resumed checkpoint, and start pushing the trainer's weights (version 0, or the resumed version)
        without waiting: a driver starts its own actors before `wait_until_ready`, so that they start up
        alongside. The run's files (metrics.jsonl and the trackers, ledger.jsonl) open first."""
        cfg = self.cfg
        self.writer = MetricsWriter(self.run_dir, cfg.mode, open_trackers(
            cfg.logging, self.run_dir, cfg.model_dump(mode="json", by_alias=True)))
        self.journal = Journal(self.run_dir)
        self.samples = SampleLog(self.run_dir, cfg.logging.samples_every, cfg.logging.samples_per_write,
                                 self.writer.trackers)
        self.log = StepLog(self.writer, self.progress, cfg.train.max_bad_steps)
        self.placement = Placement(self.resolved.plan)
        if self._owns_engines:
            self.engines = start_engines(cfg, self.resolved.plan, self.placement)
        self.trainer = TrainerGroup(self.resolved, self.placement, wait=self.watchdog.get)
        self.watchdog.name_actors(self.engines, [f"engine {index}" for index in range(len(self.engines))])
        self.watchdog.name_actors(self.trainer.ranks, [f"trainer rank {rank}" for rank in range(len(self.trainer.ranks))])
        self.checkpoints = RunCheckpoints(cfg, self.resolved.derived.train_strategy, self.run_dir, self.trainer, self.engines,
                                          self.factory, self.writer, self.journal)
        self.weights = WeightSync(transport_of(cfg), self.engines, self.trainer, self.watchdog.get)
        state = self.resumed
        if state is not None:
            self.checkpoints.restore(self._resume_from, state)
            self.records.step, self.start_rollout = state.step, state.rollout
            self.weights.version = state.version
            self.weights.clock.load_state_dict(state.clock)
            self.records.recent_rewards.extend(state.recent_rewards)
            self.log.signal = state.signal
        self.samples.start(self.records.step)
        self.weights.start(self.resolved.plan)

    def wait_until_ready(self) -> None:
        """Block until the engines and the trainer have started and the engines hold the first version; raises
        the start-up error of an actor that failed. The stall watchdog's clock starts here."""
        self.weights.wait_until_ready()
        self.watchdog.arm()

    def train_batch(self, rollout: int, batch: RolloutBatch | Drain, extra: dict | None = None) -> list[dict]:
        """Train on one rollout (or drain) at the current version; returns its step records, not yet written.
        The ledger is the driver's to update: its samples may be elsewhere (a fully_async `Drain`'s are in the
        object store, and reach only the trainer)."""
        start = time.monotonic()
        steps = self.trainer.train_rollout(batch.trainer_samples, self.weights.version)
        return self.records.of_rollout(rollout, self.weights.version, self.weights.clock, batch, steps,
                                       time.monotonic() - start, extra)

    def settle_heaps(self, *others) -> None:
        """Have the engines, the trainer's ranks and the `others` actors settle their heaps (`fasync.heap.settle`),
        without waiting: each does it before its next call."""
        for actor in [*self.engines, *self.trainer.ranks, *others]:
            actor.settle_heap.remote()

    def write(self, records: list[dict], weight_sync_time_s: float, ledger: Ledger) -> None:
        """Write a rollout's (drain's) step records and the ledger's journal."""
        self.log.write(records, weight_sync_time_s, ledger)  # raises TooManyBadSteps at train.max_bad_steps
        self.watchdog.progressed()
        self.journal.write(ledger.take_journal())

    def save_checkpoint(self, reason: str, mode: ModeCheckpoint) -> Path:
        """A checkpoint of the run as it stands between two rollouts (drains), with the driver's `mode` part."""
        standing = Standing(self.step, self.next_rollout, self.version, self.weights.clock.state_dict(),
                            list(self.records.recent_rewards), self.log.signal, self.stops.reason)
        return self.checkpoints.save(reason, standing, mode)

    @property
    def next_rollout(self) -> int:
        """The rollout (drain) after the last one written."""
        last = self.writer.history[-1]["rollout"] + 1 if self.writer.history else self.start_rollout
        return max(last, self.start_rollout)

    # -- what the run's summary and its stop path read ------------------------------------------------------------

    @property
    def step(self) -> int:
        return self.records.step

    @property
    def version(self) -> int:
        return self.weights.version if self.weights is not None else 0

    @property
    def signal(self):
        return self.log.signal

    @property
    def last_checkpoint(self) -> str | None:
        return self.checkpoints.last if self.checkpoints is not None else None

    @property
    def stop_requested(self) -> str | None:
        return self.stops.requested

    @property
    def stop_reason(self) -> str | None:
        return self.stops.reason

    def request_stop(self, outcome: str, reason: str) -> None:
        """Stop at the end of the rollout (drain) in progress, with a checkpoint (Ctrl-C, SIGTERM)."""
        self.stops.request(outcome, reason)

    def should_stop(self) -> bool:
        return self.stops.met(self.records.recent_rewards)

    def close(self, outcome: str = "finished") -> None:
        """Flush the metrics, end the trackers' runs with the run's `outcome`, and end the actors this run
        started."""
        if self.writer is not None:  # opened together with the journal and samples.jsonl
            self.writer.close(outcome)
            self.journal.close()
            self.samples.close()
        if self.trainer is not None:
            self.trainer.kill()
        for engine in self.engines if self._owns_engines else ():
            ray.kill(engine)
        if self.placement is not None:
            self.placement.remove()
