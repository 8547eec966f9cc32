"""Quantities that follow from a config, computed in one place.

The linter, `fasync config show` and the trainer all read these, so that what a
rule warns about is exactly what the trainer will do. `derive` reads no file: the one
quantity that follows from the model's size (`train.strategy`'s default) takes the size
from its caller (`fasync.memory.derive_with_model`, which reads the model's dimensions;
`fasync train` does so once, in `fasync.launch.plan.resolve`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from fasync.config.schema import FasyncConfig
from fasync.staleness import LagBound, max_lag, rollouts_ahead

GB = 1e9
"""Decimal units, as `resources.gpu_memory_gb` counts them."""
REPLICA_BYTES_PER_PARAMETER = 16
"""fp32 weights, gradients and two AdamW moments."""
CLIP_EPS_DEFAULTS = {"token": (0.2, 0.2), "sequence": (3e-4, 4e-4)}
"""(low, high) clip defaults per `train.importance_ratio`. A sequence ratio is a geometric mean over the tokens,
so it stays far closer to 1 than token ratios do: GSPO (Zheng et al. 2025, §5.1) clips it at 3e-4 and 4e-4."""


@dataclass(frozen=True)
class Derived:
    samples_per_rollout: int
    """rollout.batch_size × rollout.n_samples_per_prompt."""
    effective_global_batch_size: int
    """Samples per optimizer step: the whole rollout under the dynamic global batch size."""
    num_steps_per_rollout: int
    """Optimizer steps per pass over a rollout (fully_async: a drain); `train.ppo_epochs` passes each."""
    optimizer_steps_per_rollout: int
    """Optimizer steps each rollout (drain) takes: ppo_epochs × num_steps_per_rollout."""
    total_optimizer_steps: int
    """Optimizer steps of the whole run: train.num_rollouts × optimizer_steps_per_rollout (the learning-rate
    schedule's length)."""
    clip_eps: tuple[float, float]
    """(low, high) of the PPO clip after the defaults: 0.2 each with a token ratio, GSPO's (3e-4, 4e-4) with a
    sequence ratio."""
    trimmed_samples_per_rollout: int
    """Samples generated but never trained on each rollout (0 under the dynamic global batch size)."""
    micro_batch_size: int
    """Samples per forward/backward pass on one rank: `train.micro_batch_size`, or the per-rank batch."""
    micro_batches_per_step: int
    """Forward/backward passes per optimizer step on each data-parallel rank (rounded down)."""
    max_lag: LagBound
    """Most optimizer steps between the policy that sampled a trained token and the one that takes its
    gradient: (max_weight_staleness + 1) × update_weights_interval × num_steps_per_rollout × ppo_epochs − 1
    (fasync/staleness.py)."""
    max_queue_size: int
    """fully_async: prompt groups the queue holds (the configured value or its default)."""
    max_concurrent_samples: int
    """fully_async: samples generating at once (the configured value or its default)."""
    ratio_anchor: str
    """The PPO ratio's anchor after the default is applied: `recompute` in sync; in the async modes `proximal`
    when `correction.level` applies importance weights, else `behaviour` (the bypass objective that
    docs/correction.md's evidence favours)."""
    tokens_per_call: Optional[int]
    """Most new tokens an engine call gives each request: `async.tokens_per_call` in fully_async with partial
    rollout and the torch engine (without partial rollout a completion must finish under the weights it
    started with; the vLLM engine streams requests instead of calls); None: calls run to completion."""
    streams_requests: bool
    """fully_async with `rollout.engine: vllm`: the rollouter submits each group's requests as admission lets
    it in and collects them as they end, and the engine batches whatever is in flight (continuous batching,
    fasync.rollout.vllm_stream); otherwise each engine call is one closed batch."""
    keeps_kv_at_sync: bool
    """fully_async with partial rollout, streamed requests (the vLLM engine, not agentic) and `async.pause_mode:
    keep`: a weight sync pauses the engines with their requests and KV cache in them, loads and resumes; otherwise
    the requests in flight are aborted and submitted again (partial rollout) or finish first."""
    train_strategy: str
    """`train.strategy`, or its default by model size (`default_strategy`)."""

    def as_dict(self) -> dict:
        return asdict(self)


def samples_per_rollout(cfg: FasyncConfig) -> int:
    return cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt


def default_strategy(cfg: FasyncConfig, model_parameters: int | None) -> str:
    """`train.strategy` when it is null (see its description), for a model of `model_parameters` (None: unknown,
    so sharded wherever there is more than one GPU rank to shard over)."""
    res = cfg.resources
    if res.trainer_ranks == 1 or res.gpus_per_trainer_rank == 0:
        return "ddp"
    if model_parameters is None:
        return "fsdp2"
    replica = REPLICA_BYTES_PER_PARAMETER * model_parameters
    return "fsdp2" if replica > res.gpu_memory_gb * GB / 4 else "ddp"


def derive(cfg: FasyncConfig, model_parameters: int | None = None) -> Derived:
    """The derived quantities of `cfg`; `model_parameters` (`fasync.memory.ModelDims.parameters`) sets
    `train_strategy`'s default, and only that."""
    samples = samples_per_rollout(cfg)
    train = cfg.train
    if train.use_dynamic_global_batch_size:
        global_batch = samples
        steps = 1
    else:
        # Null: one step per rollout, or the rollout split into the steps asked for.
        global_batch = train.global_batch_size or max(samples // (train.num_steps_per_rollout or 1), 1)
        steps = train.num_steps_per_rollout if train.num_steps_per_rollout is not None else samples // global_batch
    trimmed = max(samples - steps * global_batch, 0)
    per_rank = global_batch // cfg.resources.trainer_ranks
    micro = train.micro_batch_size or max(per_rank, 1)
    micro_batches = per_rank // micro

    staleness = cfg.async_.max_weight_staleness

    queue = cfg.async_.max_queue_size
    if queue is None:
        # Enough for every drain the bound lets the rollouter run ahead, the one in progress included: (s + 1)
        # versions of `update_weights_interval` drains each.
        queue = cfg.rollout.batch_size * rollouts_ahead(staleness, cfg.async_.update_weights_interval)
    concurrent = cfg.async_.max_concurrent_samples or samples
    if cfg.correction.ratio_anchor is not None:
        anchor = cfg.correction.ratio_anchor
    elif cfg.mode == "sync":
        anchor = "recompute"
    else:
        anchor = "proximal" if cfg.correction.level != "none" else "behaviour"
    streams = cfg.mode == "fully_async" and cfg.rollout.engine == "vllm"
    return Derived(
        samples_per_rollout=samples,
        effective_global_batch_size=global_batch,
        num_steps_per_rollout=steps,
        optimizer_steps_per_rollout=steps * train.ppo_epochs,
        total_optimizer_steps=train.num_rollouts * steps * train.ppo_epochs,
        clip_eps=tuple(default if value is None else value for value, default in
                       zip((train.clip_eps_low, train.clip_eps_high), CLIP_EPS_DEFAULTS[train.importance_ratio])),
        trimmed_samples_per_rollout=trimmed,
        micro_batch_size=micro,
        micro_batches_per_step=micro_batches,
        max_lag=max_lag(cfg.mode, staleness, steps, cfg.async_.update_weights_interval, train.ppo_epochs),
        max_queue_size=queue,
        max_concurrent_samples=concurrent,
        ratio_anchor=anchor,
        train_strategy=train.strategy or default_strategy(cfg, model_parameters),
        tokens_per_call=cfg.async_.tokens_per_call if not streams and cfg.mode == "fully_async"
        and cfg.async_.partial_rollout else None,
        streams_requests=streams,
        keeps_kv_at_sync=streams and not cfg.rollout.agentic and cfg.async_.partial_rollout
        and cfg.async_.pause_mode == "keep",
    )
