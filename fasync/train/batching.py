"""From a rollout's samples to optimizer steps and padded micro batches.

The arithmetic follows `fasync.config.derived`: `num_steps_per_rollout` steps of
`effective_global_batch_size` samples each; what does not fill a whole step is trimmed
(after advantages were computed over the full groups, so trimming never changes a
baseline). A short rollout (dynamic sampling that ran out of rounds) becomes one smaller step
rather than none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from fasync.config.derived import Derived
from fasync.rollout.types import Sample


@dataclass
class MicroBatch:
    input_ids: Tensor
    """[B, T] prompt + completion, right-padded."""
    attention_mask: Tensor
    position_ids: Tensor
    completion_mask: Tensor
    """[B, T-1] bool: entry t scores input_ids[:, t + 1] and is a completion token."""
    behaviour_logprobs: Tensor
    """[B, T-1] the rollout engine's logprobs, aligned with `completion_mask` (0 elsewhere)."""
    advantages: Tensor
    """[B]"""
    anchor_logp: Tensor | None = None
    """[B, T-1] the PPO ratio's anchor when the trainer computes it ahead of the step."""

    def to(self, device) -> MicroBatch:
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None:
                setattr(self, field.name, value.to(device))
        return self


def collate(samples: list[Sample], pad_id: int) -> MicroBatch:
    lengths = [len(s.prompt_ids) + len(s.output_ids) for s in samples]
    width = max(lengths)
    batch = len(samples)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(batch, width, dtype=torch.long)
    completion_mask = torch.zeros(batch, width - 1, dtype=torch.bool)
    behaviour = torch.zeros(batch, width - 1)
    for row, (sample, length) in enumerate(zip(samples, lengths)):
        prompt = len(sample.prompt_ids)
        input_ids[row, :length] = torch.tensor(sample.prompt_ids + sample.output_ids, dtype=torch.long)
        attention_mask[row, :length] = 1
        completion_mask[row, prompt - 1:length - 1] = True
        behaviour[row, prompt - 1:length - 1] = torch.tensor(sample.behaviour_logprobs, dtype=torch.float32)
    position_ids = torch.arange(width).expand(batch, width).contiguous()
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        completion_mask=completion_mask,
        behaviour_logprobs=behaviour,
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
    )


def plan_steps(num_samples: int, derived: Derived, dynamic_global_batch: bool) -> tuple[list[range], int]:
    """Which samples each optimizer step takes, and how many are trimmed."""
    size = derived.effective_global_batch_size
    if dynamic_global_batch or num_samples < size:
        # The dynamic global batch absorbs every sample; a short rollout is one smaller step.
        return ([range(num_samples)] if num_samples else []), 0
    steps = min(derived.num_steps_per_rollout, num_samples // size)
    return [range(i * size, (i + 1) * size) for i in range(steps)], num_samples - steps * size


def rank_micro_batches(step: range, lengths: Sequence[int], rank: int, world_size: int,
                       micro_batch_size: int) -> list[list[int]]:
    """This rank's share of a step, cut into micro batches of samples of similar `lengths`.

    The step's samples are ordered by length before they are dealt to the ranks (every world_size-th),
    so that a micro batch pads only to its own longest sample, not the step's, and the ranks get alike
    shares. The order changes nothing else: every loss term is normalised over the whole step."""
    share = sorted(step, key=lambda i: lengths[i])[rank::world_size]
    return [share[i:i + micro_batch_size] for i in range(0, len(share), micro_batch_size)]
