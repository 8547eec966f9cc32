"""U: settings that the rest of the config makes the code ignore."""

from __future__ import annotations

from collections.abc import Iterator

from fasync.diagnostics import Severity
from fasync.lint.registry import Finding, rule


def _ignored(cfg) -> Iterator[tuple[str, list[str], str, str]]:
    """(section, fields, why the code ignores them, what would make them count) for every group of
    settings that has no effect."""
    yield from _ignored_async(cfg)
    rollout = cfg.rollout
    if not rollout.dynamic_sampling:
        yield "rollout", ["over_sampling_batch_size", "max_sampling_rounds"], \
            "they size the refill rounds of `rollout.dynamic_sampling`, which is off", \
            "`rollout.dynamic_sampling: true`"
    elif cfg.mode == "fully_async":
        # `max_sampling_rounds` still counts there: that many rollouts' worth of groups dropped in a row end the run.
        yield "rollout", ["over_sampling_batch_size"], \
            "the fully_async rollouter refills continuously, without rounds", "`mode: sync` or `mode: async`"
    if rollout.engine != "vllm" or cfg.resources.gpus_per_engine > 0:
        yield "rollout", ["vllm_cpu_kv_cache_gb"], "it sizes the KV cache of vLLM engines on CPU, and there are none", \
            "`rollout.engine: vllm` with `resources.gpus_per_engine: 0`"
    if rollout.temperature == 0:
        yield "rollout", ["top_p", "top_k"], "greedy decoding (`rollout.temperature` 0) takes the most likely token", \
            "a `rollout.temperature` above 0"
    if cfg.train.use_dynamic_global_batch_size:
        yield "train", ["global_batch_size"], "`train.use_dynamic_global_batch_size` makes each rollout one step", \
            "`train.use_dynamic_global_batch_size: false`"
    if cfg.model.path is not None:
        yield "model", ["n_layers", "d_model", "n_heads", "max_seq_len"], \
            "they describe the embedded model, and `model.path` loads a Hugging Face one", "`model.path: null`"
    if cfg.data.path is not None:
        yield "data", ["task", "length", "num_prompts"], "they describe a built-in task, and `data.path` is a file", \
            "`data.path: null`"
    else:
        yield "data", ["format", "prompt_key", "label_key"], "they describe a dataset file, and `data.path` is " \
            "null", "a dataset file in `data.path`"
    estimator = cfg.train.advantage_estimator
    if estimator not in ("grpo", "reinforce_baseline"):
        how = "never divides by a std" if estimator == "rloo" else "always whitens over the batch's tokens"
        yield "train", ["normalize_advantage_std"], f"`train.advantage_estimator: {estimator}` {how}", \
            "`train.advantage_estimator` grpo or reinforce_baseline"
    if cfg.reward.overlong_buffer is None:
        yield "reward", ["overlong_penalty"], "it sizes the overlong shaping, and `reward.overlong_buffer` is null", \
            "a `reward.overlong_buffer`"
    if cfg.correction.level == "none":
        yield "correction", ["weight_upper", "weight_lower", "batch_normalize"], \
            "they shape importance weights, and `correction.level` is none", "`correction.level: token` or sequence"


def _ignored_async(cfg) -> Iterator[tuple[str, list[str], str, str]]:
    """`_ignored`'s groups of the `async` section: keys of a mode, a rollouter or an engine the config does not
    run."""
    async_, rollout = cfg.async_, cfg.rollout
    if cfg.mode == "sync":
        yield "async", ["max_weight_staleness", "update_weights_interval"], \
            "sync trains each rollout on the weights that generated it and syncs after every rollout", \
            "`mode: async` or `mode: fully_async`"
    if cfg.mode != "fully_async":
        yield "async", ["max_queue_size", "max_concurrent_samples", "stale_policy"], \
            "only fully_async has a rollouter and a queue", "`mode: fully_async`"
        yield "async", ["partial_rollout", "tokens_per_call", "pause_mode"], \
            "only the fully_async rollouter aborts and resumes generations; in async they finish under their weights", \
            "`mode: fully_async`"
    elif not async_.partial_rollout:
        yield "async", ["tokens_per_call"], \
            "without partial rollout a completion must finish under the weights it started with, so calls run to the end", \
            "`async.partial_rollout: true`"
    elif async_.max_weight_staleness is None:
        yield "async", ["stale_policy"], "with `async.max_weight_staleness` null no group is ever too stale", \
            "a staleness bound (`async.max_weight_staleness`)"
    if cfg.mode == "fully_async" and async_.partial_rollout and rollout.engine == "vllm":
        yield "async", ["tokens_per_call"], \
            "in fully_async the vLLM engine takes each request as admission lets it in and batches whatever is in " \
            "flight (continuous batching): there are no calls to slice, and a finished group leaves at once", \
            "`rollout.engine: hf` (the torch engine, whose calls are closed batches)"
    if cfg.mode == "fully_async" and not async_.partial_rollout:
        yield "async", ["pause_mode"], \
            "without partial rollout a weight sync lets the requests in flight finish under the weights they started " \
            "with, so there are none to abort or keep", "`async.partial_rollout: true`"
    elif cfg.mode == "fully_async" and rollout.engine != "vllm":
        yield "async", ["pause_mode"], \
            "the torch engine generates closed batches: a sync aborts its call (or waits for the end of a slice) and " \
            "drops the keys and values it kept, as `abort` does", "`rollout.engine: vllm`, whose requests stream in"
    elif cfg.mode == "fully_async" and rollout.agentic:
        yield "async", ["pause_mode"], \
            "agentic rollouts reach the engine through generate calls, which a sync aborts and the engine client " \
            "continues from their prefix", "streamed requests (neither `rollout.function` nor `rollout.env`)"


@rule(
    "U001", "ignored-setting", Severity.INFO,
    summary="A setting that has no effect with the rest of this config.",
    what="Reports keys written in the config that the code ignores given the other settings: async keys in "
    "sync mode, queue and partial-rollout keys outside fully_async, `async.tokens_per_call` without partial rollout "
    "or with the vLLM engine (which streams requests in fully_async), `async.pause_mode` without partial rollout "
    "or streamed requests (the torch engine, agentic rollouts), dynamic-sampling sizes without dynamic "
    "sampling, `top_p` and `top_k` under greedy decoding, `reward.overlong_penalty` without an overlong buffer, "
    "`train.normalize_advantage_std` with an estimator it does not apply to, `train.global_batch_size` under the "
    "dynamic global batch, "
    "embedded-model keys with `model.path`, built-in-task keys with `data.path` (and JSONL keys without), "
    "weight-shaping keys with `correction.level: none`. Only keys some layer sets are reported, not defaults.",
    why="A setting that does nothing reads as if it did: a reviewer (or you, later) believes the run has "
    "a staleness bound, a queue limit or a model shape it does not have. Often it is a sign that another "
    "key (`mode`, `correction.level`) is not what was meant.",
)
def ignored_setting(cfg, derived):
    for section_key, fields, reason, needs in _ignored(cfg):
        section = getattr(cfg, "async_" if section_key == "async" else section_key)
        for field in fields:
            if field in section.model_fields_set:
                yield Finding(f"{section_key}.{field}", f"`{section_key}.{field}` has no effect: {reason}",
                              f"remove `{section_key}.{field}`; it would take effect with {needs}")
