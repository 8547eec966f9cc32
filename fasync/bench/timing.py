"""Timing a method of an object the benchmark does not own (an engine's prefill, TRL's generation) from outside."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def timed_method(owner, name: str, clock: Callable[[], float] = time.perf_counter) -> Iterator[list[float]]:
    """While the block runs, every call of `owner.<name>` adds its `clock` seconds to the one-item list yielded
    (the caller may reset it between readings); the method is restored after the block."""
    spent = [0.0]
    method = getattr(owner, name)

    def timed(*args, **kwargs):
        started = clock()
        try:
            return method(*args, **kwargs)
        finally:
            spent[0] += clock() - started

    setattr(owner, name, timed)
    try:
        yield spent
    finally:
        delattr(owner, name)  # the instance attribute shadowed the class's method
