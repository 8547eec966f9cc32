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


def clipped_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """PPO's pessimistic surrogate, negated to be minimised, with an asymmetric clip
    [1 − clip_low, 1 + clip_high] around the anchor `old_logp`; and where the clip was active.

    `advantages` is [B] (one per sequence) and broadcast over tokens."""
    ratio = (logp - old_logp).exp()
    advantage = advantages[:, None]
    unclipped = ratio * advantage
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantage
    return -torch.minimum(unclipped, clipped), (clipped < unclipped)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(π ‖ π_ref) on tokens sampled from π: exp(Δ) − Δ − 1 with
    Δ = log π_ref − log π. Non-negative, and its gradient is unbiased for the reverse KL."""
    delta = ref_logp - logp
    return delta.exp() - delta - 1.0


def aggregate(values: Tensor, mask: Tensor, how: Literal["token_mean", "sequence_mean"], step_tokens: int,
              step_sequences: int) -> Tensor:
    """Sum of this micro batch's share of the step mean.

    token_mean: Σ values / tokens in the step. sequence_mean: Σ over sequences of their own token
    mean, / sequences in the step (each sequence counts once, whatever its length)."""
    masked = torch.where(mask, values, torch.zeros_like(values))
    if how == "token_mean":
        return masked.sum() / max(step_tokens, 1)
    per_sequence = masked.sum(-1) / mask.sum(-1).clamp(min=1)
    return per_sequence.sum() / max(step_sequences, 1)
