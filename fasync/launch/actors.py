"""Every Ray actor: the rollout engines, the trainer ranks and the fully_async rollouter.

The classes here are thin: the engine, the trainer and the rollouter are plain Python objects
(fasync.rollout.engine, fasync.train.trainer, fasync.rollout.rollouter) that also run without Ray.
What crosses between them is packed by `fasync.wire`, which the rollouter (run inside an actor
here) imports too."""

from __future__ import annotations

import os

import ray

from fasync import heap
from fasync.config.schema import FasyncConfig
from fasync.launch.plan import Resolved, ResourcePlan
from fasync.rollout.rollouter import Rollouter
from fasync.weights.checksum import probed_names, weights_checksum
from fasync.weights.sender import SentWeights
from fasync.wire import arrays_to_weights, pack, unpack, weights_to_arrays


def _limit_threads(threads: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


# `control` lets abort reach an engine while a generate call runs in the default group, and trainer rank 0 drive a
# GPU weight transfer meanwhile (the engine holds generation from the transfer's start to its finish): two
# threads, so that an abort is never queued behind a transfer that waits for the generate call to end.
@ray.remote(concurrency_groups={"control": 2})
class EngineActor:
    def __init__(self, cfg: FasyncConfig, index: int = 0, environment: dict[str, str] | None = None,
                 memory_fraction: float | None = None):
        """`environment`: set before the engine is built (where vLLM's Ray executor places a tensor-parallel
        engine's workers: `fasync.launch.plan.Slot.worker_environment`). `memory_fraction`: the plan's share
        of each GPU for a vLLM engine (`ResourcePlan.engine_memory_fraction`)."""
        os.environ.update(environment or {})
        _limit_threads(cfg.resources.rollout_threads)
        from fasync.rollout.build import build_engine

        # Each engine its own sampling stream: identical seeds would make every engine's groups identical.
        self.engine = build_engine(cfg, seed=cfg.train.seed + 1 + index, memory_fraction=memory_fraction)

    def generate(self, requests: bytes, params, token_budget: int | None = None) -> bytes:
        """`pack`ed requests in, `pack`ed generations out."""
        return pack(self.engine.generate(unpack(requests), params, token_budget))

    def settle_heap(self) -> None:
        heap.settle()

    # `submit` in `control` too: it reaches a streaming engine while `take_ended` waits in the default group.
    @ray.method(concurrency_group="control")
    def submit(self, requests: bytes, params) -> None:
        self.engine.submit(unpack(requests), params)

    def take_ended(self) -> bytes:
        """`pack`ed: the submitted requests that ended since the last call (`RolloutEngine.take_ended`)."""
        return pack(self.engine.take_ended())

    def load_weights(self, weights, version: int) -> tuple[int, str]:
        """`weights` as `TrainerActor.rollout_weights` returns them; returns what the engine serves after the
        load (`RolloutEngine.served_weights`), which the driver checks against the trainer's checksum."""
        return self._serve(self._tensors_to_load(weights, version), version)

    # In `control`: the requests stay in the engine, so a `take_ended` waits in the default group meanwhile.
    @ray.method(concurrency_group="control")
    def load_weights_keeping_requests(self, weights, version: int) -> tuple[tuple[int, str], list[int]]:
        """`load_weights` into a streaming engine paused with its requests in it (`async.pause_mode: keep`);
        also returns the ids of the requests the load interrupted part-way through."""
        # The copy into tensors happens before the pause, while the stream still generates.
        tensors = self._tensors_to_load(weights, version)
        return self.engine.load_weights_keeping_requests(lambda: self._serve(tensors, version))

    def _tensors_to_load(self, weights, version: int) -> dict | None:
        """None on the `ipc` and `nccl` transports: the trainer ranks have already sent `version` through vLLM's
        weight transfer, and `weights` is rank 0's `SentWeights`, so there is nothing left to load."""
        if isinstance(weights, SentWeights):
            if weights.version != version:
                raise RuntimeError(f"asked to serve version {version}, but the trainer sent version {weights.version}")
            return None
        return arrays_to_weights(weights)

    def _serve(self, tensors: dict | None, version: int) -> tuple[int, str]:
        if tensors is not None:
            self.engine.load_weights(tensors, version)
        return self.engine.served_weights()

    def rng_state(self):
        """Runs after any generate call in progress (one call at a time), so the state is between calls."""
        return self.engine.rng_state()

    def set_rng_state(self, state) -> None:
        self.engine.set_rng_state(state)

    @ray.method(concurrency_group="control")
    def abort(self) -> None:
        self.engine.abort()

    # Colocated sync runs: the GPU memory goes to training between generation and the next weight push.

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.engine.wake_up(tags)

    # The `ipc` and `nccl` transports: `fasync.weights.sender.EngineClient`, run by trainer rank 0's
    # vLLM transfer engine, drives the vLLM engine through these.

    @ray.method(concurrency_group="control")
    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.engine.init_weight_transfer_engine(init_info)

    @ray.method(concurrency_group="control")
    def start_weight_update(self) -> None:
        self.engine.start_weight_update()

    @ray.method(concurrency_group="control")
    def update_weights(self, update_info) -> None:
        self.engine.update_weights(update_info)

    @ray.method(concurrency_group="control")
    def finish_weight_update(self, version: int) -> tuple[int, str | None]:
        return self.engine.finish_weight_update(version)


# It only waits on the engines and the trainer, so it asks for no CPU of its own.
RolloutActor = ray.remote(num_cpus=0)(Rollouter)
"""fully_async's rollouter, which owns the queue and the sample ledger."""


@ray.remote
class TrainerActor:
    """Started in two steps: the actors first, so that rank 0's node (and a free port on it) is known; then
    `setup` with that rendezvous address on every rank."""

    def __init__(self, resolved: Resolved, rank: int, world_size: int):
        _limit_threads(resolved.config.resources.train_threads)
        self.resolved, self.rank, self.world_size = resolved, rank, world_size
        self.trainer = None
        self.sent_checksum = ""
        """`weights_checksum` of the weights the last `rollout_weights` sent (rank 0)."""
        self.sender = None
        """The `ipc` and `nccl` transports' `TrainerSender`, once `init_weight_sync` has run."""

    def rendezvous(self) -> str:
        from fasync.launch.placement import rendezvous_address
        from fasync.train.distributed import free_port

        return rendezvous_address(free_port("0.0.0.0"))

    def setup(self, init_method: str | None) -> None:
        from fasync.train.trainer import Trainer

        self.trainer = Trainer(self.resolved, rank=self.rank, world_size=self.world_size, init_method=init_method)

    def train_rollout(self, samples: bytes, current_version: int):
        return self.trainer.train_rollout(unpack(samples), current_version)

    def settle_heap(self) -> None:
        heap.settle()

    def rollout_state_dict(self):
        return self.trainer.rollout_state_dict()

    def rollout_weights(self) -> dict | None:
        """The rollout state dict as the engines load it (`weights_to_arrays`), from rank 0; the other ranks
        only take part in gathering it (under FSDP2 each tensor is a collective) and return None."""
        if self.trainer.rank == 0:
            state = self.trainer.rollout_state_dict()
            self.sent_checksum = weights_checksum({name: state[name] for name in probed_names(state)})
            return weights_to_arrays(state)
        for _ in self.trainer.weight_buckets():
            pass
        return None

    def last_sent_checksum(self) -> str:
        return self.sent_checksum

    def weight_sync_endpoint(self) -> tuple[str, int]:
        """Rank 0's node IP and a port free there, where the NCCL weight sync group meets (rank 0 hosts it)."""
        from fasync.train.distributed import free_port

        return ray.util.get_node_ip_address(), free_port("0.0.0.0")

    def init_weight_sync(self, transport: str, engines: list, rank_offsets: list[int] | None = None,
                         world_size: int | None = None, endpoint: tuple[str, int] | None = None) -> None:
        """Join the `ipc` or `nccl` weight transfer (`fasync.weights.sender.TrainerSender`); rank 0
        also sets it up on the engines."""
        from fasync.weights.buckets import DEFAULT_BUCKET_BYTES
        from fasync.weights.sender import BucketSource, EngineClient, TrainerSender

        source = BucketSource.of_model(self.trainer.engine_weights, self.trainer.compute_dtype, DEFAULT_BUCKET_BYTES)
        address, port = endpoint or (None, None)
        self.sender = TrainerSender(transport, source, EngineClient(engines, rank_offsets), self.rank,
                                    DEFAULT_BUCKET_BYTES, address, port, world_size)

    def send_weights(self, version: int) -> SentWeights | None:
        """Send the weights as `version` (every rank takes part); rank 0 returns what each engine serves after it."""
        sent = self.sender.send(version)
        return sent if self.rank == 0 else None

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        from fasync.checkpoint.state import save_trainer

        save_trainer(self.trainer, checkpoint_dir)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        from fasync.checkpoint.state import load_trainer

        load_trainer(self.trainer, checkpoint_dir)


class TrainerGroup:
    """All data-parallel ranks, driven as one: every rank gets the same rollout and takes its shard."""

    def __init__(self, resolved: Resolved, placement=None, wait=None):
        self.wait = wait or (lambda refs, labels: ray.get(list(refs)))
        """`Watchdog.get`: (refs, labels) → results, failing with the label of a rank that died or hung."""
        world = resolved.config.resources.trainer_ranks
        self.ranks = [
            TrainerActor.options(**_placed(resolved.plan.trainer_options(rank), placement)).remote(resolved, rank,
                                                                                                  world)
            for rank in range(world)
        ]
        # Rank 0's node IP, never loopback: ranks on other nodes dial it.
        init_method = ray.get(self.ranks[0].rendezvous.remote()) if world > 1 else None
        ray.get([rank.setup.remote(init_method) for rank in self.ranks])

    def train_rollout(self, samples, current_version: int) -> list[dict]:
        """`samples`: a list, or a reference to the list `pack`ed (a fully_async drain, which the rollouter
        returned as its own object: each rank's call fetches it, and the driver never reads it)."""
        if isinstance(samples, ray.ObjectRef):
            return self._on_every_rank("train_rollout", "train call", samples, current_version)[0]
        payload = pack(samples)
        # One rank takes the bytes inline with the call; through the object store the same call costs
        # about 4 ms more. Several ranks share one stored copy instead of one copy per call.
        if len(self.ranks) > 1:
            payload = ray.put(payload)
        return self._on_every_rank("train_rollout", "train call", payload, current_version)[0]

    def _on_every_rank(self, method: str, what: str, *args) -> list:
        """Call `method` on every rank and wait, a rank that dies or hangs named as `trainer rank k's {what}`."""
        return self.wait([getattr(rank, method).remote(*args) for rank in self.ranks],
                         [f"trainer rank {index}'s {what}" for index in range(len(self.ranks))])

    def state_dict_ref(self):
        # Every rank takes part (FSDP2 gathers each tensor from all shards); rank 0's copy is the one sent.
        return [rank.rollout_weights.remote() for rank in self.ranks][0]

    def sent_checksum_ref(self):
        """The checksum of the weights the last `state_dict_ref` sends (rank 0 runs its calls in order)."""
        return self.ranks[0].last_sent_checksum.remote()

    def init_weight_sync(self, transport: str, engines: list, plan: ResourcePlan) -> list:
        """Start setting up the `ipc` or `nccl` weight transfer on every rank (and, from rank 0, on the
        engines); returns the calls, for the caller to wait on. NCCL meets at rank 0's node, in a group of
        rank 0 and every engine worker (`fasync.weights.sender.nccl_ranks`)."""
        from fasync.weights.sender import nccl_ranks

        args = ()
        if transport == "nccl":
            world_size, offsets = nccl_ranks(plan.engine_workers())
            args = (offsets, world_size, ray.get(self.ranks[0].weight_sync_endpoint.remote()))
        return [rank.init_weight_sync.remote(transport, engines, *args) for rank in self.ranks]

    def send_weights(self, version: int) -> list:
        """Every rank's call sending the weights as `version`; rank 0's returns what each engine serves."""
        return [rank.send_weights.remote(version) for rank in self.ranks]

    def save_checkpoint(self, checkpoint_dir) -> None:
        """Every rank writes its part of the checkpoint (`fasync.checkpoint.state.save_trainer`)."""
        self._on_every_rank("save_checkpoint", "checkpoint save", str(checkpoint_dir))

    def load_checkpoint(self, checkpoint_dir) -> None:
        self._on_every_rank("load_checkpoint", "checkpoint load", str(checkpoint_dir))

    def kill(self) -> None:
        for rank in self.ranks:
            ray.kill(rank)


def _placed(options: dict, placement) -> dict:
    return placement.options(options) if placement is not None else {k: v for k, v in options.items() if k != "slot"}


def start_engines(cfg: FasyncConfig, plan: ResourcePlan, placement=None) -> list:
    engines = []
    for index in range(cfg.resources.num_rollout_engines):
        options = plan.engine_options(index)
        environment = options["slot"].worker_environment() if "slot" in options else {}
        engines.append(EngineActor.options(**_placed(options, placement)).remote(cfg, index, environment,
                                                                                 plan.engine_memory_fraction))
    return engines


def push_weights(engines: list, state_ref, version: int) -> list:
    return [engine.load_weights.remote(state_ref, version) for engine in engines]
