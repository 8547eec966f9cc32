"""How a weight sync is verified: the trainer and every engine take the same checksum of the weights, the
trainer of what it sent, the engine of what it serves after loading; the driver compares them
(`fasync.drivers.weight_sync.WeightSync.verify_loads`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

PROBED_PARAMETERS = 3
PROBED_ELEMENTS = 64
"""A weight checksum covers `PROBED_ELEMENTS` values spread evenly over each of `PROBED_PARAMETERS`
parameters: enough to tell a load that did not happen (or loaded something else) from one that did, at no
cost. Spread, not the ends: an embedding's first and last rows (special tokens) may never get a gradient."""


def probed_names(names: Iterable[str]) -> list[str]:
    """The parameters a weight checksum covers: the first, middle and last name in sorted order, chosen
    from the names the trainer sends, so that the trainer and every engine pick the same ones."""
    ordered = sorted(names)
    picks = {ordered[round(i * (len(ordered) - 1) / max(PROBED_PARAMETERS - 1, 1))]
             for i in range(PROBED_PARAMETERS)} if ordered else set()
    return sorted(picks)


def weights_checksum(tensors: dict) -> str:
    """A checksum of `tensors` (name → tensor, as `probed_names` chose them): of each, the `PROBED_ELEMENTS`
    values at evenly spaced positions of the flattened tensor (`torch.linspace(0, numel − 1, n)`, rounded
    down), as float32 bytes, so that equal values in the same dtype give equal checksums on any device."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(tensors):
        flat = tensors[name].detach().reshape(-1)
        positions = torch.linspace(0, flat.numel() - 1, PROBED_ELEMENTS, dtype=torch.float64).long()
        digest.update(name.encode())
        digest.update(flat[positions.to(flat.device)].to("cpu", torch.float32).numpy().tobytes())
    return digest.hexdigest()[:16]
