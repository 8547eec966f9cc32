"""Floating-point work of a Llama-shaped model and the machine's matmul peak: the fraction of the peak a
training step or a generate call reaches (bench/medium_shape.py, docs/benchmarks.md "A medium shape").

The count is of the useful multiply-adds, two FLOPs each, of one sequence of `prompt` + `completion` tokens:

- every linear layer of the decoder (q, k, v, o, gate, up, down), once per token fed: 2 × `body_parameters`
  per token, for all prompt + completion tokens;
- the output projection only where a logit is needed: once per completion token (the trainer scores the
  completion's positions alone, fasync.model.scoring; generation needs the last position's logits per new
  token): 2 × hidden × vocabulary per completion token;
- attention, causal: the token at position i (from 1) meets i keys, QKᵀ and the weighted sum of the values
  cost 2 × hidden × i each, so a sequence of T tokens costs 4 × hidden × T(T + 1) / 2 per layer;
- nothing for the embedding lookup, the norms, the activations, the softmaxes and the optimizer, which are
  not matrix products (they are what the profile shows besides).

Training counts three times the forward (the backward computes the gradient of the inputs and of the
weights, each as much as the forward); generation counts the forward once, the prompt's prefill included.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int | None = None
    """Width of one head; None: hidden // heads (transformers' default)."""

    @classmethod
    def of(cls, config: dict) -> LlamaShape:
        """The shape of a Hugging Face `LlamaConfig` as a dict (`config.json`)."""
        return cls(hidden=config["hidden_size"], layers=config["num_hidden_layers"],
                   heads=config["num_attention_heads"],
                   kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
                   intermediate=config["intermediate_size"], vocab=config["vocab_size"],
                   head_dim=config.get("head_dim"))

    @property
    def width_per_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def body_parameters(self) -> int:
        """Weights of the decoder's linear layers: per layer q and o (hidden × heads × head width each), k and v
        (hidden × kv heads × head width each) and the gated MLP (3 × hidden × intermediate)."""
        attention = 2 * self.hidden * self.heads * self.width_per_head + 2 * self.hidden * self.kv_heads * self.width_per_head
        return self.layers * (attention + 3 * self.hidden * self.intermediate)

    @property
    def head_parameters(self) -> int:
        return self.hidden * self.vocab

    def forward_flops(self, prompt: int, completion: int) -> int:
        """One forward over a sequence of `prompt` + `completion` tokens, logits at the completion's tokens only."""
        tokens = prompt + completion
        attention = self.layers * 4 * self.heads * self.width_per_head * tokens * (tokens + 1) // 2
        return 2 * self.body_parameters * tokens + 2 * self.head_parameters * completion + attention

    def train_flops(self, prompt: int, completion: int) -> int:
        return 3 * self.forward_flops(prompt, completion)

    def generate_flops(self, prompt: int, completion: int) -> int:
        return self.forward_flops(prompt, completion)


def matmul_peak(size: int = 1024, seconds: float = 1.0) -> float:
    """GFLOP/s of the best of repeated float32 `size`³ matrix products for about `seconds`, on the threads torch
    has now (`torch.set_num_threads`): the peak a phase is compared with."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    torch.mm(a, b, out=out)  # the first call allocates and picks its kernel
    times = []
    started = time.perf_counter()
    while not times or time.perf_counter() - started < seconds:
        begin = time.perf_counter()
        torch.mm(a, b, out=out)
        times.append(time.perf_counter() - begin)
    return 2 * size**3 / min(times) / 1e9

