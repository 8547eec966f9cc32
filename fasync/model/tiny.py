"""The embedded policy: a small decoder-only transformer in plain torch.

Pre-norm blocks (causal self-attention, then an MLP), learned position
embeddings, and an output projection tied to the token embedding by default.
`forward` optionally takes a KVCache: the rollout engine then feeds only the
new tokens of each step, while the trainer runs the ordinary full forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fasync.model.scoring import ScoreRequest, score_hidden


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    max_seq_len: int = 64
    tie_embeddings: bool = True


class KVCache:
    """Keys and values of every layer for a batch, preallocated for `max_len` positions."""

    def __init__(self, cfg: TinyConfig, batch_size: int, max_len: int, dtype: torch.dtype, device):
        shape = (cfg.n_layers, batch_size, cfg.n_heads, max_len, cfg.d_model // cfg.n_heads)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0
        """Positions filled by the forwards so far."""

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions of `layer`; return its keys and values for all positions so far."""
        end = self.length + keys.shape[2]
        self.keys[layer, :, :, self.length:end] = keys
        self.values[layer, :, :, self.length:end] = values
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: KVCache | None, layer: int) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, width // self.n_heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.ln_attn = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_mlp = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: KVCache | None, layer: int) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x), mask, cache, layer)
        return x + self.mlp(self.ln_mlp(x))


class TinyTransformer(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")
        self.cfg = cfg
        self.max_seq_len = cfg.max_seq_len
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position_embedding = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_final = nn.LayerNorm(cfg.d_model)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2's scheme: small normal weights, and the projections that write into the residual
        # stream scaled down by depth so its variance does not grow with the number of blocks.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for residual_out in (block.attn.proj, block.mlp[2]):
                nn.init.normal_(residual_out.weight, std=0.02 / math.sqrt(2 * self.cfg.n_layers))

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        weight = self.token_embedding.weight
        return KVCache(self.cfg, batch_size, max_len, weight.dtype, weight.device)

    def cache_layers(self, cache: KVCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the keys and values [B, H, T, D] of the positions filled so far."""
        return [(cache.keys[layer, :, :, :cache.length], cache.values[layer, :, :, :cache.length])
                for layer in range(self.cfg.n_layers)]

    def cache_from_layers(self, layers: list[tuple[torch.Tensor, torch.Tensor]], max_len: int) -> KVCache:
        """A cache holding these keys and values, with room for `max_len` positions."""
        batch, _, filled, _ = layers[0][0].shape
        cache = self.new_cache(batch, max_len)
        for layer, (keys, values) in enumerate(layers):
            cache.keys[layer, :, :, :filled] = keys
            cache.values[layer, :, :, :filled] = values
        cache.length = filled
        return cache

    def decoder_layers(self) -> nn.ModuleList:
        """The repeated blocks: the units of activation checkpointing and of FSDP2 sharding."""
        return self.blocks

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
        score: ScoreRequest | None = None,
    ):
        """Logits [B, T, V] for `input_ids` [B, T]; with `score`, only the requested tokens' logprobs and
        entropies [N] (`fasync.model.scoring`).

        `attention_mask` [B, past + T] marks real tokens (1) and padding (0) over the cached and
        the new positions; `position_ids` [B, T] default to counting on from the cache. Without a mask
        or a cache, a row may hold several sequences packed one after another: each restart of
        `position_ids` begins a sequence that attends only to itself.
        """
        batch, length = input_ids.shape
        past = cache.length if cache is not None else 0
        device = input_ids.device
        if position_ids is None:
            position_ids = torch.arange(past, past + length, device=device).expand(batch, length)
        if attention_mask is None:
            attention_mask = (packed_segments(position_ids) if cache is None
                              else torch.ones(batch, past + length, dtype=torch.long, device=device))
        mask = _attention_mask(attention_mask, past, length)
        x = self.token_embedding(input_ids) + self.position_embedding(position_ids)
        for layer, block in enumerate(self.blocks):
            x = block(x, mask, cache, layer)
        if cache is not None:
            cache.length += length
        x = self.ln_final(x)
        output = self.token_embedding if self.lm_head is None else self.lm_head
        if score is not None:
            return score_hidden(x, output.weight, None, score)
        return F.linear(x, output.weight)


def packed_segments(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] sequence numbers from 1, a new one wherever a row's positions do not count on by one."""
    step = torch.diff(position_ids, prepend=position_ids[:, :1] - 1, dim=-1)
    return (step != 1).cumsum(-1) + 1


def _attention_mask(segments: torch.Tensor, past: int, length: int) -> torch.Tensor:
    """Boolean [B, 1, T, past + T]: each query sees the keys of its own sequence at or before its position.

    `segments` [B, past + T] numbers each token's sequence (0: padding); an attention mask of ones and
    zeros is one sequence. A padding query would see no key at all (and softmax would give NaN), so
    every query also sees itself; padding outputs are never read.
    """
    device = segments.device
    query_pos = torch.arange(past, past + length, device=device)[:, None]
    key_pos = torch.arange(past + length, device=device)[None, :]
    keys = segments[:, None, None, :]
    queries = segments[:, past:, None][:, None]
    return ((keys == queries) & (keys > 0) & (key_pos <= query_pos)) | (key_pos == query_pos)
