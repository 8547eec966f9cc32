"""The `cpu` transport's payload: the weights cross to the engine actor as arrays (`fasync.wire`), then
into vLLM's worker as one safetensors blob through `collective_rpc`, whose arguments vLLM serializes with
msgpack (a tensor would arrive as a plain list, bytes arrive as bytes). The worker reloads them with its model
runner's `reload_weights`, which also redoes the CPU build's repacking of linear weights after loading (the
model's own `load_weights` cannot load into repacked parameters).

Every transport loads the same thing: the trainer's rollout weights under their Hugging Face names
(`hf_names`), in the engine's dtype.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


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
