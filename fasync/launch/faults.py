"""The stall watchdog: it turns a silent hang, or an actor that dies while the driver waits on it, into a fault
that ends the run (`fasync.errors`), with a message that names the actor and what it was doing.

Every wait of the driver on an actor goes through `Watchdog.get` (or `Watchdog.waiting` around a wait of its
own), with a label for each awaited call ("engine 1's generate call"). An actor that dies fails the wait at
once with that label; a wait that outlasts `train.stall_timeout_s` without an optimizer step fails the run
with every wait still outstanding and how long it has lasted.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager

from fasync.errors import ActorFailed, ConfigurationError, RunFault, Stalled, actor_id, describe_failure

POLL_S = 0.5
"""How often a wait looks at the clock (and at actors that died)."""


class Watchdog:
    def __init__(self, timeout_s: float | None):
        self.timeout_s = timeout_s
        self._armed_at: float | None = None
        self._waits: dict[int, tuple[list[str], float, Callable[[], list[str]] | None]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._cancelled = False
        self.actors: dict[str, str] = {}
        """Actor id → name ("engine 1"), so that a failure names the actor that died, which need not be the
        one called (a weight load fails when the trainer that made the weights died)."""

    def name_actors(self, handles: Sequence, names: Sequence[str]) -> None:
        self.actors.update({actor_id(handle): name for handle, name in zip(handles, names)})

    def arm(self) -> None:
        """Start the clock: from now on, an optimizer step is due every `timeout_s` (start-up is not timed)."""
        self._armed_at = time.monotonic()

    def progressed(self) -> None:
        """An optimizer step was taken."""
        if self._armed_at is not None:
            self._armed_at = time.monotonic()

    def cancel(self) -> None:
        """The run is stopping: waits in other threads than the main one (async's generation) give up at
        their next look, so that the driver need not wait for them."""
        self._cancelled = True

    @contextmanager
    def waiting(self, labels: Sequence[str], detail: Callable[[], list[str]] | None = None):
        """Mark what the current thread waits for; `detail` says more when a stall is reported (the
        rollouter, asked what it waits for in turn)."""
        key = next(self._ids)
        with self._lock:
            self._waits[key] = (list(labels), time.monotonic(), detail)
        try:
            yield self._waits[key][0]
        finally:
            with self._lock:
                del self._waits[key]

    def check(self) -> None:
        """Raise `Stalled` when no optimizer step came for `timeout_s`; called by waits as they poll."""
        if self._cancelled and threading.current_thread() is not threading.main_thread():
            raise RunFault("the run is stopping")
        if self.timeout_s is None or self._armed_at is None:
            return
        silent = time.monotonic() - self._armed_at
        if silent > self.timeout_s:
            raise Stalled(f"stalled: no optimizer step for {silent:.0f} s (train.stall_timeout_s: "
                          f"{self.timeout_s:g}); waiting for {self.describe_waits()}")

    def describe_waits(self) -> str:
        now = time.monotonic()
        with self._lock:
            waits = sorted(self._waits.values(), key=lambda wait: wait[1])
        parts = []
        for labels, since, detail in waits:
            for label in labels:
                parts.append(f"{label} ({now - since:.0f} s)")
            if detail is not None:
                try:
                    parts += detail()
                except Exception as error:  # noqa: BLE001 - the stall is the news, not this
                    parts.append(f"(could not ask for more: {describe_failure(error)})")
        return "; ".join(parts) or "nothing (the driver itself is busy)"

    def get(self, refs: Sequence, labels: Sequence[str]) -> list:
        """`ray.get(refs)`, failing at once with the call's label when its actor died or raised, and with
        `Stalled` when the run stalls."""
        import ray

        results: dict = {}
        pending = dict(zip(refs, labels))
        with self.waiting(list(labels)) as outstanding:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
                for ref in ready:
                    label = pending.pop(ref)
                    outstanding.remove(label)
                    results[ref] = self.fetch(ref, label)
                if not ready:
                    self.check()
        return [results[ref] for ref in refs]

    def fetch(self, ref, label: str):
        """The result of the finished call `ref`; when it failed, `ActorFailed` naming the actor that died,
        which need not be the one called (a rollouter call fails when an engine it calls died)."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return ray.get(ref)
        except ConfigurationError:
            raise  # bad input met in an actor: its own one-line message, printed as is by the stop path
        except (RayActorError, RayTaskError) as error:
            cause = getattr(error, "cause", None)
            if isinstance(cause, RunFault):
                raise cause from None
            raise ActorFailed(f"{label} failed: {describe_failure(error, self.actors)}") from None

    def call(self, function: Callable[[], object], label: str):
        """`function()`, run in a thread of its own and watched like `get`: one that hangs (a reward stuck in a
        loop) fails the run as a stall that names `label`, as a hung actor does. The thread is a daemon: Python
        cannot stop it, and it must not keep the process from exiting."""
        from concurrent.futures import Future

        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(function())
            except BaseException as error:  # noqa: BLE001 - handed to the waiting thread, which raises it
                future.set_exception(error)

        threading.Thread(target=run, name=f"fasync-{label}", daemon=True).start()
        return self.result(future, label)

    def result(self, future, label: str):
        """A `concurrent.futures.Future`'s result, watched like `get`."""
        from concurrent.futures import TimeoutError as FutureTimeout

        with self.waiting([label]):
            while True:
                try:
                    return future.result(timeout=POLL_S)
                except FutureTimeout:
                    self.check()
