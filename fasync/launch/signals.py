"""Ctrl-C and SIGTERM in `fasync train`: the first starts a clean stop, a second skips what is left of it.

The first signal asks a started run to stop at the end of the rollout in progress, where it writes a
checkpoint (`cooperative`); before the run exists, or on a second signal, it raises `Stop` in the main
thread, wherever the driver waits (a checkpoint being written is abandoned; the last one stands). The stop
path then runs its graceful steps (`graceful`: ending the actors) where a further signal only skips the
steps still to come; writing the summary and shutting the local cluster down are never interrupted, so
that every stop leaves a summary and no process behind.

Where Python cannot raise (a signal that comes while it runs a weakref callback or a `__del__`, as ray.init's
imports do), the Stop is kept, and `fasync train` raises it once Ray has started and once the actors have.

A scheduler stops a job with a SIGTERM to its whole process group. The local Ray cluster's own processes (the
GCS, the raylet, its agents) start in a session of their own (fasync.launch.local_cluster), so that
the signal reaches the driver alone: the clean stop it asks for still has the cluster to finish on, however long
the rollout in progress takes. (They still end with the driver: Ray ties the GCS and the raylet to it, and the
reaper, fasync.launch.reaper, ends the rest.)
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

from fasync.exit_codes import ExitCode

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

OUTCOMES = {
    signal.SIGINT: ("interrupted", ExitCode.INTERRUPTED, "interrupted by Ctrl-C (SIGINT)"),
    signal.SIGTERM: ("terminated", ExitCode.TERMINATED, "terminated by SIGTERM"),
}
"""signal → (outcome, exit code, stop reason)."""

EXIT_CODE = {outcome: code for outcome, code, _ in OUTCOMES.values()}
"""The exit code of each outcome a stop signal gives."""


class Stop(KeyboardInterrupt):
    """A stop signal reached the driver. A KeyboardInterrupt, so that code which cleans up after Ctrl-C
    (Ray's waits among it) does so for SIGTERM too."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    def __init__(self, echo: Callable[[str], None], cooperative: Callable[[int], bool] | None = None):
        self.echo = echo
        self.cooperative = cooperative
        """Called with the first signal: True when it asked the run to stop at its next clean point (where it
        writes a checkpoint) instead of being interrupted now."""
        self.received: list[int] = []
        self._raise = True
        self._stopping = False
        self._received_at_stop = 0
        self._previous: dict[int, object] = {}
        self._previous_unraisable = None
        self._swallowed: Stop | None = None

    def install(self) -> None:
        """Take SIGINT and SIGTERM (again: `ray.init` puts its own SIGTERM handler in, which exits 15)."""
        for signum in STOP_SIGNALS:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)
        if self._previous_unraisable is None:
            self._previous_unraisable = sys.unraisablehook
            sys.unraisablehook = self._unraisable

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if self._previous_unraisable is not None:
            sys.unraisablehook = self._previous_unraisable
            self._previous_unraisable = None

    def _unraisable(self, unraisable) -> None:
        """A signal that came while Python ran a weakref callback or a `__del__` (ray.init's imports run
        importlib's) raised its Stop where Python cannot raise: Python prints it and goes on, and the stop
        was lost (a Ctrl-C during Ray's start-up then left the run training). Keep it for `raise_swallowed`."""
        if isinstance(unraisable.exc_value, Stop):
            self._swallowed = unraisable.exc_value
        else:
            self._previous_unraisable(unraisable)

    def raise_swallowed(self) -> None:
        """Raise the Stop that Python could not raise where its signal came (`_unraisable`), if there was one."""
        stop, self._swallowed = self._swallowed, None
        if stop is not None:
            raise stop

    def _handle(self, signum: int, frame) -> None:
        self.received.append(signum)
        if self._stopping or len(self.received) > 1:
            self.echo(f"fasync train: {signal.Signals(signum).name} again: skipping the rest of the clean stop")
        elif self.cooperative is not None and self.cooperative(signum):
            return
        if self._raise:
            raise Stop(signum)

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None

    @property
    def hurried(self) -> bool:
        """A signal came while the run was already stopping, or a second one came at all: skip what is
        graceful."""
        return len(self.received) > self._received_at_stop or len(self.received) >= 2

    def begin_stop(self) -> None:
        """From here on a signal only skips graceful steps; it no longer raises outside them."""
        self._received_at_stop = len(self.received)
        self._stopping = True
        self._raise = False

    def graceful(self, what: str, step: Callable[[], None]) -> bool:
        """Run one graceful step of the stop unless the stop is hurried; a signal during it ends it. True
        when it ran to its end."""
        if self.hurried:
            return False
        self._raise = True
        try:
            step()
            return True
        except Stop:
            self.echo(f"fasync train: skipped {what}")
            return False
        finally:
            self._raise = False
