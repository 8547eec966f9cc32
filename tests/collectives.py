"""A fake-NCCL device check for torch.distributed on CPU: while installed, a collective whose tensor sits
on another device than the one the group serves raises, as NCCL does for a CPU tensor ("No backend type
associated with device type cpu"). gloo alone would accept any CPU tensor and hide that bug."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "reduce", "gather", "scatter", "all_to_all_single")


class WrongDevice(RuntimeError):
    pass


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


@contextlib.contextmanager
def only_on(device: torch.device):
    """Every torch.distributed collective called inside must take tensors on `device` only."""
    originals = {name: getattr(dist, name) for name in COLLECTIVES}

    def checked(name):
        def call(*args, **kwargs):
            for tensor in _tensors(list(args) + list(kwargs.values())):
                if tensor.device != device:
                    raise WrongDevice(f"dist.{name} got a tensor on {tensor.device}; the group serves {device}")
            return originals[name](*args, **kwargs)
        return call

    for name in COLLECTIVES:
        setattr(dist, name, checked(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
