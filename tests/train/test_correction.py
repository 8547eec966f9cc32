"""Off-policy correction (fasync.train.correction): weights, truncation, rejection and diagnostics.

The logprobs here are float64, so weights and diagnostics are compared with approx's default (rel=1e-6) or
tighter against values worked out in Python: float64 rounding is ~1e-16. The is/*_frac metrics are counts
divided in fp32 (one rounding, 6e-8 relative at most), also inside the default. The properties draw their
logprobs as float64 too: they are about the algorithm, and in fp32 a mean of 24 weights rounds by up to
24 * 2**-24 = 1.4e-6 relative, which a CPU's reduction order decides. Only the extreme-ratio test runs in
fp32 on purpose (its point is that clamped sums stay finite in fp32) and says why its tolerances hold.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fasync.config.schema import CorrectionConfig
from fasync.train.correction import CorrectionResult, apply, diagnostics

# Two sequences of three completion tokens; the last token of the second is padding,
# with a −inf rollout logprob there, which must never reach any weight or metric.
TRAIN = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]], dtype=torch.float64)
BEHAVIOUR = torch.tensor([[-1.2, -0.5, -1.0], [-0.6, -1.0, -math.inf]], dtype=torch.float64)
MASK = torch.tensor([[True, True, True], [True, True, False]])
# log π_train − log π_behav on the five real tokens: [0.2, 0.0, −1.0] and [0.3, −0.2].
LOG_RATIOS = [[0.2, 0.0, -1.0], [0.3, -0.2]]
TOKEN_RATIOS = [[math.exp(x) for x in row] for row in LOG_RATIOS]
SEQ_RATIOS = [math.exp(-0.8), math.exp(0.1)]


def run(**cfg) -> CorrectionResult:
    return apply(TRAIN, BEHAVIOUR, MASK, CorrectionConfig(**cfg))


def real_tokens(weights: torch.Tensor) -> list[list[float]]:
    return [weights[0, :3].tolist(), weights[1, :2].tolist()]


def assert_nested_close(actual, expected):
    for actual_row, expected_row in zip(actual, expected, strict=True):
        assert actual_row == pytest.approx(expected_row, rel=1e-9)


def test_token_weights_are_per_token_ratios():
    result = run(level="token", weight_upper=10.0)
    assert_nested_close(real_tokens(result.weights), TOKEN_RATIOS)
    assert result.keep_mask.equal(MASK)
    assert result.metrics["is/truncated_token_frac"] == 0.0
    assert result.metrics["is/weight_max"] == pytest.approx(math.exp(0.3))
    assert result.metrics["is/weight_mean"] == pytest.approx(sum(map(sum, TOKEN_RATIOS)) / 5)


def test_sequence_weights_are_the_product_broadcast_over_the_sequence():
    result = run(level="sequence", weight_upper=10.0)
    assert_nested_close(real_tokens(result.weights), [[SEQ_RATIOS[0]] * 3, [SEQ_RATIOS[1]] * 2])
    assert result.metrics["is/weight_mean"] == pytest.approx((3 * SEQ_RATIOS[0] + 2 * SEQ_RATIOS[1]) / 5)


def test_no_correction_gives_unit_weights_everywhere():
    result = run(level="none", weight_upper=0.5)
    assert result.weights.eq(1.0).all()
    assert result.metrics["is/truncated_token_frac"] == 0.0
    assert result.metrics["is/weight_mean"] == 1.0


def test_token_truncation_clamps_both_ends_and_counts_what_it_touched():
    result = run(level="token", weight_upper=1.1, weight_lower=0.5)
    # exp(0.2) and exp(0.3) exceed 1.1; exp(−1) is below 0.5; exp(0) and exp(−0.2) are inside.
    assert_nested_close(real_tokens(result.weights), [[1.1, 1.0, 0.5], [1.1, math.exp(-0.2)]])
    assert result.metrics["is/truncated_token_frac"] == pytest.approx(3 / 5)
    assert result.metrics["is/truncated_seq_frac"] == 1.0


def test_sequence_truncation_marks_every_token_of_the_truncated_sequence():
    result = run(level="sequence", weight_upper=1.05)
    assert_nested_close(real_tokens(result.weights), [[SEQ_RATIOS[0]] * 3, [1.05, 1.05]])
    assert result.metrics["is/truncated_token_frac"] == pytest.approx(2 / 5)
    assert result.metrics["is/truncated_seq_frac"] == pytest.approx(1 / 2)


def test_batch_normalization_divides_by_the_mean_over_kept_tokens():
    result = run(level="token", weight_upper=10.0, batch_normalize=True)
    mean = sum(map(sum, TOKEN_RATIOS)) / 5
    assert_nested_close(real_tokens(result.weights), [[w / mean for w in row] for row in TOKEN_RATIOS])
    assert result.metrics["is/weight_mean"] == pytest.approx(1.0)

    # With rejection the mean is taken over the survivors only: exp(0.2), exp(0), exp(−0.2).
    result = run(level="token", weight_upper=10.0, batch_normalize=True, reject_token_ratio=(0.5, 1.25))
    mean = (math.exp(0.2) + 1.0 + math.exp(-0.2)) / 3
    assert result.weights[0, 0].item() == pytest.approx(math.exp(0.2) / mean)
    assert result.metrics["is/weight_mean"] == pytest.approx(1.0)


def test_token_ratio_rejection():
    # Ratios 1.221, 1, 0.368 | 1.350, 0.819 against [0.5, 1.25].
    result = run(reject_token_ratio=(0.5, 1.25))
    assert result.keep_mask.tolist() == [[True, True, False], [False, True, False]]
    assert result.metrics["is/rejected_token_frac"] == pytest.approx(2 / 5)
    assert result.metrics["is/rejected_seq_frac"] == 0.0


def test_sequence_geometric_mean_rejection():
    # Geometric means exp(−0.8 / 3) = 0.766 and exp(0.1 / 2) = 1.051 against [0.9, 1.1].
    result = run(reject_sequence_ratio=(0.9, 1.1))
    assert result.keep_mask.tolist() == [[False, False, False], [True, True, False]]
    assert result.metrics["is/rejected_token_frac"] == pytest.approx(3 / 5)
    assert result.metrics["is/rejected_seq_frac"] == pytest.approx(1 / 2)


def k3(log_ratio: float) -> float:
    return math.exp(log_ratio) - 1 - log_ratio


def test_kl_rejection_uses_the_sequence_mean_of_k3():
    first = sum(k3(x) for x in LOG_RATIOS[0]) / 3  # 0.1298
    second = sum(k3(x) for x in LOG_RATIOS[1]) / 2  # 0.0343
    assert second < 0.1 < first
    assert run(reject_kl=0.1).keep_mask.tolist() == [[False, False, False], [True, True, False]]
    assert run(reject_kl=first + 1e-6).keep_mask.equal(MASK)


def test_rejection_rules_combine_by_and():
    result = run(reject_token_ratio=(0.5, 1.25), reject_kl=0.1)
    assert result.keep_mask.tolist() == [[False, False, False], [False, True, False]]
    assert result.metrics["is/rejected_token_frac"] == pytest.approx(4 / 5)
    assert result.metrics["is/rejected_seq_frac"] == pytest.approx(1 / 2)
    assert result.metrics["is/all_rejected"] == 0.0


def test_a_fully_rejected_batch_is_reported_not_raised():
    result = run(level="token", batch_normalize=True, reject_token_ratio=(1.5, 2.0))
    assert not result.keep_mask.any()
    assert result.metrics["is/all_rejected"] == 1.0
    assert result.metrics["is/rejected_token_frac"] == 1.0
    assert result.metrics["is/rejected_seq_frac"] == 1.0
    assert result.metrics["is/weight_mean"] == 0.0
    assert torch.isfinite(result.weights).all()
    assert all(math.isfinite(value) for value in result.metrics.values())


def test_diagnostics_by_hand():
    metrics = diagnostics(TRAIN, BEHAVIOUR, MASK)
    tokens = [x for row in LOG_RATIOS for x in row]
    ratios = [math.exp(x) for x in tokens]
    assert metrics["is/kl_direct"] == pytest.approx(0.14)  # −mean(log r) = 0.7 / 5
    assert metrics["is/kl_k3"] == pytest.approx(sum(k3(x) for x in tokens) / 5)
    assert metrics["is/ppl_train"] == pytest.approx(math.exp(5.0 / 5))
    assert metrics["is/ppl_rollout"] == pytest.approx(math.exp(4.3 / 5))
    # Per-sequence mean log-ratio differences 0.8 / 3 and −0.1 / 2, averaged over the two sequences.
    assert metrics["is/log_ppl_diff"] == pytest.approx((0.8 / 3 - 0.05) / 2)
    assert metrics["is/chi2_token"] == pytest.approx(sum(r * r for r in ratios) / 5 - 1)
    assert metrics["is/chi2_seq"] == pytest.approx(sum(r * r for r in SEQ_RATIOS) / 2 - 1)
    assert metrics["is/ess_token"] == pytest.approx(sum(ratios) ** 2 / (5 * sum(r * r for r in ratios)))
    assert metrics["is/ess_seq"] == pytest.approx(sum(SEQ_RATIOS) ** 2 / (2 * sum(r * r for r in SEQ_RATIOS)))


def test_apply_reports_the_diagnostics_too():
    metrics = run(level="token").metrics
    assert diagnostics(TRAIN, BEHAVIOUR, MASK).items() <= metrics.items()


def test_token_perplexity_gap_equals_direct_kl():
    metrics = diagnostics(TRAIN, BEHAVIOUR, MASK)
    gap = math.log(metrics["is/ppl_train"]) - math.log(metrics["is/ppl_rollout"])
    assert gap == pytest.approx(metrics["is/kl_direct"])


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_weights_never_carry_gradient(level):
    train = TRAIN.clone().requires_grad_(True)
    behaviour = BEHAVIOUR.clone().requires_grad_(True)
    result = apply(train, behaviour, MASK, CorrectionConfig(level=level, batch_normalize=True))
    assert not result.weights.requires_grad
    assert result.weights.grad_fn is None
    assert train.grad is None


def test_extreme_log_ratios_are_clamped_and_stay_finite():
    # Log ratios of ±60 on each token: r² and the sequence sums would overflow float32 unclamped.
    train = torch.tensor([[0.0, -60.0], [-60.0, 0.0], [0.0, 0.0]])
    behaviour = torch.tensor([[-60.0, 0.0], [0.0, -60.0], [-60.0, -60.0]])
    mask = torch.ones(3, 2, dtype=torch.bool)
    result = apply(train, behaviour, mask, CorrectionConfig(level="sequence", weight_upper=1e12))
    assert torch.isfinite(result.weights).all()
    # fp32 exp(20) is correctly rounded to within 2**-24 relative; the clamped log ratios ±20 and their sum 40
    # are exact in fp32, and their mean −40/6 rounds once (2.4e-8 relative measured).
    assert result.weights[2, 0].item() == pytest.approx(math.exp(20.0), rel=1e-5)
    assert all(math.isfinite(value) for value in result.metrics.values())
    assert result.metrics["is/kl_direct"] == pytest.approx(-40 / 6)  # −mean of the log ratios clamped to ±20
    assert 0.0 < result.metrics["is/ess_token"] <= 1.0


def test_low_precision_inputs_give_float32_weights():
    result = apply(TRAIN.bfloat16(), BEHAVIOUR.bfloat16(), MASK, CorrectionConfig(level="token"))
    assert result.weights.dtype == torch.float32


def test_empty_batch_reads_zero():
    mask = torch.zeros_like(MASK)
    result = apply(TRAIN, BEHAVIOUR, mask, CorrectionConfig(level="token"))
    assert result.metrics["is/all_rejected"] == 1.0
    assert all(math.isfinite(value) for value in result.metrics.values())
    assert result.metrics["is/kl_direct"] == result.metrics["is/chi2_token"] == 0.0


def test_inverted_intervals_are_config_errors():
    with pytest.raises(ValueError, match="reject_token_ratio"):
        CorrectionConfig(reject_token_ratio=(2.0, 0.5))
    with pytest.raises(ValueError, match="weight_lower"):
        CorrectionConfig(weight_lower=3.0, weight_upper=2.0)


# --- properties -------------------------------------------------------------------------------

logprob_batches = st.integers(1, 4).flatmap(
    lambda batch: st.integers(1, 6).flatmap(
        lambda length: st.tuples(
            st.lists(
                st.lists(st.floats(-12.0, 0.0), min_size=length, max_size=length),
                min_size=batch,
                max_size=batch,
            ),
            st.lists(
                st.lists(st.booleans(), min_size=length, max_size=length), min_size=batch, max_size=batch
            ),
        )
    )
)
intervals_holding_one = st.tuples(st.floats(0.0, 1.0), st.floats(1.0, 100.0))


def with_a_real_token(mask: list[list[bool]]) -> torch.Tensor:
    tensor = torch.tensor(mask)
    tensor[0, 0] = True
    return tensor


@settings(max_examples=60, deadline=None)
@given(
    batch=logprob_batches,
    level=st.sampled_from(["none", "token", "sequence"]),
    upper=st.floats(1.0, 10.0),
    lower=st.one_of(st.none(), st.floats(0.0, 1.0)),
    normalize=st.booleans(),
    token_interval=st.one_of(st.none(), intervals_holding_one),
    sequence_interval=st.one_of(st.none(), intervals_holding_one),
    kl=st.one_of(st.none(), st.floats(1e-6, 10.0)),
)
def test_identical_policies_need_no_correction(
    batch, level, upper, lower, normalize, token_interval, sequence_interval, kl
):
    logp = torch.tensor(batch[0], dtype=torch.float64)
    mask = with_a_real_token(batch[1])
    cfg = CorrectionConfig(
        level=level,
        weight_upper=upper,
        weight_lower=lower,
        batch_normalize=normalize,
        reject_token_ratio=token_interval,
        reject_sequence_ratio=sequence_interval,
        reject_kl=kl,
    )
    result = apply(logp, logp.clone(), mask, cfg)
    assert result.weights[mask].eq(1.0).all()
    assert result.keep_mask.equal(mask)
    metrics = result.metrics
    for name in ["kl_direct", "kl_k3", "chi2_token", "chi2_seq", "log_ppl_diff"]:
        assert metrics[f"is/{name}"] == pytest.approx(0.0, abs=1e-6)
    for name in ["rejected_token_frac", "rejected_seq_frac", "truncated_token_frac", "all_rejected"]:
        assert metrics[f"is/{name}"] == 0.0
    assert metrics["is/ess_token"] == pytest.approx(1.0)
    assert metrics["is/ess_seq"] == pytest.approx(1.0)
    assert metrics["is/ppl_train"] == pytest.approx(metrics["is/ppl_rollout"])


@settings(max_examples=60, deadline=None)
@given(
    batch=logprob_batches,
    shift=st.lists(st.floats(-3.0, 3.0), min_size=24, max_size=24),
    level=st.sampled_from(["token", "sequence"]),
    upper=st.floats(0.5, 5.0),
    lower=st.floats(0.0, 0.5),
)
def test_weights_respect_truncation_bounds(batch, shift, level, upper, lower):
    train = torch.tensor(batch[0], dtype=torch.float64)
    behaviour = train + torch.tensor(shift[: train.numel()], dtype=torch.float64).view_as(train)
    mask = with_a_real_token(batch[1])
    result = apply(
        train, behaviour, mask, CorrectionConfig(level=level, weight_upper=upper, weight_lower=lower)
    )
    kept = result.weights[mask]
    assert (kept >= lower).all() and (kept <= upper).all()
    assert 0.0 < result.metrics["is/ess_token"] <= 1.0 + 1e-6
    assert 0.0 < result.metrics["is/ess_seq"] <= 1.0 + 1e-6
    assert result.metrics["is/kl_k3"] >= 0.0


@settings(max_examples=60, deadline=None)
@given(
    batch=logprob_batches,
    shift=st.lists(st.floats(-3.0, 3.0), min_size=24, max_size=24),
    level=st.sampled_from(["token", "sequence"]),
)
def test_batch_normalization_gives_mean_one(batch, shift, level):
    train = torch.tensor(batch[0], dtype=torch.float64)
    behaviour = train + torch.tensor(shift[: train.numel()], dtype=torch.float64).view_as(train)
    mask = with_a_real_token(batch[1])
    result = apply(
        train, behaviour, mask, CorrectionConfig(level=level, weight_upper=5.0, batch_normalize=True)
    )
    assert result.weights[result.keep_mask].mean().item() == pytest.approx(1.0, rel=1e-5)


@settings(max_examples=60, deadline=None)
@given(batch=logprob_batches, shift=st.lists(st.floats(-1.0, 1.0), min_size=24, max_size=24))
def test_sequence_weight_is_the_product_of_token_weights(batch, shift):
    train = torch.tensor(batch[0], dtype=torch.float64)
    behaviour = train + torch.tensor(shift[: train.numel()], dtype=torch.float64).view_as(train)
    mask = with_a_real_token(batch[1])
    untruncated = {"weight_upper": 1e9}
    token = apply(train, behaviour, mask, CorrectionConfig(level="token", **untruncated)).weights
    sequence = apply(train, behaviour, mask, CorrectionConfig(level="sequence", **untruncated)).weights
    for row in range(train.shape[0]):
        if mask[row].any():
            expected = token[row][mask[row]].prod().item()
            assert sequence[row][mask[row]].tolist() == pytest.approx([expected] * int(mask[row].sum()))
