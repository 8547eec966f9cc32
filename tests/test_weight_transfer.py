"""The weight transfer's placement-independent parts: which transport a placement uses, the names the engines
load, the CPU blob, and the bucketed source vLLM's GPU transports read (no vLLM needed)."""

import pytest
import torch
from safetensors import safe_open
from test_hf_model import write_tiny_llama

from fasync.config.schema import FasyncConfig
from fasync.model import build_model, build_tokenizer
from fasync.rollout.weight_transfer import BucketSource, from_blob, hf_names, to_blob, transport_for


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


def test_the_cpu_blob_round_trips_names_dtypes_and_values(model_dir, policy):
    state = {name: tensor.to(torch.bfloat16) for name, tensor in policy.state_dict().items()}
    loaded = from_blob(to_blob(state.items()))
    assert set(loaded) == checkpoint_names(model_dir)
    for name, tensor in hf_names(state.items()):
        assert loaded[name].dtype == torch.bfloat16 and torch.equal(loaded[name], tensor)


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
        torch.testing.assert_close(tensor, original.to(torch.bfloat16))


def test_buckets_hold_at_most_their_size_unless_one_tensor_is_larger(policy):
    from fasync.train.weights import weight_buckets

    sizes = [t.numel() * 4 for t in policy.state_dict().values()]
    limit = sorted(sizes)[len(sizes) // 2]
    buckets = list(weight_buckets(policy, torch.float32, limit))
    assert len(buckets) > 1 and sum(len(b) for b in buckets) == len(sizes)
    for bucket in buckets:
        total = sum(t.numel() * 4 for _, t in bucket)
        assert total <= limit or len(bucket) == 1
