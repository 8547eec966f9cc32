"""A KV cache for Hugging Face models that is written in place: each layer's keys and values are allocated once for
the call's every position (prompt and new tokens), and each forward copies only its own positions in.

transformers' `DynamicCache` appends with `torch.cat`, which copies a layer's whole cache on every decode step:
at fasync's medium shape (bench/medium_shape.py) 12-17 % of a generate call's time. Attention here reads the same
keys and values a `DynamicCache` would hold (a view of the positions filled so far, never the unused room), so the
masks transformers builds and the model's outputs are those of the growing cache. (Attention then reads them from
memory rather than from the processor's cache the copy had just filled, which gives back part of the saving:
docs/benchmarks.md, "A medium shape".)
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer


class PreallocatedLayer(CacheLayerMixin):
    """One layer's keys and values [B, H, max_len, D], allocated at its first update; `keys` and `values` are the
    views of the positions filled so far, as a `DynamicLayer`'s are."""

    is_sliding = False

    def __init__(self, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads = key_states.shape[:2]
        self.device = key_states.device
        # Uninitialised: attention only ever reads the positions written so far.
        self._key_storage = key_states.new_empty(batch, heads, self.max_len, key_states.shape[-1])
        self._value_storage = value_states.new_empty(batch, heads, self.max_len, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} positions; {end} were written")
        self._key_storage[:, :, self.length:end] = key_states
        self._value_storage[:, :, self.length:end] = value_states
        self.length = end
        self.keys = self._key_storage[:, :, :end]
        self.values = self._value_storage[:, :, :end]
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The keys a query sees: the positions filled so far and the query's own (no offset), as a `DynamicLayer`."""
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.max_len


def preallocated_cache(config, max_len: int) -> Cache:
    """A cache of `PreallocatedLayer`s with room for `max_len` positions, where every layer of the model attends to
    all earlier positions. A model with other layers (sliding windows, linear attention, shared KV) gets
    transformers' `DynamicCache`, which knows them."""
    dynamic = DynamicCache(config=config)
    if not dynamic.layers or any(type(layer) is not DynamicLayer for layer in dynamic.layers):
        return dynamic
    return Cache(layers=[PreallocatedLayer(max_len) for _ in dynamic.layers])
