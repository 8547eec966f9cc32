"""Building the policy and scoring tokens under it: the one definition trainer and engines share.

A policy module is called as `model(input_ids, attention_mask=..., position_ids=...)` and returns
logits [B, T, V], or with `score=` (a `fasync.model.scoring.ScoreRequest`) the logprobs and entropies
of the requested tokens only; it names its repeated blocks (`decoder_layers()`); for decoding it also takes `cache=` (from `model.new_cache(batch, max_len)`), has a
`max_seq_len` (None: unbounded), and moves a cache's keys and values out and in per layer
(`cache_layers`, `cache_from_layers`), so that an engine can continue a context another call began.
"""

from __future__ import annotations

import torch
from torch import nn

from fasync.config.schema import ModelConfig
from fasync.model.scoring import next_token_request

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_model(model_cfg: ModelConfig, tokenizer, seed: int, dtype: torch.dtype | None = None) -> nn.Module:
    """The policy of `model_cfg` on the CPU: the same weights for the same seed, global RNG untouched. Its
    parameters are `model.dtype`, or `dtype` (the trainer keeps fp32 master weights)."""
    dtype = dtype or DTYPES[model_cfg.dtype]
    if model_cfg.path is not None:
        from fasync.model.hf import load_hf_model

        return load_hf_model(model_cfg.path, dtype)
    from fasync.model.tiny import TinyConfig, TinyTransformer

    cfg = TinyConfig(
        vocab_size=tokenizer.vocab_size,
        n_layers=model_cfg.n_layers,
        d_model=model_cfg.d_model,
        n_heads=model_cfg.n_heads,
        max_seq_len=model_cfg.max_seq_len,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyTransformer(cfg).to(dtype)


def sampling_logprobs(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0,
                      top_k: int | None = None) -> torch.Tensor:
    """Log-probabilities [..., V] of the distribution the engines sample from.

    softmax(logits / temperature), cut to the `top_k` most likely tokens (ties at the k-th logit stay), then to
    the nucleus: the most likely tokens whose mass reaches `top_p` (the first always stays), renormalised;
    tokens outside get -inf. vLLM applies top-k before top-p too. Temperature 0 means greedy decoding, which is
    scored under the untempered distribution (a point mass would say nothing about the policy).
    """
    logits = logits.float()
    if temperature == 0:
        return logits.log_softmax(-1)
    logprobs = (logits / temperature).log_softmax(-1)
    if top_k is not None and top_k < logprobs.shape[-1]:
        kth = logprobs.topk(top_k, dim=-1).values[..., -1:]
        logprobs = logprobs.masked_fill(logprobs < kth, float("-inf")).log_softmax(-1)
    if top_p >= 1.0:
        return logprobs
    sorted_logprobs, order = logprobs.sort(-1, descending=True)
    sorted_probs = sorted_logprobs.exp()
    outside_sorted = sorted_probs.cumsum(-1) - sorted_probs >= top_p
    outside = torch.empty_like(outside_sorted).scatter_(-1, order, outside_sorted)
    return logprobs.masked_fill(outside, float("-inf")).log_softmax(-1)


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each next token [B, T-1] under softmax(logits / temperature), and the
    entropy [B, T-1] of that distribution (entry t scores input_ids[:, t + 1]).

    Every position is scored, a chunk at a time (`fasync.model.scoring`); the trainer asks for its
    completion tokens only."""
    request = next_token_request(input_ids, temperature, entropy_grad=True)
    logprobs, entropy = model(input_ids, attention_mask=attention_mask, position_ids=position_ids, score=request)
    shape = (input_ids.shape[0], input_ids.shape[1] - 1)
    return logprobs.view(shape), entropy.view(shape)
