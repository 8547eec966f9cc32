"""The drivers, one per mode, each with the same face (`Driver`): built on a `Run`, `train()` runs it.

`DRIVERS` maps every `mode` to its driver class; `fasync train` and the tests look drivers up there.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from fasync.drivers.async_ import AsyncDriver
from fasync.drivers.common import Run
from fasync.drivers.fully_async import FullyAsyncDriver
from fasync.drivers.sync import SyncDriver


class Driver(Protocol):
    mode: ClassVar[str]
    """The `mode` config value this driver runs."""

    def __init__(self, run: Run) -> None: ...

    def train(self) -> None:
        """Train `train.num_rollouts` rollouts (fully_async: drains), or until `train.target_reward`,
        writing each step's record as it goes; the run's ledger is final when it returns."""


DRIVERS: dict[str, type[Driver]] = {driver.mode: driver for driver in (SyncDriver, AsyncDriver, FullyAsyncDriver)}


def driver_for(run: Run) -> Driver:
    """The driver for the run's mode, ready to `train()`."""
    return DRIVERS[run.cfg.mode](run)
