"""The garbage collector in a run's long-lived actors.

CPython's full collection walks every object the process holds. An actor that imported torch holds hundreds of
thousands of them, so each full collection took about 0.1 s, and a trainer, an engine or a rollouter ran several
of them in a quickstart run: about a tenth of the trainer's CPU per drain (docs/benchmarks.md). `settle` leaves
what an actor allocated to get started out of every later collection.
"""

from __future__ import annotations

import gc


def settle() -> None:
    """Collect this process's garbage, then leave every object that survived out of later collections
    (`gc.freeze`): only what is allocated from now on is walked. Once, after the process's first piece of work,
    when its lazy imports have been loaded too; garbage that the frozen objects become later is never collected,
    and a process settled once at start-up holds little of it."""
    gc.collect()
    gc.freeze()
