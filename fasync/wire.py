"""How requests, samples and weights cross between Ray actors.

Requests, generations and samples cross between actors as `pack`ed bytes: Ray's own
serializer takes several times longer than pickle on lists of small dataclasses
(a drain of 32 prompt groups: about 5 ms against 1.7 ms as bytes, on the benchmark
machine; see docs/benchmarks.md). Weights cross as numpy arrays, which Ray moves without
copying, where torch tensors are pickled one storage at a time (the quickstart's state
dict: 0.3 ms against 11 ms for a round trip).
"""

from __future__ import annotations

import pickle


def pack(value) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def unpack(blob: bytes):
    return pickle.loads(blob)


def weights_to_arrays(state_dict: dict) -> dict:
    """CPU tensors as `(dtype name, numpy array)`; numpy has no bfloat16, so it travels as int16 bits."""
    import torch

    carriers = {torch.bfloat16: torch.int16}
    return {name: (str(tensor.dtype).removeprefix("torch."), tensor.view(carriers.get(tensor.dtype, tensor.dtype))
                   .numpy()) for name, tensor in state_dict.items()}


def arrays_to_weights(arrays: dict) -> dict:
    import torch

    # A copy: arrays that Ray hands over without copying are read-only.
    return {name: torch.tensor(array).view(getattr(torch, dtype)) for name, (dtype, array) in arrays.items()}
