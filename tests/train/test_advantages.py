"""Advantages against hand-computed values: GRPO per group, REINFORCE against the batch mean.

compute_advantages works on Python floats (float64, the same on every CPU), so rel=1e-12 leaves room for
float64 rounding only."""

import math

import pytest

from fasync.train.advantages import STD_EPS, compute_advantages

# Two groups of four: one split 2/2, one where every completion was right.
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1]


def test_grpo_centres_and_normalises_each_group_on_its_own():
    # Group 0: mean 0.5, population std 0.5. Group 1 agrees everywhere.
    expected = [0.5 / (0.5 + STD_EPS), -0.5 / (0.5 + STD_EPS), -0.5 / (0.5 + STD_EPS), 0.5 / (0.5 + STD_EPS),
                0.0, 0.0, 0.0, 0.0]
    assert compute_advantages(REWARDS, GROUPS, "grpo", normalize_std=True) == pytest.approx(expected, rel=1e-12)


def test_grpo_without_std_normalisation_only_centres():
    expected = [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    assert compute_advantages(REWARDS, GROUPS, "grpo", normalize_std=False) == pytest.approx(expected, abs=1e-12)


def test_grpo_groups_need_not_be_contiguous():
    # Group 7: rewards 3 and 1 (mean 2, std 1); group 3: rewards 0 and 2 (mean 1, std 1).
    advantages = compute_advantages([3.0, 0.0, 1.0, 2.0], [7, 3, 7, 3], "grpo", normalize_std=True)
    scale = 1.0 + STD_EPS
    assert advantages == pytest.approx([1 / scale, -1 / scale, -1 / scale, 1 / scale], rel=1e-12)


@pytest.mark.parametrize("value", [1.0, 0.0, 1 / 3, 0.7, 1 / 6])
@pytest.mark.parametrize("size", [1, 5, 8])
def test_a_group_whose_rewards_agree_gets_exactly_zero(value, size):
    advantages = compute_advantages([value] * size, [4] * size, "grpo", normalize_std=True)
    assert advantages == [0.0] * size
    assert not any(math.isnan(a) for a in advantages)


def test_reinforce_baseline_uses_the_batch_mean_and_std():
    # Batch mean 6/8 = 0.75, population std sqrt(0.75 * 0.25); group ids play no part.
    std = math.sqrt(0.75 * 0.25)
    high, low = 0.25 / (std + STD_EPS), -0.75 / (std + STD_EPS)
    expected = [high, low, low, high, high, high, high, high]
    assert compute_advantages(REWARDS, GROUPS, "reinforce_baseline", normalize_std=True) == pytest.approx(
        expected, rel=1e-12)
    assert compute_advantages(REWARDS, [0] * 8, "reinforce_baseline", normalize_std=True) == pytest.approx(
        expected, rel=1e-12)


def test_reinforce_baseline_without_std_normalisation():
    expected = [0.25, -0.75, -0.75, 0.25, 0.25, 0.25, 0.25, 0.25]
    assert compute_advantages(REWARDS, GROUPS, "reinforce_baseline", normalize_std=False) == pytest.approx(
        expected, abs=1e-12)

