"""Loss terms against hand-computed values, and aggregation that survives splitting into micro batches.

Every tensor is float64: these tests are about the formulas, so they compare with approx's default or
rel=1e-12 (float64 rounding is ~1e-16 on values of order 1), except the Monte Carlo estimate (rel=0.02)."""

import math

import pytest
import torch

from fasync.train.losses import aggregate, clipped_surrogate, k3_kl

CLIP_LOW, CLIP_HIGH = 0.2, 0.28
"""Asymmetric: the ratio may rise to 1.28 but fall only to 0.8."""

# Per row, tokens at ratios: inside, above 1 + high, below 1 − low, inside only thanks to the asymmetry.
RATIOS = torch.tensor([[1.1, 1.5, 0.5, 1.25], [1.1, 1.5, 0.5, 0.85]], dtype=torch.float64)
ADVANTAGES = torch.tensor([2.0, -1.0], dtype=torch.float64)
OLD_LOGP = torch.tensor([[-1.0, -0.5, -2.0, -1.5], [-0.2, -3.0, -1.0, -0.7]], dtype=torch.float64)
# A > 0: min(rA, clip(r)A) caps the gain at 1.28A but keeps a loss below 0.8.
# A < 0: the penalty of a large ratio stays unclipped; below 0.8 the ratio is clipped.
EXPECTED_LOSS = [[-2.2, -2.56, -1.0, -2.5], [1.1, 1.5, 0.8, 0.85]]
EXPECTED_CLIPPED = [[False, True, False, False], [False, False, True, False]]


def surrogate(ratios=RATIOS):
    logp = (OLD_LOGP + ratios.log()).requires_grad_(True)
    loss, clipped = clipped_surrogate(logp, OLD_LOGP, ADVANTAGES, CLIP_LOW, CLIP_HIGH)
    return logp, loss, clipped


def test_clipped_surrogate_values_and_clip_indicator():
    _, loss, clipped = surrogate()
    assert loss.tolist()[0] == pytest.approx(EXPECTED_LOSS[0], rel=1e-12)
    assert loss.tolist()[1] == pytest.approx(EXPECTED_LOSS[1], rel=1e-12)
    assert clipped.tolist() == EXPECTED_CLIPPED


def test_clipped_tokens_carry_no_gradient_and_the_others_the_policy_gradient():
    logp, loss, clipped = surrogate()
    loss.sum().backward()
    # d(−r A)/d log π = −r A where the unclipped term is the minimum; 0 where the clip is active.
    expected = torch.where(clipped, torch.zeros_like(RATIOS), -RATIOS * ADVANTAGES[:, None])
    assert torch.allclose(logp.grad, expected, rtol=1e-12)


def test_a_symmetric_clip_would_clip_the_tokens_the_asymmetric_one_lets_through():
    logp = OLD_LOGP + RATIOS.log()
    _, clipped = clipped_surrogate(logp, OLD_LOGP, ADVANTAGES, 0.2, 0.2)
    assert clipped[0, 3] and not clipped[1, 3]  # 1.25 > 1.2 with A > 0; 0.85 > 0.8 with A < 0


def test_ratio_one_is_never_clipped_and_gives_minus_the_advantage():
    _, loss, clipped = surrogate(torch.ones_like(RATIOS))
    assert loss.tolist() == [[-2.0] * 4, [1.0] * 4]
    assert not clipped.any()


def test_k3_kl_hand_values():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
    ref_logp = torch.tensor([[-2.0, -1.0, -0.5]], dtype=torch.float64)
    # Δ = ref − logp = [−1, 1, 0]: e^Δ − Δ − 1.
    expected = [math.exp(-1) + 1 - 1, math.e - 1 - 1, 0.0]
    assert k3_kl(logp, ref_logp).tolist()[0] == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_k3_kl_is_non_negative():
    generator = torch.Generator().manual_seed(0)
    logp = -5 * torch.rand(64, 32, generator=generator, dtype=torch.float64)
    ref_logp = -5 * torch.rand(64, 32, generator=generator, dtype=torch.float64)
    kl = k3_kl(logp, ref_logp)
    assert (kl >= 0).all()
    assert (k3_kl(logp, logp) == 0).all()


def test_k3_kl_averages_to_the_kl_on_tokens_sampled_from_the_policy():
    policy = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    reference = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    exact = float((policy * (policy / reference).log()).sum())
    tokens = torch.multinomial(policy, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    estimate = float(k3_kl(policy.log()[tokens][None], reference.log()[tokens][None]).mean())
    # 200,000 draws: the estimate's standard error is 0.18% of the KL here, so 2% is 11 of them.
    assert estimate == pytest.approx(exact, rel=0.02)


VALUES = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], dtype=torch.float64)
MASK = torch.tensor([[True, True, False, False], [True, True, True, False]])


def test_token_mean_divides_by_the_step_tokens():
    assert float(aggregate(VALUES, MASK, "token_mean", step_tokens=5, step_sequences=2)) == pytest.approx(21 / 5)
    # Another micro batch of the same step holds tokens too: the denominator is the step's.
    assert float(aggregate(VALUES, MASK, "token_mean", step_tokens=10, step_sequences=4)) == pytest.approx(21 / 10)


def test_sequence_mean_averages_each_sequence_then_the_sequences():
    # Row means 1.5 and 6; each sequence counts once whatever its length.
    assert float(aggregate(VALUES, MASK, "sequence_mean", step_tokens=5, step_sequences=2)) == pytest.approx(3.75)
    assert float(aggregate(VALUES, MASK, "sequence_mean", step_tokens=5, step_sequences=4)) == pytest.approx(7.5 / 4)


def test_masked_positions_never_reach_the_result_even_as_nan():
    poisoned = VALUES.masked_fill(~MASK, float("nan")).requires_grad_(True)
    total = aggregate(poisoned, MASK, "token_mean", 5, 2) + aggregate(poisoned, MASK, "sequence_mean", 5, 2)
    assert float(total.detach()) == pytest.approx(21 / 5 + 3.75)
    total.backward()
    assert torch.isfinite(poisoned.grad).all()
    assert (poisoned.grad[~MASK] == 0).all()


def test_seq_mean_token_sum_norm_divides_each_sequence_sum_by_the_budget():
    # Dr. GRPO: row sums 3 and 18, each / a budget of 4 tokens, averaged over the step's 2 (then 4) sequences.
    assert float(aggregate(VALUES, MASK, "seq_mean_token_sum_norm", 5, 2, max_new_tokens=4)) == pytest.approx(21 / 8)
    assert float(aggregate(VALUES, MASK, "seq_mean_token_sum_norm", 5, 4, max_new_tokens=4)) == pytest.approx(21 / 16)
    with pytest.raises(ValueError, match="max_new_tokens"):
        aggregate(VALUES, MASK, "seq_mean_token_sum_norm", 5, 2)


@pytest.mark.parametrize("how", ["token_mean", "sequence_mean", "seq_mean_token_sum_norm"])
def test_micro_batches_with_step_denominators_sum_to_the_full_batch(how):
    generator = torch.Generator().manual_seed(1)
    values = torch.randn(6, 5, generator=generator, dtype=torch.float64)
    lengths = torch.tensor([1, 5, 3, 2, 4, 5])
    mask = torch.arange(5)[None, :] < lengths[:, None]
    tokens, sequences = int(mask.sum()), mask.shape[0]
    whole = aggregate(values, mask, how, tokens, sequences, 5)
    parts = (aggregate(values[:2], mask[:2], how, tokens, sequences, 5)
             + aggregate(values[2:], mask[2:], how, tokens, sequences, 5))
    assert float(parts) == pytest.approx(float(whole), rel=1e-12)
    # And the plain full-batch means they stand for.
    if how == "token_mean":
        assert float(whole) == pytest.approx(float(values[mask].mean()), rel=1e-12)
    elif how == "seq_mean_token_sum_norm":
        row_sums = [float(values[i, :length].sum()) / 5 for i, length in enumerate(lengths)]
        assert float(whole) == pytest.approx(sum(row_sums) / len(row_sums), rel=1e-12)
    else:
        row_means = [float(values[i, :length].mean()) for i, length in enumerate(lengths)]
        assert float(whole) == pytest.approx(sum(row_means) / len(row_means), rel=1e-12)


# GSPO: row 0's log ratios 0.1 and 0.3 (the third token is padding) average to 0.2, a sequence ratio e^0.2 ≈ 1.2214
# above 1 + 0.2 with A = 2: clipped to 1.2 on every token. Row 1's −0.1, 0.1, 0 average to 0: ratio 1, A = −1.
GSPO_LOG_RATIOS = torch.tensor([[0.1, 0.3, 5.0], [-0.1, 0.1, 0.0]], dtype=torch.float64)
GSPO_MASK = torch.tensor([[True, True, False], [True, True, True]])
GSPO_OLD = torch.tensor([[-1.0, -0.5, -2.0], [-0.2, -3.0, -1.0]], dtype=torch.float64)


def test_sequence_ratio_is_the_geometric_mean_of_the_token_ratios_clipped_per_sequence():
    logp = (GSPO_OLD + GSPO_LOG_RATIOS).requires_grad_(True)
    loss, clipped = clipped_surrogate(logp, GSPO_OLD, ADVANTAGES, 0.2, 0.2, GSPO_MASK, "sequence")
    assert loss[0, :2].tolist() == pytest.approx([-2.4, -2.4], rel=1e-12)
    assert loss[1].tolist() == pytest.approx([1.0, 1.0, 1.0], rel=1e-12)
    assert clipped[0, :2].tolist() == [True, True] and not clipped[1].any()
    # A token's gradient is the sequence ratio times its own: −s × A where unclipped, 0 where the clip holds.
    loss.sum().backward()
    assert logp.grad[0].tolist() == [0.0, 0.0, 0.0]
    assert logp.grad[1].tolist() == pytest.approx([1.0, 1.0, 1.0], rel=1e-12)


def test_the_token_ratio_of_the_same_tokens_differs_from_the_sequence_ratio():
    logp = GSPO_OLD + GSPO_LOG_RATIOS
    token_loss, _ = clipped_surrogate(logp, GSPO_OLD, ADVANTAGES, 0.2, 0.2)
    # Row 1 token by token: ratios e^−0.1 and e^0.1 with A = −1 (no clip binds: 0.905 > 0.8, 1.105 < 1.2).
    assert token_loss[1, :2].tolist() == pytest.approx([math.exp(-0.1), math.exp(0.1)], rel=1e-12)
