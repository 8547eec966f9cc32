"""Per-token loss terms and their aggregation.

Every function takes [B, T] tensors aligned with the completion mask and returns per-token values;
`aggregate` turns them into one scalar whose denominator is the whole optimizer step, so that
gradient accumulation over micro batches (and over data-parallel ranks) gives the same gradient
as one pass over the full batch.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

MAX_LOG_RATIO = 10.0
"""A sequence ratio's log is capped here before exp: a sequence far off the anchor would otherwise overflow to inf
(its clip then zeroes its gradient, as for any ratio beyond the clip)."""


def clipped_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_low: float, clip_high: float,
    mask: Tensor | None = None, level: Literal["token", "sequence"] = "token",
) -> tuple[Tensor, Tensor]:
    """PPO's pessimistic surrogate, negated to be minimised, with an asymmetric clip
    [1 − clip_low, 1 + clip_high] around the anchor `old_logp`; and where the clip was active.

    `advantages` is [B] (one per sequence) and broadcast over tokens. `level` sequence is GSPO's ratio: every
    token of a sequence takes the geometric mean of its tokens' ratios over `mask`, s = exp(mean(log π − log
    π_old)), as its value, and s × ∇ log π(token) as its gradient; the clip then acts on whole sequences."""
    log_ratio = logp - old_logp
    if level == "sequence":
        log_sequence = (torch.where(mask, log_ratio, torch.zeros_like(log_ratio)).sum(-1)
                        / mask.sum(-1).clamp(min=1)).clamp(max=MAX_LOG_RATIO)
        log_ratio = logp - logp.detach() + log_sequence.detach()[:, None]
    ratio = log_ratio.exp()
    advantage = advantages[:, None]
    unclipped = ratio * advantage
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantage
    return -torch.minimum(unclipped, clipped), (clipped < unclipped)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(π ‖ π_ref) on tokens sampled from π: exp(Δ) − Δ − 1 with
    Δ = log π_ref − log π. Non-negative, and its gradient is unbiased for the reverse KL."""
    delta = ref_logp - logp
    return delta.exp() - delta - 1.0


Aggregation = Literal["token_mean", "sequence_mean", "seq_mean_token_sum_norm"]


def aggregate(values: Tensor, mask: Tensor, how: Aggregation, step_tokens: int, step_sequences: int,
              max_new_tokens: int | None = None) -> Tensor:
    """Sum of this micro batch's share of the step mean.

    token_mean: Σ values / tokens in the step. sequence_mean: Σ over sequences of their own token
    mean, / sequences in the step (each sequence counts once, whatever its length).
    seq_mean_token_sum_norm (Dr. GRPO): Σ over sequences of their token sum / `max_new_tokens`, / sequences in
    the step: a constant divisor, so no sequence's tokens weigh more for being short."""
    masked = torch.where(mask, values, torch.zeros_like(values))
    if how == "token_mean":
        return masked.sum() / max(step_tokens, 1)
    if how == "seq_mean_token_sum_norm":
        if max_new_tokens is None:
            raise ValueError("seq_mean_token_sum_norm divides by the completion budget: give max_new_tokens")
        return masked.sum() / max_new_tokens / max(step_sequences, 1)
    per_sequence = masked.sum(-1) / mask.sum(-1).clamp(min=1)
    return per_sequence.sum() / max(step_sequences, 1)
