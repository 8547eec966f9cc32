"""The `cpu` transport's last leg: the weights cross to the engine actor as arrays (`fasync.wire`), and the actor
hands them to vLLM's worker as tensors through `collective_rpc`. The CPU build's engine core runs in the actor's
own process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, `fasync.rollout.vllm_engine.cpu_environment`) with the
single-process executor, where `collective_rpc` calls the worker's method directly: the tensors arrive as they
are, with no copy and no serialization. (Across a process boundary vLLM would carry the arguments as msgpack,
where a tensor arrives as a plain list: a multi-process engine core needs another payload.) The worker reloads them
with its model runner's `reload_weights`, which also redoes the CPU build's repacking of linear weights after
loading (the model's own `load_weights` cannot load into repacked parameters).

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


class WorkerWeights:
    """Mixed into every vLLM worker (`worker_extension_cls`): what the `cpu` transport calls there."""

    def fasync_load(self, weights: dict) -> int:
        """Reload the model from CPU tensors under their Hugging Face names; returns the number of tensors loaded."""
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()))
        return len(weights)
