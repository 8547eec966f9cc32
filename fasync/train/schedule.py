"""The learning-rate schedule: linear warmup, then constant, linear or cosine decay (docs/algorithms.md).

A pure function of the optimizer steps taken, which a checkpoint restores: a resumed run continues the schedule
exactly, with nothing of its own to save. Pure Python, so `fasync check` can reason about it.
"""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "linear", "cosine"]


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: Schedule) -> float:
    """The multiple of `train.lr` for optimizer step `step` (0-based) of a run of `total_steps`.

    Warmup: (step + 1) / (warmup_steps + 1), rising to 1 at the first step after it. Then `constant` stays at 1;
    `linear` and `cosine` fall from 1 towards 0 over the remaining steps (the last step's factor is above 0, so
    no step is wasted at a learning rate of 0)."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))
