"""Weight versions, staleness and policy lag: the arithmetic every driver, rule and metric shares.

A weight version increments at each weight sync to the engines. A sample's staleness is the trainer's
version minus the oldest version that produced any of its tokens (a partial rollout spans versions).

Lag is counted in optimizer steps, never in versions plus steps. With `s = async.max_weight_staleness`,
`N = num_steps_per_rollout`, `E = train.ppo_epochs` (passes over each rollout, N steps each) and
`I = async.update_weights_interval`, one version spans `I × N × E` optimizer steps, so a trained token may
have been sampled up to `(s + 1) × I × N × E − 1` optimizer steps before the policy that takes its gradient
(s when N = E = I = 1; N × E − 1 in sync, where s = 0 and I = 1).

Pure Python with no heavy imports: `fasync check` and `fasync simulate` use it as the drivers do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional


def staleness(current_version: int, oldest_version: int) -> int:
    """Versions between the trainer's weights and the oldest weights that produced a token of a sample."""
    return current_version - oldest_version


@dataclass(frozen=True)
class VersionSpan:
    """The oldest and the newest weight versions behind a sample's trained tokens (equal unless a partial
    rollout went on under new weights)."""

    oldest: int
    newest: int

    @property
    def width(self) -> int:
        return self.newest - self.oldest


def version_stats(spans: Sequence[VersionSpan]) -> dict:
    """How many weight versions a batch mixes, and how much of it partial rollouts stitched together, from each
    sample's span."""
    widths = [span.width for span in spans]
    return {
        "version_diversity": len({span.oldest for span in spans}),
        "partial_ratio": sum(width > 0 for width in widths) / max(len(widths), 1),
        "max_partial_span": max(widths, default=0),
    }


def too_stale(current_version: int, oldest_version: int, bound: Optional[int]) -> bool:
    """A sample (or group) beyond the bound is never trained on; `None` is no bound."""
    return bound is not None and staleness(current_version, oldest_version) > bound


def stale_if_late(train_version: int, next_train_version: int, oldest_version: int, bound: Optional[int]) -> bool:
    """Whether a group still generating, whose tokens are no older than `oldest_version`, is fresh enough for the
    drain at `train_version` and too stale for the next, at `next_train_version`: finishing after this drain is
    taken loses it (`async.stale_policy: wait` waits for it instead)."""
    return not too_stale(train_version, oldest_version, bound) and too_stale(next_train_version, oldest_version, bound)


def train_version(batch_index: int, interval: int) -> int:
    """The trainer's version when it trains rollout (or drain) `batch_index`, 0-based: one sync every
    `interval` batches, the first after batch `interval − 1`."""
    return batch_index // interval


def syncs_after(batch_index: int, interval: int) -> bool:
    """Whether the weights are synced to the engines after the trainer trains rollout (or drain) `batch_index`."""
    return (batch_index + 1) % interval == 0


def may_generate(batch_index: int, engine_version: int, interval: int, bound: Optional[int]) -> bool:
    """Whether weights at `engine_version` may generate the samples that rollout (or drain) `batch_index`
    trains on: only if they will then be at most `bound` versions old."""
    return bound is None or train_version(batch_index, interval) - engine_version <= bound


def rollouts_ahead(bound: Optional[int], interval: int) -> int:
    """The most rollouts (fully_async: drains) generated ahead of the one the trainer trains, that one included:
    `(s + 1) × I`, the furthest `may_generate` ever allows. async's lookahead, and fully_async's default queue.
    Unbounded staleness still needs a horizon: two rollouts."""
    return (bound + 1) * interval if bound is not None else 2


def steps_per_version(num_steps_per_rollout: int, interval: int, epochs: int = 1) -> int:
    """Optimizer steps the trainer takes between two weight versions: `I × N × E`."""
    return interval * max(num_steps_per_rollout, 1) * epochs


@dataclass(frozen=True)
class LagBound:
    """The most optimizer steps between the policy that sampled a trained token and the one that takes its
    gradient; `steps` is None when staleness is unbounded."""

    steps: Optional[int]
    steps_per_version: int

    @property
    def versions(self) -> Optional[float]:
        """The same bound in weight versions (a fraction when a version spans several steps)."""
        return None if self.steps is None else self.steps / self.steps_per_version

    def steps_and_versions(self) -> str:
        """"11 optimizer steps (2.75 versions)", "0 optimizer steps", "unbounded"."""
        if self.steps is None:
            return "unbounded"
        text = f"{self.steps} optimizer step{'' if self.steps == 1 else 's'}"
        if self.steps_per_version > 1:
            text += f" ({self.versions:g} versions)"
        return text


def max_lag(mode: str, bound: Optional[int], num_steps_per_rollout: int, interval: int, epochs: int = 1) -> LagBound:
    """`(s + 1) × I × N × E − 1` optimizer steps; sync is s = 0 with a sync after every rollout (I = 1)."""
    if mode == "sync":
        bound, interval = 0, 1
    per_version = steps_per_version(num_steps_per_rollout, interval, epochs)
    return LagBound(None if bound is None else (bound + 1) * per_version - 1, per_version)


class VersionClock:
    """The optimizer step at which each weight version was published, so that a sample's lag is measured in
    optimizer steps: the step that trains on it minus the step its oldest version came from.

    Version 0 is the initial weights, published before step 0; version v is published after the trainer has
    taken `published[v]` optimizer steps."""

    def __init__(self) -> None:
        self.published: dict[int, int] = {0: 0}

    def publish(self, version: int, steps_taken: int) -> None:
        self.published[version] = steps_taken

    def lag_steps(self, step: int, oldest_version: int) -> int:
        """Optimizer steps between the weights of `oldest_version` and step `step` (0-based) that trains on
        a sample from them: 0 when the step's own policy sampled it."""
        return step - self.published[oldest_version]

    def state_dict(self) -> dict:
        return {"published": dict(self.published)}

    def load_state_dict(self, state: dict) -> None:
        self.published = {int(version): int(step) for version, step in state["published"].items()}
