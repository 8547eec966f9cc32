"""The garbage collector in a run's long-lived actors.

CPython's older generations are collected by walking every object in them, and an actor that imported torch holds
hundreds of thousands. In a quickstart fully_async run, collections took more than a tenth of the trainer's CPU
per drain, and about as much of the engine's (docs/benchmarks.md). `settle` leaves what an actor allocated to get
started out of every later collection.
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
