"""fasync's side of vLLM's GPU weight transfer, held against vLLM's real classes (the CPU build's install has
them all; no GPU and no engine needed): the engine's calls into `LLM`'s weight transfer and sleep methods and on
to its workers' methods, the lock that keeps generation away from half-loaded weights, the NCCL handshake's
payload as vLLM's worker parses it, and the bucketed source as vLLM's trainer engine reads it. The transfers
themselves (CUDA IPC, NCCL) need GPUs: tests/gpu/test_vllm_gpu.py and docs/gpu.md."""

import inspect
import os
import threading
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch
from tiny_models import write_vllm_llama

from fasync.rollout.engine import Continuation, RolloutEngine
from fasync.rollout.types import Generation, SamplingParams
from fasync.weights.sender import (
    BucketSource,
    EngineClient,
    SentWeights,
    TrainerSender,
    nccl_ranks,
    vllm_source,
)

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


class RecordingEngineCore:
    """Where `LLM`'s methods end: `llm_engine`, its calls recorded."""

    def __init__(self):
        self.calls = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append((method, kwargs or {}))
        return [None]

    def reset_prefix_cache(self, *args):
        self.calls.append(("reset_prefix_cache", {}))
        return True

    def sleep(self, level=1, mode="abort"):
        self.calls.append(("sleep", {"level": level}))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", {"tags": tags}))
        return True


def vllm_engine(transport: str):
    """A `VLLMEngine` around vLLM's real `LLM` class whose engine core records what reaches it."""
    from vllm import LLM

    from fasync.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine.__new__(VLLMEngine)
    RolloutEngine.__init__(engine)
    engine.transport = transport
    engine.keeps_kv = False  # `async.pause_mode: abort`, the default: a load recomputes the requests in flight
    engine.llm = LLM.__new__(LLM)
    engine.llm.llm_engine = RecordingEngineCore()
    return engine


def test_the_weight_transfer_calls_reach_the_workers_methods_with_their_arguments():
    from vllm.v1.worker.gpu_worker import Worker

    engine = vllm_engine("nccl")
    engine.init_weight_transfer_engine({"rank_offset": 3})
    engine.start_weight_update()
    engine.update_weights({"names": ["w"]})
    assert engine.finish_weight_update(4) == (4, None)
    calls = engine.llm.llm_engine.calls
    assert calls == [("init_weight_transfer_engine", {"init_info": {"rank_offset": 3}}),
                     ("start_weight_update", {}), ("update_weights", {"update_info": {"names": ["w"]}}),
                     ("finish_weight_update", {}), ("reset_prefix_cache", {})]
    for method, kwargs in calls:
        if method != "reset_prefix_cache":  # the engine core's own, not a worker's
            assert set(inspect.signature(getattr(Worker, method)).parameters) == {"self", *kwargs}, method


def test_colocated_engines_sleep_at_level_2_and_wake_what_they_are_told():
    from vllm import LLM

    engine = vllm_engine("ipc")
    engine.sleep()
    engine.wake_up(["weights"])
    engine.wake_up(["kv_cache"])
    assert engine.llm.llm_engine.calls == [("sleep", {"level": 2}), ("wake_up", {"tags": ["weights"]}),
                                           ("wake_up", {"tags": ["kv_cache"]})]
    assert {"level"} <= set(inspect.signature(LLM.sleep).parameters)
    # Engines of their own keep their memory (nothing to hand back): no call reaches vLLM.
    other = vllm_engine("nccl")
    other.sleep()
    other.wake_up(None)
    assert other.llm.llm_engine.calls == []


def test_no_generation_runs_between_a_transfers_start_and_finish_and_it_serves_the_new_version():
    engine = vllm_engine("nccl")
    entered = threading.Event()

    def one_token(contexts, budgets, params, interrupted):
        entered.set()
        return [Continuation([5], [-0.1], "length") for _ in contexts]

    engine._continue = one_token
    engine.start_weight_update()
    results = []
    worker = threading.Thread(target=lambda: results.extend(
        engine.generate([Generation(0, [1, 2])], SamplingParams(max_new_tokens=1))))
    worker.start()
    assert not entered.wait(0.3), "generation ran while the weights were half loaded"
    engine.update_weights({"names": []})
    engine.finish_weight_update(9)
    worker.join(5)
    assert results[0].token_versions == [9]  # the new weights, under the new version


def test_the_nccl_handshake_gives_each_engines_workers_their_own_ranks():
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

    world, offsets = nccl_ranks([2, 2])
    # What vLLM's NCCL trainer engine sends (every engine the same payload, rank_offset 1) ...
    payload = worker_init_payload(NCCLWeightTransferInitInfo(
        master_address="10.0.0.1", master_port=29600, rank_offset=1, world_size=world, packed=True))
    received = []

    class Handle:
        class init_weight_transfer_engine:  # noqa: N801 - an actor method's shape
            @staticmethod
            def remote(info):
                received.append(info)

    EngineClient([Handle(), Handle()], offsets, wait=list).init_weight_transfer_engine(payload)
    # ... as each engine's workers parse it, and the ranks they take (rank_offset + rank within the engine).
    parsed = [NCCLWeightTransferEngine.init_info_cls(**info) for info in received]
    ranks = [info.rank_offset + rank for info in parsed for rank in range(2)]
    assert sorted(ranks) == list(range(1, world)) and {info.world_size for info in parsed} == {world}


def test_vllms_trainer_engine_reads_the_bucketed_source_in_metadata_order():
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    source = BucketSource.of_model(model, torch.bfloat16, bucket_bytes=64)
    wrapped = vllm_source(source)
    # vLLM's default `iter_groups` checks that iteration follows `metadata()`; the packed NCCL sender checks
    # dtypes and shapes too (`_checked_iter`), as on the GPU.
    groups = list(wrapped.iter_groups())
    assert [name for names, _ in groups for name in names] == [meta.name for meta in wrapped.metadata()]
    sent = list(NCCLTrainerWeightTransferEngine._checked_iter(wrapped, wrapped.metadata()))
    assert [t.dtype for _, t in sent] == [torch.bfloat16] * 4
    # A trainer rank other than 0 builds vLLM's real NCCL trainer engine (no rendezvous: only rank 0 joins the
    # group) and takes part in the gathers at each send.
    sender = TrainerSender("nccl", source, EngineClient([], wait=list), rank=1, bucket_bytes=64,
                           master_address="10.0.0.1", master_port=29600, world_size=3)
    assert not sender.engine.is_sender and sender.send(1) == SentWeights(1, [])
    assert asdict(sender.engine.source.metadata()[0])["name"] == "0.weight"


@pytest.mark.parametrize(("resources", "expected"), [
    ({"num_gpus": 4, "num_rollout_engines": 1, "gpus_per_engine": 2, "trainer_ranks": 2, "gpus_per_trainer_rank": 1},
     {"tensor_parallel_size": 2, "distributed_executor_backend": "ray", "enable_sleep_mode": False,
      "gpu_memory_utilization": 0.85, "backend": "nccl"}),
    ({"num_gpus": 2, "num_rollout_engines": 2, "gpus_per_engine": 1, "trainer_ranks": 2, "gpus_per_trainer_rank": 1,
      "colocate": True},
     {"tensor_parallel_size": 1, "enable_sleep_mode": True, "backend": "ipc"}),
    # A model whose size is known: the engine takes the share of each GPU the plan leaves it, and prints.
    ({"num_gpus": 2, "num_rollout_engines": 2, "gpus_per_engine": 1, "trainer_ranks": 2, "gpus_per_trainer_rank": 1,
      "colocate": True, "gpu_memory_gb": 8.0},
     {"tensor_parallel_size": 1, "enable_sleep_mode": True, "backend": "ipc"}),
], ids=["tp2-nccl", "colocated-ipc", "colocated-planned-share"])
def test_a_gpu_placement_becomes_vllms_engine_arguments(monkeypatch, tmp_path, resources, expected):
    import vllm
    from vllm.config import WeightTransferConfig
    from vllm.platforms import current_platform

    from fasync.config.schema import FasyncConfig
    from fasync.launch.plan import resolve
    from fasync.rollout.vllm_engine import GPU_MEMORY_SHARE, VLLMEngine

    built = {}

    def recording_llm(**kwargs):
        built.update(kwargs)
        # What the engine reads of the LLM it built (the request stream's limit), and nothing more.
        return SimpleNamespace(llm_engine=SimpleNamespace(model_config=SimpleNamespace(max_model_len=64)))

    monkeypatch.setattr(vllm, "LLM", recording_llm)
    monkeypatch.setattr(current_platform, "is_cuda_alike", lambda: True)
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "0")
    if "gpu_memory_gb" in resources:
        write_vllm_llama(tmp_path)
    cfg = FasyncConfig.model_validate({"model": {"path": str(tmp_path)}, "rollout": {"engine": "vllm"},
                                       "resources": resources})
    planned = resolve(cfg).plan.engine_memory_fraction
    if "gpu_memory_gb" in resources:
        assert planned is not None and 0 < planned < 1 and planned != GPU_MEMORY_SHARE[True]
    expected.setdefault("gpu_memory_utilization", GPU_MEMORY_SHARE[True] if planned is None else planned)
    VLLMEngine(cfg, memory_fraction=planned)
    transfer = built.pop("weight_transfer_config")
    assert isinstance(transfer, WeightTransferConfig) and transfer.backend == expected.pop("backend")
    assert {key: built.get(key) for key in expected} == expected
    # The IPC handles cross into vLLM's engine core pickled: allowed where, and only where, they are sent.
    assert os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] == ("1" if transfer.backend == "ipc" else "0")
