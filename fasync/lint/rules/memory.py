"""H: GPU memory — the per-GPU estimate of fasync/memory.py against `resources.gpu_memory_gb`."""

from __future__ import annotations

from fasync.diagnostics import Severity
from fasync.lint.registry import Finding, rule
from fasync.memory import GB, estimate, model_dims


@rule(
    "H001", "gpu-memory-exceeded", Severity.ERROR,
    summary="The estimated memory of one trainer GPU exceeds `resources.gpu_memory_gb`.",
    what="Estimates, for a trainer rank on a GPU (`resources.gpus_per_trainer_rank` > 0), what its GPU holds "
    "at the peak of a step, term by term (fasync/memory.py): fp32 master weights, gradients and AdamW moments "
    "(divided over the ranks under `train.strategy: fsdp2`), the parameters FSDP2 gathers, the activations of "
    "one micro batch (all layers, or with `train.activation_checkpointing` the layer inputs and one layer), the "
    "scored hidden states and one logits chunk, the frozen reference model when `train.kl_coef` > 0, and a "
    "colocated engine's weights and KV cache. The model's dimensions come from `model.path`'s config.json or "
    "the embedded model's keys. Reports the estimate when it exceeds `resources.gpu_memory_gb`, with its "
    "arithmetic.",
    why="A trainer that does not fit fails with CUDA out of memory at its first step, after the cluster, the "
    "engines and the model load have already taken minutes; the arithmetic says which term to shrink before "
    "any of that is spent.",
)
def gpu_memory_exceeded(cfg, derived):
    res = cfg.resources
    if res.gpus_per_trainer_rank == 0:
        return
    found = estimate(cfg, derived, model_dims(cfg))
    if found is None or found.total <= res.gpu_memory_gb * GB:
        return
    yield Finding(
        "resources.gpu_memory_gb",
        f"one trainer GPU needs about {found.total / GB:.1f} GB ({found.strategy}, {found.dims.parameters:,} "
        f"parameters of {found.dims.source}) but `resources.gpu_memory_gb` is {res.gpu_memory_gb:g}:\n"
        + found.breakdown(),
        "shrink the largest term: `train.strategy: fsdp2` over more `resources.trainer_ranks`, "
        "`train.activation_checkpointing: true`, or a smaller `train.max_tokens_per_micro_batch`; or set "
        "`resources.gpu_memory_gb` to what the GPUs have",
    )
