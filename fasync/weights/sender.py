"""The `ipc` and `nccl` transports: vLLM's weight transfer engines (`weight_transfer_config` on the engine;
`trainer_init` / `send_weights` on the trainer ranks, which drive `init_weight_transfer_engine` /
`start_weight_update` / `update_weights` / `finish_weight_update` on the engines through `EngineClient`).
The trainer ranks send from the device, packed into buffers of `bucket_bytes` (`fasync.weights.buckets`): no
host copy. One NCCL group holds the sending trainer rank 0 and every worker of every engine (`nccl_ranks`), so
one broadcast reaches them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from fasync.weights.cpu import hf_names
from fasync.weights.transport import Transport


def nccl_ranks(workers_per_engine: list[int]) -> tuple[int, list[int]]:
    """(world size, each engine's first rank) of the NCCL group a weight sync broadcasts over: the sending
    trainer rank is rank 0, then every engine's workers (its tensor-parallel size of them) in engine order.

    vLLM ranks a worker `rank_offset` + its rank within its engine; each fasync engine is a separate vLLM
    instance whose workers count from 0, so each gets its own offset (vLLM's own Ray client would send them
    all the same one, and engines after the first would collide)."""
    offsets, rank = [], 1
    for workers in workers_per_engine:
        offsets.append(rank)
        rank += workers
    return rank, offsets


@dataclass(frozen=True)
class SentWeights:
    """What trainer rank 0's send of `version` returns (`ipc`, `nccl`): the engines already serve it, and
    `served` is what each one reported. fully_async's rollouter hands it to every engine's `load_weights` in
    place of a state dict, which then only reports what the engine serves."""

    version: int
    served: list


class EngineClient:
    """vLLM's weight sync client protocol (`VLLMWeightSyncClient`) over fasync's engine actors
    (`fasync.launch.actors.EngineActor`), driven by trainer rank 0's transfer engine: each call fans out to
    every engine and waits for all. The NCCL handshake gives each engine its own `rank_offsets` entry.
    `finish_weight_update` makes the engines serve `version` (set before each send) in the same call that
    ends the update, so that no generation sees the new weights under the old version; what they serve
    after it is kept in `served`, for the driver's check."""

    def __init__(self, engines: list, rank_offsets: list[int] | None = None, wait=None):
        if wait is None:
            import ray

            wait = ray.get
        self.engines = engines
        self.rank_offsets = rank_offsets
        self.wait = wait
        self.version: int | None = None
        self.served: list = []

    def _each(self, method: str, *args) -> list:
        return self.wait([getattr(engine, method).remote(*args) for engine in self.engines])

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        if "rank_offset" not in init_info or self.rank_offsets is None:
            self._each("init_weight_transfer_engine", init_info)
            return
        self.wait([engine.init_weight_transfer_engine.remote({**init_info, "rank_offset": offset})
                   for engine, offset in zip(self.engines, self.rank_offsets)])

    def start_weight_update(self) -> None:
        self._each("start_weight_update")

    def update_weights(self, update_info) -> None:
        self._each("update_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = self.version if weight_version is None else int(weight_version)
        self.served = self._each("finish_weight_update", version)


class BucketSource:
    """The trainer's weights as vLLM's weight transfer engines read them (a `WeightSource`: `metadata()`
    without transferring, then the same tensors in the same order on iteration), gathered bucket by
    bucket from `buckets()` (a fresh `fasync.weights.buckets.weight_buckets` pass each time) and named as
    the Hugging Face checkpoint.

    Kept free of vLLM so that its contract is tested without it; `vllm_source` wraps it in vLLM's class."""

    def __init__(self, buckets, meta: list[tuple[str, object, tuple[int, ...]]]):
        self._buckets = buckets
        self._meta = meta

    @classmethod
    def of_model(cls, model, dtype, bucket_bytes: int) -> "BucketSource":
        """Every parameter of `model` in `dtype`; the metadata is read from the local shapes (an FSDP2
        `DTensor` reports its global shape), so it costs no gather."""
        from fasync.weights.buckets import weight_buckets

        meta = [(name, dtype, tuple(value.shape)) for name, value in hf_names(model.state_dict().items())]
        return cls(lambda: weight_buckets(model, dtype, bucket_bytes), meta)

    def metadata(self) -> list[tuple[str, object, tuple[int, ...]]]:
        return list(self._meta)

    def __iter__(self) -> Iterator[tuple[str, object]]:
        for bucket in self._buckets():
            yield from hf_names(bucket)
            # Dropped before the next bucket is gathered: held across it, a sync would hold two buckets.
            del bucket


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
    collective) and calls `send` at each sync; rank 0 drives the engines through `client` (an
    `EngineClient`) and the others only take part in the gathers (and, for `ipc`, the handle exchange).

    Both backends are packed: tensors travel in buffers of `bucket_bytes`, so that the sender never holds
    more than a few buckets beside the model (vLLM's unpacked IPC would keep a copy of every tensor alive
    until the engines finish). `nccl` needs the rendezvous on rank 0's node (`master_address`,
    `master_port`) and the group's `world_size` (`nccl_ranks`)."""

    def __init__(self, transport: Transport, source: BucketSource, client: EngineClient, rank: int,
                 bucket_bytes: int, master_address: str | None = None, master_port: int | None = None,
                 world_size: int | None = None):
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        self.client = client
        if transport == "ipc":
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            init = IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=bucket_bytes)
        elif transport == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            init = NCCLTrainerInitInfo(rank=rank, master_address=master_address, master_port=master_port,
                                       world_size=world_size, packed=True, packed_buffer_size_bytes=bucket_bytes)
        else:
            raise ValueError(f"the {transport} transport has no trainer-side sender")
        self.engine = WeightTransferTrainerFactory.trainer_init(init, client=client, source=vllm_source(source))

    def send(self, version: int) -> SentWeights:
        """Send the weights as `version`; on rank 0 the result says what every engine serves after it."""
        self.client.version = version
        self.client.served = []
        self.engine.send_weights()
        return SentWeights(version, self.client.served)
