"""Kill points: named places in fasync's own code where a crash test SIGKILLs the run, as if its machine died.

`FASYNC_KILL_AT=<point>:<n>` (for tests only) makes the n-th time a process reaches `kill_point(point)` send
SIGKILL to the driver's whole process group: the driver, the local Ray cluster it started and every actor die at
once, with no handler run. Start the run in a session of its own (`setsid`, `start_new_session=True`) so that the
group is the run's. The driver notes its group in FASYNC_KILL_GROUP when this module is first imported, before Ray
starts, so that the actors (which Ray starts in groups of their own, with the driver's environment) kill the same
group. Each process counts its own passes (an engine counts its own generate calls). Without the variable a
kill point costs one dictionary lookup. `scripts/kill_matrix.py` drives the matrix of points × passes × seeds
(`make test-kill`); docs/training.md says what it guarantees.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ENV = "FASYNC_KILL_AT"
GROUP_ENV = "FASYNC_KILL_GROUP"

if os.environ.get(ENV):
    os.environ.setdefault(GROUP_ENV, str(os.getpgid(0)))

POINTS = {
    "ray_start": "the driver, right after its Ray cluster started",
    "rollout_end": "the driver, after a rollout's (drain's) records and journal entries were written",
    "journal_append": "the driver, between two entries of one append to ledger.jsonl",
    "checkpoint_temp": "the driver, once a checkpoint's temp directory is written, before its meta.json",
    "checkpoint_rename": "the driver, between a checkpoint's meta.json and its rename into place",
    "checkpoint_saved": "the driver, right after a checkpoint is in place",
    "weight_sync": "the driver, as it starts pushing a new weight version",
    "prefetch": "the driver (fully_async), with the next drain's take in flight",
    "engine_generate": "an engine, in the middle of a generate call (mid-rollout)",
    "engine_load": "an engine, in the middle of loading new weights",
    "trainer_step": "a trainer rank, between two optimizer steps of a rollout",
    "rollouter_snapshot": "the rollouter (fully_async), in the middle of a checkpoint's snapshot",
    "agent_step": "the multi-turn loop (the rollouter in fully_async), after a model turn, before its tool calls "
                  "or environment step (mid-trajectory)",
}
"""Every kill point, and where it is."""

_passes: Counter = Counter()


def kill_point(point: str) -> None:
    """Die here, with the whole process group, on the n-th pass when FASYNC_KILL_AT names this point."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    name, _, nth = wanted.partition(":")
    if name != point:
        return
    _passes[point] += 1
    if _passes[point] == int(nth or 1):
        os.killpg(int(os.environ.get(GROUP_ENV) or os.getpgid(0)), signal.SIGKILL)
