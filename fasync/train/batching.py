"""From a rollout's samples to optimizer steps and micro batches (padded rows, or packed ones).

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
from fasync.model.scoring import ScoreRequest
from fasync.rollout.types import Sample


@dataclass
class MicroBatch:
    """The model's input, and every per-token quantity of the loss in a layout of its own: one row per
    sequence, its completion tokens from column 0 ([S, L], L the longest completion). The scores of the
    forward pass come back straight into that layout (`scored`), so correction and loss never see
    prompts, padding or packing."""

    input_ids: Tensor
    """[R, W] rows of prompt + completion, one or several sequences after another, right-padded."""
    position_ids: Tensor
    """[R, W] counting from 0 in each sequence; each padding token is a sequence of its own (position 0)."""
    score_positions: Tensor
    """[N] where, in the flattened rows, the logits that predict each completion token sit."""
    score_targets: Tensor
    """[N] the completion tokens."""
    score_slots: Tensor
    """[N] where each of them goes in the flattened [S, L] layout."""
    completion_mask: Tensor
    """[S, L] bool: the entries that hold a completion token the loss trains on (a multi-turn trajectory's
    observation tokens are scored with the rest, and masked out here)."""
    behaviour_logprobs: Tensor
    """[S, L] the rollout engine's logprobs (0 outside the mask)."""
    advantages: Tensor
    """[S]"""
    anchor_logp: Tensor | None = None
    """[S, L] the PPO ratio's anchor when the trainer computes it ahead of the step."""

    def to(self, device) -> MicroBatch:
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None:
                setattr(self, field.name, value.to(device))
        return self

    def request(self, temperature: float, entropy_grad: bool = False) -> ScoreRequest:
        return ScoreRequest(self.score_positions, self.score_targets, temperature, entropy_grad)

    def scored(self, values: Tensor) -> Tensor:
        """Per-token values [N] (in request order) placed into the [S, L] layout, 0 elsewhere; differentiable."""
        flat = values.new_zeros(self.completion_mask.numel())
        return flat.index_put((self.score_slots,), values).view(self.completion_mask.shape)

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask.sum())


def collate(samples: list[Sample], pad_id: int, packed: bool = False) -> MicroBatch:
    """`samples` one per row, or with `packed` all in one row, position ids restarting at each.

    An empty list gives one row of a single padding token with no completion token: a rank whose share
    of a step has fewer micro batches than another's runs it, so that the ranks' forwards (and FSDP2's
    collectives in them) stay paired; it contributes nothing to the loss."""
    rows = [samples] if packed or not samples else [[sample] for sample in samples]
    width = max([sum(len(s.prompt_ids) + len(s.output_ids) for s in row) for row in rows] + [1])
    longest = max([len(s.output_ids) for s in samples] + [1])
    # Gathered as flat lists and written with one indexed assignment per tensor: a few small tensor
    # operations per sample would cost more than the rest of the collation.
    token_places, tokens, token_positions = [], [], []
    positions, targets, slots, trained, behaviour_logprobs = [], [], [], [], []
    sequence = 0
    for row, row_samples in enumerate(rows):
        offset = row * width
        for sample in row_samples:
            sequence_tokens = sample.prompt_ids + sample.output_ids
            token_places.extend(range(offset, offset + len(sequence_tokens)))
            tokens.extend(sequence_tokens)
            token_positions.extend(range(len(sequence_tokens)))
            completion = len(sample.output_ids)
            first = offset + len(sample.prompt_ids) - 1
            positions.extend(range(first, first + completion))
            targets.extend(sample.output_ids)
            slots.extend(range(sequence * longest, sequence * longest + completion))
            trained.extend(sample.trained)
            behaviour_logprobs.extend(sample.behaviour_logprobs)
            offset += len(sequence_tokens)
            sequence += 1
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros(len(rows), width, dtype=torch.long)
    completion_mask = torch.zeros(max(len(samples), 1), longest, dtype=torch.bool)
    behaviour = torch.zeros(completion_mask.shape)
    places = torch.tensor(token_places, dtype=torch.long)
    input_ids.view(-1)[places] = torch.tensor(tokens, dtype=torch.long)
    position_ids.view(-1)[places] = torch.tensor(token_positions, dtype=torch.long)
    completion_slots = torch.tensor(slots, dtype=torch.long)
    completion_mask.view(-1)[completion_slots] = torch.tensor(trained, dtype=torch.bool)
    behaviour.view(-1)[completion_slots] = torch.tensor(behaviour_logprobs, dtype=torch.float32)
    if not positions:
        # Score one padding entry, masked out, so that even an empty micro batch has a graph to run backward on.
        positions, targets, slots = [0], [pad_id], [0]
    return MicroBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        score_positions=torch.tensor(positions, dtype=torch.long),
        score_targets=torch.tensor(targets, dtype=torch.long),
        score_slots=torch.tensor(slots, dtype=torch.long),
        completion_mask=completion_mask,
        behaviour_logprobs=behaviour,
        advantages=torch.tensor([s.advantage for s in samples] or [0.0], dtype=torch.float32),
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
                       micro_batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """This rank's share of a step, cut into micro batches of samples of similar `lengths`.

    The step's samples are ordered by length before they are dealt to the ranks (every world_size-th),
    so that a micro batch pads only to its own longest sample, not the step's, and the ranks get alike
    shares. With `max_tokens`, a micro batch is instead as many samples as fit in that many tokens
    (first fit, longest first; a longer sample goes alone), packed into one row. Every rank's list is
    as long as the longest rank's, padded with empty micro batches, so that all ranks run as many
    forward passes. The order changes nothing else: every loss term is normalised over the whole step."""
    ordered = sorted(step, key=lambda i: lengths[i])
    shares = [_cut(ordered[r::world_size], lengths, micro_batch_size, max_tokens) for r in range(world_size)]
    longest = max(len(share) for share in shares)
    return shares[rank] + [[] for _ in range(longest - len(shares[rank]))]


def _cut(share: list[int], lengths: Sequence[int], micro_batch_size: int, max_tokens: int | None) -> list[list[int]]:
    if max_tokens is None:
        return [share[i:i + micro_batch_size] for i in range(0, len(share), micro_batch_size)]
    bins: list[list[int]] = []
    room: list[int] = []
    for index in sorted(share, key=lambda i: -lengths[i]):
        fits = next((b for b, free in enumerate(room) if lengths[index] <= free), None)
        if fits is None:
            bins.append([index])
            room.append(max_tokens - lengths[index])
        else:
            bins[fits].append(index)
            room[fits] -= lengths[index]
    return bins
