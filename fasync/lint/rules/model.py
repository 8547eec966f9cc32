"""M: the model — the embedded transformer's shape and context, and what each engine can load."""

from __future__ import annotations

from fasync.data.shape import builtin_task_shape
from fasync.diagnostics import Severity
from fasync.lint.registry import Finding, rule
from fasync.lint.rules import facts
from fasync.memory import model_dims


@rule(
    "M001", "vllm-needs-model-path", Severity.ERROR,
    summary="The vLLM engine needs a Hugging Face model directory.",
    what="Reports `rollout.engine: vllm` without `model.path`.",
    why="Without `model.path` the policy is the embedded tiny transformer, which exists only as fasync's own "
    "torch module: vLLM loads models from a Hugging Face directory and cannot load it. Every engine actor "
    "fails when it starts, after the cluster and the trainer are up.",
)
def vllm_needs_model_path(cfg, derived):
    if cfg.rollout.engine == "vllm" and cfg.model.path is None:
        yield Finding(
            "rollout.engine",
            "`rollout.engine` vllm cannot load the embedded model: `model.path` is null",
            "set `model.path` to a local Hugging Face model directory, or use `rollout.engine: hf` for the embedded "
            "model",
        )


@rule(
    "M002", "heads-do-not-divide-width", Severity.ERROR,
    summary="The embedded model's `d_model` is not divisible by `n_heads`.",
    what="Reports, for the embedded model (no `model.path`), a `model.d_model` that is not a multiple of "
    "`model.n_heads`.",
    why="Each attention head gets d_model / n_heads dimensions, so the width must divide evenly; the model "
    "refuses to build, which happens only once the trainer and engine actors start.",
)
def heads_do_not_divide_width(cfg, derived):
    model = cfg.model
    if model.path is None and model.d_model % model.n_heads:
        yield Finding(
            "model.n_heads",
            f"`model.d_model` {model.d_model} is not divisible by `model.n_heads` {model.n_heads}",
            f"set `model.n_heads` to a divisor of {model.d_model}, or `model.d_model` to a multiple of {model.n_heads}",
        )


def _context_text(shape, cfg) -> str:
    return (f"the {shape.task} task's prompts are {shape.prompt_tokens} tokens (`data.length` {cfg.data.length}, "
            "with the start token)")


@rule(
    "M003", "answer-exceeds-context", Severity.ERROR,
    summary="A built-in task's prompt and answer do not fit the embedded model's context.",
    what="Reports, for a built-in task with the embedded model, prompt tokens + answer tokens above "
    "`model.max_seq_len`. The prompt is counted as the embedded tokenizer feeds it: a start token, then one "
    "token per character.",
    why="The engines stop generating when the context is full, so no completion can contain a whole answer "
    "(and a prompt longer than the context leaves no room at all): rewards stay at their floor and nothing "
    "is learned.",
)
def answer_exceeds_context(cfg, derived):
    shape = builtin_task_shape(cfg)
    limit = cfg.model.max_seq_len
    if shape is None or shape.prompt_tokens + shape.answer_tokens <= limit:
        return
    needed = shape.prompt_tokens + max(cfg.rollout.max_new_tokens, shape.answer_tokens)
    yield Finding(
        "model.max_seq_len",
        f"{_context_text(shape, cfg)} and its answers {shape.answer_tokens}: "
        f"{shape.prompt_tokens + shape.answer_tokens} tokens do not fit `model.max_seq_len` {limit}",
        f"set `model.max_seq_len` to at least {needed}, or shorten the problems with `data.length`",
    )


@rule(
    "M004", "completion-budget-cut", Severity.WARNING,
    summary="The embedded model's context cuts the completion budget short.",
    what="Reports, for a built-in task with the embedded model, prompt tokens + `rollout.max_new_tokens` "
    "above `model.max_seq_len` while the answer itself still fits (otherwise M003).",
    why="The engines silently shorten each completion to what the context has left, so `max_new_tokens` is "
    "not the budget in effect, and completions that would have ended with the end-of-sequence token end "
    "at the limit instead (finish reason `length`).",
)
def completion_budget_cut(cfg, derived):
    shape = builtin_task_shape(cfg)
    limit, budget = cfg.model.max_seq_len, cfg.rollout.max_new_tokens
    if shape is None or shape.prompt_tokens + shape.answer_tokens > limit or shape.prompt_tokens + budget <= limit:
        return
    left = limit - shape.prompt_tokens
    yield Finding(
        "rollout.max_new_tokens",
        f"{_context_text(shape, cfg)}, so `model.max_seq_len` {limit} leaves room for {left} of the {budget} "
        "tokens `rollout.max_new_tokens` allows",
        f"set `rollout.max_new_tokens` to {left}, or `model.max_seq_len` to {shape.prompt_tokens + budget}",
    )


@rule(
    "M005", "vllm-cpu-head-size", Severity.ERROR,
    summary="A model whose attention head size vLLM's CPU build does not support.",
    what="Reports, for vLLM engines on CPU (`rollout.engine: vllm`, `resources.gpus_per_engine: 0`), a model whose "
    "head size (`head_dim` in `model.path`'s config.json, or hidden_size / num_attention_heads) is not one of "
    f"{', '.join(map(str, facts.VLLM_CPU_HEAD_SIZES))}.",
    why="vLLM's CPU attention kernels exist for those head sizes only: every engine fails when it starts, after "
    "the cluster and the trainer are up.",
)
def vllm_cpu_head_size(cfg, derived):
    if cfg.rollout.engine != "vllm" or cfg.resources.gpus_per_engine != 0 or cfg.model.path is None:
        return
    dims = model_dims(cfg)
    if dims is None or dims.head_dim in facts.VLLM_CPU_HEAD_SIZES:
        return
    yield Finding(
        "model.path",
        f"the model's attention heads are {dims.head_dim} wide ({dims.source}), and vLLM's CPU build supports "
        f"{', '.join(map(str, facts.VLLM_CPU_HEAD_SIZES))}",
        "use a model with one of those head sizes, `rollout.engine: hf` (the torch engine runs any), or vLLM on GPUs "
        "(`resources.gpus_per_engine: 1`)",
    )


@rule(
    "M006", "lora-with-fsdp2", Severity.ERROR,
    summary="LoRA adapters with sharded training: not supported.",
    what="Reports `model.lora` when the trainer would shard the model with fsdp2 (`train.strategy: fsdp2`, or its "
    "default for a large model over several GPU ranks).",
    why="fasync injects the adapters into the whole model and merges them into the weights it sends to the "
    "engines (fasync/model/lora.py); it has not been built or tested for adapters over fsdp2's sharded parameters, "
    "and would fail at the first weight sync. Adapters train few parameters, so a replicated model (ddp) with its "
    "frozen weights is usually what fits anyway.",
)
def lora_with_fsdp2(cfg, derived):
    if cfg.model.lora is not None and derived.train_strategy == "fsdp2":
        key = "train.strategy" if cfg.train.strategy is not None else "model.lora"
        yield Finding(
            key,
            "`model.lora` with fsdp2 sharding: fasync merges adapters only into a whole (ddp) model",
            "set `train.strategy: ddp` (every rank keeps the frozen weights; only the adapters have gradients and "
            "AdamW state), or remove `model.lora`",
        )
