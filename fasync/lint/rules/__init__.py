"""The lint rule families; importing this package registers every rule (fasync.lint.registry).

A code is a family letter and three digits, and keeps its meaning once released.
"""

from fasync.lint.rules import (  # noqa: F401 - imported for their registrations
    agentic,
    algorithm,
    batch,
    correction,
    generation,
    memory,
    model,
    queue,
    resources,
    run,
    staleness,
    unused,
)

FAMILIES = {
    "A": "algorithm: advantages and the PPO loss",
    "B": "batch geometry: rollouts, optimizer steps, micro batches",
    "C": "off-policy correction: importance weights, rejection, the ratio's anchor",
    "G": "generation and sampling",
    "H": "GPU memory: the per-GPU estimate against `resources.gpu_memory_gb`",
    "M": "the model: embedded shape and context, what each engine loads",
    "P": "the run plan: stopping and checkpoints",
    "Q": "the fully_async queue and rollouter",
    "R": "resources: GPUs and placement",
    "S": "staleness and the async modes",
    "T": "agentic rollouts: trajectories, environments, tools",
    "U": "settings that have no effect",
}
"""Code prefix → what the family checks (docs/rules.md lists them)."""
