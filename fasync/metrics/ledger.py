"""The sample ledger: every sample that entered generation is accounted for, in every mode.

A sample is in exactly one state: in flight (being generated), queued (generated and scored, waiting
for the trainer), trained, or dropped for a reason. The transitions below are the only way a count
changes, so that at every moment

    produced = trained + dropped (by reason) + queued + in flight.

Counts are in samples (a prompt group of n completions counts n). The ledger lives where the samples
are: in the driver's process in sync and async, in the rollouter actor in fully_async, which hands a
copy to the trainer with every drain.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

DropReason = Literal["zero_variance", "surplus", "unfinished_at_stop", "stale", "trimmed"]

DROPPED_FROM: dict[str, str] = {
    "zero_variance": "in_flight",
    "surplus": "in_flight",
    "unfinished_at_stop": "in_flight",
    "stale": "queued",
    "trimmed": "queued",
}
"""The state a sample leaves when it is dropped for each reason: dynamic sampling drops a group as
soon as it is scored, a run that stops drops what it was generating, the trainer drops a group too stale
to train on and the samples that do not fill a global batch."""


@dataclass
class Ledger:
    produced: int = 0
    consumed: int = 0
    """Trained on."""
    queued: int = 0
    in_flight: int = 0
    dropped: Counter = field(default_factory=Counter)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)
    """async generates in a thread while the trainer trains: each transition is atomic."""

    # -- transitions -----------------------------------------------------------------------------

    def admit(self, samples: int) -> None:
        """New samples start generating."""
        with self._lock:
            self.produced += samples
            self.in_flight += samples

    def deliver(self, samples: int) -> None:
        """Generated and scored samples wait for the trainer."""
        with self._lock:
            self.in_flight -= samples
            self.queued += samples

    def drop(self, reason: DropReason, samples: int) -> None:
        """Samples leave the state `DROPPED_FROM[reason]` and are never trained on."""
        if not samples:
            return
        with self._lock:
            setattr(self, DROPPED_FROM[reason], getattr(self, DROPPED_FROM[reason]) - samples)
            self.dropped[reason] += samples

    def train(self, taken: int, trained: int) -> None:
        """The trainer took `taken` queued samples and trained on `trained` of them; the rest were trimmed."""
        with self._lock:
            self.queued -= trained
            self.consumed += trained
            self.drop("trimmed", taken - trained)

    # -- reading ---------------------------------------------------------------------------------

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def balanced(self) -> bool:
        with self._lock:
            counts = (self.consumed, self.queued, self.in_flight, *self.dropped.values())
            return min(counts) >= 0 and self.produced == sum(counts)

    def copy(self) -> "Ledger":
        with self._lock:
            return Ledger(self.produced, self.consumed, self.queued, self.in_flight, Counter(self.dropped))

    def __getstate__(self) -> dict:
        return {name: value for name, value in self.copy().__dict__.items() if name != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.RLock())

    def as_dict(self) -> dict:
        return {
            "produced": self.produced,
            "consumed": self.consumed,
            "dropped": dict(self.dropped),
            "queued": self.queued,
            "in_flight": self.in_flight,
            "balanced": self.balanced,
        }

    def describe(self) -> str:
        drops = ", ".join(f"{reason} {n}" for reason, n in sorted(self.dropped.items())) or "none"
        verdict = "balanced" if self.balanced else "UNBALANCED"
        return (
            f"produced {self.produced} = consumed {self.consumed} + dropped {self.dropped_total} ({drops}) "
            f"+ queued {self.queued} + in flight {self.in_flight}: {verdict}"
        )
