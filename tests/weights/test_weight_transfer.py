"""The weight transfer's parts that need no vLLM and no GPU: which transport a run takes, the names the engines
load, the bucketed source vLLM's GPU transports read, the NCCL group's ranks as the plan gives
them, and the client that drives the engines."""

import pytest
import torch
from safetensors import safe_open
from tiny_models import write_tiny_llama

from fasync.config.schema import FasyncConfig
from fasync.errors import ConfigurationError
from fasync.model import build_model, build_tokenizer
from fasync.weights.cpu import hf_names
from fasync.weights.sender import BucketSource, EngineClient, nccl_ranks
from fasync.weights.transport import check_transport, transport_for, transport_of


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-llama-weights")
    write_tiny_llama(directory, hidden_size=64, heads=2)
    return directory


@pytest.fixture(scope="module")
def policy(model_dir):
    cfg = FasyncConfig.model_validate({"model": {"path": str(model_dir)}})
    return build_model(cfg.model, build_tokenizer(cfg.model, cfg.data), seed=0)


def checkpoint_names(model_dir) -> set[str]:
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return set(f.keys())


def test_each_placement_has_its_transport():
    assert transport_for(0, colocate=False) == transport_for(0, colocate=True) == "cpu"
    assert transport_for(1, colocate=True) == "ipc"
    assert transport_for(2, colocate=False) == "nccl"


def test_the_trainers_names_are_the_checkpoints(model_dir, policy):
    sent = {name for name, _ in hf_names(policy.state_dict().items())}
    assert sent == checkpoint_names(model_dir)


def test_the_bucketed_source_yields_what_its_metadata_declares(model_dir, policy):
    tensors = policy.state_dict()
    largest = max(t.numel() * 2 for t in tensors.values())
    source = BucketSource.of_model(policy, torch.bfloat16, bucket_bytes=largest)
    declared = source.metadata()
    # Iterated twice: each sync is a fresh pass.
    for _ in range(2):
        sent = list(source)
        assert [(name, t.dtype, tuple(t.shape)) for name, t in sent] == declared
    assert {name for name, _, _ in declared} == checkpoint_names(model_dir)
    for (_, tensor), original in zip(sent, tensors.values()):
        assert torch.equal(tensor, original.to(torch.bfloat16))  # a cast, the same on any CPU


def test_no_bucket_sent_is_alive_while_the_next_is_gathered(monkeypatch):
    import weakref

    import fasync.weights.buckets as weights

    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16, bias=False) for _ in range(6)])
    sent = []  # weak references to every tensor the source has yielded
    alive_at_gather = []
    gather = weights.full_value

    def counting_gather(value):
        alive_at_gather.append(sum(ref() is not None for ref in sent))
        return gather(value)

    monkeypatch.setattr(weights, "full_value", counting_gather)
    source = BucketSource.of_model(model, torch.bfloat16, bucket_bytes=2 * 16 * 16 * 2)  # two tensors a bucket
    for _, tensor in source:
        sent.append(weakref.ref(tensor))
        del tensor  # a sender that has sent it keeps nothing
    assert len(sent) == 6 and alive_at_gather == [0] * 6


def test_buckets_hold_at_most_their_size_unless_one_tensor_is_larger(policy):
    from fasync.weights.buckets import weight_buckets

    sizes = [t.numel() * 4 for t in policy.state_dict().values()]
    limit = sorted(sizes)[len(sizes) // 2]
    buckets = list(weight_buckets(policy, torch.float32, limit))
    assert len(buckets) > 1 and sum(len(b) for b in buckets) == len(sizes)
    for bucket in buckets:
        total = sum(t.numel() * 4 for _, t in bucket)
        assert total <= limit or len(bucket) == 1


# -- which transport a run takes, and the GPU transports' arithmetic ------------------------------------------

def _cfg(engine="vllm", **resources) -> FasyncConfig:
    return FasyncConfig.model_validate({"model": {"path": "/nonexistent"} if engine == "vllm" else {},
                                        "rollout": {"engine": engine}, "resources": resources})


@pytest.mark.parametrize(("engine", "resources", "expected"), [
    ("vllm", {}, "cpu"),
    ("vllm", {"num_gpus": 2, "gpus_per_engine": 1, "gpus_per_trainer_rank": 1, "colocate": True}, "ipc"),
    ("vllm", {"num_gpus": 2, "gpus_per_engine": 1, "gpus_per_trainer_rank": 1}, "nccl"),
    # The torch engine has no weight transfer engine: it loads a state dict, on a GPU too.
    ("hf", {"num_gpus": 2, "gpus_per_engine": 1, "gpus_per_trainer_rank": 1}, "cpu"),
    ("hf", {"num_gpus": 1, "gpus_per_engine": 1, "gpus_per_trainer_rank": 1, "colocate": True}, "cpu"),
])
def test_a_run_takes_its_engines_transport(engine, resources, expected):
    assert transport_of(_cfg(engine, **resources)) == expected


def test_ipc_needs_a_trainer_rank_on_every_engine_gpu():
    covered = _cfg(num_gpus=4, num_rollout_engines=2, gpus_per_engine=2, trainer_ranks=4, gpus_per_trainer_rank=1,
                   colocate=True)
    check_transport(covered)
    short = covered.model_copy(update={"resources": covered.resources.model_copy(update={"trainer_ranks": 2})})
    with pytest.raises(ConfigurationError, match=r"engines use 4 GPUs .* trainer ranks only 2.*trainer_ranks to 4"):
        check_transport(short)
    # Disaggregated, the engines' GPUs are their own: NCCL reaches them from rank 0 alone.
    check_transport(short.model_copy(update={"resources": short.resources.model_copy(update={"colocate": False})}))


@pytest.mark.parametrize(("workers", "world", "offsets"), [
    ([1], 2, [1]),
    ([1, 1, 1], 4, [1, 2, 3]),
    ([2, 2], 5, [1, 3]),
    ([4, 2], 7, [1, 5]),
])
def test_the_nccl_group_is_the_sender_and_every_engine_worker(workers, world, offsets):
    assert nccl_ranks(workers) == (world, offsets)
    # vLLM ranks a worker rank_offset + its rank within its engine: every rank from 1 on, once.
    ranks = [offset + rank for offset, count in zip(offsets, workers) for rank in range(count)]
    assert sorted(ranks) == list(range(1, world))


def test_the_plan_gives_the_nccl_group_each_engines_tensor_parallel_size():
    from fasync.launch.plan import resolve

    plan = resolve(_cfg(num_gpus=6, num_rollout_engines=2, gpus_per_engine=2, trainer_ranks=2,
                               gpus_per_trainer_rank=1)).plan
    assert plan.engine_workers() == [2, 2]
    assert nccl_ranks(plan.engine_workers()) == (5, [1, 3])
    assert resolve(_cfg(num_rollout_engines=3)).plan.engine_workers() == [1, 1, 1]  # CPU engines


def test_a_tensor_parallel_engines_workers_hold_its_gpus():
    from fasync.launch.plan import resolve

    plan = resolve(_cfg(num_gpus=6, num_rollout_engines=2, gpus_per_engine=2, trainer_ranks=2,
                               gpus_per_trainer_rank=1)).plan
    options = plan.engine_options(1)
    assert options["num_gpus"] == 0.0  # the actor leaves bundle 2's GPU to the worker placed there
    assert options["slot"].worker_environment() == {"VLLM_RAY_BUNDLE_INDICES": "2,3", "VLLM_RAY_PER_WORKER_GPUS": "1",
                                                    "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    colocated = resolve(_cfg(num_gpus=4, num_rollout_engines=2, gpus_per_engine=2, trainer_ranks=4,
                                    gpus_per_trainer_rank=1, colocate=True)).plan
    assert colocated.engine_options(0)["slot"].worker_environment() == {  # beside the trainer rank's half
        "VLLM_RAY_BUNDLE_INDICES": "0,1", "VLLM_RAY_PER_WORKER_GPUS": "0.5", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    single = resolve(_cfg(num_gpus=2, gpus_per_engine=1, gpus_per_trainer_rank=1)).plan
    assert single.engine_options(0)["num_gpus"] == 1.0 and single.engine_options(0)["slot"].worker_environment() == {}


class _Call:
    def __init__(self, log, engine, method):
        self.log, self.engine, self.method = log, engine, method

    def remote(self, *args):
        self.log.append((self.engine, self.method, args))
        return (self.method, args[-1] if args else None)


class _Engine:
    """An engine actor handle that records what the client calls on it."""

    def __init__(self, log, index):
        self.log, self.index = log, index

    def __getattr__(self, method):
        return _Call(self.log, self.index, method)


def _served(refs):
    return [(args, None) if method == "finish_weight_update" else None for method, args in refs]


def test_the_client_gives_each_engine_its_rank_offset_and_serves_the_version():
    log = []
    client = EngineClient([_Engine(log, 0), _Engine(log, 1)], rank_offsets=[1, 3], wait=_served)
    payload = {"master_address": "10.0.0.1", "master_port": 29600, "rank_offset": 1, "world_size": 5}
    client.init_weight_transfer_engine(payload)
    assert [(engine, args[0]["rank_offset"]) for engine, _, args in log] == [(0, 1), (1, 3)]
    assert all(args[0]["world_size"] == 5 for _, _, args in log)
    log.clear()
    client.version = 7
    client.start_weight_update()
    client.update_weights({"names": ["w"]})
    client.finish_weight_update()
    assert [(engine, method) for engine, method, _ in log] == [
        (0, "start_weight_update"), (1, "start_weight_update"), (0, "update_weights"), (1, "update_weights"),
        (0, "finish_weight_update"), (1, "finish_weight_update")]
    assert client.served == [(7, None), (7, None)]


def test_the_client_passes_ipcs_init_unchanged():
    log = []
    EngineClient([_Engine(log, 0)], wait=_served).init_weight_transfer_engine({"packed": True})
    assert log == [(0, "init_weight_transfer_engine", ({"packed": True},))]


# -- on a CUDA device (skipped without one): what the `ipc` and `nccl` transports read, from the GPU -----------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _gpu_model(layers: int = 8, width: int = 1024) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]).cuda()


@gpu
@pytest.mark.gpu
def test_a_sync_holds_at_most_a_bucket_and_a_tensor_beside_the_model_on_the_gpu():
    model = _gpu_model()
    bucket_bytes = 4 << 20  # two bf16 weights of 1024 × 1024
    full_copy = sum(p.numel() * 2 for p in model.parameters())  # 16 MiB in bf16
    source = BucketSource.of_model(model, torch.bfloat16, bucket_bytes)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    sent = 0
    for item in source:
        sent += 1
        del item  # a sender that has sent a tensor keeps nothing of it
    held = torch.cuda.max_memory_allocated() - baseline
    assert sent == len(source.metadata())
    for (name, tensor), (_, dtype, shape) in zip(source, source.metadata()):
        assert tensor.is_cuda and tensor.dtype == dtype and tuple(tensor.shape) == shape
        assert torch.equal(tensor, model.state_dict()[name].to(torch.bfloat16))
    # A bucket, and the tensor that did not fit in it (gathered before the bucket is sent).
    assert held <= bucket_bytes + 2 * 1024 * 1024 < full_copy, (held, full_copy)


def _rebuild_and_sum(handles, device_index, results):
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    torch.cuda.set_device(device_index)
    sums = []
    for args in handles:
        args = list(args)
        args[6] = device_index  # as vLLM's IPC engine does: the receiver's own index of the device
        sums.append(float(rebuild_cuda_tensor(*args).float().sum()))
    results.put(sums)


@gpu
@pytest.mark.gpu
def test_a_buckets_tensors_reach_another_process_through_cuda_ipc():
    """The mechanism of vLLM's `ipc` transport (`reduce_tensor` in the trainer, `rebuild_cuda_tensor` in the
    engine worker, on the same GPU), applied to a bucket as `weight_buckets` yields it."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.reductions import reduce_tensor

    from fasync.weights.buckets import weight_buckets

    bucket = next(weight_buckets(_gpu_model(layers=2, width=256), torch.bfloat16, 1 << 30))
    tensors = [tensor.contiguous() for _, tensor in bucket]
    handles = [reduce_tensor(tensor)[1] for tensor in tensors]
    context = mp.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_rebuild_and_sum, args=(handles, torch.cuda.current_device(), results))
    child.start()
    sums = results.get(timeout=120)
    child.join(30)
    assert child.exitcode == 0
    assert sums == [float(tensor.float().sum()) for tensor in tensors]
