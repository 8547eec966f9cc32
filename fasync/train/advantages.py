"""Advantages from scalar rewards (one per sample, broadcast over its tokens), and DAPO's overlong shaping of
those rewards. docs/algorithms.md gives each estimator's formula and where it comes from.

- `grpo`: reward minus its prompt group's mean (÷ the group's std with `normalize_std`).
- `rloo`: reward minus the mean of the other samples of its group (leave-one-out); never divided by a std.
- `reinforce_baseline`: reward minus the batch mean (÷ the batch std with `normalize_std`).
- `reinforce_plus_plus`: the reward whitened over the batch's tokens (every token of a sample carries its reward).
- `reinforce_plus_plus_baseline`: reward minus its group's mean, then whitened over the batch's tokens.

A group of one sample has no baseline in `rloo` and the `reinforce_plus_plus_baseline`: it keeps its reward, as
verl does (rule A007 warns). All of it is plain Python floats (float64, the same on every CPU).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from statistics import fmean, pstdev
from typing import Literal, Optional

STD_EPS = 1e-6
"""Added to the std before dividing, so a group whose rewards all agree gets advantage 0, not nan."""
WHITEN_EPS = 1e-8
"""Added to the variance before the square root when whitening over tokens (the reinforce_plus_plus estimators)."""

Estimator = Literal["grpo", "rloo", "reinforce_baseline", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]
TOKEN_WEIGHTED = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")
"""The estimators that whiten over tokens, and so need each sample's completion length."""


def compute_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[Hashable],
    estimator: Estimator,
    normalize_std: bool,
    token_counts: Optional[Sequence[int]] = None,
) -> list[float]:
    """One advantage per sample (see the module's docstring). `token_counts`, each sample's completion length, is
    needed by the estimators that whiten over tokens. Rewards must be finite (`GroupFactory` checks them where
    they are computed)."""
    bad = next((value for value in rewards if not math.isfinite(value)), None)
    if bad is not None:
        raise ValueError(f"reward {bad!r} is not a finite number: no advantage can be computed from it")
    if estimator in ("reinforce_baseline", "reinforce_plus_plus"):
        sets = [list(range(len(rewards)))]
    else:
        members: dict[Hashable, list[int]] = defaultdict(list)
        for index, group in enumerate(group_ids):
            members[group].append(index)
        sets = list(members.values())
    if estimator == "reinforce_plus_plus":
        return _whiten_over_tokens(list(rewards), _counts(token_counts, rewards))
    advantages = [0.0] * len(rewards)
    for indices in sets:
        values = [rewards[i] for i in indices]
        mean = fmean(values)
        if estimator == "rloo":
            # r − mean of the others = (r − mean) × n / (n − 1); a lone sample has no others and keeps its reward.
            scale = (len(values) - 1) / len(values) if len(values) > 1 else 1.0
            mean = mean if len(values) > 1 else 0.0
        elif estimator == "reinforce_plus_plus_baseline":
            mean, scale = (mean if len(values) > 1 else 0.0), 1.0
        else:
            scale = pstdev(values) + STD_EPS if normalize_std else 1.0
        for i, value in zip(indices, values):
            advantages[i] = (value - mean) / scale
    if estimator == "reinforce_plus_plus_baseline":
        return _whiten_over_tokens(advantages, _counts(token_counts, rewards))
    return advantages


def _counts(token_counts: Optional[Sequence[int]], rewards: Sequence[float]) -> Sequence[int]:
    if token_counts is None or len(token_counts) != len(rewards):
        raise ValueError("the reinforce_plus_plus estimators whiten over tokens: give one token count per reward")
    return token_counts


def _whiten_over_tokens(values: list[float], token_counts: Sequence[int]) -> list[float]:
    """(v − μ) / sqrt(σ² + WHITEN_EPS) with μ and the unbiased σ² taken over every token of the batch (a sample of
    L tokens counts L times)."""
    tokens = sum(token_counts)
    if tokens == 0:
        return [0.0] * len(values)
    mean = sum(v * n for v, n in zip(values, token_counts)) / tokens
    squares = sum((v - mean) ** 2 * n for v, n in zip(values, token_counts))
    variance = squares / (tokens - 1) if tokens > 1 else 0.0
    scale = math.sqrt(variance + WHITEN_EPS)
    return [(v - mean) / scale for v in values]


def overlong_penalty(tokens: int, truncated: bool, budget: int, buffer: int, penalty: float) -> float:
    """DAPO's soft overlong punishment, ≤ 0, added to a completion's reward: 0 up to `budget − buffer` tokens, then
    falling linearly to −penalty at `budget`; a completion cut off by the budget (finish reason `length`) gets
    all of −penalty."""
    if truncated:
        return -penalty
    excess = tokens - (budget - buffer)
    return -penalty * min(max(excess, 0) / buffer, 1.0)
