"""A running run's checkpoints: written between two rollouts (drains), where every count, RNG and group is
settled, and taken up again when the run resumes.

A checkpoint holds meta.json (`fasync.checkpoint.CheckpointMeta`), the trainer's part (`TrainerGroup`, through
`fasync.checkpoint.state`) and driver.pt (`DriverState`): the run's counters, its ledger, the data cursor,
every RNG, where its logs stood, and the mode's own part, which the driver hands in (`ModeCheckpoint`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

import ray

from fasync import checkpoint
from fasync.atomic import describe_os_error
from fasync.checkpoint import CheckpointMeta
from fasync.config.schema import FasyncConfig
from fasync.killpoints import kill_point
from fasync.metrics.ledger import Event, Journal, Ledger
from fasync.metrics.writer import MetricsWriter


@dataclass
class DriverState:
    """driver.pt: what the driver's process holds between two rollouts. Its keys are these fields' names."""

    step: int
    rollout: int
    version: int
    clock: dict
    """`VersionClock.state_dict`."""
    ledger: dict
    recent_rewards: list[float]
    signal: object
    """The `LearningSignal` itself, so that a resumed run's streaks and warnings are the uninterrupted run's."""
    factory: dict
    """The data cursor (`GroupFactory.state_dict`)."""
    rngs: dict
    """The driver's own RNGs (`fasync.checkpoint.driver_file.capture_plain_rngs`)."""
    engine_rngs: list
    mode: dict
    """The mode's part (`ModeCheckpoint.state`)."""
    metrics_bytes: int
    journal_bytes: int
    wall_time: float

    def as_dict(self) -> dict:
        return {name.name: getattr(self, name.name) for name in fields(self)}

    @classmethod
    def from_dict(cls, state: dict) -> "DriverState":
        return cls(**{name.name: state[name.name] for name in fields(cls)})


@dataclass
class ModeCheckpoint:
    """What a driver hands in for a checkpoint (`Driver.checkpoint_state`), once nothing of its mode is in
    motion: the run's ledger as its owner holds it, and the mode's own state."""

    ledger: Ledger
    state: dict = field(default_factory=dict)
    """Saved as driver.pt's `mode`, and handed back to the driver when the run resumes."""
    journal: list[dict] = field(default_factory=list)
    """Ledger journal entries kept elsewhere (fully_async's rollouter), written before the checkpoint's mark."""
    engine_rngs: list | None = None
    """The engines' RNG states where the mode already has them; None: asked of the engines."""
    draws: int | None = None
    """The data cursor where the mode's generation keeps it; None: the driver's factory."""


@dataclass(frozen=True)
class Standing:
    """The run's counters at a checkpoint."""

    step: int
    rollout: int
    """The rollout (drain) after the last one written."""
    version: int
    clock: dict
    recent_rewards: list[float]
    signal: object
    stop_reason: str | None


@contextmanager
def trainer_errors():
    """A trainer actor's CheckpointError as its own one line, not inside the actor's traceback."""
    try:
        yield
    except ray.exceptions.RayTaskError as error:
        cause = getattr(error, "cause", None)
        if isinstance(cause, checkpoint.CheckpointError):
            raise cause from None
        raise


class RunCheckpoints:
    """Every `checkpoint.every` optimizer steps (`due`) and at a stop, a checkpoint of the run; its newest
    (`last`) goes into the run's summary. `trainer` is the run's `TrainerGroup`, `factory` its `GroupFactory`."""

    def __init__(self, cfg: FasyncConfig, strategy: str, run_dir: Path, trainer, engines: list, factory,
                 writer: MetricsWriter, journal: Journal):
        self.cfg = cfg
        self.strategy = strategy
        self.run_dir = run_dir
        self.trainer = trainer
        self.engines = engines
        self.factory = factory
        self.writer = writer
        self.journal = journal
        self.last: str | None = None
        """The directory name of the newest checkpoint this run wrote or resumed from."""
        self._step = 0

    def due(self, step: int) -> bool:
        """The steps taken passed a multiple of `checkpoint.every` since the last checkpoint."""
        every = self.cfg.checkpoint.every
        return bool(every) and step // every > self._step // every

    def save(self, reason: str, standing: Standing, mode: ModeCheckpoint) -> Path:
        """Write a checkpoint; `reason` is "every", or the outcome of a stop ("finished", "interrupted",
        "terminated"). Returns its directory. Raises CheckpointError (one line) when it cannot be written; the
        previous checkpoints are kept."""
        temp = checkpoint.begin(self.run_dir, standing.step)
        try:
            self._write(temp, reason, standing, mode)
        except OSError as error:
            checkpoint.abandon(temp)
            raise checkpoint.CheckpointError(f"cannot write a checkpoint ({describe_os_error(error.filename or temp, error)}"
                                             "); the previous ones are kept") from error
        except BaseException:
            checkpoint.abandon(temp)
            raise
        kill_point("checkpoint_temp")
        num_rollouts = self.cfg.train.num_rollouts
        final = checkpoint.commit(temp, CheckpointMeta(
            step=standing.step, rollout=standing.rollout, weight_version=standing.version, reason=reason,
            finished=reason == "finished", mode=self.cfg.mode, strategy=self.strategy,
            trainer_ranks=self.cfg.resources.trainer_ranks, stop_reason=standing.stop_reason or (
                f"completed all {num_rollouts} rollouts" if reason == "finished" else reason),
        ), self.cfg.checkpoint.keep)
        kill_point("checkpoint_saved")
        self._step = standing.step
        self.last = final.name
        return final

    def _write(self, temp: Path, reason: str, standing: Standing, mode: ModeCheckpoint) -> None:
        """The journal up to the checkpoint, the trainer's part, and driver.pt, into `temp`."""
        from fasync.checkpoint.driver_file import capture_plain_rngs, save_driver_state

        self.journal.write(mode.journal)
        self.journal.write(mode.ledger.take_journal())
        with trainer_errors():
            self.trainer.save_checkpoint(temp)
        engine_rngs = mode.engine_rngs
        if engine_rngs is None:
            engine_rngs = ray.get([engine.rng_state.remote() for engine in self.engines])
        draws = self.factory.cursor if mode.draws is None else mode.draws
        self.journal.mark(Event.END if reason == "finished" else Event.CHECKPOINT, step=standing.step, draws=draws)
        state = DriverState(
            step=standing.step, rollout=standing.rollout, version=standing.version, clock=standing.clock,
            ledger=mode.ledger.as_dict(), recent_rewards=standing.recent_rewards, signal=standing.signal,
            factory=self.factory.state_dict(), rngs=capture_plain_rngs(), engine_rngs=engine_rngs, mode=mode.state,
            metrics_bytes=self.writer.size, journal_bytes=self.journal.size, wall_time=self.writer.elapsed)
        save_driver_state(state.as_dict(), temp / checkpoint.DRIVER)

    def restore(self, resumed: checkpoint.Checkpoint, state: DriverState) -> None:
        """Take up `resumed` outside the driver's counters: the trainer's state, the data cursor, the RNGs, and
        the logs cut back to where the checkpoint was taken (what came after is kept beside them)."""
        from fasync.checkpoint.driver_file import restore_plain_rngs

        with trainer_errors():
            self.trainer.load_checkpoint(resumed.path)
        self.factory.load_state_dict(state.factory)
        restore_plain_rngs(state.rngs)
        ray.get([engine.set_rng_state.remote(rng) for engine, rng in zip(self.engines, state.engine_rngs)])
        marker = {"step": state.step, "rollout": state.rollout, "checkpoint": resumed.path.name}
        self.writer.resume(state.metrics_bytes, state.wall_time, marker)
        self.journal.rewind(state.journal_bytes)
        self.journal.mark(Event.RESUME, **marker)
        self._step = state.step
        self.last = resumed.path.name
