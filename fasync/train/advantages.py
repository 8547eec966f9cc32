"""Advantages from scalar rewards: group-relative (GRPO) or against the batch mean (REINFORCE baseline)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from statistics import fmean, pstdev
from typing import Literal

STD_EPS = 1e-6
"""Added to the std before dividing, so a group whose rewards all agree gets advantage 0, not nan."""


def compute_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[Hashable],
    estimator: Literal["grpo", "reinforce_baseline"],
    normalize_std: bool,
) -> list[float]:
    """One advantage per sample. `grpo` centres each reward on its prompt group's mean; `reinforce_baseline`
    on the mean of the whole batch. With `normalize_std` the centred reward is divided by the (population)
    std of the same set. Rewards must be finite (`GroupFactory` checks them where they are computed)."""
    bad = next((value for value in rewards if not math.isfinite(value)), None)
    if bad is not None:
        raise ValueError(f"reward {bad!r} is not a finite number: no advantage can be computed from it")
    if estimator == "grpo":
        members: dict[Hashable, list[int]] = defaultdict(list)
        for index, group in enumerate(group_ids):
            members[group].append(index)
        sets = list(members.values())
    else:
        sets = [list(range(len(rewards)))]
    advantages = [0.0] * len(rewards)
    for indices in sets:
        values = [rewards[i] for i in indices]
        mean = fmean(values)
        scale = pstdev(values) + STD_EPS if normalize_std else 1.0
        for i, value in zip(indices, values):
            advantages[i] = (value - mean) / scale
    return advantages
