"""The drivers, one per mode, each with the same face (`Driver`): built on a `Run` that has been started,
`train()` runs it.

`DRIVERS` maps every `mode` to its driver class; `fasync train` and the tests look drivers up there.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from fasync.checkpoint.run import ModeCheckpoint
from fasync.drivers.async_ import AsyncDriver
from fasync.drivers.common import Run
from fasync.drivers.fully_async import FullyAsyncDriver
from fasync.drivers.sync import SyncDriver
from fasync.metrics.ledger import Ledger


class Driver(Protocol):
    mode: ClassVar[str]
    """The `mode` config value this driver runs."""

    ledger: Ledger
    """The run's sample ledger as this driver holds it: its own in sync and async, where the samples are; in
    fully_async the copy the rollouter, which owns it, sent last. Final once `train` returns or fails."""

    def __init__(self, run: Run) -> None:
        """Starts nothing: `train` does."""

    def train(self) -> None:
        """Set up the mode's own parts, train `train.num_rollouts` rollouts (fully_async: drains), or until
        `train.target_reward` or a requested stop, writing each step's record as it goes and a checkpoint at
        the end, then end the mode's parts, whatever way the loop ended."""

    def checkpoint_state(self, last: bool = False) -> ModeCheckpoint:
        """The ledger and the mode's state for a checkpoint, once nothing of the mode is in motion; after the
        `last` one (the loop's end) the mode generates nothing new."""


DRIVERS: dict[str, type[Driver]] = {driver.mode: driver for driver in (SyncDriver, AsyncDriver, FullyAsyncDriver)}


def driver_state_types() -> list:
    """Every class of the drivers' own that driver.pt holds (`fasync.checkpoint.run.DriverState`): the mode's
    prompt groups and generations (agentic: the trajectories' outcomes and those in flight), and the learning
    signal. driver.pt is read allowing only these
    (`fasync.checkpoint.safe_load`)."""
    from fasync.drivers.generation import RolloutBatch
    from fasync.metrics.signal import LearningSignal
    from fasync.rollout.groups import PromptGroup
    from fasync.rollout.trajectory import Outcome, SavedTrajectory, TrajectoryStats
    from fasync.rollout.types import Generation, GroupId, Sample

    return [GroupId, Generation, Sample, PromptGroup, RolloutBatch, LearningSignal, Outcome, SavedTrajectory,
            TrajectoryStats,
            # async driver.pt files written before RolloutBatch moved to fasync.drivers.generation
            (RolloutBatch, "fasync.drivers.common.RolloutBatch")]


def driver_for(run: Run) -> Driver:
    """The driver for the run's mode, ready to `train()`."""
    return DRIVERS[run.cfg.mode](run)
