"""Logprobs and entropy of chosen tokens straight from hidden states, a chunk of positions at a time.

The full-vocabulary fp32 logits of a batch are the largest tensors of a training step (at 64 × 1.5k
tokens and a 152k vocabulary, 60 GB each for the logits, their log-softmax, its exp and the entropy
terms). Here only the positions asked for are projected, `chunk_tokens` of them at a time, in one fused
autograd function: forward keeps no logits, backward recomputes each chunk's and writes its gradient
by hand, so at most one chunk's logits (and its softmax) exist at any time, forward or backward.

A policy calls `score_hidden` inside its own forward (`model(..., score=ScoreRequest(...))`), so that a
sharded (FSDP2) output projection is gathered while it is used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fasync.model.chunking import LOGIT_CHUNK_ELEMENTS


@dataclass
class ScoreRequest:
    """Which next tokens to score: `positions` [N] index the flattened [rows × width] hidden states whose
    logits predict `targets` [N]."""

    positions: Tensor
    targets: Tensor
    temperature: float = 1.0
    entropy_grad: bool = False
    """Keep the entropy's graph (only when the loss has an entropy term); otherwise it is computed detached."""


def score_dtype(weight: Tensor) -> torch.dtype:
    """Scores are computed in fp32 at least: bf16/fp16 logits are upcast, a float64 model (the tests that
    compare algorithms exactly) stays in float64."""
    return torch.promote_types(weight.dtype, torch.float32)


def _chunk_forward(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float):
    """Log-softmax l (fp32 at least) of one chunk's tempered logits, its exp p, and the chosen logprobs; in
    place, so a chunk costs two [chunk, V] tensors."""
    logprobs = torch.nn.functional.linear(hidden, weight, bias).to(score_dtype(weight))
    if temperature > 0:  # temperature 0 is greedy decoding, scored untempered (as `sampling_logprobs`)
        logprobs.div_(temperature)
    logprobs.sub_(logprobs.logsumexp(-1, keepdim=True))
    probs = logprobs.exp()
    return logprobs, probs, logprobs.gather(-1, targets[:, None]).squeeze(-1)


def _entropy(logprobs: Tensor, probs: Tensor) -> Tensor:
    return -torch.einsum("nv,nv->n", probs, logprobs)


class _ChunkedScores(torch.autograd.Function):
    """Forward: logprob and entropy per position, chunk by chunk. Backward: each chunk's logits recomputed
    (one matmul) and its gradient written out by hand. With l = log_softmax(z) and H = −Σ p l:
    d l_y / dz = onehot(y) − p, and dH / dz = −p ⊙ (l + H)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, entropy_grad, chunk):
        logps, entropies = [], []
        for start in range(0, hidden.shape[0], chunk):
            logprobs, probs, chosen = _chunk_forward(hidden[start:start + chunk], weight, bias,
                                                     targets[start:start + chunk], temperature)
            logps.append(chosen)
            entropies.append(_entropy(logprobs, probs))
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.temperature, ctx.entropy_grad, ctx.chunk = temperature, entropy_grad, chunk
        empty = hidden.new_zeros(0, dtype=score_dtype(weight))
        return torch.cat(logps) if logps else empty, torch.cat(entropies) if entropies else empty

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, targets = ctx.saved_tensors
        grad_hidden = torch.zeros_like(hidden)
        accumulate = score_dtype(weight)
        grad_weight = torch.zeros_like(weight, dtype=accumulate)
        grad_bias = None if bias is None else torch.zeros_like(bias, dtype=accumulate)
        scale = 1.0 / ctx.temperature if ctx.temperature > 0 else 1.0
        for start in range(0, hidden.shape[0], ctx.chunk):
            part = slice(start, start + ctx.chunk)
            logprobs, probs, _ = _chunk_forward(hidden[part], weight, bias, targets[part], ctx.temperature)
            g_logp = grad_logp[part, None]
            if ctx.entropy_grad and grad_entropy is not None:
                entropy = _entropy(logprobs, probs)[:, None]
                # p ⊙ (−g_logp − g_H (l + H)), the factor built in the logprobs' storage
                factor = logprobs.add_(entropy).mul_(-grad_entropy[part, None]).sub_(g_logp)
                grad_logits = probs.mul_(factor)
            else:
                grad_logits = probs.mul_(-g_logp)
            grad_logits.scatter_add_(-1, targets[part, None], g_logp)
            grad_logits = grad_logits.mul_(scale).to(weight.dtype)
            grad_hidden[part] = grad_logits @ weight
            grad_weight += (grad_logits.t() @ hidden[part]).to(accumulate)
            if grad_bias is not None:
                grad_bias += grad_logits.to(accumulate).sum(0)
        return (grad_hidden, grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None, None, None)


def score_hidden(hidden: Tensor, weight: Tensor, bias: Tensor | None, request: ScoreRequest,
                 chunk_tokens: int | None = None) -> tuple[Tensor, Tensor]:
    """Logprob and entropy [N] of each requested next token, from `hidden` [rows, width, d] and the output
    projection (`weight` [V, d], `bias`). The entropy carries a gradient only with `request.entropy_grad`."""
    selected = hidden.reshape(-1, hidden.shape[-1]).index_select(0, request.positions)
    chunk = chunk_tokens or max(1, LOGIT_CHUNK_ELEMENTS // weight.shape[0])
    logp, entropy = _ChunkedScores.apply(selected, weight, bias, request.targets, request.temperature,
                                         request.entropy_grad, chunk)
    return logp, entropy if request.entropy_grad else entropy.detach()


def next_token_request(input_ids: Tensor, temperature: float = 1.0, entropy_grad: bool = False) -> ScoreRequest:
    """Every next token of every row: entry (r, t) of the result scores input_ids[r, t + 1]."""
    rows, width = input_ids.shape
    positions = (torch.arange(rows, device=input_ids.device)[:, None] * width
                 + torch.arange(width - 1, device=input_ids.device)).reshape(-1)
    return ScoreRequest(positions, input_ids[:, 1:].reshape(-1), temperature, entropy_grad)
