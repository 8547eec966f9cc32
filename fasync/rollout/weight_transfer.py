"""How the trainer's weights reach a vLLM engine: one interface, a transport per placement.

- `cpu` (vLLM's CPU build): the weights cross to the engine actor as arrays (`fasync.launch.wire`), then
  into vLLM's worker as one safetensors blob through `collective_rpc`, whose arguments vLLM serializes
  with msgpack (a tensor would arrive as a plain list, bytes arrive as bytes). The worker reloads them
  with its model runner's `reload_weights`, which also redoes the CPU build's repacking of linear
  weights after loading (the model's own `load_weights` cannot load into repacked parameters).
- `ipc` (colocated on one GPU) and `nccl` (engines on GPUs of their own): vLLM's weight transfer
  engines (`weight_transfer_config` on the engine, `init_weight_transfer_engine` / `start_weight_update`
  / `update_weights` / `finish_weight_update` on its workers). The trainer ranks send from the device,
  one bucket at a time (`fasync.train.weights`): no full host copy per engine.

Every transport loads the same thing: the trainer's rollout weights under their Hugging Face names
(`hf_names`), in the engine's dtype.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal

Transport = Literal["cpu", "ipc", "nccl"]


def transport_for(gpus_per_engine: int, colocate: bool) -> Transport:
    """The transport a placement uses: CPU engines take blobs, a colocated GPU engine CUDA IPC handles
    (trainer and engine share the device), a GPU engine of its own an NCCL broadcast."""
    if gpus_per_engine == 0:
        return "cpu"
    return "ipc" if colocate else "nccl"


def hf_names(named: Iterable[tuple[str, object]]) -> Iterator[tuple[str, object]]:
    """The trainer's parameter names as the Hugging Face checkpoint (and so vLLM's loader) spells them:
    without the prefix of fasync's wrapper (`fasync.model.hf.HFCausalLM`)."""
    from fasync.model.hf import WRAPPER_PREFIX

    for name, tensor in named:
        yield name.removeprefix(WRAPPER_PREFIX), tensor


def to_blob(named: Iterable[tuple[str, object]]) -> bytes:
    """One safetensors blob of the named CPU tensors, under their Hugging Face names."""
    from safetensors.torch import save

    return save({name: tensor.detach().contiguous() for name, tensor in hf_names(named)})


def from_blob(blob: bytes) -> dict:
    from safetensors.torch import load

    return load(blob)


class WorkerWeights:
    """Mixed into every vLLM worker (`worker_extension_cls`): what the `cpu` transport calls there."""

    def fasync_load_blob(self, blob: bytes) -> int:
        """Reload the model from a `to_blob` blob; returns the number of tensors loaded."""
        weights = from_blob(blob)
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()))
        return len(weights)


class BucketSource:
    """The trainer's weights as vLLM's weight transfer engines read them (a `WeightSource`: `metadata()`
    without transferring, then the same tensors in the same order on iteration), gathered bucket by
    bucket from `buckets()` (a fresh `fasync.train.weights.weight_buckets` pass each time) and named as
    the Hugging Face checkpoint.

    Kept free of vLLM so that its contract is tested without it; `vllm_source` wraps it in vLLM's class."""

    def __init__(self, buckets, meta: list[tuple[str, object, tuple[int, ...]]]):
        self._buckets = buckets
        self._meta = meta

    @classmethod
    def of_model(cls, model, dtype, bucket_bytes: int) -> "BucketSource":
        """Every parameter of `model` in `dtype`; the metadata is read from the local shapes (an FSDP2
        `DTensor` reports its global shape), so it costs no gather."""
        from fasync.train.weights import weight_buckets

        meta = [(name, dtype, tuple(value.shape)) for name, value in hf_names(model.state_dict().items())]
        return cls(lambda: weight_buckets(model, dtype, bucket_bytes), meta)

    def metadata(self) -> list[tuple[str, object, tuple[int, ...]]]:
        return list(self._meta)

    def __iter__(self) -> Iterator[tuple[str, object]]:
        for bucket in self._buckets():
            yield from hf_names(bucket)


def vllm_source(source: BucketSource):
    """`source` as vLLM's `WeightSource`."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class Source(WeightSource):
        def metadata(self):
            return [ParamMeta(name, dtype, shape) for name, dtype, shape in source.metadata()]

        def __iter__(self):
            return iter(source)

    return Source()


class TrainerSender:
    """The trainer ranks' side of the `ipc` and `nccl` transports: every rank builds one (a gather is a
    collective) and calls `send` at each sync; rank 0 drives the engines through `client` (vLLM's
    `RayVLLMWeightSyncClient` over the engine actors, which forward to their workers) and the others only
    take part in the gathers."""

    def __init__(self, transport: Transport, source: BucketSource, client, rank: int,
                 master_address: str | None = None, master_port: int | None = None, engine_workers: int = 0):
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        if transport == "ipc":
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            init = IPCTrainerInitInfo(rank=rank)
        elif transport == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            # The sender is NCCL rank 0, the engines' workers the ranks after it.
            init = NCCLTrainerInitInfo(rank=rank, master_address=master_address, master_port=master_port,
                                       world_size=1 + engine_workers)
        else:
            raise ValueError(f"the {transport} transport has no trainer-side sender")
        self.engine = WeightTransferTrainerFactory.trainer_init(init, client=client, source=vllm_source(source))

    def send(self) -> None:
        self.engine.send_weights()
