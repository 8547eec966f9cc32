"""The sample ledger: every sample that entered generation is accounted for.

produced = consumed + dropped (by reason) + queued + in flight, at every moment.
Counts are in samples (a prompt group of n completions counts n).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Ledger:
    produced: int = 0
    consumed: int = 0
    queued: int = 0
    in_flight: int = 0
    dropped: Counter = field(default_factory=Counter)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def balanced(self) -> bool:
        return self.produced == self.consumed + self.dropped_total + self.queued + self.in_flight

    def drop(self, reason: str, count: int) -> None:
        if count:
            self.dropped[reason] += count

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
