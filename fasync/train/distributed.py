"""The trainer ranks' process group and every collective they run (no other module calls torch.distributed).

On GPUs the group is `cpu:gloo,cuda:nccl`: NCCL carries CUDA tensors and gloo the CPU ones (pickled
objects), so a collective never meets a backend that has no kernel for its device. Tensors are still
reduced where they live: step statistics are built on the trainer's device, so NCCL moves them, and
every gradient bucket is made of the gradients themselves.

Two strategies (`train.strategy`):
- ddp: every rank holds the whole model and AdamW state; `sum_gradients` adds the ranks' gradients
  bucket by bucket. Each rank has already divided its share by the whole step's token (or sequence)
  count, so the sum is exactly the full-batch gradient.
- fsdp2: `torch.distributed.fsdp.fully_shard` per decoder layer and at the root, with fp32 master
  weights (and so fp32 AdamW state) sharded over the ranks, parameters cast to `model.dtype` for the
  forward and backward, and gradients reduce-scattered in fp32 as a sum (`shard`).
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
from torch import nn

from fasync.memory import GRADIENT_BUCKET_ELEMENTS


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on this machine now (for a rendezvous that this process or its peers will dial)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def backend_for(device: torch.device) -> str:
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def local_device(gpus: int) -> torch.device:
    """The rank's device: its first visible GPU (Ray shows an actor only its own; a launcher without Ray
    sets LOCAL_RANK), or the CPU."""
    if not gpus or not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def init(rank: int, world_size: int, init_method: str | None, device: torch.device, always: bool = False) -> None:
    """Join the trainer ranks' group. One rank needs none, unless `always` (FSDP2 shards over a group even
    of one)."""
    if dist.is_initialized() or (world_size == 1 and not always):
        return
    if init_method is None:
        init_method = f"tcp://127.0.0.1:{free_port()}"
    dist.init_process_group(backend_for(device), init_method=init_method, rank=rank, world_size=world_size,
                            device_id=device if device.type == "cuda" else None)


def broadcast_parameters(model: nn.Module) -> None:
    if dist.is_initialized():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def sum_gradients(model: nn.Module) -> None:
    """Add up the ranks' gradients (DDP), one flat bucket of at most GRADIENT_BUCKET_ELEMENTS at a time."""
    if not dist.is_initialized():
        return
    for param in model.parameters():
        if param.requires_grad and param.grad is None:  # unused on this rank's data, maybe not on another's
            param.grad = torch.zeros_like(param)
    bucket: list[torch.Tensor] = []
    size = 0
    for grad in [p.grad for p in model.parameters() if p.grad is not None]:
        if bucket and (size + grad.numel() > GRADIENT_BUCKET_ELEMENTS or grad.dtype != bucket[0].dtype):
            _sum_bucket(bucket)
            bucket, size = [], 0
        bucket.append(grad)
        size += grad.numel()
    if bucket:
        _sum_bucket(bucket)


def _sum_bucket(grads: list[torch.Tensor]) -> None:
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def sum_scalars(values: list[float], device: torch.device) -> list[float]:
    """Per-rank partial sums of step statistics, added up across ranks on `device` (the trainer's)."""
    if not dist.is_initialized():
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def gather_objects(value) -> list:
    """Every rank's `value`, in rank order (picklable; for per-rank dicts whose keys may differ)."""
    if not dist.is_initialized():
        return [value]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def shard(model: nn.Module, compute_dtype: torch.dtype, trainable: bool = True) -> None:
    """FSDP2 over all ranks: each decoder layer one unit, the rest (embeddings, final norm, output
    projection) the root's. A trainable model keeps fp32 master weights and reduces gradients in fp32,
    summed (the loss is already normalised over the whole step); a frozen one is kept in `compute_dtype`."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = (MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32) if trainable
              else MixedPrecisionPolicy())
    for layer in model.decoder_layers():
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    if trainable:
        for module in [*model.decoder_layers(), model]:
            # A plain SUM: gloo has no PREMUL_SUM, and NCCL sums exactly the same.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
