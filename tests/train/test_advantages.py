"""Advantages against hand-computed values: GRPO and RLOO per group, REINFORCE against the batch mean, REINFORCE++
whitened over tokens; and DAPO's overlong penalty.

compute_advantages works on Python floats (float64, the same on every CPU), so rel=1e-12 leaves room for
float64 rounding only."""

import math

import pytest

from fasync.train.advantages import STD_EPS, WHITEN_EPS, compute_advantages, overlong_penalty

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



def test_rloo_subtracts_the_mean_of_the_rest_of_the_group():
    # Group 0: a 1 is compared with (0 + 0 + 1) / 3, a 0 with (1 + 0 + 1) / 3; group 1 agrees everywhere.
    expected = [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0, 0.0]
    for normalize_std in (True, False):  # rloo never divides by a std
        assert compute_advantages(REWARDS, GROUPS, "rloo", normalize_std) == pytest.approx(expected, abs=1e-12)


def test_rloo_and_the_reinforce_plus_plus_baseline_leave_a_lone_sample_its_reward():
    assert compute_advantages([0.5], [9], "rloo", normalize_std=True) == [0.5]
    # One token: nothing to whiten against, so the centred value 0.5 − 0.5 is all there is.
    assert compute_advantages([0.5], [9], "reinforce_plus_plus_baseline", True, token_counts=[1]) == [0.0]


def test_reinforce_plus_plus_whitens_the_rewards_over_the_batch_tokens():
    # Rewards 1, 0, 2 over 1, 2 and 1 tokens: the token mean is (1 + 0 + 0 + 2) / 4 = 0.75, the squared deviations
    # 0.0625 + 2 × 0.5625 + 1.5625 = 2.75, the unbiased token variance 2.75 / 3.
    scale = math.sqrt(2.75 / 3 + WHITEN_EPS)
    expected = [0.25 / scale, -0.75 / scale, 1.25 / scale]
    got = compute_advantages([1.0, 0.0, 2.0], [0, 0, 1], "reinforce_plus_plus", True, token_counts=[1, 2, 1])
    assert got == pytest.approx(expected, rel=1e-12)


def test_reinforce_plus_plus_baseline_centres_on_the_group_then_whitens_over_tokens():
    # Group 0 (rewards 1, 0) centres to 0.5, −0.5; group 1 is one sample and keeps 2. Over the tokens (1, 2, 1):
    # mean (0.5 − 1 + 2) / 4 = 0.375, squared deviations 0.125² + 2 × 0.875² + 1.625² = 4.1875, variance / 3.
    scale = math.sqrt(4.1875 / 3 + WHITEN_EPS)
    expected = [0.125 / scale, -0.875 / scale, 1.625 / scale]
    got = compute_advantages([1.0, 0.0, 2.0], [0, 0, 1], "reinforce_plus_plus_baseline", False,
                             token_counts=[1, 2, 1])
    assert got == pytest.approx(expected, rel=1e-12)


def test_the_token_whitened_estimators_need_the_token_counts():
    with pytest.raises(ValueError, match="token count"):
        compute_advantages([1.0, 0.0], [0, 0], "reinforce_plus_plus", True)


@pytest.mark.parametrize("tokens, truncated, penalty", [
    (10, False, 0.0), (12, False, 0.0), (13, False, -0.25), (14, False, -0.5), (16, False, -1.0),
    (16, True, -1.0), (9, True, -1.0),
])
def test_overlong_penalty_falls_linearly_through_the_buffer(tokens, truncated, penalty):
    # Budget 16 with a buffer of 4: free up to 12 tokens, −1 at 16 or when cut off by the budget.
    assert overlong_penalty(tokens, truncated, budget=16, buffer=4, penalty=1.0) == pytest.approx(penalty, abs=1e-15)
    assert overlong_penalty(tokens, truncated, budget=16, buffer=4, penalty=0.5) == pytest.approx(penalty / 2,
                                                                                                  abs=1e-15)
