"""Q: the fully_async rollouter and its queue (fasync.rollout.rollouter, fasync.rollout.queue).

The trainer drains exactly `rollout.batch_size` prompt groups at a time; the rollouter admits whole
groups while the queue (plus the groups in flight) has room and the engines generate fewer than
`async.max_concurrent_samples` samples.
"""

from __future__ import annotations

from fasync.config.derived import derive
from fasync.diagnostics import Severity
from fasync.lint.registry import Finding, rule


@rule(
    "Q001", "queue-below-drain", Severity.ERROR,
    summary="The fully_async queue can never hold one drain: deadlock.",
    what="Reports, in fully_async, an `async.max_queue_size` (in prompt groups) below `rollout.batch_size`.",
    why="A drain waits until the queue holds `rollout.batch_size` groups, and the rollouter stops admitting "
    "groups once the queue (with the groups in flight) is full. A queue smaller than one drain is full "
    "before the trainer can take anything: the trainer waits for groups the rollouter will never produce, "
    "and the run hangs without an error.",
)
def queue_below_drain(cfg, derived):
    queue, batch = derived.max_queue_size, cfg.rollout.batch_size
    if cfg.mode == "fully_async" and queue < batch:
        unset = cfg.model_copy(update={"async_": cfg.async_.model_copy(update={"max_queue_size": None})})
        default = derive(unset).max_queue_size
        yield Finding(
            "async.max_queue_size",
            f"`async.max_queue_size` {queue} groups cannot hold one drain of `rollout.batch_size` {batch} groups: "
            f"the trainer waits for {batch} and the rollouter stops at {queue}, a deadlock",
            f"set `async.max_queue_size` to at least {batch} (null: {default}, every drain the bound lets the "
            "rollouter run ahead)",
        )


@rule(
    "Q002", "concurrency-below-group", Severity.ERROR,
    summary="`async.max_concurrent_samples` is smaller than one prompt group: nothing is ever generated.",
    what="Reports, in fully_async, an `async.max_concurrent_samples` below `rollout.n_samples_per_prompt`.",
    why="The rollouter admits whole prompt groups (all n completions of a prompt are generated together, "
    "because their advantages are computed together) and only while fewer than `max_concurrent_samples` "
    "samples are generating. A limit below one group admits nothing, so the queue stays empty and the "
    "trainer waits forever.",
)
def concurrency_below_group(cfg, derived):
    limit, group = derived.max_concurrent_samples, cfg.rollout.n_samples_per_prompt
    if cfg.mode == "fully_async" and limit < group:
        yield Finding(
            "async.max_concurrent_samples",
            f"`async.max_concurrent_samples` {limit} is fewer than one group of {group} samples "
            "(`rollout.n_samples_per_prompt`): the rollouter admits whole groups, so it never admits one",
            f"set `async.max_concurrent_samples` to at least {group}, best a multiple of it (null: "
            f"{derived.samples_per_rollout}, one drain)",
        )
