"""What one GPU holds during training, estimated from the config and the model's dimensions (no torch).

`fasync check` (rule H001) compares the estimate with `resources.gpu_memory_gb`, the colocated engine's
planned share (fasync.launch.plan) follows from it, and
scripts/gpu_smoke.sh measures a real step against it. Every figure is a count of bytes with its formula,
so that a report can show its arithmetic. Decimal units: 1 GB = 10^9 bytes.

The terms, for P parameters in L decoder layers, N trainer ranks, c bytes per compute element:
- weights, gradients and AdamW moments: fp32 (master weights; `fasync.train.trainer`), so 4 + 4 + 8 bytes
  per parameter, divided by N under fsdp2; under `model.lora` gradients and moments only for the adapters
  (`adapter_parameters`), whose weights add to the model's; ddp also keeps a compute-dtype copy when c < 4 (autocast) and
  one gradient bucket (`fasync.train.distributed.GRADIENT_BUCKET_ELEMENTS`);
- fsdp2's gathered parameters: the root's (embeddings, final norm, output projection) and two layers' in
  compute dtype (the one running and the one prefetched), plus one layer's unsharded fp32 gradients;
- activations of one micro batch of T tokens: each layer keeps about 7h + 2·kv + 4i values per token
  (norm inputs and outputs, q, k, v, attention output, MLP gate, up and product; fused attention keeps no
  T² term); with activation checkpointing only the layer inputs (h per token) and one layer's whole set;
- scoring (`fasync.model.scoring`): the completion positions' hidden states, and one chunk's fp32
  log-softmax and softmax;
- the frozen reference model when `train.kl_coef` > 0, in compute dtype, sharded like the policy;
- a colocated rollout engine: its weights (over its tensor-parallel size) and its KV cache for the samples
  it generates at once;
- a fixed allowance for the CUDA context and communication buffers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from fasync.config.derived import GB, Derived, derive
from fasync.config.schema import FasyncConfig
from fasync.model.chunking import LOGIT_CHUNK_ELEMENTS

GRADIENT_BUCKET_ELEMENTS = 1 << 25
"""DDP gradients are summed in flat buckets of up to this many elements (128 MiB in fp32)."""
RUNTIME_BYTES = 1 * GB
"""CUDA context, cuBLAS workspaces and NCCL buffers, per GPU."""
DATASET_PROMPT_TOKENS = 1024
"""The longest prompt assumed for a dataset file when `data.max_prompt_tokens` is not set."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelDims:
    source: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied_embeddings: bool
    layer_parameters: int
    """Parameters of one decoder layer."""
    root_parameters: int
    """Parameters outside the decoder layers (embeddings, final norm, output projection)."""
    max_context: int | None

    @property
    def parameters(self) -> int:
        return self.num_layers * self.layer_parameters + self.root_parameters

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim


def hf_dims(config: dict, source: str) -> ModelDims:
    """A Llama/Qwen-style decoder from its Hugging Face config.json (q/k/v/o, a gated MLP, RMS norms)."""
    text = config.get("text_config", config)
    hidden = text["hidden_size"]
    heads = text["num_attention_heads"]
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or hidden // heads
    intermediate = text["intermediate_size"]
    vocab = text["vocab_size"]
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    bias = bool(text.get("attention_bias", text.get("model_type") == "qwen2"))
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    if bias:
        attention += heads * head_dim + 2 * kv_heads * head_dim
    layer = attention + 3 * hidden * intermediate + 2 * hidden
    root = vocab * hidden * (1 if tied else 2) + hidden
    return ModelDims(source, vocab, hidden, text["num_hidden_layers"], intermediate, heads, kv_heads, head_dim, tied,
                     layer, root, text.get("max_position_embeddings"))


def embedded_dims(cfg: FasyncConfig, vocab_size: int) -> ModelDims:
    """The embedded transformer (fasync.model.tiny): LayerNorms with bias, a 4× GELU MLP, learned positions."""
    m = cfg.model
    d = m.d_model
    layer = 4 * d + 4 * d * d + (d * 4 * d + 4 * d) + (4 * d * d + d)
    root = vocab_size * d + m.max_seq_len * d + 2 * d
    return ModelDims("the embedded model", vocab_size, d, m.n_layers, 4 * d, m.n_heads, m.n_heads, d // m.n_heads,
                     True, layer, root, m.max_seq_len)


@lru_cache(maxsize=16)
def _read_config(path: str) -> dict | None:
    try:
        return json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None


def model_dims(cfg: FasyncConfig) -> ModelDims | None:
    """The model's dimensions: from `model.path`'s config.json, or the embedded model's keys; None when the
    config.json cannot be read or lacks a dimension (rule M and preflight report that)."""
    if cfg.model.path is None:
        from fasync.model.tokenizer import build_tokenizer

        return embedded_dims(cfg, build_tokenizer(cfg.model, cfg.data, chat=cfg.rollout.agentic).vocab_size)
    config = _read_config(cfg.model.path)
    if config is None:
        return None
    try:
        return hf_dims(config, f"{cfg.model.path}/config.json")
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def derive_with_model(cfg: FasyncConfig) -> tuple[ModelDims | None, Derived]:
    """The model's dimensions (`model_dims`), and the config derived with the model's size."""
    dims = model_dims(cfg)
    return dims, derive(cfg, dims.parameters if dims is not None else None)


def prompt_tokens(cfg: FasyncConfig) -> int:
    if cfg.data.max_prompt_tokens is not None:
        return cfg.data.max_prompt_tokens
    from fasync.data.shape import builtin_task_shape

    shape = builtin_task_shape(cfg)
    return shape.prompt_tokens if shape is not None else DATASET_PROMPT_TOKENS


def micro_batch_tokens(cfg: FasyncConfig, micro_batch_size: int) -> int:
    """Tokens in one micro batch at most: the token budget, or micro_batch_size longest sequences."""
    if cfg.train.max_tokens_per_micro_batch is not None:
        return cfg.train.max_tokens_per_micro_batch
    return micro_batch_size * (prompt_tokens(cfg) + cfg.rollout.max_new_tokens)


@dataclass(frozen=True)
class Term:
    name: str
    formula: str
    bytes: float


@dataclass(frozen=True)
class MemoryEstimate:
    dims: ModelDims
    strategy: str
    terms: tuple[Term, ...]

    @property
    def total(self) -> float:
        return sum(term.bytes for term in self.terms)

    def term(self, name: str) -> Term:
        return next(term for term in self.terms if term.name == name)

    def breakdown(self) -> str:
        """One line per term with its formula and size, then the total."""
        lines = [f"  {term.name}: {term.formula} = {term.bytes / GB:.2f} GB" for term in self.terms]
        return "\n".join(lines + [f"  total: {self.total / GB:.2f} GB"])


def engine_terms(cfg: FasyncConfig, dims: ModelDims) -> list[Term]:
    """A rollout engine's weights and KV cache on each of its GPUs."""
    res, c = cfg.resources, DTYPE_BYTES[cfg.model.dtype]
    tp = max(res.gpus_per_engine, 1)
    sequences = -(-cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt // res.num_rollout_engines)
    context = prompt_tokens(cfg) + cfg.rollout.max_new_tokens
    kv = 2 * dims.num_layers * dims.kv_width * c * sequences * context / tp
    return [
        Term("engine weights", f"{c} B × {dims.parameters:,} parameters / TP {tp}", c * dims.parameters / tp),
        Term("engine KV cache", f"2 × {dims.num_layers} layers × {dims.kv_width} × {c} B × {sequences} sequences × "
             f"{context} tokens / TP {tp}", kv),
    ]


def adapter_parameters(dims: ModelDims, rank: int) -> int:
    """LoRA's parameters on every linear layer of each decoder layer (`fasync.model.lora.default_targets`):
    rank × (in + out) for q and o (h → h), k and v (h → kv), gate and up (h → i) and down (i → h), so
    rank × (9h + 2kv + 3i) per layer; fewer `target_modules` hold fewer, so this bounds them."""
    return dims.num_layers * rank * (9 * dims.hidden_size + 2 * dims.kv_width + 3 * dims.intermediate_size)


def estimate(cfg: FasyncConfig, derived: Derived, dims: ModelDims | None) -> MemoryEstimate | None:
    """Peak bytes on one trainer GPU (with its colocated engine's share), term by term, for `derived`
    (the strategy and micro batch size in effect) and the model's `dims` (`model_dims`; None: unknown, and so
    is the estimate)."""
    strategy = derived.train_strategy
    if dims is None:
        return None
    train, res = cfg.train, cfg.resources
    c = DTYPE_BYTES[cfg.model.dtype]
    p, n, layers = dims.parameters, res.trainer_ranks, dims.num_layers
    shards = n if strategy == "fsdp2" else 1
    over = f" / {n} ranks" if shards > 1 else ""
    # Under LoRA only the adapters train: they add to the weights and alone have gradients and moments.
    lora = cfg.model.lora
    trained = p if lora is None else adapter_parameters(dims, lora.rank)
    weights = p if lora is None else p + trained
    what = "" if lora is None else " adapter parameters"
    terms = [
        Term("fp32 master weights", f"4 B × {weights:,} parameters{over}", 4 * weights / shards),
        Term("fp32 gradients", f"4 B × {trained:,}{what}{over}", 4 * trained / shards),
        Term("AdamW moments", f"8 B × {trained:,}{what}{over}", 8 * trained / shards),
    ]
    if strategy == "fsdp2":
        gathered = dims.root_parameters + 2 * dims.layer_parameters
        terms += [
            Term("gathered parameters", f"{c} B × ({dims.root_parameters:,} root + 2 × {dims.layer_parameters:,} "
                 "per layer)", c * gathered),
            Term("unsharded layer gradients", f"4 B × {dims.layer_parameters:,}", 4 * dims.layer_parameters),
        ]
    else:
        if c < 4:
            terms.append(Term("compute-dtype weight copies", f"{c} B × {p:,}", c * p))
        terms.append(Term("gradient bucket", f"4 B × {min(p, GRADIENT_BUCKET_ELEMENTS):,}",
                          4 * min(p, GRADIENT_BUCKET_ELEMENTS)))
    tokens = micro_batch_tokens(cfg, derived.micro_batch_size)
    per_layer = 7 * dims.hidden_size + 2 * dims.kv_width + 4 * dims.intermediate_size
    if train.activation_checkpointing:
        terms += [
            Term("layer inputs (checkpointed)", f"{layers} layers × {dims.hidden_size} × {c} B × {tokens} tokens",
                 layers * dims.hidden_size * c * tokens),
            Term("one layer's activations", f"{per_layer:,} values × {c} B × {tokens} tokens", per_layer * c * tokens),
        ]
    else:
        terms.append(Term("activations", f"{layers} layers × {per_layer:,} values × {c} B × {tokens} tokens",
                          layers * per_layer * c * tokens))
    sequences = max(tokens // (prompt_tokens(cfg) + cfg.rollout.max_new_tokens), 1)
    completion = min(tokens, sequences * cfg.rollout.max_new_tokens)
    chunk = min(completion, max(1, LOGIT_CHUNK_ELEMENTS // dims.vocab_size))
    terms += [
        Term("scored hidden states", f"{completion} completion tokens × {dims.hidden_size} × {c} B",
             completion * dims.hidden_size * c),
        Term("logits chunk", f"2 × 4 B × {chunk} positions × {dims.vocab_size} vocabulary",
             8 * chunk * dims.vocab_size),
    ]
    if train.kl_coef > 0:
        terms.append(Term("reference model", f"{c} B × {p:,}{over}", c * p / shards))
    if res.colocate and res.gpus_per_engine > 0:
        terms += engine_terms(cfg, dims)
    terms.append(Term("CUDA context and buffers", "fixed", RUNTIME_BYTES))
    return MemoryEstimate(dims, strategy, tuple(terms))
