"""The trainer's weights for the rollout engines, gathered out of any sharding one bucket at a time.

This is where the trainer meets the weight transfer (`fasync.weights.sender`): `weight_buckets` yields lists of
(name, tensor) whose tensors are whole (an FSDP2 shard gathered from every rank), in the engines'
dtype, on the trainer's device, and together at most `bucket_bytes` (a single larger tensor goes
alone). Every rank must iterate it, since each gather is a collective; rank 0 sends what it yields and
the others drop it. A bucket is freed before the next is gathered, so no rank holds a second full
copy of the model, on the device or the host.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

DEFAULT_BUCKET_BYTES = 512 << 20
"""Per bucket: large enough that a sync is a few dozen transfers for a 7B model, small next to its memory."""


def full_value(value):
    """A sharded (DTensor) value gathered whole on every rank; other tensors as they are."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def weight_buckets(model: nn.Module, dtype: torch.dtype,
                   bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[list[tuple[str, Tensor]]]:
    """`model`'s `state_dict()` in buckets; `model` may be anything with one (under LoRA, the trainer passes
    `fasync.model.lora.EngineWeights`, the merged weights)."""
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, value in model.state_dict().items():
        tensor = full_value(value).detach().to(dtype)
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
