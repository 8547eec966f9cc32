"""Data parallelism over torch.distributed (gloo on CPU, nccl on GPU): ranks start from rank 0's
weights and sum their gradients, each rank having already divided its share by the whole step's
token (or sequence) count, so the sum is exactly the full-batch gradient."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def init(rank: int, world_size: int, init_method: str | None) -> None:
    if world_size == 1:
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)


def broadcast_parameters(model: nn.Module) -> None:
    if dist.is_initialized():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def sum_gradients(model: nn.Module) -> None:
    """One all-reduce over all gradients, flattened, rather than one per tensor."""
    if not dist.is_initialized():
        return
    for param in model.parameters():
        if param.requires_grad and param.grad is None:  # unused on this rank's data, maybe not on another's
            param.grad = torch.zeros_like(param)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def sum_scalars(values: list[float]) -> list[float]:
    """Per-rank partial sums of step statistics, added up across ranks."""
    if not dist.is_initialized():
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def gather_objects(value) -> list:
    """Every rank's `value`, in rank order (picklable; for per-rank dicts whose keys may differ)."""
    if not dist.is_initialized():
        return [value]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
