"""Off-policy correction: importance weights, rejection masks and the diagnostics of the gap.

Every ratio here is r = π_train / π_behav on the completion tokens the rollout engine
sampled, so every expectation is over the behaviour policy. Nothing here carries
gradient: the weights are constants of the loss. Formulas: docs/correction.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fasync.config.schema import CorrectionConfig

LOG_RATIO_LIMIT = 20.0
"""Token log ratios (and their sequence sums, before exp) are clamped to ±this, so that r²
and its sums stay finite in float32; every weight and metric sees the clamped values."""


@dataclass
class CorrectionResult:
    weights: Tensor
    """[B, T] float, detached importance weights; 1.0 where `correction.level` is "none"."""
    keep_mask: Tensor
    """[B, T] bool: the input mask AND every rejection mask."""
    metrics: dict[str, float]


@dataclass
class _LogRatios:
    """Detached, clamped log π_train − log π_behav per token (0 outside the mask)."""

    mask: Tensor  # [B, T] bool
    token: Tensor  # [B, T]
    tokens_per_sequence: Tensor  # [B]

    @property
    def has_tokens(self) -> Tensor:
        return self.tokens_per_sequence > 0

    @property
    def sequence_sum(self) -> Tensor:
        return self.token.sum(dim=-1)

    def per_sequence_mean(self, token_values: Tensor) -> Tensor:
        """Mean over each sequence's masked tokens of values that are 0 outside the mask."""
        return token_values.sum(dim=-1) / self.tokens_per_sequence.clamp(min=1)


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    # Select, never multiply: padding may hold −inf or nan.
    return torch.where(mask, values, torch.zeros_like(values))


def _log_ratios(train_logp: Tensor, behaviour_logp: Tensor, mask: Tensor) -> _LogRatios:
    mask = mask.bool()
    dtype = torch.promote_types(train_logp.dtype, torch.float32)
    difference = train_logp.detach().to(dtype) - behaviour_logp.detach().to(dtype)
    token = _masked(difference.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT), mask)
    return _LogRatios(mask, token, mask.sum(dim=-1).to(dtype))


def _exp(log_value: Tensor) -> Tensor:
    return log_value.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).exp()


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of `values` where `mask` holds; 0 for an empty mask."""
    return _masked(values, mask).sum() / mask.sum().clamp(min=1)


def _k3(log_ratio: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(π_behav ‖ π_train): r − 1 − log r ≥ 0, and 0 where log r = 0.
    Clamped at 0: for |log r| near float precision the subtraction can round below it."""
    return (_exp(log_ratio) - 1.0 - log_ratio).clamp(min=0.0)


def _normalized_ess(log_weights: Tensor, mask: Tensor) -> Tensor:
    """(Σw)² / (n Σw²) over the masked entries (0 if none), in log space so no weight overflows."""
    if not mask.any():
        return log_weights.new_zeros(())
    masked = log_weights[mask]
    log_ess = 2 * torch.logsumexp(masked, 0) - torch.logsumexp(2 * masked, 0)
    return (log_ess - math.log(masked.numel())).exp()


def _diagnostics(ratios: _LogRatios, train_logp: Tensor, behaviour_logp: Tensor) -> dict[str, Tensor]:
    mask, sequences = ratios.mask, ratios.has_tokens
    train = _masked(train_logp.detach().to(ratios.token.dtype), mask)
    behaviour = _masked(behaviour_logp.detach().to(ratios.token.dtype), mask)
    return {
        "is/kl_direct": _masked_mean(-ratios.token, mask),
        "is/kl_k3": _masked_mean(_k3(ratios.token), mask),
        "is/ppl_train": _masked_mean(-train, mask).exp(),
        "is/ppl_rollout": _masked_mean(-behaviour, mask).exp(),
        "is/log_ppl_diff": _masked_mean(ratios.per_sequence_mean(behaviour - train), sequences),
        # E[r²] − 1 written as E[r² − 1], so that an empty batch reads 0 like every other metric.
        "is/chi2_token": _masked_mean(_exp(2 * ratios.token) - 1.0, mask),
        "is/chi2_seq": _masked_mean(_exp(2 * ratios.sequence_sum) - 1.0, sequences),
        "is/ess_token": _normalized_ess(ratios.token, mask),
        "is/ess_seq": _normalized_ess(ratios.sequence_sum, sequences),
    }


def _as_floats(metrics: dict[str, Tensor]) -> dict[str, float]:
    # One device-to-host copy for all of them.
    values = torch.stack([value.to(torch.float64) for value in metrics.values()]).tolist()
    return dict(zip(metrics, values))


@torch.no_grad()
def diagnostics(train_logp: Tensor, behaviour_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the behaviour policy is from the training policy on these tokens (`is/` metrics)."""
    return _as_floats(_diagnostics(_log_ratios(train_logp, behaviour_logp, mask), train_logp, behaviour_logp))


def _within(values: Tensor, bounds: tuple[float, float]) -> Tensor:
    low, high = bounds
    return (values >= low) & (values <= high)


def _rejection_mask(ratios: _LogRatios, cfg: CorrectionConfig) -> Tensor:
    """Tokens that pass every configured rejection rule."""
    keep = ratios.mask.clone()
    if cfg.reject_token_ratio is not None:
        keep &= _within(_exp(ratios.token), cfg.reject_token_ratio)
    if cfg.reject_sequence_ratio is not None:
        geometric_mean = _exp(ratios.per_sequence_mean(ratios.token))
        keep &= _within(geometric_mean, cfg.reject_sequence_ratio).unsqueeze(-1)
    if cfg.reject_kl is not None:
        sequence_kl = ratios.per_sequence_mean(_k3(ratios.token))
        keep &= (sequence_kl <= cfg.reject_kl).unsqueeze(-1)
    return keep


def _truncated_weights(ratios: _LogRatios, cfg: CorrectionConfig) -> tuple[Tensor, Tensor]:
    """Weights after truncation, and where truncation changed them."""
    if cfg.level == "none":
        ones = torch.ones_like(ratios.token)
        return ones, torch.zeros_like(ratios.mask)
    if cfg.level == "token":
        raw = _exp(ratios.token)
    else:
        raw = _exp(ratios.sequence_sum).unsqueeze(-1).expand_as(ratios.token)
    weights = raw.clamp(min=cfg.weight_lower, max=cfg.weight_upper)
    return weights, (weights != raw) & ratios.mask


@torch.no_grad()
def apply(
    train_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, cfg: CorrectionConfig
) -> CorrectionResult:
    """Importance weights and rejection for one batch, with its `is/` metrics.

    Order: weights, truncation to [weight_lower, weight_upper], rejection, then
    (batch_normalize) rescaling so the weights average 1 over the kept tokens.
    """
    ratios = _log_ratios(train_logp, behaviour_logp, mask)
    weights, truncated = _truncated_weights(ratios, cfg)
    keep = _rejection_mask(ratios, cfg)
    if cfg.batch_normalize:
        mean = _masked_mean(weights, keep)
        weights = weights / torch.where(mean > 0, mean, torch.ones_like(mean))

    metrics = _diagnostics(ratios, train_logp, behaviour_logp)
    valid, sequences = ratios.mask, ratios.has_tokens
    metrics.update(
        {
            "is/weight_mean": _masked_mean(weights, keep),
            "is/weight_max": _masked(weights, keep).max(),
            "is/truncated_token_frac": _masked_mean(truncated.float(), valid),
            "is/truncated_seq_frac": _masked_mean(truncated.any(dim=-1).float(), sequences),
            "is/rejected_token_frac": _masked_mean((~keep).float(), valid),
            "is/rejected_seq_frac": _masked_mean((~keep.any(dim=-1)).float(), sequences),
            "is/all_rejected": (~keep.any()).float(),
        }
    )
    return CorrectionResult(weights=weights, keep_mask=keep, metrics=_as_floats(metrics))
